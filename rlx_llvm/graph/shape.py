"""Shape ops: reshape (free), transpose, narrow, concat, gather, cast."""
from __future__ import annotations

from typing import Sequence

from .. import thunks as T
from ..dtypes import DType
from .core import DYNAMIC, GraphError, Node, Value, broadcast, numel, parse_dtype
from .elementwise import bcast_strides
from .lower import LowerContext
from .opset import infers, lowers


def axis_index(axis: int, rank: int, op: str) -> int:
    """`axis` (negative counts from the end) as an index into a rank-`rank` shape; GraphError naming `op`."""
    if not -rank <= axis < rank:
        raise GraphError(f"{op}: axis {axis} is out of range for rank {rank}")
    return axis % rank


class ShapeOps:
    """Builders for shape and data-movement ops (mixed into `Graph`)."""

    def reshape(self, x: Value, new_shape: Sequence[int]) -> Value:
        """The same elements in `new_shape` — one −1 is inferred, a 0 copies the input's dim there (ONNX's rule) —
        free: a view of the same bytes."""
        return self.add_node("reshape", (x,), {"shape": tuple(int(d) for d in new_shape)})

    def transpose(self, x: Value, perm: Sequence[int]) -> Value:
        """Axes permuted: output axis i is input axis perm[i]."""
        return self.add_node("transpose", (x,), {"perm": tuple(int(p) for p in perm)})

    def narrow(self, x: Value, axis: int, start: int, length: int) -> Value:
        """`x[..., start:start+length, ...]` along `axis`."""
        return self.add_node("narrow", (x,), {"axis": int(axis), "start": int(start), "length": int(length)})

    def concat(self, xs: Sequence[Value], axis: int) -> Value:
        """Concatenation along `axis`."""
        return self.add_node("concat", tuple(xs), {"axis": int(axis)})

    def gather(self, table: Value, idx: Value, axis: int = 0) -> Value:
        """`take(table, idx, axis)`: idx (i32/i64) replaces `axis` by its shape."""
        return self.add_node("gather", (table, idx), {"axis": int(axis)})

    def broadcast_to(self, x: Value, shape: Sequence[int]) -> Value:
        """`x` repeated to `shape` by NumPy broadcasting (materialized: one broadcasting Transpose)."""
        return self.add_node("broadcast_to", (x,), {"shape": tuple(int(d) for d in shape)})

    def cast(self, x: Value, dtype: "DType | str") -> Value:
        """Element-wise conversion (floats round to nearest even; ints truncate and saturate)."""
        return self.add_node("cast", (x,), {"dtype": parse_dtype(dtype, "cast")})


@infers("reshape")
def _infer_reshape(ins: list[Node], attrs: dict) -> tuple:
    x, shape = ins[0], list(attrs["shape"])
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise GraphError(f"reshape: new shape {shape} may hold one −1 and no other negative dim")
    if any(d == 0 and i >= len(x.shape) for i, d in enumerate(shape)):
        raise GraphError(f"reshape: a 0 in {shape} copies the input's dim, but {list(x.shape)} has no such axis")
    shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    if DYNAMIC in x.shape:
        return tuple(shape), x.dtype
    total = numel(x.shape)
    if -1 in shape:
        rest = numel([d for d in shape if d != -1])
        if rest == 0 or total % rest:
            raise GraphError(f"reshape: {list(x.shape)} ({total} elements) cannot become {shape}")
        shape[shape.index(-1)] = total // rest
    if numel(shape) != total:
        raise GraphError(f"reshape: {list(x.shape)} ({total} elements) cannot become {shape} ({numel(shape)})")
    return tuple(shape), x.dtype


@lowers("reshape")
def lower_reshape(ctx: LowerContext, node: Node) -> None:
    """A view: no thunk."""
    ctx.alias(node.id, node.inputs[0])


@infers("transpose")
def _infer_transpose(ins: list[Node], attrs: dict) -> tuple:
    x, perm = ins[0], attrs["perm"]
    if sorted(perm) != list(range(len(x.shape))):
        raise GraphError(f"transpose: perm {list(perm)} is not a permutation of the axes of {list(x.shape)}")
    return tuple(x.shape[p] for p in perm), x.dtype


def strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major element strides."""
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return tuple(reversed(out))


@lowers("transpose")
def lower_transpose(ctx: LowerContext, node: Node) -> None:
    """One Transpose thunk walking the input with permuted strides."""
    x = ctx.node(node.inputs[0])
    st = strides(x.shape)
    in_strides = tuple(st[p] for p in node.attrs["perm"])
    src = node.inputs[0]
    ctx.emit(lambda at: T.Transpose(src=at(src), dst=at(node.id), in_total=numel(x.shape), out_dims=node.shape,
                                    in_strides=in_strides, elem_bytes=x.dtype.itemsize),
             reads=[src], writes=[node.id])


@infers("narrow")
def _infer_narrow(ins: list[Node], attrs: dict) -> tuple:
    x = ins[0]
    axis = axis_index(attrs["axis"], len(x.shape), "narrow")
    start, length, dim = attrs["start"], attrs["length"], x.shape[axis]
    if start < 0 or length < 0 or (dim != DYNAMIC and start + length > dim):
        raise GraphError(f"narrow: [{start}, {start + length}) is outside axis {axis} of {list(x.shape)}")
    return tuple(length if i == axis else d for i, d in enumerate(x.shape)), x.dtype


@lowers("narrow")
def lower_narrow(ctx: LowerContext, node: Node) -> None:
    """A view when the slice is contiguous (outer 1), else a Narrow row copy."""
    x = ctx.node(node.inputs[0])
    axis = node.attrs["axis"] % len(x.shape)
    outer, inner = numel(x.shape[:axis]), numel(x.shape[axis + 1:])
    eb, start, length = x.dtype.itemsize, node.attrs["start"], node.attrs["length"]
    if outer == 1 or length == x.shape[axis]:
        ctx.alias(node.id, node.inputs[0], start * inner * eb)
        return
    src = ctx.view(node.inputs[0])
    ctx.emit(lambda at: T.Narrow(src=at(src) + start * inner * eb, dst=at(node.id), outer=outer,
                                 src_stride=x.shape[axis] * inner, dst_stride=length * inner,
                                 inner=length * inner, elem_bytes=eb), reads=[src], writes=[node.id])


@infers("concat")
def _infer_concat(ins: list[Node], attrs: dict) -> tuple:
    if not ins:
        raise GraphError("concat: needs at least one input")
    first = ins[0]
    axis = axis_index(attrs["axis"], len(first.shape), "concat")
    for n in ins[1:]:
        if len(n.shape) != len(first.shape) or n.dtype != first.dtype or any(
                i != axis and DYNAMIC not in (a, b) and a != b for i, (a, b) in enumerate(zip(n.shape, first.shape))):
            raise GraphError(f"concat: {list(n.shape)} {n.dtype.value} does not match {list(first.shape)} "
                             f"{first.dtype.value} outside axis {axis}")
    dims = [n.shape[axis] for n in ins]
    total = DYNAMIC if DYNAMIC in dims else sum(dims)
    return tuple(total if i == axis else d for i, d in enumerate(first.shape)), first.dtype


@lowers("concat")
def lower_concat(ctx: LowerContext, node: Node) -> None:
    """Concat (4-byte elements), ConcatF64 (8-byte), or one strided Narrow copy per input (1/2-byte)."""
    axis = node.attrs["axis"] % len(node.shape)
    outer, inner = numel(node.shape[:axis]), numel(node.shape[axis + 1:])
    kind = {4: T.Concat, 8: T.ConcatF64}.get(node.dtype.itemsize)
    parts = [(i, ctx.node(i).shape[axis], numel(ctx.node(i).shape)) for i in node.inputs]
    if kind is None:
        eb, total, start = node.dtype.itemsize, node.shape[axis], 0
        for i, ext, _ in parts:
            ctx.emit(lambda at, i=i, ext=ext, start=start: T.Narrow(
                src=at(i), dst=at(node.id) + start * inner * eb, outer=outer, src_stride=ext * inner,
                dst_stride=total * inner, inner=ext * inner, elem_bytes=eb), reads=[i], writes=[node.id])
            start += ext
        return
    ctx.emit(lambda at: kind(dst=at(node.id), outer=outer, inner=inner, total_axis=node.shape[axis],
                             inputs=tuple((at(i), ext, n) for i, ext, n in parts)),
             reads=list(node.inputs), writes=[node.id])


@infers("gather")
def _infer_gather(ins: list[Node], attrs: dict) -> tuple:
    table, idx = ins
    axis = axis_index(attrs["axis"], len(table.shape), "gather")
    if idx.dtype not in (DType.I32, DType.I64):
        raise GraphError(f"gather: indices must be i32 or i64, got {idx.dtype.value}")
    return (*table.shape[:axis], *idx.shape, *table.shape[axis + 1:]), table.dtype


@lowers("gather")
def lower_gather(ctx: LowerContext, node: Node) -> None:
    """Gather (axis 0) or GatherAxis, on i64 ids (i32 ids are widened first); ids ≥ the axis are RLX's
    "row skipped", negative ids read row 0."""
    it, ii = node.inputs
    table, idx = ctx.node(it), ctx.node(ii)
    axis = node.attrs["axis"] % len(table.shape)
    outer, trailing, num = numel(table.shape[:axis]), numel(table.shape[axis + 1:]), numel(idx.shape)
    tb = table.dtype.itemsize
    if idx.dtype == DType.I32:   # the thunks read i64 (or f32) ids
        wide = ctx.scratch(num * 8, "ids as i64")
        ctx.emit(lambda at, src=ii: T.CastI32ToI64(src=at(src), dst=at(wide), len=num), reads=[ii], writes=[wide])
        ii = wide
    i64 = 1
    if axis == 0:
        ctx.emit(lambda at: T.Gather(table=at(it), table_len=numel(table.shape), idx=at(ii), dst=at(node.id),
                                     num_idx=num, trailing=trailing, idx_i64=i64, table_bytes=tb),
                 reads=[it, ii], writes=[node.id])
    else:
        ctx.emit(lambda at: T.GatherAxis(table=at(it), idx=at(ii), dst=at(node.id), outer=outer,
                                         axis_dim=table.shape[axis], num_idx=num, trailing=trailing, idx_i64=i64,
                                         table_bytes=tb), reads=[it, ii], writes=[node.id])


@infers("cast")
def _infer_cast(ins: list[Node], attrs: dict) -> tuple:
    return ins[0].shape, attrs["dtype"]


@lowers("cast")
def lower_cast(ctx: LowerContext, node: Node) -> None:
    """A view when the dtype does not change, else CastGeneric."""
    src = ctx.node(node.inputs[0])
    if src.dtype == node.dtype:
        ctx.alias(node.id, node.inputs[0])
        return
    i = node.inputs[0]
    ctx.emit(lambda at: T.CastGeneric(src=at(i), dst=at(node.id), len=numel(node.shape), src_dtype=src.dtype,
                                      dst_dtype=node.dtype), reads=[i], writes=[node.id])


@infers("broadcast_to")
def _infer_broadcast_to(ins: list[Node], attrs: dict) -> tuple:
    x, shape = ins[0], attrs["shape"]
    if broadcast(x.shape, shape, "broadcast_to") != tuple(shape):
        raise GraphError(f"broadcast_to: {list(x.shape)} does not broadcast to {list(shape)}")
    return tuple(shape), x.dtype


@lowers("broadcast_to")
def lower_broadcast_to(ctx: LowerContext, node: Node) -> None:
    """A view when nothing repeats, else one Transpose walking `x` with zero strides on broadcast dims."""
    x = ctx.node(node.inputs[0])
    if numel(x.shape) == numel(node.shape):
        ctx.alias(node.id, node.inputs[0])
        return
    src = node.inputs[0]
    strides = bcast_strides(x.shape, node.shape)
    ctx.emit(lambda at: T.Transpose(src=at(src), dst=at(node.id), in_total=numel(x.shape), out_dims=node.shape,
                                    in_strides=strides, elem_bytes=x.dtype.itemsize), reads=[src], writes=[node.id])
