"""Attention, Rope, AxialRope2d, FusedSwiGLU and RopeBackward against their float64 NumPy references, all
cases in one compiled schedule (tests/harness.py); RopeBackward's reference against the transposed Jacobian
of Rope's."""
from __future__ import annotations

import math

import numpy as np
import pytest

import rlx_llvm.ir_emit.attention  # noqa: F401  (registers the lowerings)
import rlx_llvm.reference.attention  # noqa: F401  (registers the references)
from rlx_llvm import thunks as T
from rlx_llvm.ops import MaskKind
from tests.harness import W, Outcome, Suite, expect_invalid, f32_at, forward_matrix, run_reference, suite_tests

MASKS = (MaskKind.None_, MaskKind.Causal, MaskKind.SlidingWindow(2), MaskKind.Custom, MaskKind.Bias)


def mask_name(kind) -> str:
    return f"sw{kind.w}" if isinstance(kind, MaskKind.SlidingWindow) else str(kind).split(".")[-1]


def add_attention(s: Suite, name: str, *, batch=1, seq=3, kv_seq=None, heads=2, kv_heads=None, head_dim=8,
                  v_head_dim=None, mask=MaskKind.None_, scale=None, softcap=0.0, bhsd=False, pad=0,
                  fused=False, masked_rows=False) -> None:
    """One Attention case; `pad` extra elements per source row (strided Q/K/V), `fused` Q/K/V as
    column ranges of one QKV buffer; `masked_rows` fully masks batch 0 of a Custom mask."""
    kv_seq = seq if kv_seq is None else kv_seq
    kv_heads = heads if kv_heads is None else kv_heads
    v_head_dim = head_dim if v_head_dim is None else v_head_dim
    scale = head_dim ** -0.5 if scale is None else scale
    qw, kw, vw = heads * head_dim, kv_heads * head_dim, kv_heads * v_head_dim
    if bhsd:
        q = s.put(s.normal(batch * heads * seq * head_dim))
        k = s.put(s.normal(batch * kv_heads * kv_seq * head_dim))
        v = s.put(s.normal(batch * kv_heads * kv_seq * v_head_dim))
        qrs, krs, vrs = qw, kw, vw
    elif fused:
        assert seq == kv_seq
        row = qw + kw + vw + pad
        base = s.put(s.normal(batch * seq * row))
        q, k, v = base, base + 4 * qw, base + 4 * (qw + kw)
        qrs = krs = vrs = row
    else:
        qrs, krs, vrs = qw + pad, kw + pad, vw + pad
        q = s.put(s.normal(batch * seq * qrs))
        k = s.put(s.normal(batch * kv_seq * krs))
        v = s.put(s.normal(batch * kv_seq * vrs))
    if mask == MaskKind.Custom:
        m = (s.rng.random(batch * kv_seq) > 0.3).astype(np.float32)
        if masked_rows:
            m[:kv_seq] = 0.0
        mk = s.put(m)
    elif mask == MaskKind.Bias:
        mk = s.put(s.normal(batch * heads * seq * kv_seq, scale=2.0))
    else:
        mk = 0
    out, o = s.out(np.float32, batch * seq * heads * v_head_dim)
    t = T.Attention(q=q, k=k, v=v, mask=mk, out=out, batch=batch, seq=seq, kv_seq=kv_seq, heads=heads,
                    kv_heads=kv_heads, head_dim=head_dim, v_head_dim=v_head_dim, mask_kind=mask, scale=scale,
                    softcap=softcap, q_row_stride=qrs, k_row_stride=krs, v_row_stride=vrs, bhsd=bhsd)
    s.add(name, t, [o], rtol=2e-5, atol=2e-5)


