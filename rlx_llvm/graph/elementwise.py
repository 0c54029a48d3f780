"""Element-wise ops: binary arithmetic, activations, compare/where — all lowered as `ElementwiseRegion`s.

Every element-wise node is a one-step region until `fuse` merges chains of them into one.  A region
reads each input in full, as a scalar, or tiled by its trailing shape; any other broadcast
(`[B, 1, D]` against `[B, S, D]`) is first materialized with a broadcasting `Transpose`.  Bool values
(compare results) are 1-byte in memory and 1.0/0.0 inside a region.
"""
from __future__ import annotations

from typing import Any

from .. import thunks as T
from ..dtypes import DType, LaneKind
from ..ops import Activation, BinaryOp, CmpOp
from ..ops import ActivationStep, Binary, Compare, Input, Where
from .core import GraphError, Node, Value, broadcast, numel
from .lower import LowerContext
from .opset import infers, lowers

BINARY_OPS = {"add": BinaryOp.Add, "sub": BinaryOp.Sub, "mul": BinaryOp.Mul, "div": BinaryOp.Div,
              "max": BinaryOp.Max, "min": BinaryOp.Min, "pow": BinaryOp.Pow, "mod": BinaryOp.Mod,
              "atan2": BinaryOp.Atan2, "+": BinaryOp.Add, "-": BinaryOp.Sub, "*": BinaryOp.Mul,
              "/": BinaryOp.Div}
COMPARE_OPS = {"eq": CmpOp.Eq, "ne": CmpOp.Ne, "lt": CmpOp.Lt, "le": CmpOp.Le, "gt": CmpOp.Gt, "ge": CmpOp.Ge,
               "==": CmpOp.Eq, "!=": CmpOp.Ne, "<": CmpOp.Lt, "<=": CmpOp.Le, ">": CmpOp.Gt, ">=": CmpOp.Ge}
ACTIVATIONS = {"gelu": Activation.Gelu, "gelu_approx": Activation.GeluApprox, "silu": Activation.Silu,
               "relu": Activation.Relu, "sigmoid": Activation.Sigmoid, "tanh": Activation.Tanh,
               "exp": Activation.Exp, "log": Activation.Log, "sqrt": Activation.Sqrt, "rsqrt": Activation.Rsqrt,
               "neg": Activation.Neg, "abs": Activation.Abs, "round": Activation.Round, "sin": Activation.Sin,
               "cos": Activation.Cos, "tan": Activation.Tan, "atan": Activation.Atan, "recip": Activation.Recip,
               "floor": Activation.Floor, "ceil": Activation.Ceil, "sign": Activation.Sign,
               "softplus": Activation.Softplus, "elu": Activation.Elu, "erf": Activation.Erf,
               "hard_swish": Activation.HardSwish, "hard_sigmoid": Activation.HardSigmoid,
               "mish": Activation.Mish, "softsign": Activation.Softsign, "log_sigmoid": Activation.LogSigmoid}
REGION_DTYPES = {DType.F32: LaneKind.F32, DType.F16: LaneKind.F16, DType.BF16: LaneKind.Bf16}
ELEMENTWISE = ("binary", "activation", "compare", "where")


def _choice(table: dict, key: str, op: str) -> Any:
    try:
        return table[key.lower() if isinstance(key, str) else key]
    except (KeyError, AttributeError):
        raise GraphError(f"{op}: unknown kind {key!r} (choose one of {', '.join(k for k in table if k.isalpha() or '_' in k)})") from None


