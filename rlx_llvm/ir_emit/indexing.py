"""Indexing: Gather, GatherAxis, GatherNd, GatherElements, ScatterAdd, ScatterNd, ScatterElements, GatherBackward
(semantics.md §1 "ids as f32", §3.5; docs/lowering-movement.md).

Indices are data, so the generated code bounds-checks every one before it forms an address:

* `Gather`, `GatherAxis`, `ScatterAdd` follow RLX: an f32 id is `f as usize` (truncate, negative
  and NaN → 0, saturating: `llvm.fptoui.sat`), an i64 id is `max(v, 0)`; a row at or past the
  table's end is skipped (Gather/GatherAxis leave that output row untouched, ScatterAdd drops
  the update).
* `GatherNd`, `ScatterNd`, `GatherElements`, `ScatterElements` follow ONNX: a negative index
  counts from the end (wrapped once, `v + dim`); whatever is still outside `[0, dim)` is clamped
  to it.  f32 indices convert with `llvm.fptosi.sat` (truncate, NaN → 0, ±inf saturate).

Every address is therefore inside the thunk's declared slots whatever the index bytes hold.
`GatherBackward` zeroes `dst`, then adds each `dy` slice ScatterAdd-style per in-range id (Gather's id rule).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..ops import ScatterNdReduction
from .context import STREAM_BYTES, EmitContext
from .toolkit import F32, I64, Index, as_value, iadd, imul, linear, zero_bytes
from .movement import (ELEM_BYTES, aligned_to_line, clamped_ahead, copy_run, load_elem, loop_nest, prod, row_major,
                       rows_ahead, store_elem)
from ..registry import lowering

RED = ScatterNdReduction


# ── index decoding ──────────────────────────────────────────────────────────

def load_raw_index(ctx: EmitContext, offset: int, i: Index, is_i64: bool) -> ir.Value:
    """Element `i` of an index tensor: an i64, or an f32 id."""
    return ctx.load(offset, I64 if is_i64 else F32, i)


def row_id(ctx: EmitContext, offset: int, i: Index, is_i64: bool) -> ir.Value:
    """RLX's row id as an unsigned i64: `f as usize` for f32, `max(v, 0)` for i64."""
    raw = load_raw_index(ctx, offset, i, is_i64)
    if is_i64:
        return ctx.b.call(ctx.intrinsic("llvm.smax.i64", I64, [I64, I64]), [raw, I64(0)])
    return ctx.b.call(ctx.intrinsic("llvm.fptoui.sat.i64.f32", I64, [F32]), [raw])


def onnx_index(ctx: EmitContext, offset: int, i: Index, is_i64: bool, dim: int) -> ir.Value:
    """An ONNX index into an axis of `dim > 0`: negative wraps once, then clamp to `[0, dim)`."""
    b = ctx.b
    raw = load_raw_index(ctx, offset, i, is_i64)
    v = raw if is_i64 else b.call(ctx.intrinsic("llvm.fptosi.sat.i64.f32", I64, [F32]), [raw])
    v = b.select(b.icmp_signed("<", v, I64(0)), b.add(v, I64(dim)), v)
    v = b.call(ctx.intrinsic("llvm.smax.i64", I64, [I64, I64]), [v, I64(0)])
    return b.call(ctx.intrinsic("llvm.smin.i64", I64, [I64, I64]), [v, I64(dim - 1)])


def check_width(value: int, allowed: Sequence[int], field: str) -> None:
    """An element-width field holds one of the widths the kernel moves."""
    if value not in allowed:
        raise ValidationError(f"{field} = {value}; expected one of {tuple(allowed)}", field=field)


def check_shape_len(shape: Sequence[int], length: int, field: str, shape_field: str) -> None:
    """`length` is the element count of `shape`."""
    if prod(shape) != length:
        raise ValidationError(f"{field} = {length} but {shape_field} {tuple(shape)} holds {prod(shape)} elements",
                              field=field)


def normalized_axis(axis: int, rank: int) -> int:
    """ONNX axis in `[-rank, rank)` → `[0, rank)` (ValidationError otherwise)."""
    if not -rank <= axis < rank:
        raise ValidationError(f"axis = {axis} is outside [-{rank}, {rank})", field="axis")
    return axis + rank if axis < 0 else axis


