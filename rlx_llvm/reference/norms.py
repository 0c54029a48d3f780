"""NumPy float64 references of the normalization thunks (semantics.md §3.3).

Inputs are read as f32, the statistics and the affine are computed in float64 with RLX's
formulas (LayerNorm's one-pass biased variance, GroupNorm/LayerNorm2d's two-pass one), and the
result is rounded to f32 once.  Element-wise sums that RLX forms in f32 before normalizing
(FusedResidual's `x + res + bias`) are formed in f32 here too.
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from . import reference, view


def _f32(arena: np.ndarray, off: int, count: int) -> np.ndarray:
    return view(arena, off, np.float32, count)


def normalize_rows(v: np.ndarray, eps: float, center: bool, two_pass: bool) -> np.ndarray:
    """`(v − μ)/√(var + eps)` (or `v/√(mean(v²) + eps)`) per row of a 2-D float64 array."""
    eps = float(np.float32(eps))
    with np.errstate(all="ignore"):
        if not center:
            return v / np.sqrt((v * v).mean(axis=1, keepdims=True) + eps)
        mu = v.mean(axis=1, keepdims=True)
        var = ((v - mu) ** 2).mean(axis=1, keepdims=True) if two_pass else \
            (v * v).mean(axis=1, keepdims=True) - mu * mu
        return (v - mu) / np.sqrt(var + eps)


def _affine_rows(arena, t, v32: np.ndarray, dst: int, center: bool) -> None:
    rows, h = t.rows, t.h
    if not rows * h:
        return
    y = normalize_rows(v32.reshape(rows, h).astype(np.float64), t.eps, center, two_pass=False)
    with np.errstate(all="ignore"):
        out = y * _f32(arena, t.g, h) + _f32(arena, t.b, h)
    _f32(arena, dst, rows * h)[:] = out.reshape(-1).astype(np.float32)


@reference(T.LayerNorm)
def layer_norm(arena: np.ndarray, t) -> None:
    """`(x−μ)/√(Σx²/h − μ² + eps)·g + b`."""
    _affine_rows(arena, t, _f32(arena, t.src, t.rows * t.h).copy(), t.dst, center=True)


@reference(T.RmsNorm)
def rms_norm(arena: np.ndarray, t) -> None:
    """`x/√(Σx²/h + eps)·g + b`."""
    _affine_rows(arena, t, _f32(arena, t.src, t.rows * t.h).copy(), t.dst, center=False)


def _residual_sum(arena: np.ndarray, t) -> np.ndarray:
    n = t.rows * t.h
    with np.errstate(all="ignore"):
        v = _f32(arena, t.x, n) + _f32(arena, t.res, n)
        if t.has_bias and t.h:
            v = (v.reshape(t.rows, t.h) + _f32(arena, t.bias, t.h)).reshape(-1)
    return v.astype(np.float32)


@reference(T.FusedResidualLN)
def fused_residual_ln(arena: np.ndarray, t) -> None:
    """LayerNorm of the f32 sum `x + res (+ bias)`."""
    _affine_rows(arena, t, _residual_sum(arena, t), t.out, center=True)


@reference(T.FusedResidualRmsNorm)
def fused_residual_rms_norm(arena: np.ndarray, t) -> None:
    """RmsNorm of the f32 sum `x + res (+ bias)`."""
    _affine_rows(arena, t, _residual_sum(arena, t), t.out, center=False)


@reference(T.AdaLayerNorm)
def ada_layer_norm(arena: np.ndarray, t) -> None:
    """`norm(x)·(1 + scale[m + j]) + shift[m + j]`, two-pass LayerNorm or RMS, m = mod_off[row]."""
    rows, h = t.rows, t.h
    if not rows * h:
        return
    y = normalize_rows(_f32(arena, t.src, rows * h).reshape(rows, h).astype(np.float64), t.eps,
                       t.layer_norm, two_pass=True)
    cols = np.asarray(t.mod_off, dtype=np.int64)[:, None] + np.arange(h)
    scale = _f32(arena, t.scale, t.mod_len).astype(np.float64)[cols]
    shift = _f32(arena, t.shift, t.mod_len).astype(np.float64)[cols]
    with np.errstate(all="ignore"):
        _f32(arena, t.dst, rows * h)[:] = (y * (1.0 + scale) + shift).reshape(-1).astype(np.float32)


@reference(T.GatedResidual)
def gated_residual(arena: np.ndarray, t) -> None:
    """`x + gate[gate_off[row] + j]·y`."""
    rows, h = t.rows, t.h
    if not rows * h:
        return
    cols = np.asarray(t.gate_off, dtype=np.int64)[:, None] + np.arange(h)
    gate = _f32(arena, t.gate, t.gate_len).astype(np.float64)[cols]
    x = _f32(arena, t.x, rows * h).reshape(rows, h).astype(np.float64)
    y = _f32(arena, t.y, rows * h).reshape(rows, h).astype(np.float64)
    with np.errstate(all="ignore"):
        _f32(arena, t.dst, rows * h)[:] = (x + gate * y).reshape(-1).astype(np.float32)


@reference(T.GroupNorm)
def group_norm(arena: np.ndarray, t) -> None:
    """Two-pass statistics per (batch, group of C/G channels), per-channel affine."""
    n, c, hw, groups = t.n, t.c, t.h * t.w, t.num_groups
    if not n * c * hw:
        return
    x = _f32(arena, t.src, n * c * hw).astype(np.float64).reshape(n * groups, -1)
    y = normalize_rows(x, t.eps, center=True, two_pass=True).reshape(n, c, hw)
    g = _f32(arena, t.g, c).astype(np.float64)[None, :, None]
    b = _f32(arena, t.b, c).astype(np.float64)[None, :, None]
    with np.errstate(all="ignore"):
        _f32(arena, t.dst, n * c * hw)[:] = (y * g + b).reshape(-1).astype(np.float32)


@reference(T.LayerNorm2d)
def layer_norm_2d(arena: np.ndarray, t) -> None:
    """Per (n, h, w) across the C channels, two-pass, per-channel affine."""
    n, c, hw = t.n, t.c, t.h * t.w
    if not n * c * hw:
        return
    x = _f32(arena, t.src, n * c * hw).astype(np.float64).reshape(n, c, hw)
    eps = float(np.float32(t.eps))
    with np.errstate(all="ignore"):
        mu = x.mean(axis=1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
        y = (x - mu) / np.sqrt(var + eps)
        y = y * _f32(arena, t.g, c).astype(np.float64)[None, :, None] + _f32(arena, t.b, c)[None, :, None]
    _f32(arena, t.dst, n * c * hw)[:] = y.reshape(-1).astype(np.float32)


@reference(T.BatchNormInference)
def batch_norm_inference(arena: np.ndarray, t) -> None:
    """`x·α + β`, α = g/√(var + eps), β = b − mean·α (PyTorch's CPU inference form)."""
    count, ch = t.count, t.channels
    if not count * ch:
        return
    f = lambda off: _f32(arena, off, ch).astype(np.float64)  # noqa: E731
    with np.errstate(all="ignore"):
        alpha = f(t.g) / np.sqrt(f(t.var) + float(np.float32(t.eps)))
        beta = f(t.b) - f(t.mean) * alpha
        x = _f32(arena, t.src, count * ch).astype(np.float64).reshape(count, ch)
        _f32(arena, t.dst, count * ch)[:] = (x * alpha + beta).reshape(-1).astype(np.float32)
