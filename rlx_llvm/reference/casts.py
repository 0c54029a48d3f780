"""NumPy reference of Copy/CopyF64/CopyI64, every Cast*, CastGeneric and RoundHalf — bit-exact.

One function, `cast(src_dtype, dst_dtype, values)`, defines every conversion; it is written from
the rules (docs/lowering-casts.md), not from the emitter's tricks:

* float → float: round the exact value once to the destination (nearest, ties to even; overflow
  → ±inf).  NaN → a quiet NaN of the same sign whose payload is the source payload, top-aligned
  (truncated or zero-extended); a NaN that does not change format (f32 ↔ c64 part, f64 ↔ c128
  part) keeps its bits.
* float → int: truncate toward zero, saturate at the range, NaN → 0.  int → int: wrap.
* int → float: the exact integer rounded once (nearest, ties to even).
* → Bool: value != 0 (complex: either part; NaN counts as non-zero).  Bool → 0 / 1; a Bool byte
  is true when it is non-zero.
* real → complex: (value, +0).  complex → real: the real part.  complex ↔ complex: both parts.
* same dtype: a bit copy.

Storage arrays: bf16 is its uint16 bits, Bool is uint8, C64/C128 are `(n, 2)` float32/float64.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import thunks as T
from ..dtypes import DType
from . import reference, view

# ── the cast kinds and their (source, destination) dtypes ────────────────────

_CAST_NAMES = ("CastF32ToI64", "CastF32ToF64", "CastF64ToF32", "CastF64ToI64", "CastF64ToI32", "CastF64ToBool",
               "CastI64ToI32", "CastI64ToF64", "CastI32ToF64", "CastF32ToF16", "CastF16ToF32", "CastF32ToBf16",
               "CastBf16ToF32", "CastF32ToI32", "CastI64ToF32", "CastBoolToI32", "CastBoolToF32", "CastF32ToBool",
               "CastI32ToF32", "CastI32ToI64", "CastI32ToBool", "CastI64ToBool", "CastBoolToI64")


def _pair(name: str) -> tuple[DType, DType]:
    src, dst = name[len("Cast"):].split("To")
    return DType.parse(src), DType.parse(dst)


CAST_DTYPES: dict[str, tuple[DType, DType]] = {name: _pair(name) for name in _CAST_NAMES}
"""Each fixed-pair Cast kind → (source dtype, destination dtype)."""

COPY_ITEMSIZE = {"Copy": 4, "CopyF64": 8, "CopyI64": 8}
"""Bytes per element of each Copy kind."""


# ── storage ──────────────────────────────────────────────────────────────────

STORAGE = {DType.F32: np.float32, DType.F16: np.float16, DType.BF16: np.uint16, DType.F64: np.float64,
           DType.I8: np.int8, DType.I16: np.int16, DType.I32: np.int32, DType.I64: np.int64,
           DType.U8: np.uint8, DType.U32: np.uint32, DType.Bool: np.uint8,
           DType.C64: np.float32, DType.C128: np.float64}
"""NumPy storage of one element (complex: of one part)."""


def load(arena: np.ndarray, dtype: DType, offset: int, count: int) -> np.ndarray:
    """`count` stored elements of `dtype` at byte `offset` (complex as an (n, 2) array of parts)."""
    if dtype.is_complex:
        return view(arena, offset, STORAGE[dtype], 2 * count).reshape(count, 2)
    return view(arena, offset, STORAGE[dtype], count)


def store(arena: np.ndarray, dtype: DType, offset: int, values: np.ndarray) -> None:
    """Write stored elements of `dtype` at byte `offset`."""
    flat = np.ascontiguousarray(values, dtype=STORAGE[dtype]).reshape(-1)
    view(arena, offset, STORAGE[dtype], flat.size)[:] = flat


# ── float formats ────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Fmt:
    """A binary float format: total bits, mantissa bits, minimum normal exponent, maximum exponent."""

    bits: int
    mant: int
    emin: int
    emax: int

    @property
    def max_finite(self) -> float:
        """Largest finite value."""
        return float(np.ldexp(2.0 - 2.0 ** -self.mant, self.emax))

    @property
    def exp_mask(self) -> int:
        """Bit mask of the exponent field."""
        return ((1 << (self.bits - 1)) - 1) & ~((1 << self.mant) - 1)


FMT = {DType.F16: Fmt(16, 10, -14, 15), DType.BF16: Fmt(16, 7, -126, 127), DType.F32: Fmt(32, 23, -126, 127),
       DType.F64: Fmt(64, 52, -1022, 1023)}
_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
_PART = {DType.C64: DType.F32, DType.C128: DType.F64}


def float_bits(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """The bit patterns of stored floats, as uint64."""
    return np.ascontiguousarray(raw).view(_UINT[FMT[dtype].bits]).astype(np.uint64)


def pow2(k: np.ndarray) -> np.ndarray:
    """2.0 ** k for integer arrays with |k| ≤ 1022, built from the exponent bits (exact, fast)."""
    biased = np.asarray(k).astype(np.int64)
    biased += 1023
    biased <<= 52
    return biased.view(np.float64)


def round_real(x: np.ndarray, fmt: Fmt) -> np.ndarray:
    """Exact float64 values rounded once to `fmt` (not f64): nearest, ties to even, gradual
    underflow, overflow → ±inf.  Returns the exact rounded values as float64."""
    _, e = np.frexp(x)                             # |x| in [2^(e-1), 2^e)
    k = np.maximum(e - 1, fmt.emin) - fmt.mant     # log2 of one unit in the last place of fmt at x
    r = np.rint(x * pow2(-k))                      # power-of-two scaling is exact; rint: ties to even
    r *= pow2(k)
    return np.where(np.abs(r) > fmt.max_finite, np.copysign(np.inf, x), r)


def _bit_length(mag: np.ndarray) -> np.ndarray:
    e = np.frexp(mag.astype(np.float64))[1]        # can be one too large when the float rounded up
    too_big = (e > 0) & ((mag >> np.maximum(e - 1, 0).astype(np.uint64)) == 0)
    return e - too_big


def round_int(v: np.ndarray, fmt: Fmt) -> np.ndarray:
    """Exact int64 values rounded once to `fmt` (nearest, ties to even), as exact float64 values."""
    u = v.astype(np.uint64)
    mag = np.where(v < 0, ~u + np.uint64(1), u)    # |v|, exact even for -2^63
    shift = np.maximum(_bit_length(mag) - (fmt.mant + 1), 0).astype(np.uint64)
    q = mag >> shift
    rem = mag - (q << shift)
    half = np.where(shift > 0, np.uint64(1) << (np.maximum(shift, 1) - np.uint64(1)), 0)
    up = (shift > 0) & ((rem > half) | ((rem == half) & ((q & np.uint64(1)) == 1)))
    r = (q + up).astype(np.float64) * pow2(shift)  # q + up ≤ 2^(mant+1): exact
    r = np.where(v < 0, -r, r)
    return np.where(np.abs(r) > fmt.max_finite, np.copysign(np.inf, r), r)


def nan_bits(bits: np.ndarray, src: Fmt, dst: Fmt) -> np.ndarray:
    """A NaN moved between formats: same sign, quiet bit set, payload top-aligned (uint64 bits)."""
    if src == dst:
        return bits
    sign = (bits >> np.uint64(src.bits - 1)) & np.uint64(1)
    mant = bits & np.uint64((1 << src.mant) - 1)
    mant = mant << np.uint64(dst.mant - src.mant) if dst.mant >= src.mant else mant >> np.uint64(src.mant - dst.mant)
    return (sign << np.uint64(dst.bits - 1)) | np.uint64(dst.exp_mask | 1 << (dst.mant - 1)) | mant


# ── decoded values ───────────────────────────────────────────────────────────

@dataclass
class Real:
    """Float elements: exact values (float64, NaN where NaN), their bits and their format."""

    value: np.ndarray
    bits: np.ndarray
    fmt: Fmt


@dataclass
class Int:
    """Integer or Bool elements as exact int64 (u32 fits)."""

    value: np.ndarray


@dataclass
class Complex:
    """Complex elements: two Real parts."""

    re: Real
    im: Real


def decode(dtype: DType, raw: np.ndarray) -> "Real | Int | Complex":
    """Stored elements → their exact values."""
    if dtype.is_complex:
        part = _PART[dtype]
        return Complex(decode(part, raw[:, 0]), decode(part, raw[:, 1]))
    if dtype is DType.Bool:
        return Int((raw != 0).astype(np.int64))          # any non-zero byte is true
    if dtype.is_int:
        return Int(raw.astype(np.int64))
    bits = float_bits(raw, dtype)
    if dtype is DType.BF16:
        value = (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    else:
        value = raw.astype(np.float64)
    return Real(value, bits, FMT[dtype])


def _store_exact(value: np.ndarray, dtype: DType) -> np.ndarray:
    """Exactly representable float64 values (or ±inf) → bits of `dtype` (uint64)."""
    if dtype is DType.BF16:
        return (value.astype(np.float32).view(np.uint32) >> 16).astype(np.uint64)
    return value.astype(STORAGE[dtype]).view(_UINT[FMT[dtype].bits]).astype(np.uint64)


def to_float(x: "Real | Int", dtype: DType) -> np.ndarray:
    """Real or integer elements → stored floats of `dtype` (rounded once)."""
    fmt = FMT[dtype]
    with np.errstate(all="ignore"):
        if isinstance(x, Int):
            bits = _store_exact(round_int(x.value, fmt), dtype)
        else:
            widening = fmt.mant >= x.fmt.mant and fmt.emin <= x.fmt.emin    # every value fits: exact
            bits = _store_exact(x.value if widening else round_real(x.value, fmt), dtype)
            nan = np.isnan(x.value)
            bits[nan] = nan_bits(x.bits[nan], x.fmt, fmt)
    return bits.astype(_UINT[fmt.bits]).view(STORAGE[dtype])


_INT_BITS = {DType.I8: 8, DType.I16: 16, DType.I32: 32, DType.I64: 64, DType.U8: 8, DType.U32: 32}


def int_range(dtype: DType) -> tuple[int, int]:
    """(min, max) of an integer dtype."""
    n = _INT_BITS[dtype]
    return (-(1 << (n - 1)), (1 << (n - 1)) - 1) if dtype.is_signed else (0, (1 << n) - 1)


def wrap(v: np.ndarray, dtype: DType) -> np.ndarray:
    """int64 values → `dtype` by two's-complement wrapping (keep the low bits)."""
    n = _INT_BITS[dtype]
    low = v.astype(np.uint64) & np.uint64((1 << n) - 1)
    return low.astype(_UINT[n]).view(STORAGE[dtype])