# ── Gather, GatherAxis ──────────────────────────────────────────────────────

def check_gather(t) -> None:
    """Table elements of 1/2/4/8/16 bytes (RLX uses 4 = f32 and 8 = i64; rows are byte copies)."""
    check_width(t.table_bytes, ELEM_BYTES, "table_bytes")


@lowering(T.Gather, check=check_gather)
def gather(ctx: EmitContext, t) -> None:
    """`dst[i, :] = table[idx[i], :]` for every in-range row id; other output rows stay untouched."""
    if t.trailing == 0 or t.num_idx == 0:
        return
    rows = t.table_len // t.trailing
    if rows == 0:
        return
    row = t.trailing * t.table_bytes
    streaming = t.num_idx * row >= STREAM_BYTES and aligned_to_line(t.dst, row)
    b = ctx.b
    with ctx.for_range(0, t.num_idx, name="idx") as i:
        r = row_id(ctx, t.idx, i, bool(t.idx_i64))
        ahead = None
        if streaming:  # random rows: prefetch the row of a later id
            r_next = row_id(ctx, t.idx, clamped_ahead(b, i, rows_ahead(row), t.num_idx), bool(t.idx_i64))
            ahead = (t.table, b.mul(b.select(b.icmp_unsigned("<", r_next, I64(rows)), r_next, I64(0)), I64(row)))
        with guarded(ctx, b.icmp_unsigned("<", r, I64(rows))):
            copy_run(ctx, t.dst, imul(b, i, row), t.table, imul(b, r, row), row, streaming, ahead)


def check_gather_axis(t) -> None:
    """Table elements of 1/2/4/8/16 bytes (rows are byte copies)."""
    check_width(t.table_bytes, ELEM_BYTES, "table_bytes")


@lowering(T.GatherAxis, check=check_gather_axis)
def gather_axis(ctx: EmitContext, t) -> None:
    """`dst[o, k, :] = table[o, idx[k], :]` for in-range ids; other output rows stay untouched."""
    if not t.outer or not t.num_idx or not t.trailing or not t.axis_dim:
        return
    row = t.trailing * t.table_bytes
    streaming = t.outer * t.num_idx * row >= STREAM_BYTES and aligned_to_line(t.dst, row)
    b = ctx.b
    with ctx.for_range(0, t.num_idx, name="k") as k:
        r = row_id(ctx, t.idx, k, bool(t.idx_i64))
        with guarded(ctx, b.icmp_unsigned("<", r, I64(t.axis_dim))):
            with ctx.for_range(0, t.outer, name="o") as o:
                out_row = iadd(b, imul(b, o, t.num_idx), k)
                in_row = iadd(b, imul(b, o, t.axis_dim), r)
                copy_run(ctx, t.dst, imul(b, out_row, row), t.table, imul(b, in_row, row), row, streaming)


@contextlib.contextmanager
def guarded(ctx: EmitContext, cond: ir.Value) -> Iterator[None]:
    """`with guarded(ctx, cond):` — the body runs only when `cond` (an i1) holds."""
    then = ctx.fn.append_basic_block("in_range")
    done = ctx.fn.append_basic_block("next")
    ctx.b.cbranch(cond, then, done)
    ctx.b.position_at_end(then)
    yield
    if not ctx.b.block.is_terminated:
        ctx.b.branch(done)
    ctx.b.position_at_end(done)


# ── GatherNd ────────────────────────────────────────────────────────────────

