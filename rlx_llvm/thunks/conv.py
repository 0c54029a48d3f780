"""Convolutions, pooling and im2col on NCHW / NCDHW f32 tensors (semantics.md §3.7).

Weights are `[c_out, c_in / groups, k…]` for convolutions and `[c_in, c_out / groups, k…]` for
transposed ones.
"""
from __future__ import annotations

from typing import Iterable

from ..ops import ReduceOp
from .base import F32, Extent, Thunk, prod, u32, usize


def grouped_weight(c_lead: int, c_split: int, groups: int, *kernel: int) -> int:
    """Elements of a `[c_lead, c_split / groups, *kernel]` weight (0 when groups is 0)."""
    return c_lead * (c_split // groups if groups else 0) * prod(kernel)


class Conv2D(Thunk):
    """Direct 2-D convolution `[n, c_in, h, w] → [n, c_out, h_out, w_out]` with stride, padding, dilation, groups."""

    family = "conv"

    src: usize
    weight: usize
    dst: usize
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
    dw: u32
    groups: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.n * self.c_in * self.h * self.w)
        yield self.span("weight", F32 * grouped_weight(self.c_out, self.c_in, self.groups, self.kh, self.kw))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.n * self.c_out * self.h_out * self.w_out)


class Conv2D1x1(Thunk):
    """1×1 stride-1 convolution as a per-image GEMM: `W[c_out, c_in] @ X[c_in, hw]`."""

    family = "conv"

    src: usize
    weight: usize
    dst: usize
    n: u32
    c_in: u32
    c_out: u32
    hw: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.n * self.c_in * self.hw)
        yield self.span("weight", F32 * self.c_out * self.c_in)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.n * self.c_out * self.hw)


class ConvTranspose2d(Thunk):
    """2-D transposed convolution `[n, c_in, h, w_in] → [n, c_out, h_out, w_out]` (output padding folded in)."""

    family = "conv"

    src: usize
    weight: usize
    dst: usize
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
        yield self.span("src", F32 * self.n * self.c_in * self.h * self.w_in)
        yield self.span("weight", F32 * grouped_weight(self.c_in, self.c_out, self.groups, self.kh, self.kw))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.n * self.c_out * self.h_out * self.w_out)


class Conv3d(Thunk):
    """Direct 3-D convolution `[n, c_in, d, h, w] → [n, c_out, d_out, h_out, w_out]`."""

    family = "conv"

    src: usize
    weight: usize
    dst: usize
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
    dw: u32
    groups: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.n * self.c_in * self.d * self.h * self.w)
        yield self.span("weight", F32 * grouped_weight(self.c_out, self.c_in, self.groups, self.kd, self.kh, self.kw))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.n * self.c_out * self.d_out * self.h_out * self.w_out)


class ConvTranspose3d(Thunk):
    """3-D transposed convolution `[n, c_in, d, h, w_in] → [n, c_out, d_out, h_out, w_out]`."""

    family = "conv"

    src: usize
    weight: usize
    dst: usize
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
        yield self.span("src", F32 * self.n * self.c_in * self.d * self.h * self.w_in)
        yield self.span("weight", F32 * grouped_weight(self.c_in, self.c_out, self.groups, self.kd, self.kh, self.kw))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.n * self.c_out * self.d_out * self.h_out * self.w_out)


class Pool2D(Thunk):
    """2-D Max or Mean pooling `[n, c, h, w] → [n, c, h_out, w_out]` (Mean counts padding)."""

    family = "conv"

    src: usize
    dst: usize
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
    kind: ReduceOp

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.n * self.c * self.h * self.w)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.n * self.c * self.h_out * self.w_out)


class Pool3D(Thunk):
    """3-D Max or Mean pooling `[n, c, d, h, w] → [n, c, d_out, h_out, w_out]` (Mean counts padding)."""

    family = "conv"

    src: usize
    dst: usize
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
    kind: ReduceOp

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.n * self.c * self.d * self.h * self.w)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.n * self.c * self.d_out * self.h_out * self.w_out)


class Im2Col(Thunk):
    """NCHW im2col: `col[n·h_out·w_out, c_in·kh·kw]`, zero for padded taps (`n` 0 is read as batch 1)."""

    family = "conv"

    x: usize
    col: usize
    n: u32
    c_in: u32
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
    dh: u32
    dw_dil: u32

    @property
    def batch(self) -> int:
        """Images processed: `n`, or 1 when `n` is 0 (RLX then infers the batch from `x`'s slot)."""
        return self.n or 1

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.batch * self.c_in * self.h * self.w)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("col", F32 * self.batch * self.h_out * self.w_out * self.c_in * self.kh * self.kw)
