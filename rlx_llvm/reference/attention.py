"""NumPy float64 references of Attention, Rope (and RopeBackward), AxialRope2d, FusedSwiGLU (semantics.md §2.7, §3.4).

Inputs are read as f32 and everything is computed in float64, rounded to f32 once at the end.
Attention uses the schedule defaults for the Custom mask (`mask < 0.5` → score `-1e9`), the
order scaled dot → soft-cap → Custom overwrite → Bias add → Causal/Sliding overwrite → softmax,
and `kv_head = h // (heads / kv_heads)`.  The output is `[batch, seq, heads·v_head_dim]` in both
layouts.
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..ops import MaskKind
from ..thunks.base import strided
from . import read_f64, reference, view, write_f32

MASK_THRESHOLD = 0.5
MASK_NEG_INF = -1e9


def _heads(arena, off: int, t, seq: int, heads: int, dim: int, row_stride: int) -> np.ndarray:
    """Operand as float64 `[batch, heads, seq, dim]`."""
    bs = t.batch
    if t.bhsd:
        return read_f64(arena, off, bs * heads * seq * dim).reshape(bs, heads, seq, dim)
    flat = read_f64(arena, off, strided(bs * seq, row_stride, heads * dim))
    rows = np.arange(bs * seq)[:, None] * row_stride + np.arange(heads * dim)[None, :]
    return flat[rows].reshape(bs, seq, heads, dim).transpose(0, 2, 1, 3)


@reference(T.Attention)
def attention(arena: np.ndarray, t) -> None:
    """`softmax(mask(softcap(q·kᵀ·scale)))·v` per (batch, head)."""
    bs, s, kv, h, kvh = t.batch, t.seq, t.kv_seq, t.heads, t.kv_heads
    hd, dv = t.head_dim, t.v_head_dim
    out = view(arena, t.out, np.float32, bs * s * h * dv)
    if out.size == 0:
        return
    if kv == 0:
        out[:] = 0.0
        return
    q = _heads(arena, t.q, t, s, h, hd, t.q_row_stride)
    k = _heads(arena, t.k, t, kv, kvh, hd, t.k_row_stride)
    v = _heads(arena, t.v, t, kv, kvh, dv, t.v_row_stride)
    group = h // kvh
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scale = float(np.float32(t.scale))
    sc = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if t.softcap > 0:
        cap = float(np.float32(t.softcap))
        sc = cap * np.tanh(sc / cap)
    p = softmax_rows(apply_mask(arena, t, t.mask_kind, sc))
    with np.errstate(all="ignore"):
        y = np.einsum("bhqk,bhkd->bqhd", p, v)
    out[:] = y.reshape(-1).astype(np.float32)


def apply_mask(arena: np.ndarray, t, kind: MaskKind, sc: np.ndarray) -> np.ndarray:
    """Scores `[batch, heads, seq, kv_seq]` after Custom overwrite → Bias add → Causal/Sliding overwrite."""
    bs, s, kv, h = t.batch, t.seq, t.kv_seq, t.heads
    if kind == MaskKind.Custom:
        m = read_f64(arena, t.mask, bs * kv).reshape(bs, 1, 1, kv)
        sc = np.where(m < MASK_THRESHOLD, MASK_NEG_INF, sc)
    elif kind == MaskKind.Bias:
        sc = sc + read_f64(arena, t.mask, bs * h * s * kv).reshape(bs, h, s, kv)
    if kind == MaskKind.Causal or isinstance(kind, MaskKind.SlidingWindow):
        a = (kv - s) + np.arange(s)[:, None]
        kj = np.arange(kv)[None, :]
        ok = kj <= a
        if isinstance(kind, MaskKind.SlidingWindow):
            ok &= kj >= a - kind.w
        sc = np.where(ok, sc, MASK_NEG_INF)
    return sc


def softmax_rows(sc: np.ndarray) -> np.ndarray:
    """Softmax over the last axis."""
    with np.errstate(all="ignore"):
        e = np.exp(sc - np.nanmax(sc, axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


def rope_table_rows(t) -> np.ndarray:
    """Table row of every `[batch·seq]` row of x (per-token tables, or positions `s`)."""
    rows = np.arange(t.batch * t.seq)
    per_token = t.cos_row_stride and (t.cos_len // t.cos_row_stride == t.batch * t.seq) \
        and (t.cos_len // t.cos_row_stride != t.seq)
    return rows if per_token else rows % t.seq


@reference(T.Rope)
def rope(arena: np.ndarray, t) -> None:
    """NeoX halves or GPT-J pairs over the first `n_rot` dims of each head; the rest copied."""
    n, hd, r = t.batch * t.seq, t.head_dim, t.n_rot // 2
    if n * t.hidden == 0:
        return
    flat = read_f64(arena, t.src, strided(n, t.src_row_stride, t.hidden))
    idx = np.arange(n)[:, None] * t.src_row_stride + np.arange(t.hidden)[None, :]
    x = flat[idx].reshape(n, t.hidden // hd, hd)
    y = x.copy()
    if r:
        cos, sin = read_f64(arena, t.cos, t.cos_len), read_f64(arena, t.sin, t.cos_len)
        tab = rope_table_rows(t)[:, None] * t.cos_row_stride + np.arange(r)[None, :]
        c, s = cos[tab][:, None, :], sin[tab][:, None, :]
        if t.interleaved:
            x0, x1 = x[..., 0:2 * r:2], x[..., 1:2 * r:2]
            y[..., 0:2 * r:2] = x0 * c - x1 * s
            y[..., 1:2 * r:2] = x1 * c + x0 * s
        else:
            x0, x1 = x[..., :r], x[..., r:2 * r]
            y[..., :r] = x0 * c - x1 * s
            y[..., r:2 * r] = x1 * c + x0 * s
    view(arena, t.dst, np.float32, n * t.hidden)[:] = y.reshape(-1).astype(np.float32)


@reference(T.AxialRope2d)
def axial_rope_2d(arena: np.ndarray, t) -> None:
    """First-half pairs rotated by `x·f_c`, second-half pairs by `y·f_c` (f_c, angles in f32)."""
    n, hd = t.batch * t.seq, t.head_dim
    if n * t.hidden == 0:
        return
    q4 = hd // 4
    theta = np.float32(t.theta)
    f = np.array([np.float32(1.0 / (float(theta) ** (4.0 * c / hd))) for c in range(q4)], dtype=np.float32)
    pos = (np.arange(n) % t.seq) // t.repeat_factor
    px, py = (pos % t.end_x).astype(np.float32), (pos // t.end_x).astype(np.float32)
    x = read_f64(arena, t.src, n * t.hidden).reshape(n, t.num_heads, hd)
    y = x.copy()
    for half, p in ((0, px), (1, py)):
        ang = (p[:, None] * f[None, :]).astype(np.float64)[:, None, :]  # f32 product, as in-kernel
        c, s = np.cos(ang), np.sin(ang)
        o = half * (hd // 2)
        x0, x1 = x[..., o:o + 2 * q4:2], x[..., o + 1:o + 2 * q4:2]
        y[..., o:o + 2 * q4:2] = x0 * c - x1 * s
        y[..., o + 1:o + 2 * q4:2] = x1 * c + x0 * s
    view(arena, t.dst, np.float32, n * t.hidden)[:] = y.reshape(-1).astype(np.float32)


@reference(T.FusedSwiGLU)
def fused_swiglu(arena: np.ndarray, t) -> None:
    """`up · gate/(1 + e^−gate)` per row of `[up ‖ gate]` (swapped with `gate_first`)."""
    if t.total == 0:
        return
    n = t.n_half
    rows = t.total // n
    x = read_f64(arena, t.src, 2 * t.total).reshape(rows, 2, n)
    up, gate = (x[:, 1], x[:, 0]) if t.gate_first else (x[:, 0], x[:, 1])
    with np.errstate(all="ignore"):
        out = up * gate / (1.0 + np.exp(-gate))
    view(arena, t.dst, np.float32, t.total)[:] = out.reshape(-1).astype(np.float32)


@reference(T.RopeBackward)
def rope_backward(arena: np.ndarray, t) -> None:
    """The transpose of Rope: the same pairs rotated by −θ (`dx0 = dy0·c + dy1·s`, `dx1 = dy1·c − dy0·s`)."""
    n, hd, r = t.batch * t.seq, t.head_dim, t.n_rot // 2
    if n * t.hidden == 0:
        return
    dy = read_f64(arena, t.dy, n * t.hidden).reshape(n, t.hidden // hd, hd)
    dx = dy.copy()
    if r:
        cos, sin = read_f64(arena, t.cos, t.cos_len), read_f64(arena, t.sin, t.cos_len)
        tab = rope_table_rows(t)[:, None] * t.cos_row_stride + np.arange(r)[None, :]
        c, s = cos[tab][:, None, :], sin[tab][:, None, :]
        first, second = (slice(0, 2 * r, 2), slice(1, 2 * r, 2)) if t.interleaved else (slice(0, r), slice(r, 2 * r))
        y0, y1 = dy[..., first], dy[..., second]
        dx[..., first] = y0 * c + y1 * s
        dx[..., second] = y1 * c - y0 * s
    write_f32(arena, t.dx, dx)