class ElementwiseOps:
    """Builders for element-wise ops (mixed into `Graph`)."""

    def binary(self, op: str, a: Value, b: Value) -> Value:
        """`op(a, b)` with NumPy broadcasting; op is add sub mul div max min pow mod atan2 (or + - * /)."""
        return self.add_node("binary", (a, b), {"op": _choice(BINARY_OPS, op, "binary")})

    def add(self, a: Value, b: Value) -> Value:
        """a + b."""
        return self.binary("add", a, b)

    def sub(self, a: Value, b: Value) -> Value:
        """a − b."""
        return self.binary("sub", a, b)

    def mul(self, a: Value, b: Value) -> Value:
        """a · b."""
        return self.binary("mul", a, b)

    def div(self, a: Value, b: Value) -> Value:
        """a / b."""
        return self.binary("div", a, b)

    def pow(self, a: Value, b: Value) -> Value:
        """a ** b."""
        return self.binary("pow", a, b)

    def maximum(self, a: Value, b: Value) -> Value:
        """Element-wise max (NaN-ignoring, as RLX's Max)."""
        return self.binary("max", a, b)

    def minimum(self, a: Value, b: Value) -> Value:
        """Element-wise min."""
        return self.binary("min", a, b)

    def activation(self, kind: str, x: Value) -> Value:
        """`kind(x)`: gelu (erf form) gelu_approx silu relu sigmoid tanh exp log sqrt rsqrt neg abs round …"""
        return self.add_node("activation", (x,), {"act": _choice(ACTIVATIONS, kind, "activation")})

    def gelu(self, x: Value) -> Value:
        """GELU, erf form."""
        return self.activation("gelu", x)

    def silu(self, x: Value) -> Value:
        """x·sigmoid(x)."""
        return self.activation("silu", x)

    def relu(self, x: Value) -> Value:
        """max(x, 0)."""
        return self.activation("relu", x)

    def sigmoid(self, x: Value) -> Value:
        """1/(1 + e^−x)."""
        return self.activation("sigmoid", x)

    def tanh(self, x: Value) -> Value:
        """tanh(x)."""
        return self.activation("tanh", x)

    def exp(self, x: Value) -> Value:
        """e^x."""
        return self.activation("exp", x)

    def log(self, x: Value) -> Value:
        """ln x."""
        return self.activation("log", x)

    def sqrt(self, x: Value) -> Value:
        """√x."""
        return self.activation("sqrt", x)

    def neg(self, x: Value) -> Value:
        """−x."""
        return self.activation("neg", x)

    def compare(self, op: str, a: Value, b: Value) -> Value:
        """`a op b` as bool; op is eq ne lt le gt ge (or == != < <= > >=)."""
        return self.add_node("compare", (a, b), {"op": _choice(COMPARE_OPS, op, "compare")})

    def eq_(self, a: Value, b: Value) -> Value:
        """a == b."""
        return self.compare("eq", a, b)

    def lt_(self, a: Value, b: Value) -> Value:
        """a < b."""
        return self.compare("lt", a, b)

    def where_(self, cond: Value, a: Value, b: Value) -> Value:
        """`a` where `cond` is true (non-zero) else `b`, broadcast together."""
        return self.add_node("where", (cond, a, b))


def _float_dtype(nodes: list[Node], op: str) -> DType:
    dtypes = {n.dtype for n in nodes if n.dtype != DType.Bool}
    if len(dtypes) > 1:
        raise GraphError(f"{op}: operand dtypes differ ({', '.join(sorted(d.value for d in dtypes))}); cast first")
    dt = dtypes.pop() if dtypes else DType.F32
    if dt not in REGION_DTYPES:
        raise GraphError(f"{op}: element-wise math is lowered for f32, f16 and bf16 (computed in f32), not {dt.value}")
    return dt


@infers("binary")
def _infer_binary(ins: list[Node], attrs: dict) -> tuple:
    op = f"binary {attrs['op'].name.lower()}"
    return broadcast(ins[0].shape, ins[1].shape, op), _float_dtype(ins, op)


@infers("activation")
def _infer_activation(ins: list[Node], attrs: dict) -> tuple:
    return ins[0].shape, _float_dtype(ins, f"activation {attrs['act'].name.lower()}")


@infers("compare")
def _infer_compare(ins: list[Node], attrs: dict) -> tuple:
    op = f"compare {attrs['op'].name.lower()}"
    _float_dtype(ins, op)
    return broadcast(ins[0].shape, ins[1].shape, op), DType.Bool


