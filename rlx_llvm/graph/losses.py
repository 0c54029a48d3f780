"""Losses: `softmax_cross_entropy` (the fused SoftmaxCrossEntropy thunk) and `mse` (composed).

    loss = g.mean(g.softmax_cross_entropy(logits, labels))   # logits [n, c], labels [n] → per-row loss [n]
    loss = g.mse(pred, target)                               # mean((pred − target)²), a scalar

`softmax_cross_entropy` is per row, as the thunk is (semantics.md §3.6): `lse(x_n) − x[n, label_n]`;
reduce it with `mean` or `sum`.  Labels are class indices as f32 (RLX's encoding), i32 or i64; an
out-of-range label gives loss 0 and a zero gradient row, as the kernels do.
"""
from __future__ import annotations

from .. import thunks as T
from ..dtypes import DType
from .backward import ids_as_f32
from .core import GraphError, Node, Value
from .lower import LowerContext
from .opset import infers, lowers

LABEL_DTYPES = (DType.F32, DType.I32, DType.I64)


class LossOps:
    """Builders for losses (mixed into `Graph`)."""

    def softmax_cross_entropy(self, logits: Value, labels: Value) -> Value:
        """Per-row `lse(logits[n]) − logits[n, labels[n]]` of `[n, c]` logits and `[n]` class labels."""
        return self.add_node("softmax_cross_entropy", (logits, labels))

    def mse(self, pred: Value, target: Value) -> Value:
        """Mean squared error `mean((pred − target)²)` over every element: a scalar."""
        d = self.sub(pred, target)
        return self.mean(self.mul(d, d))


def softmax_cross_entropy_backward(g, logits: Value, labels: Value, d_loss: Value) -> Value:
    """`(softmax(logits[n]) − onehot(labels[n]))·d_loss[n]`: the logits gradient."""
    return g.add_node("softmax_cross_entropy_backward", (logits, labels, d_loss))


@infers("softmax_cross_entropy", "softmax_cross_entropy_backward")
def _infer_sce(ins: list[Node], attrs: dict) -> tuple:
    logits, labels = ins[0], ins[1]
    if len(logits.shape) != 2 or labels.shape != logits.shape[:1]:
        raise GraphError(f"softmax_cross_entropy: logits must be [n, c] and labels [n], got {list(logits.shape)} "
                         f"and {list(labels.shape)}")
    if logits.dtype != DType.F32 or labels.dtype not in LABEL_DTYPES:
        raise GraphError(f"softmax_cross_entropy: logits must be f32 and labels f32/i32/i64, got "
                         f"{logits.dtype.value} and {labels.dtype.value}")
    backward = len(ins) == 3
    if backward and ins[2].shape != labels.shape:
        raise GraphError(f"softmax_cross_entropy_backward: d_loss must be [n] = {list(labels.shape)}, "
                         f"got {list(ins[2].shape)}")
    return (logits.shape if backward else logits.shape[:1]), DType.F32


@lowers("softmax_cross_entropy")
def lower_sce(ctx: LowerContext, node: Node) -> None:
    """SoftmaxCrossEntropy over `[n, c]`."""
    logits, labels = node.inputs
    n, c = ctx.node(logits).shape
    lab = ids_as_f32(ctx, labels)
    ctx.emit(lambda at: T.SoftmaxCrossEntropy(logits=at(logits), labels=at(lab), dst=at(node.id), n=n, c=c),
             reads=[logits, lab], writes=[node.id])


@lowers("softmax_cross_entropy_backward")
def lower_sce_backward(ctx: LowerContext, node: Node) -> None:
    """SoftmaxCrossEntropyBackward over `[n, c]`."""
    logits, labels, d_loss = node.inputs
    n, c = node.shape
    lab = ids_as_f32(ctx, labels)
    ctx.emit(lambda at: T.SoftmaxCrossEntropyBackward(logits=at(logits), labels=at(lab), d_loss=at(d_loss),
                                                      dlogits=at(node.id), n=n, c=c),
             reads=[logits, lab, d_loss], writes=[node.id])
