"""QMatMul / QConv2d against ONNX, bit-exact.

The integer part — `Σ (x − x_zp)(w − w_zp)` in int32 — is ONNX's `MatMulInteger`/`ConvInteger`
(plus the bias). The requantization is RLX's (semantics.md §3.8): `round_half_away(f32(acc)·mult)
+ out_zp`, saturated; ONNX's `QLinearMatMul`/`QLinearConv` round `acc·mult + zp` half to even in
float64 instead, so those are compared where no product lies near a half (`GENERIC`, `TINY`),
and the tie cases (`HALVES`, every odd sum a tie) are compared with the spec's rounding.
The thunk's `mult` is ONNX's `a_scale·b_scale/y_scale` computed in f32.
"""
from __future__ import annotations

import numpy as np

from rlx_llvm import thunks as T
from tests.oracles.onnx_check import OnnxCase, onnx_run, oracle_test, rng

I8 = np.dtype(np.int8)


def int8s(shape, *key: int) -> np.ndarray:
    """Uniform int8 data of `shape`, seeded by `key`."""
    return rng(*key).integers(-128, 128, shape).astype(np.int8)


def quant_params(scales, zps) -> list[np.ndarray]:
    """ONNX (scale, zero point) scalars: f32 and int8."""
    return [np.float32(scales), np.int8(zps)]


def multiplier(a_scale: float, b_scale: float, y_scale: float) -> float:
    """`a_scale·b_scale/y_scale` in f32, as ONNX's reference evaluator computes it."""
    return float(np.float32(a_scale) * np.float32(b_scale) / np.float32(y_scale))


def rlx_requantize(acc: np.ndarray, mult: float, out_zp: int) -> np.ndarray:
    """semantics.md §3.8: `clamp(round_half_away(acc·mult) + out_zp, −128, 127)`, the product in f32."""
    with np.errstate(over="ignore"):
        real = (acc.astype(np.float32) * np.float32(mult)).astype(np.float64)
    away = np.clip(np.sign(real) * np.floor(np.abs(real) + 0.5), -1024, 1024).astype(np.int32)
    return np.clip(away + out_zp, -128, 127).astype(np.int8)


def qmatmul_case(m, k, n, zps, scales) -> OnnxCase:
    """QMatMul ↔ QLinearMatMul; `zps` = (x, w, y) zero points, `scales` = (x, w, y) scales."""
    x, w = int8s((m, k), 1, m, k), int8s((k, n), 2, k, n)
    (xs, ws, ys), (xz, wz, yz) = scales, zps
    inputs = [x, *quant_params(xs, xz), w, *quant_params(ws, wz), *quant_params(ys, yz)]
    inputs = [np.asarray(a) for a in inputs]

    def build(x_, xs_, xz_, w_, ws_, wz_, ys_, yz_, bias, out) -> T.Thunk:
        return T.QMatMul(x=x_, w=w_, bias=bias, out=out, m=m, k=k, n=n, x_zp=xz, w_zp=wz, out_zp=yz,
                         mult=multiplier(xs, ws, ys))

    def rlx_rounding() -> np.ndarray:
        acc = onnx_run("MatMulInteger", [x, w, np.int8(xz), np.int8(wz)])[0]
        return rlx_requantize(acc, multiplier(xs, ws, ys), yz)

    return OnnxCase(f"QMatMul-{m}x{k}x{n}-zp{zps}-s{scales}", "QLinearMatMul", inputs, build, (m, n), I8,
                    extra=[np.zeros(n, np.int32)], expect=None if scales in EXACT else rlx_rounding)


def qconv_case(n, c_in, hw, c_out, kernel, stride, pad, dilation, groups, zps, scales) -> OnnxCase:
    """QConv2d ↔ QLinearConv with an int32 bias."""
    out = [(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d in zip(hw, kernel, stride, pad, dilation)]
    x = int8s((n, c_in, *hw), 3, n, c_in, *hw)
    w = int8s((c_out, c_in // groups, *kernel), 4, c_out, *kernel)
    bias = rng(5, c_out).integers(-30000, 30000, c_out).astype(np.int32)
    (xs, ws, ys), (xz, wz, yz) = scales, zps
    inputs = [np.asarray(a) for a in (x, *quant_params(xs, xz), w, *quant_params(ws, wz), *quant_params(ys, yz), bias)]
    attrs = dict(kernel_shape=list(kernel), strides=list(stride), pads=list(pad) * 2, dilations=list(dilation),
                 group=groups)

    def build(x_, xs_, xz_, w_, ws_, wz_, ys_, yz_, b_, out_) -> T.Thunk:
        return T.QConv2d(x=x_, w=w_, bias=b_, out=out_, n=n, c_in=c_in, h=hw[0], w_in=hw[1], c_out=c_out,
                         h_out=out[0], w_out=out[1], kh=kernel[0], kw=kernel[1], sh=stride[0], sw=stride[1],
                         ph=pad[0], pw=pad[1], dh=dilation[0], dw=dilation[1], groups=groups, x_zp=xz, w_zp=wz,
                         out_zp=yz, mult=multiplier(xs, ws, ys))

    def rlx_rounding() -> np.ndarray:
        acc = onnx_run("ConvInteger", [x, w, np.int8(xz), np.int8(wz)], attrs)[0] + bias[:, None, None]
        return rlx_requantize(acc, multiplier(xs, ws, ys), yz)

    return OnnxCase(f"QConv2d-{n}x{c_in}x{hw}-{c_out}-k{kernel}s{stride}p{pad}d{dilation}g{groups}-zp{zps}-s{scales}",
                    "QLinearConv", inputs, build, (n, c_out, *out), I8, attrs=attrs,
                    expect=None if scales in EXACT else rlx_rounding)


GENERIC = (0.02, 0.013, 0.37)
HALVES = (1.0, 1.0, 2.0)        # mult = 0.5: every odd sum is a tie
SATURATING = (0.5, 0.25, 0.01)
TINY = (0.001, 0.002, 3.0)
EXACT = (GENERIC, TINY)         # no product near a half: QLinearMatMul/QLinearConv themselves agree

CASES = [
    qmatmul_case(1, 1, 1, (0, 0, 0), GENERIC),
    qmatmul_case(5, 37, 19, (3, -2, -5), GENERIC),
    qmatmul_case(4, 16, 16, (0, 0, 0), HALVES),
    qmatmul_case(7, 9, 33, (-128, 127, 0), HALVES),
    qmatmul_case(6, 50, 41, (127, -128, 127), SATURATING),
    qmatmul_case(3, 64, 17, (-128, -128, -128), SATURATING),
    qmatmul_case(17, 130, 70, (11, 7, -9), TINY),
    qmatmul_case(33, 256, 65, (-1, 1, 2), (0.0078125, 0.0234, 0.731)),
    qconv_case(1, 3, (7, 11), 4, (3, 3), (1, 1), (1, 1), (1, 1), 1, (5, -3, 2), GENERIC),
    qconv_case(2, 4, (9, 10), 6, (3, 2), (2, 1), (1, 0), (1, 2), 2, (-128, 127, -7), HALVES),
    qconv_case(1, 6, (1, 13), 6, (1, 3), (1, 3), (0, 2), (1, 1), 6, (127, 0, 0), SATURATING),   # depthwise
    qconv_case(1, 8, (6, 7), 5, (1, 1), (1, 1), (0, 0), (1, 1), 1, (1, 2, 3), TINY),          # 1×1: direct
    qconv_case(2, 8, (12, 37), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1, (-4, 9, 12), (0.01, 0.02, 0.9)),
]

test_qgemm_matches_onnx = oracle_test(CASES)
