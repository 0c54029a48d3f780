"""Reductions over axes (sum mean max min prod), softmax and cumsum along one axis."""
from __future__ import annotations

from typing import Sequence

from .. import thunks as T
from ..dtypes import DType
from ..ops import ReduceOp
from .core import GraphError, Node, Value, numel
from .elementwise import copy_into
from .lower import LowerContext
from .opset import infers, lowers

REDUCE_OPS = {"sum": ReduceOp.Sum, "mean": ReduceOp.Mean, "max": ReduceOp.Max, "min": ReduceOp.Min,
              "prod": ReduceOp.Prod}


def _axes(axes: "int | Sequence[int] | None", rank: int, op: str) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(rank))
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    for a in axes:
        if not -rank <= a < rank:
            raise GraphError(f"{op}: axis {a} is out of range for rank {rank}")
    out = tuple(sorted({a % rank for a in axes}))
    return out


class ReductionOps:
    """Builders for reductions, softmax and cumsum (mixed into `Graph`)."""

    def reduce(self, x: Value, op: str, axes: "int | Sequence[int] | None" = None, keep_dim: bool = False) -> Value:
        """Reduce `axes` (all when None) with sum, mean, max, min or prod."""
        if op not in REDUCE_OPS:
            raise GraphError(f"reduce: unknown op {op!r} (choose one of {', '.join(REDUCE_OPS)})")
        return self.add_node("reduce", (x,), {"op": REDUCE_OPS[op], "axes": _axes(axes, x.ndim, f"reduce {op}"),
                                              "keep_dim": bool(keep_dim)})

    def sum(self, x: Value, axes: "int | Sequence[int] | None" = None, keep_dim: bool = False) -> Value:
        """Sum over `axes`."""
        return self.reduce(x, "sum", axes, keep_dim)

    def mean(self, x: Value, axes: "int | Sequence[int] | None" = None, keep_dim: bool = False) -> Value:
        """Mean over `axes`."""
        return self.reduce(x, "mean", axes, keep_dim)

    def softmax(self, x: Value, axis: int = -1) -> Value:
        """Softmax along `axis`."""
        return self.add_node("softmax", (x,), {"axis": _axes(axis, x.ndim, "softmax")[0]})

    def cumsum(self, x: Value, axis: int = -1, exclusive: bool = False) -> Value:
        """Running sum along the last axis (`axis` must be the last)."""
        ax = _axes(axis, x.ndim, "cumsum")[0]
        if ax != x.ndim - 1:
            raise GraphError(f"cumsum: lowered along the last axis only, got axis {axis} of rank {x.ndim}")
        return self.add_node("cumsum", (x,), {"exclusive": bool(exclusive)})


def _f32(x: Node, op: str) -> None:
    if x.dtype != DType.F32:
        raise GraphError(f"{op}: lowered for f32, got {x.dtype.value}")


@infers("reduce")
def _infer_reduce(ins: list[Node], attrs: dict) -> tuple:
    x = ins[0]
    _f32(x, f"reduce {attrs['op'].name.lower()}")
    axes = attrs["axes"]
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if attrs["keep_dim"] else \
        tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return shape, x.dtype


def _runs(axes: tuple[int, ...]) -> list[tuple[int, int]]:
    """Contiguous runs `[lo, hi)` of sorted axes."""
    runs: list[list[int]] = []
    for a in axes:
        if runs and runs[-1][1] == a:
            runs[-1][1] = a + 1
        else:
            runs.append([a, a + 1])
    return [tuple(r) for r in runs]


@lowers("reduce")
def lower_reduce(ctx: LowerContext, node: Node) -> None:
    """One Reduce per contiguous run of axes (innermost run first), through scratch between them."""
    x = ctx.node(node.inputs[0])
    shape, src = list(x.shape), node.inputs[0]
    runs = _runs(node.attrs["axes"])
    if not runs:
        copy_into(ctx, src, node.id, numel(shape) * 4)
        return
    for k, (lo, hi) in enumerate(reversed(runs)):
        outer, reduced, inner = numel(shape[:lo]), numel(shape[lo:hi]), numel(shape[hi:])
        last = k == len(runs) - 1
        dst = node.id if last else ctx.scratch(outer * inner * 4, "partial reduction")
        ctx.emit(lambda at, s=src, d=dst, o=outer, r=reduced, i=inner: T.Reduce(
            src=at(s), dst=at(d), outer=o, reduced=r, inner=i, op=node.attrs["op"]), reads=[src], writes=[dst])
        shape[lo:hi] = [1] * (hi - lo)
        src = dst


@infers("softmax", "cumsum")
def _infer_same(ins: list[Node], attrs: dict) -> tuple:
    _f32(ins[0], "softmax/cumsum")
    return ins[0].shape, ins[0].dtype


@lowers("softmax")
def lower_softmax(ctx: LowerContext, node: Node) -> None:
    """The in-place Softmax over `[rows, cols, inner]`, on the input's bytes when they die here, else on a copy."""
    x = ctx.node(node.inputs[0])
    axis = node.attrs["axis"]
    cols, inner = x.shape[axis], numel(x.shape[axis + 1:])
    rows = numel(x.shape[:axis]) * inner          # Softmax counts rows as outer·inner
    if not ctx.reuse_input(node, node.inputs[0]):
        copy_into(ctx, node.inputs[0], node.id, numel(x.shape) * 4)
    ctx.emit(lambda at: T.Softmax(data=at(node.id), rows=rows, cols=cols, inner=inner),
             reads=[node.id], writes=[node.id])


@lowers("cumsum")
def lower_cumsum(ctx: LowerContext, node: Node) -> None:
    """Cumsum over `[rows, cols]`."""
    cols = node.shape[-1] if node.shape else 1
    rows = numel(node.shape) // max(cols, 1) if cols else 0
    i = node.inputs[0]
    ctx.emit(lambda at: T.Cumsum(src=at(i), dst=at(node.id), rows=rows, cols=cols, exclusive=node.attrs["exclusive"],
                                 dtype=DType.F32), reads=[i], writes=[node.id])
