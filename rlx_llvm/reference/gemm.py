"""NumPy references of the GEMM family (semantics.md §3.2, §3.7, §3.8), computed in float64.

Inputs are read exactly (halves widened exactly), the product is formed in f64 and rounded once to
the output's storage (f32, f64, complex64, or f32 then RNE to a packed half).
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..dtypes import HalfKind
from . import reference, view
from .halves import bf16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits


def matrix(arena: np.ndarray, offset: int, rows: int, cols: int, dtype=np.float32) -> np.ndarray:
    """A row-major `[rows, cols]` slot as float64 (complex128 for complex64)."""
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    return view(arena, offset, dtype, rows * cols).reshape(rows, cols).astype(wide)


def put(arena: np.ndarray, offset: int, value: np.ndarray, dtype=np.float32) -> None:
    """Round `value` to `dtype` and store it at `offset`."""
    flat = np.asarray(value).reshape(-1)
    view(arena, offset, dtype, flat.size)[:] = flat.astype(dtype)


def half_matrix(arena: np.ndarray, offset: int, rows: int, cols: int, kind: HalfKind) -> np.ndarray:
    """An operand stored as f32 or packed bf16/f16, widened exactly to float64."""
    if kind is HalfKind.F32:
        return matrix(arena, offset, rows, cols)
    bits = view(arena, offset, np.uint16, rows * cols)
    wide = bf16_bits_to_f32(bits) if kind is HalfKind.Bf16 else bits.view(np.float16).astype(np.float32)
    return wide.astype(np.float64).reshape(rows, cols)


def put_half(arena: np.ndarray, offset: int, value: np.ndarray, kind: HalfKind) -> None:
    """Store as f32, or round f32 → bf16/f16 (RNE) for a packed slot."""
    if kind is HalfKind.F32:
        put(arena, offset, value)
        return
    f32 = np.asarray(value, dtype=np.float32).reshape(-1)
    bits = f32_to_bf16_bits(f32) if kind is HalfKind.Bf16 else f32_to_f16_bits(f32)
    view(arena, offset, np.uint16, bits.size)[:] = bits


@reference(T.Sgemm)
def sgemm(arena: np.ndarray, t) -> None:
    """`C = A·B`."""
    put(arena, t.c, matrix(arena, t.a, t.m, t.k) @ matrix(arena, t.b, t.k, t.n))


@reference(T.SgemmT)
def sgemm_t(arena: np.ndarray, t) -> None:
    """`C = op(A)·op(B)`; a transposed operand is stored `[k, m]` / `[n, k]`."""
    a = matrix(arena, t.a, t.k, t.m).T if t.ta else matrix(arena, t.a, t.m, t.k)
    b = matrix(arena, t.b, t.n, t.k).T if t.tb else matrix(arena, t.b, t.k, t.n)
    put(arena, t.c, a @ b)


@reference(T.Dgemm)
def dgemm(arena: np.ndarray, t) -> None:
    """`C = A·B` in f64."""
    put(arena, t.c, matrix(arena, t.a, t.m, t.k, np.float64) @ matrix(arena, t.b, t.k, t.n, np.float64),
        np.float64)


@reference(T.CgemmC64)
def cgemm_c64(arena: np.ndarray, t) -> None:
    """`C = A·B` on interleaved complex64."""
    put(arena, t.c, matrix(arena, t.a, t.m, t.k, np.complex64) @ matrix(arena, t.b, t.k, t.n, np.complex64),
        np.complex64)


@reference(T.BatchedSgemm, T.BatchedDgemmF64)
def batched_gemm(arena: np.ndarray, t) -> None:
    """Per batch `C[i] = A[i]·B[i]`; a broadcast operand reuses matrix 0."""
    dt = np.float64 if type(t).__name__ == "BatchedDgemmF64" else np.float32
    size = np.dtype(dt).itemsize
    for i in range(t.batch):
        a = matrix(arena, t.a + (0 if t.a_bcast else i * t.m * t.k * size), t.m, t.k, dt)
        b = matrix(arena, t.b + (0 if t.b_bcast else i * t.k * t.n * size), t.k, t.n, dt)
        put(arena, t.c + i * t.m * t.n * size, a @ b, dt)


@reference(T.SgemmBf16, T.SgemmF16, T.SgemmHalf)
def sgemm_half(arena: np.ndarray, t) -> None:
    """`C = A·B` with packed half operands widened and a packed C rounded RNE."""
    kinds = {"SgemmBf16": (HalfKind.F32, HalfKind.Bf16, HalfKind.F32),
             "SgemmF16": (HalfKind.F32, HalfKind.F16, HalfKind.F32)}
    ak, bk, ck = kinds.get(type(t).__name__) or (t.a_kind, t.b_kind, t.c_kind)
    c = half_matrix(arena, t.a, t.m, t.k, ak) @ half_matrix(arena, t.b, t.k, t.n, bk)
    put_half(arena, t.c, c, ck)


@reference(T.FusedMmBiasAct)
def fused_mm_bias_act(arena: np.ndarray, t) -> None:
    """`C = act(A·W + bias)` — the f32 activation formulas, erf-form Gelu."""
    c = (matrix(arena, t.a, t.m, t.k) @ matrix(arena, t.w, t.k, t.n)).astype(np.float32)
    c = c + view(arena, t.bias, np.float32, t.n)
    if t.act is not None:
        from .elementmath import activation
        c = activation(t.act, c, region=False)
    put(arena, t.c, c)


@reference(T.LoraMatMul)
def lora_mat_mul(arena: np.ndarray, t) -> None:
    """`out = X·W + scale·(X·A)·B`."""
    x = matrix(arena, t.x, t.m, t.k)
    out = x @ matrix(arena, t.w, t.k, t.n)
    if t.r:
        out = out + float(np.float32(t.scale)) * ((x @ matrix(arena, t.a, t.k, t.r)) @ matrix(arena, t.b, t.r, t.n))
    put(arena, t.dst, out)


@reference(T.Conv2D1x1)
def conv2d_1x1(arena: np.ndarray, t) -> None:
    """Per image `out[c_out, hw] = W[c_out, c_in]·X[c_in, hw]`."""
    w = matrix(arena, t.weight, t.c_out, t.c_in)
    for i in range(t.n):
        x = matrix(arena, t.src + i * t.c_in * t.hw * 4, t.c_in, t.hw)
        put(arena, t.dst + i * t.c_out * t.hw * 4, w @ x)


def expert_ids(arena: np.ndarray, offset: int, m: int) -> np.ndarray:
    """f32-encoded ids `as usize`: truncate toward zero, NaN/negative → 0."""
    ids = view(arena, offset, np.float32, m).astype(np.float64)
    return np.trunc(np.nan_to_num(np.maximum(ids, 0.0), nan=0.0, posinf=2.0**63)).astype(np.uint64)


def checked_expert_ids(arena: np.ndarray, t) -> np.ndarray:
    """Each row's expert `as usize`; an id ≥ `t.num_experts` raises IndexError naming the first such row."""
    ids = expert_ids(arena, t.expert_idx, t.m)
    bad = np.flatnonzero(ids >= t.num_experts)
    if bad.size:
        row = int(bad[0])
        raise IndexError(f"row {row}: expert id {view(arena, t.expert_idx, np.float32, t.m)[row]!r} ≥ "
                         f"num_experts {t.num_experts}")
    return ids.astype(np.intp)


