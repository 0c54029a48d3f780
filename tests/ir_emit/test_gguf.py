"""GGUF decoders and DequantMatMulGguf.

* Every IR decoder, compiled alone, and every NumPy reference decoder are bit-identical to
  `gguf.quants.dequantize` (llama.cpp's own reader) on random block bytes: every code value, and
  scales that are NaN, ±inf or denormal (any NaN matches any NaN, at the same positions).
* DequantMatMulGguf against its reference (f64 sums) for m in {1, 3, 17}, odd n, in one program (m ≥ 2:
  decoded panels, also over several k-blocks and blocks of rows);
  and against gguf-dequantize + a float64 NumPy matmul.
* DequantGroupedMatMulGguf likewise (odd m, ids covering every expert), also against gguf-dequantize
  + NumPy; an expert id ≥ num_experts is an ExecutionError natively and an IndexError in the reference.
* DequantMoEWeightsGguf bit-identical to the reference and to gguf-dequantize, transposed per expert.
* Bad input: k not a whole number of blocks, a scheme not decoded, a weight buffer too short.
"""
from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType as G
from gguf.quants import dequantize as gguf_dequantize
from llvmlite import binding as llvm
from llvmlite import ir

import rlx_llvm as rl
from rlx_llvm import reference as reference_registry
from rlx_llvm import thunks as T
from rlx_llvm.errors import ExecutionError
from rlx_llvm.ir_emit import gguf as emit
from rlx_llvm.jit import host
from rlx_llvm.kernels.blas import Status
from rlx_llvm.ops import QuantScheme
from rlx_llvm.reference import gguf as ref
from rlx_llvm.testing.gguf import SCALES, random_blocks
from rlx_llvm.thunks.quant import GGUF_BLOCKS
from tests.harness import NAN_FILL as SENTINEL
from tests.harness import Suite, assert_close, assert_same, expect_invalid, suite_tests

ORACLE = {"GgufQ8_0": G.Q8_0, "GgufQ4_0": G.Q4_0, "GgufQ4_1": G.Q4_1, "GgufQ5_0": G.Q5_0, "GgufQ5_1": G.Q5_1,
          "GgufQ2K": G.Q2_K, "GgufQ3K": G.Q3_K, "GgufQ4K": G.Q4_K, "GgufQ5K": G.Q5_K, "GgufQ6K": G.Q6_K,
          "GgufIQ4NL": G.IQ4_NL, "GgufIQ4XS": G.IQ4_XS}
"""Our schemes that `gguf` dequantizes (it has no Q8_K)."""

HOST_WIDTH = emit.chunk_width(host().lanes(32))
BLOCKS = 400   # random blocks per scheme: every code value in every position, many NaN/inf scales


# ── the decoders alone ───────────────────────────────────────────────────────

WIDTHS = (4, 8, 16)   # chunk widths: SSE, AVX2 and AVX-512 hosts (LLVM splits the wide ones here)


class Decoders:
    """Every scheme's IR decoder at every chunk width as `void dequantize_<scheme>_<width>(ptr blocks,
    ptr out, i64 count)`."""

    def __init__(self) -> None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        module = ir.Module(name="gguf_decoders")
        module.triple = llvm.get_process_triple()
        for scheme in emit.DECODERS:
            for width in WIDTHS:
                emit.define_dequantize(module, scheme, width, f"dequantize_{scheme}_{width}")
        target = llvm.Target.from_triple(llvm.get_process_triple())
        machine = target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                               features=llvm.get_host_cpu_features().flatten(), opt=3, jit=True)
        mod = llvm.parse_assembly(str(module))
        mod.verify()
        self.engine = llvm.create_mcjit_compiler(mod, machine)
        self.engine.finalize_object()

    def __call__(self, scheme: str, data: np.ndarray, width: int = 0) -> np.ndarray:
        elems, nbytes = GGUF_BLOCKS[scheme]
        count = data.size // nbytes
        out = np.full(count * elems, np.nan, np.float32)
        fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
            self.engine.get_function_address(f"dequantize_{scheme}_{width or HOST_WIDTH}"))
        fn(data.ctypes.data, out.ctypes.data, count)
        return out


@pytest.fixture(scope="module")
def decoders() -> Decoders:
    return Decoders()


