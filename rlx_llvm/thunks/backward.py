"""Training kernels: backward passes of activations, norms, RoPE, cumsum, gather, pooling and
convolutions (semantics.md §2.3, §3.3, §3.7, §3.12).  All tensors are f32 unless named F64.

Only the inputs a gradient depends on are read: RmsNorm/GroupNorm backward never read `beta`,
BatchNorm's input gradient needs only `gamma` and `var`, a beta gradient only `dy`.
"""
from __future__ import annotations

from typing import ClassVar, Iterable

from ..ops import Activation
from .base import F32, F64, Extent, Thunk, f32, u32, usize
from .conv import grouped_weight


class _ElementGrad(Thunk):
    """`dx[i] = f'(x[i])·dy[i]` over `len` elements of `elem_bytes`."""

    family = "backward"
    elem_bytes: ClassVar[int] = F32

    x: usize
    dy: usize
    dx: usize
    len: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", self.elem_bytes * self.len)
        yield self.span("dy", self.elem_bytes * self.len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dx", self.elem_bytes * self.len)


class ReluBackward(_ElementGrad):
    """`dx = dy` where `x > 0`, else 0."""


class ReluBackwardF64(_ElementGrad):
    """ReluBackward at 8 bytes per element."""

    elem_bytes = F64


class ActivationBackward(_ElementGrad):
    """`dx = kind'(x)·dy` for a differentiable activation."""

    kind: Activation


class ActivationBackwardF64(_ElementGrad):
    """ActivationBackward at 8 bytes per element."""

    elem_bytes = F64

    kind: Activation


# ── row norms ────────────────────────────────────────────────────────────────

class _RowGrad(Thunk):
    """Gradients of a norm over the last axis of `[rows, h]`."""

    family = "backward"

    def _rows(self, *names: str) -> Iterable[Extent]:
        for name in names:
            yield self.span(name, F32 * self.rows * self.h)


class LayerNormBackwardInput(_RowGrad):
    """LayerNorm input gradient (recomputes mean, variance and x̂ from `x`)."""

    x: usize
    gamma: usize
    dy: usize
    dx: usize
    rows: u32
    h: u32
    eps: f32

    def _reads(self) -> Iterable[Extent]:
        yield from self._rows("x", "dy")
        yield self.span("gamma", F32 * self.h)

    def _writes(self) -> Iterable[Extent]:
        yield from self._rows("dx")


class LayerNormBackwardGamma(_RowGrad):
    """LayerNorm gamma gradient `dgamma = Σ_rows dy·x̂`."""

    x: usize
    dy: usize
    dgamma: usize
    rows: u32
    h: u32
    eps: f32

    def _reads(self) -> Iterable[Extent]:
        yield from self._rows("x", "dy")

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dgamma", F32 * self.h)


class RmsNormBackwardInput(_RowGrad):
    """RmsNorm input gradient."""

    x: usize
    gamma: usize
    beta: usize
    dy: usize
    dx: usize
    rows: u32
    h: u32
    eps: f32

    def _reads(self) -> Iterable[Extent]:
        yield from self._rows("x", "dy")
        yield self.span("gamma", F32 * self.h)

    def _writes(self) -> Iterable[Extent]:
        yield from self._rows("dx")


class RmsNormBackwardGamma(_RowGrad):
    """RmsNorm gamma gradient `dgamma = Σ_rows dy·x/rms`."""

    x: usize
    gamma: usize
    beta: usize
    dy: usize
    dgamma: usize
    rows: u32
    h: u32
    eps: f32

    def _reads(self) -> Iterable[Extent]:
        yield from self._rows("x", "dy")

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dgamma", F32 * self.h)


class RmsNormBackwardBeta(_RowGrad):
    """RmsNorm beta gradient `dbeta = Σ_rows dy`."""

    x: usize
    gamma: usize
    beta: usize
    dy: usize
    dbeta: usize
    rows: u32
    h: u32
    eps: f32

    def _reads(self) -> Iterable[Extent]:
        yield from self._rows("dy")

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dbeta", F32 * self.h)


class AdaLayerNormBackward(_RowGrad):
    """AdaLayerNorm backward into the packed `[dx ‖ dscale ‖ dshift]` (`rows·h + 2·mod_len` elements)."""

    x: usize
    scale: usize
    shift: usize
    dy: usize
    dst: usize
    rows: u32
    h: u32
    eps: f32
    layer_norm: bool
    mod_len: u32
    mod_off: tuple[u32, ...]

    def _reads(self) -> Iterable[Extent]:
        yield from self._rows("x", "dy")
        yield self.span("scale", F32 * self.mod_len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * (self.rows * self.h + 2 * self.mod_len))


class GatedResidualBackward(_RowGrad):
    """GatedResidual backward into the packed `[dx ‖ dy ‖ dgate]` (`2·rows·h + gate_len` elements)."""

    x: usize
    y: usize
    gate: usize
    dy: usize
    dst: usize
    rows: u32
    h: u32
    gate_len: u32
    gate_off: tuple[u32, ...]

    def _reads(self) -> Iterable[Extent]:
        yield from self._rows("y", "dy")
        yield self.span("gate", F32 * self.gate_len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * (2 * self.rows * self.h + self.gate_len))


# ── GroupNorm / BatchNorm ────────────────────────────────────────────────────

class _GroupGrad(Thunk):
    """Gradients of GroupNorm over NCHW `[n, c, h, w]`."""

    family = "backward"

    @property
    def elems(self) -> int:
        """Elements of x, dy and dx."""
        return self.n * self.c * self.h * self.w


class GroupNormBackwardInput(_GroupGrad):
    """GroupNorm input gradient."""

    x: usize
    gamma: usize
    beta: usize
    dy: usize
    dx: usize
    n: u32
    c: u32
    h: u32
    w: u32
    num_groups: u32
    eps: f32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.elems)
        yield self.span("gamma", F32 * self.c)
        yield self.span("dy", F32 * self.elems)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dx", F32 * self.elems)


