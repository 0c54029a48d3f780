"""ONNX shape ops: Shape/Size (import-time constants), Reshape, Transpose, Flatten, Squeeze, Unsqueeze,
Concat, Split, Slice, Gather, Expand, Tile, Cast, DepthToSpace/SpaceToDepth."""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ..dtypes import DType
from ..graph import Value
from .importer import Convert, Unsupported, converts, dtype_of


@converts("Shape")
def _shape(cx: Convert, node) -> list:
    shape = np.array(cx.shape(node.input[0]), np.int64)
    start, end = cx.attr(node, "start", 0), cx.attr(node, "end", None)
    return [shape[start:end]]


@converts("Size")
def _size(cx: Convert, node) -> list:
    return [np.array(int(np.prod(cx.shape(node.input[0]))), np.int64)]


@converts("Reshape")
def _reshape(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    shape = [int(d) for d in cx.need_const(node, 1, "shape")]
    if cx.attr(node, "allowzero", 0) and 0 in shape:
        if x.shape and int(np.prod(x.shape)) != 0 or -1 in shape:
            raise Unsupported(f"allowzero=1: shape {shape} for input {list(x.shape)}")
        return [empty(x, shape)]
    return [cx.g.reshape(x, shape)]


def empty(x: Value, shape: "list[int]") -> np.ndarray:
    """A zero-size result of `x`'s dtype: known at import time, it is a constant."""
    return np.zeros(shape, ml_dtypes.bfloat16 if x.dtype == DType.BF16 else x.dtype.numpy)


@converts("Transpose")
def _transpose(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    perm = cx.attr(node, "perm") or list(reversed(range(x.ndim)))
    return [cx.g.transpose(x, perm)]


@converts("Flatten")
def _flatten(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    axis = cx.attr(node, "axis", 1)
    axis = axis + x.ndim if axis < 0 else axis            # in [−r, r]: −1 is the last axis, not r
    return [cx.g.reshape(x, [int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))])]


def _axes_of(cx: Convert, node, name: str = "axes") -> list[int] | None:
    axes = cx.attr(node, name)
    if axes is None and cx.has(node, 1):
        axes = [int(a) for a in cx.need_const(node, 1, name)]
    return axes


@converts("Squeeze")
def _squeeze(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    axes = _axes_of(cx, node)
    axes = {a % x.ndim for a in axes} if axes else {i for i, d in enumerate(x.shape) if d == 1}
    if any(x.shape[a] != 1 for a in axes):
        raise Unsupported(f"squeeze of a dim that is not 1 ({list(x.shape)}, axes {sorted(axes)})")
    return [cx.g.reshape(x, [d for i, d in enumerate(x.shape) if i not in axes])]


@converts("Unsqueeze")
def _unsqueeze(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    axes = _axes_of(cx, node)
    rank = x.ndim + len(axes)
    axes = sorted(a % rank for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return [cx.g.reshape(x, shape)]


@converts("Concat")
def _concat(cx: Convert, node) -> list:
    xs = [cx.tensor(i) for i in node.input if i and np.prod(cx.shape(i)) > 0] or [cx.tensor(node.input[0])]
    return [cx.g.concat(xs, cx.attr(node, "axis"))] if len(xs) > 1 else [xs[0]]


@converts("Split")
def _split(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    axis = cx.attr(node, "axis", 0) % x.ndim
    sizes = cx.attr(node, "split")
    if sizes is None and cx.has(node, 1):
        sizes = [int(s) for s in cx.need_const(node, 1, "split")]
    if sizes is None:
        parts = cx.attr(node, "num_outputs", len(node.output))
        step = -(-x.shape[axis] // parts)
        sizes = [min(step, x.shape[axis] - k * step) for k in range(parts)]
    out, start = [], 0
    for s in sizes:
        out.append(cx.g.narrow(x, axis, start, int(s)))
        start += int(s)
    return out


@converts("Slice")
def _slice(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    if cx.opset.get("", 13) < 10:
        starts, ends, axes = cx.attr(node, "starts"), cx.attr(node, "ends"), cx.attr(node, "axes")
        steps = None
    else:
        starts, ends = cx.need_const(node, 1, "starts"), cx.need_const(node, 2, "ends")
        axes = cx.need_const(node, 3, "axes") if cx.has(node, 3) else None
        steps = cx.need_const(node, 4, "steps") if cx.has(node, 4) else None
    axes = list(range(len(starts))) if axes is None else [int(a) % x.ndim for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    kept = {a: np.arange(x.shape[a])[slice(int(s0) if abs(int(s0)) < 2**62 else None,
                                           int(e0) if abs(int(e0)) < 2**62 else None, st)]
            for a, s0, e0, st in zip(axes, starts, ends, steps)}
    if any(idx.size == 0 for idx in kept.values()):
        return [empty(x, [kept[a].size if a in kept else d for a, d in enumerate(x.shape)])]
    for (a, idx), st in zip(kept.items(), steps):
        if st == 1:
            x = cx.g.narrow(x, a, int(idx[0]), int(idx.size))
        else:
            x = cx.g.gather(x, cx.g.constant(idx.astype(np.int64)), a)
    return [x]


@converts("Gather")
def _gather(cx: Convert, node) -> list:
    table = cx.tensor(node.input[0])
    axis = cx.attr(node, "axis", 0) % table.ndim
    idx = cx.const(node.input[1])
    if idx is not None:
        idx = np.where(idx < 0, idx + table.shape[axis], idx).astype(np.int64)
        if idx.ndim == 0:
            return [cx.g.reshape(cx.g.narrow(table, axis, int(idx), 1),
                                 [d for i, d in enumerate(table.shape) if i != axis])]
        return [cx.g.gather(table, cx.g.constant(idx), axis)]
    return [cx.g.gather(table, _wrapped(cx, cx.tensor(node.input[1]), table.shape[axis]), axis)]


def _wrapped(cx: Convert, idx, n: int):
    """Run-time indices with a negative one counted from the end: `((i % n) + n) % n` in i64."""
    from ..dtypes import DType
    from .ops_math import arithmetic
    i = idx if idx.dtype == DType.I64 else cx.g.cast(idx, DType.I64)
    size = cx.g.constant(np.array(n, np.int64), DType.I64)
    return arithmetic(cx, "mod", arithmetic(cx, "add", arithmetic(cx, "mod", i, size), size), size)


@converts("Expand")
def _expand(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    shape = tuple(int(d) for d in cx.need_const(node, 1, "shape"))
    return [cx.g.broadcast_to(x, tuple(np.broadcast_shapes(x.shape, shape)))]


@converts("Tile")
def _tile(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    reps = [int(r) for r in cx.need_const(node, 1, "repeats")]
    for axis, r in enumerate(reps):
        if r != 1:
            x = cx.g.concat([x] * r, axis)
    return [x]


@converts("Cast")
def _cast(cx: Convert, node) -> list:
    return [cx.g.cast(cx.tensor(node.input[0]), dtype_of(cx.attr(node, "to"), "Cast to"))]


@converts("CastLike")
def _cast_like(cx: Convert, node) -> list:
    return [cx.g.cast(cx.tensor(node.input[0]), cx.dtype(node.input[1]))]


@converts("DepthToSpace", "SpaceToDepth")
def _depth_space(cx: Convert, node) -> list:
    g = cx.g
    x = cx.tensor(node.input[0])
    n, c, h, w = x.shape
    b = int(cx.attr(node, "blocksize"))
    dcr = cx.attr(node, "mode", "DCR") == "DCR"
    if node.op_type == "SpaceToDepth":
        y = g.reshape(x, [n, c, h // b, b, w // b, b])
        perm = [0, 3, 5, 1, 2, 4] if dcr else [0, 1, 3, 5, 2, 4]
        return [g.reshape(g.transpose(y, perm), [n, c * b * b, h // b, w // b])]
    if dcr:
        y, perm = g.reshape(x, [n, b, b, c // (b * b), h, w]), [0, 3, 4, 1, 5, 2]
    else:
        y, perm = g.reshape(x, [n, c // (b * b), b, b, h, w]), [0, 1, 4, 2, 5, 3]
    return [g.reshape(g.transpose(y, perm), [n, c // (b * b), h * b, w * b])]
