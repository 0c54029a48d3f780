"""Ops the ONNX importer needs beyond the other families, each one thunk:

    y = g.wide_binary("add", a, b)                        # i64 (or f64) math, NumPy broadcasting: BinaryFull / BinaryFullF64
    m = g.wide_compare("lt", a, b)                        # i64 comparison to bool, broadcasting: Compare
    y = g.wide_where(m, a, b)                             # select of 4- or 8-byte values: Where (operands expanded)
    y = g.wide_activation("exp", x)                       # f64 exp, log, sqrt, abs … (no gelu/silu): ActivationF64
    y = g.wide_sum(x, axes, keep_dim)                     # f64 sum: one ReduceSumF64 per contiguous run of axes
    y = g.gather_elements(x, idx, axis)                   # take_along_axis: GatherElements (any dtype)
    y = g.gather_nd(x, idx, batch_dims=0)                 # ONNX GatherND on 4-byte data: GatherNd
    y = g.scatter_elements(x, idx, upd, axis, "add")      # ONNX ScatterElements on f32: ScatterElements
    y = g.scatter_nd(x, idx, upd, "none")                 # ONNX ScatterND on f32: ScatterNd

i64 arithmetic follows the thunk: wrapping, division truncates toward zero, x/0 = x%0 = 0.  ONNX
indices (i32 are widened to i64): a negative index gets `+ dim` once, then clamps into the axis;
scatters apply updates in order (with no reduction the last duplicate wins).
"""
from __future__ import annotations

from .. import thunks as T
from ..dtypes import DType
from ..ops import Activation, BinaryOp, ScatterNdReduction
from .elementwise import ACTIVATIONS, COMPARE_OPS, _choice, copy_into
from .core import GraphError, Node, Value, broadcast, numel
from .elementwise import bcast_strides
from .lower import LowerContext
from .opset import infers, lowers
from .reductions import _runs

WIDE_OPS = {"add": BinaryOp.Add, "sub": BinaryOp.Sub, "mul": BinaryOp.Mul, "div": BinaryOp.Div, "max": BinaryOp.Max,
            "min": BinaryOp.Min, "pow": BinaryOp.Pow, "mod": BinaryOp.Mod, "bitand": BinaryOp.BitAnd,
            "bitor": BinaryOp.BitOr, "bitxor": BinaryOp.BitXor, "shl": BinaryOp.Shl, "shr": BinaryOp.Shr}
WIDE_DTYPES = (DType.I64, DType.F64)
REDUCTIONS = {"none": ScatterNdReduction.None_, "add": ScatterNdReduction.Add, "mul": ScatterNdReduction.Mul,
              "max": ScatterNdReduction.Max, "min": ScatterNdReduction.Min}
INDEX_DTYPES = (DType.I32, DType.I64)


