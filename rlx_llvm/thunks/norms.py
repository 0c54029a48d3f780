"""Normalizations (semantics.md §3.3): row norms over `[rows, h]`, NCHW norms, BatchNorm, DiT modulation."""
from __future__ import annotations

from typing import Iterable

from .base import F32, Extent, Thunk, f32, u32, usize


class _RowNorm(Thunk):
    """Normalize each of `rows` rows of `h` f32 over the last axis, then `· g + b`."""

    family = "norms"

    src: usize
    g: usize
    b: usize
    dst: usize
    rows: u32
    h: u32
    eps: f32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.rows * self.h)
        yield self.span("g", F32 * self.h)
        yield self.span("b", F32 * self.h)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.rows * self.h)


class LayerNorm(_RowNorm):
    """LayerNorm over the last axis: `(x − μ)/√(var + eps)·g + b` (one-pass biased variance)."""


class RmsNorm(_RowNorm):
    """RMSNorm over the last axis: `x/√(mean(x²) + eps)·g + b`."""


class _ResidualNorm(Thunk):
    """Normalize `v = x + res (+ bias)` row-wise, then `· g + b`."""

    family = "norms"

    x: usize
    res: usize
    bias: usize
    g: usize
    b: usize
    out: usize
    rows: u32
    h: u32
    eps: f32
    has_bias: bool

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.rows * self.h)
        yield self.span("res", F32 * self.rows * self.h)
        if self.has_bias:
            yield self.span("bias", F32 * self.h)
        yield self.span("g", F32 * self.h)
        yield self.span("b", F32 * self.h)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("out", F32 * self.rows * self.h)


class FusedResidualLN(_ResidualNorm):
    """`out = LayerNorm(x + res + bias)·g + b`."""


class FusedResidualRmsNorm(_ResidualNorm):
    """`out = RmsNorm(x + res + bias)·g + b`."""


class GroupNorm(Thunk):
    """GroupNorm on NCHW `[n, c, h, w]`: per batch and group of `c / num_groups` channels, per-channel `g`, `b`."""

    family = "norms"

    src: usize
    g: usize
    b: usize
    dst: usize
    n: u32
    c: u32
    h: u32
    w: u32
    num_groups: u32
    eps: f32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.n * self.c * self.h * self.w)
        yield self.span("g", F32 * self.c)
        yield self.span("b", F32 * self.c)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.n * self.c * self.h * self.w)


class BatchNormInference(Thunk):
    """Inference BatchNorm on `[count, channels]`: `(x − mean[c])/√(var[c] + eps)·g[c] + b[c]`."""

    family = "norms"

    src: usize
    g: usize
    b: usize
    mean: usize
    var: usize
    dst: usize
    count: u32
    channels: u32
    eps: f32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.count * self.channels)
        for name in ("g", "b", "mean", "var"):
            yield self.span(name, F32 * self.channels)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.count * self.channels)


class LayerNorm2d(Thunk):
    """LayerNorm2d on NCHW (SAM / candle): per pixel across the `c` channels, per-channel `g`, `b`."""

    family = "norms"

    src: usize
    g: usize
    b: usize
    dst: usize
    n: u32
    c: u32
    h: u32
    w: u32
    eps: f32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.n * self.c * self.h * self.w)
        yield self.span("g", F32 * self.c)
        yield self.span("b", F32 * self.c)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.n * self.c * self.h * self.w)


class AdaLayerNorm(Thunk):
    """DiT adaLN modulation `norm(x)·(1 + scale) + shift`; row `r` uses `scale/shift[mod_off[r]:][:h]`."""

    family = "norms"

    src: usize
    scale: usize
    shift: usize
    dst: usize
    rows: u32
    h: u32
    eps: f32
    layer_norm: bool
    mod_len: u32
    mod_off: tuple[u32, ...]

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.rows * self.h)
        yield self.span("scale", F32 * self.mod_len)
        yield self.span("shift", F32 * self.mod_len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.rows * self.h)


class GatedResidual(Thunk):
    """DiT gated residual `out = x + gate·y`; row `r` uses `gate[gate_off[r]:][:h]`."""

    family = "norms"

    x: usize
    y: usize
    gate: usize
    dst: usize
    rows: u32
    h: u32
    gate_len: u32
    gate_off: tuple[u32, ...]

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.rows * self.h)
        yield self.span("y", F32 * self.rows * self.h)
        yield self.span("gate", F32 * self.gate_len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.rows * self.h)
