"""Indexing lowerings (gathers, scatters, GatherBackward) against the NumPy reference and the ONNX operator spec.

One schedule over one arena of random bytes (tests/harness.py), compiled as is and with streaming
forced on.  Indices are data, so every kind also runs on hostile index values (NaN,
±inf, negative, huge, i64 extremes) and on index slots left as random bytes; the sentinel check
proves no byte outside the declared outputs changes whatever the indices hold.
"""
from __future__ import annotations


import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import thunks as T
from rlx_llvm.errors import ValidationError
from rlx_llvm.ops import ScatterNdReduction as Red
from tests.harness import (WIDTHS, Outcome, Suite, expect_invalid, f32_at, forward_matrix, run_reference,
                           streaming_forced, suite_tests)

RNG = np.random.default_rng(11)
REDUCTIONS = (Red.None_, Red.Add, Red.Mul, Red.Max, Red.Min)

HOSTILE_F32 = np.array([np.nan, -np.nan, np.inf, -np.inf, -1.0, -0.5, -0.0, 0.99, -1e30, 1e30, 2.0**31, 2.0**32 + 512,
                        2.0**63, 2.0**64, 3.4e38, -3.4e38, 1e-45, 16777217.0, 4.5, -4.5], np.float32)
HOSTILE_I64 = np.array([-2**63, 2**63 - 1, -1, -2, 2**31, 2**32, -2**32, 2**62, -2**62, 1 << 40, 0, 3], np.int64)


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def i64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


def indices(values, as_i64: bool) -> np.ndarray:
    """An index tensor in f32 or i64 storage."""
    return i64(values) if as_i64 else f32(values)


def hostile(n: int, dims: int, as_i64: bool) -> np.ndarray:
    """`n` index values: the hostile specials mixed with valid and slightly-out-of-range ones."""
    base = HOSTILE_I64 if as_i64 else HOSTILE_F32
    valid = RNG.integers(-dims - 2, dims + 3, n)
    out = np.where(RNG.random(n) < 0.5, valid, 0).astype(base.dtype)
    pick = RNG.random(n) < 0.5
    out[pick] = base[RNG.integers(0, base.size, int(pick.sum()))]
    return out


def floats(n: int, nan: bool = False) -> np.ndarray:
    """Finite small-integer f32 values (exact sums/products), optionally a canonical NaN and ±inf."""
    x = RNG.integers(1, 9, n).astype(np.float32) * np.where(RNG.random(n) < 0.5, -1, 1).astype(np.float32)
    if nan and n >= 3:
        x[RNG.choice(n, 3, replace=False)] = [np.nan, np.inf, -np.inf]
    return x


# ── Gather, GatherAxis ──────────────────────────────────────────────────────

def add_gathers(s: Suite) -> None:
    for rows, trailing, n, tb, as_i64 in [(10, 7, 40, 4, False), (10, 7, 40, 8, True), (33, 16, 50, 4, True),
                                          (5, 1, 64, 8, False), (6, 33, 9, 2, False), (4, 3, 0, 4, False),
                                          (7, 5, 12, 1, True)]:
        for hostile_ids in (False, True):
            ids = hostile(n, rows, as_i64) if hostile_ids else indices(RNG.integers(0, rows, n), as_i64)
            s.add(f"gather{rows}x{trailing}[{n}]tb{tb}{'i64' if as_i64 else 'f32'}{'!' if hostile_ids else ''}",
                  T.Gather(table=s.slot(rows * trailing * tb), table_len=rows * trailing, idx=s.put(ids),
                           dst=s.slot(n * trailing * tb), num_idx=n, trailing=trailing, idx_i64=int(as_i64),
                           table_bytes=tb))
    s.add("gather_partial_last_row", T.Gather(table=s.slot(4 * 23), table_len=23, idx=s.put(f32([0, 1, 2, 3, 4])),
                                              dst=s.slot(4 * 25), num_idx=5, trailing=5, idx_i64=0, table_bytes=4))
    s.add("gather_misaligned_dst", T.Gather(table=s.slot(4 * 64 * 16), table_len=64 * 16,
                                            idx=s.put(f32(RNG.integers(0, 64, 20))), dst=s.slot(4 * 20 * 16, 4),
                                            num_idx=20, trailing=16, idx_i64=0, table_bytes=4))
    s.add("gather_random_index_bytes", T.Gather(table=s.slot(4 * 60), table_len=60, idx=s.slot(8 * 30),
                                                dst=s.slot(8 * 30 * 6), num_idx=30, trailing=6, idx_i64=1,
                                                table_bytes=8))
    s.add("gather_large_streams", T.Gather(table=s.slot(4 * 2048 * 768), table_len=2048 * 768,
                                           idx=s.put(f32(RNG.integers(-2, 2050, 2800))), dst=s.slot(4 * 2800 * 768),
                                           num_idx=2800, trailing=768, idx_i64=0, table_bytes=4))
    for outer, axis_dim, n, trailing, tb, as_i64 in [(3, 5, 4, 2, 4, False), (2, 6, 7, 3, 8, True),
                                                     (4, 3, 10, 16, 4, True), (1, 9, 5, 1, 8, False)]:
        for hostile_ids in (False, True):
            ids = hostile(n, axis_dim, as_i64) if hostile_ids else indices(RNG.integers(0, axis_dim, n), as_i64)
            s.add(f"gather_axis{outer}x{axis_dim}x{trailing}[{n}]tb{tb}{'!' if hostile_ids else ''}",
                  T.GatherAxis(table=s.slot(outer * axis_dim * trailing * tb), idx=s.put(ids),
                               dst=s.slot(outer * n * trailing * tb), outer=outer, axis_dim=axis_dim, num_idx=n,
                               trailing=trailing, idx_i64=int(as_i64), table_bytes=tb))


