"""ONNX signal ops: DFT (opset 17 and 20) and STFT, on the graph's `fft` (one Fft1d).

ONNX stores a signal as `[..., n, 1]` (real) or `[..., n, 2]` (complex); the signal axis is moved last,
the (re, im) parts are widened into f64 real-block rows `[re… im…]`, transformed and narrowed back, so the
result is f64-accurate before its f32 rounding (an f32 FFT misses ONNX's node tests' 1e-7 absolute
tolerance on near-zero bins).  ONNX's inverse DFT divides by n and its forward one does not scale,
which is pyrlx's "forward" norm (graph/fft.py).  An inverse onesided DFT is the real signal of the
conjugate-mirrored half spectrum (numpy.fft.irfft).  Refused by name: non-f32 signals, a window whose
length differs from frame_length.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import DType
from ..graph import Value
from .importer import Convert, Unsupported, converts


Parts = tuple[Value, Value]


def _parts(cx: Convert, x: Value) -> Parts:
    """`[..., 1 | 2]` f32 → (re, im) f32 `[...]` (im zeros for a real signal)."""
    if x.dtype != DType.F32:
        raise Unsupported(f"{x.dtype.value} signal (f32 only)")
    g, lead = cx.g, list(x.shape[:-1])
    re = g.reshape(g.narrow(x, -1, 0, 1), lead)
    if x.shape[-1] == 1:
        return re, g.constant(np.zeros(lead, np.float32))
    if x.shape[-1] == 2:
        return re, g.reshape(g.narrow(x, -1, 1, 1), lead)
    raise Unsupported(f"last axis {x.shape[-1]} (1 for real, 2 for complex signals)")


def _as_pairs(cx: Convert, parts: Parts) -> Value:
    """(re, im) `[...]` → f32 `[..., 2]`."""
    g = cx.g
    return g.concat([g.reshape(p, [*p.shape, 1]) for p in parts], -1)


def _to_length(cx: Convert, parts: Parts, n: int) -> Parts:
    """Both parts' last axis cut or zero-padded to `n`."""
    g, have = cx.g, parts[0].shape[-1]
    if n < have:
        return tuple(g.narrow(p, -1, 0, n) for p in parts)
    if n > have:
        pad = g.constant(np.zeros((*parts[0].shape[:-1], n - have), np.float32))
        return tuple(g.concat([p, pad], -1) for p in parts)
    return parts


def _mirrored(cx: Convert, parts: Parts, n: int) -> Parts:
    """The full n-point spectrum of a real signal from its first `n//2 + 1` bins (conjugate mirror)."""
    g, half = cx.g, n // 2 + 1
    re, im = (g.narrow(p, -1, 0, half) if p.shape[-1] != half else p for p in parts)
    mirror = g.constant(np.arange(n - half, 0, -1, dtype=np.int64))       # bins half … n−1 read bins n−k
    return g.concat([re, g.gather(re, mirror, -1)], -1), g.concat([im, -g.gather(im, mirror, -1)], -1)


def _dft_rows(cx: Convert, parts: Parts, inverse: bool) -> Parts:
    """ONNX's DFT along the last axis (unscaled forward, 1/n inverse), computed as f64 real-block rows."""
    g, n = cx.g, parts[0].shape[-1]
    y = g.fft(g.concat([g.cast(p, DType.F64) for p in parts], -1), inverse=inverse, norm="forward")
    return tuple(g.cast(g.narrow(y, -1, start, n), DType.F32) for start in (0, n))


def _spectrum(cx: Convert, parts: Parts, inverse: bool, onesided: bool, n: int | None) -> Parts:
    """The transform of rows of `n` points (None: as they are); onesided: the first n//2 + 1 bins of a forward
    transform, or the real signal of an inverse one from its half spectrum."""
    if onesided and inverse:
        n = n or 2 * (parts[0].shape[-1] - 1)
        re, _ = _dft_rows(cx, _mirrored(cx, parts, n), inverse=True)
        return (re,)
    if n is not None:
        parts = _to_length(cx, parts, n)
    y = _dft_rows(cx, parts, inverse)
    return tuple(cx.g.narrow(p, -1, 0, p.shape[-1] // 2 + 1) for p in y) if onesided else y


@converts("DFT")
def _dft(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    if cx.opset.get("", 17) >= 20:
        axis = int(cx.need_const(node, 2, "axis")) if cx.has(node, 2) else -2
    else:
        axis = int(cx.attr(node, "axis", 1))
    axis %= x.ndim
    if axis == x.ndim - 1:
        raise Unsupported("axis is the last (re, im) axis")
    inverse, onesided = bool(cx.attr(node, "inverse", 0)), bool(cx.attr(node, "onesided", 0))
    g = cx.g
    perm = [i for i in range(x.ndim - 1) if i != axis] + [axis]
    parts = tuple(g.transpose(p, perm) if axis != x.ndim - 2 else p for p in _parts(cx, x))
    n = int(cx.need_const(node, 1, "dft_length")) if cx.has(node, 1) else None
    y = _as_pairs(cx, _spectrum(cx, parts, inverse, onesided, n))
    if axis == x.ndim - 2:
        return [y]
    back = sorted(range(len(perm)), key=perm.__getitem__) + [len(perm)]
    return [g.transpose(y, back)]


@converts("STFT")
def _stft(cx: Convert, node) -> list:
    """Frames `signal[b, f·step : f·step + L]` times the window, each one DFT: `[batch, frames, bins, 2]`."""
    g = cx.g
    signal = _parts(cx, cx.tensor(node.input[0]))                            # [batch, signal] each
    step = int(cx.need_const(node, 1, "frame_step"))
    window = cx.tensor(node.input[2]) if cx.has(node, 2) else None
    length = int(cx.need_const(node, 3, "frame_length")) if cx.has(node, 3) else None
    if length is None and window is None:
        raise Unsupported("neither window nor frame_length is given")
    length = length if length is not None else window.shape[0]
    if window is not None and window.shape != (length,):
        raise Unsupported(f"window of shape {list(window.shape)} for frame_length {length}")
    frames = (signal[0].shape[1] - length) // step + 1
    if frames < 1:
        raise Unsupported(f"frame_length {length} is longer than the signal ({signal[0].shape[1]})")
    starts = g.constant((np.arange(frames)[:, None] * step + np.arange(length)[None, :]).astype(np.int64))
    framed = tuple(g.gather(p, starts, axis=1) for p in signal)             # [batch, frames, L]
    if window is not None:
        framed = tuple(p * g.reshape(window, [1, 1, length]) for p in framed)
    return [_as_pairs(cx, _spectrum(cx, framed, False, bool(cx.attr(node, "onesided", 1)), None))]