class OnnxExtraOps:
    """Builders for the importer's extra ops (mixed into `Graph`)."""

    def wide_binary(self, op: str, a: Value, b: Value) -> Value:
        """`a op b` on i64 or f64 operands of one dtype, NumPy broadcasting."""
        if op not in WIDE_OPS:
            raise GraphError(f"wide_binary: unknown op {op!r} (choose one of {', '.join(WIDE_OPS)})")
        return self.add_node("wide_binary", (a, b), {"op": WIDE_OPS[op]})

    def wide_activation(self, kind: str, x: Value) -> Value:
        """`kind(x)` on f64 `x` (every activation but gelu, gelu_approx and silu)."""
        return self.add_node("wide_activation", (x,), {"act": _choice(ACTIVATIONS, kind, "wide_activation")})

    def wide_sum(self, x: Value, axes: "tuple[int, ...]", keep_dim: bool) -> Value:
        """Sum of f64 `x` over `axes` (sorted, non-negative)."""
        return self.add_node("wide_sum", (x,), {"axes": tuple(sorted(axes)), "keep_dim": bool(keep_dim)})

    def wide_compare(self, op: str, a: Value, b: Value) -> Value:
        """`a op b` (eq ne lt le gt ge) on i64 operands as bool, NumPy broadcasting."""
        if op not in COMPARE_OPS:
            raise GraphError(f"wide_compare: unknown op {op!r} (choose one of eq, ne, lt, le, gt, ge)")
        return self.add_node("wide_compare", (a, b), {"op": COMPARE_OPS[op]})

    def wide_where(self, cond: Value, a: Value, b: Value) -> Value:
        """`cond ? a : b` for bool `cond` and 4- or 8-byte `a`, `b` of one dtype, NumPy broadcasting."""
        shape = broadcast(broadcast(cond.shape, a.shape, "wide_where"), b.shape, "wide_where")
        cond, a, b = (v if v.shape == shape else self.broadcast_to(v, shape) for v in (cond, a, b))
        return self.add_node("wide_where", (cond, a, b), {})

    def gather_elements(self, x: Value, idx: Value, axis: int) -> Value:
        """`out[i] = x[i with i[axis] ← idx[i]]`: the shape of `idx`, the dtype of `x`."""
        return self.add_node("gather_elements", (x, self._i64(idx)), {"axis": int(axis) % max(x.ndim, 1)})

    def gather_nd(self, x: Value, idx: Value, batch_dims: int = 0) -> Value:
        """ONNX GatherND: `idx[..., k]` tuples address slices of 4-byte `x` after `batch_dims` shared dims."""
        return self.add_node("gather_nd", (x, self._i64(idx)), {"batch_dims": int(batch_dims)})

    def scatter_elements(self, x: Value, idx: Value, updates: Value, axis: int, reduction: str = "none") -> Value:
        """A copy of f32 `x` with `updates` written (or reduced) at `x[i with i[axis] ← idx[i]]`."""
        return self.add_node("scatter_elements", (x, self._i64(idx), updates),
                             {"axis": int(axis) % max(x.ndim, 1), "reduction": _reduction(reduction)})

    def scatter_nd(self, x: Value, idx: Value, updates: Value, reduction: str = "none") -> Value:
        """ONNX ScatterND: a copy of f32 `x` with `updates` slices written (or reduced) at `idx` tuples."""
        return self.add_node("scatter_nd", (x, self._i64(idx), updates), {"reduction": _reduction(reduction)})

    def _i64(self, idx: Value) -> Value:
        if idx.dtype not in INDEX_DTYPES:
            raise GraphError(f"indices must be i32 or i64, got {idx.dtype.value}")
        return idx if idx.dtype == DType.I64 else self.cast(idx, DType.I64)


def _reduction(name: str) -> ScatterNdReduction:
    if name not in REDUCTIONS:
        raise GraphError(f"scatter: unknown reduction {name!r} (choose one of {', '.join(REDUCTIONS)})")
    return REDUCTIONS[name]


@infers("wide_binary")
def _infer_wide_binary(ins: list[Node], attrs: dict) -> tuple:
    a, b = ins
    name = f"wide_binary {attrs['op'].name.lower()}"
    if a.dtype != b.dtype or a.dtype not in WIDE_DTYPES:
        raise GraphError(f"{name}: operands must both be i64 or both f64, got {a.dtype.value} and {b.dtype.value}")
    if a.dtype == DType.F64 and attrs["op"] in (BinaryOp.BitAnd, BinaryOp.BitOr, BinaryOp.BitXor, BinaryOp.Shl,
                                                 BinaryOp.Shr):
        raise GraphError(f"{name}: bit operations need i64 operands")
    return broadcast(a.shape, b.shape, name), a.dtype


def _broadcast_geometry(ctx: LowerContext, node: Node) -> dict:
    """The length, op and NumPy-broadcast stride walk fields BinaryFull and Compare share (no walk when equal)."""
    a, b = (ctx.node(i).shape for i in node.inputs)
    out = tuple(node.shape)
    same = a == b == out
    return dict(len=numel(out), lhs_len=numel(a), rhs_len=numel(b), op=node.attrs["op"],
                out_dims_bcast=() if same else out, bcast_lhs_strides=() if same else bcast_strides(a, out),
                bcast_rhs_strides=() if same else bcast_strides(b, out))


