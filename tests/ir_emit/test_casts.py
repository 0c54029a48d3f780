"""Copies, casts and RoundHalf against the NumPy reference: bit-exact, on edge-case-rich inputs.

One program holds every case (each Cast kind, all 13×13 CastGeneric pairs, exhaustive half
patterns, sizes, in-place forms); it is compiled and run once and each parametrized case compares
its output bytes with the reference's.
"""
from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import thunks as T
from rlx_llvm.dtypes import DType
from rlx_llvm.reference import casts as rc
from rlx_llvm.reference import halves
from tests.harness import W, Outcome, Suite, suite_tests

D = DType
BIG = 1_000_003


# ── inputs ───────────────────────────────────────────────────────────────────

def _f32_edges() -> np.ndarray:
    values = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.5, -3.5, 0.49999997, -0.99999994,
              np.inf, -np.inf, 127, 127.5, 128, 128.5, -128, -128.5, -129, 255, 255.5, 256, -0.5,
              32767, 32767.5, 32768, -32768, -32768.5, -32769, 65504, 65519.996, 65520, 65535, 65536, 1e5,
              2.0**24, 2.0**24 + 2, 2.0**31 - 128, 2.0**31, -2.0**31, -2.0**31 - 256, 2.0**32 - 256, 2.0**32,
              2.0**63 - 2.0**39, 2.0**63, -2.0**63, -2.0**63 - 2.0**40, 1e20, -1e20, 3.4028235e38, -3.4028235e38,
              2.0**-14, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 1.5 * 2.0**-24, 6e-8,
              1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-8 + 2.0**-23, 1 + 2.0**-11, 1 + 3 * 2.0**-11,
              1 + 2.0**-11 + 2.0**-23, 1 - 2.0**-12]
    bits = [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FA00000, 0x7F812345,
            0xFFB54321, 0x7F802000, 0x7F810000, 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00400000,
            0x00008000, 0x00018000, 0x00008001, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x33000000, 0x33000001,
            0x80800000, 0x00800000]
    rng = np.random.default_rng(32)
    rand = np.concatenate([rng.standard_normal(64) * s for s in (1, 1e3, 1e10, 1e-3)])
    return np.concatenate([np.array(values, np.float32), np.array(bits, np.uint32).view(np.float32),
                           rand.astype(np.float32), rng.integers(0, 2**32, 128, dtype=np.uint32).view(np.float32)])


def _f64_edges() -> np.ndarray:
    values = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, np.inf, -np.inf, 127.5, -128.5, 255.5, 256.0,
              32767.5, -32768.5, 65504, 65520 - 2.0**-30, 65520, 65536, 2.0**53, 2.0**53 + 2, 2.0**31 - 1,
              2.0**31 - 0.5, 2.0**31, -2.0**31 - 0.5, -2.0**31 - 1, 2.0**32 - 1, 2.0**32 - 0.5, 2.0**32,
              2.0**63 - 1024, 2.0**63, -2.0**63, -2.0**63 - 2048, 1e300, -1e300, 1e-300, -1e-300, 5e-324, -5e-324,
              2.2250738585072014e-308, 1.7976931348623157e308, 3.4028234663852886e38,
              2.0**128 - 2.0**103, 2.0**128 - 2.0**103 - 2.0**70, 2.0**128 - 2.0**119 - 2.0**90,
              2.0**128 - 2.0**119, 2.0**128 - 2.0**119 + 2.0**90,
              # ties of f32 / f16 / bf16, and values just beside them (where rounding twice goes wrong)
              1 + 2.0**-24, 1 + 2.0**-24 + 2.0**-52, 1 + 3 * 2.0**-24, 2.0**-150, 2.0**-150 + 2.0**-200,
              3 * 2.0**-150, 1 + 2.0**-11, 1 + 2.0**-11 + 2.0**-40, 1 + 2.0**-11 - 2.0**-40, 1 + 2.0**-11 + 2.0**-60,
              -(1 + 3 * 2.0**-11) + 2.0**-45, 1 + 2.0**-8, 1 + 2.0**-8 + 2.0**-40, 1 + 2.0**-8 - 2.0**-40,
              2.0**-25, 2.0**-25 + 2.0**-60, 3 * 2.0**-26 - 2.0**-70, 2.0**-134 + 2.0**-180, 2.0**-134,
              1e-45, 1.4e-45, 0.1, 1 / 3]
    bits = [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0xFFF0000000000001, 0x7FF4000000000000,
            0x7FFFFFFFFFFFFFFF, 0x7FF0000020000000, 0xFFF123456789ABCD, 0x7FF0000000002000, 0x0000000000000001,
            0x8000000000000001, 0x000FFFFFFFFFFFFF]
    rng = np.random.default_rng(64)
    rand = np.concatenate([rng.standard_normal(64) * s for s in (1, 1e5, 1e15, 1e-5)])
    return np.concatenate([np.array(values, np.float64), np.array(bits, np.uint64).view(np.float64), rand,
                           rng.integers(0, 2**64, 128, dtype=np.uint64).view(np.float64)])


