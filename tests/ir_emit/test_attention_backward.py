"""AttentionBackward / AttentionBackwardAll against their float64 NumPy reference (one compiled schedule,
tests/harness.py); the reference against finite differences of the forward Attention reference and against
torch.autograd of scaled_dot_product_attention."""
from __future__ import annotations

import numpy as np
import pytest

import rlx_llvm.ir_emit.attention_backward  # noqa: F401  (registers the lowerings)
import rlx_llvm.reference.attention  # noqa: F401
import rlx_llvm.reference.attention_backward  # noqa: F401
from rlx_llvm import thunks as T
from rlx_llvm.ops import AttentionBwdWrt, MaskKind
from tests.harness import W, Suite, expect_invalid, f32_at, run_reference, suite_tests

MASKS = (MaskKind.None_, MaskKind.Causal, MaskKind.SlidingWindow(2), MaskKind.Custom, MaskKind.Bias)


def mask_name(kind) -> str:
    return f"sw{kind.w}" if isinstance(kind, MaskKind.SlidingWindow) else str(kind).split(".")[-1]


def mask_values(rng, kind, batch: int, heads: int, seq: int, kv_seq: int) -> "np.ndarray | None":
    """A Custom keep-mask (batch 0's first key always masked) or a Bias tensor; None for in-kernel kinds."""
    if kind == MaskKind.Custom:
        m = (rng.random(batch * kv_seq) > 0.3).astype(np.float32)
        m[0] = 0.0
        return m
    if kind == MaskKind.Bias:
        return (rng.standard_normal(batch * heads * seq * kv_seq) * 2).astype(np.float32)
    return None


def add_backward(s: Suite, name: str, *, batch=2, seq=3, kv_seq=None, heads=2, head_dim=8, mask=MaskKind.None_,
                 bhsd=False, wrt=None) -> None:
    """One AttentionBackwardAll case (or an AttentionBackward for `wrt`)."""
    kv_seq = seq if kv_seq is None else kv_seq
    nq, nkv = batch * seq * heads * head_dim, batch * kv_seq * heads * head_dim
    q, k, v, dy = (s.put(s.normal(n)) for n in (nq, nkv, nkv, nq))
    m = mask_values(s.rng, mask, batch, heads, seq, kv_seq)
    mk = s.put(m) if m is not None else 0
    shape = dict(q=q, k=k, v=v, dy=dy, mask=mk, batch=batch, seq=seq, kv_seq=kv_seq, heads=heads,
                 head_dim=head_dim, mask_kind=mask, bhsd=bhsd)
    if wrt is None:
        (oq, o1), (ok, o2), (ov, o3) = s.out(np.float32, nq), s.out(np.float32, nkv), s.out(np.float32, nkv)
        s.add(name, T.AttentionBackwardAll(out_q=oq, out_k=ok, out_v=ov, **shape), [o1, o2, o3])
    else:
        out, o = s.out(np.float32, nq if wrt == AttentionBwdWrt.Query else nkv)
        s.add(name, T.AttentionBackward(out=out, wrt=wrt, **shape), [o])


def build() -> Suite:
    s = Suite(13, rtol=1e-4, atol=1e-5)
    s.put(np.zeros(16, np.float32))  # nothing real at offset 0 (AttentionBackward's "no mask")
    for seq in (1, W + 1, 19):
        for kind in MASKS:
            for bhsd in (False, True):
                add_backward(s, f"all-s{seq}-{mask_name(kind)}-bhsd{int(bhsd)}", seq=seq, heads=3, head_dim=W + 3,
                             mask=kind, bhsd=bhsd)
    for wrt in AttentionBwdWrt:
        for kind in MASKS:
            add_backward(s, f"one-{wrt.value}-{mask_name(kind)}", seq=6, kv_seq=9, head_dim=5, mask=kind, wrt=wrt)
        add_backward(s, f"one-{wrt.value}-bhsd", seq=7, head_dim=16, mask=MaskKind.Causal, bhsd=True, wrt=wrt)
    add_backward(s, "all-sW-1", seq=W - 1, kv_seq=W + 2, heads=3, head_dim=W + 3, mask=MaskKind.SlidingWindow(3))
    for seq, kv in ((9, 2), (3, 11), (4, 0), (0, 4)):  # short keys, decode-like, and empty sides
        add_backward(s, f"all-s{seq}-kv{kv}", seq=seq, kv_seq=kv, mask=MaskKind.Causal)
    add_backward(s, "all-hd1", seq=4, head_dim=1, mask=MaskKind.Bias)
    add_backward(s, "all-blocks", batch=1, seq=70, kv_seq=1000, heads=1, head_dim=8, mask=MaskKind.Custom)
    # Causal/Sliding blocks that skip invisible keys (and ones that cannot: rows before the first key)
    add_backward(s, "all-causal-blocks", batch=1, seq=100, heads=2, head_dim=16, mask=MaskKind.Causal)
    add_backward(s, "all-sliding-blocks", batch=1, seq=130, heads=1, head_dim=W + 1, mask=MaskKind.SlidingWindow(20))
    add_backward(s, "all-causal-long-q", batch=1, seq=150, kv_seq=100, heads=1, head_dim=8, mask=MaskKind.Causal)
    add_backward(s, "all-big", batch=2, seq=64, heads=4, head_dim=64, mask=MaskKind.Causal)  # split across threads
    add_backward(s, "value-big", batch=2, seq=48, heads=4, head_dim=32, bhsd=True, wrt=AttentionBwdWrt.Value)
    return s


SUITE = build()

