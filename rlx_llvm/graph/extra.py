"""Ops with one thunk each beyond the dense basics: LoRA matmul, dense solves, sampling, cumsum along any
axis, argmax/argmin, top-k indices, and `custom_fn` (a sub-graph run as one CustomFn thunk).

    y = g.lora_matmul(x, w, a, b, scale=0.5)       # x @ w + 0.5·(x @ a) @ b
    s = g.dense_solve(A, B)                        # A⁻¹·B; leading dims of A and B are a batch
    t = g.sample(logits, top_k=40, top_p=0.9, temperature=0.8, seed=1)   # i32 token ids
"""
from __future__ import annotations

from typing import Sequence

from .. import thunks as T
from ..dtypes import DType
from ..schedule import ThunkSchedule
from .checks import require_f32, require_rank, same_dim, shapes_agree
from .core import DYNAMIC, GraphCore, GraphError, Node, Value, is_static, numel, parse_dtype
from .lower import LowerContext
from .opset import infers, lowers
from .session import build_schedule
from .shape import axis_index

INDEX_DTYPES = (DType.I32, DType.I64, DType.F32)


class ExtraOps:
    """Builders for LoRA, solves, sampling, cumsum, arg-reductions and top-k (mixed into `Graph`)."""

    def lora_matmul(self, x: Value, w: Value, a: Value, b: Value, scale: float = 1.0) -> Value:
        """`x @ w + scale·(x @ a) @ b` with `w [k, n]`, `a [k, r]`, `b [r, n]`; x's leading axes are rows."""
        return self.add_node("lora_matmul", (x, w, a, b), {"scale": float(scale)})

    def dense_solve(self, a: Value, b: Value) -> Value:
        """`X` with `A·X = B` (`A [..., n, n]`, `B [..., n, nrhs]`, or `[n]` for a 2-D A): LAPACK sgesv."""
        return self.add_node("dense_solve", (a, b))

    def batched_dense_solve(self, a: Value, b: Value) -> Value:
        """`dense_solve` over a leading batch: `A [batch, n, n]`, `B [batch, n, nrhs]`."""
        if a.ndim < 3:
            raise GraphError(f"batched_dense_solve: A must be [batch, n, n], got {list(a.shape)}")
        return self.dense_solve(a, b)

    def sample(self, logits: Value, top_k: int = 0, top_p: float = 1.0, temperature: float = 1.0, seed: int = 0,
               dtype: "DType | str" = "i32") -> Value:
        """One token id per row of `logits [..., vocab]` (temperature, top-k, top-p, Philox `seed`; 0 = default)."""
        if top_k < 0 or seed < 0:
            raise GraphError(f"sample: top_k and seed must be ≥ 0, got {top_k} and {seed}")
        return self.add_node("sample", (logits,), {"top_k": int(top_k), "top_p": float(top_p),
                                                   "temperature": float(temperature), "seed": int(seed),
                                                   "dtype": parse_dtype(dtype, "sample")})

    def cumsum(self, x: Value, axis: int = -1, exclusive: bool = False) -> Value:
        """Running sum along any `axis`: the last axis directly, another moved last by transposes."""
        ax = axis_index(axis, x.ndim, "cumsum")
        if ax == x.ndim - 1:
            return super().cumsum(x, -1, exclusive)
        perm = [i for i in range(x.ndim) if i != ax] + [ax]
        back = sorted(range(x.ndim), key=perm.__getitem__)
        return self.transpose(super().cumsum(self.transpose(x, perm), -1, exclusive), back)

    def argmax(self, x: Value, axis: int = -1, keep_dim: bool = False) -> Value:
        """i64 index of the first maximum along `axis` (NaN-ignoring)."""
        return self._arg_reduce(x, axis, keep_dim, True)

    def argmin(self, x: Value, axis: int = -1, keep_dim: bool = False) -> Value:
        """i64 index of the first minimum along `axis` (NaN-ignoring)."""
        return self._arg_reduce(x, axis, keep_dim, False)

    def topk(self, x: Value, k: int) -> Value:
        """i64 indices `[..., k]` of the k largest along the last axis, largest first (ties: smaller index)."""
        return self.add_node("topk", (x,), {"k": int(k)})

    def custom_fn(self, inputs: Sequence[Value], fwd_body: GraphCore) -> Value:
        """Graph `fwd_body` run as one CustomFn thunk on `inputs` (its inputs in order; static shapes, constants but
        no params, one output).  Only the forward body: pyrlx's vjp/jvp bodies are not supported."""
        return self.add_node("custom_fn", tuple(inputs), {"body": fwd_body})

    def _arg_reduce(self, x: Value, axis: int, keep_dim: bool, is_max: bool) -> Value:
        op = "argmax" if is_max else "argmin"
        return self.add_node("arg_reduce", (x,), {"axis": axis_index(axis, x.ndim, op), "keep_dim": bool(keep_dim),
                                                  "is_max": is_max})