def oracle(scheme: str, data: np.ndarray) -> np.ndarray:
    """`gguf.quants.dequantize`, flat."""
    with np.errstate(all="ignore"):
        return gguf_dequantize(data, ORACLE[scheme]).reshape(-1).astype(np.float32)


SPECIAL_HALVES = np.array([np.inf, -np.inf, np.nan, -np.nan, 6e-8, -6e-8, 0.0, -0.0, 65504.0], np.float16)


def with_special_scales(scheme: str, data: np.ndarray) -> np.ndarray:
    """The first blocks' f16 scale `d` set to ±inf, NaN, denormals, ±0 and the largest half."""
    _, nbytes = GGUF_BLOCKS[scheme]
    blocks = data.reshape(-1, nbytes).copy()
    at = SCALES[scheme][0]
    blocks[:SPECIAL_HALVES.size, at:at + 2] = SPECIAL_HALVES.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


@pytest.mark.parametrize("sane", [False, True], ids=["any-scales", "sane-scales"])
@pytest.mark.parametrize("scheme", list(ORACLE))
def test_decoders_match_gguf_bit_for_bit(decoders: Decoders, scheme: str, sane: bool) -> None:
    """Every chunk width (the host's and the others'), and the NumPy reference."""
    data = random_blocks(scheme, BLOCKS, np.random.default_rng(len(scheme) + sane), sane=sane)
    data = data if sane else with_special_scales(scheme, data)
    want = oracle(scheme, data)
    if not sane:
        assert np.isnan(want).any() and np.isinf(want).any(), "the random scales should reach NaN and inf"
    for width in WIDTHS:
        assert_same(decoders(scheme, data, width), want, what=f"IR {scheme} at width {width}")
    assert_same(ref.dequantize(scheme, data), want, what=f"NumPy {scheme}")


def test_random_blocks_hold_every_code_value() -> None:
    data = random_blocks("GgufQ4_0", BLOCKS, np.random.default_rng(1)).reshape(BLOCKS, 18)
    codes = np.concatenate([data[:, 2:] & 15, data[:, 2:] >> 4])
    assert set(np.unique(codes)) == set(range(16))


def test_q8_k_decoder_matches_reference(decoders: Decoders) -> None:
    """gguf has no Q8_K: `d·q` per element (d f32 at byte 0, 256 int8 codes, 16 int16 sums unused)."""
    data = random_blocks("GgufQ8K", BLOCKS, np.random.default_rng(3), sane=False)
    blocks = data.reshape(BLOCKS, 292)
    d = blocks[:, :4].copy().view(np.float32)
    with np.errstate(all="ignore"):
        want = (d * blocks[:, 4:260].view(np.int8).astype(np.float32)).reshape(-1)
    assert_same(decoders("GgufQ8K", data), want, what="IR Q8_K")
    assert_same(ref.dequantize("GgufQ8K", data), want, what="NumPy Q8_K")


def test_q4_0_hand_example(decoders: Decoders) -> None:
    """d = 0.5, byte i = (i + 1) << 4 | i: element i is 0.5·(i − 8), element 16 + i is 0.5·(i + 1 − 8)."""
    block = np.concatenate([np.array([0.5], np.float16).view(np.uint8),
                            np.array([(i + 1) % 16 << 4 | i for i in range(16)], np.uint8)])
    want = 0.5 * (np.concatenate([np.arange(16), (np.arange(16) + 1) % 16]) - 8).astype(np.float32)
    assert_same(decoders("GgufQ4_0", block), want)


# ── DequantMatMulGguf ────────────────────────────────────────────────────────

def add_matmul(s: Suite, scheme: str, m: int, blocks: int, n: int) -> str:
    """A DequantMatMulGguf case over sane random blocks and normal x; returns its name."""
    elems, _ = GGUF_BLOCKS[scheme]
    k = blocks * elems
    x, w = s.normal(m, k), random_blocks(scheme, n * blocks, s.rng)
    magnitude = np.abs(x.astype(np.float64)) @ np.abs(ref.dequantize(scheme, w).reshape(n, k).astype(np.float64)).T
    dst, o = s.out(np.float32, m * n)
    name = f"DequantMatMulGguf-{scheme}-{m}x{k}x{n}"
    s.add(name, T.DequantMatMulGguf(x=s.put(x), w_q=s.put(w, skew=1), dst=dst, m=m, k=k, n=n,
                                    scheme=getattr(QuantScheme, scheme)), [o], atol=1e-6 * magnitude.reshape(-1))
    return name