def _int_edges(dtype: DType) -> np.ndarray:
    lo, hi = rc.int_range(dtype)
    if hi - lo < 1 << 17:                                   # i8, u8, i16: every value
        return np.arange(lo, hi + 1).astype(rc.STORAGE[dtype])
    t = [0, 1, 2, 127, 128, 255, 256, 32767, 32768, 65504, 65519, 65520, 65535, 65536, 2**24, 2**24 + 1,
         2**24 + 3, 2**24 + 2**16 + 1, 2**24 + 2**16, 2**24 + 2**16 - 1, 2**31 - 1, 2**31 - 128, 2**31 - 129,
         2**31 - 64, 2**31, 2**32 - 1, 2**32 - 128, 2**32 - 129, 2**32, 2**32 + 5, 0x1_8000_0000, 2**40 + 1,
         2**53, 2**53 + 1, 2**53 + 3, 2**60 + 2**52 + 1, 2**60 + 2**52, 2**62 + 2**38 + 1, 2**62 + 2**38,
         2**63 - 512, 2**63 - 513, 2**63 - 1024, 2**63 - 1025, 2**63 - 1]
    t = t + [-v for v in t] + [lo, lo + 1, hi, hi - 1]
    t = [v for v in t if lo <= v <= hi]
    rng = np.random.default_rng(dtype.itemsize)
    r = rng.integers(lo, hi, 256, endpoint=True, dtype=np.int64 if dtype is not D.U32 else np.uint64)
    r = np.concatenate([r, r >> rng.integers(0, 8 * dtype.itemsize, 256).astype(r.dtype)])
    return np.concatenate([np.array(t, dtype=object).astype(np.int64 if dtype is not D.U32 else np.uint64),
                           r]).astype(rc.STORAGE[dtype])


def _complex_edges(part: np.ndarray) -> np.ndarray:
    zeros = np.zeros_like(part)
    re = np.concatenate([part, part, zeros, np.array([0.0, -0.0, np.nan], part.dtype)])
    im = np.concatenate([np.roll(part, 7), zeros, part, np.array([0.0, -0.0, 0.0], part.dtype)])
    return np.stack([re, im], axis=1)


def edges(dtype: DType) -> np.ndarray:
    """Stored input elements of `dtype`, rich in edge cases (every pattern for 1- and 2-byte types)."""
    if dtype in (D.F16, D.BF16):
        return np.arange(1 << 16, dtype=np.uint16).view(rc.STORAGE[dtype])
    if dtype is D.F32:
        return _f32_edges()
    if dtype is D.F64:
        return _f64_edges()
    if dtype is D.Bool:
        return np.concatenate([[0, 1, 2, 0x80, 0xFF], np.random.default_rng(1).integers(0, 4, 256) * 85]
                              ).astype(np.uint8)
    if dtype is D.C64:
        return _complex_edges(_f32_edges())
    if dtype is D.C128:
        return _complex_edges(_f64_edges())
    return _int_edges(dtype)


