"""ONNX math: element-wise ops and activations, MatMul/Gemm, reductions, Softmax/LogSoftmax, LayerNormalization."""
from __future__ import annotations

import numpy as np

from ..dtypes import DType
from ..graph import Value
from .importer import Convert, Unsupported, converts, in_f32

BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow"}
UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
         "Neg": "neg", "Abs": "abs", "Erf": "erf", "Floor": "floor", "Ceil": "ceil",
         "Sign": "sign", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Atan": "atan", "Reciprocal": "recip",
         "Softplus": "softplus", "Softsign": "softsign", "Mish": "mish", "HardSwish": "hard_swish"}
COMPARE = {"Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt", "GreaterOrEqual": "ge"}


def _float(cx: Convert, node, i: int = 0) -> Value:
    v = cx.tensor(node.input[i])
    if not v.dtype.is_float:
        raise Unsupported(f"input {i} is {v.dtype.value}: this op is lowered for float tensors")
    return v


INTEGERS = {DType.I8, DType.U8, DType.I16, DType.I32, DType.U32, DType.I64}


def arithmetic(cx: Convert, op: str, a: Value, b: Value) -> Value:
    """`a op b`: float regions for f32/f16/bf16, else i64 (integers, cast back) or f64 `wide_binary`."""
    if a.dtype.is_float and a.dtype != DType.F64:
        if b.dtype != a.dtype:          # Pow's exponent may be of another type
            b = cx.g.cast(b, a.dtype)
        return cx.g.binary(op, a, b)
    if a.dtype not in INTEGERS and a.dtype != DType.F64:
        raise Unsupported(f"{op} of {a.dtype.value} tensors")
    wide = DType.F64 if a.dtype == DType.F64 else DType.I64
    y = cx.g.wide_binary(op, *(v if v.dtype == wide else cx.g.cast(v, wide) for v in (a, b)))
    return y if a.dtype == wide else cx.g.cast(_wrapped_to(cx, y, a.dtype), a.dtype)


def _wrapped_to(cx: Convert, y: Value, dtype: DType) -> Value:
    """i64 `y` wrapped into the range of the narrower integer `dtype` (two's complement, as ONNX computes)."""
    bits = 8 * dtype.itemsize
    i64 = lambda v: cx.g.constant(np.array(v, np.int64), DType.I64)  # noqa: E731
    if dtype in (DType.U8, DType.U32):
        return cx.g.wide_binary("bitand", y, i64((1 << bits) - 1))
    half = i64(1 << (bits - 1))
    return cx.g.wide_binary("sub", cx.g.wide_binary("bitand", cx.g.wide_binary("add", y, half),
                                                    i64((1 << bits) - 1)), half)


BITWISE = {"BitwiseAnd": "bitand", "BitwiseOr": "bitor", "BitwiseXor": "bitxor"}


@converts(*BITWISE, "BitShift", "BitwiseNot")
def _bitwise(cx: Convert, node) -> list:
    a = cx.tensor(node.input[0])
    if a.dtype not in INTEGERS:
        raise Unsupported(f"{node.op_type} of {a.dtype.value} tensors (integers only)")
    if node.op_type == "BitwiseNot":
        return [arithmetic(cx, "bitxor", a, cx.g.constant(np.array(-1, np.int64), DType.I64))]
    op = BITWISE.get(node.op_type) or ("shl" if cx.attr(node, "direction") == "LEFT" else "shr")
    return [arithmetic(cx, op, a, cx.tensor(node.input[1]))]


@converts(*BINARY)
def _binary(cx: Convert, node) -> list:
    a = cx.tensor(node.input[0])
    if node.op_type == "Pow" and _is_square(cx, a, node.input[1]):
        return [cx.g.mul(a, a)]                # x² as a product: no exp/log per element (STFT magnitudes)
    return [arithmetic(cx, BINARY[node.op_type], a, cx.tensor(node.input[1]))]


def _is_square(cx: Convert, a: Value, exponent: str) -> bool:
    """True when `exponent` is a constant 2 that does not broadcast `a` (a float tensor, not f64)."""
    e = cx.const(exponent)
    return (e is not None and np.size(e) == 1 and np.ndim(e) <= a.ndim and float(np.asarray(e).reshape(-1)[0]) == 2.0
            and a.dtype.is_float and a.dtype != DType.F64)