def every_expert(m: int, experts: int, rng: np.random.Generator) -> np.ndarray:
    """f32-encoded expert ids of m ≥ experts rows, each expert used at least once, shuffled."""
    return rng.permutation(np.arange(m) % experts).astype(np.float32)


def add_grouped(s: Suite, scheme: str, m: int, blocks: int, n: int, experts: int) -> str:
    """A DequantGroupedMatMulGguf case whose rows use every expert; returns its name."""
    elems, _ = GGUF_BLOCKS[scheme]
    k = blocks * elems
    x, w, ids = s.normal(m, k), random_blocks(scheme, experts * n * blocks, s.rng), every_expert(m, experts, s.rng)
    slabs = np.abs(ref.dequantize(scheme, w).reshape(experts, n, k).astype(np.float64))
    magnitude = np.einsum("ik,ink->in", np.abs(x.astype(np.float64)), slabs[ids.astype(int)])
    dst, o = s.out(np.float32, m * n)
    name = f"DequantGroupedMatMulGguf-{scheme}-{m}x{k}x{n}-E{experts}"
    s.add(name, T.DequantGroupedMatMulGguf(input=s.put(x), w_q=s.put(w, skew=1), expert_idx=s.put(ids), dst=dst,
                                           m=m, k_dim=k, n=n, num_experts=experts,
                                           scheme=getattr(QuantScheme, scheme)), [o], atol=1e-6 * magnitude.reshape(-1))
    return name


def add_moe_weights(s: Suite, scheme: str, blocks: int, n: int, experts: int, sane: bool = True) -> str:
    """A DequantMoEWeightsGguf case (compared bit for bit); returns its name."""
    elems, _ = GGUF_BLOCKS[scheme]
    w = random_blocks(scheme, experts * n * blocks, s.rng, sane=sane)
    dst, o = s.out(np.float32, experts * n * blocks * elems)
    name = f"DequantMoEWeightsGguf-{scheme}-{blocks * elems}x{n}-E{experts}{'' if sane else '-any-scales'}"
    s.add(name, T.DequantMoEWeightsGguf(w_q=s.put(w, skew=1), dst=dst, k_dim=blocks * elems, n=n,
                                        num_experts=experts, scheme=getattr(QuantScheme, scheme)), [o], exact=True)
    return name


PANEL_CASES = {"GgufQ4_0": (200, 65), "GgufQ4K": (7, 9)}
"""(m, blocks of k) of DequantMatMulGguf cases whose decoded panels take several k-blocks (Q4_0's
last one shorter) and, for Q4_0, several blocks of rows of x."""


def build() -> Suite:
    s = Suite(11, rtol=1e-6)   # plus 1e-6·Σ|x·w| per output: f32 sums in another order
    for scheme in emit.DECODERS:
        elems, _ = GGUF_BLOCKS[scheme]
        for m in (1, 3, 17):
            add_matmul(s, scheme, m, 2 if elems == 256 else 5, 7)
        add_grouped(s, scheme, 7, 1 if elems == 256 else 3, 5, 4)
        add_moe_weights(s, scheme, 1 if elems == 256 else 3, 5, 3)
    add_matmul(s, "GgufQ4_0", 5, 16, 301)     # weight rows split across threads
    add_matmul(s, "GgufQ6K", 2, 3, 129)
    for scheme, (m, blocks) in PANEL_CASES.items():
        add_matmul(s, scheme, m, blocks, 9)
    add_grouped(s, "GgufQ4_0", 9, 8, 257, 3)  # weight rows split across threads
    add_moe_weights(s, "GgufQ4_0", 16, 131, 3)  # weight rows split across threads
    add_moe_weights(s, "GgufQ4K", 2, 3, 2, sane=False)
    return s


