"""Quantize / Dequantize against one-node ONNX QuantizeLinear / DequantizeLinear models, bit-exact.

The thunk views its data as `[outer, chan_dim, inner]`; ONNX gets that shape with per-axis scales and
int8 zero points on axis 1 (per tensor: scalars).  Dequantize maps for every input.  Quantize maps
where RLX's rounding and ONNX's agree (docs/semantics-choices.md, "quantize"): the scales are powers
of two (so RLX's `x·(1/scale)` equals ONNX's `x/scale` exactly), no product is an exact half (RLX
rounds those away from zero, ONNX to even), and no input is NaN or infinite (ONNX leaves those
undefined); saturation at both ends is covered.
"""
from __future__ import annotations

import numpy as np

from rlx_llvm import thunks as T
from tests.oracles.onnx_check import OnnxCase, oracle_test, rng

I8 = np.dtype(np.int8)


def onnx_params(scales, zps, per_tensor: bool) -> list[np.ndarray]:
    """ONNX (scale, zero point): f32 and int8, scalars per tensor or 1-D per axis."""
    if per_tensor:
        return [np.asarray(np.float32(scales[0])), np.asarray(np.int8(zps[0]))]
    return [np.asarray(scales, np.float32), np.asarray(zps, np.int8)]


def layout(shape: tuple[int, int, int]) -> dict:
    outer, chan_dim, inner = shape
    return dict(len=outer * chan_dim * inner, chan_axis=1, chan_dim=chan_dim, inner=inner)


def without_ties(x: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """`x` with every element whose quotient by its channel's scale is an exact half nudged off it."""
    q = x / scales.reshape(1, -1, 1)
    tie = np.abs(q - np.trunc(q)) == 0.5
    return np.where(tie, np.nextafter(x, np.float32(np.inf)), x).astype(np.float32)


def quantize_case(shape: tuple[int, int, int], exponents, zps) -> OnnxCase:
    """Quantize ↔ QuantizeLinear over normals spread to ±3× the int8 range (saturating both ends)."""
    scales = np.float32(2.0) ** np.asarray(exponents, np.float32)
    x = (rng(1, *shape).standard_normal(shape) * 130.0).astype(np.float32) * scales.reshape(1, -1, 1)
    x = without_ties(x.astype(np.float32), scales)
    per_tensor = shape[1] == 1

    def build(x_, s_, z_, out) -> T.Thunk:
        return T.Quantize(x=x_, q=out, scales=tuple(map(float, scales)), zero_points=tuple(map(int, zps)),
                          **layout(shape))

    return OnnxCase(f"Quantize-{shape}-e{tuple(exponents)}-zp{tuple(zps)}", "QuantizeLinear",
                    [x, *onnx_params(scales, zps, per_tensor)], build, shape, I8, attrs=dict(axis=1))


def dequantize_case(shape: tuple[int, int, int], scales, zps) -> OnnxCase:
    """Dequantize ↔ DequantizeLinear over uniform int8 codes."""
    q = rng(2, *shape).integers(-128, 128, shape).astype(np.int8)
    per_tensor = shape[1] == 1

    def build(q_, s_, z_, out) -> T.Thunk:
        return T.Dequantize(q=q_, x=out, scales=tuple(float(np.float32(s)) for s in scales),
                            zero_points=tuple(map(int, zps)), **layout(shape))

    return OnnxCase(f"Dequantize-{shape}-s{tuple(scales)}-zp{tuple(zps)}", "DequantizeLinear",
                    [q, *onnx_params(scales, zps, per_tensor)], build, shape, np.dtype(np.float32),
                    attrs=dict(axis=1))


CASES = [
    quantize_case((1, 1, 1), (-3,), (0,)),
    quantize_case((1, 1, 37), (-7,), (5,)),
    quantize_case((1, 1, 1000), (4,), (-128,)),
    quantize_case((6, 3, 1), (-1, 0, 2), (127, 0, -128)),
    quantize_case((2, 4, 17), (-10, -4, 3, 0), (1, -2, 3, -4)),
    quantize_case((3, 2, 64), (-20, 20), (-128, 127)),
    dequantize_case((1, 1, 1), (0.5,), (0,)),
    dequantize_case((1, 1, 300), (0.0137,), (-128,)),
    dequantize_case((5, 3, 1), (0.1, 3.7e-5, 12.5), (127, 0, -128)),
    dequantize_case((2, 4, 19), (0.02, 0.05, 0.011, 0.3), (0, -3, 17, -128)),
    dequantize_case((3, 2, 70), (1e-30, 1e30), (7, -7)),
]

test_quantize_matches_onnx = oracle_test(CASES)
