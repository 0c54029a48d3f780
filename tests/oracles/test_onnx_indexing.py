"""GatherAxis, GatherElements, GatherNd, ScatterElements, ScatterNd against the ONNX ops of the same names.

Every case passes ONNX int64 indices; the thunk reads the same indices stored as int64 or as f32
(RLX's two index encodings), written to the arena as an extra operand.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from rlx_llvm import thunks as T
from rlx_llvm.ops import ScatterNdReduction as Red
from tests.oracles.onnx_check import OnnxCase, floats, onnx_run, oracle_test, rng

ONNX_REDUCTION = {Red.None_: "none", Red.Add: "add", Red.Mul: "mul", Red.Max: "max", Red.Min: "min"}


def indices(values, as_f32: bool) -> tuple[np.ndarray, np.ndarray]:
    """(ONNX int64 indices, the same indices as the thunk stores them)."""
    idx = np.asarray(values, dtype=np.int64)
    return idx, idx.astype(np.float32) if as_f32 else idx


def encoding(as_f32: bool) -> str:
    """How the thunk stores its indices, for case ids."""
    return "f32idx" if as_f32 else "i64idx"


def name(kind: str, *parts: object) -> str:
    """A case id from the kind and its parameters."""
    return "-".join([kind, *("x".join(map(str, p)) if isinstance(p, tuple) else str(p) for p in parts)])


def gather_axis_case(outer: int, axis_dim: int, trailing: int, ids: Sequence[int], as_f32: bool = False) -> OnnxCase:
    """GatherAxis over `[outer, axis_dim, trailing]` ↔ ONNX Gather(axis=1).

    RLX row ids are never negative (a negative id clamps to row 0; ONNX counts from the end), so
    a case with negative ids is compared with ONNX Gather on `max(ids, 0)`.
    """
    table = floats((outer, axis_dim, trailing), 10, outer, axis_dim, trailing)
    idx, stored = indices(ids, as_f32)

    def build(table_off: int, _onnx_idx: int, idx_off: int, dst: int) -> T.Thunk:
        return T.GatherAxis(table=table_off, idx=idx_off, dst=dst, outer=outer, axis_dim=axis_dim, num_idx=idx.size,
                            trailing=trailing, idx_i64=int(not as_f32), table_bytes=4)

    def clamped() -> np.ndarray:
        return onnx_run("Gather", [table, np.maximum(idx, 0)], dict(axis=1))[0]

    return OnnxCase(name("GatherAxis", (outer, axis_dim, trailing), tuple(ids), encoding(as_f32)), "Gather",
                    (table, idx), build, (outer, idx.size, trailing), attrs=dict(axis=1), extra=(stored,),
                    expect=clamped if (idx < 0).any() else None)


def gather_elements_case(shape: tuple[int, ...], index_shape: tuple[int, ...], axis: int,
                         dtype: type = np.float32, as_f32: bool = False) -> OnnxCase:
    """GatherElements (byte-generic data) ↔ ONNX GatherElements; indices include negatives.

    onnx.reference's GatherElements mis-slices shapes for a negative axis, so ONNX is given the
    same axis counted from the front (the thunk keeps the negative one).
    """
    data = floats(shape, 11, *shape).astype(dtype)
    dim = shape[axis]
    idx, stored = indices(rng(12, *index_shape).integers(-dim, dim, index_shape), as_f32)

    def build(data_off: int, _onnx_idx: int, idx_off: int, dst: int) -> T.Thunk:
        return T.GatherElements(data=data_off, indices=idx_off, dst=dst, data_shape=shape, indices_shape=index_shape,
                                data_len=data.size, indices_len=idx.size, out_len=idx.size,
                                indices_i64=int(not as_f32), data_elem_bytes=data.itemsize, axis=axis)

    return OnnxCase(name("GatherElements", shape, index_shape, axis, np.dtype(dtype).name, encoding(as_f32)), "GatherElements",
                    (data, idx), build, index_shape, np.dtype(dtype), attrs=dict(axis=axis % len(shape)), extra=(stored,))


def gather_nd_case(shape: tuple[int, ...], idx_values: np.ndarray, batch_dims: int = 0,
                   as_f32: bool = False) -> OnnxCase:
    """GatherNd ↔ ONNX GatherND."""
    data = floats(shape, 13, *shape)
    idx, stored = indices(idx_values, as_f32)
    out_shape = (*idx.shape[:-1], *shape[batch_dims + idx.shape[-1]:])

    def build(data_off: int, _onnx_idx: int, idx_off: int, dst: int) -> T.Thunk:
        return T.GatherNd(data=data_off, indices=idx_off, dst=dst, data_shape=shape, indices_shape=idx.shape,
                          data_len=data.size, indices_len=idx.size, out_len=int(np.prod(out_shape)),
                          indices_i64=int(not as_f32), batch_dims=batch_dims)

    return OnnxCase(name("GatherNd", shape, idx.shape, batch_dims, encoding(as_f32)), "GatherND", (data, idx), build, out_shape,
                    attrs=dict(batch_dims=batch_dims), extra=(stored,))


def with_non_finite(data: np.ndarray, reduction: Red) -> np.ndarray:
    """`data` with NaN and ±inf sprinkled in (the copy keeps them, as ONNX does), except for Max/Min,
    which ignore NaN in RLX (semantics.md §2.13) but propagate it in onnx.reference."""
    if reduction in (Red.Max, Red.Min):
        return data
    out = data.copy()
    every_fourth = out.reshape(-1)[1::4]
    every_fourth[:] = np.resize(np.float32([np.nan, np.inf, -np.inf]), every_fourth.size)
    return out


def scatter_elements_case(shape: tuple[int, ...], idx_values: np.ndarray, axis: int, reduction: Red,
                          as_f32: bool = False) -> OnnxCase:
    """ScatterElements ↔ ONNX ScatterElements (updates applied in order)."""
    data = with_non_finite(floats(shape, 14, *shape), reduction)
    idx, stored = indices(idx_values, as_f32)
    updates = floats(idx.shape, 15, *idx.shape)

    def build(data_off: int, _onnx_idx: int, upd: int, idx_off: int, dst: int) -> T.Thunk:
        return T.ScatterElements(data=data_off, indices=idx_off, updates=upd, dst=dst, data_shape=shape,
                                 indices_shape=idx.shape, data_len=data.size, updates_len=updates.size,
                                 indices_len=idx.size, indices_i64=int(not as_f32), axis=axis, reduction=reduction)

    return OnnxCase(name("ScatterElements", shape, idx.shape, axis, reduction.name, encoding(as_f32)), "ScatterElements",
                    (data, idx, updates), build, shape, attrs=dict(axis=axis, reduction=ONNX_REDUCTION[reduction]),
                    extra=(stored,), rtol=1e-6, atol=1e-6)


def scatter_nd_case(shape: tuple[int, ...], idx_values: np.ndarray, reduction: Red, as_f32: bool = False) -> OnnxCase:
    """ScatterNd ↔ ONNX ScatterND (updates applied in order)."""
    data = with_non_finite(floats(shape, 16, *shape), reduction)
    idx, stored = indices(idx_values, as_f32)
    updates = floats((*idx.shape[:-1], *shape[idx.shape[-1]:]), 17, *idx.shape)

    def build(data_off: int, _onnx_idx: int, upd: int, idx_off: int, dst: int) -> T.Thunk:
        return T.ScatterNd(data=data_off, indices=idx_off, updates=upd, dst=dst, data_shape=shape,
                           indices_shape=idx.shape, data_len=data.size, updates_len=updates.size,
                           indices_len=idx.size, indices_i64=int(not as_f32), reduction=reduction)

    return OnnxCase(name("ScatterNd", shape, idx.shape, reduction.name, encoding(as_f32)), "ScatterND", (data, idx, updates), build,
                    shape, attrs=dict(reduction=ONNX_REDUCTION[reduction]), extra=(stored,), rtol=1e-6, atol=1e-6)


def distinct_along(axis_len: int, index_shape: tuple[int, int], key: int) -> np.ndarray:
    """Indices into an axis of `axis_len`, distinct along each row (ONNX leaves duplicates undefined for 'none')."""
    g = rng(18, key)
    return np.stack([g.permutation(axis_len)[:index_shape[1]] for _ in range(index_shape[0])])


CASES = [
    gather_axis_case(3, 5, 1, [4, 0, 2]),
    gather_axis_case(1, 7, 11, [6, 6, 1, 0], as_f32=True),
    gather_axis_case(4, 3, 9, [2, -1, 0, -3, 1]),              # negative ids clamp to row 0 (by design)
    gather_elements_case((3, 4), (2, 4), 0),
    gather_elements_case((2, 3, 9), (2, 3, 5), -1, as_f32=True),
    gather_elements_case((1, 13), (1, 17), 1, np.float64),
    gather_elements_case((5, 2), (3, 2), 0, np.float16),
    gather_nd_case((2, 3, 4), np.array([[0, 1], [1, 2], [1, -1]])),
    gather_nd_case((4, 2, 3), np.array([[[3, 1, 2]], [[0, 0, 0]], [[-1, 1, 1]]]), as_f32=True),
    gather_nd_case((2, 3, 5), np.array([[2], [0]]), batch_dims=1),
    gather_nd_case((1, 9), np.array([[0, 8], [0, 0]])),
    scatter_elements_case((4, 5), distinct_along(5, (2, 4), 0), 1, Red.None_),
    scatter_elements_case((4, 5), distinct_along(5, (2, 4), 0) - 5, 1, Red.None_, as_f32=True),   # negative indices
    scatter_elements_case((6, 1), np.array([[0], [5], [0], [2], [5], [0]]), 0, Red.Add),
    scatter_elements_case((3, 9), rng(19).integers(0, 9, (3, 11)), 1, Red.Mul),
    scatter_elements_case((3, 9), rng(20).integers(0, 9, (3, 11)), 1, Red.Max),
    scatter_elements_case((2, 3, 4), rng(21).integers(0, 3, (2, 2, 4)), 1, Red.Min),
    scatter_nd_case((4, 3), np.array([[1], [3]]), Red.None_),
    scatter_nd_case((2, 3, 4), np.array([[0, 1], [1, 2], [0, 1]]), Red.Add),
    scatter_nd_case((5, 9), np.array([[4], [-1], [0]]), Red.Mul, as_f32=True),   # -1 and 4 are one row
    scatter_nd_case((1, 6), np.array([[0, 5], [0, 1], [0, 5]]), Red.Max),
    scatter_nd_case((3, 2, 2), np.array([[2, 1], [2, 1]]), Red.Min),
]

test_gathers_and_scatters_match_onnx = oracle_test(CASES)
