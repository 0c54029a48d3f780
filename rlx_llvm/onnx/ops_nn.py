"""ONNX convolution, pooling and normalization: Conv, ConvTranspose, MaxPool, AveragePool, LpPool, Global*Pool,
BatchNormalization (inference), InstanceNormalization, GroupNormalization, RMSNormalization,
LpNormalization, MeanVarianceNormalization.

1-D ops run as 2-D ones over an `h = 1` image.  Asymmetric pads (explicit or `auto_pad=SAME_*`) run
with the larger pad on both sides and narrow the output to the windows ONNX asks for.  Pooling over three
spatial axes, with dilations, or with MaxPool's Indices output gathers every window's taps from the padded,
flattened input by constant indices and reduces over them (`_pooled_by_gather`); the others use Pool2D.
"""
from __future__ import annotations

import math

import numpy as np

from ..dtypes import DType
from ..graph import Value
from .importer import Convert, Unsupported, converts, in_f32
from .ops_math import _float


# ── geometry ────────────────────────────────────────────────────────────────

def _spatial(cx: Convert, node, x: Value, kernel: list[int]) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """(strides, dilations, [(begin, end) pads]) per spatial axis, auto_pad resolved."""
    n = len(kernel)
    strides = list(cx.attr(node, "strides", [1] * n))
    dil = list(cx.attr(node, "dilations", [1] * n))
    auto = cx.attr(node, "auto_pad", "NOTSET")
    sizes = x.shape[2:]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for size, k, s, d in zip(sizes, kernel, strides, dil):
            total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
            small = total // 2
            pads.append((small, total - small) if auto == "SAME_UPPER" else (total - small, small))
    elif auto == "VALID":
        pads = [(0, 0)] * n
    else:
        flat = list(cx.attr(node, "pads", [0] * 2 * n))
        pads = list(zip(flat[:n], flat[n:]))
    return strides, dil, pads


def _as_2d(cx: Convert, x: Value, what: str) -> tuple[Value, bool]:
    """`x` as NCHW (a 1-D `[n, c, w]` gets h = 1); Unsupported beyond two spatial dims."""
    if x.ndim == 3:
        return cx.g.reshape(x, [x.shape[0], x.shape[1], 1, x.shape[2]]), True
    if x.ndim != 4:
        raise Unsupported(f"{what} over {x.ndim - 2} spatial dims (1-D and 2-D are lowered)")
    return x, False


def _pair(values: list[int], one_d: bool, fill: int) -> tuple[int, int]:
    return (fill, values[0]) if one_d else (values[0], values[1])


def _even_pads(cx: Convert, x: Value, pads: list[tuple[int, int]], fill: float) -> tuple[Value, list[int]]:
    """Pad the end of each spatial axis with `fill` where ONNX pads it more than the start; the start pads."""
    for axis, (b, e) in enumerate(pads, start=x.ndim - len(pads)):
        if e > b:
            block = np.full((*x.shape[:axis], e - b, *x.shape[axis + 1:]), fill, np.float32)
            x = cx.g.concat([x, cx.g.constant(block)], axis)
    return x, [b for b, _ in pads]


def _windowed(cx: Convert, y: Value, counts: list[int]) -> Value:
    """The first `counts` windows along each spatial axis (symmetric padding makes extra ones at the end)."""
    for axis, n_out in enumerate(counts, start=y.ndim - len(counts)):
        if n_out != y.shape[axis]:
            y = cx.g.narrow(y, axis, 0, n_out)
    return y


def _out_count(size: int, k: int, s: int, d: int, pad: tuple[int, int], ceil: bool = False) -> int:
    span = (k - 1) * d + 1
    n = (size + pad[0] + pad[1] - span) / s
    n = math.ceil(n) if ceil else math.floor(n)
    if ceil and n * s >= size + pad[0]:      # a last window that starts in the end padding is dropped
        n -= 1
    return int(n) + 1


# ── convolution ─────────────────────────────────────────────────────────────

def _baked(cx: Convert, node, i: int) -> Value:
    """Input `i` (a weight or bias) as a baked constant when known at import time — the graph passes can then
    repack it once (graph/fuse_conv.py) — else as the graph value it is."""
    value = cx.const(node.input[i])
    if value is None or np.asarray(value).dtype != np.float32:
        return _float(cx, node, i)
    return cx.g.constant(np.asarray(value))