def half_inputs(stride: int = 251) -> np.ndarray:
    """f32 inputs for f32 → f16/bf16: every f16 and bf16 value, the midpoints between neighbours (the ties)
    and one f32 ulp either side of them, plus every `stride`-th f32 bit pattern."""
    f16 = rc.decode(D.F16, np.arange(1 << 16, dtype=np.uint16).view(np.float16)).value
    grid = np.unique(f16[np.isfinite(f16)])
    mids16 = np.concatenate([(grid[1:] + grid[:-1]) / 2, [65520.0, -65520.0]]).astype(np.float32)
    bf = np.arange(1 << 16, dtype=np.uint32) << 16
    mids_bf = bf[(bf & 0x7F800000) != 0x7F800000] | 0x8000
    ties = np.concatenate([mids16, mids_bf.view(np.float32)])
    return np.concatenate([rc.cast(D.F16, D.F32, np.arange(1 << 16, dtype=np.uint16).view(np.float16)),
                           bf.view(np.float32), ties, np.nextafter(ties, np.inf),
                           np.nextafter(ties, -np.inf),
                           np.arange(0, 1 << 32, stride, dtype=np.uint64).astype(np.uint32).view(np.float32)])


# ── one schedule holding every case ──────────────────────────────────────────

def _nbytes(dtype: DType, n: int) -> int:
    return dtype.itemsize * n


def build() -> Suite:
    """Every case in one arena; each output is compared byte for byte."""
    suite = Suite(0)
    inputs = {d: edges(d) for d in DType}
    slots = {d: suite.put(v) for d, v in inputs.items()}
    count = {d: len(v) for d, v in inputs.items()}
    for name, (s, d) in rc.CAST_DTYPES.items():
        suite.add(f"kind-{name}", getattr(T, name)(src=slots[s], dst=suite.slot(_nbytes(d, count[s])),
                                                   len=count[s]))
    for s in DType:
        for d in DType:
            suite.add(f"generic-{s.value}-{d.value}",
                      T.CastGeneric(src=slots[s], dst=suite.slot(_nbytes(d, count[s])), len=count[s],
                                    src_dtype=s, dst_dtype=d))
    halves_in = half_inputs()
    h, n = suite.put(halves_in), halves_in.size
    suite.add("all-f32-to-f16", T.CastF32ToF16(src=h, dst=suite.slot(2 * n), len=n))
    suite.add("all-f32-to-bf16", T.CastF32ToBf16(src=h, dst=suite.slot(2 * n), len=n))
    round_in = half_inputs(stride=2039)
    h, n = suite.put(round_in), round_in.size
    suite.add("all-round-half-f16", T.RoundHalf(src=h, dst=suite.slot(4 * n), len=n, bf16=False))
    suite.add("all-round-half-bf16", T.RoundHalf(src=h, dst=suite.slot(4 * n), len=n, bf16=True))
    rng = np.random.default_rng(5)
    big = {D.F32: suite.put((rng.standard_normal(BIG) * 1e3).astype(np.float32)),
           D.F64: suite.put(rng.standard_normal(BIG) * 1e5),
           D.C64: suite.put(rng.standard_normal((BIG, 2)).astype(np.float32))}
    for n in (0, 1, W - 1, W, W + 1, BIG):
        for kind, s, d in (("CastF32ToBf16", D.F32, D.BF16), ("CastF32ToI32", D.F32, D.I32),
                           ("CastF64ToF32", D.F64, D.F32)):
            suite.add(f"size-{kind}-{n}", getattr(T, kind)(src=big[s], dst=suite.slot(_nbytes(d, n)), len=n))
        for s, d in ((D.F64, D.F16), (D.C64, D.C128), (D.F32, D.U8)):
            suite.add(f"size-generic-{s.value}-{d.value}-{n}",
                      T.CastGeneric(src=big[s], dst=suite.slot(_nbytes(d, n)), len=n, src_dtype=s, dst_dtype=d))
        for kind, size in rc.COPY_ITEMSIZE.items():
            suite.add(f"size-{kind}-{n}", getattr(T, kind)(src=big[D.F64], dst=suite.slot(size * n), len=n))
    for kind, values, dtype in (("Copy", inputs[D.F32], D.F32), ("CopyF64", inputs[D.F64], D.F64),
                                ("CopyI64", inputs[D.I64], D.I64)):
        off = suite.put(values.copy())
        suite.add(f"inplace-{kind}", getattr(T, kind)(src=off, dst=off, len=values.size))
    for kind, s, d in (("CastF32ToI32", D.F32, D.I32), ("CastI64ToF64", D.I64, D.F64)):
        off = suite.put(inputs[s].copy())
        suite.add(f"inplace-{kind}", getattr(T, kind)(src=off, dst=off, len=count[s]))
    off = suite.put(inputs[D.F32].copy())
    suite.add("inplace-RoundHalf", T.RoundHalf(src=off, dst=off, len=count[D.F32], bf16=True))
    off = suite.put(inputs[D.C64].copy())
    suite.add("inplace-generic-c64-i64", T.CastGeneric(src=off, dst=off, len=count[D.C64], src_dtype=D.C64,
                                                       dst_dtype=D.I64))
    return suite


