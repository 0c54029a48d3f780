"""Integer quantization ops with ONNX's rounding (ties to even), bit-exact against onnx.reference.

    q = g.quantize(x, scale, zero_point, "u8")        # saturate(rint(x / scale) + zero_point), x / scale in f32
    q = g.requantize(acc, multiplier, zero_point, "i8")  # saturate(rint(f64(acc)·f64(multiplier)) + zero_point)
    acc = g.integer_matmul(a, b, a_zp, b_zp)          # i32 Σ (a − a_zp)(b − b_zp), exact

`scale`, `multiplier` and the zero points are graph values that broadcast against the operand (per tensor,
per axis, or per row / column).  RLX's `Quantize` and `QMatMul` thunks round half away from zero and
multiply by the reciprocal of the scale, so these ops are built from exact steps instead: an f32 `BinaryFull`
division (or an f64 product), `ActivationF64` Round (ties to even), f64 adds and clamps, and a `CastGeneric`
to the integer type; `integer_matmul` is a `Dgemm` of the zero-point-shifted operands widened to f64
(every sum of int8 products is exact in f64).
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..dtypes import DType
from ..ops import Activation, BinaryOp
from .backward import constant_buffer
from .core import GraphError, Node, Value, broadcast, numel, parse_dtype
from .elementwise import bcast_strides
from .lower import LowerContext
from .opset import infers, lowers

QUANT_DTYPES = {DType.I8: (-128, 127), DType.U8: (0, 255), DType.I16: (-32768, 32767),
                DType.I32: (-2 ** 31, 2 ** 31 - 1)}
INT8 = (DType.I8, DType.U8)


class QuantOps:
    """Builders for quantize / requantize / integer_matmul (mixed into `Graph`)."""

    def quantize(self, x: Value, scale: Value, zero_point: Value, dtype: "DType | str" = "u8") -> Value:
        """`saturate(rint(x / scale) + zero_point)` as `dtype` (i8, u8, i16); x and scale f32."""
        return self.add_node("quantize", (x, scale, zero_point), _attrs("quantize", dtype))

    def requantize(self, acc: Value, multiplier: Value, zero_point: Value, dtype: "DType | str" = "i8") -> Value:
        """`saturate(rint(f64(acc)·f64(multiplier)) + zero_point)` of an i32 accumulator, as `dtype`."""
        return self.add_node("requantize", (acc, multiplier, zero_point), _attrs("requantize", dtype))

    def integer_matmul(self, a: Value, b: Value, a_zp: Value, b_zp: Value) -> Value:
        """i32 `(a − a_zp) @ (b − b_zp)` of int8/uint8 `a [..., m, k]`, `b [k, n]` (or `[..., k, n]` with a's
        batch dims); zero points broadcast (a_zp per row, b_zp per column)."""
        return self.add_node("integer_matmul", (a, b, a_zp, b_zp))

    def dequant_matmul_int4(self, x: Value, codes: Value, scale: Value, zero: Value, block_size: int) -> Value:
        """`x [..., k] @ W` with `W[p, j] = (q[p, j] − zero[p // block, j])·scale[p // block, j]`: `codes` u8
        holding the `[k, n]` 4-bit codes row-major, two per byte (even index low); scale, zero f32 `[⌈k/block⌉, n]`."""
        return self.add_node("dequant_matmul_int4", (x, codes, scale, zero), {"block_size": int(block_size)})


def _attrs(op: str, dtype: "DType | str") -> dict:
    return {"dtype": parse_dtype(dtype, op), "op": op}


@infers("quantize", "requantize")
def _infer_quantize(ins: list[Node], attrs: dict) -> tuple:
    v, scale, zp = ins
    dtype, op = attrs["dtype"], attrs["op"]
    operand = DType.F32 if op == "quantize" else DType.I32
    if dtype not in QUANT_DTYPES or scale.dtype != DType.F32 or v.dtype != operand \
            or zp.dtype not in (*QUANT_DTYPES, DType.F32):
        raise GraphError(f"{op}: a {v.dtype.value} operand (want {operand.value}), {scale.dtype.value} scale (f32) "
                         f"and {zp.dtype.value} zero point to {dtype.value} (i8, u8, i16, i32)")
    for what, n in (("scale", scale), ("zero point", zp)):
        if broadcast(v.shape, n.shape, f"quantize {what}") != v.shape:
            raise GraphError(f"quantize: {what} {list(n.shape)} must broadcast to {list(v.shape)}")
    return v.shape, dtype


@infers("integer_matmul")
def _infer_integer_matmul(ins: list[Node], attrs: dict) -> tuple:
    a, b, a_zp, b_zp = ins
    batched = len(b.shape) > 2
    if a.dtype not in INT8 or b.dtype not in INT8 or len(a.shape) < 2 or len(b.shape) < 2 \
            or a.shape[-1] != b.shape[-2] or (batched and a.shape[:-2] != b.shape[:-2]):
        raise GraphError(f"integer_matmul: a {list(a.shape)} {a.dtype.value} and b {list(b.shape)} "
                         f"{b.dtype.value} must be int8/uint8 [..., m, k] and [k, n] or [..., k, n]")
    out = (*a.shape[:-1], b.shape[-1])
    for what, zp, like in (("a_zp", a_zp, (*a.shape[:-1], 1)), ("b_zp", b_zp, (b.shape[-1],))):
        if zp.dtype != (a if what == "a_zp" else b).dtype or broadcast(like, zp.shape, what) != like:
            raise GraphError(f"integer_matmul: {what} {list(zp.shape)} {zp.dtype.value} must have its operand's "
                             f"dtype and broadcast to {list(like)}")
    return out, DType.I32


@infers("dequant_matmul_int4")
def _infer_dequant_matmul_int4(ins: list[Node], attrs: dict) -> tuple:
    x, codes, scale, zero = ins
    block = attrs["block_size"]
    k = x.shape[-1] if x.shape else 0
    n = scale.shape[-1] if scale.shape else 0
    if x.dtype != DType.F32 or codes.dtype != DType.U8 or block < 1 or len(scale.shape) != 2 \
            or scale.shape != (-(-k // block), n) or zero.shape != scale.shape or codes.shape != ((k * n + 1) // 2,):
        raise GraphError(f"dequant_matmul_int4: x {list(x.shape)} {x.dtype.value}, codes {list(codes.shape)} "
                         f"{codes.dtype.value}, scale {list(scale.shape)}, zero {list(zero.shape)} do not fit "
                         f"f32 [..., k], u8 [⌈k·n/2⌉], f32 [⌈k/{block}⌉, n] twice")
    return (*x.shape[:-1], n), DType.F32


# ── lowering ────────────────────────────────────────────────────────────────

def _f64_of(ctx: LowerContext, src, shape: tuple, dtype: DType, label: str):
    """A scratch f64 copy of the `shape` `dtype` values at `src`."""
    out = ctx.scratch(8 * numel(shape), label)
    ctx.emit(lambda at: T.CastGeneric(src=at(src), dst=at(out), len=numel(shape), src_dtype=dtype,
                                      dst_dtype=DType.F64), reads=[src], writes=[out])
    return out


def _widened(ctx: LowerContext, i: int, label: str):
    """Node `i` as a scratch f64 copy."""
    n = ctx.node(i)
    return _f64_of(ctx, i, n.shape, n.dtype, label)


def _binary(ctx: LowerContext, op: BinaryOp, lhs, lhs_shape: tuple, rhs, rhs_shape: tuple, out_shape: tuple,
            label: str, f64: bool = True):
    """A scratch `lhs op rhs` (NumPy broadcasting) in f64 (`BinaryFullF64`) or f32 (`BinaryFull`)."""
    out = ctx.scratch((8 if f64 else 4) * numel(out_shape), label)
    same = tuple(lhs_shape) == tuple(rhs_shape) == tuple(out_shape)
    geometry = dict(len=numel(out_shape), lhs_len=numel(lhs_shape), rhs_len=numel(rhs_shape), op=op,
                    out_dims_bcast=() if same else tuple(out_shape),
                    bcast_lhs_strides=() if same else bcast_strides(tuple(lhs_shape), tuple(out_shape)),
                    bcast_rhs_strides=() if same else bcast_strides(tuple(rhs_shape), tuple(out_shape)))
    kind = T.BinaryFullF64 if f64 else T.BinaryFull
    extra = {} if f64 else {"elem_bytes": 4}
    ctx.emit(lambda at: kind(lhs=at(lhs), rhs=at(rhs), dst=at(out), **geometry, **extra),
             reads=[lhs, rhs], writes=[out])
    return out


@lowers("quantize", "requantize")
def lower_quantize(ctx: LowerContext, node: Node) -> None:
    """Scaled value in f64 → Round (ties to even) → + zero point → clamp to the dtype → CastGeneric."""
    iv, iscale, izp = node.inputs
    v, scale, zp = (ctx.node(i) for i in node.inputs)
    shape = node.shape
    if node.op == "quantize":
        ratio = _binary(ctx, BinaryOp.Div, iv, v.shape, iscale, scale.shape, shape, "x/scale", f64=False)
        scaled = _f64_of(ctx, ratio, shape, DType.F32, "x/scale f64")
    else:
        scaled = _binary(ctx, BinaryOp.Mul, _widened(ctx, iv, "acc f64"), v.shape,
                         _widened(ctx, iscale, "multiplier f64"), scale.shape, shape, "acc·multiplier")
    rounded = ctx.scratch(8 * numel(shape), "rint")
    ctx.emit(lambda at: T.ActivationF64(src=at(scaled), dst=at(rounded), len=numel(shape), kind=Activation.Round),
             reads=[scaled], writes=[rounded])
    shifted = _binary(ctx, BinaryOp.Add, rounded, shape, _widened(ctx, izp, "zero point f64"), zp.shape, shape,
                      "+zero point")
    lo, hi = (constant_buffer(ctx, np.array([b], np.float64), f"%{node.id} bound") for b in QUANT_DTYPES[node.dtype])
    clamped = _binary(ctx, BinaryOp.Min, _binary(ctx, BinaryOp.Max, shifted, shape, lo, (), shape, "max lo"), shape,
                      hi, (), shape, "min hi")
    ctx.emit(lambda at: T.CastGeneric(src=at(clamped), dst=at(node.id), len=numel(shape), src_dtype=DType.F64,
                                      dst_dtype=node.dtype), reads=[clamped], writes=[node.id])


@lowers("integer_matmul")
def lower_integer_matmul(ctx: LowerContext, node: Node) -> None:
    """Both operands widened to f64 and shifted by their zero points, a Dgemm (one per batch when b is
    batched), CastGeneric to i32."""
    ia, ib, iaz, ibz = node.inputs
    a, b, az, bz = (ctx.node(i) for i in node.inputs)
    k, n = b.shape[-2:]
    batches = numel(b.shape[:-2])
    m = numel(a.shape[:-1]) // batches
    sa = _binary(ctx, BinaryOp.Sub, _widened(ctx, ia, "a f64"), a.shape, _widened(ctx, iaz, "a_zp f64"),
                 _padded(az.shape, a.shape), a.shape, "a − a_zp")
    sb = _binary(ctx, BinaryOp.Sub, _widened(ctx, ib, "b f64"), b.shape, _widened(ctx, ibz, "b_zp f64"),
                 bz.shape, b.shape, "b − b_zp")
    product = ctx.scratch(8 * batches * m * n, "product f64")
    for i in range(batches):
        ctx.emit(lambda at, i=i: T.Dgemm(a=at(sa) + 8 * i * m * k, b=at(sb) + 8 * i * k * n,
                                         c=at(product) + 8 * i * m * n, m=m, k=k, n=n),
                 reads=[sa, sb], writes=[product])
    ctx.emit(lambda at: T.CastGeneric(src=at(product), dst=at(node.id), len=batches * m * n, src_dtype=DType.F64,
                                      dst_dtype=DType.I32), reads=[product], writes=[node.id])


@lowers("dequant_matmul_int4")
def lower_dequant_matmul_int4(ctx: LowerContext, node: Node) -> None:
    """One DequantMatMulInt4 (asymmetric: the zero points are explicit)."""
    ix, iw, isc, iz = node.inputs
    x = ctx.node(ix)
    ctx.emit(lambda at: T.DequantMatMulInt4(x=at(ix), w_q=at(iw), scale=at(isc), zp=at(iz), dst=at(node.id),
                                            m=numel(x.shape[:-1]), k=x.shape[-1], n=node.shape[-1],
                                            block_size=node.attrs["block_size"], is_asymmetric=True),
             reads=[ix, iw, isc, iz], writes=[node.id])


def _padded(shape: tuple, like: tuple) -> tuple:
    """`shape` with leading 1s to the rank of `like`."""
    return (1,) * (len(like) - len(shape)) + tuple(shape)
