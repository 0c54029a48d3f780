"""Neural-network layers: layer_norm and rms_norm over the last axis (and their fused forms)."""
from __future__ import annotations

from .. import thunks as T
from ..dtypes import DType
from .core import GraphError, Node, Value, numel
from .lower import LowerContext
from .opset import infers, lowers


class NNOps:
    """Builders for normalization layers (mixed into `Graph`)."""

    def layer_norm(self, x: Value, g: Value, b: Value, axis: int = -1, eps: float = 1e-5) -> Value:
        """`(x − μ)/√(σ² + eps)·g + b` over the last axis."""
        if axis not in (-1, x.ndim - 1):
            raise GraphError(f"layer_norm: lowered over the last axis only, got axis {axis}")
        return self.add_node("layer_norm", (x, g, b), {"eps": float(eps)})

    def rms_norm(self, x: Value, g: Value, b: Value, eps: float = 1e-5) -> Value:
        """`x/√(mean(x²) + eps)·g + b` over the last axis."""
        return self.add_node("rms_norm", (x, g, b), {"eps": float(eps)})


@infers("layer_norm", "rms_norm")
def _infer_norm(ins: list[Node], attrs: dict) -> tuple:
    x, g, b = ins
    h = x.shape[-1] if x.shape else None
    for name, p in (("gamma", g), ("beta", b)):
        if p.shape != (h,):
            raise GraphError(f"norm: {name} must have shape [{h}] (the last axis of {list(x.shape)}), got {list(p.shape)}")
    if {x.dtype, g.dtype, b.dtype} != {DType.F32}:
        raise GraphError("norm: lowered for f32 tensors")
    return x.shape, x.dtype


@lowers("layer_norm", "rms_norm")
def lower_norm(ctx: LowerContext, node: Node) -> None:
    """LayerNorm / RmsNorm over rows of the last axis."""
    kind = T.LayerNorm if node.op == "layer_norm" else T.RmsNorm
    ix, ig, ib = node.inputs
    h = node.shape[-1]
    rows = numel(node.shape) // h if h else 0
    ctx.emit(lambda at: kind(src=at(ix), g=at(ig), b=at(ib), dst=at(node.id), rows=rows, h=h, eps=node.attrs["eps"]),
             reads=[ix, ig, ib], writes=[node.id])


@infers("residual_norm")
def _infer_residual_norm(ins: list[Node], attrs: dict) -> tuple:
    return ins[0].shape, ins[0].dtype


@lowers("residual_norm")
def lower_residual_norm(ctx: LowerContext, node: Node) -> None:
    """`norm(x + res)·g + b` in one pass pair (made by the `residual_norm` fusion pass)."""
    kind = T.FusedResidualLN if node.attrs["norm"] == "layer_norm" else T.FusedResidualRmsNorm
    ix, ir, ig, ib = node.inputs
    h = node.shape[-1]
    rows = numel(node.shape) // h if h else 0
    ctx.emit(lambda at: kind(x=at(ix), res=at(ir), bias=0, g=at(ig), b=at(ib), out=at(node.id), rows=rows, h=h,
                             eps=node.attrs["eps"], has_bias=False),
             reads=list(node.inputs), writes=[node.id])


@infers("fused_bert_layer")
def _infer_bert_layer(ins: list[Node], attrs: dict) -> tuple:
    return ins[0].shape, ins[0].dtype


@lowers("fused_bert_layer")
def lower_bert_layer(ctx: LowerContext, node: Node) -> None:
    """One FusedBertLayer (made by the `bert_layer` fusion pass)."""
    names = ("hidden", "qkv_w", "qkv_b", "out_w", "out_b", "mask", "ln1_g", "ln1_b", "fc1_w", "fc1_b", "fc2_w",
             "fc2_b", "ln2_g", "ln2_b")
    b, s, hs = node.shape
    a = node.attrs
    ctx.emit(lambda at: T.FusedBertLayer(**{f: at(i) for f, i in zip(names, node.inputs)}, out=at(node.id),
                                         eps1=a["eps1"], eps2=a["eps2"], batch=b, seq=s, hs=hs, nh=a["heads"],
                                         dh=a["head_dim"], int_dim=a["int_dim"]),
             reads=list(node.inputs), writes=[node.id])