@infers("where")
def _infer_where(ins: list[Node], attrs: dict) -> tuple:
    shape = broadcast(broadcast(ins[0].shape, ins[1].shape, "where"), ins[2].shape, "where")
    return shape, _float_dtype(ins[1:], "where")


@infers("region")
def _infer_region(ins: list[Node], attrs: dict) -> tuple:
    shape = ()
    for n in ins:
        shape = broadcast(shape, n.shape, "region")
    return (attrs.get("shape") or shape), attrs["dtype"]


def chain_of(node: Node) -> tuple:
    """The one-step region chain of an element-wise node over `Input(0..)`."""
    x = [Input(i) for i in range(len(node.inputs))]
    if node.op == "binary":
        return (Binary(node.attrs["op"], x[0], x[1]),)
    if node.op == "activation":
        return (ActivationStep(node.attrs["act"], x[0]),)
    if node.op == "compare":
        return (Compare(node.attrs["op"], x[0], x[1]),)
    if node.op == "where":
        return (Where(x[0], x[1], x[2]),)
    if node.op == "region":
        return node.attrs["chain"]
    raise GraphError(f"%{node.id} {node.op} is not element-wise")


def bcast_strides(in_shape: tuple, out_shape: tuple) -> tuple[int, ...]:
    """Element strides of `in_shape` walked over `out_shape` (0 where it broadcasts)."""
    padded = (1,) * (len(out_shape) - len(in_shape)) + tuple(in_shape)
    strides, step = [], 1
    for d in reversed(padded):
        strides.append(0 if d == 1 else step)
        step *= d
    return tuple(reversed(strides))


def region_mode(in_shape: tuple, out_shape: tuple) -> str:
    """How a region reads an input: "full", "scalar", "tile" (trailing shape) or "expand" (materialize)."""
    if numel(in_shape) == 1:
        return "scalar"
    trimmed = tuple(in_shape)
    while trimmed and trimmed[0] == 1:
        trimmed = trimmed[1:]
    if trimmed == tuple(out_shape)[len(out_shape) - len(trimmed):]:
        return "full" if numel(trimmed) == numel(out_shape) else "tile"
    return "expand"


@lowers("binary", "activation", "compare", "where", "region")
def lower_elementwise(ctx: LowerContext, node: Node) -> None:
    """One ElementwiseRegion (plus a Transpose per input that must be expanded, casts for bool operands)."""
    chain = chain_of(node)
    if node.op == "activation" and node.attrs["act"] is Activation.Gelu:
        _lower_standalone_activation(ctx, node)
        return
    out_shape, total = node.shape, numel(node.shape)
    offs, lanes, modulus, scalar_mask = [], [], [], 0
    for i, src in enumerate(node.inputs):
        n = ctx.node(src)
        mode = region_mode(n.shape, out_shape)
        operand = src
        if n.dtype == DType.Bool:
            operand = _bool_as_f32(ctx, src, n)
        if mode == "expand":
            operand = _expand(ctx, operand, n, out_shape)
            mode = "full"
        offs.append(operand)
        lanes.append(REGION_DTYPES[DType.F32 if n.dtype == DType.Bool else n.dtype])
        modulus.append(numel(n.shape) if mode == "tile" else (1 if mode == "scalar" else 0))
        scalar_mask |= (mode == "scalar") << i
    out = node.id
    if node.dtype == DType.Bool:
        out = ctx.scratch(total * 4, "f32 result")
    out_lane = REGION_DTYPES[DType.F32 if node.dtype == DType.Bool else node.dtype]
    ctx.emit(lambda at: T.ElementwiseRegion(dst=at(out), len=total, input_offs=tuple(at(o) for o in offs),
                                            chain=tuple(chain), scalar_input_mask=scalar_mask,
                                            input_modulus=tuple(modulus), in_lanes=tuple(lanes), out_lane=out_lane),
             reads=offs, writes=[out])
    if node.dtype == DType.Bool:
        ctx.emit(lambda at: T.CastF32ToBool(src=at(out), dst=at(node.id), len=total), reads=[out], writes=[node.id])