def nd_plan(data_shape: Sequence[int], indices_shape: Sequence[int], batch_dims: int
            ) -> tuple[int, int, int, list[int], list[int], int]:
    """GatherND/ScatterND geometry: (batch, tuples per batch, k, indexed dims, their strides, slice)."""
    r, q = len(data_shape), len(indices_shape)
    if q < 1:
        raise ValidationError("indices must have rank ≥ 1", field="indices_shape")
    if not 0 <= batch_dims < min(q, r):
        raise ValidationError(f"batch_dims = {batch_dims} is outside [0, min(q, r) = {min(q, r)})",
                              field="batch_dims")
    k = indices_shape[-1]
    if batch_dims + k > r:
        raise ValidationError(f"indices_shape[-1] = {k} indexes beyond rank {r} (batch_dims {batch_dims})",
                              field="indices_shape")
    if tuple(indices_shape[:batch_dims]) != tuple(data_shape[:batch_dims]):
        raise ValidationError(f"batch dims {tuple(indices_shape[:batch_dims])} differ from data's "
                              f"{tuple(data_shape[:batch_dims])}", field="indices_shape")
    strides = row_major(data_shape)
    dims = list(data_shape[batch_dims:batch_dims + k])
    return (prod(data_shape[:batch_dims]), prod(indices_shape[batch_dims:-1]), k, dims,
            strides[batch_dims:batch_dims + k], prod(data_shape[batch_dims + k:]))


def check_gather_nd(t) -> None:
    """ONNX GatherND shapes; the length fields match them."""
    batch, tuples, k, _, _, slice_len = nd_plan(t.data_shape, t.indices_shape, t.batch_dims)
    check_shape_len(t.data_shape, t.data_len, "data_len", "data_shape")
    check_shape_len(t.indices_shape, t.indices_len, "indices_len", "indices_shape")
    if t.out_len != batch * tuples * slice_len:
        raise ValidationError(f"out_len = {t.out_len}, but the shapes give {batch * tuples * slice_len}",
                              field="out_len")


def nd_offset(ctx: EmitContext, indices: int, first: Index, is_i64: bool, dims: Sequence[int],
              strides: Sequence[int]) -> Index:
    """`Σ_j onnx_index(indices[first + j], dims[j]) · strides[j]` (elements)."""
    b = ctx.b
    off: Index = 0
    for j, (d, s) in enumerate(zip(dims, strides)):
        off = iadd(b, off, imul(b, onnx_index(ctx, indices, iadd(b, first, j), is_i64, d), s))
    return off


@lowering(T.GatherNd, check=check_gather_nd)
def gather_nd(ctx: EmitContext, t) -> None:
    """ONNX GatherND over f32 data: each index tuple copies one contiguous slice."""
    batch, tuples, k, dims, strides, slice_len = nd_plan(t.data_shape, t.indices_shape, t.batch_dims)
    if not batch * tuples * slice_len or 0 in dims:
        return  # nothing to write, or an empty indexed axis: no index is in bounds
    b = ctx.b
    batch_stride = prod(t.data_shape[t.batch_dims:])

    def body(coords: list[ir.Value]) -> None:
        bi, ti = coords
        n = iadd(b, imul(b, bi, tuples), ti)
        off = iadd(b, imul(b, bi, batch_stride), nd_offset(ctx, t.indices, imul(b, n, k), bool(t.indices_i64),
                                                         dims, strides))
        copy_run(ctx, t.dst, imul(b, n, slice_len * 4), t.data, imul(b, off, 4), slice_len * 4)

    loop_nest(ctx, [batch, tuples], body, name="nd")


# ── GatherElements ──────────────────────────────────────────────────────────

def elements_plan(t) -> int:
    """Shared GatherElements/ScatterElements checks; returns the normalized axis."""
    r = len(t.data_shape)
    if r < 1 or len(t.indices_shape) != r:
        raise ValidationError(f"data rank {r} and indices rank {len(t.indices_shape)} must be equal and ≥ 1",
                              field="indices_shape")
    axis = normalized_axis(t.axis, r)
    for d, (i_dim, d_dim) in enumerate(zip(t.indices_shape, t.data_shape)):
        if d != axis and i_dim > d_dim:
            raise ValidationError(f"indices_shape[{d}] = {i_dim} exceeds data_shape[{d}] = {d_dim}",
                                  field="indices_shape")
    check_shape_len(t.data_shape, t.data_len, "data_len", "data_shape")
    check_shape_len(t.indices_shape, t.indices_len, "indices_len", "indices_shape")
    return axis


def check_gather_elements(t) -> None:
    """Equal ranks, indices no larger than data off the axis, lengths match the shapes."""
    elements_plan(t)
    check_width(t.data_elem_bytes, ELEM_BYTES, "data_elem_bytes")
    if t.out_len != t.indices_len:
        raise ValidationError(f"out_len = {t.out_len} differs from indices_len = {t.indices_len}", field="out_len")


