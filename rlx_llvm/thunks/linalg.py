"""Solves, factorizations and sorting (semantics.md §3.2): LAPACK-backed, f32 ones promoted to f64."""
from __future__ import annotations

from typing import ClassVar, Iterable

from .base import F32, F64, Extent, Thunk, u8, u32, usize


class _Solve(Thunk):
    """`X = A⁻¹·B` for `batch` systems of `A[n,n]`, `B[n,nrhs]` (unbatched: one system)."""

    family = "linalg"
    elem_bytes: ClassVar[int]

    @property
    def systems(self) -> int:
        """Number of independent systems."""
        return getattr(self, "batch", 1)

    def _reads(self) -> Iterable[Extent]:
        yield self.span("a", self.elem_bytes * self.systems * self.n * self.n)
        yield self.span("b", self.elem_bytes * self.systems * self.n * self.nrhs)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("x", self.elem_bytes * self.systems * self.n * self.nrhs)


class DenseSolveF64(_Solve):
    """f64 dense solve `X = A⁻¹·B` (LAPACK dgesv)."""

    elem_bytes = F64

    a: usize
    b: usize
    x: usize
    n: u32
    nrhs: u32


class DenseSolveF32(_Solve):
    """f32 dense solve `X = A⁻¹·B` (LAPACK sgesv)."""

    elem_bytes = F32

    a: usize
    b: usize
    x: usize
    n: u32
    nrhs: u32


class BatchedDenseSolveF64(_Solve):
    """Batched f64 dense solve: one dgesv per slice."""

    elem_bytes = F64

    a: usize
    b: usize
    x: usize
    batch: u32
    n: u32
    nrhs: u32


class BatchedDenseSolveF32(_Solve):
    """Batched f32 dense solve: one sgesv per slice."""

    elem_bytes = F32

    a: usize
    b: usize
    x: usize
    batch: u32
    n: u32
    nrhs: u32


class CholeskyF32(Thunk):
    """Cholesky factor `A = L·Lᵀ` of `a[n,n]` into lower-triangular `l[n,n]` (upper zeroed)."""

    family = "linalg"

    a: usize
    l: usize  # noqa: E741 (the seed's name)
    n: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("a", F32 * self.n * self.n)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("l", F32 * self.n * self.n)


class TriangularSolveF32(Thunk):
    """Triangular solve `op(A)·X = B` with `a[n,n]`, `b`/`x` `[n,nrhs]`."""

    family = "linalg"

    a: usize
    b: usize
    x: usize
    n: u32
    nrhs: u32
    lower: bool
    transpose: bool

    def _reads(self) -> Iterable[Extent]:
        yield self.span("a", F32 * self.n * self.n)
        yield self.span("b", F32 * self.n * self.nrhs)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.n * self.nrhs)


class DetF32(Thunk):
    """Determinant (or `log|det|` with `log_abs`) of `a[n,n]` into the scalar `out`."""

    family = "linalg"

    a: usize
    out: usize
    n: u32
    log_abs: bool

    def _reads(self) -> Iterable[Extent]:
        yield self.span("a", F32 * self.n * self.n)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("out", F32)


class SortF32(Thunk):
    """Sort (or argsort with `arg`, f32 indices) each fiber of `[outer, axis_dim, inner]`."""

    family = "linalg"

    src: usize
    dst: usize
    outer: u32
    axis_dim: u32
    inner: u32
    descending: bool
    arg: bool

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.outer * self.axis_dim * self.inner)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.outer * self.axis_dim * self.inner)


class SvdF32(Thunk):
    """One factor of the thin SVD of `a[m,n]`: `part` 0 = U `[m,k]`, 1 = S `[k]`, 2 = Vt `[k,n]`, k = min(m,n)."""

    family = "linalg"

    a: usize
    out: usize
    m: u32
    n: u32
    part: u8

    def _reads(self) -> Iterable[Extent]:
        yield self.span("a", F32 * self.m * self.n)

    def _writes(self) -> Iterable[Extent]:
        k = min(self.m, self.n)
        yield self.span("out", F32 * {0: self.m * k, 1: k, 2: k * self.n}.get(self.part, 0))


class QrF32(Thunk):
    """One factor of the thin QR of `a[m,n]`: `part` 0 = Q `[m,k]`, 1 = R `[k,n]`, k = min(m,n)."""

    family = "linalg"

    a: usize
    out: usize
    m: u32
    n: u32
    part: u8

    def _reads(self) -> Iterable[Extent]:
        yield self.span("a", F32 * self.m * self.n)

    def _writes(self) -> Iterable[Extent]:
        k = min(self.m, self.n)
        yield self.span("out", F32 * {0: self.m * k, 1: k * self.n}.get(self.part, 0))
