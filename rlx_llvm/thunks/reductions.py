"""Softmax, scans, reductions, selection and histograms (semantics.md §2.6, §3.3, §3.6).

Reductions view their input as `[outer, reduced, inner]` and write `[outer, inner]`.
"""
from __future__ import annotations

from typing import Iterable

from ..dtypes import DType
from ..ops import ReduceOp
from .base import F32, F64, I64, Extent, Thunk, f32, u8, u32, usize


class Softmax(Thunk):
    """In-place softmax of `rows × cols` f32 along an axis whose elements are `inner` apart."""

    family = "reductions"

    data: usize
    rows: u32
    cols: u32
    inner: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("data", F32 * self.rows * self.cols)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("data", F32 * self.rows * self.cols)


class Cumsum(Thunk):
    """Inclusive (or `exclusive`) running sum along the last axis of `[rows, cols]`, in f32 or i64 lanes."""

    family = "reductions"

    src: usize
    dst: usize
    rows: u32
    cols: u32
    exclusive: bool
    dtype: DType

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", self.dtype.itemsize * self.rows * self.cols)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", self.dtype.itemsize * self.rows * self.cols)


class CumScan(Thunk):
    """Inclusive (or `exclusive`) running product, or maximum with `is_max`, along the last axis (f32)."""

    family = "reductions"

    src: usize
    dst: usize
    rows: u32
    cols: u32
    exclusive: bool
    is_max: bool

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.rows * self.cols)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.rows * self.cols)


class Reduce(Thunk):
    """Sum / Mean / Max / Min / Prod over the middle axis of `[outer, reduced, inner]` (f32)."""

    family = "reductions"

    src: usize
    dst: usize
    outer: u32
    reduced: u32
    inner: u32
    op: ReduceOp

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.outer * self.reduced * self.inner)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.outer * self.inner)


class ReduceSumF64(Thunk):
    """f64 sum over the middle axis of `[outer, reduced, inner]`."""

    family = "reductions"

    src: usize
    dst: usize
    outer: u32
    reduced: u32
    inner: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F64 * self.outer * self.reduced * self.inner)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F64 * self.outer * self.inner)


class ArgReduce(Thunk):
    """Index of the max (`is_max`) or min over the middle axis of `[outer, reduced, inner]`, as f32."""

    family = "reductions"

    src: usize
    dst: usize
    outer: u32
    reduced: u32
    inner: u32
    is_max: bool

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.outer * self.reduced * self.inner)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.outer * self.inner)


class TopK(Thunk):
    """Indices of the `k` largest of each `[outer, axis_dim]` row, as f32 (or i64 with `indices_i64`)."""

    family = "reductions"

    src: usize
    dst: usize
    outer: u32
    axis_dim: u32
    k: u32
    indices_i64: u8

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.outer * self.axis_dim)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", (I64 if self.indices_i64 else F32) * self.outer * self.k)


class Histogram(Thunk):
    """f32 counts of `n` values in `bins` equal-width buckets over `[min, max]` (outside values dropped)."""

    family = "reductions"

    src: usize
    dst: usize
    n: u32
    bins: u32
    min: f32
    max: f32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.n)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.bins)
