"""FusedAttnBlock, FusedBertLayer and FusedNomicLayer against their float64 NumPy references (one compiled
schedule, tests/harness.py), and FusedBertLayer against the composition of
the unfused thunks it replaces, run through `rl.compile`."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

import rlx_llvm as rl
import rlx_llvm.ir_emit.fused_layers  # noqa: F401  (registers the lowerings)
import rlx_llvm.reference.fused_layers  # noqa: F401  (registers the references)
import rlx_llvm.ir_emit.attention, rlx_llvm.ir_emit.gemm, rlx_llvm.ir_emit.norms  # noqa: F401,E401
from rlx_llvm import thunks as T
from rlx_llvm.ir_emit import parallel
from rlx_llvm.ir_emit.gemm import GEMM_MODE_ENV
from rlx_llvm.ops import Activation, MaskKind
from tests.harness import Suite, bert_inputs, expect_invalid, padding_mask, suite_tests



def add_bert(s: Suite, name: str, *, batch=1, seq=5, hs=32, nh=2, inter=64, full_masked=False) -> T.FusedBertLayer:
    out, o = s.out(np.float32, batch * seq * hs)
    t = T.FusedBertLayer(out=out, **bert_inputs(s, batch, seq, hs, nh, inter, full_masked))
    s.add(name, t, [o], rtol=2e-4, atol=2e-4)
    return t


def rope_tables(s: Suite, seq: int, dh: int, extra: int = 3) -> tuple:
    r = dh // 2
    ang = np.arange(seq + extra)[:, None] * (10000.0 ** (-np.arange(r) / max(1, r)))[None, :]
    return s.put(np.cos(ang).astype(np.float32).reshape(-1)), s.put(np.sin(ang).astype(np.float32).reshape(-1)), \
        (seq + extra) * r


def add_nomic(s: Suite, name: str, *, batch=2, seq=5, hs=32, nh=2, inter=64, interleaved=False,
              full_masked=False) -> T.FusedNomicLayer:
    w = lambda k, n: s.put(s.normal(k * n, scale=k ** -0.5))
    cos, sin, cos_len = rope_tables(s, seq, hs // nh)
    out, o = s.out(np.float32, batch * seq * hs)
    t = T.FusedNomicLayer(hidden=s.put(s.normal(batch * seq * hs)), qkv_w=w(hs, 3 * hs), out_w=w(hs, hs),
                          mask=s.put(padding_mask(s, batch, seq, full_masked)), cos=cos, sin=sin, cos_len=cos_len,
                          ln1_g=s.put(s.normal(hs, scale=0.1, shift=1.0)), ln1_b=s.put(s.normal(hs, scale=0.1)), eps1=1e-5,
                          fc11_w=w(hs, 2 * inter), fc12_w=0, fc2_w=w(inter, hs), ln2_g=s.put(s.normal(hs, scale=0.1, shift=1.0)),
                          ln2_b=s.put(s.normal(hs, scale=0.1)), eps2=1e-5, out=out, batch=batch, seq=seq, hs=hs, nh=nh,
                          dh=hs // nh, int_dim=inter, interleaved=interleaved)
    s.add(name, t, [o], rtol=2e-4, atol=2e-4)
    return t


def add_attn_block(s: Suite, name: str, *, batch=2, seq=5, hs=32, nh=4, in_dim=None, out_dim=None, bias=True,
                   out_bias=True, mask=MaskKind.Custom, full_masked=False, rope=None) -> None:
    """`rope` None, "neox" or "gptj" (tables of seq + 3 rows of dh/2)."""
    in_dim = hs if in_dim is None else in_dim
    out_dim = hs if out_dim is None else out_dim
    m = batch * seq
    mk = s.put(padding_mask(s, batch, seq, full_masked)) if mask == MaskKind.Custom else \
        s.put(s.normal(batch * nh * seq * seq)) if mask == MaskKind.Bias else 0
    out, o = s.out(np.float32, m * out_dim)
    cos, sin, cos_len = rope_tables(s, seq, hs // nh) if rope else (0, 0, 0)
    t = T.FusedAttnBlock(hidden=s.put(s.normal(m * in_dim)), qkv_w=s.put(s.normal(in_dim * 3 * hs, scale=in_dim ** -0.5)),
                         out_w=s.put(s.normal(hs * out_dim, scale=hs ** -0.5)), mask=mk, mask_kind=mask, out=out,
                         qkv_b=s.put(s.normal(3 * hs, scale=0.1)) if bias else 0,
                         out_b=s.put(s.normal(out_dim, scale=0.1)) if out_bias else 0, cos=cos, sin=sin,
                         cos_len=cos_len, batch=batch, seq=seq, hs=hs, nh=nh, dh=hs // nh, in_dim=in_dim,
                         out_dim=out_dim, has_bias=bias, has_rope=rope is not None, interleaved=rope == "gptj")
    s.add(name, t, [o], rtol=1e-4, atol=1e-4)


def build() -> Suite:
    s = Suite(11, rtol=2e-5, atol=2e-5)
    add_bert(s, "bert_b1_s1", batch=1, seq=1, hs=32, nh=2, inter=64)
    add_bert(s, "bert_b2_s5_masked", batch=2, seq=5, hs=32, nh=4, inter=128, full_masked=True)
    add_bert(s, "bert_b2_s17", batch=2, seq=17, hs=64, nh=4, inter=128)
    add_bert(s, "bert_b1_s17_h48", batch=1, seq=17, hs=48, nh=3, inter=96)
    for kind in (MaskKind.None_, MaskKind.Causal, MaskKind.Custom, MaskKind.Bias, MaskKind.SlidingWindow(3)):
        k = str(kind).split(".")[-1].replace("(", "").replace(")", "")
        add_attn_block(s, f"attn_{k}", mask=kind)
        add_attn_block(s, f"attn_{k}_nobias_s17", seq=17, mask=kind, bias=False, out_bias=False)
        add_attn_block(s, f"attn_{k}_dims", batch=1, seq=9, in_dim=24, out_dim=40, hs=32, nh=2, mask=kind)
    add_attn_block(s, "attn_custom_full_masked", mask=MaskKind.Custom, full_masked=True)
    add_attn_block(s, "attn_s1_outbias_only", batch=2, seq=1, bias=False, out_bias=True)
    for rope in ("neox", "gptj"):
        add_attn_block(s, f"attn_rope_{rope}_custom", seq=5, mask=MaskKind.Custom, rope=rope)
        add_attn_block(s, f"attn_rope_{rope}_causal_s17", seq=17, hs=64, nh=2, mask=MaskKind.Causal, rope=rope,
                       in_dim=48, out_dim=24, bias=False)
    add_nomic(s, "nomic_b1_s1", batch=1, seq=1)
    add_nomic(s, "nomic_b2_s5_masked", batch=2, seq=5, full_masked=True)
    add_nomic(s, "nomic_b2_s17_gptj", batch=2, seq=17, hs=64, nh=4, inter=128, interleaved=True)
    # enough attention work that Attention forks threads on the scratch sub-context
    add_attn_block(s, "attn_parallel_s64", batch=2, seq=64, hs=64, nh=4, mask=MaskKind.Causal)
    add_attn_block(s, "attn_bias_parallel_s64", batch=2, seq=64, hs=64, nh=4, mask=MaskKind.Bias)
    add_attn_block(s, "attn_rope_neox_sliding_s17", seq=17, hs=64, nh=2, mask=MaskKind.SlidingWindow(4), rope="neox")
    add_bert(s, "bert_parallel_s64", batch=2, seq=64, hs=64, nh=4, inter=128, full_masked=True)
    # large enough that every projection GEMM (≥ PARALLEL_MIN_FMAS per panel), the LayerNorms and
    # SwiGLU (≥ 2·ROW_PARALLEL_MIN_ELEMENTS) fork too; 266 rows split unevenly, out_dim 200 ends
    # in a ragged panel
    for name, add in THREADED.items():
        add(s, name)
    return s


THREADED = {
    "bert_threads_b2_s133": lambda s, n: add_bert(s, n, batch=2, seq=133, hs=256, nh=4, inter=512, full_masked=True),
    "nomic_threads_b2_s133": lambda s, n: add_nomic(s, n, batch=2, seq=133, hs=256, nh=4, inter=512),
    "attn_threads_b2_s133": lambda s, n: add_attn_block(s, n, batch=2, seq=133, hs=256, nh=4, out_dim=200,
                                                        rope="neox"),
}
# parallel_for calls each threaded layer must emit: (projections, row loops); plus at least one
# for attention.  Under RLX_LLVM_GEMM=blas the projections are BLAS calls (BLAS threads itself).
MIN_FORKS = {"bert_threads_b2_s133": (4, 2), "nomic_threads_b2_s133": (4, 3), "attn_threads_b2_s133": (2, 0)}


SUITE = build()
(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


# ── every step of a large layer splits across threads ───────────────────────

def test_large_layers_fork_every_step(outcome) -> None:
    """The projections with scratch operands, the LayerNorms and SwiGLU each emit a parallel_for."""
    for name, (gemms, rows) in MIN_FORKS.items():
        forks = outcome.thunk_ir(name).count(f'@"{parallel.fork_symbol()}"(')
        assert forks >= gemms * _tiles() + rows + 1, (name, forks)


def _tiles() -> bool:
    """Whether the GEMMs run as IR tiles (not RLX_LLVM_GEMM=blas)."""
    return os.environ.get(GEMM_MODE_ENV, "auto").lower() != "blas"


def test_large_layers_on_two_threads(outcome) -> None:
    """`rl.set_num_threads(2)` at run time (no recompile): the large layers match the reference
    and the one-thread run byte for byte, and nothing outside the outputs is written.  (Under
    RLX_LLVM_GEMM=blas the OpenBLAS pool changes size too, and its sums may differ by thread count.)"""
    saved_blas, saved_own = rl.get_num_threads(), parallel.get_threads()
    runs = {}
    try:
        for threads in (1, 2):
            rl.set_num_threads(threads)
            arena = rl.Arena(outcome.before.size)
            arena.bytes[:] = outcome.before
            outcome.program.run(arena)
            runs[threads] = arena.bytes.copy()
    finally:
        rl.set_num_threads(saved_blas)
        parallel.set_threads(saved_own)
    diff = np.flatnonzero(runs[1] != runs[2])
    assert diff.size == 0 or not _tiles(), f"2 threads differ from 1 thread, first byte {diff[:8]}"
    two = dataclasses.replace(outcome, got=runs[2])
    for name in THREADED:
        two.check(name)
    two.check_untouched()


# ── the fused layer equals the chain of unfused thunks ───────────────────────

def unfused_chain(s: Suite, t: T.FusedBertLayer, out: int) -> list:
    """FusedMmBiasAct → Attention → Sgemm + FusedResidualLN → FusedMmBiasAct(Gelu) →
    FusedMmBiasAct(None) → FusedResidualLN, intermediates in fresh arena slots."""
    m, hs, inter = t.batch * t.seq, t.hs, t.int_dim
    qkv, attn, y, n1, f, y2 = (s.slot(4 * m * n) for n in (3 * hs, hs, hs, hs, inter, hs))
    return [
        T.FusedMmBiasAct(a=t.hidden, w=t.qkv_w, bias=t.qkv_b, c=qkv, m=m, k=hs, n=3 * hs, act=None),
        T.Attention(q=qkv, k=qkv + 4 * hs, v=qkv + 8 * hs, mask=t.mask, out=attn, batch=t.batch, seq=t.seq,
                    kv_seq=t.seq, heads=t.nh, kv_heads=t.nh, head_dim=t.dh, v_head_dim=t.dh,
                    mask_kind=MaskKind.Custom, scale=t.dh ** -0.5, softcap=0.0, q_row_stride=3 * hs,
                    k_row_stride=3 * hs, v_row_stride=3 * hs, bhsd=False),
        T.Sgemm(a=attn, b=t.out_w, c=y, m=m, k=hs, n=hs),
        T.FusedResidualLN(x=y, res=t.hidden, bias=t.out_b, g=t.ln1_g, b=t.ln1_b, out=n1, rows=m, h=hs,
                          eps=t.eps1, has_bias=True),
        T.FusedMmBiasAct(a=n1, w=t.fc1_w, bias=t.fc1_b, c=f, m=m, k=hs, n=inter, act=Activation.Gelu),
        T.FusedMmBiasAct(a=f, w=t.fc2_w, bias=t.fc2_b, c=y2, m=m, k=inter, n=hs, act=None),
        T.FusedResidualLN(x=y2, res=n1, bias=t.fc2_b, g=t.ln2_g, b=t.ln2_b, out=out, rows=m, h=hs,
                          eps=t.eps2, has_bias=False),
    ]


@pytest.mark.parametrize("batch,seq,hs,nh,inter,full_masked", [(1, 1, 32, 2, 64, False), (2, 5, 32, 4, 128, True),
                                                               (2, 17, 64, 4, 128, False)])
def test_bert_layer_equals_unfused_chain(batch, seq, hs, nh, inter, full_masked) -> None:
    s = Suite(batch * 100 + seq, rtol=2e-5, atol=2e-5)
    fused = add_bert(s, "fused", batch=batch, seq=seq, hs=hs, nh=nh, inter=inter, full_masked=full_masked)
    ref_out = s.slot(4 * batch * seq * hs)
    chain = unfused_chain(s, fused, ref_out)
    prog = rl.compile(rl.ThunkSchedule([fused] + chain, arena_bytes=s.nbytes), cache=False)
    arena = s.arena()
    prog.run(arena)
    n = batch * seq * hs
    got = arena.bytes[fused.out:fused.out + 4 * n].view(np.float32)
    want = arena.bytes[ref_out:ref_out + 4 * n].view(np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ── validation ───────────────────────────────────────────────────────────────

def _bert(**changes) -> T.FusedBertLayer:
    s = Suite(1)
    t = add_bert(s, "x", batch=1, seq=2, hs=8, nh=2, inter=8)
    return dataclasses.replace(t, **changes), s.nbytes


def _block(rope=None, **changes):
    s = Suite(1)
    add_attn_block(s, "x", batch=1, seq=2, hs=8, nh=2, rope=rope)
    return dataclasses.replace(s.cases[0].thunk, **changes), s.nbytes


def _nomic(**changes):
    s = Suite(1)
    t = add_nomic(s, "x", batch=1, seq=2, hs=8, nh=2, inter=8)
    return dataclasses.replace(t, **changes), s.nbytes


@pytest.mark.parametrize("make,changes,field", [
    (_bert, dict(dh=3), "dh"),
    (_bert, dict(nh=0, dh=0), "dh"),
    (_block, dict(dh=3), "dh"),
    (_block, dict(rope="neox", cos_len=3), "cos_len"),
    (_block, dict(rope="neox", hs=6, nh=2, dh=3, cos_len=6), "dh"),
    (_nomic, dict(dh=3), "dh"),
    (_nomic, dict(cos_len=3), "cos_len"),
    (_nomic, dict(hs=6, dh=3), "dh"),
])
def test_invalid(make, changes, field) -> None:
    t, top = make(**changes)
    expect_invalid(t, top + (1 << 16), field)