SUITE = build()

(outcome, test_matches_reference_bit_exactly, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


def test_nothing_else_is_written(outcome: Outcome):
    assert np.array_equal(outcome.got, outcome.want)


def test_in_place_copy_leaves_data_unchanged(outcome: Outcome):
    t = outcome.case("inplace-CopyF64").thunk
    assert np.array_equal(outcome.got[t.src:t.src + 8 * t.len].view(np.uint64), edges(D.F64).view(np.uint64))


# ── the machine code ─────────────────────────────────────────────────────────

@pytest.mark.parametrize("kind", ["CastF32ToBf16", "CastF32ToF16"])
def test_half_casts_are_vector_code_without_calls(outcome: Outcome, kind: str):
    asm = outcome.program.asm(thunk=outcome.index(f"kind-{kind}"))
    assert "zmm" in asm or "ymm" in asm
    assert "call" not in asm


def test_every_converting_cast_is_vector_code_without_calls(outcome: Outcome):
    from rlx_llvm.ir_emit.casts import bit_identical
    from rlx_llvm.ir_emit.parallel import THREADS_SYMBOL, fork_symbol
    bad = []
    for name, t in ((c.name, c.thunk) for c in SUITE.cases):
        pair = rc.CAST_DTYPES.get(type(t).__name__) or (getattr(t, "src_dtype", None), getattr(t, "dst_dtype", None))
        if not name.startswith(("kind-", "generic-")) or bit_identical(*pair):
            continue
        asm = outcome.program.asm(thunk=outcome.index(name))
        calls = sum("call" in line for line in asm.splitlines())
        forks = len(re.findall(f'call void @"?{fork_symbol()}"?\\(', outcome.thunk_ir(name)))
        forks += len(re.findall(f'call i64 @"?{THREADS_SYMBOL}"?\\(', outcome.thunk_ir(name)))  # and asks how many threads
        if calls > forks or not any(r in asm for r in ("xmm", "ymm", "zmm")):  # a split cast forks, no more
            bad.append(name)
    assert not bad


# ── the reference itself, against independent oracles ───────────────────────

def _exact_rne(x: Fraction, dtype: DType) -> float:
    """Round an exact rational to a float format, by the definition (ties to even)."""
    fmt = rc.FMT[dtype]
    if x == 0:
        return 0.0
    sign, x = (-1 if x < 0 else 1), abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    e -= Fraction(2) ** e > x
    ulp = Fraction(2) ** (max(e, fmt.emin) - fmt.mant)
    q, r = divmod(x / ulp, 1)
    q += r > Fraction(1, 2) or (r == Fraction(1, 2) and q % 2 == 1)
    v = q * ulp
    return sign * (float("inf") if v > Fraction(fmt.max_finite) else float(v))


def _as_float(stored: np.ndarray, dtype: DType) -> np.ndarray:
    return rc.decode(dtype, stored).value


@pytest.mark.parametrize("src", [D.I64, D.U32, D.I32, D.F64, D.F32])
@pytest.mark.parametrize("dst", [D.F16, D.BF16, D.F32])
def test_reference_rounds_once_like_exact_arithmetic(src: DType, dst: DType):
    x = edges(src)
    if src.is_float:
        x = x[np.isfinite(x)]
    want = np.array([_exact_rne(Fraction(int(v)) if src.is_int else Fraction(float(v)), dst) for v in x])
    want = np.copysign(np.abs(want), x.astype(np.float64))     # rounding keeps the sign, also of zero
    got = _as_float(rc.cast(src, dst, x), dst)
    assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want))


