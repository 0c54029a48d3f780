"""NumPy references of convolution and pooling (semantics.md §3.7), computed in float64.

The 2-D kinds are their 3-D analogues with a depth of 1.  Convolutions skip out-of-range taps
(a padded tap contributes nothing even against an infinite or NaN weight); Max pooling follows
PyTorch (a NaN in the window gives NaN; a window entirely in the padding gives −inf); Mean pooling
sums the in-range taps and divides by the whole kernel volume (count_include_pad = True).
"""
from __future__ import annotations

import numpy as np

from ..ops import ReduceOp
from . import reference, view


def _dims(t, conv: bool) -> tuple:
    """(d, h, w), (d_out, h_out, w_out), kernel, stride, padding, dilation of a 2-D or 3-D kind."""
    three = hasattr(t, "kd")
    size = (t.d if three else 1, t.h, t.w)
    out = (t.d_out if three else 1, t.h_out, t.w_out)
    k = (t.kd if three else 1, t.kh, t.kw)
    s = (t.sd if three else 1, t.sh, t.sw)
    p = (t.pd if three else 0, t.ph, t.pw)
    dil = (t.dd if three else 1, t.dh, t.dw) if conv else (1, 1, 1)
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


@reference("Pool2D", "Pool3D")
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


@reference("Conv2D", "Conv3d")
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