class GroupNormBackwardGamma(_GroupGrad):
    """GroupNorm gamma gradient `dgamma[c] = Σ dy·x̂`."""

    x: usize
    dy: usize
    dgamma: usize
    n: u32
    c: u32
    h: u32
    w: u32
    num_groups: u32
    eps: f32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.elems)
        yield self.span("dy", F32 * self.elems)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dgamma", F32 * self.c)


class GroupNormBackwardBeta(_GroupGrad):
    """GroupNorm beta gradient `dbeta[c] = Σ dy`."""

    dy: usize
    dbeta: usize
    n: u32
    c: u32
    h: u32
    w: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("dy", F32 * self.elems)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dbeta", F32 * self.c)


class BatchNormInferenceBackwardInput(Thunk):
    """Inference-BatchNorm input gradient `dx = gamma[c]/√(var[c] + eps)·dy` over `[count, channels]`."""

    family = "backward"

    x: usize
    gamma: usize
    mean: usize
    var: usize
    dy: usize
    dx: usize
    count: u32
    channels: u32
    eps: f32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("gamma", F32 * self.channels)
        yield self.span("var", F32 * self.channels)
        yield self.span("dy", F32 * self.count * self.channels)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dx", F32 * self.count * self.channels)


class BatchNormInferenceBackwardGamma(Thunk):
    """Inference-BatchNorm gamma gradient `dgamma[c] = Σ dy·x̂`."""

    family = "backward"

    x: usize
    mean: usize
    var: usize
    dy: usize
    dgamma: usize
    count: u32
    channels: u32
    eps: f32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.count * self.channels)
        yield self.span("mean", F32 * self.channels)
        yield self.span("var", F32 * self.channels)
        yield self.span("dy", F32 * self.count * self.channels)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dgamma", F32 * self.channels)


class BatchNormInferenceBackwardBeta(Thunk):
    """Inference-BatchNorm beta gradient `dbeta[c] = Σ dy`."""

    family = "backward"

    dy: usize
    dbeta: usize
    count: u32
    channels: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("dy", F32 * self.count * self.channels)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dbeta", F32 * self.channels)


# ── RoPE, cumsum, gather ─────────────────────────────────────────────────────

class RopeBackward(Thunk):
    """The transpose of Rope (same table stride and pairing, sin negated) on contiguous `[batch, seq, hidden]`."""

    family = "backward"

    dy: usize
    cos: usize
    sin: usize
    dx: usize
    batch: u32
    seq: u32
    hidden: u32
    head_dim: u32
    n_rot: u32
    cos_len: u32
    cos_row_stride: u32
    interleaved: bool

    def _reads(self) -> Iterable[Extent]:
        yield self.span("dy", F32 * self.batch * self.seq * self.hidden)
        yield self.span("cos", F32 * self.cos_len)
        yield self.span("sin", F32 * self.cos_len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dx", F32 * self.batch * self.seq * self.hidden)


class CumsumBackward(Thunk):
    """Cumsum backward: the reverse running sum of `dy` along the last axis (shifted when `exclusive`)."""

    family = "backward"

    dy: usize
    dx: usize
    rows: u32
    cols: u32
    exclusive: bool

    def _reads(self) -> Iterable[Extent]:
        yield self.span("dy", F32 * self.rows * self.cols)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dx", F32 * self.rows * self.cols)


class GatherBackward(Thunk):
    """GatherAxis backward: zero `dst[outer, axis_dim, trailing]`, then scatter-add the `dy` rows by `indices`."""

    family = "backward"

    dy: usize
    indices: usize
    dst: usize
    outer: u32
    axis_dim: u32
    num_idx: u32
    trailing: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("dy", F32 * self.outer * self.num_idx * self.trailing)
        yield self.span("indices", F32 * self.num_idx)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.outer * self.axis_dim * self.trailing)


