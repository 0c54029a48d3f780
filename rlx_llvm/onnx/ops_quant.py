"""ONNX integer quantization: QuantizeLinear, DequantizeLinear (per tensor and per axis), DynamicQuantizeLinear,
MatMulInteger, QLinearMatMul — bit-exact against onnx.reference (ties round to even, as ONNX).

Quantizing runs on `Graph.quantize` / `requantize` / `integer_matmul` (graph/quant.py), not on RLX's
`Quantize` / `QMatMul` thunks, whose rounding is half away from zero.  Blocked quantization (`block_size`)
spreads each scale and zero point over its block with a `gather`.  Refused by name: 4-bit and float8
types, a batched `B` whose batch dims are not A's.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import DType
from ..graph import Value
from .importer import Convert, Unsupported, converts, dtype_of

INTEGER = (DType.I8, DType.U8, DType.I16)


def _along(cx: Convert, v: Value, x: Value, axis: int, block: int = 0) -> Value:
    """A per-tensor (size 1), per-axis (1-D) or blocked (x's rank, `block` elements of `x` per element along
    `axis`) parameter shaped to broadcast against `x`."""
    rank = x.ndim
    if block:
        if v.ndim != rank or v.shape[axis] != -(-x.shape[axis] // block):
            raise Unsupported(f"a blocked parameter of shape {list(v.shape)} for input {list(x.shape)}, "
                              f"block_size {block} along axis {axis}")
        spread = cx.g.constant(np.arange(x.shape[axis], dtype=np.int64) // block, DType.I64)
        return cx.g.gather(v, spread, axis)
    if v.shape and int(np.prod(v.shape)) > 1:
        if v.ndim != 1:
            raise Unsupported(f"a parameter of shape {list(v.shape)} (blocked quantization is not supported)")
        return cx.g.reshape(v, [v.shape[0]] + [1] * (rank - axis - 1))
    return cx.g.reshape(v, [])


def _scalar_or(cx: Convert, v: Value, shape: list[int]) -> Value:
    """`v` reshaped to `shape` when it has more than one element, else to a scalar."""
    return cx.g.reshape(v, shape if int(np.prod(v.shape)) > 1 else [])


def _zero(cx: Convert, dtype: DType) -> Value:
    return cx.g.constant(np.zeros((), dtype.numpy), dtype)


@converts("QuantizeLinear")
def _quantize(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    if x.dtype != DType.F32:
        raise Unsupported(f"quantizing {x.dtype.value} input (f32 only)")
    axis = cx.attr(node, "axis", 1) % max(x.ndim, 1)
    if cx.has(node, 2):
        zp = cx.tensor(node.input[2])
    else:
        zp = _zero(cx, dtype_of(cx.attr(node, "output_dtype", 2) or 2, "output_dtype"))
    if zp.dtype not in INTEGER:
        raise Unsupported(f"quantizing to {zp.dtype.value} (int8, uint8, int16)")
    block = int(cx.attr(node, "block_size", 0))
    scale = _along(cx, cx.tensor(node.input[1]), x, axis, block)
    zp = _along(cx, zp, x, axis, block) if cx.has(node, 2) else _along(cx, zp, x, axis)
    return [cx.g.quantize(x, scale, zp, zp.dtype)]


@converts("DequantizeLinear")
def _dequantize(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    if x.dtype not in (*INTEGER, DType.I32):
        raise Unsupported(f"dequantizing {x.dtype.value} input (int8, uint8, int16, int32)")
    if cx.attr(node, "output_dtype", 0) not in (0, 1):
        raise Unsupported("output_dtype other than float")
    axis = cx.attr(node, "axis", 1) % max(x.ndim, 1)
    g, block = cx.g, int(cx.attr(node, "block_size", 0))
    y = g.cast(x, "f32")
    if cx.has(node, 2):
        y = y - g.cast(_along(cx, cx.tensor(node.input[2]), x, axis, block), "f32")
    return [y * _along(cx, cx.tensor(node.input[1]), x, axis, block)]


@converts("DynamicQuantizeLinear")
def _dynamic_quantize(cx: Convert, node) -> list:
    """uint8 with `scale = (max(x, 0) − min(x, 0)) / 255` (1/255 when both are 0), `zp = rint(−min/scale)`."""
    x = cx.tensor(node.input[0])
    if x.dtype != DType.F32:
        raise Unsupported(f"{x.dtype.value} input (f32 only)")
    g = cx.g
    hi = g.maximum(g.reduce(x, "max"), g.constant(0.0))
    lo = g.minimum(g.reduce(x, "min"), g.constant(0.0))
    scale = g.where_(g.eq_(hi, lo), g.constant(1.0), hi - lo) / 255.0
    zp = g.quantize(g.neg(lo), scale, _zero(cx, DType.U8), "u8")
    return [g.quantize(x, scale, zp, "u8"), scale, zp]


def _matmul_operands(cx: Convert, node, slots: tuple[int, int, int, int]) -> tuple[Value, Value, Value, Value]:
    """(a, b, a_zp as [m, 1] or scalar, b_zp as [n] or scalar) of an integer matmul."""
    a, b = cx.tensor(node.input[slots[0]]), cx.tensor(node.input[slots[1]])
    if a.ndim < 2 or b.ndim < 2 or (b.ndim > 2 and a.shape[:-2] != b.shape[:-2]):
        raise Unsupported(f"A {list(a.shape)} @ B {list(b.shape)}: a batched B must have A's batch dims")
    zps = []
    for operand, slot, shape in ((a, slots[2], [-1, 1]), (b, slots[3], [-1])):
        if not cx.has(node, slot):
            zps.append(_zero(cx, operand.dtype))
            continue
        zps.append(_scalar_or(cx, cx.tensor(node.input[slot]), shape))
    return a, b, zps[0], zps[1]


@converts("MatMulInteger")
def _matmul_integer(cx: Convert, node) -> list:
    return [cx.g.integer_matmul(*_matmul_operands(cx, node, (0, 1, 2, 3)))]


@converts("QLinearMatMul")
def _qlinear_matmul(cx: Convert, node) -> list:
    """`saturate(rint((a − a_zp)(b − b_zp) · (a_scale·b_scale/y_scale)) + y_zp)`, the product exact in f64."""
    acc = cx.g.integer_matmul(*_matmul_operands(cx, node, (0, 3, 2, 5)))
    a_scale, b_scale, y_scale = (cx.need_const(node, i, what)
                                 for i, what in ((1, "a_scale"), (4, "b_scale"), (6, "y_scale")))
    if a_scale.size > 1:
        a_scale = a_scale.reshape(-1, 1)
    product = a_scale * b_scale / y_scale                  # in the scales' own type, as onnx.reference computes it
    multiplier = product.astype(np.float32)
    if not np.array_equal(multiplier, product):
        raise Unsupported(f"a {product.dtype} scale product that f32 does not hold exactly")
    y_zp = cx.tensor(node.input[7]) if cx.has(node, 7) else _zero(cx, cx.dtype(node.input[0]))
    if y_zp.dtype not in INTEGER:
        raise Unsupported(f"output type {y_zp.dtype.value}")
    return [cx.g.requantize(acc, cx.g.constant(multiplier), _scalar_or(cx, y_zp, [-1]), y_zp.dtype)]
