"""NumPy references of the quantization kinds Quantize, Dequantize, FakeQuantize and its backward, and
the LSQ trio (semantics.md §2.9, §3.8; docs/lowering-quantize.md).

Every kind views its `len` elements as `[outer, chan_dim, inner]` (channel `c = (i / inner) mod
chan_dim`).  Element-wise arithmetic is done in f32 as RLX does; rounding (half away from zero,
Rust's `f32::round`) is done in float64, where it is exact for every f32 value.
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..ops import ScaleMode, SteKind
from . import reference, view

Q_MAX = {8: 127.0, 4: 7.0, 2: 1.0}
MIN_SCALE = np.float32(1e-12)


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


def clamp_keep_nan(v: np.ndarray, q_max: float) -> np.ndarray:
    """Rust `f32::clamp(v, −q_max, q_max)`: NaN stays NaN."""
    return np.where(v < -q_max, -q_max, np.where(v > q_max, q_max, v))


def batch_scale(x: np.ndarray, bits: int) -> np.ndarray:
    """Per channel `max(maxabs/q_max, 1e-12)` in f32, NaN ignored (Rust `f32::max`), shaped `[1, C, 1]`."""
    maxabs = np.fmax.reduce(np.abs(x), axis=(0, 2), initial=np.float32(0.0)).astype(np.float32)
    return per_channel(np.fmax(maxabs / np.float32(Q_MAX[bits]), MIN_SCALE))


def tracked_scale(arena: np.ndarray, t: T.FakeQuantize, x: np.ndarray) -> np.ndarray:
    """FakeQuantize's per-channel scale under its ScaleMode; EMA writes the blended state back."""
    mode = t.scale_mode
    if mode == ScaleMode.PerBatch:
        return batch_scale(x, t.bits)
    state = view(arena, t.state_off, np.float32, t.chan_dim)
    if mode == ScaleMode.Fixed:
        return per_channel(np.fmax(state, MIN_SCALE))
    current = batch_scale(x, t.bits).reshape(-1)
    decay = np.float32(mode.decay)
    blended = decay * state + (np.float32(1.0) - decay) * current
    state[:] = np.where(state <= 0, current, blended)
    return per_channel(state.copy())


def fake_quantized(x: np.ndarray, s: np.ndarray, bits: int) -> np.ndarray:
    """`clamp(round_half_away(x/s), ±q_max)·s` in f32."""
    return clamp_keep_nan(round_half_away(x / s), Q_MAX[bits]).astype(np.float32) * s


@reference(T.FakeQuantize)
def fake_quantize(arena: np.ndarray, t: T.FakeQuantize) -> None:
    """Per-channel scale (PerBatch / EMA / Fixed), then quantize-dequantize."""
    x = by_channel(arena, t, t.x).copy()
    with np.errstate(all="ignore"):
        out = fake_quantized(x, tracked_scale(arena, t, x), t.bits)
    by_channel(arena, t, t.out)[:] = out


def ste_factor(ste: SteKind, x: np.ndarray, s: np.ndarray, bits: int) -> np.ndarray:
    """The straight-through `d out/d x` (semantics.md §2.9); f32 except Tanh (float64 tanh)."""
    q_max = np.float32(Q_MAX[bits])
    if ste is SteKind.Identity:
        return np.ones_like(x)
    if ste is SteKind.ClippedIdentity:
        return (np.abs(x) <= q_max * s).astype(np.float32)
    if ste is SteKind.Tanh:
        return 1.0 - np.tanh((x / s).astype(np.float64)) ** 2
    return np.fmax(np.float32(0.0), np.float32(1.0) - np.abs(x / (q_max * s)))


@reference(T.FakeQuantizeBackward)
def fake_quantize_backward(arena: np.ndarray, t: T.FakeQuantizeBackward) -> None:
    """`dx = dy·ste(x, s)`, `s` the forward's PerBatch scale."""
    x, dy = by_channel(arena, t, t.x), by_channel(arena, t, t.dy)
    with np.errstate(all="ignore"):
        dx = dy if t.ste is SteKind.Identity else dy * ste_factor(t.ste, x, batch_scale(x, t.bits), t.bits)
    by_channel(arena, t, t.dx)[:] = dx.astype(np.float32)


def lsq_scale(arena: np.ndarray, t) -> np.ndarray:
    """LSQ's per-channel `max(scale, 1e-12)` (a NaN scale gives 1e-12), shaped `[1, C, 1]`."""
    return per_channel(np.fmax(view(arena, t.scale_off, np.float32, t.chan_dim), MIN_SCALE))


@reference(T.FakeQuantizeLSQ)
def fake_quantize_lsq(arena: np.ndarray, t: T.FakeQuantizeLSQ) -> None:
    """FakeQuantize with the learned scale."""
    with np.errstate(all="ignore"):
        out = fake_quantized(by_channel(arena, t, t.x), lsq_scale(arena, t), t.bits)
    by_channel(arena, t, t.out)[:] = out


@reference(T.FakeQuantizeLSQBackwardX)
def fake_quantize_lsq_backward_x(arena: np.ndarray, t: T.FakeQuantizeLSQBackwardX) -> None:
    """`dx = dy·[|x/s| ≤ q_max]`."""
    with np.errstate(all="ignore"):
        inside = np.abs(by_channel(arena, t, t.x) / lsq_scale(arena, t)) <= np.float32(Q_MAX[t.bits])
        dx = by_channel(arena, t, t.dy) * inside.astype(np.float32)
    by_channel(arena, t, t.dx)[:] = dx


def lsq_psi(z: np.ndarray, q_max: float) -> np.ndarray:
    """`ψ(z) = round(z) − z` for `|z| ≤ q_max`, `sign(z)·q_max` beyond (float64; NaN stays NaN)."""
    z64 = z.astype(np.float64)
    return np.where(np.abs(z64) > q_max, np.copysign(q_max, z64), round_half_away(z) - z64)


@reference(T.FakeQuantizeLSQBackwardScale)
def fake_quantize_lsq_backward_scale(arena: np.ndarray, t: T.FakeQuantizeLSQBackwardScale) -> None:
    """`dscale[c] = Σ ψ(x/s[c])·dy` over channel `c`: each term an f32 product (as RLX's, so one that
    overflows is ±inf and meets an infinite term as NaN), summed in float64."""
    with np.errstate(all="ignore"):
        z = by_channel(arena, t, t.x) / lsq_scale(arena, t)
        terms = lsq_psi(z, Q_MAX[t.bits]).astype(np.float32) * by_channel(arena, t, t.dy)
        total = terms.sum(axis=(0, 2), dtype=np.float64)
        view(arena, t.dscale, np.float32, t.chan_dim)[:] = total.astype(np.float32)
