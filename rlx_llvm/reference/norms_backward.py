"""NumPy references of the norm backward kernels (semantics.md §3.3, §3.12).

Inputs are read as f32 and the gradients computed in float64, rounded to f32 once.  The row
statistics are the forward's (`norms.normalize_rows`: LayerNorm's one-pass variance); the
gradients are the exact derivatives of that forward, checked against finite differences in the
tests.  The float64 cores (`layer_norm_grads`, `rms_norm_grads`) are public for those tests.
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from . import read_f64, reference, write_f32
from .norms import normalize_rows


def row_inv_std(x: np.ndarray, eps: float, center: bool) -> tuple[np.ndarray, np.ndarray]:
    """(μ — 0 for RMS, 1/√(var + eps)) per row: LayerNorm's one-pass biased variance, or mean(x²)."""
    eps = float(np.float32(eps))
    with np.errstate(all="ignore"):
        mu = x.mean(axis=1, keepdims=True) if center else np.zeros((x.shape[0], 1))
        ms = (x * x).mean(axis=1, keepdims=True)
        return mu, 1.0 / np.sqrt(ms - mu * mu + eps)


def layer_norm_grads(x: np.ndarray, gamma: np.ndarray, dy: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dγ) of `y = x̂·γ + β`: `dx = inv·(g − mean(g) − x̂·mean(g·x̂))`, g = dy·γ; `dγ = Σ_rows dy·x̂`."""
    mu, inv = row_inv_std(x, eps, center=True)
    with np.errstate(all="ignore"):
        xh = (x - mu) * inv
        g = dy * gamma
        dx = inv * (g - g.mean(axis=1, keepdims=True) - xh * (g * xh).mean(axis=1, keepdims=True))
        return dx, (dy * xh).sum(axis=0)


def rms_norm_grads(x: np.ndarray, gamma: np.ndarray, dy: np.ndarray, eps: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dγ, dβ) of `y = x·inv·γ + β`: `dx = inv·(g − x̂·mean(g·x̂))`, `dγ = Σ dy·x̂`, `dβ = Σ dy`."""
    _, inv = row_inv_std(x, eps, center=False)
    with np.errstate(all="ignore"):
        xh = x * inv
        g = dy * gamma
        dx = inv * (g - xh * (g * xh).mean(axis=1, keepdims=True))
        return dx, (dy * xh).sum(axis=0), dy.sum(axis=0)


def _rows(arena: np.ndarray, t, *names: str) -> list[np.ndarray]:
    return [read_f64(arena, getattr(t, n), t.rows * t.h).reshape(t.rows, t.h) for n in names]


@reference(T.LayerNormBackwardInput)
def layer_norm_backward_input(arena: np.ndarray, t) -> None:
    """`dx = inv·(dy·γ − mean(dy·γ) − x̂·mean(dy·γ·x̂))` per row."""
    if t.rows * t.h:
        x, dy = _rows(arena, t, "x", "dy")
        write_f32(arena, t.dx, layer_norm_grads(x, read_f64(arena, t.gamma, t.h), dy, t.eps)[0])


@reference(T.LayerNormBackwardGamma)
def layer_norm_backward_gamma(arena: np.ndarray, t) -> None:
    """`dγ[j] = Σ_rows dy·x̂` (zeros for no rows)."""
    if t.h:
        x, dy = _rows(arena, t, "x", "dy")
        write_f32(arena, t.dgamma, layer_norm_grads(x, np.ones(t.h), dy, t.eps)[1])


@reference(T.RmsNormBackwardInput)
def rms_norm_backward_input(arena: np.ndarray, t) -> None:
    """`dx = inv·(dy·γ − x̂·mean(dy·γ·x̂))` per row (β does not enter)."""
    if t.rows * t.h:
        x, dy = _rows(arena, t, "x", "dy")
        write_f32(arena, t.dx, rms_norm_grads(x, read_f64(arena, t.gamma, t.h), dy, t.eps)[0])


@reference(T.RmsNormBackwardGamma)
def rms_norm_backward_gamma(arena: np.ndarray, t) -> None:
    """`dγ[j] = Σ_rows dy·x·inv`."""
    if t.h:
        x, dy = _rows(arena, t, "x", "dy")
        write_f32(arena, t.dgamma, rms_norm_grads(x, np.ones(t.h), dy, t.eps)[1])


