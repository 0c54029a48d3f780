"""Convolution and pooling on NCHW f32 tensors: conv2d (Conv2D, or Conv2D1x1 for a plain 1×1), max/avg pool2d.

    y = g.conv2d(x, w, b, stride=2, padding=1)     # x [n, c_in, h, w], w [c_out, c_in/groups, kh, kw]
    p = g.max_pool2d(y, 2)                         # kernel 2, stride 2 (the kernel, as PyTorch)
    f = g.global_avg_pool2d(p)                     # [n, c]: a mean over h and w

Output sizes follow PyTorch: `(size + 2·pad − dil·(k − 1) − 1) // stride + 1`.  Average pooling
divides by the full window (`count_include_pad=True`, PyTorch's default); max pooling skips padding.
"""
from __future__ import annotations

from typing import Sequence

from .. import thunks as T
from ..dtypes import DType
from ..ops import ReduceOp
from .checks import require_f32, require_rank
from .core import DYNAMIC, GraphError, Node, Value
from .lower import LowerContext
from .opset import infers, lowers

Pair = "int | Sequence[int]"


def pair(v: "int | Sequence[int]", name: str, op: str, least: int) -> tuple[int, int]:
    """`(h, w)` from an int or a pair, each ≥ `least`."""
    hw = (int(v), int(v)) if isinstance(v, int) else tuple(int(x) for x in v)
    if len(hw) != 2 or min(hw) < least:
        raise GraphError(f"{op}: {name} must be an int or a pair of ints ≥ {least}, got {v!r}")
    return hw


def out_size(size: int, k: int, stride: int, pad: int, dil: int, op: str) -> int:
    """PyTorch's output size along one axis (dynamic stays dynamic); GraphError when the window does not fit."""
    if size == DYNAMIC:
        return DYNAMIC
    span = dil * (k - 1) + 1
    if size + 2 * pad < span:
        raise GraphError(f"{op}: window {span} is larger than the padded input {size} + 2·{pad}")
    return (size + 2 * pad - span) // stride + 1


class ConvOps:
    """Builders for convolution and pooling (mixed into `Graph`)."""

    def conv2d(self, x: Value, w: Value, bias: "Value | None" = None, stride: Pair = 1, padding: Pair = 0,
               dilation: Pair = 1, groups: int = 1) -> Value:
        """Cross-correlation `[n, c_in, h, w] * [c_out, c_in/groups, kh, kw] → [n, c_out, h_out, w_out]` (+ bias)."""
        attrs = {"stride": pair(stride, "stride", "conv2d", 1), "padding": pair(padding, "padding", "conv2d", 0),
                 "dilation": pair(dilation, "dilation", "conv2d", 1), "groups": int(groups)}
        y = self.add_node("conv2d", (x, w), attrs)
        if bias is None:
            return y
        if bias.shape != (y.shape[1],):
            raise GraphError(f"conv2d: bias must have shape [{y.shape[1]}] (c_out), got {list(bias.shape)}")
        return y + bias.reshape(y.shape[1], 1, 1)

    def max_pool2d(self, x: Value, kernel: Pair, stride: "Pair | None" = None, padding: Pair = 0) -> Value:
        """Max over each window (padding ignored); the stride defaults to the kernel."""
        return self._pool(x, "max_pool2d", kernel, stride, padding)

    def avg_pool2d(self, x: Value, kernel: Pair, stride: "Pair | None" = None, padding: Pair = 0) -> Value:
        """Mean over each window, divided by kh·kw even where it covers padding (count_include_pad)."""
        return self._pool(x, "avg_pool2d", kernel, stride, padding)

    def global_avg_pool2d(self, x: Value, keep_dim: bool = False) -> Value:
        """Mean over h and w: `[n, c, h, w] → [n, c]` (`[n, c, 1, 1]` with keep_dim)."""
        if x.ndim != 4:
            raise GraphError(f"global_avg_pool2d: input must be [n, c, h, w], got {list(x.shape)}")
        return self.mean(x, (2, 3), keep_dim)

    def _pool(self, x: Value, op: str, kernel: Pair, stride: "Pair | None", padding: Pair) -> Value:
        k = pair(kernel, "kernel", op, 1)
        attrs = {"kernel": k, "stride": k if stride is None else pair(stride, "stride", op, 1),
                 "padding": pair(padding, "padding", op, 0)}
        return self.add_node(op, (x,), attrs)


