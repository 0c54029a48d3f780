"""NumPy references of `DequantMatMul` (Int8Block) and `DequantMatMulInt4` (semantics.md §3.8;
docs/lowering-dequant.md): W decoded to f32 as `(f32(q) − z)·s` (two roundings), products summed in
f64 and rounded once."""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..thunks.base import cdiv
from . import reference, view


def int8_codes(arena: np.ndarray, t: T.DequantMatMul) -> np.ndarray:
    """The signed byte codes of W, flat."""
    return view(arena, t.w_q, np.int8, t.k * t.n)


def int4_codes(arena: np.ndarray, t: T.DequantMatMulInt4) -> np.ndarray:
    """The nibble codes of W, flat: element f is the low nibble of byte f // 2 when f is even, else the high."""
    packed = view(arena, t.w_q, np.uint8, cdiv(t.k * t.n, 2))
    return np.stack([packed & 15, packed >> 4], axis=1).reshape(-1)[:t.k * t.n]


def dequantize(t: "T.DequantMatMul | T.DequantMatMulInt4", arena: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """`w[p, j] = (q[p, j] − z)·s` with the block row `p // block_size` of scale (and zp), as f32 `[k, n]`."""
    blocks = cdiv(t.k, t.block_size)
    per_row = np.arange(t.k) // t.block_size
    scale = view(arena, t.scale, np.float32, blocks * t.n).reshape(blocks, t.n)[per_row]
    zp = (view(arena, t.zp, np.float32, blocks * t.n).reshape(blocks, t.n)[per_row] if t.is_asymmetric
          else np.float32(0.0))
    with np.errstate(invalid="ignore", over="ignore"):
        return (codes.reshape(t.k, t.n).astype(np.float32) - zp) * scale


def matmul(arena: np.ndarray, t: "T.DequantMatMul | T.DequantMatMulInt4", w: np.ndarray) -> None:
    """`dst = x @ w`, summed in f64."""
    x = view(arena, t.x, np.float32, t.m * t.k).reshape(t.m, t.k)
    with np.errstate(invalid="ignore", over="ignore"):
        out = x.astype(np.float64) @ w.astype(np.float64)
    view(arena, t.dst, np.float32, t.m * t.n)[:] = out.astype(np.float32).reshape(-1)


@reference(T.DequantMatMul)
def dequant_matmul(arena: np.ndarray, t: T.DequantMatMul) -> None:
    """Int8Block: i8 codes."""
    matmul(arena, t, dequantize(t, arena, int8_codes(arena, t)))


@reference(T.DequantMatMulInt4)
def dequant_matmul_int4(arena: np.ndarray, t: T.DequantMatMulInt4) -> None:
    """Int4: unsigned nibbles, even flat index low."""
    matmul(arena, t, dequantize(t, arena, int4_codes(arena, t)))
