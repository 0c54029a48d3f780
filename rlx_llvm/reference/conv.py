"""NumPy references of convolution and pooling (semantics.md §3.7), computed in float64.

The 2-D kinds are their 3-D analogues with a depth of 1.  Convolutions skip out-of-range taps
(a padded tap contributes nothing even against an infinite or NaN weight); Max pooling follows
PyTorch (a NaN in the window gives NaN; a window entirely in the padding gives −inf); Mean pooling
sums the in-range taps and divides by the whole kernel volume (count_include_pad = True).
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..ops import ReduceOp
from . import reference, view


def _dims(t, conv: bool, w_dilation: str = "dw", width: str = "w") -> tuple:
    """(d, h, w), (d_out, h_out, w_out), kernel, stride, padding, dilation of a 2-D or 3-D kind
    (`w_dilation`, `width` name the fields: the weight gradients call the width dilation `dw_dil`,
    the transposed convolutions the input width `w_in`)."""
    three = hasattr(t, "kd")
    size = (t.d if three else 1, t.h, getattr(t, width))
    out = (t.d_out if three else 1, t.h_out, t.w_out)
    k = (t.kd if three else 1, t.kh, t.kw)
    s = (t.sd if three else 1, t.sh, t.sw)
    p = (t.pd if three else 0, t.ph, t.pw)
    dil = (t.dd if three else 1, t.dh, getattr(t, w_dilation)) if conv else (1, 1, 1)
    return size, out, k, s, p, dil


def _taps(x: np.ndarray, size, out, k, s, p, dil, fill: float):
    """For every kernel tap `(a, b, c)`: the strided input slab `[..., od, oh, ow]` it reads (padding
    holds `fill`) and the mask of outputs for which the tap is inside the input."""
    xp = np.pad(x, [(0, 0)] * (x.ndim - 3) + [(q, q) for q in p], constant_values=fill)
    for tap in np.ndindex(*k):
        first = [t * d for t, d in zip(tap, dil)]
        sl = tuple(slice(f, f + st * (o - 1) + 1, st) for f, st, o in zip(first, s, out))
        inside = [(np.arange(o) * st + f - q >= 0) & (np.arange(o) * st + f - q < n)
                  for o, st, f, q, n in zip(out, s, first, p, size)]
        mask = inside[0][:, None, None] & inside[1][None, :, None] & inside[2][None, None, :]
        yield tap, xp[(Ellipsis, *sl)], mask


@reference(T.Pool2D, T.Pool3D)
def pool(arena: np.ndarray, t) -> None:
    """Max (NaN propagates, all-padding window −inf) or Mean (÷ kernel volume) pooling."""
    size, out, k, s, p, dil = _dims(t, conv=False)
    planes = t.n * t.c
    x = view(arena, t.src, np.float32, planes * int(np.prod(size))).astype(np.float64).reshape(planes, *size)
    is_max = t.kind is ReduceOp.Max
    acc = np.full((planes, *out), -np.inf if is_max else 0.0)
    if all(out):
        for _, slab, mask in _taps(x, size, out, k, s, p, dil, fill=0.0):
            if is_max:
                taken = mask & ((slab > acc) | np.isnan(slab))
                acc = np.where(taken, slab, acc)
            else:
                acc = acc + np.where(mask, slab, 0.0)
    if not is_max:
        acc = acc / float(np.prod(k))
    view(arena, t.dst, np.float32, acc.size)[:] = acc.reshape(-1).astype(np.float32)


@reference(T.Conv2D, T.Conv3d)
def conv(arena: np.ndarray, t) -> None:
    """Grouped convolution, weight `[c_out, c_in/groups, k…]`, out-of-range taps skipped."""
    size, out, k, s, p, dil = _dims(t, conv=True)
    g, cin_g, cout_g = t.groups, t.c_in // t.groups, t.c_out // t.groups
    x = view(arena, t.src, np.float32, t.n * t.c_in * int(np.prod(size))).astype(np.float64)
    x = x.reshape(t.n, g, cin_g, *size)
    w = view(arena, t.weight, np.float32, t.c_out * cin_g * int(np.prod(k))).astype(np.float64)
    w = w.reshape(g, cout_g, cin_g, *k)
    acc = np.zeros((t.n, g, cout_g, *out))
    if all(out) and cin_g:
        with np.errstate(invalid="ignore"):  # inf·0 and inf − inf in the input give NaN, as in f32
            for tap, slab, mask in _taps(x, size, out, k, s, p, dil, fill=0.0):
                part = np.einsum("goc,ngcdhw->ngodhw", w[(Ellipsis, *tap)], slab)
                acc = acc + np.where(mask, part, 0.0)
    view(arena, t.dst, np.float32, acc.size)[:] = acc.reshape(-1).astype(np.float32)


def _conv_transpose(x: np.ndarray, w: np.ndarray, size, out, k, s, p, dil) -> np.ndarray:
    """RLX's scatter in float64: `x[n, g, ic, i…]` adds `x·w[g, ic, oc, tap]` at `i·s + tap·dil − p`
    inside `out`; zero inputs are skipped (so `0·∞` contributes nothing)."""
    n, g, cin_g = x.shape[:3]
    cout_g = w.shape[2]
    ext = [max((a - 1) * st + (kk - 1) * d + 1, q + o, 1) for a, st, kk, d, q, o in zip(size, s, k, dil, p, out)]
    acc = np.zeros((n, g, cout_g, *ext))
    if all(size) and cin_g:
        finite = bool(np.isfinite(w).all())
        with np.errstate(invalid="ignore"):
            for tap in np.ndindex(*k):
                sl = tuple(slice(t * d, t * d + st * (a - 1) + 1, st) for t, d, st, a in zip(tap, dil, s, size))
                wt = w[(Ellipsis, *tap)]                                              # [g, cin_g, cout_g]
                if finite:
                    part = np.einsum("gco,ngcdhw->ngodhw", wt, x)
                else:
                    part = sum(np.where((x[:, :, c] != 0)[:, :, None], x[:, :, c, None] * wt[None, :, c, :, None, None, None], 0.0)
                               for c in range(cin_g))
                acc[(slice(None), slice(None), slice(None), *sl)] += part
    crop = tuple(slice(q, q + o) for q, o in zip(p, out))
    return acc[(slice(None), slice(None), slice(None), *crop)]


def _tdims(t, backward_input: bool) -> tuple:
    """Scattered size, output size, kernel, stride, padding, dilation of a transposed conv."""
    size, out, k, s, p, dil = _dims(t, conv=True, width="w_in")
    return (out, size, k, s, p, dil) if backward_input else (size, out, k, s, p, dil)


def _run_transpose(arena, src, weight, dst, n, cin, cout, groups, dims) -> None:
    size, out, k, s, p, dil = dims
    cin_g, cout_g = cin // groups, cout // groups
    x = view(arena, src, np.float32, n * cin * int(np.prod(size))).astype(np.float64).reshape(n, groups, cin_g, *size)
    w = view(arena, weight, np.float32, cin * cout_g * int(np.prod(k))).astype(np.float64)
    w = w.reshape(groups, cin_g, cout_g, *k)
    y = _conv_transpose(x, w, size, out, k, s, p, dil)
    view(arena, dst, np.float32, y.size)[:] = y.reshape(-1).astype(np.float32)


@reference(T.ConvTranspose2d, T.ConvTranspose3d)
def conv_transpose(arena: np.ndarray, t) -> None:
    """Weight `[c_in, c_out/groups, k…]`; output zeroed, then every nonzero input scattered."""
    _run_transpose(arena, t.src, t.weight, t.dst, t.n, t.c_in, t.c_out, t.groups, _tdims(t, False))


@reference(T.Conv2dBackwardInput, T.Conv3dBackwardInput)
def conv_backward_input(arena: np.ndarray, t) -> None:
    """`dx = conv_transpose(dy, w)` with the forward geometry (w `[c_out, c_in/groups, k…]`)."""
    _run_transpose(arena, t.dy, t.w, t.dx, t.n, t.c_out, t.c_in, t.groups, _tdims(t, True))


@reference(T.MaxPool2dBackward, T.MaxPool3dBackward)
def max_pool_backward(arena: np.ndarray, t) -> None:
    """dx zeroed; each dy added at the first arg-max of its window (the forward Max rule made
    first-wins for NaN: a NaN routes to the first NaN); an all-padding window routes nowhere."""
    size, out, k, s, p, dil = _dims(t, conv=False)
    planes = t.n * t.c
    x = view(arena, t.x, np.float32, planes * int(np.prod(size))).astype(np.float64).reshape(planes, *size)
    dy = view(arena, t.dy, np.float32, planes * int(np.prod(out))).astype(np.float64).reshape(planes, *out)
    dx = np.zeros((planes, int(np.prod(size))))
    if all(out) and all(size):
        best = np.full((planes, *out), -np.inf)
        where = np.full((planes, *out), -1, dtype=np.int64)
        grid = np.meshgrid(*[np.arange(o) for o in out], indexing="ij")
        for tap, slab, mask in _taps(x, size, out, k, s, p, dil, fill=0.0):
            pos = [g * st + tp - q for g, st, tp, q in zip(grid, s, tap, p)]
            flat = (pos[0] * size[1] + pos[1]) * size[2] + pos[2]
            take = mask & ((where < 0) | (slab > best) | (np.isnan(slab) & ~np.isnan(best)))
            best = np.where(take, slab, best)
            where = np.where(take, flat, where)
        for plane in range(planes):
            sel = where[plane].reshape(-1)
            ok = sel >= 0
            np.add.at(dx[plane], sel[ok], dy[plane].reshape(-1)[ok])
    view(arena, t.dx, np.float32, dx.size)[:] = dx.reshape(-1).astype(np.float32)


@reference(T.Conv2dBackwardWeight, T.Conv3dBackwardWeight)
def conv_backward_weight(arena: np.ndarray, t) -> None:
    """`dw[g, co, c, tap] = Σ_{n, out} dy·x` over the outputs whose tap is inside the input (padded taps skipped)."""
    size, out, k, s, p, dil = _dims(t, conv=True, w_dilation="dw_dil")
    g, cin_g, cout_g = t.groups, t.c_in // t.groups, t.c_out // t.groups
    x = view(arena, t.x, np.float32, t.n * t.c_in * int(np.prod(size))).astype(np.float64)
    x = x.reshape(t.n, g, cin_g, *size)
    dy = view(arena, t.dy, np.float32, t.n * t.c_out * int(np.prod(out))).astype(np.float64)
    dy = dy.reshape(t.n, g, cout_g, *out)
    dw = np.zeros((g, cout_g, cin_g, *k))
    if all(out) and cin_g and t.n:
        with np.errstate(invalid="ignore"):
            for tap, slab, mask in _taps(x, size, out, k, s, p, dil, fill=0.0):
                dw[(Ellipsis, *tap)] = np.einsum("ngodhw,ngcdhw->goc", np.where(mask, dy, 0.0),
                                                 np.where(mask, slab, 0.0))
    view(arena, t.dw, np.float32, dw.size)[:] = dw.reshape(-1).astype(np.float32)
