"""NumPy reference of the element-wise thunks (semantics.md §3.1, §3.12).

Written for clarity: every kernel computes, per output element, the index it reads in each
operand (`binary_indices`, `walk_indices`), gathers, applies the elementmath rule, and stores.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .. import thunks as T
from . import elementmath as em
from . import reference, view


# ── indexing ────────────────────────────────────────────────────────────────

def walk_indices(dims, strides) -> np.ndarray:
    """For each row-major coordinate `c` of `dims`: the element index `Σ c·strides`."""
    n = math.prod(dims)
    index = np.zeros(n, dtype=np.int64)
    if n == 0:
        return index
    for coord, stride in zip(np.unravel_index(np.arange(n), tuple(dims)), strides):
        index += coord.astype(np.int64) * int(stride)
    return index


def legacy_indices(n: int, operand_len: int) -> np.ndarray:
    """Legacy indexing: element 0 for a length ≤ 1 operand, else `i mod operand_len`."""
    i = np.arange(n, dtype=np.int64)
    return np.zeros(n, dtype=np.int64) if operand_len <= 1 else i % operand_len


def binary_indices(t) -> tuple[np.ndarray, np.ndarray]:
    """BinaryFull's three paths: plain, broadcast stride walk, legacy modulo."""
    n = t.len
    if t.lhs_len == t.rhs_len == n:
        return np.arange(n), np.arange(n)
    if t.out_dims_bcast:
        return walk_indices(t.out_dims_bcast, t.bcast_lhs_strides), walk_indices(t.out_dims_bcast,
                                                                                   t.bcast_rhs_strides)
    return legacy_indices(n, t.lhs_len), legacy_indices(n, t.rhs_len)


def gather(arena: np.ndarray, offset: int, dtype, index: np.ndarray) -> np.ndarray:
    """Elements of `dtype` at `index` in the slot at `offset` (a copy)."""
    count = int(index.max()) + 1 if index.size else 0
    return view(arena, offset, dtype, count)[index]


