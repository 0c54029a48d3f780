"""Graph ops that only gradients need, each with its inference and lowering (to backward thunks).

`autodiff` builds backward graphs from the ordinary builders plus these:

    broadcast_as(x, like, axes)           x (with size-1 dims inserted at `axes`) broadcast to like's shape
    reshape_as(x, like)                   x's elements in like's shape (a view)
    reciprocal_count(x, axes)             the scalar 1/Π x.shape[axes], known once shapes are concrete
    activation_backward(x, dy)            ReluBackward / ActivationBackward
    norm_backward(x, gamma, dy)           LayerNorm/RmsNormBackwardInput or …Gamma
    cumsum_backward(dy)                   CumsumBackward
    gather_backward(dy, idx, like)        GatherBackward (indices cast to f32)
    narrow_backward(dy, like)             dy placed at [start, start+length) of zeros: GatherBackward
    conv2d_backward(a, b, like)           Conv2dBackwardInput (dy, w → dx) or Conv2dBackwardWeight (x, dy → dw)
    max_pool2d_backward(x, dy)            MaxPool2dBackward
    rope_backward(dy, cos, sin)           RopeBackward
    attention_backward(q, k, v, dy[, m])  AttentionBackwardAll: dQ | dK | dV packed, read by three views
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .. import thunks as T
from ..dtypes import DType
from ..ops import Activation
from .core import DYNAMIC, GraphCore, GraphError, Node, Value, broadcast, numel
from .elementwise import bcast_strides
from .lower import LowerContext
from .opset import infers, lowers

# Activations ActivationBackward computes (the rest are differentiated by composition in autodiff).
THUNK_DERIVATIVES = frozenset(Activation) - {Activation.Erf, Activation.HardSwish, Activation.HardSigmoid,
                                              Activation.Mish, Activation.Softsign, Activation.LogSigmoid}


def broadcast_as(g: GraphCore, x: Value, like: Value, axes: Sequence[int] = ()) -> Value:
    """`x` with size-1 dims inserted at output `axes`, broadcast to `like`'s shape."""
    return g.add_node("broadcast_as", (x, like), {"axes": tuple(axes)})


def reshape_as(g: GraphCore, x: Value, like: Value) -> Value:
    """`x`'s elements in `like`'s shape (works with dynamic dims)."""
    return g.add_node("reshape_as", (x, like))


def reciprocal_count(g: GraphCore, x: Value, axes: Sequence[int]) -> Value:
    """1 / (number of elements of `x` along `axes`), a scalar constant of the specialized graph."""
    return g.add_node("reciprocal_count", (x,), {"axes": tuple(axes)})


def activation_backward(g: GraphCore, act: Activation, x: Value, dy: Value) -> Value:
    """`act'(x)·dy` by the backward thunk."""
    return g.add_node("activation_backward", (x, dy), {"act": act})


def norm_backward(g: GraphCore, norm: str, part: str, x: Value, gamma: Value, dy: Value, eps: float) -> Value:
    """The `part` ("input" or "gamma") gradient of `norm` ("layer_norm" or "rms_norm")."""
    return g.add_node("norm_backward", (x, gamma, dy), {"norm": norm, "part": part, "eps": eps})


def cumsum_backward(g: GraphCore, dy: Value, exclusive: bool) -> Value:
    """The reverse running sum of `dy` along the last axis."""
    return g.add_node("cumsum_backward", (dy,), {"exclusive": exclusive})


def gather_backward(g: GraphCore, dy: Value, idx: Value, like: Value, axis: int) -> Value:
    """Zeros of `like`'s shape with the rows of `dy` added at `idx` along `axis`."""
    return g.add_node("gather_backward", (dy, idx, like), {"axis": axis})


def narrow_backward(g: GraphCore, dy: Value, like: Value, axis: int, start: int) -> Value:
    """Zeros of `like`'s shape with `dy` at `[start, start + len)` along `axis`."""
    return g.add_node("narrow_backward", (dy, like), {"axis": axis, "start": start})


def conv2d_backward(g: GraphCore, part: str, a: Value, b: Value, like: Value, conv: dict) -> Value:
    """The conv2d gradient `part`: "input" from (dy, w), "weight" from (x, dy); `conv` holds the forward attrs."""
    return g.add_node("conv2d_backward", (a, b, like), {**conv, "part": part})


def max_pool2d_backward(g: GraphCore, x: Value, dy: Value, pool: dict) -> Value:
    """`dy` routed to the first arg-max of each window of `x`."""
    return g.add_node("max_pool2d_backward", (x, dy), dict(pool))