def _operands(cx: Convert, node) -> tuple[Value, Value, Value, Value, bool]:
    """Input and weight as given and as NCHW, and whether the op is 1-D."""
    x0, w0 = _float(cx, node, 0), _baked(cx, node, 1)
    x, one_d = _as_2d(cx, x0, node.op_type)
    return x0, w0, x, _as_2d(cx, w0, node.op_type)[0], one_d


@converts("Conv")
@in_f32
def _conv(cx: Convert, node) -> list:
    g = cx.g
    x0, w0, x, w, one_d = _operands(cx, node)
    kernel = list(cx.attr(node, "kernel_shape", w0.shape[2:]))
    strides, dil, pads = _spatial(cx, node, x0, kernel)
    counts = [_out_count(sz, k, s, d, p) for sz, k, s, d, p in zip(x0.shape[2:], kernel, strides, dil, pads)]
    if one_d:
        strides, dil, pads = [1, *strides], [1, *dil], [(0, 0), *pads]
    x, begin = _even_pads(cx, x, pads, 0.0)
    y = g.conv2d(x, w, None, stride=tuple(strides), padding=tuple(begin), dilation=tuple(dil),
                 groups=int(cx.attr(node, "group", 1)))
    y = _windowed(cx, y, counts)
    if cx.has(node, 2):
        y = y + g.reshape(_baked(cx, node, 2), [y.shape[1], 1, 1])
    return [g.reshape(y, [*y.shape[:2], y.shape[3]]) if one_d else y]