# ── pooling and convolution ──────────────────────────────────────────────────

class MaxPool2dBackward(Thunk):
    """Route each `dy` to the first arg-max of its 2-D window in `x` (dx zeroed first)."""

    family = "backward"

    x: usize
    dy: usize
    dx: usize
    n: u32
    c: u32
    h: u32
    w: u32
    h_out: u32
    w_out: u32
    kh: u32
    kw: u32
    sh: u32
    sw: u32
    ph: u32
    pw: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.n * self.c * self.h * self.w)
        yield self.span("dy", F32 * self.n * self.c * self.h_out * self.w_out)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dx", F32 * self.n * self.c * self.h * self.w)


class MaxPool3dBackward(Thunk):
    """Route each `dy` to the first arg-max of its 3-D window in `x` (dx zeroed first)."""

    family = "backward"

    x: usize
    dy: usize
    dx: usize
    n: u32
    c: u32
    d: u32
    h: u32
    w: u32
    d_out: u32
    h_out: u32
    w_out: u32
    kd: u32
    kh: u32
    kw: u32
    sd: u32
    sh: u32
    sw: u32
    pd: u32
    ph: u32
    pw: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.n * self.c * self.d * self.h * self.w)
        yield self.span("dy", F32 * self.n * self.c * self.d_out * self.h_out * self.w_out)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dx", F32 * self.n * self.c * self.d * self.h * self.w)


class Conv2dBackwardInput(Thunk):
    """Conv2D input gradient `dx = conv_transpose(dy, w)` (forward geometry)."""

    family = "backward"

    dy: usize
    w: usize
    dx: usize
    n: u32
    c_in: u32
    h: u32
    w_in: u32
    c_out: u32
    h_out: u32
    w_out: u32
    kh: u32
    kw: u32
    sh: u32
    sw: u32
    ph: u32
    pw: u32
    dh: u32
    dw: u32
    groups: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("dy", F32 * self.n * self.c_out * self.h_out * self.w_out)
        yield self.span("w", F32 * grouped_weight(self.c_out, self.c_in, self.groups, self.kh, self.kw))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dx", F32 * self.n * self.c_in * self.h * self.w_in)


class Conv2dBackwardWeight(Thunk):
    """Conv2D weight gradient: `dw` zeroed, then `Σ x·dy` per tap (`dw_dil` is the width dilation)."""

    family = "backward"

    x: usize
    dy: usize
    dw: usize
    n: u32
    c_in: u32
    h: u32
    w: u32
    c_out: u32
    h_out: u32
    w_out: u32
    kh: u32
    kw: u32
    sh: u32
    sw: u32
    ph: u32
    pw: u32
    dh: u32
    dw_dil: u32
    groups: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.n * self.c_in * self.h * self.w)
        yield self.span("dy", F32 * self.n * self.c_out * self.h_out * self.w_out)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dw", F32 * grouped_weight(self.c_out, self.c_in, self.groups, self.kh, self.kw))


class Conv3dBackwardInput(Thunk):
    """Conv3d input gradient (transposed 3-D convolution of `dy` with `w`)."""

    family = "backward"

    dy: usize
    w: usize
    dx: usize
    n: u32
    c_in: u32
    d: u32
    h: u32
    w_in: u32
    c_out: u32
    d_out: u32
    h_out: u32
    w_out: u32
    kd: u32
    kh: u32
    kw: u32
    sd: u32
    sh: u32
    sw: u32
    pd: u32
    ph: u32
    pw: u32
    dd: u32
    dh: u32
    dw: u32
    groups: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("dy", F32 * self.n * self.c_out * self.d_out * self.h_out * self.w_out)
        yield self.span("w", F32 * grouped_weight(self.c_out, self.c_in, self.groups, self.kd, self.kh, self.kw))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dx", F32 * self.n * self.c_in * self.d * self.h * self.w_in)


class Conv3dBackwardWeight(Thunk):
    """Conv3d weight gradient: `dw` zeroed, then `Σ x·dy` per tap (`dw_dil` is the width dilation)."""

    family = "backward"

    x: usize
    dy: usize
    dw: usize
    n: u32
    c_in: u32
    d: u32
    h: u32
    w: u32
    c_out: u32
    d_out: u32
    h_out: u32
    w_out: u32
    kd: u32
    kh: u32
    kw: u32
    sd: u32
    sh: u32
    sw: u32
    pd: u32
    ph: u32
    pw: u32
    dd: u32
    dh: u32
    dw_dil: u32
    groups: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.n * self.c_in * self.d * self.h * self.w)
        yield self.span("dy", F32 * self.n * self.c_out * self.d_out * self.h_out * self.w_out)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dw", F32 * grouped_weight(self.c_out, self.c_in, self.groups, self.kd, self.kh, self.kw))