@reference(T.RmsNormBackwardBeta)
def rms_norm_backward_beta(arena: np.ndarray, t) -> None:
    """`dβ[j] = Σ_rows dy`."""
    if t.h:
        (dy,) = _rows(arena, t, "dy")
        with np.errstate(all="ignore"):
            write_f32(arena, t.dbeta, dy.sum(axis=0))


def _bn(arena: np.ndarray, t, *names: str) -> list[np.ndarray]:
    return [read_f64(arena, getattr(t, n), t.count * t.channels).reshape(t.count, t.channels) for n in names]


def _bn_inv(arena: np.ndarray, t) -> np.ndarray:
    with np.errstate(all="ignore"):
        return 1.0 / np.sqrt(read_f64(arena, t.var, t.channels) + float(np.float32(t.eps)))


@reference(T.BatchNormInferenceBackwardInput)
def batch_norm_inference_backward_input(arena: np.ndarray, t) -> None:
    """`dx = γ[c]/√(var[c] + eps)·dy` (the statistics are constants in inference mode)."""
    if t.count * t.channels:
        (dy,) = _bn(arena, t, "dy")
        with np.errstate(all="ignore"):
            write_f32(arena, t.dx, dy * (read_f64(arena, t.gamma, t.channels) * _bn_inv(arena, t)))


@reference(T.BatchNormInferenceBackwardGamma)
def batch_norm_inference_backward_gamma(arena: np.ndarray, t) -> None:
    """`dγ[c] = Σ_i dy·(x − mean[c])/√(var[c] + eps)`."""
    if t.channels:
        x, dy = _bn(arena, t, "x", "dy")
        with np.errstate(all="ignore"):
            write_f32(arena, t.dgamma, (dy * ((x - read_f64(arena, t.mean, t.channels)) * _bn_inv(arena, t))).sum(axis=0))


@reference(T.BatchNormInferenceBackwardBeta)
def batch_norm_inference_backward_beta(arena: np.ndarray, t) -> None:
    """`dβ[c] = Σ_i dy[i, c]`."""
    if t.channels:
        (dy,) = _bn(arena, t, "dy")
        with np.errstate(all="ignore"):
            write_f32(arena, t.dbeta, dy.sum(axis=0))


def group_norm_grads(x: np.ndarray, gamma: np.ndarray, dy: np.ndarray, groups: int, eps: float
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dγ, dβ) of GroupNorm on float64 `[n, c, hw]`: two-pass block statistics as the forward;
    `dx = inv·(g − mean_blk(g) − x̂·mean_blk(g·x̂))`, g = dy·γ[c]; `dγ[c] = Σ dy·x̂`, `dβ[c] = Σ dy`."""
    n, c, hw = x.shape
    blk = lambda a: a.reshape(n * groups, -1)  # noqa: E731
    xh = normalize_rows(blk(x), eps, center=True, two_pass=True).reshape(n, c, hw)
    with np.errstate(all="ignore"):
        var = (blk(x) - blk(x).mean(axis=1, keepdims=True)) ** 2
        inv = 1.0 / np.sqrt(var.mean(axis=1, keepdims=True) + float(np.float32(eps)))
        g = blk(dy * gamma[None, :, None])
        dx = inv * (g - g.mean(axis=1, keepdims=True) - blk(xh) * (g * blk(xh)).mean(axis=1, keepdims=True))
        return dx.reshape(n, c, hw), (dy * xh).sum(axis=(0, 2)), dy.sum(axis=(0, 2))


def _nchw(arena: np.ndarray, t, name: str) -> np.ndarray:
    return read_f64(arena, getattr(t, name), t.elems).reshape(t.n, t.c, t.h * t.w)


@reference(T.GroupNormBackwardInput)
def group_norm_backward_input(arena: np.ndarray, t) -> None:
    """GroupNorm's input gradient (β does not enter)."""
    if t.elems:
        dx = group_norm_grads(_nchw(arena, t, "x"), read_f64(arena, t.gamma, t.c), _nchw(arena, t, "dy"),
                              t.num_groups, t.eps)[0]
        write_f32(arena, t.dx, dx)