@lowers("wide_binary")
def lower_wide_binary(ctx: LowerContext, node: Node) -> None:
    """One BinaryFull (i64, elem_bytes 8) or BinaryFullF64 with a broadcast stride walk."""
    ia, ib = node.inputs
    geometry = _broadcast_geometry(ctx, node)
    if node.dtype == DType.I64:
        ctx.emit(lambda at: T.BinaryFull(lhs=at(ia), rhs=at(ib), dst=at(node.id), elem_bytes=8, **geometry),
                 reads=[ia, ib], writes=[node.id])
    else:
        ctx.emit(lambda at: T.BinaryFullF64(lhs=at(ia), rhs=at(ib), dst=at(node.id), **geometry),
                 reads=[ia, ib], writes=[node.id])


@infers("wide_activation")
def _infer_wide_activation(ins: list[Node], attrs: dict) -> tuple:
    if ins[0].dtype != DType.F64 or attrs["act"] in (Activation.Gelu, Activation.GeluApprox, Activation.Silu):
        raise GraphError(f"wide_activation {attrs['act'].name.lower()}: lowered for f64 (not gelu/silu), "
                         f"got {ins[0].dtype.value}")
    return ins[0].shape, DType.F64


@lowers("wide_activation")
def lower_wide_activation(ctx: LowerContext, node: Node) -> None:
    """One ActivationF64."""
    i = node.inputs[0]
    ctx.emit(lambda at: T.ActivationF64(src=at(i), dst=at(node.id), len=numel(node.shape), kind=node.attrs["act"]),
             reads=[i], writes=[node.id])


@infers("wide_sum")
def _infer_wide_sum(ins: list[Node], attrs: dict) -> tuple:
    x, axes = ins[0], attrs["axes"]
    if x.dtype != DType.F64:
        raise GraphError(f"wide_sum: lowered for f64, got {x.dtype.value}")
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if attrs["keep_dim"] else \
        tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return shape, DType.F64


@lowers("wide_sum")
def lower_wide_sum(ctx: LowerContext, node: Node) -> None:
    """One ReduceSumF64 per contiguous run of axes (innermost first), through scratch between them."""
    x = ctx.node(node.inputs[0])
    shape, src, runs = list(x.shape), node.inputs[0], _runs(node.attrs["axes"])
    if not runs:
        copy_into(ctx, src, node.id, numel(shape) * 8)
        return
    for k, (lo, hi) in enumerate(reversed(runs)):
        outer, reduced, inner = numel(shape[:lo]), numel(shape[lo:hi]), numel(shape[hi:])
        dst = node.id if k == len(runs) - 1 else ctx.scratch(outer * inner * 8, "partial f64 sum")
        ctx.emit(lambda at, s=src, d=dst, o=outer, r=reduced, i=inner: T.ReduceSumF64(
            src=at(s), dst=at(d), outer=o, reduced=r, inner=i), reads=[src], writes=[dst])
        shape[lo:hi] = [1] * (hi - lo)
        src = dst


@infers("wide_compare")
def _infer_wide_compare(ins: list[Node], attrs: dict) -> tuple:
    a, b = ins
    name = f"wide_compare {attrs['op'].name.lower()}"
    if a.dtype != DType.I64 or b.dtype != DType.I64:
        raise GraphError(f"{name}: operands must be i64, got {a.dtype.value} and {b.dtype.value}")
    return broadcast(a.shape, b.shape, name), DType.Bool


@infers("wide_where")
def _infer_wide_where(ins: list[Node], attrs: dict) -> tuple:
    cond, a, b = ins
    if cond.dtype != DType.Bool or a.dtype != b.dtype or a.dtype.itemsize not in (4, 8):
        raise GraphError(f"wide_where: a bool condition and two 4- or 8-byte operands of one dtype, got "
                         f"{cond.dtype.value}, {a.dtype.value} and {b.dtype.value}")
    return a.shape, a.dtype


@lowers("wide_compare")
def lower_wide_compare(ctx: LowerContext, node: Node) -> None:
    """One Compare on i64 inputs with a broadcast stride walk, writing bool."""
    ia, ib = node.inputs
    ctx.emit(lambda at: T.Compare(lhs=at(ia), rhs=at(ib), dst=at(node.id), inputs_i64=1, inputs_elem_bytes=8,
                                  dst_elem_bytes=1, lhs_scalar=False, rhs_scalar=False,
                                  **_broadcast_geometry(ctx, node)), reads=[ia, ib], writes=[node.id])


