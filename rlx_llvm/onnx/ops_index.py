"""ONNX index and logic ops: ArgMax/ArgMin, TopK, CumSum/CumProd, Compress, Gather/ScatterElements,
GatherND/ScatterND, Pad, Resize, Mod, Not/And/Or/Xor.

Logic runs on float regions: bool operands are cast to f32 (0/1) and compared back to bool.  Pad
builds each padded axis from `concat` (constant mode) or a `gather` of constant indices (reflect,
edge, wrap — `np.pad` of the axis' index range).  Resize is separable: each resized axis is a
product with a constant `[in, out]` interpolation matrix, computed at import by ONNX's reference
Resize of an identity (so every mode, coordinate transform, cubic coefficient and antialias is
ONNX's own).
"""
from __future__ import annotations

import numpy as np

from ..dtypes import DType
from ..graph import Value
from .importer import Convert, Unsupported, converts, in_f32
from .ops_math import INTEGERS, _as_i64, _float, arithmetic
from .ops_shape import empty


# ── logic ───────────────────────────────────────────────────────────────────

def _as01(cx: Convert, node, i: int) -> Value:
    v = cx.tensor(node.input[i])
    if v.dtype != DType.Bool:
        raise Unsupported(f"input {i} is {v.dtype.value}: logic ops are lowered for bool")
    return cx.g.cast(v, "f32")


@converts("Not", "And", "Or", "Xor")
def _logic(cx: Convert, node) -> list:
    g = cx.g
    a = _as01(cx, node, 0)
    if node.op_type == "Not":
        return [g.compare("lt", a, g.constant(0.5))]
    b = _as01(cx, node, 1)
    if node.op_type == "And":
        return [g.compare("gt", a * b, g.constant(0.5))]
    if node.op_type == "Or":
        return [g.compare("gt", a + b, g.constant(0.5))]
    return [g.compare("ne", a, b)]


@converts("Mod")
def _mod(cx: Convert, node) -> list:
    g = cx.g
    a, b = cx.tensor(node.input[0]), cx.tensor(node.input[1])
    if a.dtype == DType.F64 and not int(cx.attr(node, "fmod", 0)):
        return [_floored_f64(cx, a, b)]
    if not a.dtype.is_float or a.dtype == DType.F64:
        if not int(cx.attr(node, "fmod", 0)):     # Python's sign rule from C's remainder: ((a % b) + b) % b
            return [arithmetic(cx, "mod", arithmetic(cx, "add", arithmetic(cx, "mod", a, b), b), b)]
        return [arithmetic(cx, "mod", a, b)]
    q = a / b
    if int(cx.attr(node, "fmod", 0)):      # C fmod: the quotient truncated toward zero
        trunc = g.activation("sign", q) * g.activation("floor", g.activation("abs", q))
        return [a - trunc * b]
    floored = a - g.activation("floor", q) * b
    # a finite `a` over b = ±inf is `a` when their signs agree (or a = 0), else b — NumPy's rule; the formula gives NaN
    inf, zero = (g.constant(v) if a.dtype == DType.F32 else g.cast(g.constant(v), a.dtype) for v in (float("inf"), 0.0))
    same_sign = g.where_(g.compare("ge", g.activation("sign", a) * g.activation("sign", b), zero), a, b)
    finite_a = g.where_(g.compare("lt", g.activation("abs", a), inf), same_sign, floored)
    return [g.where_(g.compare("eq", g.activation("abs", b), inf), finite_a, floored)]


def _floored_f64(cx: Convert, a: Value, b: Value) -> Value:
    """Python's `a mod b` of f64: C's remainder r, plus b where r and b have opposite signs (exact, and
    right for b = ±inf: NumPy's 3 mod −inf = −inf)."""
    g = cx.g
    r = arithmetic(cx, "mod", a, b)
    sign = lambda v: g.cast(g.wide_activation("sign", v), DType.F32)  # noqa: E731
    opposite = g.compare("lt", sign(r) * sign(b), g.constant(0.0))
    return g.wide_where(opposite, arithmetic(cx, "add", r, b), r)


# ── arg reductions, top-k, cumulative sums ──────────────────────────────────

