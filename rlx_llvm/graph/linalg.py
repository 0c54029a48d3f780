"""Matrix products: `matmul` (2-D, batched, broadcast batch) and `fused_matmul_bias_act`."""
from __future__ import annotations

from .. import thunks as T
from ..dtypes import DType
from .core import DYNAMIC, GraphError, Node, Value, numel
from .elementwise import ACTIVATIONS
from .lower import LowerContext
from .opset import infers, lowers


class LinalgOps:
    """Builders for matrix products (mixed into `Graph`)."""

    def matmul(self, a: Value, b: Value) -> Value:
        """`a @ b` over the last two axes; leading (batch) axes broadcast."""
        return self.add_node("matmul", (a, b))

    def fused_matmul_bias_act(self, x: Value, w: Value, b: Value, activation: "str | None" = None) -> Value:
        """`act(x @ w + b)` as one kernel; `w` is `[k, n]`, `b` is `[n]`."""
        act = None if activation is None else ACTIVATIONS[activation.lower()]
        return self.add_node("fused_matmul_bias_act", (x, w, b), {"act": act})


def _dim_eq(a: int, b: int) -> bool:
    return a == b or DYNAMIC in (a, b)


def _matmul_shape(a: Node, b: Node, op: str) -> tuple:
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise GraphError(f"{op}: operands need rank ≥ 2, got {list(a.shape)} and {list(b.shape)}")
    if not _dim_eq(a.shape[-1], b.shape[-2]):
        raise GraphError(f"{op}: inner dims differ: {list(a.shape)} @ {list(b.shape)} "
                         f"({a.shape[-1]} vs {b.shape[-2]})")
    ba, bb = a.shape[:-2], b.shape[:-2]
    if ba and bb and numel([d for d in ba if d != DYNAMIC]) > 1 and numel([d for d in bb if d != DYNAMIC]) > 1 \
            and len(ba) == len(bb) and not all(_dim_eq(x, y) for x, y in zip(ba, bb)):
        raise GraphError(f"{op}: batch dims {list(ba)} and {list(bb)} differ")
    batch = ba if len(ba) >= len(bb) else bb
    return (*batch, a.shape[-2], b.shape[-1])


@infers("matmul")
def _infer_matmul(ins: list[Node], attrs: dict) -> tuple:
    a, b = ins
    if a.dtype != DType.F32 or b.dtype != DType.F32:
        raise GraphError(f"matmul: lowered for f32 operands, got {a.dtype.value} @ {b.dtype.value}")
    return _matmul_shape(a, b, "matmul"), DType.F32


@infers("fused_matmul_bias_act")
def _infer_fused(ins: list[Node], attrs: dict) -> tuple:
    x, w, b = ins
    shape = _matmul_shape(x, w, "fused_matmul_bias_act")
    if len(w.shape) != 2 or len(b.shape) != 1 or not _dim_eq(b.shape[0], w.shape[1]):
        raise GraphError(f"fused_matmul_bias_act: w must be [k, n] and b [n], got {list(w.shape)} and {list(b.shape)}")
    return shape, DType.F32


def _batch(shape: tuple) -> int:
    return numel(shape[:-2])


@lowers("matmul")
def lower_matmul(ctx: LowerContext, node: Node) -> None:
    """Sgemm when `b` is one matrix (a's batch folds into m), else BatchedSgemm with broadcast flags."""
    a, b = (ctx.node(i) for i in node.inputs)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    ba, bb, bc = _batch(a.shape), _batch(b.shape), _batch(node.shape)
    ia, ib = node.inputs
    if bb == 1:
        ctx.emit(lambda at: T.Sgemm(a=at(ia), b=at(ib), c=at(node.id), m=m * ba, k=k, n=n),
                 reads=[ia, ib], writes=[node.id])
        return
    if ba not in (1, bc) or bb not in (1, bc):
        raise GraphError(f"%{node.id} matmul: batch dims of {list(a.shape)} and {list(b.shape)} only partly "
                         f"broadcast; expand one side first")
    ctx.emit(lambda at: T.BatchedSgemm(a=at(ia), b=at(ib), c=at(node.id), batch=bc, m=m, k=k, n=n,
                                       a_bcast=ba == 1 and bc > 1, b_bcast=bb == 1 and bc > 1),
             reads=[ia, ib], writes=[node.id])


@lowers("fused_matmul_bias_act")
def lower_fused_matmul(ctx: LowerContext, node: Node) -> None:
    """FusedMmBiasAct over the rows of x."""
    ix, iw, ib = node.inputs
    x, w = ctx.node(ix), ctx.node(iw)
    m, k, n = numel(x.shape[:-1]), x.shape[-1], w.shape[-1]
    act = node.attrs["act"]
    ctx.emit(lambda at: T.FusedMmBiasAct(a=at(ix), w=at(iw), bias=at(ib), c=at(node.id), m=m, k=k, n=n, act=act),
             reads=[ix, iw, ib], writes=[node.id])


@infers("matmul_t")
def _infer_matmul_t(ins: list[Node], attrs: dict) -> tuple:
    a, b = ins
    ka, m = (a.shape[-2], a.shape[-1]) if attrs["ta"] else (a.shape[-1], a.shape[-2])
    n, kb = (b.shape[0], b.shape[1]) if attrs["tb"] else (b.shape[1], b.shape[0])
    return (*a.shape[:-2], m, n), DType.F32


@lowers("matmul_t")
def lower_matmul_t(ctx: LowerContext, node: Node) -> None:
    """SgemmT: `a` stored `[k, m]` when `ta`, `b` stored `[n, k]` when `tb` (made by the matmul_t pass)."""
    ia, ib = node.inputs
    a = ctx.node(ia)
    k = a.shape[-2] if node.attrs["ta"] else a.shape[-1]
    m, n = numel(node.shape[:-1]), node.shape[-1]
    ctx.emit(lambda at: T.SgemmT(a=at(ia), b=at(ib), c=at(node.id), m=m, k=k, n=n, ta=node.attrs["ta"],
                                 tb=node.attrs["tb"]), reads=[ia, ib], writes=[node.id])
