"""NumPy references of the INT8 kernels QMatMul and QConv2d (semantics.md §3.8; docs/lowering-qgemm.md).

Both accumulate `(x − x_zp)·(w − w_zp)` exactly in int32 (wrapping, as NumPy's int32 matmul does),
add the int32 bias, and requantize as RLX does: the int32 sum times `mult` in f32, rounded half away
from zero (Rust `f32::round`), plus the output zero point, saturated to int8.
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from . import reference, view


def requantize(acc: np.ndarray, mult: float, out_zp: int) -> np.ndarray:
    """`clip(round_half_away(f32(acc)·mult) + out_zp, −128, 127)` as int8, the product in f32."""
    with np.errstate(over="ignore"):
        real = (acc.astype(np.float32) * np.float32(mult)).astype(np.float64)   # exact in f64
    rounded = np.clip(np.copysign(np.floor(np.abs(real) + 0.5), real), -1024, 1024)
    return np.clip(rounded.astype(np.int32) + out_zp, -128, 127).astype(np.int8)


def centered(arena: np.ndarray, offset: int, count: int, zp: int) -> np.ndarray:
    """The int8 buffer at `offset` minus its zero point, as int32."""
    return view(arena, offset, np.int8, count).astype(np.int32) - np.int32(zp)


@reference(T.QMatMul)
def qmatmul(arena: np.ndarray, t: T.QMatMul) -> None:
    """`out = requantize(bias[n] + (x − x_zp)·(w − w_zp))` on `[m, k]·[k, n]`."""
    x = centered(arena, t.x, t.m * t.k, t.x_zp).reshape(t.m, t.k)
    w = centered(arena, t.w, t.k * t.n, t.w_zp).reshape(t.k, t.n)
    acc = np.matmul(x, w) + view(arena, t.bias, np.int32, t.n)
    view(arena, t.out, np.int8, t.m * t.n)[:] = requantize(acc, t.mult, t.out_zp).reshape(-1)


@reference(T.QConv2d)
def qconv2d(arena: np.ndarray, t: T.QConv2d) -> None:
    """NCHW grouped conv of the centered int8 input and weights (padding contributes 0), requantized."""
    g, cin_g, cout_g = t.groups, t.c_in // t.groups, t.c_out // t.groups
    x = centered(arena, t.x, t.n * t.c_in * t.h * t.w_in, t.x_zp).reshape(t.n, g, cin_g, t.h, t.w_in)
    w = centered(arena, t.w, t.c_out * cin_g * t.kh * t.kw, t.w_zp).reshape(g, cout_g, cin_g, t.kh, t.kw)
    xp = np.pad(x, [(0, 0)] * 3 + [(t.ph, t.ph), (t.pw, t.pw)])
    acc = np.zeros((t.n, g, cout_g, t.h_out, t.w_out), np.int32)
    for ki, kj in np.ndindex(t.kh, t.kw):
        rows = slice(ki * t.dh, ki * t.dh + t.sh * (t.h_out - 1) + 1, t.sh)
        cols = slice(kj * t.dw, kj * t.dw + t.sw * (t.w_out - 1) + 1, t.sw)
        acc += np.einsum("ngchw,gdc->ngdhw", xp[..., rows, cols], w[..., ki, kj], dtype=np.int32)
    acc = acc.reshape(t.n, t.c_out, t.h_out, t.w_out) + view(arena, t.bias, np.int32, t.c_out)[:, None, None]
    view(arena, t.out, np.int8, acc.size)[:] = requantize(acc, t.mult, t.out_zp).reshape(-1)