def rope_backward(g: GraphCore, dy: Value, cos: Value, sin: Value, rope: dict) -> Value:
    """The transpose of the rotation (sin negated)."""
    return g.add_node("rope_backward", (dy, cos, sin), dict(rope))


def attention_backward(g: GraphCore, ins: Sequence[Value], dy: Value, attention: dict) -> tuple[Value, Value, Value]:
    """(dQ, dK, dV) of attention over `ins` = (q, k, v[, mask]): one recompute, three views of its result."""
    q, k, v, *mask = ins
    packed = g.add_node("attention_backward", (q, k, v, dy, *mask), dict(attention))
    return tuple(g.add_node("attention_grad", (packed, like), {"part": part}) for part, like in zip("qkv", (q, k, v)))


# ── inference ───────────────────────────────────────────────────────────────

def _inserted(shape: tuple, axes: tuple, rank: int) -> tuple:
    """`shape` with size-1 dims at output positions `axes` (a no-op when it already has `rank` dims)."""
    if len(shape) == rank:
        return tuple(shape)
    dims = iter(shape)
    return tuple(1 if i in axes else next(dims) for i in range(rank))


@infers("broadcast_as")
def _infer_broadcast_as(ins: list[Node], attrs: dict) -> tuple:
    x, like = ins
    if len(x.shape) + len(attrs["axes"]) != len(like.shape) and len(x.shape) != len(like.shape):
        raise GraphError(f"broadcast_as: {list(x.shape)} with axes {list(attrs['axes'])} does not match the rank "
                         f"of {list(like.shape)}")
    padded = _inserted(x.shape, attrs["axes"], len(like.shape))
    if broadcast(padded, like.shape, "broadcast_as") != like.shape:
        raise GraphError(f"broadcast_as: {list(x.shape)} does not broadcast to {list(like.shape)}")
    return like.shape, x.dtype


@infers("reshape_as")
def _infer_reshape_as(ins: list[Node], attrs: dict) -> tuple:
    return ins[1].shape, ins[0].dtype


@infers("reciprocal_count")
def _infer_reciprocal_count(ins: list[Node], attrs: dict) -> tuple:
    return (), DType.F32


@infers("activation_backward", "cumsum_backward", "rope_backward", "max_pool2d_backward")
def _infer_like_first_input(ins: list[Node], attrs: dict) -> tuple:
    return ins[0].shape, DType.F32


@infers("attention_backward")
def _infer_attention_backward(ins: list[Node], attrs: dict) -> tuple:
    shapes = [n.shape for n in ins[:3]]
    return ((DYNAMIC,) if any(DYNAMIC in s for s in shapes) else (sum(numel(s) for s in shapes),)), DType.F32


@infers("attention_grad")
def _infer_attention_grad(ins: list[Node], attrs: dict) -> tuple:
    return ins[1].shape, DType.F32


@infers("norm_backward")
def _infer_norm_backward(ins: list[Node], attrs: dict) -> tuple:
    x, gamma, _ = ins
    return (x.shape if attrs["part"] == "input" else gamma.shape), DType.F32


@infers("gather_backward", "narrow_backward", "conv2d_backward")
def _infer_scatter(ins: list[Node], attrs: dict) -> tuple:
    return ins[-1].shape, DType.F32


# ── lowering ────────────────────────────────────────────────────────────────

@lowers("broadcast_as")
def lower_broadcast_as(ctx: LowerContext, node: Node) -> None:
    """A view when no dim grows, else a broadcasting Transpose (stride 0 on broadcast dims)."""
    src = ctx.node(node.inputs[0])
    if numel(src.shape) == numel(node.shape):
        ctx.alias(node.id, src.id)
        return
    in_strides = bcast_strides(_inserted(src.shape, node.attrs["axes"], len(node.shape)), node.shape)
    ctx.emit(lambda at: T.Transpose(src=at(src.id), dst=at(node.id), in_total=numel(src.shape),
                                    out_dims=node.shape, in_strides=in_strides, elem_bytes=src.dtype.itemsize),
             reads=[src.id], writes=[node.id])


@lowers("reshape_as")
def lower_reshape_as(ctx: LowerContext, node: Node) -> None:
    """A view: no thunk."""
    ctx.alias(node.id, node.inputs[0])


def constant_buffer(ctx: LowerContext, data: np.ndarray, label: str):
    """A buffer holding `data`, written once when the arena is created."""
    buf = ctx.buffer(data.nbytes, "const", label)
    buf.data = np.ascontiguousarray(data)
    return buf


