"""LayerNorm, RmsNorm, GroupNorm, BatchNormInference and Softmax against ONNX LayerNormalization,
RMSNormalization (opset 23), GroupNormalization (per-channel scale, opset 21), BatchNormalization
(inference) and Softmax."""
from __future__ import annotations

import numpy as np

from rlx_llvm import thunks as T
from tests.oracles.onnx_check import OnnxCase, floats, onnx_run, oracle_test

TOL = dict(rtol=1e-5, atol=1e-5)   # f32 means, variances and square roots in another order


def row_norm_case(kind: str, rows: int, h: int, eps: float = 1e-5) -> OnnxCase:
    """LayerNorm ↔ LayerNormalization(axis=-1), or RmsNorm ↔ RMSNormalization(axis=-1) + b.

    ONNX's RMSNormalization has no bias input; RLX's RmsNorm adds `b`, so that case is compared with
    the ONNX output plus `b`.
    """
    x = floats((rows, h), 30, rows, h) + np.float32(1.5)    # a mean away from 0 exercises the variance
    g, b = floats((h,), 31, h), floats((h,), 32, h)
    cls = T.LayerNorm if kind == "LayerNorm" else T.RmsNorm

    def build(src: int, g_off: int, b_off: int, dst: int) -> T.Thunk:
        return cls(src=src, g=g_off, b=b_off, dst=dst, rows=rows, h=h, eps=eps)

    attrs = dict(axis=-1, epsilon=eps)
    if cls is T.LayerNorm:
        return OnnxCase(f"LayerNorm-{rows}x{h}", "LayerNormalization", (x, g, b), build, (rows, h), attrs=attrs, **TOL)
    return OnnxCase(f"RmsNorm-{rows}x{h}", "RMSNormalization", (x, g), build, (rows, h), attrs=attrs, extra=(b,),
                    expect=lambda: onnx_run("RMSNormalization", [x, g], attrs)[0] + b, **TOL)


def group_norm_case(n: int, c: int, h: int, w: int, groups: int, eps: float = 1e-5) -> OnnxCase:
    """GroupNorm ↔ GroupNormalization (per-channel scale and bias)."""
    x = floats((n, c, h, w), 33, n, c, h, w)
    g, b = floats((c,), 34, c), floats((c,), 35, c)

    def build(src: int, g_off: int, b_off: int, dst: int) -> T.Thunk:
        return T.GroupNorm(src=src, g=g_off, b=b_off, dst=dst, n=n, c=c, h=h, w=w, num_groups=groups, eps=eps)

    return OnnxCase(f"GroupNorm-{n}x{c}x{h}x{w}-g{groups}", "GroupNormalization", (x, g, b), build, (n, c, h, w),
                    attrs=dict(epsilon=eps, num_groups=groups), **TOL)


def batch_norm_case(count: int, channels: int, eps: float = 1e-3) -> OnnxCase:
    """BatchNormInference on `[count, channels]` ↔ BatchNormalization (inference: running mean and var)."""
    x = floats((count, channels), 36, count, channels)
    g, b, mean = (floats((channels,), key, channels) for key in (37, 38, 39))
    var = np.abs(floats((channels,), 40, channels)) + np.float32(0.1)

    def build(src: int, g_off: int, b_off: int, mean_off: int, var_off: int, dst: int) -> T.Thunk:
        return T.BatchNormInference(src=src, g=g_off, b=b_off, mean=mean_off, var=var_off, dst=dst, count=count,
                                    channels=channels, eps=eps)

    return OnnxCase(f"BatchNormInference-{count}x{channels}", "BatchNormalization", (x, g, b, mean, var), build,
                    (count, channels), attrs=dict(epsilon=eps), **TOL)


def softmax_case(outer: int, cols: int, inner: int, masked: bool = False) -> OnnxCase:
    """Softmax (in place, on a copy) over the middle axis of `[outer, cols, inner]` ↔ Softmax(axis=1);
    `masked` sets every third element to −inf (an attention-mask pattern)."""
    x = floats((outer, cols, inner), 41, outer, cols, inner) * np.float32(4)
    if masked:
        x.reshape(-1)[::3] = -np.inf

    def build(src: int, dst: int) -> list[T.Thunk]:
        return [T.Copy(src=src, dst=dst, len=x.size), T.Softmax(data=dst, rows=outer * inner, cols=cols, inner=inner)]

    return OnnxCase(f"Softmax-{outer}x{cols}x{inner}{'-masked' * masked}", "Softmax", (x,), build, x.shape, attrs=dict(axis=1),
                    rtol=1e-5, atol=1e-7)


ROWS = [(5, 1), (1, 7), (3, 8), (4, 13), (2, 100)]

CASES = [
    *(row_norm_case(kind, rows, h) for kind in ("LayerNorm", "RmsNorm") for rows, h in ROWS),
    group_norm_case(1, 4, 3, 5, 2),
    group_norm_case(2, 6, 1, 7, 3),
    group_norm_case(1, 3, 2, 2, 1),
    group_norm_case(2, 4, 1, 1, 4),
    batch_norm_case(1, 3),
    batch_norm_case(7, 5),
    batch_norm_case(16, 1),
    batch_norm_case(9, 13),
    softmax_case(1, 7, 1),
    softmax_case(3, 8, 1),
    softmax_case(2, 5, 3),
    softmax_case(1, 1, 4),
    softmax_case(4, 13, 2),
    softmax_case(2, 100, 1),
    softmax_case(3, 37, 2, masked=True),
]

test_norms_and_softmax_match_onnx = oracle_test(CASES)
