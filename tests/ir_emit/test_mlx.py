"""MLX decoders, DequantMatMulMlx and DequantGroupedMatMulMlx.

* Every IR decoder (affine bits 2/3/4/5/6/8, mxfp4, mxfp8; f32 and bf16 scales; chunk widths 4, 8, 16),
  compiled alone, is bit-identical to the NumPy reference and to an element-by-element decode written
  from the spec text, on random words (every code value) with special scales (NaN, ±inf, denormals, ±0,
  every E8M0 byte); and to `mlx.core.dequantize` where MLX is installed.
* DequantMatMulMlx against its reference (f64 sums) for m in {0, 1, 3, 4, 5, 9}, n around the vector
  width, k several groups, groups of 32/64/128, every scheme; all in one program; against
  `mlx.core.quantized_matmul` where MLX is installed.
* Some of those cases compiled again with the 4- and 16-lane chunks of SSE and AVX-512 hosts.
* DequantGroupedMatMulMlx likewise (every expert used, f32 and bf16 scales); an id that is not an integer
  in [0, num_experts) is an ExecutionError naming the row (status >> 8), with dst untouched.
* Bad input: one test per check rule, and a buffer too short.
"""
from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pytest
from llvmlite import ir

import rlx_llvm as rl
from rlx_llvm import reference as reference_registry
from rlx_llvm import thunks as T
from rlx_llvm.errors import ExecutionError
from rlx_llvm.ir_emit import mlx as emit
from rlx_llvm import jit
from rlx_llvm.jit import host
from rlx_llvm.kernels.blas import Status
from rlx_llvm.ops import QuantScheme
from rlx_llvm.reference import mlx as ref
from rlx_llvm.reference.gemm import checked_expert_ids
from rlx_llvm.reference.halves import bf16_bits_to_f32, f32_to_bf16_bits
from rlx_llvm.thunks.quant import mlx_bytes
from tests.harness import NAN_FILL as SENTINEL
from tests.harness import Suite, assert_close, assert_same, expect_invalid, suite_tests

W = host().lanes(32)
HOST_WIDTH = emit.chunk_width(W)
WIDTHS = (4, 8, 16)   # chunk widths: SSE, AVX2 and AVX-512 hosts
AFFINE = [QuantScheme.MlxAffine(bits=bits, group_size=64) for bits in emit.AFFINE_BITS]
MX = [QuantScheme.MlxMxfp4(group_size=32), QuantScheme.MlxMxfp8(group_size=32)]
SCHEMES = AFFINE + MX
GROUPS = 64   # groups decoded per scheme: every code value in many positions


def label(scheme: QuantScheme) -> str:
    """`affine4g64`, `mxfp4g32`."""
    kind = f"affine{scheme.bits}" if isinstance(scheme, QuantScheme.MlxAffine) else type(scheme).__name__[3:].lower()
    return f"{kind}g{scheme.group_size}"


# ── random packed weights ───────────────────────────────────────────────────

SPECIAL_F32 = np.array([np.nan, np.inf, -np.inf, 1e-40, -1e-40, 0.0, -0.0, 3e38], np.float32)
SPECIAL_E8M0 = np.array([0, 1, 127, 254, 255], np.uint8)   # 2^−127 (an f32 denormal), 2^−126, 1, 2^127, +inf