def saturate(x: np.ndarray, dtype: DType) -> np.ndarray:
    """float64 values → `dtype`: truncate toward zero, saturate at the range, NaN → 0."""
    lo, hi = int_range(dtype)
    t = np.trunc(np.nan_to_num(x, nan=0.0, posinf=np.inf, neginf=-np.inf))
    ceiling = float(hi + 1)                        # a power of two: exact in float64
    inside = np.clip(t, float(lo), np.nextafter(ceiling, 0.0)).astype(np.int64)
    return wrap(np.where(t >= ceiling, hi, inside), dtype)


def encode(x: "Real | Int | Complex", dtype: DType) -> np.ndarray:
    """Decoded elements → stored elements of `dtype`."""
    if dtype.is_complex:
        part = _PART[dtype]
        if isinstance(x, Complex):
            return np.stack([to_float(x.re, part), to_float(x.im, part)], axis=1)
        re = to_float(x, part)
        return np.stack([re, np.zeros_like(re)], axis=1)
    if dtype is DType.Bool:
        nonzero = (x.re.value != 0) | (x.im.value != 0) if isinstance(x, Complex) else x.value != 0
        return nonzero.astype(np.uint8)              # NaN != 0 is true
    real = x.re if isinstance(x, Complex) else x
    if dtype.is_int:
        return wrap(real.value, dtype) if isinstance(real, Int) else saturate(real.value, dtype)
    return to_float(real, dtype)


