"""ONNX signal ops: DFT (opset 17 and 20) and STFT, on the graph's c64 `fft` (one Fft1d).

ONNX stores a signal as `[..., n, 1]` (real) or `[..., n, 2]` (complex); the signal axis is moved last,
made c64, transformed and moved back.  ONNX's inverse DFT divides by n and its forward one does not scale,
which is pyrlx's "forward" norm (graph/fft.py).  Refused by name: non-f32 signals, a window whose length
differs from frame_length, onesided with an inverse transform.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import DType
from ..graph import Value
from .importer import Convert, Unsupported, converts


def _as_complex(cx: Convert, x: Value) -> Value:
    """`[..., 1 | 2]` f32 → c64 `[...]`."""
    if x.dtype != DType.F32:
        raise Unsupported(f"{x.dtype.value} signal (f32 only)")
    g, lead = cx.g, list(x.shape[:-1])
    re = g.reshape(g.narrow(x, -1, 0, 1), lead)
    if x.shape[-1] == 1:
        im = g.constant(np.zeros(lead, np.float32))
    elif x.shape[-1] == 2:
        im = g.reshape(g.narrow(x, -1, 1, 1), lead)
    else:
        raise Unsupported(f"last axis {x.shape[-1]} (1 for real, 2 for complex signals)")
    return g.complex(re, im)


def _as_pairs(cx: Convert, z: Value) -> Value:
    """c64 `[...]` → f32 `[..., 2]` (re, im)."""
    g, shape = cx.g, [*z.shape, 1]
    return g.concat([g.reshape(g.real(z), shape), g.reshape(g.imag(z), shape)], -1)


def _to_length(cx: Convert, z: Value, n: int) -> Value:
    """The last axis cut or zero-padded to `n`."""
    have = z.shape[-1]
    if n < have:
        return cx.g.narrow(z, -1, 0, n)
    if n > have:
        pad = np.zeros((*z.shape[:-1], n - have), np.float32)
        return cx.g.concat([z, cx.g.complex(cx.g.constant(pad), cx.g.constant(pad))], -1)
    return z


def _spectrum(cx: Convert, z: Value, inverse: bool, onesided: bool) -> Value:
    """ONNX's DFT of c64 rows: unscaled forward, 1/n inverse; the n//2 + 1 first bins when onesided."""
    if onesided and inverse:
        raise Unsupported("onesided with inverse is not supported")
    y = cx.g.fft(z, inverse=inverse, norm="forward")
    return cx.g.narrow(y, -1, 0, z.shape[-1] // 2 + 1) if onesided else y


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
    z = _as_complex(cx, x)
    perm = [i for i in range(z.ndim) if i != axis] + [axis]
    z = g.transpose(z, perm) if axis != z.ndim - 1 else z
    if cx.has(node, 1):
        z = _to_length(cx, z, int(cx.need_const(node, 1, "dft_length")))
    y = _as_pairs(cx, _spectrum(cx, z, inverse, onesided))
    if axis == x.ndim - 2:
        return [y]
    back = sorted(range(len(perm)), key=perm.__getitem__) + [len(perm)]
    return [g.transpose(y, back)]


@converts("STFT")
def _stft(cx: Convert, node) -> list:
    """Frames `signal[b, f·step : f·step + L]` times the window, each one DFT: `[batch, frames, bins, 2]`."""
    g = cx.g
    z = _as_complex(cx, cx.tensor(node.input[0]))                            # [batch, signal]
    step = int(cx.need_const(node, 1, "frame_step"))
    window = cx.tensor(node.input[2]) if cx.has(node, 2) else None
    length = int(cx.need_const(node, 3, "frame_length")) if cx.has(node, 3) else None
    if length is None and window is None:
        raise Unsupported("neither window nor frame_length is given")
    length = length if length is not None else window.shape[0]
    if window is not None and window.shape != (length,):
        raise Unsupported(f"window of shape {list(window.shape)} for frame_length {length}")
    frames = (z.shape[1] - length) // step + 1
    if frames < 1:
        raise Unsupported(f"frame_length {length} is longer than the signal ({z.shape[1]})")
    starts = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
    framed = g.gather(z, g.constant(starts.astype(np.int64)), axis=1)        # [batch, frames, L]
    if window is not None:
        w = g.reshape(window, [1, 1, length])
        framed = g.complex(g.real(framed) * w, g.imag(framed) * w)
    return [_as_pairs(cx, _spectrum(cx, framed, False, bool(cx.attr(node, "onesided", 1))))]