# ── GatherNd, GatherElements ────────────────────────────────────────────────

def gather_nd(s: Suite, data_shape, idx: np.ndarray, batch_dims: int = 0, data=None, expect=None, name=None):
    """A GatherNd case (output shape from the ONNX rule)."""
    data_shape, ishape = tuple(data_shape), tuple(idx.shape)
    k = ishape[-1]
    out_len = int(np.prod(ishape[:-1], dtype=np.int64)) * int(np.prod(data_shape[batch_dims + k:], dtype=np.int64))
    n = int(np.prod(data_shape, dtype=np.int64))
    src = s.slot(4 * n) if data is None else s.put(f32(data))
    dst = s.slot(4 * out_len)
    name = name or f"gather_nd{data_shape}{ishape}b{batch_dims}{idx.dtype}"
    s.add(name, T.GatherNd(data=src, indices=s.put(idx), dst=dst, data_shape=data_shape, indices_shape=ishape,
                           data_len=n, indices_len=idx.size, out_len=out_len, indices_i64=int(idx.dtype == np.int64),
                           batch_dims=batch_dims), expect=None if expect is None else (dst, f32(expect)))


def gather_elements(s: Suite, data_shape, idx: np.ndarray, axis: int, eb: int = 4, data=None, expect=None,
                    name=None):
    """A GatherElements case."""
    n = int(np.prod(data_shape, dtype=np.int64))
    src = s.slot(eb * n) if data is None else s.put(f32(data))
    dst = s.slot(eb * idx.size)
    name = name or f"gather_elements{tuple(data_shape)}{idx.shape}ax{axis}x{eb}{idx.dtype}"
    s.add(name, T.GatherElements(data=src, indices=s.put(idx), dst=dst, data_shape=tuple(data_shape),
                                 indices_shape=idx.shape, data_len=n, indices_len=idx.size, out_len=idx.size,
                                 indices_i64=int(idx.dtype == np.int64), data_elem_bytes=eb, axis=axis),
          expect=None if expect is None else (dst, f32(expect)))