@converts("ConvTranspose")
@in_f32
def _conv_transpose(cx: Convert, node) -> list:
    g = cx.g
    x0, w0 = _float(cx, node, 0), _baked(cx, node, 1)
    n_sp = x0.ndim - 2
    kernel = list(cx.attr(node, "kernel_shape", w0.shape[2:]))
    strides = list(cx.attr(node, "strides", [1] * n_sp))
    dil = list(cx.attr(node, "dilations", [1] * n_sp))
    out_pad = list(cx.attr(node, "output_padding", [0] * n_sp))
    full = [(i - 1) * s + (k - 1) * d + 1 + op for i, s, k, d, op in zip(x0.shape[2:], strides, kernel, dil, out_pad)]
    out_shape = cx.attr(node, "output_shape")
    auto = cx.attr(node, "auto_pad", "NOTSET")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        want = list(out_shape)[-n_sp:] if out_shape is not None else [i * s for i, s in zip(x0.shape[2:], strides)]
        full = [max(f, o) for f, o in zip(full, want)]        # a larger output_shape pads the end with zeros
        totals = [f - o for f, o in zip(full, want)]
        lower_first = auto == "SAME_LOWER"
        pads = [((t + 1) // 2, t // 2) if lower_first else (t // 2, t - t // 2) for t in totals]
    elif auto == "VALID":
        pads = [(0, 0)] * n_sp
    else:
        flat = list(cx.attr(node, "pads", [0] * 2 * n_sp))
        pads = list(zip(flat[:n_sp], flat[n_sp:]))
    group = int(cx.attr(node, "group", 1))
    c_out = w0.shape[1] * group
    if n_sp == 3:
        y = _transposed_3d(g, x0, w0, strides, dil, full, group)
    else:
        (x, one_d), (w, _) = _as_2d(cx, x0, node.op_type), _as_2d(cx, w0, node.op_type)
        y = _transposed_nchw(g, x, w, _pair(strides, one_d, 1), _pair(dil, one_d, 1), [1, *full] if one_d else full,
                             group)
    for axis, ((b, e), f) in enumerate(zip(pads, full), start=y.ndim - n_sp):
        if b or e:
            y = g.narrow(y, axis, b, f - b - e)
    if cx.has(node, 2):
        y = y + g.reshape(_float(cx, node, 2), [c_out] + [1] * (y.ndim - 2))
    return [g.reshape(y, [*y.shape[:2], y.shape[3]]) if n_sp == 1 else y]


def _transposed_nchw(g, x: Value, w: Value, strides, dil, full: list[int], group: int) -> Value:
    """ConvTranspose of NCHW `x` by `[c_in, c_out / group, kh, kw]` `w` to the unpadded `full` size (the
    input-gradient of a convolution)."""
    from ..graph.backward import conv2d_backward
    like = g.constant(np.zeros((x.shape[0], w.shape[1] * group, *full), np.float32))
    conv = {"stride": tuple(strides), "padding": (0, 0), "dilation": tuple(dil), "groups": group}
    return conv2d_backward(g, "input", x, w, like, conv)


def _transposed_3d(g, x: Value, w: Value, strides, dil, full: list[int], group: int) -> Value:
    """3-D ConvTranspose from 2-D ones: depth slices ride in the batch, one 2-D transpose per kernel depth kd,
    and a 0/1 placement matrix sums slice i of tap kd into output depth i·stride + kd·dilation."""
    n, _, depth = x.shape[:3]
    taps = w.shape[2]
    x2 = g.reshape(g.transpose(x, [0, 2, 1, 3, 4]), [n * depth, x.shape[1], *x.shape[3:]])
    slabs = []
    for kd in range(taps):
        wk = g.reshape(g.narrow(w, 2, kd, 1), [w.shape[0], w.shape[1], *w.shape[3:]])
        slabs.append(g.reshape(_transposed_nchw(g, x2, wk, strides[1:], dil[1:], full[1:], group), [n, depth, -1]))
    place = np.zeros((full[0], taps * depth), np.float32)
    for kd in range(taps):
        place[np.arange(depth) * strides[0] + kd * dil[0], kd * depth + np.arange(depth)] = 1.0
    y = g.matmul(g.constant(np.broadcast_to(place, (n, *place.shape)).copy()), g.concat(slabs, 1))
    c_out = w.shape[1] * group
    return g.transpose(g.reshape(y, [n, full[0], c_out, *full[1:]]), [0, 2, 1, 3, 4])


# ── pooling ─────────────────────────────────────────────────────────────────

@converts("MaxPool", "AveragePool", "LpPool")
def _pool(cx: Convert, node) -> list:
    g = cx.g
    x0 = cx.tensor(node.input[0])
    if node.op_type == "MaxPool" and x0.dtype in SMALL_INTEGERS:    # exact in f32: max-pool there, cast back
        y, *indices = _pool_float(cx, node, g.cast(x0, DType.F32))
        return [g.cast(y, x0.dtype), *indices]
    return _pool_float(cx, node, _float(cx, node))


SMALL_INTEGERS = (DType.I8, DType.U8, DType.I16)


def _pool_float(cx: Convert, node, x0: Value) -> list:
    """The pooled float tensor (and MaxPool's Indices output when the node asks for it)."""
    g = cx.g
    indices = len(node.output) > 1 and bool(node.output[1])
    column_major = bool(cx.attr(node, "storage_order", 0))      # only the Indices depend on it
    lp = float(cx.attr(node, "p", 2))
    if node.op_type == "LpPool":                      # (Σ |x|^p)^(1/p): a window sum of |x|^p
        x0 = g.pow(g.activation("abs", x0), g.constant(lp))
    kernel = list(cx.attr(node, "kernel_shape"))
    strides, dil, pads = _spatial(cx, node, x0, kernel)
    ceil = bool(cx.attr(node, "ceil_mode", 0))
    sizes, given = list(x0.shape[2:]), pads
    counts = [_out_count(sz, k, s, d, p, ceil) for sz, k, s, d, p in zip(sizes, kernel, strides, dil, pads)]
    # the end pad that makes the last (ceil_mode) window fit
    pads = [(b, max(e, (n - 1) * s + (k - 1) * d + 1 - sz - b))
            for (b, e), n, s, k, d, sz in zip(pads, counts, strides, kernel, dil, sizes)]
    fill = -3.0e38 if node.op_type == "MaxPool" else 0.0
    if not indices and (x0.ndim == 3 or (x0.ndim == 4 and all(d == 1 for d in dil))):
        y = _pooled_2d(cx, node.op_type, x0, kernel, strides, pads, counts, fill)
    else:
        y, where = _pooled_by_gather(cx, node.op_type, x0, kernel, strides, dil, pads, counts, fill, indices,
                                     column_major)
        if where is not None:
            return [y, where]
    if node.op_type == "LpPool":
        y = g.pow(y * float(np.prod(kernel)), g.constant(1.0 / lp))
    elif node.op_type == "AveragePool":
        include_pad = bool(cx.attr(node, "count_include_pad", 0))
        scale = _window_counts(kernel, strides, dil, given, counts, sizes, include_pad)
        if not np.all(scale == 1.0):
            y = y * g.constant(scale.reshape((1,) * (y.ndim - scale.ndim) + scale.shape).astype(np.float32))
    return [g.reshape(y, x0.shape[:2] + tuple(counts))]


def _pooled_2d(cx: Convert, op: str, x0: Value, kernel, strides, pads, counts, fill: float) -> Value:
    """Max or mean over each window by the Pool2D thunk (1-D and 2-D, no dilation), NCHW."""
    g = cx.g
    x, one_d = _as_2d(cx, x0, op)
    lead = 1 if one_d else 0
    k2, s2 = (1,) * lead + tuple(kernel), (1,) * lead + tuple(strides)
    x, begin = _even_pads(cx, x, [(0, 0)] * lead + pads, fill)
    pool = g.max_pool2d if op == "MaxPool" else g.avg_pool2d
    return _windowed(cx, pool(x, k2, s2, tuple(begin)), counts)


def _pooled_by_gather(cx: Convert, op: str, x0: Value, kernel, strides, dil, pads, counts, fill: float,
                      indices: bool = False, column_major: bool = False) -> tuple[Value, Value | None]:
    """Max or mean over each window, any number of spatial axes and dilations: the padded input's spatial axes
    flattened, every window's taps gathered by constant indices `[positions · taps]`, reduced over the taps.
    With `indices`, also MaxPool's Indices: the first maximum's flat index into the unpadded `x0` (its spatial
    axes column-major with `column_major`, ONNX's storage_order = 1)."""
    g = cx.g
    n, c, *sizes = x0.shape
    x = x0
    for axis, (b, e) in enumerate(pads, start=2):             # pad both ends with `fill`
        blocks = [np.full((*x.shape[:axis], m, *x.shape[axis + 1:]), fill, np.float32) for m in (b, e)]
        x = g.concat([v for v in (g.constant(blocks[0]) if b else None, x, g.constant(blocks[1]) if e else None)
                      if v is not None], axis)
    padded = x.shape[2:]
    coords = _grid([np.arange(m) * s for m, s in zip(counts, strides)])[:, None] \
        + _grid([np.arange(k) * d for k, d in zip(kernel, dil)])[None, :]            # [positions, taps, axes]
    where = np.ravel_multi_index(tuple(np.moveaxis(coords, -1, 0)), padded)
    idx = g.constant(where.reshape(-1).astype(np.int64))
    flat = g.reshape(x, [n, c, int(np.prod(padded))])
    positions, taps = int(np.prod(counts)), int(np.prod(kernel))
    windows = g.reshape(g.gather(flat, idx, 2), [n, c, positions, taps])
    y = g.reshape(g.reduce(windows, "max" if op == "MaxPool" else "mean", (3,)), [n, c, *counts])
    if not indices:
        return y, None
    inside = np.clip(coords - np.array([b for b, _ in pads]), 0, np.array(sizes) - 1)   # a padded tap never wins
    spatial = np.ravel_multi_index(tuple(np.moveaxis(inside, -1, 0)), sizes, order="F" if column_major else "C")
    table = g.constant(np.broadcast_to(spatial, (n, c, positions, taps)).astype(np.int64))
    at = g.gather_elements(table, g.argmax(windows, 3, True), 3)                       # [n, c, positions, 1]
    plane = g.constant((np.arange(n * c, dtype=np.int64) * int(np.prod(sizes))).reshape(n, c, 1, 1))
    return y, g.reshape(g.wide_binary("add", at, plane), [n, c, *counts])


def _grid(axes: list[np.ndarray]) -> np.ndarray:
    """Every combination of the per-axis values, row-major: `[∏ len, number of axes]`."""
    return np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(axes))


def _window_counts(kernel, strides, dil, pads, counts, sizes, include_pad: bool) -> np.ndarray:
    """`window size / elements ONNX averages over` per output position (outer product over axes)."""
    scale = np.ones((), np.float64)
    for k, s, d, (b, e), n, size in zip(kernel, strides, dil, pads, counts, sizes):
        lo, hi = (-b, size + e) if include_pad else (0, size)
        taps = (np.arange(n) * s - b)[:, None] + np.arange(k)[None, :] * d
        valid = ((taps >= lo) & (taps < hi)).sum(axis=1)
        scale = np.multiply.outer(scale, k / valid)
    return scale


@converts("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(cx: Convert, node) -> list:
    x = _float(cx, node)
    return [cx.g.reduce(x, "mean" if node.op_type == "GlobalAveragePool" else "max", tuple(range(2, x.ndim)), True)]


# ── normalization ───────────────────────────────────────────────────────────

def _channel(cx: Convert, v: Value, rank: int) -> Value:
    """A per-channel `[c]` tensor shaped to broadcast against `[n, c, …]`."""
    return cx.g.reshape(v, [v.shape[0], *([1] * (rank - 2))])


def _normalize(cx: Convert, x: Value, axes: tuple[int, ...], eps: float, center: bool = True) -> Value:
    """`(x − mean) / sqrt(var + eps)` over `axes` (`x / sqrt(mean(x²) + eps)` without centering)."""
    g = cx.g
    if center:
        x = x - g.reduce(x, "mean", axes, True)
    return x / g.sqrt(g.reduce(x * x, "mean", axes, True) + eps)


@converts("BatchNormalization")
def _batch_norm(cx: Convert, node) -> list:
    if int(cx.attr(node, "training_mode", 0)) or len([o for o in node.output if o]) > 1:
        raise Unsupported("training_mode (running statistics outputs): inference only")
    x = _float(cx, node)
    scale, bias, mean, var = (_channel(cx, _float(cx, node, i), x.ndim) for i in (1, 2, 3, 4))
    eps = float(cx.attr(node, "epsilon", 1e-5))
    return [(x - mean) * (scale / cx.g.sqrt(var + eps)) + bias]


@converts("InstanceNormalization")
def _instance_norm(cx: Convert, node) -> list:
    x = _float(cx, node)
    y = _normalize(cx, x, tuple(range(2, x.ndim)), float(cx.attr(node, "epsilon", 1e-5)))
    return [y * _channel(cx, _float(cx, node, 1), x.ndim) + _channel(cx, _float(cx, node, 2), x.ndim)]


@converts("GroupNormalization")
def _group_norm(cx: Convert, node) -> list:
    g = cx.g
    x = _float(cx, node)
    groups = int(cx.attr(node, "num_groups"))
    n, c = x.shape[:2]
    grouped = g.reshape(x, [n, groups, -1])
    y = g.reshape(_normalize(cx, grouped, (2,), float(cx.attr(node, "epsilon", 1e-5))), x.shape)
    scale, bias = _float(cx, node, 1), _float(cx, node, 2)
    if scale.shape[0] != c:          # opset 18: one scale and bias per group
        scale, bias = (g.reshape(g.broadcast_to(g.reshape(v, [groups, 1]), (groups, c // groups)), [c])
                       for v in (scale, bias))
    return [y * _channel(cx, scale, x.ndim) + _channel(cx, bias, x.ndim)]


@converts("RMSNormalization")
def _rms_norm(cx: Convert, node) -> list:
    x = _float(cx, node)
    axis = int(cx.attr(node, "axis", -1)) % x.ndim
    y = _normalize(cx, x, tuple(range(axis, x.ndim)), float(cx.attr(node, "epsilon", 1e-5)), center=False)
    return [y * _float(cx, node, 1)]


@converts("MeanVarianceNormalization")
def _mvn(cx: Convert, node) -> list:
    x = _float(cx, node)
    axes = tuple(a % x.ndim for a in cx.attr(node, "axes", [0, 2, 3]))
    return [_normalize(cx, x, axes, 1e-9)]


@converts("LRN")
@in_f32
def _lrn(cx: Convert, node) -> list:
    """`x / (bias + alpha/size · Σ x²)^beta`, the sum over the `size` channels around each one (zero padded):
    `size` shifted slices of the padded squares."""
    g, x = cx.g, _float(cx, node)
    size = int(cx.attr(node, "size"))
    alpha, beta, bias = (float(cx.attr(node, k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    channels = x.shape[1]
    zeros = [g.constant(np.zeros((x.shape[0], n, *x.shape[2:]), np.float32)) for n in (before, after)]
    parts = [z for z, n in zip(zeros, (before, after)) if n]
    squares = g.concat(parts[:1 if before else 0] + [x * x] + parts[1 if before else 0:], 1) if parts else x * x
    total = g.narrow(squares, 1, 0, channels)
    for k in range(1, size):
        total = total + g.narrow(squares, 1, k, channels)
    return [x / g.pow(total * (alpha / size) + bias, g.constant(beta))]


@converts("LpNormalization")
def _lp_norm(cx: Convert, node) -> list:
    g = cx.g
    x = _float(cx, node)
    axis, p = int(cx.attr(node, "axis", -1)) % x.ndim, int(cx.attr(node, "p", 2))
    if p not in (1, 2):
        raise Unsupported(f"p={p} (1 or 2)")
    norm = g.reduce(g.activation("abs", x), "sum", (axis,), True) if p == 1 else \
        g.sqrt(g.reduce(x * x, "sum", (axis,), True))
    return [x / g.maximum(norm, g.constant(1e-30))]        # a zero vector stays zero