@converts("ArgMax", "ArgMin")
def _arg(cx: Convert, node) -> list:
    x = _float(cx, node)
    axis, keep = int(cx.attr(node, "axis", 0)) % x.ndim, bool(cx.attr(node, "keepdims", 1))
    fn = cx.g.argmax if node.op_type == "ArgMax" else cx.g.argmin
    if not int(cx.attr(node, "select_last_index", 0)):
        return [fn(x, axis, keep)]
    # the last extreme: the first one of the flipped axis, counted from the end
    last = cx.g.constant(np.array(x.shape[axis] - 1, np.int64), DType.I64)
    return [arithmetic(cx, "sub", last, fn(_flip(cx, x, axis), axis, keep))]


def _move_last(cx: Convert, x: Value, axis: int) -> tuple[Value, list[int] | None]:
    """`x` with `axis` moved last, and the permutation that moves it back (None when already last)."""
    if axis == x.ndim - 1:
        return x, None
    perm = [i for i in range(x.ndim) if i != axis] + [axis]
    return cx.g.transpose(x, perm), sorted(range(x.ndim), key=perm.__getitem__)


@converts("TopK")
def _topk(cx: Convert, node) -> list:
    g = cx.g
    x0 = cx.tensor(node.input[0])
    k = int(cx.need_const(node, 1, "K").reshape(-1)[0])
    if not int(cx.attr(node, "sorted", 1)):
        raise Unsupported("sorted=0")
    largest = bool(cx.attr(node, "largest", 1))
    x, back = _move_last(cx, x0, int(cx.attr(node, "axis", -1)) % x0.ndim)
    if x.dtype in INTEGERS:
        values, idx = _ranked_topk(cx, x, k, largest)
        return [values, idx] if not back else [g.transpose(values, back), g.transpose(idx, back)]
    _float(cx, node)
    idx = g.topk(x if largest else -x, k)
    n = x.shape[-1]
    # values: take_along_axis as a select of x by the one-hot of each index (sums exact zeros)
    hot = g.compare("eq", g.reshape(g.cast(idx, "f32"), [*idx.shape, 1]),
                    g.constant(np.arange(n, dtype=np.float32)))
    values = g.reduce(g.where_(hot, g.reshape(x, [*x.shape[:-1], 1, n]), g.constant(0.0)), "sum", (x.ndim,))
    if back:
        values, idx = g.transpose(values, back), g.transpose(idx, back)
    return [values, idx]


def _ranked_topk(cx: Convert, x: Value, k: int, largest: bool) -> tuple[Value, Value]:
    """TopK along the last axis of integer `x`, exactly: each element's rank is the count of
    elements that come before it (larger — or smaller — or equal at a smaller index); the element of
    rank r is output r.  Values are gathered by the indices, so they are `x`'s own."""
    g, n = cx.g, x.shape[-1]
    xi, xj = g.reshape(x, [*x.shape[:-1], n, 1]), g.reshape(x, [*x.shape[:-1], 1, n])
    beats = g.wide_compare("gt" if largest else "lt", *(_as_i64(cx, v) for v in (xj, xi)))
    ties = g.wide_compare("eq", *(_as_i64(cx, v) for v in (xj, xi)))
    earlier = g.constant(np.tri(n, n, -1, dtype=np.float32))           # [i, j]: j < i
    rank = g.reduce(g.cast(beats, "f32") + g.cast(ties, "f32") * earlier, "sum", (x.ndim,))
    hot = g.compare("eq", g.reshape(rank, [*x.shape[:-1], 1, n]),
                    g.constant(np.arange(k, dtype=np.float32).reshape(k, 1)))
    where = g.reduce(g.where_(hot, g.constant(np.arange(n, dtype=np.float32)), g.constant(0.0)), "sum", (x.ndim,))
    idx = g.cast(where, DType.I64)
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))
    offsets = g.constant((np.arange(rows, dtype=np.int64) * n).reshape(*x.shape[:-1], 1), DType.I64)
    flat = g.wide_binary("add", idx, offsets)
    return g.gather(g.reshape(x, [rows * n]), flat, 0), idx


def _flip(cx: Convert, x: Value, axis: int) -> Value:
    return cx.g.gather(x, cx.g.constant(np.arange(x.shape[axis] - 1, -1, -1, dtype=np.int64)), axis)


