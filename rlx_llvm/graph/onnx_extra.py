"""Ops the ONNX importer needs beyond the float element-wise family: `wide_binary` — i64 and f64 binary
math with NumPy broadcasting, one `BinaryFull` (i64 lanes, `elem_bytes` 8) or `BinaryFullF64`.

    y = g.wide_binary("add", a, b)      # a, b both i64 (or both f64)

i64 arithmetic follows the thunk: wrapping, division truncates toward zero, x/0 = x%0 = 0.
"""
from __future__ import annotations

from .. import thunks as T
from ..dtypes import DType
from ..ops import BinaryOp
from .core import GraphError, Node, Value, broadcast, numel
from .elementwise import bcast_strides
from .lower import LowerContext
from .opset import infers, lowers

WIDE_OPS = {"add": BinaryOp.Add, "sub": BinaryOp.Sub, "mul": BinaryOp.Mul, "div": BinaryOp.Div, "max": BinaryOp.Max,
            "min": BinaryOp.Min, "pow": BinaryOp.Pow, "mod": BinaryOp.Mod, "bitand": BinaryOp.BitAnd,
            "bitor": BinaryOp.BitOr, "bitxor": BinaryOp.BitXor, "shl": BinaryOp.Shl, "shr": BinaryOp.Shr}
WIDE_DTYPES = (DType.I64, DType.F64)


class OnnxExtraOps:
    """Builders for the importer's extra ops (mixed into `Graph`)."""

    def wide_binary(self, op: str, a: Value, b: Value) -> Value:
        """`a op b` on i64 or f64 operands of one dtype, NumPy broadcasting."""
        if op not in WIDE_OPS:
            raise GraphError(f"wide_binary: unknown op {op!r} (choose one of {', '.join(WIDE_OPS)})")
        return self.add_node("wide_binary", (a, b), {"op": WIDE_OPS[op]})


@infers("wide_binary")
def _infer_wide_binary(ins: list[Node], attrs: dict) -> tuple:
    a, b = ins
    name = f"wide_binary {attrs['op'].name.lower()}"
    if a.dtype != b.dtype or a.dtype not in WIDE_DTYPES:
        raise GraphError(f"{name}: operands must both be i64 or both f64, got {a.dtype.value} and {b.dtype.value}")
    if a.dtype == DType.F64 and attrs["op"] in (BinaryOp.BitAnd, BinaryOp.BitOr, BinaryOp.BitXor, BinaryOp.Shl,
                                                 BinaryOp.Shr):
        raise GraphError(f"{name}: bit operations need i64 operands")
    return broadcast(a.shape, b.shape, name), a.dtype


@lowers("wide_binary")
def lower_wide_binary(ctx: LowerContext, node: Node) -> None:
    """One BinaryFull (i64, elem_bytes 8) or BinaryFullF64 with a broadcast stride walk."""
    ia, ib = node.inputs
    a, b = ctx.node(ia), ctx.node(ib)
    out = tuple(node.shape)
    same = a.shape == b.shape == out
    geometry = dict(len=numel(out), lhs_len=numel(a.shape), rhs_len=numel(b.shape), op=node.attrs["op"],
                    out_dims_bcast=() if same else out, bcast_lhs_strides=() if same else bcast_strides(a.shape, out),
                    bcast_rhs_strides=() if same else bcast_strides(b.shape, out))
    if node.dtype == DType.I64:
        ctx.emit(lambda at: T.BinaryFull(lhs=at(ia), rhs=at(ib), dst=at(node.id), elem_bytes=8, **geometry),
                 reads=[ia, ib], writes=[node.id])
    else:
        ctx.emit(lambda at: T.BinaryFullF64(lhs=at(ia), rhs=at(ib), dst=at(node.id), **geometry),
                 reads=[ia, ib], writes=[node.id])