def cast(src_dtype: DType, dst_dtype: DType, values: np.ndarray) -> np.ndarray:
    """Convert stored `src_dtype` elements to stored `dst_dtype` elements (Rust `as` semantics)."""
    if src_dtype is dst_dtype:
        return values.copy()
    with np.errstate(all="ignore"):
        return encode(decode(src_dtype, values), dst_dtype)


def round_half(values: np.ndarray, bf16: bool) -> np.ndarray:
    """f32 values rounded to bf16 / f16 (RNE) and widened back to f32."""
    half = DType.BF16 if bf16 else DType.F16
    return cast(half, DType.F32, cast(DType.F32, half, values))


# ── the thunks ───────────────────────────────────────────────────────────────

@reference(*(T.ALL_THUNKS[kind] for kind in COPY_ITEMSIZE))
def copy(arena: np.ndarray, t) -> None:
    """Copy `len` elements of 4 or 8 bytes."""
    n = t.len * COPY_ITEMSIZE[type(t).__name__]
    arena[t.dst:t.dst + n] = arena[t.src:t.src + n].copy()


@reference(*(T.ALL_THUNKS[kind] for kind in CAST_DTYPES), T.CastGeneric)
def cast_thunk(arena: np.ndarray, t) -> None:
    """Any Cast kind: convert `len` elements from the source to the destination dtype."""
    src, dst = CAST_DTYPES.get(type(t).__name__) or (t.src_dtype, t.dst_dtype)
    store(arena, dst, t.dst, cast(src, dst, load(arena, src, t.src, t.len).copy()))


@reference(T.RoundHalf)
def round_half_thunk(arena: np.ndarray, t) -> None:
    """Round f32 values to half precision, keeping f32 storage."""
    store(arena, DType.F32, t.dst, round_half(load(arena, DType.F32, t.src, t.len).copy(), t.bf16))