def test_reference_halves_agree_with_half_helpers():
    x = half_inputs()[: 6 * 65536]
    assert np.array_equal(rc.cast(D.F32, D.F16, x).view(np.uint16), halves.f32_to_f16_bits(x))
    assert np.array_equal(rc.cast(D.F32, D.BF16, x), halves.f32_to_bf16_bits(x))


def test_reference_nan_rules():
    nan32 = np.array([0x7F800001, 0xFFA00000, 0x7FC12345], np.uint32).view(np.float32)
    assert rc.cast(D.F32, D.F16, nan32).view(np.uint16).tolist() == [0x7E00, 0xFF00, 0x7E09]
    assert rc.cast(D.F32, D.BF16, nan32).tolist() == [0x7FC0, 0xFFE0, 0x7FC1]
    assert rc.cast(D.F32, D.F64, nan32).view(np.uint64).tolist() == [0x7FF8000020000000, 0xFFFC000000000000,
                                                                      0x7FF82468A0000000]
    bf = np.array([0x7F81, 0xFFC0], np.uint16)
    assert rc.cast(D.BF16, D.F32, bf).view(np.uint32).tolist() == [0x7FC10000, 0xFFC00000]   # Rust half quiets
    c = np.array([[np.float32(1), nan32[0]]], np.float32)
    assert rc.cast(D.C64, D.F32, c).view(np.uint32).tolist() == [0x3F800000]
    assert rc.cast(D.F32, D.C64, nan32[:1]).view(np.uint32).tolist() == [[0x7F800001, 0]]  # same format: kept


def test_reference_integer_rules():
    assert rc.cast(D.F32, D.I8, np.array([np.nan, 1e10, -1e10, -1.9, 127.9], np.float32)).tolist() == \
        [0, 127, -128, -1, 127]
    assert rc.cast(D.F64, D.U32, np.array([-5.0, 4294967295.7, 1e300], np.float64)).tolist() == \
        [0, 4294967295, 4294967295]
    assert rc.cast(D.I64, D.I8, np.array([300, -129, 2**40 + 255], np.int64)).tolist() == [44, 127, -1]
    assert rc.cast(D.I32, D.U32, np.array([-1], np.int32)).tolist() == [4294967295]
    assert rc.cast(D.Bool, D.I32, np.array([0, 1, 2, 255], np.uint8)).tolist() == [0, 1, 1, 1]
    assert rc.cast(D.C128, D.Bool, np.array([[0.0, 0.0], [0.0, -1.0], [np.nan, 0.0]])).tolist() == [0, 1, 1]


# ── bad input ────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("thunk, field", [
    (T.CastF32ToBf16(src=0, dst=448, len=100), "dst"),
    (T.CastGeneric(src=64, dst=0, len=30, src_dtype=D.C128, dst_dtype=D.I8), "src"),
    (T.CopyF64(src=0, dst=8, len=8), "dst"),                      # overlapping, not an exact alias
])
def test_bad_extents_are_rejected(thunk, field):
    sched = rl.ThunkSchedule([T.Copy(src=0, dst=256, len=4), thunk], arena_bytes=512)
    with pytest.raises(rl.ValidationError) as e:
        rl.compile(sched, cache=False)
    assert e.value.index == 1 and e.value.field == field
    assert "thunk 1" in str(e.value) and repr(field) in str(e.value)


def test_absent_buffer_with_elements_is_rejected():
    absent = 2**64 - 1
    with pytest.raises(rl.ValidationError) as e:
        rl.compile(rl.ThunkSchedule([T.CastF32ToI32(src=absent, dst=0, len=4)], arena_bytes=64), cache=False)
    assert e.value.index == 0 and e.value.field == "src"
    empty = rl.ThunkSchedule([T.CastGeneric(src=absent, dst=absent, len=0, src_dtype=D.F64, dst_dtype=D.F16)],
                             arena_bytes=64)
    rl.compile(empty, cache=False).run(rl.Arena(64))
