"""NumPy references of the data-movement thunks (semantics.md §3.5; docs/lowering-movement.md).

Byte-generic kinds view their slots as unsigned integers of the element width (a 16-byte element
as two uint64 columns), so the oracle moves bit patterns exactly like the kernels do.
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from . import reference, view

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def elements(arena: np.ndarray, offset: int, nbytes: int, count: int) -> np.ndarray:
    """`count` elements of `nbytes` at `offset` as an array of shape (count,) or (count, k)."""
    if nbytes in _UINT:
        return view(arena, offset, _UINT[nbytes], count)
    return view(arena, offset, np.uint64, count * (nbytes // 8)).reshape(count, nbytes // 8)


@reference(T.Narrow)
def narrow(arena: np.ndarray, t) -> None:
    """Row `o`: `inner` elements from `src + o·src_stride` to `dst + o·dst_stride`."""
    eb = t.elem_bytes
    if t.src == t.dst:
        return
    for o in range(t.outer):
        s, d = t.src + o * t.src_stride * eb, t.dst + o * t.dst_stride * eb
        arena[d:d + t.inner * eb] = arena[s:s + t.inner * eb]


@reference(T.KvAppend)
def kv_append(arena: np.ndarray, t) -> None:
    """Row `o` of `src` lands at byte `(o·seq_cap + pos)·inner_bytes` of `dst`."""
    n = t.inner_bytes
    for o in range(t.outer):
        d = t.dst + (o * t.seq_cap + t.pos) * n
        arena[d:d + n] = arena[t.src + o * n:t.src + (o + 1) * n]


def walk_sources(dims, strides, in_total: int) -> np.ndarray:
    """Input element index of every output element (row-major), reduced mod `in_total` if needed."""
    grids = np.indices(tuple(dims), dtype=np.int64) if dims else np.zeros((0,), np.int64)
    src = np.zeros(tuple(dims), np.int64)
    for axis, s in enumerate(strides):
        src += grids[axis] * s
    src = src.reshape(-1)
    return src % in_total if src.size and src.max() >= in_total else src


@reference(T.Transpose, T.TransposeF64)
def transpose(arena: np.ndarray, t) -> None:
    """`dst[flat] = src[Σ coord_d · in_strides[d]]`, element bits copied."""
    eb = getattr(t, "elem_bytes", 8)
    total = int(np.prod(t.out_dims, dtype=np.int64))
    if total == 0:
        return
    src = elements(arena, t.src, eb, t.in_total)
    elements(arena, t.dst, eb, total)[...] = src[walk_sources(t.out_dims, t.in_strides, t.in_total)]


@reference(T.Reverse)
def reverse(arena: np.ndarray, t) -> None:
    """Flip the flagged axes."""
    eb = t.elem_bytes
    n = int(np.prod(t.dims, dtype=np.int64))
    if n == 0:
        return
    x = elements(arena, t.src, eb, n)
    x = x.reshape(tuple(t.dims) + x.shape[1:])
    flipped = np.flip(x, axis=tuple(a for a, f in enumerate(t.rev_mask) if f)) if any(t.rev_mask) else x
    elements(arena, t.dst, eb, n)[...] = flipped.reshape((n,) + x.shape[len(t.dims):])


@reference(T.Concat, T.ConcatF64)
def concat(arena: np.ndarray, t) -> None:
    """Output `[outer, total_axis·inner]`; input `i` fills its columns (broadcast when rank-deficient)."""
    eb = 8 if type(t).__name__ == "ConcatF64" else 4
    row = t.total_axis * t.inner
    out = elements(arena, t.dst, eb, t.outer * row).reshape(t.outer, row)
    col = 0
    for src, extent, numel in t.inputs:
        seg = extent * t.inner
        if seg and t.outer:
            if numel >= t.outer * seg:
                block = elements(arena, src, eb, t.outer * seg).reshape(t.outer, seg)
            elif numel == 1:
                block = np.broadcast_to(elements(arena, src, eb, 1), (t.outer, seg))
            else:  # rank-deficient: the first `seg` elements, repeated for every outer row
                block = np.broadcast_to(elements(arena, src, eb, seg), (t.outer, seg))
            out[:, col:col + seg] = block
        col += seg


@reference(T.ResizeNearest2x)
def resize_nearest_2x(arena: np.ndarray, t) -> None:
    """`y[p, 2i+a, 2j+b] = x[p, i, j]`."""
    planes = t.n * t.c
    x = view(arena, t.src, np.uint32, planes * t.h * t.w).reshape(planes, t.h, t.w)
    y = view(arena, t.dst, np.uint32, planes * 4 * t.h * t.w).reshape(planes, 2 * t.h, 2 * t.w)
    y[...] = x.repeat(2, axis=1).repeat(2, axis=2)


def nearest_map(size_in: int, size_out: int) -> np.ndarray:
    """`min(floor(o·in/out), in−1)` for every output coordinate `o`."""
    return np.minimum(np.arange(size_out, dtype=np.int64) * size_in // size_out, size_in - 1)


@reference(T.Interpolate3d)
def interpolate_3d(arena: np.ndarray, t) -> None:
    """Nearest NCDHW resample to `(d_out, h_out, w_out)`."""
    planes = t.n * t.c
    n_out = planes * t.d_out * t.h_out * t.w_out
    if n_out == 0 or 0 in (t.d_in, t.h_in, t.w_in):
        return
    x = view(arena, t.src, np.uint32, planes * t.d_in * t.h_in * t.w_in).reshape(planes, t.d_in, t.h_in, t.w_in)
    y = x[:, nearest_map(t.d_in, t.d_out)][:, :, nearest_map(t.h_in, t.h_out)][:, :, :, nearest_map(t.w_in, t.w_out)]
    view(arena, t.dst, np.uint32, n_out)[...] = y.reshape(-1)


@reference(T.Im2Col)
def im2col(arena: np.ndarray, t) -> None:
    """`col[m, (c·kh + i)·kw + j] = x[nb, c, oh·sh − ph + i·dh, ow·sw − pw + j·dw]`, 0 outside."""
    n = t.n or 1
    rows, k_len = n * t.h_out * t.w_out, t.c_in * t.kh * t.kw
    if rows == 0 or k_len == 0:
        return
    col = view(arena, t.col, np.uint32, rows * k_len).reshape(n, t.h_out, t.w_out, t.c_in, t.kh, t.kw)
    col[...] = 0
    if t.h == 0 or t.w == 0:
        return
    x = view(arena, t.x, np.uint32, n * t.c_in * t.h * t.w).reshape(n, t.c_in, t.h, t.w)
    ih = np.arange(t.h_out)[:, None] * t.sh - t.ph + np.arange(t.kh)[None, :] * t.dh      # [h_out, kh]
    iw = np.arange(t.w_out)[:, None] * t.sw - t.pw + np.arange(t.kw)[None, :] * t.dw_dil  # [w_out, kw]
    ok = (ih >= 0)[:, None, :, None] & (ih < t.h)[:, None, :, None] & (iw >= 0)[None, :, None, :] \
        & (iw < t.w)[None, :, None, :]                                                     # [h_out, w_out, kh, kw]
    ihc, iwc = np.clip(ih, 0, t.h - 1), np.clip(iw, 0, t.w - 1)
    g = x[:, :, ihc[:, None, :, None], iwc[None, :, None, :]]       # [n, c, h_out, w_out, kh, kw]
    g = np.where(ok[None, None], g, 0).transpose(0, 2, 3, 1, 4, 5)   # [n, h_out, w_out, c, kh, kw]
    col[...] = g
