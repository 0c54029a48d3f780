"""NumPy references of the indexing thunks and GatherBackward (semantics.md §1, §3.5; docs/lowering-movement.md).

Index rules, written from the documentation rather than from the emitter:

* RLX row ids (Gather, GatherAxis, ScatterAdd): f32 → Rust `f as usize` (truncate; negative and
  NaN → 0; saturating), i64 → `max(v, 0)`; a row id ≥ the row count is skipped.
* ONNX indices (GatherNd, ScatterNd, GatherElements, ScatterElements): f32 → Rust `f as i64`
  (truncate, NaN → 0, saturating), a negative value gets `+ dim` once, then clamp to `[0, dim−1]`.

Scatters apply their updates one at a time in update order (duplicates accumulate; with no
reduction the last one wins), in f32.
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..ops import ScatterNdReduction
from . import reference, view
from .movement import elements

RED = ScatterNdReduction


def raw_indices(arena: np.ndarray, offset: int, count: int, is_i64: int) -> np.ndarray:
    """An index tensor as stored: int64 or float32."""
    return view(arena, offset, np.int64 if is_i64 else np.float32, count)


def row_ids(values: np.ndarray, rows: int) -> np.ndarray:
    """RLX row ids as int64, with -1 marking an id that is ≥ `rows` (skipped)."""
    if values.dtype == np.int64:
        v = np.maximum(values, 0)
        return np.where(v < rows, v, -1)
    f = np.nan_to_num(values.astype(np.float64), nan=0.0, posinf=np.inf, neginf=0.0)
    f = np.maximum(f, 0.0)
    ok = f < rows
    return np.where(ok, np.trunc(np.where(ok, f, 0.0)), -1).astype(np.int64)


def onnx_indices(values: np.ndarray, dim: int) -> np.ndarray:
    """ONNX indices into an axis of `dim > 0`: wrap a negative once, then clamp into `[0, dim)`."""
    if values.dtype == np.int64:
        v = values.astype(np.int64)
        with np.errstate(over="ignore"):
            v = np.where(v < 0, v + dim, v)      # v + dim cannot overflow where it is used
    else:
        f = np.trunc(np.nan_to_num(values.astype(np.float64), nan=0.0, posinf=np.inf, neginf=-np.inf))
        v = np.where(f < 0, f + dim, f)          # exact below 2^53; beyond, the clamp decides anyway
    return np.clip(v, 0, dim - 1).astype(np.int64)


@reference(T.Gather)
def gather(arena: np.ndarray, t) -> None:
    """`dst[i] = table[row(idx[i])]` for in-range rows; other rows untouched."""
    if not t.trailing or not t.num_idx:
        return
    rows = t.table_len // t.trailing
    table = elements(arena, t.table, t.table_bytes, rows * t.trailing).reshape(rows, t.trailing)
    out = elements(arena, t.dst, t.table_bytes, t.num_idx * t.trailing).reshape(t.num_idx, t.trailing)
    ids = row_ids(raw_indices(arena, t.idx, t.num_idx, t.idx_i64), rows)
    hit = ids >= 0
    out[hit] = table[ids[hit]]


@reference(T.GatherAxis)
def gather_axis(arena: np.ndarray, t) -> None:
    """`dst[o, k] = table[o, row(idx[k])]` for in-range rows; other rows untouched."""
    if not (t.outer and t.num_idx and t.trailing):
        return
    table = elements(arena, t.table, t.table_bytes, t.outer * t.axis_dim * t.trailing)
    table = table.reshape(t.outer, t.axis_dim, t.trailing)
    out = elements(arena, t.dst, t.table_bytes, t.outer * t.num_idx * t.trailing).reshape(t.outer, t.num_idx,
                                                                                          t.trailing)
    ids = row_ids(raw_indices(arena, t.idx, t.num_idx, t.idx_i64), t.axis_dim)
    hit = ids >= 0
    out[:, hit] = table[:, ids[hit]]


def nd_geometry(data_shape, indices_shape, batch_dims: int):
    """(batch, tuples per batch, k, indexed dims, their strides, slice length)."""
    data_shape, indices_shape = tuple(data_shape), tuple(indices_shape)
    k = indices_shape[-1]
    strides = [int(np.prod(data_shape[d + 1:], dtype=np.int64)) for d in range(len(data_shape))]
    return (int(np.prod(data_shape[:batch_dims], dtype=np.int64)),
            int(np.prod(indices_shape[batch_dims:-1], dtype=np.int64)), k,
            list(data_shape[batch_dims:batch_dims + k]), strides[batch_dims:batch_dims + k],
            int(np.prod(data_shape[batch_dims + k:], dtype=np.int64)))


def nd_offsets(idx: np.ndarray, tuples: int, k: int, dims, strides) -> np.ndarray:
    """Element offset (within a batch) of each index tuple."""
    tup = idx.reshape(tuples, k) if k else np.zeros((tuples, 0), idx.dtype)
    off = np.zeros(tuples, np.int64)
    for j in range(k):
        off += onnx_indices(tup[:, j], dims[j]) * strides[j]
    return off


@reference(T.GatherNd)
def gather_nd(arena: np.ndarray, t) -> None:
    """ONNX GatherND on f32 data (empty indexed axis → output untouched)."""
    batch, tuples, k, dims, strides, sl = nd_geometry(t.data_shape, t.indices_shape, t.batch_dims)
    if not batch * tuples * sl or 0 in dims:
        return
    data = view(arena, t.data, np.uint32, t.data_len).reshape(batch, -1)
    out = view(arena, t.dst, np.uint32, t.out_len).reshape(batch, tuples, sl)
    idx = raw_indices(arena, t.indices, t.indices_len, t.indices_i64).reshape(batch, -1)
    for bi in range(batch):
        for n, off in enumerate(nd_offsets(idx[bi], tuples, k, dims, strides)):
            out[bi, n] = data[bi, off:off + sl]


def element_targets(arena: np.ndarray, t, axis: int) -> np.ndarray:
    """Flat data index addressed by every index position (its coords with axis ← index)."""
    ishape = tuple(t.indices_shape)
    coords = np.indices(ishape, dtype=np.int64).reshape(len(ishape), -1)
    idx = raw_indices(arena, t.indices, t.indices_len, t.indices_i64)
    coords[axis] = onnx_indices(idx, t.data_shape[axis])
    return np.ravel_multi_index(tuple(coords), tuple(t.data_shape))


def normalized_axis(axis: int, rank: int) -> int:
    """ONNX axis → `[0, rank)`."""
    return axis + rank if axis < 0 else axis


@reference(T.GatherElements)
def gather_elements(arena: np.ndarray, t) -> None:
    """ONNX GatherElements, byte-generic (empty indexed axis → output untouched)."""
    axis = normalized_axis(t.axis, len(t.data_shape))
    if not t.indices_len or not t.data_shape[axis]:
        return
    data = elements(arena, t.data, t.data_elem_bytes, t.data_len)
    elements(arena, t.dst, t.data_elem_bytes, t.out_len)[...] = data[element_targets(arena, t, axis)]


def apply_updates(out: np.ndarray, targets: np.ndarray, updates: np.ndarray, reduction: RED) -> None:
    """`out[targets[i]] = reduction(out[targets[i]], updates[i])`, one update after another."""
    if reduction is RED.None_:
        for i, tgt in enumerate(targets):
            out[tgt] = updates[i]
        return
    ufunc = {RED.Add: np.add, RED.Mul: np.multiply, RED.Max: np.fmax, RED.Min: np.fmin}[reduction]
    ufunc.at(out, targets, updates)


@reference(T.ScatterAdd)
def scatter_add(arena: np.ndarray, t) -> None:
    """`dst = 0; dst[row(idx[i])] += upd[i]` in order; ids ≥ out_dim dropped."""
    out = view(arena, t.dst, np.float32, t.out_dim * t.trailing).reshape(t.out_dim, t.trailing)
    out[...] = 0
    if not t.num_updates or not t.trailing or not t.out_dim:
        return
    ids = row_ids(raw_indices(arena, t.indices, t.num_updates, 0), t.out_dim)
    upd = view(arena, t.updates, np.float32, t.num_updates * t.trailing).reshape(t.num_updates, t.trailing)
    hit = ids >= 0
    with np.errstate(all="ignore"):
        np.add.at(out, ids[hit], upd[hit])


def copy_data(arena: np.ndarray, t) -> np.ndarray:
    """`out = data` as f32; returns the output view."""
    out = view(arena, t.dst, np.float32, t.data_len)
    if t.data != t.dst:
        out[...] = view(arena, t.data, np.float32, t.data_len).copy()
    return out


@reference(T.ScatterNd)
def scatter_nd(arena: np.ndarray, t) -> None:
    """ONNX ScatterND on f32 with `reduction`, updates in order."""
    upd = view(arena, t.updates, np.float32, t.updates_len).copy()
    idx = raw_indices(arena, t.indices, t.indices_len, t.indices_i64).copy()
    out = copy_data(arena, t)
    _, tuples, k, dims, strides, sl = nd_geometry(t.data_shape, t.indices_shape, 0)
    if not tuples or not sl or 0 in dims:
        return
    offs = nd_offsets(idx, tuples, k, dims, strides)
    targets = (offs[:, None] + np.arange(sl)[None, :]).reshape(-1)
    with np.errstate(all="ignore"):
        apply_updates(out, targets, upd, t.reduction)


@reference(T.ScatterElements)
def scatter_elements(arena: np.ndarray, t) -> None:
    """ONNX ScatterElements on f32 with `reduction`, updates in order."""
    axis = normalized_axis(t.axis, len(t.data_shape))
    upd = view(arena, t.updates, np.float32, t.updates_len).copy()
    targets = element_targets(arena, t, axis) if t.indices_len and t.data_shape[axis] else None
    out = copy_data(arena, t)
    if targets is None:
        return
    with np.errstate(all="ignore"):
        apply_updates(out, targets, upd, t.reduction)


@reference(T.GatherBackward)
def gather_backward(arena: np.ndarray, t) -> None:
    """`dst = 0; dst[o, row(idx[k])] += dy[o, k]` in k order (f32 adds); ids ≥ axis_dim dropped (Gather skips them)."""
    dst = view(arena, t.dst, np.float32, t.outer * t.axis_dim * t.trailing).reshape(t.outer, t.axis_dim, t.trailing)
    dst[:] = 0.0
    if not (t.outer and t.num_idx and t.trailing and t.axis_dim):
        return
    dy = view(arena, t.dy, np.float32, t.outer * t.num_idx * t.trailing).reshape(t.outer, t.num_idx, t.trailing)
    ids = row_ids(view(arena, t.indices, np.float32, t.num_idx), t.axis_dim)
    with np.errstate(all="ignore"):
        for k in np.flatnonzero(ids >= 0):
            dst[:, ids[k]] += dy[:, k]