@lowers("reciprocal_count")
def lower_reciprocal_count(ctx: LowerContext, node: Node) -> None:
    """A constant: the count is known once shapes are concrete."""
    shape = ctx.node(node.inputs[0]).shape
    count = numel([shape[a] for a in node.attrs["axes"]])
    buf = constant_buffer(ctx, np.array([1.0 / count if count else 0.0], np.float32), f"%{node.id} 1/count")
    ctx.views[node.id] = ctx.view(buf)


@lowers("activation_backward")
def lower_activation_backward(ctx: LowerContext, node: Node) -> None:
    """ReluBackward for Relu, else ActivationBackward."""
    x, dy = node.inputs
    act, n = node.attrs["act"], numel(node.shape)
    if act is Activation.Relu:
        ctx.emit(lambda at: T.ReluBackward(x=at(x), dy=at(dy), dx=at(node.id), len=n), reads=[x, dy], writes=[node.id])
    else:
        ctx.emit(lambda at: T.ActivationBackward(x=at(x), dy=at(dy), dx=at(node.id), len=n, kind=act),
                 reads=[x, dy], writes=[node.id])


_NORM_GRADS = {("layer_norm", "input"): T.LayerNormBackwardInput, ("layer_norm", "gamma"): T.LayerNormBackwardGamma,
               ("rms_norm", "input"): T.RmsNormBackwardInput, ("rms_norm", "gamma"): T.RmsNormBackwardGamma}


@lowers("norm_backward")
def lower_norm_backward(ctx: LowerContext, node: Node) -> None:
    """One row-norm backward thunk over `[rows, h]`."""
    x, gamma, dy = node.inputs
    shape = ctx.node(x).shape
    h = shape[-1]
    rows = numel(shape) // h if h else 0
    norm, part, eps = node.attrs["norm"], node.attrs["part"], node.attrs["eps"]
    kind = _NORM_GRADS[norm, part]
    out = "dx" if part == "input" else "dgamma"

    def build(at):
        args = dict(x=at(x), dy=at(dy), rows=rows, h=h, eps=eps, **{out: at(node.id)})
        if part == "input" or norm == "rms_norm":
            args["gamma"] = at(gamma)
        if norm == "rms_norm":
            args["beta"] = at(gamma)     # read by no RmsNorm gradient; any valid offset
        return kind(**args)
    ctx.emit(build, reads=[x, gamma, dy], writes=[node.id])


@lowers("cumsum_backward")
def lower_cumsum_backward(ctx: LowerContext, node: Node) -> None:
    """CumsumBackward over `[rows, cols]`."""
    dy = node.inputs[0]
    cols = node.shape[-1] if node.shape else 1
    rows = numel(node.shape) // cols if cols else 0
    ctx.emit(lambda at: T.CumsumBackward(dy=at(dy), dx=at(node.id), rows=rows, cols=cols,
                                         exclusive=node.attrs["exclusive"]), reads=[dy], writes=[node.id])


def _scatter_rows(ctx: LowerContext, node: Node, dy: int, indices, num_idx: int, axis: int) -> None:
    """GatherBackward: zero the output, then add `dy`'s rows at f32 `indices` along `axis`."""
    shape = node.shape
    outer, axis_dim, trailing = numel(shape[:axis]), shape[axis], numel(shape[axis + 1:])
    ctx.emit(lambda at: T.GatherBackward(dy=at(dy), indices=at(indices), dst=at(node.id), outer=outer,
                                         axis_dim=axis_dim, num_idx=num_idx, trailing=trailing),
             reads=[dy, indices], writes=[node.id])


def ids_as_f32(ctx: LowerContext, ids: int):
    """Integer ids as f32 (the encoding of GatherBackward and the losses): the buffer itself, or a cast."""
    n = ctx.node(ids)
    if n.dtype == DType.F32:
        return ids
    out = ctx.scratch(numel(n.shape) * 4, "ids as f32")
    ctx.emit(lambda at: T.CastGeneric(src=at(ids), dst=at(out), len=numel(n.shape), src_dtype=n.dtype,
                                      dst_dtype=DType.F32), reads=[ids], writes=[out])
    return out


@lowers("gather_backward")
def lower_gather_backward(ctx: LowerContext, node: Node) -> None:
    """The indices converted to f32 (GatherBackward's encoding), then GatherBackward."""
    dy, idx, _ = node.inputs
    _scatter_rows(ctx, node, dy, ids_as_f32(ctx, idx), numel(ctx.node(idx).shape), node.attrs["axis"] % len(node.shape))


@lowers("narrow_backward")
def lower_narrow_backward(ctx: LowerContext, node: Node) -> None:
    """GatherBackward with the constant indices start … start + length − 1."""
    dy = node.inputs[0]
    axis = node.attrs["axis"] % len(node.shape)
    length, start = ctx.node(dy).shape[axis], node.attrs["start"]
    idx = constant_buffer(ctx, np.arange(start, start + length, dtype=np.float32), f"%{node.id} narrow indices")
    _scatter_rows(ctx, node, dy, idx, length, axis)