def random_words(scheme: QuantScheme, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Uniformly random u32 words `[rows, k·bits/32]` (every code value in every position)."""
    return rng.integers(0, 1 << 32, (rows, k * ref.code_bits(scheme) // 32), dtype=np.uint64).astype(np.uint32)


def random_params(scheme: QuantScheme, rows: int, groups: int, rng: np.random.Generator, special: bool = False
                  ) -> tuple[np.ndarray, np.ndarray | None]:
    """(scales, biases) `[rows, groups]`: affine f32 scales in ±[0.01, 0.1) and biases around 0; mxfp E8M0
    bytes near 1 (or, `special`, every byte value; affine: NaN, ±inf, denormals, ±0 among them)."""
    if not isinstance(scheme, QuantScheme.MlxAffine):
        scales = (rng.integers(0, 256, (rows, groups)) if special else rng.integers(118, 132, (rows, groups))).astype(np.uint8)
        if special:
            scales.reshape(-1)[:SPECIAL_E8M0.size] = SPECIAL_E8M0
        return scales, None
    scales = (rng.uniform(0.01, 0.1, (rows, groups)) * rng.choice([-1, 1], (rows, groups))).astype(np.float32)
    biases = (rng.standard_normal((rows, groups)) * 0.1).astype(np.float32)
    if special:
        scales.reshape(-1)[:SPECIAL_F32.size] = SPECIAL_F32
        biases.reshape(-1)[-SPECIAL_F32.size:] = SPECIAL_F32
    return scales, biases


def as_stored(values: np.ndarray | None, bf16: bool) -> np.ndarray | None:
    """Affine parameters as the arena holds them: f32, or bf16 bits when `bf16`."""
    return values if values is None or not bf16 or values.dtype == np.uint8 else f32_to_bf16_bits(values)


def as_f32(stored: np.ndarray | None) -> np.ndarray | None:
    """Stored parameters as the decoder reads them (bf16 bits widened; E8M0 bytes unchanged)."""
    return bf16_bits_to_f32(stored) if stored is not None and stored.dtype == np.uint16 else stored


# ── an element-by-element decode written from the spec text ─────────────────

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def spec_code(words: np.ndarray, p: int, bits: int) -> int:
    """Element p of a row: bits p·bits … p·bits + bits − 1 of the LSB-first stream of u32 words."""
    return sum(((int(words[(p * bits + i) // 32]) >> ((p * bits + i) % 32)) & 1) << i for i in range(bits))


def spec_e4m3(code: int) -> float:
    """OCP E4M3: S.1111.111 is NaN; exponent 0 subnormal m/8·2^−6; else (1 + m/8)·2^(e − 7)."""
    sign, exp, man = -1.0 if code & 0x80 else 1.0, (code >> 3) & 15, code & 7
    if exp == 15 and man == 7:
        return float("nan")
    return sign * (man / 8 * 2.0 ** -6 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7))


def spec_e8m0(byte: int) -> np.float32:
    """2^(s − 127) (s = 255 → +inf, as MLX decodes it)."""
    return np.float32(np.inf) if byte == 255 else np.float32(2.0 ** (int(byte) - 127))


def spec_row(scheme: QuantScheme, words: np.ndarray, scales: np.ndarray, biases: np.ndarray | None, k: int
             ) -> np.ndarray:
    """One weight row, element by element, in f32 scalar arithmetic (affine: `scale·q + bias`, two roundings)."""
    bits, group = ref.code_bits(scheme), scheme.group_size
    out = np.empty(k, np.float32)
    with np.errstate(all="ignore"):
        for p in range(k):
            q, g = spec_code(words, p, bits), p // group
            if isinstance(scheme, QuantScheme.MlxAffine):
                out[p] = np.float32(scales[g]) * np.float32(q) + np.float32(biases[g])
            else:
                value = E2M1[q] if isinstance(scheme, QuantScheme.MlxMxfp4) else spec_e4m3(q)
                out[p] = np.float32(value) * spec_e8m0(scales[g])
    return out


def spec_dequantize(scheme: QuantScheme, words: np.ndarray, scales: np.ndarray, biases: np.ndarray | None, k: int
                    ) -> np.ndarray:
    """Every row of `[rows, k]` by `spec_row`."""
    return np.stack([spec_row(scheme, words[r], scales[r], None if biases is None else biases[r], k)
                     for r in range(words.shape[0])])


def test_spec_decode_hand_examples() -> None:
    """3-bit codes 0…7 then 7…0 packed by hand (element 10 straddles words 0 and 1); E4M3 and E8M0 values."""
    codes = list(range(8)) + list(range(7, -1, -1))
    stream = sum(c << (3 * p) for p, c in enumerate(codes))
    words = np.array([stream & 0xFFFFFFFF, stream >> 32], np.uint32)
    assert [spec_code(words, p, 3) for p in range(16)] == codes
    assert ref.unpack(words[None], 3, 16)[0].tolist() == codes
    assert (spec_e4m3(0x7E), spec_e4m3(0x01), spec_e4m3(0xB8)) == (448.0, 2.0 ** -9, -1.0)
    assert (spec_e8m0(127), spec_e8m0(0), spec_e8m0(255)) == (1.0, 2.0 ** -127, np.inf)


# ── the decoders alone ───────────────────────────────────────────────────────

DECODER_CASES = ([(s, False, w) for s in SCHEMES for w in WIDTHS]
                 + [(s, True, HOST_WIDTH) for s in AFFINE]
                 + [(QuantScheme.MlxAffine(bits=bits, group_size=g), False, HOST_WIDTH)
                    for bits in emit.AFFINE_BITS for g in (32, 128)])


def decoder_name(scheme: QuantScheme, bf16: bool, width: int) -> str:
    return f"dequantize_{label(scheme)}_{'bf16' if bf16 else 'f32'}_{width}"


class Decoders:
    """Every decoder case as `void dequantize_<scheme>_<scales>_<width>(codes, scales, biases, out, groups)`."""

    def __init__(self) -> None:
        module = ir.Module(name="mlx_decoders")
        for case in DECODER_CASES:
            emit.define_dequantize(module, *case, decoder_name(*case))
        self.engine = jit.Engine()
        self.engine.load(jit.compile_ir(str(module)))

    def __call__(self, scheme: QuantScheme, words: np.ndarray, scales: np.ndarray, biases: np.ndarray | None,
                 width: int = HOST_WIDTH) -> np.ndarray:
        """f32 `[rows, k]` of `words [rows, ·]` with stored per-group `scales`/`biases` `[rows, groups]`."""
        rows, groups = scales.shape
        out = np.full((rows, groups * scheme.group_size), np.nan, np.float32)
        bf16 = scales.dtype == np.uint16
        fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 4, ctypes.c_int64)(
            self.engine.address(decoder_name(scheme, bf16, width)))
        words, scales = np.ascontiguousarray(words), np.ascontiguousarray(scales)
        biases = scales if biases is None else np.ascontiguousarray(biases)
        fn(words.ctypes.data, scales.ctypes.data, biases.ctypes.data, out.ctypes.data, rows * groups)
        return out


@pytest.fixture(scope="module")
def decoders() -> Decoders:
    return Decoders()


def decoder_input(scheme: QuantScheme, bf16: bool, seed: int) -> tuple:
    """(words, stored scales, stored biases, k) of GROUPS groups in 4 rows, with special scales."""
    rng = np.random.default_rng(seed)
    k = GROUPS // 4 * scheme.group_size
    scales, biases = random_params(scheme, 4, GROUPS // 4, rng, special=True)
    return random_words(scheme, 4, k, rng), as_stored(scales, bf16), as_stored(biases, bf16), k


@pytest.mark.parametrize("scheme,bf16,width", DECODER_CASES, ids=[decoder_name(*c) for c in DECODER_CASES])
def test_decoder_matches_reference_and_spec(decoders: Decoders, scheme: QuantScheme, bf16: bool, width: int
                                            ) -> None:
    words, scales, biases, k = decoder_input(scheme, bf16, len(DECODER_CASES) + width + bf16)
    want = ref.dequantize(scheme, words, as_f32(scales), as_f32(biases), k)
    assert np.isnan(want).any() and np.isinf(want).any(), "the special scales should reach NaN and inf"
    assert_same(decoders(scheme, words, scales, biases, width), want, what=f"IR {decoder_name(scheme, bf16, width)}")
    assert_same(spec_dequantize(scheme, words, as_f32(scales), as_f32(biases), k), want, what="spec decode")


@pytest.mark.parametrize("scheme", SCHEMES, ids=label)
def test_random_words_hold_every_code(scheme: QuantScheme) -> None:
    words, _, _, k = decoder_input(scheme, False, 1)
    codes = ref.unpack(words, ref.code_bits(scheme), k)
    assert set(np.unique(codes)) == set(range(1 << ref.code_bits(scheme)))


@pytest.mark.parametrize("scheme", SCHEMES, ids=label)
def test_decoder_matches_mlx_dequantize(decoders: Decoders, scheme: QuantScheme) -> None:
    mx = pytest.importorskip("mlx.core")
    words, scales, biases, k = decoder_input(scheme, False, 2)
    if isinstance(scheme, QuantScheme.MlxAffine):
        want = mx.dequantize(mx.array(words), mx.array(scales), mx.array(biases), group_size=scheme.group_size,
                             bits=scheme.bits)
    else:
        want = mx.dequantize(mx.array(words), mx.array(scales), group_size=scheme.group_size,
                             bits=ref.code_bits(scheme), mode=type(scheme).__name__[3:].lower(), dtype=mx.float32)
    assert_same(decoders(scheme, words, scales, biases), np.array(want), what=f"IR {label(scheme)} vs MLX")


# ── DequantMatMulMlx and DequantGroupedMatMulMlx ────────────────────────────

def weight_magnitude(scheme: QuantScheme, words: np.ndarray, scales: np.ndarray, biases: np.ndarray | None, k: int
                     ) -> np.ndarray:
    """`|scale|·q + |bias|` per weight (affine: the kernel sums `scale·Σ x·q + bias·Σ x`), else `|w|`, as f64."""
    if biases is None:
        return np.abs(ref.dequantize(scheme, words, scales, None, k)).astype(np.float64)
    group = scheme.group_size
    q = ref.unpack(words, scheme.bits, k).astype(np.float64)
    return np.repeat(np.abs(scales.astype(np.float64)), group, 1) * q + np.repeat(np.abs(biases.astype(np.float64)), group, 1)


def put_params(s: Suite, scales: np.ndarray, biases: np.ndarray | None) -> tuple[int, int]:
    """Slots of the scales and (affine) biases; mxfp has no biases (offset 0)."""
    return s.put(scales, skew=2), 0 if biases is None else s.put(biases, skew=2)


def add_matmul(s: Suite, scheme: QuantScheme, m: int, groups: int, n: int) -> str:
    """A DequantMatMulMlx case over random words and sane parameters, normal x; returns its name."""
    k = groups * scheme.group_size
    x, words = s.normal(m, k), random_words(scheme, n, k, s.rng)
    scales, biases = random_params(scheme, n, groups, s.rng)
    magnitude = np.abs(x) @ weight_magnitude(scheme, words, scales, biases, k).T
    scale, zp = put_params(s, scales, biases)
    dst, o = s.out(np.float32, m * n)
    name = f"DequantMatMulMlx-{label(scheme)}-{m}x{k}x{n}"
    s.add(name, T.DequantMatMulMlx(x=s.put(x), w_q=s.put(words, skew=1), scale=scale, zp=zp, dst=dst, m=m, k=k, n=n,
                                   scheme=scheme), [o], atol=1e-6 * magnitude.reshape(-1))
    return name


def every_expert(m: int, experts: int, rng: np.random.Generator) -> np.ndarray:
    """f32-encoded expert ids of m ≥ experts rows, each expert used at least once, shuffled."""
    return rng.permutation(np.arange(m) % experts).astype(np.float32)


def add_grouped(s: Suite, scheme: QuantScheme, m: int, groups: int, n: int, experts: int, bf16: bool = False) -> str:
    """A DequantGroupedMatMulMlx case whose rows use every expert (slabs padded past their codes)."""
    k = groups * scheme.group_size
    slab = n * k * ref.code_bits(scheme) // 8 + 12
    words = random_words(scheme, experts * n, k, s.rng).reshape(experts, -1).view(np.uint8)
    packed = np.concatenate([words, s.rng.integers(0, 256, (experts, 12), dtype=np.uint8)], axis=1)
    scales, biases = random_params(scheme, experts * n, groups, s.rng)
    scales, biases = as_stored(scales, bf16), as_stored(biases, bf16)
    x, ids = s.normal(m, k), every_expert(m, experts, s.rng)
    w = weight_magnitude(scheme, words.view(np.uint32).reshape(experts * n, -1), as_f32(scales), as_f32(biases), k)
    w = w.reshape(experts, n, k)[ids.astype(int)]
    scale, zp = put_params(s, scales, biases)
    dst, o = s.out(np.float32, m * n)
    name = f"DequantGroupedMatMulMlx-{label(scheme)}{'-bf16' if bf16 else ''}-{m}x{k}x{n}-E{experts}"
    s.add(name, T.DequantGroupedMatMulMlx(input=s.put(x), w_q=s.put(packed, skew=1), scale=scale, zp=zp,
                                          expert_idx=s.put(ids), dst=dst, m=m, k_dim=k, n=n, num_experts=experts,
                                          slab_bytes=slab, scheme=scheme, scale_bf16=bf16),
          [o], atol=1e-6 * np.einsum("ik,ink->in", np.abs(x), w).reshape(-1))
    return name


def build() -> Suite:
    s = Suite(13, rtol=1e-6)   # plus 1e-6·Σ|x·w| per output: f32 sums in another order
    affine4 = QuantScheme.MlxAffine(bits=4, group_size=64)
    for m in (0, 1, 3, 4, 5, 9):
        add_matmul(s, affine4, m, 3, W + 1)
    for i, bits in enumerate(emit.AFFINE_BITS):
        for j, group in enumerate((32, 64, 128)):
            add_matmul(s, QuantScheme.MlxAffine(bits=bits, group_size=group), 1 + (i + j) % 2, 2, (W - 1, W, W + 2)[j])
    for scheme in MX:
        for m in (1, 5):
            add_matmul(s, scheme, m, 3, W)
    add_matmul(s, affine4, 3, 0, 5)                    # k = 0: zeros
    add_matmul(s, affine4, 5, 4, 301)                  # weight rows split across threads
    for scheme in (QuantScheme.MlxAffine(bits=3, group_size=32), affine4, *MX):
        add_grouped(s, scheme, 7, 2, W + 1, 3)
    add_grouped(s, QuantScheme.MlxAffine(bits=6, group_size=64), 9, 2, W - 1, 4, bf16=True)
    add_grouped(s, affine4, 9, 4, 257, 3, bf16=True)   # weight rows split across threads
    return s


SUITE = build()
(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)

OTHER_WIDTH_CASES = [f"DequantMatMulMlx-affine4g64-5x192x{W + 1}", f"DequantMatMulMlx-affine3g32-2x64x{W - 1}",
                     f"DequantMatMulMlx-mxfp4g32-5x96x{W}", f"DequantMatMulMlx-mxfp8g32-1x96x{W}",
                     f"DequantGroupedMatMulMlx-affine6g64-bf16-9x128x{W - 1}-E4"]
"""Cases compiled again at the chunk widths of other hosts."""


@pytest.mark.parametrize("width", [w for w in WIDTHS if w != HOST_WIDTH])
def test_tiles_at_other_hosts_chunk_widths_match_reference(width: int) -> None:
    """The tiles with 4-lane (SSE) and 16-lane (AVX-512) chunks, which LLVM widens or splits here."""
    sub = SUITE.subset(lambda c: c.name in OTHER_WIDTH_CASES)
    assert len(sub.cases) == len(OTHER_WIDTH_CASES)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(emit, "chunk_width", lambda lanes: width)
        result = sub.run()
    for name in OTHER_WIDTH_CASES:
        result.check(name)


def case_arrays(outcome, name: str) -> tuple:
    """(thunk, x, weights as words `[rows, ·]`, scales, biases) of a DequantMatMulMlx case, from the arena."""
    t, arena = outcome.case(name).thunk, outcome.before
    codes, scale_bytes, bias_bytes = mlx_bytes(t, t.n, t.k, 4)
    groups = t.k // t.scheme.group_size
    x = arena[t.x:t.x + 4 * t.m * t.k].view(np.float32).reshape(t.m, t.k)
    words = arena[t.w_q:t.w_q + codes].view(np.uint32).reshape(t.n, -1)
    affine = isinstance(t.scheme, QuantScheme.MlxAffine)
    scales = arena[t.scale:t.scale + scale_bytes].view(np.float32 if affine else np.uint8).reshape(t.n, groups)
    biases = arena[t.zp:t.zp + bias_bytes].view(np.float32).reshape(t.n, groups) if affine else None
    return t, x, words, scales, biases


MATMULS = [c.name for c in SUITE.cases if c.name.startswith("DequantMatMulMlx") and "x0x" not in c.name]


@pytest.mark.parametrize("name", MATMULS)
def test_matmul_matches_spec_decode_then_numpy(outcome, name: str) -> None:
    t, x, words, scales, biases = case_arrays(outcome, name)
    w = spec_dequantize(t.scheme, words, scales, biases, t.k).astype(np.float64)
    x = x.astype(np.float64)
    magnitude = np.abs(x) @ weight_magnitude(t.scheme, words, scales, biases, t.k).T
    assert_close(outcome.output(name).reshape(t.m, t.n), x @ w.T, rtol=1e-5, atol=1e-5 * magnitude, what=name)


@pytest.mark.parametrize("name", [n for n in MATMULS if "-0x" not in n])
def test_matmul_matches_mlx_quantized_matmul(outcome, name: str) -> None:
    mx = pytest.importorskip("mlx.core")
    t, x, words, scales, biases = case_arrays(outcome, name)
    mode = "affine" if biases is not None else type(t.scheme).__name__[3:].lower()
    want = mx.quantized_matmul(mx.array(x), mx.array(words), mx.array(scales),
                               None if biases is None else mx.array(biases), transpose=True,
                               group_size=t.scheme.group_size, bits=ref.code_bits(t.scheme), mode=mode)
    magnitude = np.abs(x.astype(np.float64)) @ weight_magnitude(t.scheme, words, scales, biases, t.k).T
    assert_close(outcome.output(name).reshape(t.m, t.n), np.array(want), rtol=1e-5, atol=1e-5 * magnitude, what=name)


def test_suite_covers_the_shapes() -> None:
    """m in {0, 1, 3, 4, 5, 9}; every affine bits value at every group size; grouped cases use every expert."""
    matmuls = [c.thunk for c in SUITE.cases if isinstance(c.thunk, T.DequantMatMulMlx)]
    assert {t.m for t in matmuls} >= {0, 1, 3, 4, 5, 9}
    assert {(t.scheme.bits, t.scheme.group_size) for t in matmuls if isinstance(t.scheme, QuantScheme.MlxAffine)} \
        == {(b, g) for b in emit.AFFINE_BITS for g in (32, 64, 128)}
    arena = SUITE.initial_bytes()
    for t in (c.thunk for c in SUITE.cases if isinstance(c.thunk, T.DequantGroupedMatMulMlx)):
        assert set(checked_expert_ids(arena, t)) == set(range(t.num_experts))


# ── expert ids that are not experts ──────────────────────────────────────────

class BadIds:
    """One compiled DequantGroupedMatMulMlx (4 rows, 3 experts) over an arena whose ids the tests rewrite."""

    def __init__(self) -> None:
        lay = Suite(fill=SENTINEL)
        scheme = QuantScheme.MlxAffine(bits=4, group_size=32)
        scales, biases = random_params(scheme, 3 * 4, 2, lay.rng)
        self.ids = lay.put(np.float32([0, 2, 1, 1]))
        self.thunk = T.DequantGroupedMatMulMlx(
            input=lay.put(lay.normal(4, 64)), w_q=lay.put(random_words(scheme, 12, 64, lay.rng)), scale=lay.put(scales),
            zp=lay.put(biases), expert_idx=self.ids, dst=lay.slot(4 * 4 * 4), m=4, k_dim=64, n=4, num_experts=3,
            slab_bytes=4 * 32, scheme=scheme, scale_bf16=False)
        self.layout = lay
        self.program = rl.compile(rl.ThunkSchedule([self.thunk], arena_bytes=lay.nbytes), cache=False)

    def arena(self, row: int, bad: float) -> np.ndarray:
        """The initial bytes with expert id `bad` at `row`."""
        arena = self.layout.initial_bytes()
        arena[self.ids + 4 * row:self.ids + 4 * row + 4] = np.float32([bad]).view(np.uint8)
        return arena


@pytest.fixture(scope="module")
def bad_ids() -> BadIds:
    return BadIds()


@pytest.mark.parametrize("bad", [3.0, 7.0, 3.5, np.inf, 2.0 ** 40])
@pytest.mark.parametrize("row", [0, 2])
def test_bad_expert_id_is_an_execution_error_naming_the_row(bad_ids: BadIds, bad: float, row: int) -> None:
    """An id ≥ num_experts `as usize`: INDEX_OUT_OF_RANGE with row + 1 in the bits above, the message names the
    row, nothing written; the reference raises too."""
    t = bad_ids.thunk
    arena = rl.Arena.from_bytes(bad_ids.arena(row, bad))
    with pytest.raises(ExecutionError) as info:
        bad_ids.program.run(arena)
    assert (info.value.kind, info.value.status) == ("DequantGroupedMatMulMlx",
                                                    Status.INDEX_OUT_OF_RANGE | (row + 1) << 8)
    assert f"expert id of row {row}" in str(info.value)
    assert (arena.bytes[t.dst:t.dst + 64] == SENTINEL).all(), "the failing thunk writes nothing"
    with pytest.raises(IndexError, match=f"row {row}: expert id"):
        reference_registry.run_thunk(bad_ids.arena(row, bad), t)


@pytest.mark.parametrize("ids", [-0.0, 1.5, 2.99, -1.0, np.nan, -np.inf])
def test_ids_convert_as_usize(bad_ids: BadIds, ids: float) -> None:
    """Ids truncate toward zero, negative and NaN ids are expert 0 (semantics.md §1): the same bytes as the
    integer id, and as the reference."""
    t = bad_ids.thunk
    got, want = rl.Arena.from_bytes(bad_ids.arena(0, ids)), bad_ids.arena(0, ids)
    same = rl.Arena.from_bytes(bad_ids.arena(0, float(checked_expert_ids(want, t)[0])))
    bad_ids.program.run(same)
    bad_ids.program.run(got)
    reference_registry.run_thunk(want, t)
    assert np.array_equal(got.bytes[t.dst:t.dst + 64], same.bytes[t.dst:t.dst + 64])
    assert_close(got.bytes[t.dst:t.dst + 64].view(np.float32), want[t.dst:t.dst + 64].view(np.float32), rtol=1e-5,
                 atol=1e-5)


# ── bad input ────────────────────────────────────────────────────────────────

def matmul(scheme: QuantScheme = QuantScheme.MlxAffine(bits=4, group_size=32), k: int = 64, **changes
           ) -> T.DequantMatMulMlx:
    fields = dict(x=0, w_q=4096, scale=6144, zp=7168, dst=8192, m=2, k=k, n=3, scheme=scheme)
    return T.DequantMatMulMlx(**(fields | changes))


def grouped(scheme: QuantScheme = QuantScheme.MlxAffine(bits=4, group_size=32), k: int = 64, **changes
            ) -> T.DequantGroupedMatMulMlx:
    fields = dict(input=0, w_q=4096, scale=6144, zp=7168, expert_idx=2048, dst=8192, m=2, k_dim=k, n=3,
                  num_experts=2, slab_bytes=3 * k // 2, scheme=scheme, scale_bf16=False)
    return T.DequantGroupedMatMulMlx(**(fields | changes))


KINDS = {"matmul": (matmul, "k"), "grouped": (grouped, "k_dim")}
"""Each kind's bad-input thunk builder and the name of its reduction-length field."""


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("scheme,k", [(QuantScheme.MlxAffine(bits=4, group_size=64), 96),
                                      (QuantScheme.MlxAffine(bits=3, group_size=128), 64),
                                      (QuantScheme.MlxMxfp4(group_size=32), 48)], ids=["affine4g64", "affine3g128", "mxfp4"])
def test_k_not_a_whole_number_of_groups_is_refused(kind: str, scheme: QuantScheme, k: int) -> None:
    build_thunk, k_field = KINDS[kind]
    expect_invalid(build_thunk(scheme, k), 1 << 14, k_field, f"group size {scheme.group_size}")


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("bits", [1, 7, 16])
def test_affine_bits_not_lowered_are_refused(kind: str, bits: int) -> None:
    build_thunk, _ = KINDS[kind]
    expect_invalid(build_thunk(QuantScheme.MlxAffine(bits=bits, group_size=32)), 1 << 14, "scheme", f"bits = {bits}")


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("scheme", [QuantScheme.MlxAffine(bits=4, group_size=16), QuantScheme.MlxAffine(bits=4, group_size=256),
                                    QuantScheme.MlxMxfp4(group_size=64), QuantScheme.MlxMxfp8(group_size=16)],
                         ids=["affine-g16", "affine-g256", "mxfp4-g64", "mxfp8-g16"])
def test_group_sizes_not_lowered_are_refused(kind: str, scheme: QuantScheme) -> None:
    build_thunk, _ = KINDS[kind]
    expect_invalid(build_thunk(scheme, 256), 1 << 16, "scheme", f"group_size = {scheme.group_size}")


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("scheme", [QuantScheme.GgufQ4_0, QuantScheme.Int8Block(block_size=32)], ids=["gguf", "int8"])
def test_non_mlx_scheme_is_refused(kind: str, scheme: QuantScheme) -> None:
    build_thunk, _ = KINDS[kind]
    expect_invalid(dataclasses.replace(build_thunk(), scheme=scheme), 1 << 14, "scheme")


def test_grouped_needs_an_expert() -> None:
    expect_invalid(grouped(num_experts=0), 1 << 14, "num_experts", "num_experts = 0")


def test_grouped_slab_must_hold_one_expert() -> None:
    """3 rows × 64 4-bit codes = 96 bytes per expert."""
    expect_invalid(grouped(slab_bytes=95), 1 << 14, "slab_bytes", "96 bytes")


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("field", ["w_q", "scale", "zp"])
def test_buffer_too_short_is_refused(kind: str, field: str) -> None:
    """Codes 3·32 bytes per expert, scales and biases 3·2 f32 per expert: the buffer placed last, one byte short."""
    build_thunk, _ = KINDS[kind]
    experts = 2 if kind == "grouped" else 1
    needed = experts * {"w_q": 96, "scale": 24, "zp": 24}[field]
    t = build_thunk(**({"w_q": 3072, "scale": 3584, "zp": 3840} | {field: 10000}))
    expect_invalid(t, 10000 + needed - 1, field)
