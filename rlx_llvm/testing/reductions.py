"""Examples of the reduction families: reductions, scans, softmax, top-k, histogram, and the losses."""
from __future__ import annotations

from .. import thunks as T
from ..dtypes import DType
from ..ops import ReduceOp
from .layout import Example, example, ints, uniform

N, C = 4, 13   # rows × classes / columns: an odd row width


def reductions() -> list[Example]:
    """Reduce, ReduceSumF64, ArgReduce, TopK, Softmax, Cumsum, CumScan and Histogram."""
    return [
        example("Reduce/max_2x5x4", T.Reduce(src=0, dst=0, outer=2, reduced=5, inner=4, op=ReduceOp.Max)),
        example("Reduce/mean_3x37x1", T.Reduce(src=0, dst=0, outer=3, reduced=37, inner=1, op=ReduceOp.Mean)),
        example("ReduceSumF64/3x7x5", T.ReduceSumF64(src=0, dst=0, outer=3, reduced=7, inner=5), dtype="f8"),
        example("ArgReduce/argmax", T.ArgReduce(src=0, dst=0, outer=N, reduced=C, inner=1, is_max=True)),
        example("TopK/k3_i64", T.TopK(src=0, dst=0, outer=N, axis_dim=C, k=3, indices_i64=1), dst="i8"),
        example("Softmax/4x13x2", T.Softmax(data=0, rows=N, cols=C, inner=2)),
        example("Cumsum/exclusive_f32", T.Cumsum(src=0, dst=0, rows=N, cols=C, exclusive=True, dtype=DType.F32)),
        example("Cumsum/i64", T.Cumsum(src=0, dst=0, rows=N, cols=C, exclusive=False, dtype=DType.I64), dtype="i8"),
        example("CumScan/max", T.CumScan(src=0, dst=0, rows=N, cols=C, exclusive=False, is_max=True)),
        example("CumScan/prod_exclusive", T.CumScan(src=0, dst=0, rows=N, cols=C, exclusive=True, is_max=False),
                src=uniform(0.5, 1.5)),
        example("Histogram/7_bins", T.Histogram(src=0, dst=0, n=45, bins=7, min=-1.0, max=1.0)),
    ]


def losses() -> list[Example]:
    """Softmax cross-entropy: class labels, dense targets, and the backward."""
    labels = ints(0, C, "f4")   # f32-encoded class ids
    return [
        example("SoftmaxCrossEntropy", T.SoftmaxCrossEntropy(logits=0, labels=0, dst=0, n=N, c=C), labels=labels),
        example("SoftmaxCrossEntropyDense", T.SoftmaxCrossEntropyDense(logits=0, targets=0, dst=0, n=N, c=C),
                targets=uniform(0, 1)),
        example("SoftmaxCrossEntropyBackward", T.SoftmaxCrossEntropyBackward(logits=0, labels=0, d_loss=0, dlogits=0,
                                                                             n=N, c=C), labels=labels),
    ]
