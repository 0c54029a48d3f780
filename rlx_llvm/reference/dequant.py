"""NumPy references of the `[k, n]`-layout dequantizing GEMMs (semantics.md §2.11, §3.8;
docs/lowering-dequant.md): `DequantMatMul` (Int8Block), `DequantMatMulInt4`, `DequantMatMulFp8`,
`DequantMatMulNvfp4` and `DequantMatMulMxFp4x2`.  W is decoded to f32 `[k, n]` with the kernel's
roundings, then the products are summed in f64 and rounded once."""
from __future__ import annotations

from typing import Union

import numpy as np

from .. import thunks as T
from ..thunks.base import cdiv
from . import reference, view
from .scaled import FORMATS, Minifloat, decode

RLX_E4M3 = Minifloat(4, 3, 7, "ieee")
"""`DequantMatMulFp8`'s *IEEE-like* E4M3 (§2.11): exponent 15 is ±inf (mantissa 0) or NaN — not OCP E4M3FN."""
FP8 = {False: RLX_E4M3, True: FORMATS["F8E5M2"]}
"""`DequantMatMulFp8`'s decoder by its `e5m2` flag."""
E2M1 = FORMATS["F4E2M1"]
NVFP4_GROUP = 16
"""Rows of W per NVFP4 scale byte."""

Dequant = Union[T.DequantMatMul, T.DequantMatMulInt4, T.DequantMatMulFp8, T.DequantMatMulNvfp4,
                T.DequantMatMulMxFp4x2]


def int8_codes(arena: np.ndarray, t: T.DequantMatMul) -> np.ndarray:
    """The signed byte codes of W, flat."""
    return view(arena, t.w_q, np.int8, t.k * t.n)


def nibbles(arena: np.ndarray, offset: int, count: int) -> np.ndarray:
    """`count` nibbles packed from `offset`: element f is the low nibble of byte f // 2 when f is even, else the high."""
    packed = view(arena, offset, np.uint8, cdiv(count, 2))
    return np.stack([packed & 15, packed >> 4], axis=1).reshape(-1)[:count]


def int4_codes(arena: np.ndarray, t: "T.DequantMatMulInt4 | T.DequantMatMulNvfp4") -> np.ndarray:
    """The nibble codes of W, flat (even flat index low)."""
    return nibbles(arena, t.w_q, t.k * t.n)