@infers("lora_matmul")
def _infer_lora(ins: list[Node], attrs: dict) -> tuple:
    x, w, a, b = ins
    require_f32("lora_matmul", *ins)
    for what, n in (("w [k, n]", w), ("a [k, r]", a), ("b [r, n]", b)):
        require_rank("lora_matmul", what, n, 2)
    if len(x.shape) < 1 or not (same_dim(x.shape[-1], w.shape[0]) and a.shape[0] == w.shape[0]
                                and a.shape[1] == b.shape[0] and b.shape[1] == w.shape[1]):
        raise GraphError(f"lora_matmul: x {list(x.shape)}, w {list(w.shape)}, a {list(a.shape)} and b "
                         f"{list(b.shape)} must be [..., k], [k, n], [k, r] and [r, n]")
    return (*x.shape[:-1], w.shape[1]), DType.F32


@lowers("lora_matmul")
def lower_lora(ctx: LowerContext, node: Node) -> None:
    """One LoraMatMul over the rows of x."""
    ix, iw, ia, ib = node.inputs
    k, r = ctx.node(ia).shape
    n = node.shape[-1]
    ctx.emit(lambda at: T.LoraMatMul(x=at(ix), w=at(iw), a=at(ia), b=at(ib), dst=at(node.id),
                                     m=numel(node.shape[:-1]), k=k, n=n, r=r, scale=node.attrs["scale"]),
             reads=[ix, iw, ia, ib], writes=[node.id])


@infers("dense_solve")
def _infer_solve(ins: list[Node], attrs: dict) -> tuple:
    a, b = ins
    require_f32("dense_solve", a, b)
    vector = len(a.shape) == 2 and len(b.shape) == 1
    want = a.shape[:-1] if vector else (*a.shape[:-1], b.shape[-1] if b.shape else 0)
    if len(a.shape) < 2 or not same_dim(a.shape[-1], a.shape[-2]) or not shapes_agree(b.shape, want):
        raise GraphError(f"dense_solve: A {list(a.shape)} must be [..., n, n] and B {list(b.shape)} "
                         f"[..., n, nrhs] (or [n]) with the same leading dims")
    return b.shape, DType.F32


@lowers("dense_solve")
def lower_solve(ctx: LowerContext, node: Node) -> None:
    """DenseSolveF32 for one system, BatchedDenseSolveF32 for a batch (LAPACK, promoted to f64 inside)."""
    ia, ib = node.inputs
    a = ctx.node(ia)
    n = a.shape[-1]
    batch = numel(a.shape[:-2])
    nrhs = numel(node.shape) // (batch * n) if batch * n else 0
    if len(a.shape) == 2:
        ctx.emit(lambda at: T.DenseSolveF32(a=at(ia), b=at(ib), x=at(node.id), n=n, nrhs=nrhs),
                 reads=[ia, ib], writes=[node.id])
        return
    ctx.emit(lambda at: T.BatchedDenseSolveF32(a=at(ia), b=at(ib), x=at(node.id), batch=batch, n=n, nrhs=nrhs),
             reads=[ia, ib], writes=[node.id])


@infers("sample")
def _infer_sample(ins: list[Node], attrs: dict) -> tuple:
    x, = ins
    require_f32("sample", x)
    if not x.shape:
        raise GraphError("sample: logits must be [..., vocab], got a scalar")
    if attrs["dtype"] not in INDEX_DTYPES:
        raise GraphError(f"sample: output dtype must be i32, i64 or f32, got {attrs['dtype'].value}")
    return x.shape[:-1], attrs["dtype"]


@lowers("sample")
def lower_sample(ctx: LowerContext, node: Node) -> None:
    """Sample (f32 ids) into the output, or into scratch then a cast to the integer dtype."""
    ix, = node.inputs
    vocab, rows = ctx.node(ix).shape[-1], numel(node.shape)
    a = node.attrs
    ids = as_index_dtype(ctx, node, rows)
    ctx.emit(lambda at: T.Sample(logits=at(ix), dst=at(ids), batch=rows, vocab=vocab, top_k=a["top_k"],
                                 top_p=a["top_p"], temperature=a["temperature"], seed=a["seed"]),
             reads=[ix], writes=[ids])
    finish_index(ctx, node, ids, rows)


def as_index_dtype(ctx: LowerContext, node: Node, count: int):
    """Where a thunk writing f32 indices should write them: the output, or scratch when it is an integer."""
    return node.id if node.dtype == DType.F32 else ctx.scratch(count * 4, "f32 indices")


def finish_index(ctx: LowerContext, node: Node, ids, count: int) -> None:
    """Cast f32 indices from scratch `ids` into the integer output (nothing when the output is f32)."""
    if ids is not node.id:
        ctx.emit(lambda at: T.CastGeneric(src=at(ids), dst=at(node.id), len=count, src_dtype=DType.F32,
                                          dst_dtype=node.dtype), reads=[ids], writes=[node.id])