@reference(T.GroupedMatMul)
def grouped_mat_mul(arena: np.ndarray, t) -> None:
    """`out[i] = input[i]·W[idx[i]]`, W `[E, K, N]` (or `[E, N, K]` when `w_transposed`)."""
    ids = checked_expert_ids(arena, t)
    x = matrix(arena, t.input, t.m, t.k_dim)
    out = np.zeros((t.m, t.n))
    for i, e in enumerate(ids):
        base = t.weight + int(e) * t.k_dim * t.n * 4
        w = matrix(arena, base, t.n, t.k_dim).T if t.w_transposed else matrix(arena, base, t.k_dim, t.n)
        out[i] = x[i] @ w
    put(arena, t.dst, out)


@reference(T.SynthMatMul)
def synth_mat_mul(arena: np.ndarray, t) -> None:
    """`out = X·W`, `W[p, j] = codebook[indices[j, p // d], p % d]`."""
    groups = t.k // t.entry_dim if t.entry_dim else 0
    codes = view(arena, t.indices, np.uint8, t.n * groups).reshape(t.n, groups).astype(np.int64)
    if codes.size and codes.max() >= t.num_entries:
        raise IndexError(f"code {int(codes.max())} ≥ num_entries {t.num_entries}")
    book = matrix(arena, t.codebook, t.num_entries, t.entry_dim)
    w = book[codes].reshape(t.n, t.k).T
    put(arena, t.dst, matrix(arena, t.x, t.m, t.k) @ w)