@lowers("wide_where")
def lower_wide_where(ctx: LowerContext, node: Node) -> None:
    """One byte-generic Where over operands of the output's shape."""
    ic, ia, ib = node.inputs
    ctx.emit(lambda at: T.Where(cond=at(ic), on_true=at(ia), on_false=at(ib), dst=at(node.id), len=numel(node.shape),
                                elem_bytes=node.dtype.itemsize, cond_elem_bytes=1, cond_scalar=False,
                                true_scalar=False, false_scalar=False), reads=[ic, ia, ib], writes=[node.id])


@infers("gather_elements")
def _infer_gather_elements(ins: list[Node], attrs: dict) -> tuple:
    x, idx = ins
    if len(idx.shape) != len(x.shape):
        raise GraphError(f"gather_elements: indices {list(idx.shape)} and data {list(x.shape)} differ in rank")
    if x.dtype.itemsize not in (1, 2, 4, 8):
        raise GraphError(f"gather_elements: {x.dtype.value} data is not lowered")
    return idx.shape, x.dtype


@infers("gather_nd")
def _infer_gather_nd(ins: list[Node], attrs: dict) -> tuple:
    x, idx = ins
    b = attrs["batch_dims"]
    k = idx.shape[-1] if idx.shape else 0
    if x.dtype.itemsize != 4 or not idx.shape or b + k > len(x.shape) or idx.shape[:b] != x.shape[:b]:
        raise GraphError(f"gather_nd: 4-byte data {list(x.shape)} ({x.dtype.value}), indices {list(idx.shape)} and "
                         f"batch_dims {b} do not agree")
    return (*idx.shape[:-1], *x.shape[b + k:]), x.dtype


@infers("scatter_elements", "scatter_nd")
def _infer_scatter(ins: list[Node], attrs: dict) -> tuple:
    x, idx, upd = ins
    if x.dtype != DType.F32 or upd.dtype != DType.F32:
        raise GraphError(f"scatter: lowered for f32 data and updates, got {x.dtype.value} and {upd.dtype.value}")
    return x.shape, DType.F32


def _index_geometry(ctx: LowerContext, node: Node) -> dict:
    """The shape fields every indexing thunk shares (indices are i64)."""
    x, idx = (ctx.node(i) for i in node.inputs[:2])
    return dict(data_shape=tuple(x.shape), indices_shape=tuple(idx.shape), data_len=numel(x.shape),
                indices_len=numel(idx.shape), indices_i64=1)


@lowers("gather_elements", "gather_nd", "scatter_elements", "scatter_nd")
def lower_indexing(ctx: LowerContext, node: Node) -> None:
    """One GatherElements / GatherNd / ScatterElements / ScatterNd thunk."""
    geo = _index_geometry(ctx, node)
    ix, ii = node.inputs[:2]
    if node.op == "gather_elements":
        ctx.emit(lambda at: T.GatherElements(data=at(ix), indices=at(ii), dst=at(node.id), out_len=numel(node.shape),
                                             data_elem_bytes=node.dtype.itemsize, axis=node.attrs["axis"], **geo),
                 reads=[ix, ii], writes=[node.id])
    elif node.op == "gather_nd":
        ctx.emit(lambda at: T.GatherNd(data=at(ix), indices=at(ii), dst=at(node.id), out_len=numel(node.shape),
                                       batch_dims=node.attrs["batch_dims"], **geo), reads=[ix, ii], writes=[node.id])
    else:
        iu = node.inputs[2]
        kind, extra = (T.ScatterElements, {"axis": node.attrs["axis"]}) if node.op == "scatter_elements" else \
            (T.ScatterNd, {})
        ctx.emit(lambda at: kind(data=at(ix), indices=at(ii), updates=at(iu), dst=at(node.id),
                                 updates_len=numel(ctx.node(iu).shape), reduction=node.attrs["reduction"], **extra,
                                 **geo), reads=[ix, ii, iu], writes=[node.id])
