"""NumPy references of the quantization kinds Quantize, Dequantize, FakeQuantize and its backward, and
the LSQ trio (semantics.md §2.9, §3.8; docs/lowering-quantize.md).

Every kind views its `len` elements as `[outer, chan_dim, inner]` (channel `c = (i / inner) mod
chan_dim`).  Element-wise arithmetic is done in f32 as RLX does; rounding (half away from zero,
Rust's `f32::round`) is done in float64, where it is exact for every f32 value.
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from . import reference, view


def by_channel(arena: np.ndarray, t, offset: int, dtype=np.float32) -> np.ndarray:
    """The `len` elements at `offset` as a `[outer, chan_dim, inner]` view."""
    return view(arena, offset, dtype, t.len).reshape(-1, t.chan_dim, t.inner)


def per_channel(values) -> np.ndarray:
    """Per-channel values shaped `[1, chan_dim, 1]` to broadcast against `by_channel` arrays."""
    return np.asarray(values).reshape(1, -1, 1)


def round_half_away(v: np.ndarray) -> np.ndarray:
    """Round to nearest, ties away from zero (Rust `f32::round`), exactly, in float64."""
    v64 = v.astype(np.float64)
    return np.copysign(np.floor(np.abs(v64) + 0.5), v64)


@reference(T.Quantize)
def quantize(arena: np.ndarray, t: T.Quantize) -> None:
    """`q = clamp(round_half_away(x·f32(1/scale)) + zp, −128, 127)`; a NaN product gives `zp`."""
    x = by_channel(arena, t, t.x)
    with np.errstate(all="ignore"):
        inv = np.float32(1.0) / per_channel(np.float32(t.scales))
        v = x * inv
        zp = per_channel(np.int32(t.zero_points))
        q = np.where(np.isnan(v), zp, np.clip(round_half_away(v) + zp, -128, 127))
    by_channel(arena, t, t.q, np.int8)[:] = q.astype(np.int8)


@reference(T.Dequantize)
def dequantize(arena: np.ndarray, t: T.Dequantize) -> None:
    """`x = f32(q − zp)·scale`."""
    q = by_channel(arena, t, t.q, np.int8).astype(np.int32)
    centered = (q - per_channel(np.int32(t.zero_points))).astype(np.float32)
    by_channel(arena, t, t.x)[:] = centered * per_channel(np.float32(t.scales))