def gather_c64(arena: np.ndarray, offset: int, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Complex elements (interleaved f32 pairs) at `index`, as (re, im)."""
    count = int(index.max()) + 1 if index.size else 0
    pairs = view(arena, offset, np.float32, 2 * count).reshape(count, 2)[index]
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def store_c64(arena: np.ndarray, offset: int, re: np.ndarray, im: np.ndarray) -> None:
    """Write (re, im) as interleaved f32 pairs."""
    out = view(arena, offset, np.float32, 2 * re.size).reshape(re.size, 2)
    out[:, 0], out[:, 1] = re, im


# ── BinaryFull family, BiasAdd ──────────────────────────────────────────────

@reference(T.BinaryFull)
def binary_full(arena: np.ndarray, t) -> None:
    """f32 (elem_bytes 4) or i64 (elem_bytes 8) binary with broadcast."""
    li, ri = binary_indices(t)
    if t.len == 0:
        return
    dtype, rule = (np.int64, em.binary_i64) if t.elem_bytes == 8 else (np.float32, em.binary)
    l, r = gather(arena, t.lhs, dtype, li), gather(arena, t.rhs, dtype, ri)
    with np.errstate(all="ignore"):
        result = rule(t.op, l, r)
    view(arena, t.dst, dtype, t.len)[:] = result


@reference(T.BinaryFullF64)
def binary_full_f64(arena: np.ndarray, t) -> None:
    """f64 binary with broadcast."""
    li, ri = binary_indices(t)
    if t.len == 0:
        return
    l, r = gather(arena, t.lhs, np.float64, li), gather(arena, t.rhs, np.float64, ri)
    with np.errstate(all="ignore"):
        result = em.binary_f64(t.op, l, r)
    view(arena, t.dst, np.float64, t.len)[:] = result


@reference(T.BinaryFullC64)
def binary_full_c64(arena: np.ndarray, t) -> None:
    """Complex binary with broadcast (indices count complex elements)."""
    li, ri = binary_indices(t)
    if t.len == 0:
        return
    with np.errstate(all="ignore"):
        re, im = em.binary_c64(t.op, gather_c64(arena, t.lhs, li), gather_c64(arena, t.rhs, ri))
    store_c64(arena, t.dst, np.asarray(re, np.float32), np.asarray(im, np.float32))


@reference(T.BiasAdd)
def bias_add(arena: np.ndarray, t) -> None:
    """dst[r, j] = src[r, j] + bias[j]."""
    src = view(arena, t.src, np.float32, t.m * t.n).reshape(t.m, t.n)
    bias = view(arena, t.bias, np.float32, t.n)
    result = src + bias[None, :]
    view(arena, t.dst, np.float32, t.m * t.n)[:] = result.reshape(-1)


# ── activations ─────────────────────────────────────────────────────────────

@reference(T.ActivationInPlace)
def activation_in_place(arena: np.ndarray, t) -> None:
    """data = act(data) in f32 (standalone: Gelu is the erf form)."""
    data = view(arena, t.data, np.float32, t.len)
    with np.errstate(all="ignore"):
        data[:] = em.activation(t.act, data.copy(), region=False)


@reference(T.ActivationF64)
def activation_f64(arena: np.ndarray, t) -> None:
    """dst = kind(src) in f64."""
    src = view(arena, t.src, np.float64, t.len).copy()
    with np.errstate(all="ignore"):
        view(arena, t.dst, np.float64, t.len)[:] = em.activation_f64(t.kind, src)


@reference(T.ActivationC64)
def activation_c64(arena: np.ndarray, t) -> None:
    """dst = kind(src) on complex elements (Neg, Exp, Log, Sqrt)."""
    idx = np.arange(t.len)
    re, im = gather_c64(arena, t.src, idx)
    with np.errstate(all="ignore"):
        out_re, out_im = em.activation_c64(t.kind, re, im)
    store_c64(arena, t.dst, np.asarray(out_re, np.float32), np.asarray(out_im, np.float32))


# ── Compare, Where ──────────────────────────────────────────────────────────

def _compare_dtype(t):
    if t.inputs_i64 or t.inputs_elem_bytes == 8:
        return np.int64
    return np.uint8 if t.inputs_elem_bytes == 1 else np.float32


@reference(T.Compare)
def compare(arena: np.ndarray, t) -> None:
    """out = (L op R) ? 1 : 0, stored as Bool (1 byte) or f32."""
    n = t.len
    if n == 0:
        return
    if t.out_dims_bcast:
        li, ri = walk_indices(t.out_dims_bcast, t.bcast_lhs_strides), walk_indices(t.out_dims_bcast,
                                                                                     t.bcast_rhs_strides)
    else:
        li = np.zeros(n, np.int64) if t.lhs_scalar else np.arange(n)
        ri = np.zeros(n, np.int64) if t.rhs_scalar else np.arange(n)
    dtype = _compare_dtype(t)
    hit = em.compare(t.op, gather(arena, t.lhs, dtype, li), gather(arena, t.rhs, dtype, ri))
    out_dtype = np.uint8 if t.dst_elem_bytes == 1 else np.float32
    view(arena, t.dst, out_dtype, n)[:] = np.asarray(hit, dtype=bool).astype(out_dtype)


@reference(T.Where)
def where(arena: np.ndarray, t) -> None:
    """out = cond != 0 ? on_true : on_false (a NaN f32 condition is true); data copied bit-exactly."""
    n = t.len
    if n == 0:
        return
    idx = lambda scalar: np.zeros(n, np.int64) if scalar else np.arange(n)  # noqa: E731
    cond = gather(arena, t.cond, np.uint8 if t.cond_elem_bytes == 1 else np.float32, idx(t.cond_scalar))
    bits = np.uint64 if t.elem_bytes == 8 else np.uint32
    on_true = gather(arena, t.on_true, bits, idx(t.true_scalar))
    on_false = gather(arena, t.on_false, bits, idx(t.false_scalar))
    view(arena, t.dst, bits, n)[:] = np.where(cond != 0, on_true, on_false)


# ── Fma, SgdMomentum ────────────────────────────────────────────────────────

def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Correctly rounded f32 `a·b + c`.

    `a·b` is exact in f64 (48 significant bits); the f64 sum `s` with its exact error `e`
    (TwoSum) is rounded *to odd* (nudged one f64 ulp towards `e` when inexact with an even last
    bit), and an odd-rounded value with ≥ 2 extra bits rounds to f32 exactly like the exact sum.
    """
    a64, b64, c64 = (np.asarray(x, np.float64) for x in (a, b, c))
    with np.errstate(all="ignore"):
        p = a64 * b64
        s = p + c64
        bv = s - p
        e = (p - (s - bv)) + (c64 - bv)
        fix = np.isfinite(s) & (e != 0) & ((s.view(np.int64) & 1) == 0)
        s = np.where(fix, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
        return s.astype(np.float32)


def fma_f64_scalar(a: float, b: float, c: float) -> float:
    """Correctly rounded f64 `a·b + c` (math.fma on Python ≥ 3.13, else exact Fractions)."""
    if hasattr(math, "fma"):
        try:
            return math.fma(a, b, c)
        except (OverflowError, ValueError):
            pass
    if not (math.isfinite(a) and math.isfinite(b)):
        return a * b + c
    if not math.isfinite(c):
        return c
    product = Fraction(a) * Fraction(b)
    exact = product + Fraction(c)
    if exact == 0:
        # exact zero: −0 only when both addends are (signed) zeros that are negative
        return (a * b) + c if product == 0 else 0.0
    try:
        return float(exact)  # int / int true division rounds correctly
    except OverflowError:
        return math.copysign(math.inf, exact)


def fma_f64(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Correctly rounded f64 `a·b + c`, element-wise (slow: one Python call per element)."""
    return np.array([fma_f64_scalar(float(x), float(y), float(z)) for x, y, z in zip(a, b, c)],
                    dtype=np.float64)


@reference(T.Fma)
def fma(arena: np.ndarray, t) -> None:
    """dst = a·b + c with one rounding (f32 or f64)."""
    dtype = np.float64 if t.elem_bytes == 8 else np.float32
    a, b, c = (view(arena, off, dtype, t.len).copy() for off in (t.a, t.b, t.c))
    result = fma_f64(a, b, c) if t.elem_bytes == 8 else fma_f32(a, b, c)
    view(arena, t.dst, dtype, t.len)[:] = result


@reference(T.SgdMomentum)
def sgd_momentum(arena: np.ndarray, t) -> None:
    """v' = mom·v + g; p' = p − lr·v' in f32, each operation rounded."""
    p, v, g = (view(arena, off, np.float32, t.len).copy() for off in (t.param, t.vel, t.grad))
    with np.errstate(all="ignore"):
        v_new = np.float32(t.mom) * v + g
        p_new = p - np.float32(t.lr) * v_new
    view(arena, t.p_out, np.float32, t.len)[:] = p_new
    view(arena, t.v_out, np.float32, t.len)[:] = v_new


# ── complex helpers ─────────────────────────────────────────────────────────

@reference(T.ComplexNormSqF32)
def complex_norm_sq_f32(arena: np.ndarray, t) -> None:
    """dst = re² + im²."""
    re, im = gather_c64(arena, t.src, np.arange(t.len))
    with np.errstate(all="ignore"):
        view(arena, t.dst, np.float32, t.len)[:] = re * re + im * im


@reference(T.ComplexNormSqBackwardF32)
def complex_norm_sq_backward_f32(arena: np.ndarray, t) -> None:
    """dz = g·z."""
    re, im = gather_c64(arena, t.z, np.arange(t.len))
    g = view(arena, t.g, np.float32, t.len).copy()
    with np.errstate(all="ignore"):
        store_c64(arena, t.dz, g * re, g * im)


@reference(T.ConjugateC64)
def conjugate_c64(arena: np.ndarray, t) -> None:
    """dst = (re, −im)."""
    re, im = gather_c64(arena, t.src, np.arange(t.len))
    store_c64(arena, t.dst, re, -im)


# ── SplineActivation ────────────────────────────────────────────────────────

@reference(T.SplineActivation)
def spline_activation(arena: np.ndarray, t) -> None:
    """`y[r, c] = Σ_g coeff[c, g]·exp(−((x − center_g)·inv_h)²)`: the grid (`step`, `center_g = gmin + g·step`,
    `inv_h = 1/step`) in f32 as the kernel forms it, the rest in float64, rounded to f32 once."""
    rows, ch, nb = t.rows, t.channels, t.num_basis
    if not rows * ch:
        return
    gmin, gmax = np.float32(t.grid_min), np.float32(t.grid_max)
    with np.errstate(all="ignore"):
        step = np.float32((gmax - gmin) / np.float32(nb - 1)) if nb > 1 else np.float32(1.0)
        inv_h = np.float32(np.float32(1.0) / step)
        centers = (gmin + np.arange(nb, dtype=np.float32) * step).astype(np.float64)
        x = view(arena, t.x, np.float32, rows * ch).reshape(rows, ch, 1).astype(np.float64)
        coeff = view(arena, t.coeff, np.float32, ch * nb).reshape(ch, nb).astype(np.float64)
        d = (x - centers) * float(inv_h)
        y = (coeff * np.exp(-(d * d))).sum(axis=2) if nb else np.zeros((rows, ch))
    view(arena, t.dst, np.float32, rows * ch)[:] = y.reshape(-1).astype(np.float32)
