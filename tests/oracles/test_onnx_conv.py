"""Conv2D/Conv3d, ConvTranspose2d/3d and Pool2D/Pool3D against ONNX Conv, ConvTranspose, MaxPool, AveragePool."""
from __future__ import annotations

import numpy as np

from rlx_llvm import thunks as T
from rlx_llvm.ops import ReduceOp
from tests.oracles.onnx_check import OnnxCase, floats, onnx_run, oracle_test

AXES = ("d", "h", "w")
CONV = {2: T.Conv2D, 3: T.Conv3d}
CONV_T = {2: T.ConvTranspose2d, 3: T.ConvTranspose3d}
POOL = {2: T.Pool2D, 3: T.Pool3D}
CONV_TOL = dict(rtol=1e-5, atol=1e-5)   # sums of products in another order


def geometry(spatial, out, kernel, stride, pad, dilation=None) -> dict[str, int]:
    """The thunk's per-axis fields (`h`, `h_out`, `kh`, `sh`, `ph`, `dh`, … for the trailing axes)."""
    fields = {}
    for i, axis in enumerate(AXES[-len(spatial):]):
        fields |= {axis: spatial[i], f"{axis}_out": out[i], f"k{axis}": kernel[i], f"s{axis}": stride[i],
                   f"p{axis}": pad[i]}
        if dilation is not None:
            fields[f"d{axis}"] = dilation[i]
    return fields


def onnx_window(kernel, stride, pad, dilation=None) -> dict:
    """ONNX attributes of a symmetric-padding window."""
    attrs = dict(kernel_shape=list(kernel), strides=list(stride), pads=list(pad) * 2)
    return attrs | ({} if dilation is None else dict(dilations=list(dilation)))