@converts("CumSum", "CumProd")
@in_f32
def _cumulative(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    axis = int(cx.need_const(node, 1, "axis").reshape(-1)[0]) % x.ndim
    exclusive, reverse = bool(cx.attr(node, "exclusive", 0)), bool(cx.attr(node, "reverse", 0))
    if node.op_type == "CumProd" or x.dtype == DType.F64 or x.dtype in INTEGERS:
        return [_scanned(cx, x, axis, exclusive, reverse, "mul" if node.op_type == "CumProd" else "add")]
    x = _float(cx, node)
    if reverse:
        return [_flip(cx, cx.g.cumsum(_flip(cx, x, axis), axis, exclusive), axis)]
    return [cx.g.cumsum(x, axis, exclusive)]


def _scanned(cx: Convert, x: Value, axis: int, exclusive: bool, reverse: bool, op: str) -> Value:
    """CumSum (`op` add) of f64 or integer `x` (exact wide adds, integers wrapping as ONNX's), or CumProd
    (mul): `⌈log₂ n⌉` steps `y = y op (y shifted by s)` (s = 1, 2, 4 …, Hillis–Steele), then one more
    shift when `exclusive`."""
    n, unit = x.shape[axis], 1 if op == "mul" else 0
    y, s = x, 1
    while s < n:
        y = arithmetic(cx, op, y, _shifted(cx, y, axis, s, reverse, unit))
        s *= 2
    return _shifted(cx, y, axis, 1, reverse, unit) if exclusive else y


def _shifted(cx: Convert, y: Value, axis: int, s: int, reverse: bool, unit: int = 0) -> Value:
    """`y` moved `s` places along `axis` (towards the end, or the start when `reverse`), `unit`s shifted in."""
    n = y.shape[axis]
    units = cx.g.constant(np.full((*y.shape[:axis], min(s, n), *y.shape[axis + 1:]), unit, y.dtype.numpy),
                          y.dtype)
    if s >= n:
        return units
    kept = cx.g.narrow(y, axis, s if reverse else 0, n - s)
    return cx.g.concat([kept, units] if reverse else [units, kept], axis)


# ── gathers and scatters ────────────────────────────────────────────────────

@converts("Compress")
def _compress(cx: Convert, node) -> list:
    """The slices along `axis` (of the flattened input without one) where the import-time condition holds:
    one constant-index `gather`."""
    x = cx.tensor(node.input[0])
    keep = np.flatnonzero(cx.need_const(node, 1, "condition"))
    axis = cx.attr(node, "axis")
    if axis is None:
        x, axis = cx.g.reshape(x, [-1]), 0
    axis = int(axis) % x.ndim
    if keep.size == 0:
        return [empty(x, [0 if a == axis else d for a, d in enumerate(x.shape)])]
    return [cx.g.gather(x, cx.g.constant(keep.astype(np.int64), DType.I64), axis)]


REDUCTION = {"none": "none", "add": "add", "mul": "mul", "max": "max", "min": "min"}


@converts("GatherElements")
def _gather_elements(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    return [cx.g.gather_elements(x, cx.tensor(node.input[1]), int(cx.attr(node, "axis", 0)))]


@converts("GatherND")
def _gather_nd(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    return [cx.g.gather_nd(x, cx.tensor(node.input[1]), int(cx.attr(node, "batch_dims", 0)))]


@converts("ScatterElements", "Scatter")
def _scatter_elements(cx: Convert, node) -> list:
    x = _float(cx, node)
    reduction = REDUCTION[cx.attr(node, "reduction", "none")]
    return [cx.g.scatter_elements(x, cx.tensor(node.input[1]), _float(cx, node, 2), int(cx.attr(node, "axis", 0)),
                                  reduction)]


@converts("ScatterND")
def _scatter_nd(cx: Convert, node) -> list:
    reduction = REDUCTION[cx.attr(node, "reduction", "none")]
    return [cx.g.scatter_nd(_float(cx, node), cx.tensor(node.input[1]), _float(cx, node, 2), reduction)]


# ── Pad ─────────────────────────────────────────────────────────────────────

PAD_MODES = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}


@converts("Pad")
def _pad(cx: Convert, node) -> list:
    g = cx.g
    x = cx.tensor(node.input[0])
    mode = cx.attr(node, "mode", "constant")
    if cx.opset.get("", 13) < 11:
        flat, value = list(cx.attr(node, "pads")), g.constant(float(cx.attr(node, "value", 0.0)))
    else:
        flat = [int(p) for p in cx.need_const(node, 1, "pads")]
        value = cx.tensor(node.input[2]) if cx.has(node, 2) else g.constant(np.zeros((), np.float32))
    axes = [int(a) % x.ndim for a in cx.need_const(node, 3, "axes")] if cx.has(node, 3) else list(range(x.ndim))
    n = len(axes)
    for axis, b, e in zip(axes, flat[:n], flat[n:]):
        if mode == "constant":
            x = _pad_constant(cx, x, axis, b, e, value)
        elif mode in PAD_MODES:
            size = x.shape[axis]
            ids = np.pad(np.arange(size), (max(b, 0), max(e, 0)), PAD_MODES[mode])
            ids = ids[max(-b, 0): len(ids) - max(-e, 0)]
            x = g.gather(x, g.constant(ids.astype(np.int64)), axis)
        else:
            raise Unsupported(f"mode {mode!r}")
    return [x]


def _pad_constant(cx: Convert, x: Value, axis: int, b: int, e: int, value: Value) -> Value:
    """`x` with `b` elements of `value` before and `e` after along `axis` (negative: cropped)."""
    g = cx.g
    if b < 0 or e < 0:
        x = g.narrow(x, axis, max(-b, 0), x.shape[axis] - max(-b, 0) - max(-e, 0))
    def fill(count: int) -> list[Value]:
        shape = (*x.shape[:axis], count, *x.shape[axis + 1:])
        return [g.broadcast_to(g.reshape(g.cast(value, x.dtype), [1] * x.ndim), shape)] if count > 0 else []

    parts = fill(b) + [x] + fill(e)
    return g.concat(parts, axis) if len(parts) > 1 else x


# ── Resize ──────────────────────────────────────────────────────────────────

@converts("Resize")
def _resize(cx: Convert, node) -> list:
    g = cx.g
    x = _float(cx, node)
    opset10 = cx.opset.get("", 13) < 11
    roi = None if opset10 or not cx.has(node, 1) else cx.need_const(node, 1, "roi").astype(np.float64)
    scales = cx.need_const(node, 1 if opset10 else 2, "scales") if cx.has(node, 1 if opset10 else 2) else None
    sizes = None if opset10 or not cx.has(node, 3) else cx.need_const(node, 3, "sizes")
    if scales is not None and scales.size == 0:
        scales = None
    axes = [int(a) % x.ndim for a in cx.attr(node, "axes", range(x.ndim))]
    fill = float(cx.attr(node, "extrapolation_value", 0.0)) \
        if cx.attr(node, "coordinate_transformation_mode") == "tf_crop_and_resize" else 0.0
    outside: dict[int, np.ndarray] = {}     # axis → its output positions that extrapolate (when fill ≠ 0)
    policy, binding, given = cx.attr(node, "keep_aspect_ratio_policy", "stretch"), None, sizes
    if policy != "stretch" and sizes is not None:
        sizes, binding = _kept_aspect(x, axes, sizes, policy)
    y = x
    for j, axis in enumerate(axes):
        n_in = x.shape[axis]
        scale = float(scales[j]) if scales is not None else None
        n_out = int(sizes[j]) if sizes is not None else int(np.floor(n_in * scale))
        r = (roi[j], roi[len(axes) + j]) if roi is not None and roi.size else None
        lead = (*binding, int(given[j])) if binding and binding[0] * n_out != binding[1] * n_in else None
        if (scale == 1.0 and r is None or (scale is None and n_out == n_in and r is None)) and lead is None:
            continue
        m = _interpolation(cx, node, n_in, n_out, scale, r, lead)
        if fill:
            outside[axis] = (_interpolation(cx, node, n_in, n_out, scale, r, lead, extrapolation=1.0) != m).any(0)
        moved, back = _move_last(cx, y, axis)
        lead = moved.shape[:-1]
        out = g.reshape(g.matmul(g.reshape(moved, [-1, n_in]), g.constant(m)), [*lead, n_out])
        y = g.transpose(out, back) if back else out
    if outside:
        mask = np.zeros(y.shape, bool)
        for axis, cols in outside.items():
            mask |= cols.reshape([-1 if a == axis else 1 for a in range(y.ndim)])
        y = g.where_(g.constant(mask, DType.Bool), g.constant(fill), y)
    return [y]


def _kept_aspect(x: Value, axes: list[int], sizes: np.ndarray, policy: str) -> tuple[list[int], tuple[int, int]]:
    """keep_aspect_ratio_policy: the output sizes (one scale, the least or the largest of sizes / input, on
    every axis; sizes round half up) and the binding axis' `(input, size)` in lowest terms."""
    import math
    ratios = [int(n) / x.shape[a] for n, a in zip(sizes, axes)]
    k = int(np.argmin(ratios) if policy == "not_larger" else np.argmax(ratios))
    q, p = x.shape[axes[k]], int(sizes[k])
    d = math.gcd(q, p) or 1
    return [int(ratios[k] * x.shape[a] + 0.5) for a in axes], (q // d, p // d)


def _interpolation(cx: Convert, node, n_in: int, n_out: int, scale: float | None,
                   roi: tuple[float, float] | None, lead: tuple[int, int, int] | None = None,
                   extrapolation: float = 0.0) -> np.ndarray:
    """The `[n_in, n_out]` matrix of ONNX's Resize along one axis (its reference run on an identity).  With
    `lead = (q, p, size)` (keep_aspect_ratio_policy bound by another axis) the identity, asked for `size`,
    rides behind a length-q axis of ones asked for p, so the reference picks the same p / q scale for it."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name != "axes"}
    if attrs.get("coordinate_transformation_mode") in ("tf_crop_and_resize", b"tf_crop_and_resize"):
        attrs["extrapolation_value"] = extrapolation
    if lead is None:
        attrs.pop("keep_aspect_ratio_policy", None)
    opset = cx.opset.get("", 13)
    feeds = {"X": np.eye(n_in, dtype=np.float32)}
    if lead is not None:
        q, p, size = lead
        names, attrs["axes"] = ["X", "", "", "sizes"], [0, 2]
        feeds.update(X=np.ascontiguousarray(np.broadcast_to(feeds["X"], (q, n_in, n_in))),
                     sizes=np.array([p, size], np.int64))
    elif opset < 11:
        names = ["X", "scales"]
        feeds["scales"] = np.array([1.0, scale], np.float32)
    else:
        names = ["X", "roi", "scales", "sizes"]
        feeds["roi"] = np.array([0, roi[0], 1, roi[1]] if roi else [], np.float32)
        feeds["scales"] = np.array([1.0, scale] if scale is not None else [], np.float32)
        if scale is None:
            feeds["sizes"] = np.array([n_in, n_out], np.int64)
        else:
            names = names[:3]
    model = helper.make_model(
        helper.make_graph([helper.make_node("Resize", names, ["Y"], **attrs)], "resize_axis",
                          [helper.make_tensor_value_info(n, 0, None) for n in names if n],
                          [helper.make_tensor_value_info("Y", 0, None)]),
        opset_imports=[helper.make_opsetid("", opset)])
    m, = ReferenceEvaluator(model).run(None, {n: feeds[n] for n in names if n})
    m = m[0] if lead is not None else m
    if m.shape != (n_in, n_out):
        raise Unsupported(f"resize of {n_in} to {n_out} gave an interpolation matrix of shape {list(m.shape)}")
    return np.ascontiguousarray(m, np.float32)


# ── masks ───────────────────────────────────────────────────────────────────

@converts("Trilu")
def _trilu(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    k = int(cx.need_const(node, 1, "k").reshape(-1)[0]) if cx.has(node, 1) else 0
    rows, cols = x.shape[-2:]
    keep = (np.triu if int(cx.attr(node, "upper", 1)) else np.tril)(np.ones((rows, cols), bool), k)
    zero = cx.g.constant(np.zeros((), x.dtype.numpy), x.dtype)
    if not x.dtype.is_float or x.dtype == DType.F64:      # a byte-exact select for other dtypes
        return [arithmetic(cx, "mul", x, cx.g.constant(keep.astype(x.dtype.numpy), x.dtype))]
    return [cx.g.where_(cx.g.constant(keep, DType.Bool), x, zero)]


@converts("Hardmax")
def _hardmax(cx: Convert, node) -> list:
    g = cx.g
    x = _float(cx, node)
    axis = int(cx.attr(node, "axis", -1)) % x.ndim
    at = g.cast(g.argmax(x, axis, True), "f32")
    iota = np.arange(x.shape[axis], dtype=np.float32).reshape([-1 if i == axis else 1 for i in range(x.ndim)])
    return [g.cast(g.compare("eq", at, g.constant(iota)), x.dtype)]