@infers("conv2d")
def _infer_conv2d(ins: list[Node], attrs: dict) -> tuple:
    x, w = ins
    op = "conv2d"
    require_rank(op, "input", x, 4)
    require_rank(op, "weight", w, 4)
    require_f32(op, x, w)
    n, c_in, h, wd = x.shape
    c_out, c_group, kh, kw = w.shape
    g = attrs["groups"]
    if g < 1 or c_out % g or (c_in != DYNAMIC and c_in != c_group * g):
        raise GraphError(f"{op}: input {list(x.shape)} and weight {list(w.shape)} do not agree with groups={g} "
                         f"(need c_in = weight[1]·groups and c_out divisible by groups)")
    (sh, sw), (ph, pw), (dh, dw) = attrs["stride"], attrs["padding"], attrs["dilation"]
    return (n, c_out, out_size(h, kh, sh, ph, dh, op), out_size(wd, kw, sw, pw, dw, op)), DType.F32


def _pool_rule(op: str):
    """The inference rule of pooling op `op` (named in its errors)."""
    def infer_pool(ins: list[Node], attrs: dict) -> tuple:
        x, = ins
        require_rank(op, "input", x, 4)
        require_f32(op, x)
        (kh, kw), (sh, sw), (ph, pw) = attrs["kernel"], attrs["stride"], attrs["padding"]
        n, c, h, w = x.shape
        return (n, c, out_size(h, kh, sh, ph, 1, op), out_size(w, kw, sw, pw, 1, op)), DType.F32
    return infer_pool


for _op in ("max_pool2d", "avg_pool2d"):
    infers(_op)(_pool_rule(_op))


@lowers("conv2d")
def lower_conv2d(ctx: LowerContext, node: Node) -> None:
    """Conv2D1x1 (a per-image GEMM) for a 1×1 stride-1 unpadded ungrouped kernel, else Conv2D."""
    ix, iw = node.inputs
    n, c_in, h, w = ctx.node(ix).shape
    c_out, _, kh, kw = ctx.node(iw).shape
    _, _, h_out, w_out = node.shape
    (sh, sw), (ph, pw), (dh, dw) = node.attrs["stride"], node.attrs["padding"], node.attrs["dilation"]
    if (kh, kw, sh, sw, ph, pw, node.attrs["groups"]) == (1, 1, 1, 1, 0, 0, 1):
        ctx.emit(lambda at: T.Conv2D1x1(src=at(ix), weight=at(iw), dst=at(node.id), n=n, c_in=c_in, c_out=c_out,
                                        hw=h * w), reads=[ix, iw], writes=[node.id])
        return
    ctx.emit(lambda at: T.Conv2D(src=at(ix), weight=at(iw), dst=at(node.id), n=n, c_in=c_in, h=h, w=w, c_out=c_out,
                                 h_out=h_out, w_out=w_out, kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw, dh=dh, dw=dw,
                                 groups=node.attrs["groups"]), reads=[ix, iw], writes=[node.id])


@lowers("max_pool2d", "avg_pool2d")
def lower_pool(ctx: LowerContext, node: Node) -> None:
    """One Pool2D (kind Max or Mean)."""
    ix, = node.inputs
    n, c, h, w = ctx.node(ix).shape
    (kh, kw), (sh, sw), (ph, pw) = node.attrs["kernel"], node.attrs["stride"], node.attrs["padding"]
    kind = ReduceOp.Max if node.op == "max_pool2d" else ReduceOp.Mean
    ctx.emit(lambda at: T.Pool2D(src=at(ix), dst=at(node.id), n=n, c=c, h=h, w=w, h_out=node.shape[2],
                                 w_out=node.shape[3], kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw, kind=kind),
             reads=[ix], writes=[node.id])