@infers("arg_reduce")
def _infer_arg_reduce(ins: list[Node], attrs: dict) -> tuple:
    x, = ins
    require_f32("argmax/argmin", x)
    ax = attrs["axis"]
    if x.shape[ax] == 0:
        raise GraphError(f"argmax/argmin: axis {ax} of {list(x.shape)} is empty")
    shape = tuple(1 if i == ax else d for i, d in enumerate(x.shape)) if attrs["keep_dim"] else \
        tuple(d for i, d in enumerate(x.shape) if i != ax)
    return shape, DType.I64


@lowers("arg_reduce")
def lower_arg_reduce(ctx: LowerContext, node: Node) -> None:
    """ArgReduce over `[outer, axis, inner]` (f32 indices), then a cast to i64."""
    ix, = node.inputs
    shape, ax = ctx.node(ix).shape, node.attrs["axis"]
    outer, inner, count = numel(shape[:ax]), numel(shape[ax + 1:]), numel(node.shape)
    ids = as_index_dtype(ctx, node, count)
    ctx.emit(lambda at: T.ArgReduce(src=at(ix), dst=at(ids), outer=outer, reduced=shape[ax], inner=inner,
                                    is_max=node.attrs["is_max"]), reads=[ix], writes=[ids])
    finish_index(ctx, node, ids, count)


@infers("topk")
def _infer_topk(ins: list[Node], attrs: dict) -> tuple:
    x, = ins
    require_f32("topk", x)
    k = attrs["k"]
    if not x.shape or k < 1 or (x.shape[-1] != DYNAMIC and k > x.shape[-1]):
        raise GraphError(f"topk: k = {k} must be in [1, {x.shape[-1] if x.shape else 0}] for {list(x.shape)}")
    return (*x.shape[:-1], k), DType.I64


@lowers("topk")
def lower_topk(ctx: LowerContext, node: Node) -> None:
    """One TopK writing i64 indices."""
    ix, = node.inputs
    width = ctx.node(ix).shape[-1]
    ctx.emit(lambda at: T.TopK(src=at(ix), dst=at(node.id), outer=numel(node.shape[:-1]), axis_dim=width,
                               k=node.attrs["k"], indices_i64=1), reads=[ix], writes=[node.id])


@infers("custom_fn")
def _infer_custom_fn(ins: list[Node], attrs: dict) -> tuple:
    body = attrs["body"]
    if not isinstance(body, GraphCore):
        raise GraphError(f"custom_fn: the body must be a Graph, got {type(body).__name__}")
    if body.params or len(body.outputs) != 1 or len(body.inputs) != len(ins):
        raise GraphError(f"custom_fn: body {body.name!r} has {len(body.inputs)} input(s), {len(body.params)} param(s) "
                         f"and {len(body.outputs)} output(s); it needs {len(ins)} input(s), no params, one output")
    for (name, i), n in zip(body.inputs.items(), ins):
        b = body.nodes[i]
        if not is_static(b.shape) or not shapes_agree(n.shape, b.shape) or n.dtype != b.dtype:
            raise GraphError(f"custom_fn: body input {name!r} is {list(b.shape)} {b.dtype.value} (static), "
                             f"given {list(n.shape)} {n.dtype.value}")
    out = body.nodes[body.outputs[0]]
    return out.shape, out.dtype


def body_program(body: GraphCore) -> tuple[ThunkSchedule, bytes, dict[str, int], int]:
    """The body compiled like any graph: schedule, arena image (constants), input offsets, output offset."""
    built = build_schedule(body, {name: body.nodes[i].shape for name, i in body.inputs.items()})
    inputs = {name: built.plan.at(v) for name, v in built.lowered.inputs.items()}
    return built.schedule, built.arena_image(), inputs, built.plan.at(built.lowered.outputs[0])


@lowers("custom_fn")
def lower_custom_fn(ctx: LowerContext, node: Node) -> None:
    """One CustomFn: copy each used input into the body arena, run the body's schedule, copy the output back."""
    schedule, image, body_inputs, body_out = body_program(node.attrs["body"])
    names = list(node.attrs["body"].inputs)
    used = [(body_inputs[name], i, numel(ctx.node(i).shape) * ctx.node(i).dtype.itemsize)
            for name, i in zip(names, node.inputs) if name in body_inputs]
    ctx.emit(lambda at: T.CustomFn(body=schedule, body_init=image, inputs=tuple((b, at(i), n) for b, i, n in used),
                                   body_output_off=body_out, outer_output_off=at(node.id),
                                   out_bytes=numel(node.shape) * node.dtype.itemsize),
             reads=list(node.inputs), writes=[node.id])
