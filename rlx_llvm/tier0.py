"""Tier 0: a schedule run by NumPy, in float32, while its native code compiles (docs/compile.md).

The NumPy references (`rlx_llvm.reference`) compute in float64 for clarity: MiniLM's six
FusedBertLayers take ~225 ms there at 1×128.  Here the kinds that carry a model's work have float32
versions that keep the reference's order of operations (the same math, with the float32 rounding
the native code has) — MiniLM 1×128 in ~80 ms at one thread with no compile at all — and every other kind runs its
reference.  The results differ from the native code's in the last bits (BLAS sums in another order),
within the tolerances the tests give those kinds; a caller that asks for tier 0 accepts that, as it
does for the quick tier.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from scipy.special import erf

from . import reference
from . import thunks as T
from .reference import view
from .reference.attention import MASK_NEG_INF, MASK_THRESHOLD
from .reference.fused_layers import layer_norm

FAST: dict[type, Callable] = {}
"""Float32 versions of the heavy kinds, by thunk class: `fn(arena: np.ndarray[uint8], thunk)`."""


def _f32(arena: np.ndarray, offset: int, *shape: int) -> np.ndarray:
    return view(arena, offset, np.float32, int(np.prod(shape))).reshape(shape)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """`x·Φ(x)` in float32."""
    return np.float32(0.5) * x * (np.float32(1.0) + erf(x * np.float32(np.sqrt(0.5))))


def attention(qkv: np.ndarray, mask: np.ndarray, batch: int, seq: int, nh: int, dh: int) -> np.ndarray:
    """`[m, 3hs]` → `[m, hs]` with the Custom `[batch, seq]` mask (keys with mask < 0.5 get −1e9), as
    the reference's `mha` computes it, by batched matrix products in float32."""
    x = qkv.reshape(batch, seq, 3, nh, dh)
    q, k, v = (x[:, :, i].transpose(0, 2, 1, 3) for i in range(3))   # [b, h, s, d]
    scores = (q @ k.transpose(0, 1, 3, 2)) * np.float32(dh ** -0.5)
    scores = np.where(mask.reshape(batch, 1, 1, seq) < MASK_THRESHOLD, np.float32(MASK_NEG_INF), scores)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return ((e / e.sum(axis=-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(batch * seq, nh * dh)


def fused_bert_layer(arena: np.ndarray, t) -> None:
    """The FusedBertLayer reference's steps, in float32."""
    m, hs, inter = t.batch * t.seq, t.hs, t.int_dim
    out = view(arena, t.out, np.float32, m * hs)
    if out.size == 0:
        return
    h = _f32(arena, t.hidden, m, hs).copy()   # `out` may be `hidden`'s neighbour: read it before writing
    qkv = h @ _f32(arena, t.qkv_w, hs, 3 * hs) + _f32(arena, t.qkv_b, 3 * hs)
    attn = attention(qkv, _f32(arena, t.mask, t.batch, t.seq), t.batch, t.seq, t.nh, t.dh)
    r1 = attn @ _f32(arena, t.out_w, hs, hs) + h + _f32(arena, t.out_b, hs)
    n1 = layer_norm(r1, _f32(arena, t.ln1_g, hs), _f32(arena, t.ln1_b, hs), t.eps1)
    f = gelu_erf(n1 @ _f32(arena, t.fc1_w, hs, inter) + _f32(arena, t.fc1_b, inter))
    r2 = f @ _f32(arena, t.fc2_w, inter, hs) + n1 + _f32(arena, t.fc2_b, hs)
    out[:] = layer_norm(r2, _f32(arena, t.ln2_g, hs), _f32(arena, t.ln2_b, hs), t.eps2).reshape(-1)


FAST[T.FusedBertLayer] = fused_bert_layer


def run(schedule, arena) -> None:
    """Execute `schedule` on `arena` (an Arena or its bytes): the float32 kinds here, the rest by reference."""
    buf = arena.bytes if hasattr(arena, "bytes") else arena
    rng = getattr(schedule, "rng", None)
    for t in schedule.thunks:
        fast = FAST.get(type(t))
        if fast is not None:
            fast(buf, t)
        else:
            reference.run_thunk(buf, t, rng)