def add_rope(s: Suite, name: str, *, batch=2, seq=5, heads=2, head_dim=16, n_rot=None, interleaved=False,
             pad=0, per_token=False, table_extra=0) -> None:
    n_rot = head_dim if n_rot is None else n_rot
    hidden = heads * head_dim
    r = n_rot // 2
    crs = r + table_extra
    rows = batch * seq if per_token else seq
    ang = s.rng.uniform(-4, 4, rows * crs)
    cos, sin = s.put(np.cos(ang).astype(np.float32)), s.put(np.sin(ang).astype(np.float32))
    srs = hidden + pad
    src = s.put(s.normal(batch * seq * srs))
    dst, o = s.out(np.float32, batch * seq * hidden)
    t = T.Rope(src=src, cos=cos, sin=sin, dst=dst, batch=batch, seq=seq, hidden=hidden, head_dim=head_dim,
               n_rot=n_rot, cos_len=rows * crs, cos_row_stride=crs, src_row_stride=srs, interleaved=interleaved)
    s.add(name, t, [o], rtol=1e-6, atol=1e-6)


ROPES = [  # (batch, seq, heads, head_dim, n_rot, table rows, cos_row_stride)
    (2, 5, 3, 8, 8, 5, 4), (1, 7, 2, 2 * W + 4, 2 * W + 2, 7, W + 1), (2, 3, 2, 64, 32, 6, 16),
    (3, 4, 1, 6, 4, 4, 5), (1, 1, 1, 2, 2, 1, 1), (2, 4, 2, 16, 0, 4, 8), (4, 33, 4, 128, 128, 33, 64)]


def add_rope_backward(s: Suite) -> None:
    """RopeBackward over the ROPES geometries, both layouts, and in place."""
    for k, (batch, seq, heads, hd, n_rot, tab_rows, stride) in enumerate(ROPES):
        for interleaved in (False, True):
            hidden = heads * hd
            n = batch * seq * hidden
            cos_len = tab_rows * stride
            ang = s.rng.uniform(-3, 3, cos_len)
            dx, o = s.out(np.float32, n)
            s.add(f"RopeBackward-{k}-il{int(interleaved)}",
                  T.RopeBackward(dy=s.put(s.normal(n)), cos=s.put(np.cos(ang).astype(np.float32)),
                                 sin=s.put(np.sin(ang).astype(np.float32)), dx=dx, batch=batch, seq=seq, hidden=hidden,
                                 head_dim=hd, n_rot=n_rot, cos_len=cos_len, cos_row_stride=stride,
                                 interleaved=interleaved), [o])
    dy = s.put(s.normal(2 * 3 * 8))
    s.add("RopeBackward-inplace", T.RopeBackward(dy=dy, cos=s.put(s.normal(12)), sin=s.put(s.normal(12)), dx=dy,
                                                 batch=2, seq=3, hidden=8, head_dim=8, n_rot=6, cos_len=12,
                                                 cos_row_stride=4, interleaved=False), [(dy, np.dtype(np.float32), 48)])