def add_nd_and_elements(s: Suite) -> None:
    for data_shape, ishape, b in [((4, 5), (6, 2), 0), ((4, 5), (3, 1), 0), ((3, 4, 5), (2, 2, 2), 0),
                                  ((2, 3, 4), (2, 5, 1), 1), ((2, 3, 4, 5), (2, 3, 2, 1), 2), ((6,), (4, 1), 0),
                                  ((3, 4), (5, 0), 0), ((2, 4, 3), (2, 3, 2), 1)]:
        k = ishape[-1]
        dims = data_shape[b:b + k] or (1,)
        for as_i64, bad in ((False, False), (True, False), (False, True), (True, True)):
            raw = hostile(int(np.prod(ishape)), max(dims), as_i64) if bad else \
                RNG.integers(-max(dims), max(dims), int(np.prod(ishape)))
            idx = indices(raw, as_i64).reshape(ishape)
            gather_nd(s, data_shape, idx, b, name=f"gather_nd{data_shape}{ishape}b{b}"
                                                  f"{'i64' if as_i64 else 'f32'}{'!' if bad else ''}")
    for data_shape, ishape, axis in [((7,), (9,), 0), ((4, 5), (4, 5), 1), ((4, 5), (3, 2), 0), ((4, 5), (2, 8), 1),
                                     ((3, 4, 5), (3, 2, 5), -2), ((2, 3, 4, 5), (2, 3, 4, 2), 3),
                                     ((2, 3, 4, 5), (1, 5, 4, 2), -3), ((3, 0, 2), (3, 0, 2), 0)]:
        dim = data_shape[axis] or 1
        for eb, as_i64, bad in [(4, False, False), (8, True, False), (1, False, True), (2, True, True),
                                (16, False, False)]:
            n = int(np.prod(ishape))
            raw = hostile(n, dim, as_i64) if bad else RNG.integers(-dim, dim, n)
            gather_elements(s, data_shape, indices(raw, as_i64).reshape(ishape), axis, eb,
                            name=f"gather_elements{data_shape}{ishape}ax{axis}x{eb}{'!' if bad else ''}")
    s.add("gather_elements_axis_dim_0", T.GatherElements(
        data=s.slot(4), indices=s.put(f32([0, 1])), dst=s.slot(8), data_shape=(0, 2), indices_shape=(1, 2),
        data_len=0, indices_len=2, out_len=2, indices_i64=0, data_elem_bytes=4, axis=0))


# ── scatters ────────────────────────────────────────────────────────────────

def add_scatter_adds(s: Suite) -> None:
    for out_dim, trailing, n, bad in [(6, 5, 30, False), (6, 17, 30, True), (40, 33, 12, False), (3, 1, 50, True),
                                      (5, 16, 0, False), (4, 32, 64, True)]:
        ids = hostile(n, out_dim, False) if bad else f32(RNG.integers(0, out_dim, n))
        s.add(f"scatter_add{out_dim}x{trailing}[{n}]{'!' if bad else ''}",
              T.ScatterAdd(updates=s.put(floats(n * trailing, nan=bad)), indices=s.put(ids),
                           dst=s.slot(4 * out_dim * trailing), num_updates=n, out_dim=out_dim, trailing=trailing),
              dtype=np.float32, zero_sign=False)
    s.add("scatter_add_random_index_bytes", T.ScatterAdd(updates=s.put(floats(20 * 4)), indices=s.slot(4 * 20),
                                                         dst=s.slot(4 * 7 * 4), num_updates=20, out_dim=7, trailing=4),
          dtype=np.float32, zero_sign=False)


def scatter_nd(s: Suite, data, idx: np.ndarray, updates, reduction: Red, name: str, expect=None, in_place=False,
               nan=False):
    """A ScatterNd case over f32 `data` (an array, or a shape for random floats)."""
    data = f32(data) if not isinstance(data, tuple) else floats(int(np.prod(data)), nan).reshape(data)
    updates = f32(updates) if not isinstance(updates, tuple) else floats(int(np.prod(updates)), nan).reshape(updates)
    src = s.put(data)
    dst = src if in_place else s.slot(data.nbytes)
    s.add(name, T.ScatterNd(data=src, indices=s.put(idx), updates=s.put(updates), dst=dst, data_shape=data.shape,
                            indices_shape=idx.shape, data_len=data.size, updates_len=updates.size,
                            indices_len=idx.size, indices_i64=int(idx.dtype == np.int64), reduction=reduction),
          expect=None if expect is None else (dst, f32(expect)), dtype=np.float32, zero_sign=False)