(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


# ── the reference against finite differences and torch ──────────────────────

B, S, KV, H, D = 2, 4, 5, 2, 3


def _inputs(rng, kind) -> dict:
    nq, nkv = B * S * H * D, B * KV * H * D
    x = {name: rng.standard_normal(n) for name, n in (("q", nq), ("k", nkv), ("v", nkv), ("dy", nq))}
    x["mask"] = mask_values(rng, kind, B, H, S, KV)
    return x


OFF = dict(q=0, k=1024, v=2048, dy=3072, mask=4096, out=8192, out_q=8192, out_k=9216, out_v=10240)


def _loss(x: dict, kind, bhsd: bool) -> float:
    """`Σ dy ⊙ Attention(q, k, v)` by the forward reference in float64 (the f32 arena holds the perturbed values)."""
    t = T.Attention(q=OFF["q"], k=OFF["k"], v=OFF["v"], mask=OFF["mask"], out=OFF["out"], batch=B, seq=S,
                    kv_seq=KV, heads=H, kv_heads=H, head_dim=D, v_head_dim=D, mask_kind=kind,
                    scale=float(np.float32(D ** -0.5)), softcap=0.0, q_row_stride=H * D, k_row_stride=H * D,
                    v_row_stride=H * D, bhsd=bhsd)
    arena = run_reference(t, 12288, {OFF[n]: np.asarray(x[n], np.float32) for n in ("q", "k", "v")
                                     if True} | ({OFF["mask"]: x["mask"]} if x["mask"] is not None else {}))
    y = f32_at(arena, OFF["out"], B, S, H, D).astype(np.float64)
    dy = x["dy"].reshape(B, H, S, D).transpose(0, 2, 1, 3) if bhsd else x["dy"].reshape(B, S, H, D)
    return float((y * dy).sum())


def _reference_grads(x: dict, kind, bhsd: bool) -> list[np.ndarray]:
    t = T.AttentionBackwardAll(q=OFF["q"], k=OFF["k"], v=OFF["v"], dy=OFF["dy"], mask=OFF["mask"],
                               out_q=OFF["out_q"], out_k=OFF["out_k"], out_v=OFF["out_v"], batch=B, seq=S,
                               kv_seq=KV, heads=H, head_dim=D, mask_kind=kind, bhsd=bhsd)
    arena = run_reference(t, 12288, {OFF[n]: np.asarray(x[n], np.float32) for n in x if x[n] is not None})
    return [f32_at(arena, OFF[o], n).astype(np.float64) for o, n in (("out_q", x["q"].size), ("out_k", x["k"].size),
                                                                     ("out_v", x["v"].size))]


@pytest.mark.parametrize("bhsd", [False, True])
@pytest.mark.parametrize("kind", MASKS, ids=mask_name)
def test_reference_matches_finite_differences(kind, bhsd: bool) -> None:
    """Central differences of the forward reference's `Σ dy ⊙ y` (inputs are f32, so steps of 1e-2)."""
    rng = np.random.default_rng(5)
    x = _inputs(rng, kind)
    for name in ("q", "k", "v"):
        x[name] = x[name].astype(np.float32).astype(np.float64)
    grads = _reference_grads(x, kind, bhsd)
    for name, g in zip(("q", "k", "v"), grads):
        fd = np.empty_like(g)
        for i in range(g.size):
            h = 2.0 ** -7
            up, dn = dict(x), dict(x)
            up[name], dn[name] = x[name].copy(), x[name].copy()
            up[name][i] += h
            dn[name][i] -= h
            fd[i] = (_loss(up, kind, bhsd) - _loss(dn, kind, bhsd)) / (2 * h)
        np.testing.assert_allclose(g, fd, rtol=2e-3, atol=2e-3, err_msg=name)


@pytest.mark.parametrize("kind", [MaskKind.None_, MaskKind.Causal, MaskKind.Custom, MaskKind.Bias], ids=mask_name)
def test_reference_matches_torch_autograd(kind) -> None:
    """torch.autograd of scaled_dot_product_attention (float64) with the same additive / boolean mask."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    x = _inputs(rng, kind)
    for name in ("q", "k", "v", "dy"):
        x[name] = x[name].astype(np.float32).astype(np.float64)
    bshd = lambda a, s: torch.tensor(a.reshape(B, s, H, D).transpose(0, 2, 1, 3).copy(), requires_grad=True)  # noqa
    q, k, v = bshd(x["q"], S), bshd(x["k"], KV), bshd(x["v"], KV)
    bias = torch.zeros(B, H, S, KV, dtype=torch.float64)
    if kind == MaskKind.Custom:
        bias = bias.masked_fill(torch.tensor(x["mask"].reshape(B, 1, 1, KV) < 0.5), -1e9)
    elif kind == MaskKind.Bias:
        bias = bias + torch.tensor(x["mask"].astype(np.float64).reshape(B, H, S, KV))
    elif kind == MaskKind.Causal:
        ok = torch.arange(KV)[None, :] <= (KV - S) + torch.arange(S)[:, None]
        bias = bias.masked_fill(~ok, -1e9)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=float(np.float32(D ** -0.5)))
    y.backward(torch.tensor(x["dy"].reshape(B, S, H, D).transpose(0, 2, 1, 3).copy()))
    for got, want in zip(_reference_grads(x, kind, False), (q.grad, k.grad, v.grad)):
        want = want.detach().numpy().transpose(0, 2, 1, 3).reshape(-1)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ── bad input ───────────────────────────────────────────────────────────────

def test_buffers_past_the_arena_are_refused() -> None:
    """The only rule beyond field ranges: every operand fits in the arena (dY here)."""
    t = T.AttentionBackwardAll(q=0, k=256, v=512, dy=8150, mask=0, out_q=1024, out_k=1280, out_v=1536, batch=1,
                               seq=2, kv_seq=2, heads=2, head_dim=4, mask_kind=MaskKind.None_, bhsd=False)
    expect_invalid(t, 8192, "dy")