def build() -> Suite:
    s = Suite(6, rtol=2e-5, atol=2e-5)
    # every mask kind, both layouts, odd lengths, softcap
    for seq in (1, 3, 17, 33):
        for kind in MASKS:
            for bhsd in (False, True):
                add_attention(s, f"attn-s{seq}-{mask_name(kind)}-bhsd{int(bhsd)}", batch=2, seq=seq, heads=3,
                              head_dim=W + 3, mask=kind, bhsd=bhsd)
    for kind in MASKS:
        add_attention(s, f"attn-softcap-{mask_name(kind)}", batch=2, seq=9, heads=2, head_dim=8, mask=kind,
                      softcap=1.5, scale=1.0)
    # GQA ratios, MLA v_head_dim, decode (kv_seq > seq), strided and fused QKV rows
    for heads, kvh in ((4, 2), (8, 1), (6, 3)):
        for bhsd in (False, True):
            add_attention(s, f"attn-gqa{heads}x{kvh}-bhsd{int(bhsd)}", batch=2, seq=5, kv_seq=7, heads=heads,
                          kv_heads=kvh, head_dim=16, mask=MaskKind.Causal, bhsd=bhsd)
    for dv in (1, 5, W, 3 * W + 5, 5 * W + 1):
        add_attention(s, f"attn-dv{dv}", batch=1, seq=4, heads=2, head_dim=12, v_head_dim=dv, mask=MaskKind.Causal)
    for kind in MASKS:
        add_attention(s, f"attn-decode1-{mask_name(kind)}", batch=2, seq=1, kv_seq=33, heads=4, kv_heads=2,
                      head_dim=32, mask=kind)
        add_attention(s, f"attn-decode4-{mask_name(kind)}", batch=1, seq=4, kv_seq=19, heads=2, head_dim=32,
                      mask=kind)
    for heads, kvh, seq in ((12, 1, 2), (16, 2, 1)):  # a group wider than MAX_GROUP: one unit per query head
        add_attention(s, f"attn-wide-group{heads}x{kvh}-s{seq}", batch=2, seq=seq, kv_seq=9, heads=heads,
                      kv_heads=kvh, head_dim=8, mask=MaskKind.Bias)
    for kind in (MaskKind.None_, MaskKind.Causal):  # tiled: whole W×W key blocks and panels, then ragged ends
        add_attention(s, f"attn-tiles-{mask_name(kind)}", batch=1, seq=5 * W + 3, heads=2, head_dim=4 * W + 3,
                      v_head_dim=4 * W, mask=kind)
    add_attention(s, "attn-padded-rows", batch=2, seq=6, heads=2, kv_heads=1, head_dim=8, pad=5,
                  mask=MaskKind.Custom)
    add_attention(s, "attn-fused-qkv", batch=2, seq=7, heads=3, head_dim=16, fused=True, mask=MaskKind.Causal)
    add_attention(s, "attn-fused-qkv-pad", batch=1, seq=5, heads=2, head_dim=8, fused=True, pad=3,
                  mask=MaskKind.SlidingWindow(1))
    add_attention(s, "attn-fully-masked", batch=2, seq=3, kv_seq=5, heads=2, head_dim=8, mask=MaskKind.Custom,
                  masked_rows=True)
    add_attention(s, "attn-sliding0", batch=1, seq=6, heads=1, head_dim=4, mask=MaskKind.SlidingWindow(0))
    add_attention(s, "attn-sliding-big", batch=1, seq=6, heads=1, head_dim=4, mask=MaskKind.SlidingWindow(100))
    # the register-tile path (seq ≥ TILE_MIN_SEQ): several column panels, ragged tiles, query blocks
    for dv in (1, 5, 5 * W + 1):
        add_attention(s, f"attn-tiled-dv{dv}", batch=1, seq=9, kv_seq=70, heads=2, head_dim=12, v_head_dim=dv,
                      mask=MaskKind.Causal)
    for heads, kvh in ((4, 2), (8, 1)):
        add_attention(s, f"attn-tiled-gqa{heads}x{kvh}", batch=2, seq=12, kv_seq=20, heads=heads, kv_heads=kvh,
                      head_dim=16, mask=MaskKind.SlidingWindow(5), pad=3)
    add_attention(s, "attn-tiled-blocks", batch=1, seq=100, kv_seq=1000, heads=1, head_dim=8,
                  mask=MaskKind.Custom)
    add_attention(s, "attn-tiled-fully-masked", batch=2, seq=10, kv_seq=13, heads=2, head_dim=8,
                  mask=MaskKind.Custom, masked_rows=True)
    add_attention(s, "attn-tiled-softcap-bias", batch=1, seq=16, heads=2, head_dim=W, mask=MaskKind.Bias,
                  softcap=2.0, bhsd=True)
    for seq, kv in ((9, 2), (3, 2), (20, 7)):  # fewer keys than queries: the first rows see nothing
        for kind in (MaskKind.Causal, MaskKind.SlidingWindow(1)):
            add_attention(s, f"attn-short-kv-s{seq}-kv{kv}-{mask_name(kind)}", batch=2, seq=seq, kv_seq=kv,
                          heads=2, head_dim=8, mask=kind)
    add_attention(s, "attn-tiled-causal-panels", batch=1, seq=200, kv_seq=260, heads=2, head_dim=8,
                  mask=MaskKind.Causal)
    add_attention(s, "attn-kv0", batch=1, seq=2, kv_seq=0, heads=1, head_dim=4)
    add_attention(s, "attn-scale", batch=1, seq=5, heads=2, head_dim=8, scale=0.05, mask=MaskKind.Bias)
    # large enough to split across threads
    add_attention(s, "attn-big", batch=2, seq=64, heads=4, head_dim=64, mask=MaskKind.Causal)
    add_attention(s, "attn-big-bhsd", batch=1, seq=48, kv_seq=80, heads=8, kv_heads=2, head_dim=32,
                  mask=MaskKind.Custom, bhsd=True)

    # Rope: both styles, partial rotation, strided source, per-token tables, wide table rows
    for interleaved in (False, True):
        tag = "gptj" if interleaved else "neox"
        for hd, n_rot in ((16, 16), (16, 8), (64, 32), (2 * W + 6, 2 * W + 2), (8, 0), (6, 2)):
            add_rope(s, f"rope-{tag}-hd{hd}-rot{n_rot}", head_dim=hd, n_rot=n_rot, interleaved=interleaved)
        add_rope(s, f"rope-{tag}-strided", head_dim=16, n_rot=12, interleaved=interleaved, pad=7, table_extra=3)
        add_rope(s, f"rope-{tag}-per-token", batch=3, seq=4, head_dim=16, interleaved=interleaved, per_token=True)
        add_rope(s, f"rope-{tag}-big", batch=2, seq=256, heads=8, head_dim=64, interleaved=interleaved)

    # AxialRope2d
    for hd, heads, rep, end_x, seq in ((16, 2, 1, 4, 16), (8, 3, 2, 3, 13), (64, 2, 1, 8, 64), (4, 1, 1, 2, 5)):
        hidden = heads * hd
        src = s.put(s.normal(2 * seq * hidden))
        dst, o = s.out(np.float32, 2 * seq * hidden)
        t = T.AxialRope2d(src=src, dst=dst, batch=2, seq=seq, hidden=hidden, end_x=end_x,
                          end_y=-(-seq // (rep * end_x)), head_dim=hd, num_heads=heads, theta=10000.0,
                          repeat_factor=rep)
        s.add(f"axial-hd{hd}-h{heads}-r{rep}", t, [o], rtol=1e-5, atol=1e-5)

    # FusedSwiGLU
    for n, rows in ((1, 3), (W - 1, 2), (W, 4), (3 * W + 5, 5), (4096, 40)):
        for gate_first in (False, True):
            x = s.normal(rows * 2 * n, scale=3.0)
            x[:4] = [30.0, -30.0, 0.0, -100.0][:min(4, x.size)]
            src = s.put(x)
            dst, o = s.out(np.float32, rows * n)
            s.add(f"swiglu-{rows}x{n}-gf{int(gate_first)}",
                  T.FusedSwiGLU(src=src, dst=dst, n_half=n, total=rows * n, gate_first=gate_first), [o],
                  rtol=1e-5, atol=1e-6)
    add_rope_backward(s)
    return s


SUITE = build()


(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


def _out(outcome: Outcome, name: str) -> np.ndarray:
    off, dtype, count = outcome.case(name).outputs[0]
    return outcome.got[off:off + count * dtype.itemsize].view(dtype)


@pytest.mark.parametrize("name", ["attn-fully-masked", "attn-tiled-fully-masked"])
def test_fully_masked_rows_are_uniform(outcome: Outcome, name: str) -> None:
    """Batch 0's keys are all masked: its rows are the plain mean of V's rows, never NaN."""
    t = outcome.case(name).thunk
    got = _out(outcome, name).reshape(t.batch, t.seq, t.heads, t.v_head_dim)
    assert np.isfinite(got).all()
    v = outcome.before[t.v:t.v + 4 * t.batch * t.kv_seq * t.v_row_stride].view(np.float32)
    v = v.reshape(t.batch, t.kv_seq, t.kv_heads, t.v_head_dim).astype(np.float64)
    mean = v[0].mean(axis=0)  # [kv_heads, dv]
    mean = np.repeat(mean, t.heads // t.kv_heads, axis=0)
    np.testing.assert_allclose(got[0], np.broadcast_to(mean, got[0].shape), rtol=1e-5, atol=1e-5)


def test_no_nan_anywhere(outcome: Outcome) -> None:
    for c in outcome.suite.cases:
        if c.name.startswith("attn"):
            assert np.isfinite(_out(outcome, c.name)).all(), c.name


# ── bad inputs: one per check rule ──────────────────────────────────────────

def _attn(**kw):
    base = dict(q=0, k=0, v=0, mask=0, out=4096, batch=1, seq=2, kv_seq=2, heads=4, kv_heads=2, head_dim=4,
                v_head_dim=4, mask_kind=MaskKind.None_, scale=0.5, softcap=0.0, q_row_stride=16,
                k_row_stride=8, v_row_stride=8, bhsd=False)
    base.update(kw)
    return T.Attention(**base)


@pytest.mark.parametrize("kw, field", [
    (dict(kv_heads=3), "kv_heads"),
    (dict(kv_heads=0), "kv_heads"),
    (dict(kv_heads=8, k_row_stride=32, v_row_stride=32), "kv_heads"),
    (dict(q_row_stride=15), "q_row_stride"),
    (dict(k_row_stride=7), "k_row_stride"),
    (dict(v_row_stride=7), "v_row_stride"),
    (dict(softcap=-1.0), "softcap"),
    (dict(softcap=math.nan), "softcap"),
])
def test_attention_checks(kw, field) -> None:
    expect_invalid(_attn(**kw), 8192, field)


def _rope(**kw):
    base = dict(src=0, cos=1024, sin=2048, dst=4096, batch=1, seq=2, hidden=16, head_dim=8, n_rot=8, cos_len=8,
                cos_row_stride=4, src_row_stride=16, interleaved=False)
    base.update(kw)
    return T.Rope(**base)


@pytest.mark.parametrize("kw, field", [
    (dict(n_rot=7), "n_rot"),
    (dict(n_rot=10), "n_rot"),
    (dict(head_dim=6), "head_dim"),
    (dict(src_row_stride=15), "src_row_stride"),
    (dict(cos_row_stride=3, cos_len=6), "cos_row_stride"),
    (dict(cos_len=7), "cos_len"),
])
def test_rope_checks(kw, field) -> None:
    expect_invalid(_rope(**kw), 8192, field)


def _axial(**kw):
    base = dict(src=0, dst=4096, batch=1, seq=4, hidden=16, end_x=2, end_y=2, head_dim=8, num_heads=2,
                theta=100.0, repeat_factor=1)
    base.update(kw)
    return T.AxialRope2d(**base)


@pytest.mark.parametrize("kw, field", [
    (dict(head_dim=6, hidden=12), "head_dim"),
    (dict(num_heads=3), "hidden"),
    (dict(repeat_factor=0), "repeat_factor"),
    (dict(end_x=0), "end_x"),
])
def test_axial_checks(kw, field) -> None:
    expect_invalid(_axial(**kw), 8192, field)


def test_swiglu_total_must_be_whole_rows() -> None:
    expect_invalid(T.FusedSwiGLU(src=0, dst=4096, n_half=3, total=8, gate_first=False), 8192, "total")


def test_custom_mask_uses_the_schedule_threshold() -> None:
    """`mask < schedule.mask_threshold` masks: with threshold 0.25 a 0.3 entry keeps its key."""
    import rlx_llvm as rl
    from rlx_llvm import reference as ref
    rng = np.random.default_rng(3)
    bs, seq, heads, hd, kv = 2, 9, 2, 8, 11
    q, k, v = (rng.standard_normal(n).astype(np.float32) for n in (bs * seq * heads * hd, bs * kv * heads * hd,
                                                                    bs * kv * heads * hd))
    mask = rng.choice(np.float32([0.0, 0.3, 1.0]), bs * kv)
    mask[0] = 1.0
    offs, top = [], 0
    for arr in (q, k, v, mask):
        offs.append(top)
        top += arr.nbytes
    out = top
    top += 4 * bs * seq * heads * hd
    t = T.Attention(q=offs[0], k=offs[1], v=offs[2], mask=offs[3], out=out, batch=bs, seq=seq, kv_seq=kv,
                    heads=heads, kv_heads=heads, head_dim=hd, v_head_dim=hd, mask_kind=MaskKind.Custom, scale=0.4,
                    softcap=0.0, q_row_stride=heads * hd, k_row_stride=heads * hd, v_row_stride=heads * hd,
                    bhsd=False)
    prog = rl.compile(rl.ThunkSchedule([t], arena_bytes=top, mask_threshold=0.25, mask_neg_inf=-1e4), cache=False)
    arena = rl.Arena(top)
    for off, arr in zip(offs, (q, k, v, mask)):
        arena.bytes[off:off + arr.nbytes] = arr.view(np.uint8)
    want = arena.bytes.copy()
    want[offs[3]:offs[3] + mask.nbytes] = np.where(mask == np.float32(0.3), 1.0, mask).astype(np.float32).view(np.uint8)
    prog.run(arena)
    ref.REFERENCES[T.Attention](want, t)
    np.testing.assert_allclose(arena.bytes[out:top].view(np.float32), want[out:top].view(np.float32),
                               rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("per_token", [False, True])
def test_rope_backward_is_the_transpose_of_rope(interleaved: bool, per_token: bool) -> None:
    """`RopeBackward(dy) = Jᵀ dy` with J the forward Rope reference's matrix (stride > n_rot/2, partial n_rot)."""
    rng = np.random.default_rng(2)
    batch, seq, heads, hd, n_rot, stride = 2, 3, 2, 6, 4, 3
    hidden, n = heads * hd, batch * seq * heads * hd
    cos_len = (batch * seq if per_token else seq) * stride
    cos, sin = rng.standard_normal(cos_len).astype(np.float32), rng.standard_normal(cos_len).astype(np.float32)
    geo = dict(cos=1024, sin=2048, batch=batch, seq=seq, hidden=hidden, head_dim=hd, n_rot=n_rot, cos_len=cos_len,
               cos_row_stride=stride, interleaved=interleaved)
    fwd = lambda e, m: f32_at(run_reference(T.Rope(src=0, dst=4096, src_row_stride=hidden, **geo), 8192,  # noqa: E731
                                       {0: e, 1024: cos, 2048: sin}), 4096, m)
    jac = forward_matrix(fwd, n, n)
    dy = rng.standard_normal(n).astype(np.float32)
    got = f32_at(run_reference(T.RopeBackward(dy=0, dx=4096, **geo), 8192, {0: dy, 1024: cos, 2048: sin}), 4096, n)
    np.testing.assert_allclose(got, (jac @ dy.astype(np.float64)).astype(np.float32), rtol=1e-6, atol=1e-6)


# ── bad inputs: RopeBackward takes Rope's rules ─────────────────────────────

def _rope_backward(**kw) -> T.RopeBackward:
    base = dict(dy=0, cos=1024, sin=2048, dx=3072, batch=1, seq=4, hidden=16, head_dim=8, n_rot=8, cos_len=16,
                cos_row_stride=4, interleaved=False)
    base.update(kw)
    return T.RopeBackward(**base)


@pytest.mark.parametrize("kw, field", [
    (dict(head_dim=6), "head_dim"), (dict(head_dim=0), "head_dim"), (dict(n_rot=5), "n_rot"),
    (dict(n_rot=10), "n_rot"), (dict(cos_row_stride=3), "cos_row_stride"), (dict(cos_len=15), "cos_len")])
def test_rope_backward_rejects(kw: dict, field: str) -> None:
    expect_invalid(_rope_backward(**kw), 4096, field)