def scatter_elements(s: Suite, data, idx: np.ndarray, updates, axis: int, reduction: Red, name: str, expect=None,
                     in_place=False, nan=False):
    """A ScatterElements case over f32 `data` (an array, or a shape for random floats)."""
    data = f32(data) if not isinstance(data, tuple) else floats(int(np.prod(data)), nan).reshape(data)
    updates = f32(updates) if updates is not None else floats(idx.size, nan).reshape(idx.shape)
    src = s.put(data)
    dst = src if in_place else s.slot(data.nbytes)
    s.add(name, T.ScatterElements(data=src, indices=s.put(idx), updates=s.put(updates), dst=dst,
                                  data_shape=data.shape, indices_shape=idx.shape, data_len=data.size,
                                  updates_len=updates.size, indices_len=idx.size,
                                  indices_i64=int(idx.dtype == np.int64), axis=axis, reduction=reduction),
          expect=None if expect is None else (dst, f32(expect)), dtype=np.float32, zero_sign=False)


def add_scatters(s: Suite) -> None:
    for red in REDUCTIONS:
        r = red.name
        # duplicates on purpose: 12 tuples into 4 rows
        scatter_nd(s, (4, 6), indices(RNG.integers(0, 4, (12, 1)), False), (12, 6), red, f"scatter_nd_dups_{r}")
        scatter_nd(s, (3, 4, 5), indices(RNG.integers(-4, 4, (7, 2)), True), (7, 5), red, f"scatter_nd_k2_{r}")
        scatter_nd(s, (3, 4), indices(RNG.integers(-3, 3, (2, 3, 2)), False), (2, 3), red, f"scatter_nd_elems_{r}",
                   nan=True)
        scatter_nd(s, (5, 3), hostile(9, 5, r in ("Add", "Max")).reshape(9, 1), (9, 3), red, f"scatter_nd_hostile_{r}")
        scatter_nd(s, (4, 4), indices(RNG.integers(0, 4, (5, 1)), True), (5, 4), red, f"scatter_nd_in_place_{r}",
                   in_place=True)
        scatter_elements(s, (4, 5), indices(RNG.integers(-4, 4, (6, 5)), False), None, 0, red,
                         f"scatter_elements_dups_axis0_{r}")
        scatter_elements(s, (3, 4, 5), indices(RNG.integers(0, 5, (2, 3, 7)), True), None, -1, red,
                         f"scatter_elements_small_indices_{r}", nan=True)
        scatter_elements(s, (6, 5), hostile(12, 6, r in ("Mul", "Min")).reshape(3, 4), None, 0, red,
                         f"scatter_elements_hostile_{r}")
        scatter_elements(s, (2, 3, 4, 5), indices(RNG.integers(-3, 3, (2, 3, 4, 5)), False), None, 1, red,
                         f"scatter_elements_rank4_in_place_{r}", in_place=True)
    scatter_nd(s, (4, 3), i64(np.zeros((0, 1))), (0, 3), Red.Add, "scatter_nd_no_updates")
    scatter_elements(s, (3, 4), i64(np.zeros((3, 0))), None, 1, Red.Mul, "scatter_elements_no_updates")
    s.add("scatter_nd_random_index_bytes", T.ScatterNd(
        data=s.put(floats(12)), indices=s.slot(8 * 6), updates=s.put(floats(6 * 2)), dst=s.slot(4 * 12),
        data_shape=(3, 2, 2), indices_shape=(6, 2), data_len=12, updates_len=12, indices_len=12, indices_i64=1,
        reduction=Red.Add), dtype=np.float32, zero_sign=False)
    s.add("scatter_elements_random_index_bytes", T.ScatterElements(
        data=s.put(floats(20)), indices=s.slot(4 * 8), updates=s.put(floats(8)), dst=s.slot(4 * 20),
        data_shape=(4, 5), indices_shape=(2, 4), data_len=20, updates_len=8, indices_len=8, indices_i64=0, axis=1,
        reduction=Red.Max), dtype=np.float32, zero_sign=False)


# ── ONNX spec cases (expected outputs written by hand from the operator docs' examples) ──

SCATTER_DATA_444 = [[[1, 2, 3, 4], [5, 6, 7, 8], [8, 7, 6, 5], [4, 3, 2, 1]],
                    [[1, 2, 3, 4], [5, 6, 7, 8], [8, 7, 6, 5], [4, 3, 2, 1]],
                    [[8, 7, 6, 5], [4, 3, 2, 1], [1, 2, 3, 4], [5, 6, 7, 8]],
                    [[8, 7, 6, 5], [4, 3, 2, 1], [1, 2, 3, 4], [5, 6, 7, 8]]]