def conv_case(n, c_in, spatial, c_out, kernel, stride, pad, dilation, groups) -> OnnxCase:
    """Conv2D / Conv3d ↔ ONNX Conv (no bias)."""
    out = [(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d in zip(spatial, kernel, stride, pad, dilation)]
    x = floats((n, c_in, *spatial), 1, n, c_in, *spatial)
    w = floats((c_out, c_in // groups, *kernel), 2, c_out, *kernel)
    cls = CONV[len(spatial)]

    def build(src: int, weight: int, dst: int) -> T.Thunk:
        return cls(src=src, weight=weight, dst=dst, n=n, c_in=c_in, c_out=c_out, groups=groups,
                   **geometry(spatial, out, kernel, stride, pad, dilation))

    return OnnxCase(f"{cls.__name__}-{n}x{c_in}x{'x'.join(map(str, spatial))}-k{kernel}s{stride}p{pad}d{dilation}g{groups}",
                    "Conv", (x, w), build, (n, c_out, *out),
                    attrs=onnx_window(kernel, stride, pad, dilation) | dict(group=groups), **CONV_TOL)


def conv_transpose_case(n, c_in, spatial, c_out, kernel, stride, pad, dilation, groups, out_pad) -> OnnxCase:
    """ConvTranspose2d / 3d ↔ ONNX ConvTranspose (output padding folded into the output size)."""
    out = [(i - 1) * s - 2 * p + d * (k - 1) + 1 + op
           for i, k, s, p, d, op in zip(spatial, kernel, stride, pad, dilation, out_pad)]
    x = floats((n, c_in, *spatial), 3, n, c_in, *spatial)
    w = floats((c_in, c_out // groups, *kernel), 4, c_out, *kernel)
    cls = CONV_T[len(spatial)]
    fields = geometry(spatial, out, kernel, stride, pad, dilation)
    fields["w_in"] = fields.pop("w")

    attrs = onnx_window(kernel, stride, pad, dilation) | dict(output_padding=list(out_pad))

    def build(src: int, weight: int, dst: int) -> T.Thunk:
        return cls(src=src, weight=weight, dst=dst, n=n, c_in=c_in, c_out=c_out, groups=groups, **fields)

    def group_by_group() -> np.ndarray:
        """Grouped ConvTranspose as its definition: each group's channels alone, outputs concatenated.

        (onnx.reference's ConvTranspose slices the weight of a group by OUTPUT channels along axis 0,
        which holds input channels — wrong for group > 1 — so the groups are run one by one.)
        """
        xs, ws = np.split(x, groups, axis=1), np.split(w, groups, axis=0)
        return np.concatenate([onnx_run("ConvTranspose", [xg, wg], attrs)[0] for xg, wg in zip(xs, ws)], axis=1)

    return OnnxCase(f"{cls.__name__}-{n}x{c_in}x{'x'.join(map(str, spatial))}-k{kernel}s{stride}p{pad}d{dilation}"
                    f"g{groups}op{out_pad}", "ConvTranspose", (x, w), build, (n, c_out, *out), attrs=attrs,
                    expect=group_by_group if groups > 1 else None, **CONV_TOL)


def pool_case(kind: ReduceOp, n, c, spatial, kernel, stride, pad, *, count_include_pad: int = 1) -> OnnxCase:
    """Pool2D / Pool3D ↔ ONNX MaxPool, or AveragePool with count_include_pad=1 (RLX's Mean counts padding).

    With `count_include_pad=0` (ONNX's default) the expected value is the documented relation
    RLX mean = ONNX mean over in-range taps × (in-range taps / kernel taps), both from ONNX.
    """
    out = [(i + 2 * p - k) // s + 1 for i, k, s, p in zip(spatial, kernel, stride, pad)]
    x = floats((n, c, *spatial), 5, n, c, *spatial)
    cls = POOL[len(spatial)]
    window = onnx_window(kernel, stride, pad)
    op = "MaxPool" if kind is ReduceOp.Max else "AveragePool"
    attrs = window | ({} if kind is ReduceOp.Max else dict(count_include_pad=count_include_pad))

    def build(src: int, dst: int) -> T.Thunk:
        return cls(src=src, dst=dst, n=n, c=c, kind=kind, **geometry(spatial, out, kernel, stride, pad))

    def padded_share_times_default() -> np.ndarray:
        in_range_mean = onnx_run(op, [x], attrs)[0]
        taps_share = onnx_run(op, [np.ones_like(x)], window | dict(count_include_pad=1))[0]
        return in_range_mean * taps_share

    relation = None if kind is ReduceOp.Max or count_include_pad else padded_share_times_default
    return OnnxCase(f"{cls.__name__}{kind.name}-cip{count_include_pad}-{n}x{c}x{'x'.join(map(str, spatial))}"
                    f"-k{kernel}s{stride}p{pad}", op, (x,), build, (n, c, *out), attrs=attrs,
                    expect=relation, rtol=1e-6, atol=1e-6)


CASES = [
    conv_case(1, 3, (7, 11), 4, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    conv_case(2, 4, (9, 10), 6, (3, 2), (2, 1), (1, 0), (1, 2), 2),
    conv_case(1, 6, (1, 13), 6, (1, 3), (1, 3), (0, 2), (1, 1), 6),        # depthwise, a size-1 axis
    conv_case(1, 2, (5, 17), 3, (5, 5), (2, 2), (2, 2), (1, 1), 1),
    conv_case(2, 8, (12, 37), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1),     # wide rows: the vector paths
    conv_case(1, 2, (3, 5, 9), 3, (2, 3, 3), (1, 2, 1), (1, 1, 0), (1, 1, 2), 1),
    conv_case(2, 4, (1, 6, 7), 4, (1, 3, 3), (1, 1, 1), (0, 1, 1), (1, 1, 1), 2),
    conv_transpose_case(1, 3, (5, 7), 2, (3, 3), (2, 2), (1, 1), (1, 1), 1, (1, 0)),
    conv_transpose_case(2, 4, (1, 9), 6, (1, 3), (1, 2), (0, 1), (1, 2), 2, (0, 1)),
    conv_transpose_case(1, 2, (2, 3, 5), 3, (2, 2, 3), (2, 1, 2), (0, 1, 1), (1, 1, 1), 1, (0, 0, 1)),
    conv_transpose_case(1, 4, (3, 1, 6), 2, (3, 1, 2), (1, 1, 2), (1, 0, 0), (2, 1, 1), 2, (0, 0, 0)),
    pool_case(ReduceOp.Max, 1, 3, (7, 11), (3, 3), (2, 2), (1, 1)),
    pool_case(ReduceOp.Max, 2, 1, (1, 13), (1, 4), (1, 3), (0, 2)),
    pool_case(ReduceOp.Max, 1, 8, (16, 37), (2, 2), (2, 2), (0, 0)),
    pool_case(ReduceOp.Mean, 2, 1, (6, 9), (2, 3), (2, 3), (1, 1)),
    pool_case(ReduceOp.Mean, 1, 4, (8, 8), (2, 2), (2, 2), (0, 0)),
    pool_case(ReduceOp.Mean, 2, 1, (6, 9), (2, 3), (2, 3), (1, 1), count_include_pad=0),
    pool_case(ReduceOp.Max, 1, 2, (3, 5, 9), (2, 2, 3), (1, 2, 2), (1, 0, 1)),
    pool_case(ReduceOp.Mean, 1, 2, (1, 4, 13), (1, 3, 3), (1, 2, 2), (0, 1, 1)),
    pool_case(ReduceOp.Mean, 1, 2, (1, 4, 13), (1, 3, 3), (1, 2, 2), (0, 1, 1), count_include_pad=0),
]

test_conv_and_pool_match_onnx = oracle_test(CASES)