def element_source(ctx: EmitContext, t, axis: int, coords: list[ir.Value], p: Index) -> Index:
    """Data element addressed by index position `coords` (flat `p`): coords with axis ← index."""
    b = ctx.b
    strides = row_major(t.data_shape)
    a = onnx_index(ctx, t.indices, p, bool(t.indices_i64), t.data_shape[axis])
    rest = linear(b, [c for d, c in enumerate(coords) if d != axis], [s for d, s in enumerate(strides) if d != axis])
    return iadd(b, rest, imul(b, a, strides[axis]))


@lowering(T.GatherElements, check=check_gather_elements)
def gather_elements(ctx: EmitContext, t) -> None:
    """`out[i…] = data[i… with i_axis ← idx[i…]]` (ONNX take_along_axis), byte-generic."""
    axis = elements_plan(t)
    if not t.indices_len or not t.data_shape[axis]:
        return
    b = ctx.b
    eb = t.data_elem_bytes
    idx_strides = row_major(t.indices_shape)

    def body(coords: list[ir.Value]) -> None:
        p = linear(b, coords, idx_strides)
        store_elem(ctx, t.dst, load_elem(ctx, t.data, element_source(ctx, t, axis, coords, p), eb), p)

    loop_nest(ctx, list(t.indices_shape), body, name="ge")


# ── scatters: one reduction rule ────────────────────────────────────────────

def combine(ctx: EmitContext, reduction: ScatterNdReduction, old: ir.Value, new: ir.Value) -> ir.Value:
    """`reduction(old, new)` on f32 lanes: overwrite, +, ×, or NaN-ignoring max/min (Rust f32::max)."""
    b = ctx.b
    if reduction is RED.None_:
        return new
    if reduction is RED.Add:
        return b.fadd(old, new)
    if reduction is RED.Mul:
        return b.fmul(old, new)
    name = "maxnum" if reduction is RED.Max else "minnum"
    ty = old.type
    suffix = f"v{ty.count}f32" if isinstance(ty, ir.VectorType) else "f32"
    return b.call(ctx.intrinsic(f"llvm.{name}.{suffix}", ty, [ty, ty]), [old, new])


def scatter_slice(ctx: EmitContext, dst: int, dst_elem: Index, updates: int, upd_elem: Index, n: int,
                  reduction: ScatterNdReduction) -> None:
    """`dst[dst_elem + e] = reduction(dst[dst_elem + e], updates[upd_elem + e])` for e < n (vectorized)."""
    b = ctx.b
    if reduction is RED.None_:
        copy_run(ctx, dst, imul(b, dst_elem, 4), updates, imul(b, upd_elem, 4), n * 4)
        return

    def body(e: ir.Value, w: int) -> None:
        at = iadd(b, dst_elem, e)
        new = ctx.load(updates, F32, iadd(b, upd_elem, e), w)
        ctx.store(dst, combine(ctx, reduction, ctx.load(dst, F32, at, w), new), at)

    ctx.vector_loop(n, body, name="upd")


def copy_data(ctx: EmitContext, t) -> None:
    """`out = data` (nothing when the scatter runs in place)."""
    if t.data != t.dst:
        copy_run(ctx, t.dst, 0, t.data, 0, t.data_len * 4)


def check_in_place_operands(t) -> None:
    """Only `data` may alias `dst` (an in-place scatter); indices/updates never may."""
    for field in ("indices", "updates"):
        if getattr(t, field) == t.dst:
            raise ValidationError(f"{field} aliases dst; only data may", field=field)


# ── ScatterAdd ──────────────────────────────────────────────────────────────

@lowering(T.ScatterAdd)
def scatter_add(ctx: EmitContext, t) -> None:
    """`dst = 0; dst[idx[i], :] += updates[i, :]` in update order; ids ≥ `out_dim` are dropped."""
    zero_bytes(ctx, ctx.addr(t.dst), t.out_dim * t.trailing * 4)
    if not t.num_updates or not t.trailing or not t.out_dim:
        return
    b = ctx.b
    with ctx.for_range(0, t.num_updates, name="u") as i:
        r = row_id(ctx, t.indices, i, False)
        with guarded(ctx, b.icmp_unsigned("<", r, I64(t.out_dim))):
            scatter_slice(ctx, t.dst, imul(b, r, t.trailing), t.updates, imul(b, i, t.trailing), t.trailing, RED.Add)