SCATTER_UPD_244 = [[[5, 5, 5, 5], [6, 6, 6, 6], [7, 7, 7, 7], [8, 8, 8, 8]],
                   [[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3], [4, 4, 4, 4]]]


def add_onnx_gathers(s: Suite) -> None:
    # Gather, example 1 (axis = 0): indices [[0, 1], [1, 2]] into a 3×2 table.
    table = s.put(f32([[1.0, 1.2], [2.3, 3.4], [4.5, 5.7]]))
    dst = s.slot(4 * 8)
    s.add("onnx_gather_axis0", T.Gather(table=table, table_len=6, idx=s.put(i64([[0, 1], [1, 2]])), dst=dst,
                                        num_idx=4, trailing=2, idx_i64=1, table_bytes=4),
          expect=(dst, f32([[[1.0, 1.2], [2.3, 3.4]], [[2.3, 3.4], [4.5, 5.7]]])))
    # Gather, example 2 (axis = 1): indices [[0, 2]] into a 3×3 table → GatherAxis.
    table = s.put(f32([[1.0, 1.2, 1.9], [2.3, 3.4, 3.9], [4.5, 5.7, 5.9]]))
    dst = s.slot(4 * 6)
    s.add("onnx_gather_axis1", T.GatherAxis(table=table, idx=s.put(i64([0, 2])), dst=dst, outer=3, axis_dim=3,
                                            num_idx=2, trailing=1, idx_i64=1, table_bytes=4),
          expect=(dst, f32([[[1.0, 1.9]], [[2.3, 3.9]], [[4.5, 5.9]]])))
    # gather_negative_indices: ONNX gives [0, 1, 0]; RLX clamps negative ids to row 0 (semantics.md §3.5).
    dst = s.slot(4 * 3)
    s.add("onnx_gather_negative_indices_rlx_rule", T.Gather(
        table=s.put(f32(np.arange(10))), table_len=10, idx=s.put(i64([0, -9, -10])), dst=dst, num_idx=3,
        trailing=1, idx_i64=1, table_bytes=4), expect=(dst, f32([0, 0, 0])))
    # GatherND examples 1–5.
    d22, d222 = [[0, 1], [2, 3]], [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    gather_nd(s, (2, 2), i64([[0, 0], [1, 1]]), data=d22, expect=[0, 3], name="onnx_gather_nd_ex1")
    gather_nd(s, (2, 2), i64([[1], [0]]), data=d22, expect=[[2, 3], [0, 1]], name="onnx_gather_nd_ex2")
    gather_nd(s, (2, 2, 2), i64([[0, 1], [1, 0]]), data=d222, expect=[[2, 3], [4, 5]], name="onnx_gather_nd_ex3")
    gather_nd(s, (2, 2, 2), i64([[[0, 1]], [[1, 0]]]), data=d222, expect=[[[2, 3]], [[4, 5]]],
              name="onnx_gather_nd_ex4")
    gather_nd(s, (2, 2, 2), i64([[1], [0]]), 1, data=d222, expect=[[2, 3], [4, 5]], name="onnx_gather_nd_ex5")
    gather_nd(s, (2, 2), f32([[-1, -2], [1, -1]]), data=d22, expect=[2, 3], name="onnx_gather_nd_negative_wraps")
    # GatherElements examples 1, 2 and gather_elements_negative_indices.
    gather_elements(s, (2, 2), i64([[0, 0], [1, 0]]), 1, data=[[1, 2], [3, 4]], expect=[[1, 1], [4, 3]],
                    name="onnx_gather_elements_ex1")
    d33 = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    gather_elements(s, (3, 3), i64([[1, 2, 0], [2, 0, 0]]), 0, data=d33, expect=[[4, 8, 3], [7, 2, 3]],
                    name="onnx_gather_elements_ex2")
    gather_elements(s, (3, 3), i64([[-1, -2, 0], [-2, 0, 0]]), 0, data=d33, expect=[[7, 5, 3], [4, 2, 3]],
                    name="onnx_gather_elements_negative_indices")


def add_onnx_scatters(s: Suite) -> None:
    # ScatterND example 1 and example 2 (reduction none), then scatternd_add/multiply/max/min.
    scatter_nd(s, [1, 2, 3, 4, 5, 6, 7, 8], i64([[4], [3], [1], [7]]), [9, 10, 11, 12], Red.None_,
               "onnx_scatter_nd_ex1", expect=[1, 11, 3, 10, 9, 6, 7, 12])
    scatter_nd(s, SCATTER_DATA_444, i64([[0], [2]]), SCATTER_UPD_244, Red.None_, "onnx_scatter_nd_ex2",
               expect=[SCATTER_UPD_244[0], SCATTER_DATA_444[1], SCATTER_UPD_244[1], SCATTER_DATA_444[3]])
    reduced = {Red.Add: [[7, 8, 9, 10], [13, 14, 15, 16], [18, 17, 16, 15], [16, 15, 14, 13]],
               Red.Mul: [[5, 10, 15, 20], [60, 72, 84, 96], [168, 147, 126, 105], [128, 96, 64, 32]],
               Red.Max: [[5, 5, 5, 5], [6, 6, 7, 8], [8, 7, 7, 7], [8, 8, 8, 8]],
               Red.Min: [[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3], [4, 3, 2, 1]]}
    for red, first in reduced.items():
        scatter_nd(s, SCATTER_DATA_444, i64([[0], [0]]), SCATTER_UPD_244, red, f"onnx_scatter_nd_{red.name.lower()}",
                   expect=[first] + SCATTER_DATA_444[1:])
    # ScatterElements example 1 (axis 0), example 2 (axis 1), negative indices, duplicates with reductions.
    scatter_elements(s, np.zeros((3, 3)), i64([[1, 0, 2], [0, 2, 1]]), [[1.0, 1.1, 1.2], [2.0, 2.1, 2.2]], 0,
                     Red.None_, "onnx_scatter_elements_ex1",
                     expect=[[2.0, 1.1, 0.0], [1.0, 0.0, 2.2], [0.0, 2.1, 1.2]])
    row = [[1.0, 2.0, 3.0, 4.0, 5.0]]
    scatter_elements(s, row, i64([[1, 3]]), [[1.1, 2.1]], 1, Red.None_, "onnx_scatter_elements_ex2",
                     expect=[[1.0, 1.1, 3.0, 2.1, 5.0]])
    scatter_elements(s, row, i64([[1, -3]]), [[1.1, 2.1]], 1, Red.None_, "onnx_scatter_elements_negative_indices",
                     expect=[[1.0, 1.1, 2.1, 4.0, 5.0]])
    for red, value in ((Red.Add, 5.2), (Red.Mul, 2.0 * 1.1 * 2.1), (Red.Max, 2.1), (Red.Min, 1.1)):
        scatter_elements(s, row, i64([[1, 1]]), [[1.1, 2.1]], 1, red,
                         f"onnx_scatter_elements_duplicates_{red.name.lower()}",
                         expect=[[1.0, value, 3.0, 4.0, 5.0]])
    # indices smaller than data (the seed's indices_shape): a 2×2 index block into 3×4 data, axis 0.
    scatter_elements(s, np.zeros((3, 4)), i64([[1, 0], [2, 1]]), [[1, 2], [3, 4]], 0, Red.None_,
                     "onnx_scatter_elements_indices_smaller_than_data",
                     expect=[[0, 2, 0, 0], [1, 4, 0, 0], [3, 0, 0, 0]])


def gather_ids(s: Suite, num_idx: int, axis_dim: int) -> np.ndarray:
    """Random in-range ids (with repeats), then the edge ids: fractional, negative, NaN, out of range."""
    ids = s.rng.integers(0, max(axis_dim, 1), num_idx).astype(np.float32)
    edge = [axis_dim - 0.5, -3.0, np.nan, float(axis_dim), 1e9, np.inf, 2.7, -np.inf]
    ids[:min(num_idx, len(edge))] = edge[:num_idx]
    return ids.astype(np.float32)


def add_gather_backward(s: Suite) -> None:
    """GatherBackward (repeated and hostile ids: fractional, negative, NaN, ±inf, out of range), empty shapes."""
    shapes = [(2, 5, 11, t) for t in WIDTHS] + [(1, 1, 1, 1), (3, 4, 0, 7), (0, 4, 3, 7), (2, 0, 3, 5),
                                                 (4, 37, 300, 64)]
    for outer, axis_dim, num_idx, trailing in shapes:
        dy = s.normal(outer * num_idx * trailing)
        if dy.size > 3:
            dy[1], dy[2] = np.nan, np.inf
        dst, o = s.out(np.float32, outer * axis_dim * trailing)
        s.add(f"GatherBackward-{outer}x{axis_dim}x{num_idx}x{trailing}{'!' if num_idx else ''}",
              T.GatherBackward(dy=s.put(dy), indices=s.put(gather_ids(s, num_idx, axis_dim)), dst=dst, outer=outer,
                               axis_dim=axis_dim, num_idx=num_idx, trailing=trailing), [o], exact=True)


def build_suite() -> Suite:
    s = Suite(5)
    for add in (add_gathers, add_nd_and_elements, add_scatter_adds, add_scatters, add_onnx_gathers,
                add_onnx_scatters, add_gather_backward):
        add(s)
    return s


SUITE = build_suite()
STREAMED = SUITE.subset(lambda c: type(c.thunk).__name__ in {"Gather", "GatherAxis"})
SPEC = [c.name for c in SUITE.cases if c.expect is not None]

(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


# the streaming cases again, compiled with every output streamed (non-temporal stores, prefetch)
(streamed, test_streamed_matches_reference, test_streamed_changes_nothing_outside_the_outputs,
 test_streamed_thread_count_does_not_change_results, test_streamed_kinds_are_native) = suite_tests(
    STREAMED, streaming_forced, fixture="streamed")


@pytest.mark.parametrize("name", SPEC)
def test_onnx_spec_example(outcome: Outcome, name: str) -> None:
    outcome.check_spec(name, rtol=1e-6)


def test_every_indexing_kind_is_lowered_and_attacked():
    kinds = {type(c.thunk).__name__ for c in SUITE.cases}
    assert kinds == {"Gather", "GatherAxis", "GatherNd", "GatherElements", "ScatterAdd", "ScatterNd",
                     "ScatterElements", "GatherBackward"}
    assert {k: rl.coverage()[k] for k in kinds} == {k: "llvm" for k in kinds}
    attacked = {type(c.thunk).__name__ for c in SUITE.cases if "!" in c.name or "random_index_bytes" in c.name}
    assert attacked == kinds


def test_scatter_add_duplicates_accumulate_in_order(outcome: Outcome):
    case = next(c for c in SUITE.cases if c.name == "scatter_add6x5[30]")
    out = outcome.got[case.thunk.dst:case.thunk.dst + 4 * 30].view(np.float32).reshape(6, 5)
    ids = outcome.before[case.thunk.indices:case.thunk.indices + 4 * 30].view(np.float32).astype(int)
    upd = outcome.before[case.thunk.updates:case.thunk.updates + 4 * 150].view(np.float32).reshape(30, 5)
    want = np.zeros((6, 5), np.float32)
    for i, r in enumerate(ids):
        want[r] += upd[i]
    np.testing.assert_array_equal(out, want)


# ── the index rules on their own ────────────────────────────────────────────

def test_reference_index_rules():
    from rlx_llvm.reference.indexing import onnx_indices, row_ids
    got = row_ids(f32([np.nan, -1, -0.5, 2.9, 3, 1e30, np.inf, -np.inf]), 3)
    assert got.tolist() == [0, 0, 0, 2, -1, -1, -1, 0]
    assert row_ids(i64([-2**63, -1, 2, 3, 2**63 - 1]), 3).tolist() == [0, 0, 2, -1, -1]
    assert onnx_indices(f32([np.nan, -1, -3, -4, -1e30, 2.9, 3, np.inf]), 3).tolist() == [0, 2, 0, 0, 0, 2, 2, 2]
    assert onnx_indices(i64([-2**63, -1, -3, -4, 2**63 - 1, 1]), 3).tolist() == [0, 2, 0, 0, 2, 1]


# ── validation ──────────────────────────────────────────────────────────────

def _nd(**kw):
    base = dict(data=0, indices=256, dst=512, data_shape=(2, 3), indices_shape=(2, 1), data_len=6, indices_len=2,
                out_len=6, indices_i64=0, batch_dims=0)
    return T.GatherNd(**{**base, **kw})


def _ge(**kw):
    base = dict(data=0, indices=256, dst=512, data_shape=(2, 3), indices_shape=(2, 3), data_len=6, indices_len=6,
                out_len=6, indices_i64=0, data_elem_bytes=4, axis=0)
    return T.GatherElements(**{**base, **kw})


def _se(**kw):
    base = dict(data=0, indices=256, updates=512, dst=768, data_shape=(2, 3), indices_shape=(2, 3), data_len=6,
                updates_len=6, indices_len=6, indices_i64=0, axis=1, reduction=Red.Add)
    return T.ScatterElements(**{**base, **kw})


def _sn(**kw):
    base = dict(data=0, indices=256, updates=512, dst=768, data_shape=(2, 3), indices_shape=(2, 1), data_len=6,
                updates_len=6, indices_len=2, indices_i64=0, reduction=Red.Mul)
    return T.ScatterNd(**{**base, **kw})


BAD = {
    "gather_table_bytes": (T.Gather(table=0, table_len=4, idx=256, dst=512, num_idx=1, trailing=2, idx_i64=0,
                                    table_bytes=3), "table_bytes"),
    "gather_axis_table_bytes": (T.GatherAxis(table=0, idx=256, dst=512, outer=1, axis_dim=2, num_idx=1, trailing=1,
                                             idx_i64=0, table_bytes=0), "table_bytes"),
    "gather_nd_batch_dims": (_nd(batch_dims=2), "batch_dims"),
    "gather_nd_k_too_big": (_nd(indices_shape=(1, 3), indices_len=3, out_len=1), "indices_shape"),
    "gather_nd_batch_mismatch": (_nd(indices_shape=(3, 1), indices_len=3, batch_dims=1), "indices_shape"),
    "gather_nd_data_len": (_nd(data_len=5), "data_len"),
    "gather_nd_out_len": (_nd(out_len=5), "out_len"),
    "gather_elements_rank": (_ge(indices_shape=(6,)), "indices_shape"),
    "gather_elements_axis": (_ge(axis=2), "axis"),
    "gather_elements_indices_too_big": (_ge(indices_shape=(2, 4), indices_len=8, out_len=8), "indices_shape"),
    "gather_elements_elem_bytes": (_ge(data_elem_bytes=3), "data_elem_bytes"),
    "gather_elements_out_len": (_ge(out_len=5), "out_len"),
    "scatter_elements_updates_len": (_se(updates_len=5), "updates_len"),
    "scatter_elements_axis": (_se(axis=-3), "axis"),
    "scatter_nd_updates_len": (_sn(updates_len=5), "updates_len"),
    "scatter_nd_indices_len": (_sn(indices_len=3), "indices_len"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_thunk_is_a_validation_error(name):
    thunk, fld = BAD[name]
    assert expect_invalid(thunk, 4096, fld).index == 0


def test_updates_may_not_alias_the_output():
    same = dict(data=0, indices=256, updates=512, dst=512, data_shape=(6,), indices_shape=(6, 1), data_len=6,
                updates_len=6, indices_len=6, indices_i64=0, reduction=Red.Add)
    with pytest.raises(ValidationError):
        rl.compile(rl.ThunkSchedule([T.ScatterNd(**same)], arena_bytes=4096), cache=False)


def test_gather_backward_is_the_transpose_of_gather_axis() -> None:
    """Including repeated ids (summed) and ids Gather skips (no gradient)."""
    outer, axis_dim, trailing = 2, 4, 3
    ids = np.array([1, 3, 1, 7, -2, np.nan, 2.5], np.float32)
    geo = dict(outer=outer, axis_dim=axis_dim, num_idx=ids.size, trailing=trailing)
    n_in, n_out = outer * axis_dim * trailing, outer * ids.size * trailing
    gather = T.GatherAxis(table=0, idx=1024, dst=2048, idx_i64=0, table_bytes=4, **geo)
    fwd = lambda e, m: f32_at(run_reference(gather, 4096, {0: e, 1024: ids}), 2048, m)  # noqa: E731
    jac = forward_matrix(fwd, n_in, n_out)
    dy = np.random.default_rng(4).standard_normal(n_out).astype(np.float32)
    got = f32_at(run_reference(T.GatherBackward(dy=0, indices=1024, dst=2048, **geo), 4096, {0: dy, 1024: ids}),
                  2048, n_in)
    np.testing.assert_allclose(got, jac @ dy.astype(np.float64), rtol=1e-6, atol=1e-6)
