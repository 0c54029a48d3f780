"""NumPy float64 references of the softmax cross-entropy losses (semantics.md §3.6).

Labels convert like Rust's `label as usize` (truncate, NaN and negatives → 0); a label ≥ c is
ignored (loss 0, gradient row 0), as the kernels document.
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from . import reference, view


def _f32(arena: np.ndarray, off: int, count: int) -> np.ndarray:
    return view(arena, off, np.float32, count)


def label_indices(labels: np.ndarray, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(valid mask, class index — 0 where invalid) of f32-encoded labels."""
    lab = labels.astype(np.float64)
    valid = ~(lab >= classes)                      # NaN compares false → valid (→ class 0)
    idx = np.where(valid, np.trunc(np.nan_to_num(np.maximum(lab, 0.0), nan=0.0)), 0.0)
    return valid, idx.astype(np.int64)


def _logits(arena: np.ndarray, t) -> np.ndarray:
    return _f32(arena, t.logits, t.n * t.c).reshape(t.n, t.c).astype(np.float64)


def log_softmax_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lse per row, softmax) with the NaN-ignoring max as the shift."""
    with np.errstate(all="ignore"):
        m = np.fmax.reduce(x, axis=1, keepdims=True, initial=-np.inf)
        e = np.exp(x - m)
        s = e.sum(axis=1, keepdims=True)
        return (m + np.log(s))[:, 0], e / s


@reference(T.SoftmaxCrossEntropy)
def softmax_cross_entropy(arena: np.ndarray, t) -> None:
    """`lse(x_n) − x[n, label]`, 0 for an out-of-range label."""
    if not t.n:
        return
    x = _logits(arena, t)
    lse, _ = log_softmax_parts(x)
    valid, idx = label_indices(_f32(arena, t.labels, t.n), t.c)
    with np.errstate(all="ignore"):
        loss = np.where(valid, lse - x[np.arange(t.n), idx], 0.0)
    _f32(arena, t.dst, t.n)[:] = loss.astype(np.float32)


@reference(T.SoftmaxCrossEntropyDense)
def softmax_cross_entropy_dense(arena: np.ndarray, t) -> None:
    """`lse(x_n) − Σ_c t[n,c]·x[n,c]`."""
    if not t.n:
        return
    x = _logits(arena, t)
    lse, _ = log_softmax_parts(x)
    tgt = _f32(arena, t.targets, t.n * t.c).reshape(t.n, t.c).astype(np.float64)
    with np.errstate(all="ignore"):
        _f32(arena, t.dst, t.n)[:] = (lse - (tgt * x).sum(axis=1)).astype(np.float32)


@reference(T.SoftmaxCrossEntropyBackward)
def softmax_cross_entropy_backward(arena: np.ndarray, t) -> None:
    """`(softmax(x_n) − onehot(label))·d_loss[n]`, a zero row for an out-of-range label."""
    if not t.n:
        return
    _, p = log_softmax_parts(_logits(arena, t))
    valid, idx = label_indices(_f32(arena, t.labels, t.n), t.c)
    p[np.arange(t.n), idx] -= 1.0
    with np.errstate(all="ignore"):
        d = p * _f32(arena, t.d_loss, t.n).astype(np.float64)[:, None]
    d[~valid] = 0.0
    _f32(arena, t.dlogits, t.n * t.c)[:] = d.reshape(-1).astype(np.float32)