@converts("Max", "Min", "Sum", "Mean")
def _variadic(cx: Convert, node) -> list:
    op = {"Max": "max", "Min": "min", "Sum": "add", "Mean": "add"}[node.op_type]
    vals = [cx.tensor(i) for i in node.input]
    out = vals[0]
    for v in vals[1:]:
        out = arithmetic(cx, op, out, v)
    if node.op_type == "Mean":
        out = arithmetic(cx, "mul", out, cx.g.constant(np.full((), 1.0 / len(vals)), out.dtype))
    return [out]


@converts(*UNARY)
def _unary(cx: Convert, node) -> list:
    x = _float(cx, node)
    if x.dtype == DType.F64:
        return [cx.g.wide_activation(UNARY[node.op_type], x)]
    return [cx.g.activation(UNARY[node.op_type], x)]


@converts("Round")
def _round(cx: Convert, node) -> list:
    """Round half to even (ONNX, NumPy): `f = ⌊x + ½⌋`, less one where x was a tie and f is odd; |x| ≥ 2²³ is
    already an integer (and x + ½ would round there)."""
    g = cx.g
    x = _float(cx, node)
    f = g.activation("floor", x + 0.5)
    odd = f - g.activation("floor", f * 0.5) * 2.0
    rounded = f - g.where_(g.compare("eq", f - x, g.constant(0.5)), odd, g.constant(0.0))
    return [g.where_(g.compare("ge", g.activation("abs", x), g.constant(float(2 ** 23))), x, rounded)]


def _inverse_and_hyperbolic(g, op: str, x: Value) -> Value:
    """asin/acos/sinh/cosh/asinh/acosh/atanh from exp, log, sqrt and atan."""
    if op in ("Sinh", "Cosh"):
        e, inv = g.exp(x), g.exp(-x)
        return (e - inv if op == "Sinh" else e + inv) * 0.5
    if op in ("Asinh", "Acosh"):
        return g.log(x + g.sqrt(x * x + (1.0 if op == "Asinh" else -1.0)))
    if op == "Atanh":
        return g.log((x + 1.0) / (1.0 - x)) * 0.5
    asin = g.activation("atan", x / g.sqrt(1.0 - x * x))
    return asin if op == "Asin" else (asin * -1.0) + float(np.pi / 2)


