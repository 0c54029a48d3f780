"""NumPy references of the scaled low-precision kinds (semantics.md §2.12, §3.8) and the minifloat formats.

A `Minifloat` describes one `ScaledFormat` (exponent/mantissa bits, bias, which codes are NaN/inf);
the IR codecs (`ir_emit/lowp_floats.py`) read the same description.  The references here decode
by the formula and encode by exhaustive search of the finite codes (nearest, ties to the even
mantissa LSB, overflow and ±inf saturating to ±max, NaN → code 0) — a different construction from
the IR's bit arithmetic, and the tests check both against `ml_dtypes`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .. import thunks as T
from ..errors import ValidationError
from ..ops import ScaledFormat, ScaleLayout
from ..thunks.base import cdiv
from ..thunks.quant import scale_bytes
from . import reference, view
from .gemm import checked_expert_ids

E8M0_BIAS = 127


@dataclass(frozen=True)
class Minifloat:
    """A sign-exponent-mantissa code of `1 + exp_bits + mant_bits` ≤ 8 bits; `specials` says which codes
    are not finite: "none" (all finite), "ocp" (S.1111.111 is NaN), "ieee" (top exponent inf/NaN),
    "fnuz" (0x80 is the only NaN; no −0)."""

    exp_bits: int
    mant_bits: int
    bias: int
    specials: str = "none"

    @property
    def sign_shift(self) -> int:
        """Bit position of the sign."""
        return self.exp_bits + self.mant_bits

    @property
    def max_code(self) -> int:
        """The code (sign clear) of the largest finite value."""
        all_ones = (1 << self.sign_shift) - 1
        if self.specials == "ocp":
            return all_ones - 1
        if self.specials == "ieee":
            return all_ones - (1 << self.mant_bits)
        return all_ones

    @property
    def min_normal_exp(self) -> int:
        """log2 of the smallest normal value, `1 − bias`."""
        return 1 - self.bias

    @cached_property
    def magnitudes(self) -> np.ndarray:
        """The f32 values of codes `0 … max_code` (increasing)."""
        return decode(self, np.arange(self.max_code + 1))

    @property
    def max_finite(self) -> np.float32:
        """The largest finite value."""
        return self.magnitudes[-1]


FORMATS = {"F8E4M3": Minifloat(4, 3, 7, "ocp"), "F8E5M2": Minifloat(5, 2, 15, "ieee"),
           "F8E4M3Fnuz": Minifloat(4, 3, 8, "fnuz"), "F8E5M2Fnuz": Minifloat(5, 2, 16, "fnuz"),
           "F6E2M3": Minifloat(2, 3, 1), "F6E3M2": Minifloat(3, 2, 3), "F4E2M1": Minifloat(2, 1, 1)}
"""The named `ScaledFormat`s."""


def minifloat(fmt: ScaledFormat, kind: str = "", field: str = "fmt") -> Minifloat:
    """The description of `fmt`; a `Custom` format must fit a byte and keep its values f32 normals."""
    if isinstance(fmt, ScaledFormat.Custom):
        e, m, bias = fmt.exp_bits, fmt.mant_bits, fmt.bias
        if not (e >= 1 and m >= 0 and 1 + e + m <= 8 and (1 << e) - 1 - bias <= 127 and 1 - bias - m >= -126):
            raise ValidationError(f"format {fmt!r}: need exp_bits ≥ 1, 1 + exp_bits + mant_bits ≤ 8 and a range "
                                  "inside f32's normals", kind=kind, field=field)
        return Minifloat(e, m, bias)
    return FORMATS[fmt.name]


def decode(f: Minifloat, codes: np.ndarray) -> np.ndarray:
    """f32 values of the codes: `(m/2^M)·2^(1−bias)` for exp 0, else `(1+m/2^M)·2^(exp−bias)`."""
    c = np.asarray(codes, np.int64) & ((1 << (f.sign_shift + 1)) - 1)
    sign = np.where(c >> f.sign_shift, -1.0, 1.0)
    mag = c & ((1 << f.sign_shift) - 1)
    exp, man = mag >> f.mant_bits, mag & ((1 << f.mant_bits) - 1)
    frac = np.where(exp == 0, man / 2.0 ** f.mant_bits, 1 + man / 2.0 ** f.mant_bits)
    value = sign * np.ldexp(frac, np.maximum(exp, 1) - f.bias)
    if f.specials == "ocp":
        value[mag == (1 << f.sign_shift) - 1] = np.nan
    elif f.specials == "ieee":
        top = exp == (1 << f.exp_bits) - 1
        value[top] = np.where(man[top] == 0, sign[top] * np.inf, np.nan)
    elif f.specials == "fnuz":
        value[c == 1 << f.sign_shift] = np.nan
    return value.astype(np.float32)


def encode(f: Minifloat, x: np.ndarray) -> np.ndarray:
    """uint8 codes of f32 `x`: nearest finite magnitude (ties → even code), saturating, NaN → 0."""
    x = np.asarray(x, np.float32).reshape(-1)
    a = np.abs(x).astype(np.float64)
    mags = f.magnitudes.astype(np.float64)
    hi = np.clip(np.searchsorted(mags, a), 1, len(mags) - 1)
    lo = hi - 1
    below, above = a - mags[lo], mags[hi] - a
    pick_hi = (above < below) | ((above == below) & (hi % 2 == 0))
    mag = np.where(a >= mags[-1], len(mags) - 1, np.where(pick_hi, hi, lo))
    neg = np.signbit(x) & ((mag != 0) | (f.specials != "fnuz"))
    code = np.where(neg, 1 << f.sign_shift, 0) | mag
    return np.where(np.isnan(x), 0, code).astype(np.uint8)


def e8m0_decode(b: np.ndarray) -> np.ndarray:
    """E8M0 scale bytes → f32 `2^(b−127)` (0xFF NaN)."""
    b = np.asarray(b, np.int64)
    return np.where(b == 255, np.nan, np.ldexp(1.0, b - E8M0_BIAS)).astype(np.float32)


def e8m0_encode_up(s: np.ndarray) -> np.ndarray:
    """f32 scales → E8M0 bytes rounded up to a power of two: `clamp(⌈log2 s⌉ + 127, 0, 254)`, s ≤ 0 or
    non-finite → 0."""
    s = np.asarray(s, np.float32).astype(np.float64)
    frac, e = np.frexp(s)                       # s = frac·2^e, frac ∈ [0.5, 1)
    ceil_log2 = np.where(frac == 0.5, e - 1, e)
    byte = np.clip(ceil_log2 + E8M0_BIAS, 0, 254)
    return np.where(np.isfinite(s) & (s > 0), byte, 0).astype(np.uint8)


# ── scale layouts ───────────────────────────────────────────────────────────

def block_of(layout: ScaleLayout, cols: int) -> int:
    """Elements per scale along a row (the whole row for a per-tensor scale)."""
    if isinstance(layout, ScaleLayout.BlockMxE8M0):
        return layout.block
    if isinstance(layout, ScaleLayout.Nvfp4):
        return layout.group
    return max(cols, 1)


def decode_scales(layout: ScaleLayout, raw: np.ndarray) -> np.ndarray:
    """Scale bytes (or the per-tensor f32's bytes) → f32 scales."""
    if isinstance(layout, ScaleLayout.BlockMxE8M0):
        return e8m0_decode(raw)
    if isinstance(layout, ScaleLayout.Nvfp4):
        return decode(FORMATS["F8E4M3"], raw)
    return raw.view(np.float32)


def encode_scales(layout: ScaleLayout, s: np.ndarray) -> np.ndarray:
    """f32 scales → the bytes of the scale tensor."""
    if isinstance(layout, ScaleLayout.BlockMxE8M0):
        return e8m0_encode_up(s)
    if isinstance(layout, ScaleLayout.Nvfp4):
        return encode(FORMATS["F8E4M3"], s)
    return np.asarray(s, np.float32).view(np.uint8)


def scale_per_element(arena: np.ndarray, layout: ScaleLayout, offset: int, rows: int, cols: int) -> np.ndarray:
    """`scale(block_of(i))` for every element of a `[rows, cols]` matrix, as f32."""
    scales = decode_scales(layout, view(arena, offset, np.uint8, scale_bytes(layout, rows, cols)))
    if layout.name == "PerTensor":
        return np.full(rows * cols, scales[0], np.float32)
    block = block_of(layout, cols)
    per_row = scales.reshape(rows, cdiv(cols, block))
    return np.repeat(per_row, block, axis=1)[:, :cols].reshape(-1)


def dequantized(arena: np.ndarray, fmt: ScaledFormat, layout: ScaleLayout, codes: int, scale: int, rows: int,
                cols: int) -> np.ndarray:
    """f32 `decode(code)·scale(block)` of a `[rows, cols]` code matrix."""
    with np.errstate(all="ignore"):
        return decode(minifloat(fmt), view(arena, codes, np.uint8, rows * cols)) * \
            scale_per_element(arena, layout, scale, rows, cols)


@reference(T.ScaledDequantize)
def scaled_dequantize(arena, t) -> None:
    """`decode(code)·scale(block)`."""
    view(arena, t.dst, np.float32, t.rows * t.cols)[:] = dequantized(arena, t.fmt, t.layout, t.codes, t.scale,
                                                                     t.rows, t.cols)


@reference(T.ScaledMatMul)
def scaled_matmul(arena, t) -> None:
    """`dequantized(lhs) · dequantized(rhs)ᵀ (+ bias)`, the dot products in float64."""
    a = dequantized(arena, t.lhs_fmt, t.layout, t.lhs, t.lhs_scale, t.m, t.k).reshape(t.m, t.k)
    w = dequantized(arena, t.rhs_fmt, t.layout, t.rhs, t.rhs_scale, t.n, t.k).reshape(t.n, t.k)
    with np.errstate(all="ignore"):
        out = a.astype(np.float64) @ w.astype(np.float64).T
        if t.has_bias:
            out += view(arena, t.bias, np.float32, t.n)
    view(arena, t.dst, np.float32, t.m * t.n)[:] = out.reshape(-1).astype(np.float32)


@reference(T.ScaledGroupedMatMul)
def scaled_grouped_matmul(arena, t) -> None:
    """`dst[i] = dequantized(input[i]) · dequantized(weight[idx[i]])ᵀ (+ bias[idx[i]])`, in float64; an id that
    is ≥ num_experts `as usize` is an IndexError naming its row."""
    ids = checked_expert_ids(arena, t)
    a = dequantized(arena, t.lhs_fmt, t.layout, t.input, t.input_scale, t.m, t.k).reshape(t.m, t.k)
    slab_scales = scale_bytes(t.layout, t.n, t.k)
    w = {e: dequantized(arena, t.rhs_fmt, t.layout, t.weight + e * t.n * t.k, t.weight_scale + e * slab_scales,
                        t.n, t.k).reshape(t.n, t.k).astype(np.float64) for e in set(ids.tolist())}
    bias = view(arena, t.bias, np.float32, t.num_experts * t.n).reshape(-1, t.n) if t.has_bias else None
    out = np.zeros((t.m, t.n))
    with np.errstate(all="ignore"):
        for i, e in enumerate(ids.tolist()):
            out[i] = a[i].astype(np.float64) @ w[e].T + (bias[e] if t.has_bias else 0.0)
    view(arena, t.dst, np.float32, t.m * t.n)[:] = out.reshape(-1).astype(np.float32)


@reference(T.ScaledQuantize)
def scaled_quantize(arena, t) -> None:
    """`encode(x / scale(block))`."""
    n = t.rows * t.cols
    with np.errstate(all="ignore"):
        q = view(arena, t.x, np.float32, n) / scale_per_element(arena, t.layout, t.scale, t.rows, t.cols)
    view(arena, t.dst, np.uint8, n)[:] = encode(minifloat(t.fmt), q)


def amax_blocks(x: np.ndarray, rows: int, cols: int, block: int) -> np.ndarray:
    """NaN-ignoring `max |x|` of each `block` run of each row (0 for an all-NaN block), `[rows, ⌈cols/block⌉]`."""
    nb = cdiv(cols, block)
    padded = np.zeros((rows, nb * block), np.float32)
    padded[:, :cols] = np.abs(x.reshape(rows, cols))
    return np.fmax.reduce(padded.reshape(rows, nb, block), axis=2, initial=0.0)


@reference(T.ScaledQuantScale)
def scaled_quant_scale(arena, t) -> None:
    """`amax / max_finite(fmt)` per tensor or per block, stored per the layout (E8M0 rounded up, E4M3 RNE)."""
    x = view(arena, t.x, np.float32, t.rows * t.cols)
    if t.layout.name == "PerTensor":
        amax = amax_blocks(x, 1, x.size, max(x.size, 1))
    else:
        amax = amax_blocks(x, t.rows, t.cols, block_of(t.layout, t.cols))
    s = amax.reshape(-1) / minifloat(t.fmt).max_finite
    view(arena, t.dst, np.uint8, scale_bytes(t.layout, t.rows, t.cols))[:] = encode_scales(t.layout, s)