@lowers("conv2d_backward")
def lower_conv2d_backward(ctx: LowerContext, node: Node) -> None:
    """Conv2dBackwardInput or Conv2dBackwardWeight in the forward geometry."""
    a, b, like = node.inputs
    x_shape, w_shape = (node.shape, ctx.node(b).shape) if node.attrs["part"] == "input" else \
        (ctx.node(a).shape, node.shape)
    dy_shape = ctx.node(a if node.attrs["part"] == "input" else b).shape
    n, c_in, h, w = x_shape
    c_out, _, kh, kw = w_shape
    (sh, sw), (ph, pw), (dh, dw) = node.attrs["stride"], node.attrs["padding"], node.attrs["dilation"]
    geometry = dict(n=n, c_in=c_in, h=h, c_out=c_out, h_out=dy_shape[2], w_out=dy_shape[3], kh=kh, kw=kw, sh=sh,
                    sw=sw, ph=ph, pw=pw, dh=dh, groups=node.attrs["groups"])
    if node.attrs["part"] == "input":
        ctx.emit(lambda at: T.Conv2dBackwardInput(dy=at(a), w=at(b), dx=at(node.id), w_in=w, dw=dw, **geometry),
                 reads=[a, b], writes=[node.id])
    else:
        ctx.emit(lambda at: T.Conv2dBackwardWeight(x=at(a), dy=at(b), dw=at(node.id), w=w, dw_dil=dw, **geometry),
                 reads=[a, b], writes=[node.id])


@lowers("max_pool2d_backward")
def lower_max_pool2d_backward(ctx: LowerContext, node: Node) -> None:
    """MaxPool2dBackward."""
    x, dy = node.inputs
    n, c, h, w = node.shape
    _, _, h_out, w_out = ctx.node(dy).shape
    (kh, kw), (sh, sw), (ph, pw) = node.attrs["kernel"], node.attrs["stride"], node.attrs["padding"]
    ctx.emit(lambda at: T.MaxPool2dBackward(x=at(x), dy=at(dy), dx=at(node.id), n=n, c=c, h=h, w=w, h_out=h_out,
                                            w_out=w_out, kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw),
             reads=[x, dy], writes=[node.id])


@lowers("rope_backward")
def lower_rope_backward(ctx: LowerContext, node: Node) -> None:
    """RopeBackward with the forward's table layout."""
    dy, cos, sin = node.inputs
    b, s, hidden = node.shape
    table = ctx.node(cos).shape
    ctx.emit(lambda at: T.RopeBackward(dy=at(dy), cos=at(cos), sin=at(sin), dx=at(node.id), batch=b, seq=s,
                                       hidden=hidden, head_dim=node.attrs["head_dim"], n_rot=node.attrs["n_rot"],
                                       cos_len=numel(table), cos_row_stride=table[1],
                                       interleaved=node.attrs["interleaved"]), reads=[dy, cos, sin], writes=[node.id])


@lowers("attention_backward")
def lower_attention_backward(ctx: LowerContext, node: Node) -> None:
    """AttentionBackwardAll into dQ | dK | dV packed (K/V heads = heads, scale 1/√head_dim: what it computes)."""
    q, k, v, dy, *mask = node.inputs
    b, s, _ = ctx.node(q).shape
    kv = ctx.node(k).shape[1]
    nq, nk = numel(ctx.node(q).shape) * 4, numel(ctx.node(k).shape) * 4
    ctx.emit(lambda at: T.AttentionBackwardAll(
        q=at(q), k=at(k), v=at(v), dy=at(dy), mask=at(mask[0]) if mask else 0, out_q=at(node.id),
        out_k=at(node.id) + nq, out_v=at(node.id) + nq + nk, batch=b, seq=s, kv_seq=kv, heads=node.attrs["heads"],
        head_dim=node.attrs["head_dim"], mask_kind=node.attrs["mask_kind"], bhsd=False),
        reads=[q, k, v, dy, *mask], writes=[node.id])


@lowers("attention_grad")
def lower_attention_grad(ctx: LowerContext, node: Node) -> None:
    """A view of one part of the packed gradients."""
    packed, _ = node.inputs
    q, k, _, *_ = ctx.node(packed).inputs
    sizes = {"q": 0, "k": numel(ctx.node(q).shape), "v": numel(ctx.node(q).shape) + numel(ctx.node(k).shape)}
    ctx.alias(node.id, packed, 4 * sizes[node.attrs["part"]])