SUITE = build()
(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


@pytest.mark.parametrize("scheme", ["GgufQ4_0", "GgufQ8_0", "GgufQ5_1", "GgufQ4K", "GgufQ3K", "GgufIQ4XS"])
@pytest.mark.parametrize("m", [1, 3, 17])
def test_matmul_matches_gguf_dequantize_then_numpy(outcome, scheme: str, m: int) -> None:
    elems, nbytes = GGUF_BLOCKS[scheme]
    case = next(c for c in SUITE.cases if c.name.startswith(f"DequantMatMulGguf-{scheme}-{m}x"))
    t = case.thunk
    arena = outcome.before
    x = arena[t.x:t.x + 4 * t.m * t.k].view(np.float32).reshape(t.m, t.k).astype(np.float64)
    w = oracle(scheme, arena[t.w_q:t.w_q + t.n * t.k // elems * nbytes]).reshape(t.n, t.k).astype(np.float64)
    want = x @ w.T
    got = outcome.output(case.name).reshape(t.m, t.n)
    assert_close(got, want, rtol=1e-5, atol=1e-5 * np.abs(x) @ np.abs(w).T, what=case.name)


def test_panel_cases_take_several_k_blocks_and_row_blocks() -> None:
    """The cases above reach every loop of the panel GEMM on this host."""
    plans = {scheme: (emit.PanelPlan.of(host().lanes(32), scheme, blocks * GGUF_BLOCKS[scheme][0], m), m, blocks)
             for scheme, (m, blocks) in PANEL_CASES.items()}
    assert all(plan.blocks < blocks for plan, _, blocks in plans.values()), plans
    plan, m, blocks = plans["GgufQ4_0"]
    assert blocks % plan.blocks and plan.row_block < m, plan


@pytest.mark.parametrize("scheme", ["GgufQ8_0", "GgufQ4_0", "GgufQ4K", "GgufQ6K"])
def test_grouped_matches_gguf_dequantize_then_numpy(outcome, scheme: str) -> None:
    elems, nbytes = GGUF_BLOCKS[scheme]
    case = next(c for c in SUITE.cases if c.name.startswith(f"DequantGroupedMatMulGguf-{scheme}-"))
    t, arena = case.thunk, outcome.before
    x = arena[t.input:t.input + 4 * t.m * t.k_dim].view(np.float32).reshape(t.m, t.k_dim).astype(np.float64)
    ids = arena[t.expert_idx:t.expert_idx + 4 * t.m].view(np.float32).astype(int)
    assert set(ids) == set(range(t.num_experts))
    slab = t.n * t.k_dim // elems * nbytes
    w = [oracle(scheme, arena[t.w_q + e * slab:t.w_q + (e + 1) * slab]).reshape(t.n, t.k_dim).astype(np.float64)
         for e in ids]
    want = np.stack([x[i] @ w[i].T for i in range(t.m)])
    magnitude = np.stack([np.abs(x[i]) @ np.abs(w[i]).T for i in range(t.m)])
    assert_close(outcome.output(case.name).reshape(t.m, t.n), want, rtol=1e-5, atol=1e-5 * magnitude, what=case.name)


@pytest.mark.parametrize("scheme", list(ORACLE))
def test_moe_weights_match_gguf_dequantize_transposed(outcome, scheme: str) -> None:
    elems, nbytes = GGUF_BLOCKS[scheme]
    case = next(c for c in SUITE.cases if c.name.startswith(f"DequantMoEWeightsGguf-{scheme}-"))
    t = case.thunk
    packed = outcome.before[t.w_q:t.w_q + t.num_experts * t.n * t.k_dim // elems * nbytes]
    want = oracle(scheme, packed).reshape(t.num_experts, t.n, t.k_dim).transpose(0, 2, 1)
    assert_same(outcome.output(case.name).reshape(want.shape), want, what=case.name)


def test_out_of_range_expert_id_is_an_execution_error() -> None:
    """Native: INDEX_OUT_OF_RANGE naming the row before anything is written; the reference raises too."""
    lay = Suite(fill=SENTINEL)
    w = random_blocks("GgufQ8_0", 2 * 3 * 2, lay.rng)
    bad = T.DequantGroupedMatMulGguf(input=lay.put(lay.normal(3, 64)), w_q=lay.put(w),
                                     expert_idx=lay.put(np.float32([0, 2, 1])), dst=lay.slot(36), m=3, k_dim=64, n=3,
                                     num_experts=2, scheme=QuantScheme.GgufQ8_0)
    arena = lay.arena()
    with pytest.raises(ExecutionError) as info:
        rl.compile(rl.ThunkSchedule([bad], arena_bytes=lay.nbytes), cache=False).run(arena)
    assert (info.value.kind, info.value.status) == ("DequantGroupedMatMulGguf", Status.INDEX_OUT_OF_RANGE | 2 << 8)
    assert "expert id of row 1" in str(info.value)
    assert (arena.bytes[bad.dst:bad.dst + 36] == SENTINEL).all(), "the failing thunk writes nothing"
    with pytest.raises(IndexError, match="num_experts 2"):
        reference_registry.run_thunk(lay.initial_bytes(), bad)


# ── bad input ────────────────────────────────────────────────────────────────

def matmul(scheme: str = "GgufQ4_0", k: int = 64, **changes) -> T.DequantMatMulGguf:
    fields = dict(x=0, w_q=4096, dst=8192, m=2, k=k, n=3, scheme=getattr(QuantScheme, scheme))
    return T.DequantMatMulGguf(**(fields | changes))


def grouped(scheme: str = "GgufQ4_0", k: int = 64, **changes) -> T.DequantGroupedMatMulGguf:
    fields = dict(input=0, w_q=4096, expert_idx=2048, dst=8192, m=2, k_dim=k, n=3, num_experts=2,
                  scheme=getattr(QuantScheme, scheme))
    return T.DequantGroupedMatMulGguf(**(fields | changes))


def moe_weights(scheme: str = "GgufQ4_0", k: int = 64, **changes) -> T.DequantMoEWeightsGguf:
    fields = dict(w_q=4096, dst=8192, k_dim=k, n=3, num_experts=2, scheme=getattr(QuantScheme, scheme))
    return T.DequantMoEWeightsGguf(**(fields | changes))


KINDS = {"matmul": (matmul, "k"), "grouped": (grouped, "k_dim"), "moe_weights": (moe_weights, "k_dim")}
"""Each GGUF kind's bad-input thunk builder and the name of its reduction-length field."""


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("scheme,k", [("GgufQ4_0", 48), ("GgufQ8_0", 33), ("GgufQ4K", 128), ("GgufQ6K", 300)])
def test_k_not_a_whole_number_of_blocks_is_refused(kind: str, scheme: str, k: int) -> None:
    build_thunk, k_field = KINDS[kind]
    elems, _ = GGUF_BLOCKS[scheme]
    err = expect_invalid(build_thunk(scheme, k), 1 << 14, k_field, f"block size {elems}")
    assert scheme in str(err)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("scheme", ["GgufIQ2XXS", "GgufIQ3S", "GgufIQ1M", "GgufTQ1_0", "GgufMXFP4", "GgufQ1_0"])
def test_schemes_not_decoded_are_refused_by_name(kind: str, scheme: str) -> None:
    build_thunk, _ = KINDS[kind]
    elems, _ = GGUF_BLOCKS[scheme]
    err = expect_invalid(build_thunk(scheme, elems), 1 << 14, "scheme", "not decoded")
    assert scheme in str(err)


@pytest.mark.parametrize("kind", list(KINDS))
def test_non_gguf_scheme_is_refused(kind: str) -> None:
    build_thunk, _ = KINDS[kind]
    t = dataclasses.replace(build_thunk(), scheme=QuantScheme.Int8Block(block_size=32))
    expect_invalid(t, 1 << 14, "scheme")


@pytest.mark.parametrize("thunk,end", [
    (matmul(dst=0, x=256), 4096 + 107),                          # n·k/32·18 = 3·2·18 = 108 bytes
    (grouped(dst=0, input=256, expert_idx=1024), 4096 + 215),    # two such slabs
    (moe_weights(dst=0), 4096 + 215),
], ids=list(KINDS))
def test_weight_buffer_too_short_is_refused(thunk, end: int) -> None:
    """An arena ending 1 byte before the end of the packed weights at 4096 is refused on w_q."""
    expect_invalid(thunk, end, "w_q")


def test_grouped_needs_an_expert() -> None:
    expect_invalid(grouped(num_experts=0), 1 << 14, "num_experts", "num_experts = 0")
