"""Matrix products: GEMMs in every precision, batched and fused GEMMs, expert and codebook matmuls
(semantics.md §3.2, §3.8).  Row-major `A[m,k] @ B[k,n] → C[m,n]` unless a docstring says otherwise."""
from __future__ import annotations

from typing import ClassVar, Iterable

from ..dtypes import HalfKind
from ..ops import Activation
from .base import C64, F32, F64, HALF, I8, Extent, Thunk, cdiv, f32, u32, usize


class _Gemm(Thunk):
    """`C[m,n] = A[m,k] @ B[k,n]` with per-operand element widths."""

    family = "gemm"

    a: usize
    b: usize
    c: usize
    m: u32
    k: u32
    n: u32
    a_bytes: ClassVar[int] = F32
    b_bytes: ClassVar[int] = F32
    c_bytes: ClassVar[int] = F32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("a", self.a_bytes * self.m * self.k)
        yield self.span("b", self.b_bytes * self.k * self.n)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("c", self.c_bytes * self.m * self.n)


class Sgemm(_Gemm):
    """`C = A @ B` in f32 (BLAS sgemm)."""


class SgemmHalf(_Gemm):
    """`C = A @ B` where any operand may be packed at 2 B/elem (widened, f32 GEMM, `c` rounded back)."""

    a_kind: HalfKind
    b_kind: HalfKind
    c_kind: HalfKind

    @property
    def a_bytes(self) -> int:  # type: ignore[override]
        """Bytes per element of A (2 when packed)."""
        return self.a_kind.itemsize

    @property
    def b_bytes(self) -> int:  # type: ignore[override]
        """Bytes per element of B (2 when packed)."""
        return self.b_kind.itemsize

    @property
    def c_bytes(self) -> int:  # type: ignore[override]
        """Bytes per element of C (2 when packed)."""
        return self.c_kind.itemsize


class SgemmBf16(_Gemm):
    """`C = A @ B` with f32 `A`, `C` and a packed bf16 right-hand side `B`."""

    b_bytes = HALF


class SgemmF16(_Gemm):
    """`C = A @ B` with f32 `A`, `C` and a packed IEEE f16 right-hand side `B`."""

    b_bytes = HALF


class SgemmT(_Gemm):
    """`C = op(A) @ op(B)` in f32; `ta` stores `a` as `[k, m]`, `tb` stores `b` as `[n, k]`."""

    ta: bool
    tb: bool


class CgemmC64(_Gemm):
    """Complex `C = A @ B` on interleaved `[re, im]` f32 pairs; dims count complex elements."""

    a_bytes = b_bytes = c_bytes = C64


class Dgemm(_Gemm):
    """`C = A @ B` in f64."""

    a_bytes = b_bytes = c_bytes = F64


class _BatchedGemm(Thunk):
    """Per batch `C[i] = A[i] @ B[i]`; a `*_bcast` operand has batch 1 and is reused."""

    family = "gemm"
    elem_bytes: ClassVar[int]

    def _reads(self) -> Iterable[Extent]:
        yield self.span("a", self.elem_bytes * (1 if self.a_bcast else self.batch) * self.m * self.k)
        yield self.span("b", self.elem_bytes * (1 if self.b_bcast else self.batch) * self.k * self.n)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("c", self.elem_bytes * self.batch * self.m * self.n)


class BatchedDgemmF64(_BatchedGemm):
    """Batched f64 matmul `C[i] = A[i] @ B[i]` (broadcast flags reuse matrix 0)."""

    elem_bytes = F64

    a: usize
    b: usize
    c: usize
    batch: u32
    m: u32
    k: u32
    n: u32
    a_bcast: bool
    b_bcast: bool


class BatchedSgemm(_BatchedGemm):
    """Batched f32 matmul `C[i] = A[i] @ B[i]` (broadcast flags reuse matrix 0)."""

    elem_bytes = F32

    a: usize
    b: usize
    c: usize
    batch: u32
    m: u32
    k: u32
    n: u32
    a_bcast: bool
    b_bcast: bool


class FusedMmBiasAct(Thunk):
    """`C = act(A @ W + bias)` in f32 (`act = None`: bias only; Gelu is the erf form)."""

    family = "gemm"

    a: usize
    w: usize
    bias: usize
    c: usize
    m: u32
    k: u32
    n: u32
    act: Activation | None

    def _reads(self) -> Iterable[Extent]:
        yield self.span("a", F32 * self.m * self.k)
        yield self.span("w", F32 * self.k * self.n)
        yield self.span("bias", F32 * self.n)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("c", F32 * self.m * self.n)


class LoraMatMul(Thunk):
    """Fused LoRA matmul `dst = X @ W + scale·(X @ A[k,r]) @ B[r,n]`."""

    family = "gemm"

    x: usize
    w: usize
    a: usize
    b: usize
    dst: usize
    m: u32
    k: u32
    n: u32
    r: u32
    scale: f32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.m * self.k)
        yield self.span("w", F32 * self.k * self.n)
        yield self.span("a", F32 * self.k * self.r)
        yield self.span("b", F32 * self.r * self.n)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.m * self.n)


class GroupedMatMul(Thunk):
    """Per row `dst[i] = input[i] @ weight[expert_idx[i]]`; `weight` is `[E, K, N]` (`[E, N, K]` if transposed)."""

    family = "gemm"

    input: usize
    weight: usize
    expert_idx: usize
    dst: usize
    m: u32
    k_dim: u32
    n: u32
    num_experts: u32
    w_transposed: bool

    def _reads(self) -> Iterable[Extent]:
        yield self.span("input", F32 * self.m * self.k_dim)
        yield self.span("weight", F32 * self.num_experts * self.k_dim * self.n)
        yield self.span("expert_idx", F32 * self.m)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.m * self.n)


class SynthMatMul(Thunk):
    """Codebook matmul `dst = X @ W`, `W[p, j] = codebook[indices[j, p / entry_dim], p mod entry_dim]`."""

    family = "gemm"

    x: usize
    indices: usize
    codebook: usize
    dst: usize
    m: u32
    k: u32
    n: u32
    entry_dim: u32
    num_entries: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.m * self.k)
        yield self.span("indices", I8 * self.n * cdiv(self.k, self.entry_dim))
        yield self.span("codebook", F32 * self.num_entries * self.entry_dim)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.m * self.n)