def _bool_as_f32(ctx: LowerContext, src: int, n: Node):
    tmp = ctx.scratch(numel(n.shape) * 4, "bool as f32")
    ctx.emit(lambda at: T.CastBoolToF32(src=at(src), dst=at(tmp), len=numel(n.shape)), reads=[src], writes=[tmp])
    return tmp


def _expand(ctx: LowerContext, operand, n: Node, out_shape: tuple):
    """Materialize a leading/middle broadcast of `operand` to `out_shape` (a broadcasting Transpose)."""
    width = 4 if n.dtype == DType.Bool else n.dtype.itemsize
    tmp = ctx.scratch(numel(out_shape) * width, f"%{n.id} broadcast")
    strides = bcast_strides(n.shape, out_shape)
    ctx.emit(lambda at: T.Transpose(src=at(operand), dst=at(tmp), in_total=numel(n.shape), out_dims=tuple(out_shape),
                                    in_strides=strides, elem_bytes=width), reads=[operand], writes=[tmp])
    return tmp


def _lower_standalone_activation(ctx: LowerContext, node: Node) -> None:
    """Activations a region computes differently (erf GELU): ActivationInPlace, on a copy unless the input dies here."""
    src = node.inputs[0]
    if node.dtype != DType.F32:
        raise GraphError(f"%{node.id} activation gelu: lowered for f32 only, got {node.dtype.value}")
    total = numel(node.shape)
    if not ctx.reuse_input(node, src):
        copy_into(ctx, src, node.id, total * 4)
    ctx.emit(lambda at: T.ActivationInPlace(data=at(node.id), len=total, act=node.attrs["act"]),
             reads=[node.id], writes=[node.id])


def copy_into(ctx: LowerContext, src, dst, nbytes: int) -> None:
    """Copy `nbytes` (a multiple of 4) from `src` to `dst`."""
    if nbytes % 4:
        raise GraphError(f"internal: copy of {nbytes} bytes is not whole 4-byte words")
    ctx.emit(lambda at: T.Copy(src=at(src), dst=at(dst), len=nbytes // 4), reads=[src], writes=[dst])


@infers("bias_add")
def _infer_bias_add(ins: list[Node], attrs: dict) -> tuple:
    return ins[0].shape, ins[0].dtype


@lowers("bias_add")
def lower_bias_add(ctx: LowerContext, node: Node) -> None:
    """BiasAdd over `[rows, n]` (made by the bias_add pass)."""
    ix, ib = node.inputs
    n = node.shape[-1]
    m = numel(node.shape) // n if n else 0
    ctx.emit(lambda at: T.BiasAdd(src=at(ix), bias=at(ib), dst=at(node.id), m=m, n=n), reads=[ix, ib],
             writes=[node.id])


@infers("sgd_momentum")
def _infer_sgd(ins: list[Node], attrs: dict) -> tuple:
    return ins[0].shape, ins[0].dtype


@infers("sgd_velocity")
def _infer_velocity(ins: list[Node], attrs: dict) -> tuple:
    raise GraphError("sgd_velocity is made by the sgd_momentum pass with its shape")


@lowers("sgd_velocity")
def lower_velocity(ctx: LowerContext, node: Node) -> None:
    """Nothing: the sgd_momentum step that reads this node writes it."""


@lowers("sgd_momentum")
def lower_sgd(ctx: LowerContext, node: Node) -> None:
    """One SgdMomentum writing p' (this node) and v' (its `sgd_velocity` input)."""
    ip, iv, ig, v_new = node.inputs
    total = numel(node.shape)
    ctx.emit(lambda at: T.SgdMomentum(param=at(ip), vel=at(iv), grad=at(ig), p_out=at(node.id), v_out=at(v_new),
                                      lr=node.attrs["lr"], mom=node.attrs["mom"], len=total),
             reads=[ip, iv, ig], writes=[node.id, v_new])