@reference(T.GroupNormBackwardGamma)
def group_norm_backward_gamma(arena: np.ndarray, t) -> None:
    """`dγ[c] = Σ_{n, hw} dy·x̂` (zeros when n or h·w is 0)."""
    if t.c:
        if not t.elems:
            write_f32(arena, t.dgamma, np.zeros(t.c))
            return
        write_f32(arena, t.dgamma, group_norm_grads(_nchw(arena, t, "x"), np.ones(t.c), _nchw(arena, t, "dy"),
                                               t.num_groups, t.eps)[1])


@reference(T.GroupNormBackwardBeta)
def group_norm_backward_beta(arena: np.ndarray, t) -> None:
    """`dβ[c] = Σ_{n, hw} dy`."""
    if t.c:
        with np.errstate(all="ignore"):
            write_f32(arena, t.dbeta, _nchw(arena, t, "dy").sum(axis=(0, 2)) if t.elems else np.zeros(t.c))


# ── AdaLayerNorm / GatedResidual backward (packed outputs, per-row broadcast offsets) ──

def _slices(offs, h: int) -> np.ndarray:
    """`[rows, h]` element indices `offs[r] + j` into the modulation / gate buffer."""
    return np.asarray(offs, dtype=np.int64).reshape(-1, 1) + np.arange(h)


def ada_layer_norm_grads(x: np.ndarray, scale: np.ndarray, dy: np.ndarray, offs, eps: float, center: bool
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dscale, dshift) of `y = ŷ·(1 + scale[m + j]) + shift[m + j]`, ŷ the forward's two-pass
    LayerNorm (or RMS) without affine: `dx = inv·(g − mean(g) − ŷ·mean(g·ŷ))`, g = dy·(1 + scale[m + j]);
    `dscale[k] = Σ dy·ŷ`, `dshift[k] = Σ dy` over every (row, j) with `m_row + j = k` (rows sharing a
    slice add up, in row order; elements no row reads get 0)."""
    cols = _slices(offs, x.shape[1])
    eps = float(np.float32(eps))
    if not x.size:
        return x.copy(), np.zeros(scale.size), np.zeros(scale.size)
    with np.errstate(all="ignore"):
        if center:
            mu = x.mean(axis=1, keepdims=True)
            inv = 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=1, keepdims=True) + eps)
            xh = (x - mu) * inv
        else:
            inv = 1.0 / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps)
            xh = x * inv
        g = dy * (1.0 + scale[cols])
        v = g - xh * (g * xh).mean(axis=1, keepdims=True)
        dx = inv * (v - g.mean(axis=1, keepdims=True) if center else v)
        dscale, dshift = np.zeros(scale.size), np.zeros(scale.size)
        np.add.at(dscale, cols, dy * xh)
        np.add.at(dshift, cols, dy)
    return dx, dscale, dshift


@reference(T.AdaLayerNormBackward)
def ada_layer_norm_backward(arena: np.ndarray, t) -> None:
    """Packed `[dx ‖ dscale ‖ dshift]` (`shift` is not read)."""
    x, dy = _rows(arena, t, "x", "dy")
    dx, ds, dt = ada_layer_norm_grads(x, read_f64(arena, t.scale, t.mod_len), dy, t.mod_off, t.eps, t.layer_norm)
    write_f32(arena, t.dst, np.concatenate([dx.reshape(-1), ds, dt]))


def gated_residual_grads(y: np.ndarray, gate: np.ndarray, dy: np.ndarray, offs
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dy_in, dgate) of `out = x + gate[m + j]·y`: `dx = dy`, `d(y) = dy·gate[m + j]`,
    `dgate[k] = Σ dy·y` over every (row, j) with `m_row + j = k` (0 where no row reads)."""
    cols = _slices(offs, y.shape[1])
    dgate = np.zeros(gate.size)
    with np.errstate(all="ignore"):
        np.add.at(dgate, cols, dy * y)
        return dy.copy(), dy * gate[cols], dgate


@reference(T.GatedResidualBackward)
def gated_residual_backward(arena: np.ndarray, t) -> None:
    """Packed `[dx ‖ dy ‖ dgate]` (`x` is not read)."""
    y, dy = _rows(arena, t, "y", "dy")
    dx, dyy, dg = gated_residual_grads(y, read_f64(arena, t.gate, t.gate_len), dy, t.gate_off)
    write_f32(arena, t.dst, np.concatenate([dx.reshape(-1), dyy.reshape(-1), dg]))
