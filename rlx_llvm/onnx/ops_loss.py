"""ONNX losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (forward), from graph ops.

`loss[n, d…] = −w[t] · input[n, t, d…]` with `t = target[n, d…]` picked by `gather_elements` along
the class axis; an `ignore_index` target weighs 0 (its clamped pick is multiplied away).  `mean`
divides by the summed weights, as ONNX does.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import DType
from ..graph import Value
from .importer import Convert, Unsupported, converts
from .ops_math import _float


def _nll(cx: Convert, node, logp: Value, target: Value, weight: Value | None) -> Value:
    """The reduced negative log-likelihood of `target` under log-probabilities `logp` `[n, c, d…]`."""
    g = cx.g
    t = target if target.dtype == DType.I64 else g.cast(target, DType.I64)
    picked = g.reshape(g.gather_elements(logp, g.reshape(t, [t.shape[0], 1, *t.shape[1:]]), 1), t.shape)
    w = None if weight is None else g.gather(weight, t, 0)
    ignore = cx.attr(node, "ignore_index")
    if ignore is not None:
        keep = g.cast(g.wide_compare("ne", t, g.constant(np.array(int(ignore), np.int64), DType.I64)), "f32")
        w = keep if w is None else w * keep
    loss = -picked if w is None else -(picked * w)
    reduction = cx.attr(node, "reduction", "mean")
    if reduction == "none":
        return loss
    if reduction == "sum":
        return g.reduce(loss, "sum")
    if reduction != "mean":
        raise Unsupported(f"reduction {reduction!r}")
    return g.reduce(loss, "mean") if w is None else g.reduce(loss, "sum") / g.reduce(w, "sum")


@converts("NegativeLogLikelihoodLoss")
def _nll_loss(cx: Convert, node) -> list:
    weight = _float(cx, node, 2) if cx.has(node, 2) else None
    return [_nll(cx, node, _float(cx, node), cx.tensor(node.input[1]), weight)]


@converts("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(cx: Convert, node) -> list:
    g = cx.g
    x = _float(cx, node)
    m = g.reduce(x, "max", (1,), True)
    shifted = x - m
    logp = shifted - g.log(g.reduce(g.exp(shifted), "sum", (1,), True))
    weight = _float(cx, node, 2) if cx.has(node, 2) else None
    return [_nll(cx, node, logp, cx.tensor(node.input[1]), weight), logp]
