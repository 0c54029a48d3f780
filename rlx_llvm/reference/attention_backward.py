"""NumPy float64 references of AttentionBackward and AttentionBackwardAll (semantics.md §3.4).

`P = softmax(mask(Q·Kᵀ/√D))` with the forward's mask helper (Custom overwrite → Bias add →
Causal/Sliding overwrite; defaults `mask < 0.5` → `-1e9`), then `dV = Pᵀ·dY`, `dP = dY·Vᵀ`,
`dS = P ⊙ (dP − rowsum(dP ⊙ P))`, `dQ = dS·K/√D`, `dK = dSᵀ·Q/√D`.  Q, dY, dQ are `[B, S, H, D]`
and K, V, dK, dV `[B, KV, H, D]` (or `[B, H, ·, D]` with `bhsd`); `heads` K/V heads (no GQA).
An AttentionBackward with `mask = 0` has no mask buffer: Custom and Bias then mask nothing.
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..ops import AttentionBwdWrt, MaskKind
from . import reference, write_f32
from .attention import _heads, apply_mask, softmax_rows


def effective_mask(t) -> MaskKind:
    """The mask kind applied: Custom/Bias without a mask buffer mask nothing."""
    if t.mask_kind in (MaskKind.Custom, MaskKind.Bias) and not t.mask_present:
        return MaskKind.None_
    return t.mask_kind


def score_scale(t) -> float:
    """`1/√head_dim`, rounded to f32 as the kernel uses it."""
    return float(np.float32(t.head_dim ** -0.5)) if t.head_dim else 1.0


def gradients(arena: np.ndarray, t) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) as float64 `[batch, heads, rows, head_dim]`."""
    s, kv, h, hd = t.seq, t.kv_seq, t.heads, t.head_dim
    q, dy = (_heads(arena, off, t, s, h, hd, h * hd) for off in (t.q, t.dy))
    k, v = (_heads(arena, off, t, kv, h, hd, h * hd) for off in (t.k, t.v))
    if not (s and kv):  # no scores: every gradient is 0
        return np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    scale = score_scale(t)
    p = softmax_rows(apply_mask(arena, t, effective_mask(t), np.einsum("bhqd,bhkd->bhqk", q, k) * scale))
    dp = np.einsum("bhqd,bhkd->bhqk", dy, v)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return (np.einsum("bhqk,bhkd->bhqd", ds, k) * scale, np.einsum("bhqk,bhqd->bhkd", ds, q) * scale,
            np.einsum("bhqk,bhqd->bhkd", p, dy))


def _write(arena: np.ndarray, off: int, t, x: np.ndarray) -> None:
    """`x` `[batch, heads, rows, head_dim]` in the thunk's layout."""
    write_f32(arena, off, x if t.bhsd else x.transpose(0, 2, 1, 3))


@reference(T.AttentionBackward)
def attention_backward(arena: np.ndarray, t) -> None:
    """The one gradient `wrt` names."""
    dq, dk, dv = gradients(arena, t)
    _write(arena, t.out, t, {AttentionBwdWrt.Query: dq, AttentionBwdWrt.Key: dk, AttentionBwdWrt.Value: dv}[t.wrt])


@reference(T.AttentionBackwardAll)
def attention_backward_all(arena: np.ndarray, t) -> None:
    """dQ, dK and dV."""
    for off, x in zip((t.out_q, t.out_k, t.out_v), gradients(arena, t)):
        _write(arena, off, t, x)
