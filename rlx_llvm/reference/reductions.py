"""NumPy references of Softmax, reductions, scans (and CumsumBackward), TopK, Histogram (semantics.md §2.6, §3.6).

Float64 math on f32 inputs, NaN-ignoring max/min (`np.fmax/np.fmin`, Rust's `f32::max/min`),
index results exactly as the kernels define them: ArgReduce takes the first occurrence and lets
a NaN win (NumPy/PyTorch argmax), TopK runs RLX's literal k rounds, Histogram buckets in f32.
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..dtypes import DType
from ..ops import ReduceOp
from . import read_f64, reference, view, write_f32


def _f32(arena: np.ndarray, off: int, count: int) -> np.ndarray:
    return view(arena, off, np.float32, count)


@reference(T.Softmax)
def softmax(arena: np.ndarray, t) -> None:
    """In place over `[outer, cols, inner]`: `exp(x − max)/Σ` along the middle axis."""
    if not (t.rows and t.cols):
        return
    outer = t.rows // t.inner
    data = _f32(arena, t.data, t.rows * t.cols)
    x = data.astype(np.float64).reshape(outer, t.cols, t.inner)
    with np.errstate(all="ignore"):
        m = np.fmax.reduce(x, axis=1, keepdims=True, initial=-np.inf)
        e = np.exp(x - m)
        data[:] = (e / e.sum(axis=1, keepdims=True)).reshape(-1).astype(np.float32)


def reduce_values(x: np.ndarray, op: ReduceOp) -> np.ndarray:
    """Reduce axis 1 of `[outer, reduced, inner]` float64 data the RLX way."""
    n = x.shape[1]
    with np.errstate(all="ignore"):
        if op is ReduceOp.Sum:
            return x.sum(axis=1)
        if op is ReduceOp.Mean:
            return x.sum(axis=1) / np.float64(n) if n else np.full((x.shape[0], x.shape[2]), np.nan)
        if op is ReduceOp.Max:
            return np.fmax.reduce(x, axis=1, initial=-np.inf)
        if op is ReduceOp.Min:
            return np.fmin.reduce(x, axis=1, initial=np.inf)
        return x.prod(axis=1)


@reference(T.Reduce)
def reduce(arena: np.ndarray, t) -> None:
    """`[outer, reduced, inner] → [outer, inner]`."""
    x = _f32(arena, t.src, t.outer * t.reduced * t.inner).astype(np.float64)
    out = reduce_values(x.reshape(t.outer, t.reduced, t.inner), t.op)
    _f32(arena, t.dst, t.outer * t.inner)[:] = out.reshape(-1).astype(np.float32)


@reference(T.ReduceSumF64)
def reduce_sum_f64(arena: np.ndarray, t) -> None:
    """f64 sum over the reduced axis."""
    x = view(arena, t.src, np.float64, t.outer * t.reduced * t.inner).reshape(t.outer, t.reduced, t.inner)
    with np.errstate(all="ignore"):
        view(arena, t.dst, np.float64, t.outer * t.inner)[:] = x.sum(axis=1).reshape(-1)


@reference(T.ArgReduce)
def arg_reduce(arena: np.ndarray, t) -> None:
    """f32 index of the max/min: first occurrence, a NaN wins (NumPy's argmax/argmin rule)."""
    if not (t.outer and t.inner):
        return
    x = _f32(arena, t.src, t.outer * t.reduced * t.inner).reshape(t.outer, t.reduced, t.inner)
    idx = np.argmax(x, axis=1) if t.is_max else np.argmin(x, axis=1)
    _f32(arena, t.dst, t.outer * t.inner)[:] = idx.reshape(-1).astype(np.float32)


def top_k_rounds(x: np.ndarray, k: int) -> np.ndarray:
    """RLX's TopK literally: k rounds of strictly-greater arg-max from element 0, the chosen
    element set to −inf before the next round (vectorized over rows)."""
    cur = x.astype(np.float32).copy()
    rows = np.arange(cur.shape[0])
    out = np.zeros((cur.shape[0], k), dtype=np.int64)
    for r in range(k):
        scan = cur.copy()
        tail = scan[:, 1:]
        tail[np.isnan(tail)] = -np.inf          # a NaN at j ≥ 1 never compares greater
        first = np.argmax(scan, axis=1)          # first index of the largest value
        beats = scan[rows, first] > scan[:, 0]   # strictly greater than the running best x[0]
        pick = np.where(np.isnan(cur[:, 0]) | ~beats, 0, first)
        out[:, r] = pick
        cur[rows, pick] = -np.inf
    return out


@reference(T.TopK)
def top_k(arena: np.ndarray, t) -> None:
    """Indices of the k rounds, as f32 or i64."""
    if not (t.outer and t.k):
        return
    x = _f32(arena, t.src, t.outer * t.axis_dim).reshape(t.outer, t.axis_dim)
    idx = top_k_rounds(x, t.k).reshape(-1)
    if t.indices_i64:
        view(arena, t.dst, np.int64, idx.size)[:] = idx
    else:
        _f32(arena, t.dst, idx.size)[:] = idx.astype(np.float32)


def _scan(x: np.ndarray, ufunc, identity, exclusive: bool) -> np.ndarray:
    """Inclusive/exclusive scan along axis 1 starting from `identity`."""
    start = np.full((x.shape[0], 1), identity, dtype=x.dtype)
    with np.errstate(all="ignore"):
        full = ufunc.accumulate(np.concatenate([start, x], axis=1), axis=1)
    return full[:, :-1] if exclusive else full[:, 1:]


@reference(T.Cumsum)
def cumsum(arena: np.ndarray, t) -> None:
    """Running sum along rows: float64 for f32 data, wrapping int64 for i64."""
    if not (t.rows and t.cols):
        return
    n = t.rows * t.cols
    if t.dtype is DType.I64:
        x = view(arena, t.src, np.int64, n).reshape(t.rows, t.cols)
        view(arena, t.dst, np.int64, n)[:] = _scan(x, np.add, 0, t.exclusive).reshape(-1)
        return
    x = _f32(arena, t.src, n).reshape(t.rows, t.cols).astype(np.float64)
    _f32(arena, t.dst, n)[:] = _scan(x, np.add, 0.0, t.exclusive).reshape(-1).astype(np.float32)


@reference(T.CumScan)
def cum_scan(arena: np.ndarray, t) -> None:
    """Running product (from 1) or NaN-ignoring maximum (from −inf)."""
    if not (t.rows and t.cols):
        return
    n = t.rows * t.cols
    x = _f32(arena, t.src, n).reshape(t.rows, t.cols).astype(np.float64)
    ufunc, identity = (np.fmax, -np.inf) if t.is_max else (np.multiply, 1.0)
    _f32(arena, t.dst, n)[:] = _scan(x, ufunc, identity, t.exclusive).reshape(-1).astype(np.float32)


def histogram_bins(x: np.ndarray, bins: int, lo: float, hi: float) -> np.ndarray:
    """Bucket of each value, or −1 when dropped: `floor((x−min)/(max−min)·bins)` in f32,
    `x == max` → last bin, outside [min, max] or NaN → dropped, clamped into [0, bins)."""
    lo32, hi32 = np.float32(lo), np.float32(hi)
    with np.errstate(all="ignore"):
        t = np.floor((x - lo32) / (hi32 - lo32) * np.float32(bins))
    t = np.where(x == hi32, np.float32(bins - 1), t)
    t = np.nan_to_num(t, nan=0.0, posinf=bins - 1, neginf=0.0)
    k = np.clip(t, 0, bins - 1).astype(np.int64)
    inside = (x >= lo32) & (x <= hi32)
    return np.where(inside, k, -1)


@reference(T.Histogram)
def histogram(arena: np.ndarray, t) -> None:
    """f32 counts per bucket."""
    if not t.bins:
        return
    k = histogram_bins(_f32(arena, t.src, t.n), t.bins, t.min, t.max)
    counts = np.bincount(k[k >= 0], minlength=t.bins)
    _f32(arena, t.dst, t.bins)[:] = counts.astype(np.float32)


@reference(T.CumsumBackward)
def cumsum_backward(arena: np.ndarray, t) -> None:
    """`dx[j] = Σ_{k ≥ j} dy[k]` (`k > j` when exclusive): the forward scan of the reversed row."""
    if t.rows * t.cols:
        dy = read_f64(arena, t.dy, t.rows * t.cols).reshape(t.rows, t.cols)
        write_f32(arena, t.dx, _scan(dy[:, ::-1], np.add, 0.0, t.exclusive)[:, ::-1])