@converts("Asin", "Acos", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh")
def _trig(cx: Convert, node) -> list:
    return [_inverse_and_hyperbolic(cx.g, node.op_type, _float(cx, node))]


@converts("IsInf")
def _isinf(cx: Convert, node) -> list:
    g = cx.g
    x = _float(cx, node)
    hits = [g.cast(g.compare("eq", x, g.constant(np.array(sign * np.inf, np.float32), x.dtype)), "f32")
            for sign, attr in ((1.0, "detect_positive"), (-1.0, "detect_negative")) if int(cx.attr(node, attr, 1))]
    if not hits:
        return [g.constant(np.zeros(x.shape, bool))]
    return [g.compare("gt", hits[0] + hits[1] if len(hits) == 2 else hits[0], g.constant(0.5))]


@converts("Gelu")
def _gelu(cx: Convert, node) -> list:
    approx = cx.attr(node, "approximate", "none")
    if approx not in ("none", "tanh"):
        raise Unsupported(f"approximate={approx!r} (none or tanh)")
    return [cx.g.activation("gelu" if approx == "none" else "gelu_approx", _float(cx, node))]


@converts("LeakyRelu")
def _leaky(cx: Convert, node) -> list:
    x = _float(cx, node)
    return [cx.g.where_(x < 0.0, x * float(cx.attr(node, "alpha", 0.01)), x)]


@converts("Elu", "Selu", "Celu")
def _elu(cx: Convert, node) -> list:
    x = _float(cx, node)
    default = {"Elu": 1.0, "Selu": 1.67326319217681884765625, "Celu": 1.0}[node.op_type]
    alpha = float(cx.attr(node, "alpha", default))
    if node.op_type == "Celu":
        neg = (cx.g.exp(x * (1.0 / alpha)) - 1.0) * alpha
    else:
        neg = (cx.g.exp(x) - 1.0) * alpha
    out = cx.g.where_(x > 0.0, x, neg)
    if node.op_type == "Selu":
        out = out * float(cx.attr(node, "gamma", 1.05070102214813232421875))
    return [out]


@converts("Swish")
def _swish(cx: Convert, node) -> list:
    x = _float(cx, node)
    return [x * cx.g.sigmoid(x * float(cx.attr(node, "alpha", 1.0)))]


@converts("SwiGLU")
def _swiglu(cx: Convert, node) -> list:
    """`a · sigmoid(alpha·a) · b` (Swish of a gating b; the operands have one shape)."""
    a, b = _float(cx, node, 0), _float(cx, node, 1)
    if a.shape != b.shape:
        raise Unsupported(f"operands of shapes {list(a.shape)} and {list(b.shape)} (SwiGLU does not broadcast)")
    return [a * cx.g.sigmoid(a * float(cx.attr(node, "alpha", 1.0))) * b]


@converts("Shrink")
def _shrink(cx: Convert, node) -> list:
    g = cx.g
    x = _float(cx, node)
    lam, bias = float(cx.attr(node, "lambd", 0.5)), float(cx.attr(node, "bias", 0.0))
    zero = g.constant(0.0)
    return [g.where_(x < -lam, x + bias, g.where_(x > lam, x - bias, zero))]


@converts("Dropout")
def _dropout(cx: Convert, node) -> list:
    training = cx.need_const(node, 2, "training_mode") if cx.has(node, 2) else np.array(False)
    if bool(np.asarray(training).reshape(-1)[0]):
        raise Unsupported("training_mode=True (random masks): inference only")
    x = cx.tensor(node.input[0])
    return [x, cx.g.constant(np.ones(x.shape, bool), DType.Bool)]


@converts("HardSigmoid")
def _hard_sigmoid(cx: Convert, node) -> list:
    x = _float(cx, node)
    y = x * float(cx.attr(node, "alpha", 0.2)) + float(cx.attr(node, "beta", 0.5))
    return [cx.g.minimum(cx.g.maximum(y, cx.g.constant(0.0)), cx.g.constant(1.0))]


@converts("ThresholdedRelu")
def _thresholded(cx: Convert, node) -> list:
    x = _float(cx, node)
    return [cx.g.where_(x > float(cx.attr(node, "alpha", 1.0)), x, cx.g.constant(0.0))]


@converts("PRelu")
def _prelu(cx: Convert, node) -> list:
    x, slope = _float(cx, node, 0), _float(cx, node, 1)
    return [cx.g.where_(x < 0.0, x * slope, x)]


@converts("Clip")
def _clip(cx: Convert, node) -> list:
    lo = cx.attr(node, "min") if cx.opset.get("", 13) < 11 else (cx.tensor(node.input[1]) if cx.has(node, 1) else None)
    hi = cx.attr(node, "max") if cx.opset.get("", 13) < 11 else (cx.tensor(node.input[2]) if cx.has(node, 2) else None)
    x = cx.tensor(node.input[0])
    if x.dtype in INTEGERS:                      # exact: i64 max/min, wrapped back to the dtype
        for op, bound in (("max", lo), ("min", hi)):
            if bound is not None:
                x = arithmetic(cx, op, x, bound)
        return [x]
    x = _float(cx, node)
    if lo is not None:
        x = cx.g.maximum(x, lo if isinstance(lo, Value) else cx.g.constant(float(lo)))
    if hi is not None:
        x = cx.g.minimum(x, hi if isinstance(hi, Value) else cx.g.constant(float(hi)))
    return [x]


@converts(*COMPARE)
def _compare(cx: Convert, node) -> list:
    a, b = cx.tensor(node.input[0]), cx.tensor(node.input[1])
    if a.dtype in INTEGERS or a.dtype == DType.Bool:
        return [cx.g.wide_compare(COMPARE[node.op_type], *(_as_i64(cx, v) for v in (a, b)))]
    return [cx.g.compare(COMPARE[node.op_type], _float(cx, node, 0), _float(cx, node, 1))]


def _as_i64(cx: Convert, v: Value) -> Value:
    return v if v.dtype == DType.I64 else cx.g.cast(v, DType.I64)


@converts("Where")
def _where(cx: Convert, node) -> list:
    cond, a, b = (cx.tensor(i) for i in node.input)
    if a.dtype.is_float and a.dtype != DType.F64:
        return [cx.g.where_(cond, _float(cx, node, 1), _float(cx, node, 2))]
    if a.dtype.itemsize in (4, 8) and a.dtype == b.dtype:
        return [cx.g.wide_where(cond, a, b)]
    if a.dtype not in INTEGERS and a.dtype != DType.Bool:
        raise Unsupported(f"Where of {a.dtype.value} values")
    return [cx.g.cast(cx.g.wide_where(cond, _as_i64(cx, a), _as_i64(cx, b)), a.dtype)]


# ── products ───────────────────────────────────────────────────────────────

@converts("MatMul")
@in_f32
def _matmul(cx: Convert, node) -> list:
    a, b = _float(cx, node, 0), _float(cx, node, 1)
    g = cx.g
    if a.ndim == 1 and b.ndim == 1:
        return [g.reshape(g.matmul(g.reshape(a, [1, -1]), g.reshape(b, [-1, 1])), [])]
    if a.ndim == 1:
        out = g.matmul(g.reshape(a, [1, -1]), b)
        return [g.reshape(out, [*out.shape[:-2], out.shape[-1]])]
    if b.ndim == 1:
        out = g.matmul(a, g.reshape(b, [-1, 1]))
        return [g.reshape(out, out.shape[:-1])]
    return [g.matmul(*_broadcast_batches(g, a, b))]


def _broadcast_batches(g, a: Value, b: Value) -> tuple[Value, Value]:
    """`a` and `b` broadcast to their common batch dims when both have batch dims that only partly match."""
    ba, bb = a.shape[:-2], b.shape[:-2]
    if not bb or not ba or ba == bb or int(np.prod(bb)) == 1:
        return a, b
    batch = tuple(np.broadcast_shapes(ba, bb))
    return tuple(v if v.shape[:-2] == batch else g.broadcast_to(v, batch + v.shape[-2:]) for v in (a, b))


@converts("Gemm")
@in_f32
def _gemm(cx: Convert, node) -> list:
    g = cx.g
    a, b = _float(cx, node, 0), _float(cx, node, 1)
    if cx.attr(node, "transA", 0):
        a = g.transpose(a, [1, 0])
    if cx.attr(node, "transB", 0):
        b = g.transpose(b, [1, 0])
    y = g.matmul(a, b)
    alpha, beta = float(cx.attr(node, "alpha", 1.0)), float(cx.attr(node, "beta", 1.0))
    if alpha != 1.0:
        y = y * alpha
    if cx.has(node, 2) and beta != 0.0:
        c = _float(cx, node, 2)
        y = y + (c * beta if beta != 1.0 else c)
    return [y]


# ── reductions, softmax, norms ────────────────────────────────────────────

def _axes(cx: Convert, node, rank: int) -> tuple[int, ...] | None:
    """Reduce axes from the attribute (older opsets) or the second input (ReduceSum ≥ 13, others ≥ 18)."""
    axes = cx.attr(node, "axes")
    if axes is None and cx.has(node, 1):
        axes = [int(a) for a in cx.need_const(node, 1, "axes")]
    if axes is None or len(axes) == 0:
        return None if not cx.attr(node, "noop_with_empty_axes", 0) else ()
    return tuple(a % rank for a in axes)


def _reduce_f64(cx: Convert, op: str, x: Value, axes: tuple[int, ...], keep: bool) -> Value:
    """The sum-based reductions of f64 `x` in f64 (ReduceMax/Min/Prod of f64 are not lowered).  LogSumExp
    shifts by the f32 max (any shift near the max is exact algebra; x − m stays f64)."""
    g = cx.g
    f64 = lambda v: g.constant(np.asarray(v, np.float64), DType.F64)  # noqa: E731
    if op == "ReduceLogSumExp":
        m = _f64_shift(cx, x, axes)
        s = g.wide_sum(g.wide_activation("exp", g.wide_binary("sub", x, m)), axes, True)
        out = g.wide_binary("add", g.wide_activation("log", s), m)
        return out if keep else g.reshape(out, [d for i, d in enumerate(out.shape) if i not in axes])
    terms = {"ReduceSum": x, "ReduceMean": x, "ReduceLogSum": x, "ReduceSumSquare": g.wide_binary("mul", x, x),
             "ReduceL2": g.wide_binary("mul", x, x), "ReduceL1": None}
    if op not in terms:
        raise Unsupported(f"{op} of f64 (f64 sums are lowered: Sum, Mean, SumSquare, L1, L2, LogSum, LogSumExp)")
    s = g.wide_sum(terms[op] if op != "ReduceL1" else g.wide_activation("abs", x), axes, keep)
    if op == "ReduceMean":
        return g.wide_binary("mul", s, f64(1.0 / int(np.prod([x.shape[a] for a in axes]))))
    if op in ("ReduceL2", "ReduceLogSum"):
        return g.wide_activation("sqrt" if op == "ReduceL2" else "log", s)
    return s


REDUCE = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min", "ReduceProd": "prod"}


@converts(*REDUCE, "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp")
@in_f32
def _reduce(cx: Convert, node) -> list:
    g = cx.g
    x = cx.tensor(node.input[0])
    axes = _axes(cx, node, x.ndim)
    keep = bool(cx.attr(node, "keepdims", 1))
    if axes == ():
        return [x]
    op = node.op_type
    if x.dtype == DType.Bool and op in ("ReduceMax", "ReduceMin"):     # any / all, exact on 0/1 in f32
        return [_any_all(cx, x, op == "ReduceMin", axes, keep)]
    x = _float(cx, node)
    if x.dtype == DType.F64:
        return [_reduce_f64(cx, op, x, axes or tuple(range(x.ndim)), keep)]
    if op in REDUCE:
        return [g.reduce(x, REDUCE[op], axes, keep)]
    if op == "ReduceSumSquare":
        return [g.reduce(x * x, "sum", axes, keep)]
    if op == "ReduceL1":
        return [g.reduce(g.activation("abs", x), "sum", axes, keep)]
    if op == "ReduceL2":
        return [g.sqrt(g.reduce(x * x, "sum", axes, keep))]
    if op == "ReduceLogSum":
        return [g.log(g.reduce(x, "sum", axes, keep))]
    m = g.reduce(x, "max", axes, True)
    s = g.log(g.reduce(g.exp(x - m), "sum", axes, True)) + m
    return [s if keep else g.reshape(s, [d for i, d in enumerate(s.shape) if i not in (axes or range(x.ndim))])]


def _any_all(cx: Convert, x: Value, every: bool, axes: tuple[int, ...] | None, keep: bool) -> Value:
    """ReduceMax (any) or ReduceMin (all, `every`) of a bool tensor; over an empty axis False (any) or True (all)."""
    g = cx.g
    reduced = range(x.ndim) if axes is None else axes
    if any(x.shape[a] == 0 for a in reduced):
        shape = [1 if a in reduced else d for a, d in enumerate(x.shape) if keep or a not in reduced]
        return g.constant(np.full(shape, every, np.bool_), DType.Bool)
    return g.compare("ne", g.reduce(g.cast(x, DType.F32), "min" if every else "max", axes, keep), g.constant(0.0))


def _softmax_axis(cx: Convert, node, x: Value) -> tuple[Value, int, tuple | None]:
    """Softmax's axis; before opset 13 the input is flattened to 2-D at `axis` first."""
    axis = cx.attr(node, "axis", -1 if cx.opset.get("", 13) >= 13 else 1) % max(x.ndim, 1)
    if cx.opset.get("", 13) >= 13 or axis == x.ndim - 1:
        return x, axis, None
    lead = int(np.prod(x.shape[:axis]))
    return cx.g.reshape(x, [lead, -1]), 1, x.shape


@converts("Softmax", "LogSoftmax")
@in_f32
def _softmax(cx: Convert, node) -> list:
    x0 = _float(cx, node)
    x, axis, restore = _softmax_axis(cx, node, x0)
    if x.dtype == DType.F64:
        y = _softmax_f64(cx, x, axis % x.ndim, node.op_type == "LogSoftmax")
    else:
        y = cx.g.softmax(x, axis)
        if node.op_type == "LogSoftmax":
            y = cx.g.log(y)
    return [cx.g.reshape(y, restore) if restore else y]


def _softmax_f64(cx: Convert, x: Value, axis: int, log: bool) -> Value:
    """Softmax (or LogSoftmax) of f64 `x` along `axis` in f64: `x − m` over the f32-rounded max `m` (the
    shift cancels exactly), `exp`, and the wide sum."""
    g = cx.g
    shifted = g.wide_binary("sub", x, _f64_shift(cx, x, (axis,)))
    total = g.wide_sum(g.wide_activation("exp", shifted), (axis,), True)
    if log:
        return g.wide_binary("sub", shifted, g.wide_activation("log", total))
    return g.wide_binary("div", g.wide_activation("exp", shifted), total)


def _f64_shift(cx: Convert, x: Value, axes: tuple[int, ...]) -> Value:
    """The max of f64 `x` over `axes` (kept), rounded through f32 (0 where that is not finite): a shift for
    exp-sums that cancels exactly."""
    g = cx.g
    m = g.reduce(g.cast(x, DType.F32), "max", axes, True)
    finite = g.compare("lt", g.activation("abs", m), g.constant(float("inf")))
    return g.wide_where(finite, g.cast(m, DType.F64), g.constant(np.zeros((), np.float64), DType.F64))


@converts("LayerNormalization")
def _layer_norm(cx: Convert, node) -> list:
    x = _float(cx, node)
    axis = cx.attr(node, "axis", -1) % x.ndim
    eps = float(cx.attr(node, "epsilon", 1e-5))
    scale = cx.tensor(node.input[1])
    if axis != x.ndim - 1 or (len(node.output) > 1 and any(node.output[1:])):
        return _layer_norm_general(cx, node, x, axis, eps, scale)
    h = x.shape[-1]
    bias = cx.tensor(node.input[2]) if cx.has(node, 2) else cx.g.constant(np.zeros(h, np.float32))
    return [cx.g.layer_norm(x, _vector(cx, scale, h), _vector(cx, bias, h), eps=eps)]


def _layer_norm_general(cx: Convert, node, x: Value, axis: int, eps: float, scale: Value) -> list:
    """LayerNormalization over the axes from `axis` on, with the Mean and InvStdDev outputs, as reductions."""
    g = cx.g
    axes = tuple(range(axis, x.ndim))
    mean = g.reduce(x, "mean", axes, True)
    d = x - mean
    inv = g.activation("recip", g.sqrt(g.reduce(d * d, "mean", axes, True) + eps))
    y = d * inv * scale
    if cx.has(node, 2):
        y = y + cx.tensor(node.input[2])
    return [y, mean, inv]


def _vector(cx: Convert, v: Value, h: int) -> Value:
    """A per-channel tensor as `[h]` (broadcast shapes like `[1, h]` are reshaped; a scalar is expanded)."""
    if v.shape == (h,):
        return v
    if int(np.prod(v.shape)) == h:
        return cx.g.reshape(v, [h])
    if int(np.prod(v.shape)) == 1:
        return cx.g.broadcast_to(cx.g.reshape(v, [1]), (h,))
    raise Unsupported(f"a per-channel tensor of shape {list(v.shape)} for {h} channels")


@converts("Einsum")
@in_f32
def _einsum(cx: Convert, node) -> list:
    """Each operand laid out over all the equation's letters (broadcast 1s), multiplied, summed over the
    letters the output drops — simple and O(all dims); repeated letters in one operand are refused."""
    g = cx.g
    eq = cx.attr(node, "equation").replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if "..." in eq or any(len(set(t)) != len(t) for t in terms):
        raise Unsupported(f"equation {eq!r} (ellipsis or a repeated letter within one operand)")
    xs = [_float(cx, node, i) for i in range(len(terms))]
    if not arrow:                      # implicit output: the letters used once, alphabetically
        out = "".join(sorted(c for c in set(lhs) - {","} if lhs.count(c) == 1))
    letters = list(out) + sorted(set(lhs) - set(out) - {","})
    prod = None
    for term, x in zip(terms, xs):
        order = sorted(range(len(term)), key=lambda i: letters.index(term[i]))
        if order != list(range(len(term))):
            x = g.transpose(x, order)
        dims = {term[i]: x.shape[k] for k, i in enumerate(order)}
        x = g.reshape(x, [dims.get(c, 1) for c in letters])
        prod = x if prod is None else prod * x
    dropped = tuple(range(len(out), len(letters)))
    return [g.reduce(prod, "sum", dropped) if dropped else prod]