def block_rows(arena: np.ndarray, offset: int, t: Dequant, rows_per_block: int, dtype=np.float32) -> np.ndarray:
    """A `[ceil(k / rows_per_block), n]` table of per-block values, repeated to one row per row of W: `[k, n]`."""
    blocks = cdiv(t.k, rows_per_block)
    return view(arena, offset, dtype, blocks * t.n).reshape(blocks, t.n)[np.arange(t.k) // rows_per_block]


def int_weights(arena: np.ndarray, t: "T.DequantMatMul | T.DequantMatMulInt4", codes: np.ndarray) -> np.ndarray:
    """`w[p, j] = (q[p, j] − z)·s` with the block row `p // block_size` of scale (and zp), as f32 `[k, n]`."""
    scale = block_rows(arena, t.scale, t, t.block_size)
    zp = block_rows(arena, t.zp, t, t.block_size) if t.is_asymmetric else np.float32(0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        return (codes.reshape(t.k, t.n).astype(np.float32) - zp) * scale


def fp8_weights(arena: np.ndarray, t: T.DequantMatMulFp8) -> np.ndarray:
    """`w[p, j] = fp8(q[p, j])·scale[j]` (one rounding)."""
    codes = view(arena, t.w_q, np.uint8, t.k * t.n).reshape(t.k, t.n)
    with np.errstate(invalid="ignore", over="ignore"):
        return decode(FP8[t.e5m2], codes) * view(arena, t.scale, np.float32, t.n)


def nvfp4_scale(codes: np.ndarray) -> np.ndarray:
    """NVFP4 block scales: OCP E4M3 bytes, the NaN codes (S.1111.111) decoded as 0 (§2.11)."""
    s = decode(FORMATS["F8E4M3"], codes)
    return np.where(np.isnan(s), np.float32(0.0), s)


def nvfp4_weights(arena: np.ndarray, t: T.DequantMatMulNvfp4) -> np.ndarray:
    """`w = (e2m1(q)·e4m3(scale[p // 16, j]))·global` (the first product exact, one rounding)."""
    q = decode(E2M1, int4_codes(arena, t)).reshape(t.k, t.n)
    s = nvfp4_scale(block_rows(arena, t.scale, t, NVFP4_GROUP, np.uint8))
    with np.errstate(invalid="ignore", over="ignore"):
        return (q * s) * view(arena, t.global_scale, np.float32, 1)[0]


def mxfp4x2_planes(t: T.DequantMatMulMxFp4x2) -> tuple[tuple[int, int], tuple[int, int]]:
    """`(nibble plane, scale plane)` offsets of the two levels: plane 1 starts `ceil(k·n/2)` bytes after
    `w_q` and `4·ceil(k/group)·n` bytes after `scale`."""
    codes, scales = cdiv(t.k * t.n, 2), 4 * cdiv(t.k, t.group) * t.n
    return (t.w_q, t.scale), (t.w_q + codes, t.scale + scales)


def mxfp4x2_weights(arena: np.ndarray, t: T.DequantMatMulMxFp4x2) -> np.ndarray:
    """`w = e2m1(q0)·s0 + e2m1(q1)·s1` in f32 (each product and the sum rounded)."""
    with np.errstate(invalid="ignore", over="ignore"):
        q0, q1 = (decode(E2M1, nibbles(arena, codes, t.k * t.n)).reshape(t.k, t.n) * block_rows(arena, scale, t, t.group)
                  for codes, scale in mxfp4x2_planes(t))
        return q0 + q1


def matmul(arena: np.ndarray, t: Dequant, w: np.ndarray) -> None:
    """`dst = x @ w`, summed in f64."""
    x = view(arena, t.x, np.float32, t.m * t.k).reshape(t.m, t.k)
    with np.errstate(invalid="ignore", over="ignore"):
        out = x.astype(np.float64) @ w.astype(np.float64)
    view(arena, t.dst, np.float32, t.m * t.n)[:] = out.astype(np.float32).reshape(-1)


@reference(T.DequantMatMul)
def dequant_matmul(arena: np.ndarray, t: T.DequantMatMul) -> None:
    """Int8Block: i8 codes."""
    matmul(arena, t, int_weights(arena, t, int8_codes(arena, t)))


@reference(T.DequantMatMulInt4)
def dequant_matmul_int4(arena: np.ndarray, t: T.DequantMatMulInt4) -> None:
    """Int4: unsigned nibbles, even flat index low."""
    matmul(arena, t, int_weights(arena, t, int4_codes(arena, t)))


@reference(T.DequantMatMulFp8)
def dequant_matmul_fp8(arena: np.ndarray, t: T.DequantMatMulFp8) -> None:
    """FP8 bytes (IEEE-like E4M3 or E5M2), per-column scale."""
    matmul(arena, t, fp8_weights(arena, t))


@reference(T.DequantMatMulNvfp4)
def dequant_matmul_nvfp4(arena: np.ndarray, t: T.DequantMatMulNvfp4) -> None:
    """NVFP4: E2M1 nibbles, E4M3 scale per 16 rows, f32 global."""
    matmul(arena, t, nvfp4_weights(arena, t))


@reference(T.DequantMatMulMxFp4x2)
def dequant_matmul_mxfp4x2(arena: np.ndarray, t: T.DequantMatMulMxFp4x2) -> None:
    """Two-level residual E2M1 with f32 scales per `group` rows."""
    matmul(arena, t, mxfp4x2_weights(arena, t))