# ── ScatterNd ───────────────────────────────────────────────────────────────

def check_scatter_nd(t) -> None:
    """ONNX ScatterND shapes; updates = indices_shape[:-1] + data_shape[k:]; only data may alias dst."""
    _, tuples, _, _, _, slice_len = nd_plan(t.data_shape, t.indices_shape, 0)
    check_shape_len(t.data_shape, t.data_len, "data_len", "data_shape")
    check_shape_len(t.indices_shape, t.indices_len, "indices_len", "indices_shape")
    if t.updates_len != tuples * slice_len:
        raise ValidationError(f"updates_len = {t.updates_len}, but the shapes give {tuples * slice_len}",
                              field="updates_len")
    check_in_place_operands(t)


@lowering(T.ScatterNd, check=check_scatter_nd, inplace=True)
def scatter_nd(ctx: EmitContext, t) -> None:
    """ONNX ScatterND (f32): `out = data`, then each tuple's slice combined with its update, in order."""
    copy_data(ctx, t)
    _, tuples, k, dims, strides, slice_len = nd_plan(t.data_shape, t.indices_shape, 0)
    if not tuples or not slice_len or 0 in dims:
        return
    b = ctx.b
    with ctx.for_range(0, tuples, name="tuple") as n:
        off = nd_offset(ctx, t.indices, imul(b, n, k), bool(t.indices_i64), dims, strides)
        scatter_slice(ctx, t.dst, off, t.updates, imul(b, n, slice_len), slice_len, t.reduction)


# ── ScatterElements ─────────────────────────────────────────────────────────

def check_scatter_elements(t) -> None:
    """As GatherElements; updates has the indices' shape; only data may alias dst."""
    elements_plan(t)
    if t.updates_len != t.indices_len:
        raise ValidationError(f"updates_len = {t.updates_len} differs from indices_len = {t.indices_len}",
                              field="updates_len")
    check_in_place_operands(t)


@lowering(T.ScatterElements, check=check_scatter_elements, inplace=True)
def scatter_elements(ctx: EmitContext, t) -> None:
    """ONNX ScatterElements (f32): `out = data`, then `out[i… with i_axis ← idx[i…]] ⊕= upd[i…]` in order."""
    copy_data(ctx, t)
    axis = elements_plan(t)
    if not t.indices_len or not t.data_shape[axis]:
        return
    b = ctx.b
    idx_strides = row_major(t.indices_shape)

    def body(coords: list[ir.Value]) -> None:
        p = linear(b, coords, idx_strides)
        target = as_value(element_source(ctx, t, axis, coords, p))
        new = ctx.load(t.updates, F32, p)
        ctx.store(t.dst, combine(ctx, t.reduction, ctx.load(t.dst, F32, target), new), target)

    loop_nest(ctx, list(t.indices_shape), body, name="se")


# ── GatherBackward ──────────────────────────────────────────────────────────

@lowering(T.GatherBackward)
def gather_backward(ctx: EmitContext, t) -> None:
    """`dst = 0; dst[o, row(idx[k]), :] += dy[o, k, :]` in k order; ids Gather skips (≥ axis_dim) are dropped."""
    zero_bytes(ctx, ctx.addr(t.dst), 4 * t.outer * t.axis_dim * t.trailing)
    if not (t.outer and t.num_idx and t.trailing and t.axis_dim):
        return
    b = ctx.b
    with ctx.for_range(0, t.num_idx, name="k") as k:
        r = row_id(ctx, t.indices, k, False)
        with guarded(ctx, b.icmp_unsigned("<", r, I64(t.axis_dim))):
            with ctx.for_range(0, t.outer, name="o") as o:
                to = imul(b, iadd(b, imul(b, o, t.axis_dim), r), t.trailing)
                frm = imul(b, iadd(b, imul(b, o, t.num_idx), k), t.trailing)
                scatter_slice(ctx, t.dst, to, t.dy, frm, t.trailing, ScatterNdReduction.Add)
