"""NumPy float64 references of FusedAttnBlock, FusedBertLayer and FusedNomicLayer (semantics.md §3.4).

Inputs are read as f32, everything is computed in float64 and rounded to f32 once at the end.
Weights are `[in, out]`; the Custom mask is `[batch, seq]` with `mask < 0.5` → score `-1e9`; the
scale is `dh^-0.5` (as f32); RoPE (FusedAttnBlock `has_rope`, FusedNomicLayer) uses table rows
`pos·dh/2` for the token's position within its sequence; LayerNorm uses RLX's one-pass variance (`normalize_rows`).
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..ops import MaskKind
from ..thunks.attention import mask_elems
from . import reference, view
from .attention import MASK_NEG_INF, MASK_THRESHOLD
from .norms import normalize_rows


def _f64(arena: np.ndarray, off: int, *shape: int) -> np.ndarray:
    return view(arena, off, np.float32, int(np.prod(shape))).astype(np.float64).reshape(shape)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """RoPE of `x[b, h, s, d]` with table rows `cos/sin[s, d/2]` (NeoX halves, or GPT-J pairs)."""
    r = x.shape[-1] // 2
    c, s = cos[None, None], sin[None, None]
    y = x.copy()
    if interleaved:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        y[..., 0::2], y[..., 1::2] = x0 * c - x1 * s, x1 * c + x0 * s
    else:
        x0, x1 = x[..., :r], x[..., r:]
        y[..., :r], y[..., r:] = x0 * c - x1 * s, x1 * c + x0 * s
    return y


def mha(qkv: np.ndarray, mask, kind, batch: int, seq: int, nh: int, dh: int, rope=None) -> np.ndarray:
    """`[m, 3hs]` → `[m, hs]`; `mask` float64 `[batch, seq]` (Custom), `[batch, nh, seq, seq]`
    (Bias, added to the scaled scores) or None; `rope` = (cos[seq, dh/2], sin[seq, dh/2],
    interleaved) applied to q and k.  Order as semantics.md §2.7: Custom → Bias → synthetic."""
    hs = nh * dh
    x = qkv.reshape(batch, seq, 3, nh, dh)
    q, k, v = (x[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # [b, h, s, d]
    if rope is not None:
        q, k = rotate(q, *rope), rotate(k, *rope)
    sc = np.einsum("bhqd,bhkd->bhqk", q, k) * float(np.float32(dh ** -0.5))
    q_pos, k_pos = np.arange(seq)[:, None], np.arange(seq)[None, :]
    if kind == MaskKind.Custom:
        sc = np.where(mask.reshape(batch, 1, 1, seq) < MASK_THRESHOLD, MASK_NEG_INF, sc)
    elif kind == MaskKind.Bias:
        sc = sc + mask.reshape(batch, nh, seq, seq)
    elif kind == MaskKind.Causal:
        sc = np.where(k_pos <= q_pos, sc, MASK_NEG_INF)
    elif isinstance(kind, MaskKind.SlidingWindow):
        sc = np.where((k_pos <= q_pos) & (k_pos >= q_pos - kind.w), sc, MASK_NEG_INF)
    e = np.exp(sc - sc.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bqhd", p, v).reshape(batch * seq, hs)


def _rope(arena: np.ndarray, t) -> tuple:
    """The first `seq` table rows (stride dh/2): position = token index within its sequence."""
    r = t.dh // 2
    return _f64(arena, t.cos, t.seq, r), _f64(arena, t.sin, t.seq, r), t.interleaved


def gelu_erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf   # on first use: importing scipy.special costs ~0.2 s (every worker's start)
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def layer_norm(v: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    return normalize_rows(v, eps, center=True, two_pass=False) * g + b


@reference(T.FusedAttnBlock)
def fused_attn_block(arena: np.ndarray, t) -> None:
    m, hs = t.batch * t.seq, t.hs
    out = view(arena, t.out, np.float32, m * t.out_dim)
    if out.size == 0:
        return
    qkv = _f64(arena, t.hidden, m, t.in_dim) @ _f64(arena, t.qkv_w, t.in_dim, 3 * hs)
    if t.has_bias:
        qkv = qkv + _f64(arena, t.qkv_b, 3 * hs)
    elems = mask_elems(t.mask_kind, t.batch, t.nh, t.seq, t.seq)
    mask = _f64(arena, t.mask, elems) if elems else None
    attn = mha(qkv, mask, t.mask_kind, t.batch, t.seq, t.nh, t.dh, _rope(arena, t) if t.has_rope else None) \
        if hs else np.zeros((m, 0))
    y = attn @ _f64(arena, t.out_w, hs, t.out_dim)
    if t.out_b != 0:
        y = y + _f64(arena, t.out_b, t.out_dim)
    out[:] = y.reshape(-1).astype(np.float32)


@reference(T.FusedBertLayer)
def fused_bert_layer(arena: np.ndarray, t) -> None:
    m, hs, inter = t.batch * t.seq, t.hs, t.int_dim
    out = view(arena, t.out, np.float32, m * hs)
    if out.size == 0:
        return
    vec = lambda off, n: _f64(arena, off, n)
    h = _f64(arena, t.hidden, m, hs)
    qkv = h @ _f64(arena, t.qkv_w, hs, 3 * hs) + vec(t.qkv_b, 3 * hs)
    attn = mha(qkv, _f64(arena, t.mask, t.batch, t.seq), MaskKind.Custom, t.batch, t.seq, t.nh, t.dh)
    r1 = attn @ _f64(arena, t.out_w, hs, hs) + h + vec(t.out_b, hs)
    n1 = layer_norm(r1, vec(t.ln1_g, hs), vec(t.ln1_b, hs), t.eps1)
    f = gelu_erf(n1 @ _f64(arena, t.fc1_w, hs, inter) + vec(t.fc1_b, inter))
    r2 = f @ _f64(arena, t.fc2_w, inter, hs) + n1 + vec(t.fc2_b, hs)
    out[:] = layer_norm(r2, vec(t.ln2_g, hs), vec(t.ln2_b, hs), t.eps2).reshape(-1).astype(np.float32)


@reference(T.FusedNomicLayer)
def fused_nomic_layer(arena: np.ndarray, t) -> None:
    m, hs, inter = t.batch * t.seq, t.hs, t.int_dim
    out = view(arena, t.out, np.float32, m * hs)
    if out.size == 0:
        return
    vec = lambda off, n: _f64(arena, off, n)
    h = _f64(arena, t.hidden, m, hs)
    qkv = h @ _f64(arena, t.qkv_w, hs, 3 * hs)
    attn = mha(qkv, _f64(arena, t.mask, t.batch, t.seq), MaskKind.Custom, t.batch, t.seq, t.nh, t.dh, _rope(arena, t))
    n1 = layer_norm(attn @ _f64(arena, t.out_w, hs, hs) + h, vec(t.ln1_g, hs), vec(t.ln1_b, hs), t.eps1)
    u = n1 @ _f64(arena, t.fc11_w, hs, 2 * inter)
    up, gate = u[:, :inter], u[:, inter:]
    y = up * gate / (1.0 + np.exp(-gate))
    r2 = y @ _f64(arena, t.fc2_w, inter, hs) + n1
    out[:] = layer_norm(r2, vec(t.ln2_g, hs), vec(t.ln2_b, hs), t.eps2).reshape(-1).astype(np.float32)
