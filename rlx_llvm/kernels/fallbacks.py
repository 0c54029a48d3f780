"""Thunks that run in Python on NumPy views of the arena: SvdF32, QrF32 (SciPy LAPACK), SortF32.

A native segment ends where one of these starts (`codegen.plan`).  Each reads exactly its
declared input extent and writes exactly its declared output extent (float64 internally).

Conventions (documented in docs/lowering-blas.md):

* **SvdF32** — thin SVD by LAPACK `dgesdd` in f64; `S` descending.  Signs: each singular pair
  `(uᵢ, vᵢ)` is flipped so that the entry of largest magnitude of `uᵢ` (the first such entry on a
  tie) is positive — the factors no longer depend on the LAPACK build.
* **QrF32** — thin QR by LAPACK `dgeqrf` + `dorgqr` in f64.  Signs: row `i` of R and column `i`
  of Q are flipped so that `R[i, i] ≥ 0` (for a full-rank A this makes the factorization unique).
* Non-finite input to SvdF32/QrF32 raises (SciPy's `check_finite`), which `Program.run` reports
  as ExecutionError naming the thunk; the output is left untouched.
* **SortF32** — along the axis of the `[outer, axis_dim, inner]` view; **stable** (equal keys
  keep their input order, `-0.0 == 0.0`), **NaNs last** in both directions (as NumPy ascending;
  descending sorts `-x`, so NaNs stay last); `arg=true` writes the source positions as f32.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg

from .. import thunks as T
from ..errors import ValidationError
from ..registry import fallback


def _view(arena: np.ndarray, offset: int, dtype, count: int) -> np.ndarray:
    """`count` elements of `dtype` at byte `offset`: exactly the declared extent."""
    dt = np.dtype(dtype)
    return arena[offset:offset + count * dt.itemsize].view(dt)


def svd_signs(u: np.ndarray, vt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flip each singular pair so that the largest-magnitude entry of each column of U is positive."""
    if u.size == 0:
        return u, vt
    pivot = np.argmax(np.abs(u), axis=0)
    signs = np.where(u[pivot, np.arange(u.shape[1])] < 0, -1.0, 1.0)
    return u * signs, vt * signs[:, None]


def qr_signs(q: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flip columns of Q and rows of R so that the diagonal of R is non-negative."""
    signs = np.where(np.diagonal(r) < 0, -1.0, 1.0)
    return q * signs, r * signs[:, None]


def check_part(parts: int):
    """A `check(thunk)` that `part` names one of the `parts` factors."""
    def check(t) -> None:
        if not 0 <= t.part < parts:
            raise ValidationError(f"part = {t.part} names no factor (0..{parts - 1})", field="part")
    return check


@fallback(T.SvdF32, check=check_part(3))
def svd_f32(arena: np.ndarray, t) -> None:
    """One factor (0 = U, 1 = S, 2 = Vt) of the thin SVD of `a[m, n]`."""
    m, n, k = t.m, t.n, min(t.m, t.n)
    if k == 0:
        return
    a = _view(arena, t.a, np.float32, m * n).reshape(m, n).astype(np.float64)
    u, s, vt = scipy.linalg.svd(a, full_matrices=False, lapack_driver="gesdd")
    u, vt = svd_signs(u, vt)
    factor = (u, s, vt)[t.part]
    _view(arena, t.out, np.float32, factor.size)[:] = factor.reshape(-1)


@fallback(T.QrF32, check=check_part(2))
def qr_f32(arena: np.ndarray, t) -> None:
    """One factor (0 = Q[m, k], 1 = R[k, n]) of the thin QR of `a[m, n]`."""
    m, n, k = t.m, t.n, min(t.m, t.n)
    if k == 0:
        return
    a = _view(arena, t.a, np.float32, m * n).reshape(m, n).astype(np.float64)
    q, r = scipy.linalg.qr(a, mode="economic")
    q, r = qr_signs(q, r)
    factor = (q, r)[t.part]
    _view(arena, t.out, np.float32, factor.size)[:] = factor.reshape(-1)


def sort_order(x: np.ndarray, descending: bool) -> np.ndarray:
    """Stable sort permutation along axis 1, NaNs last in both directions."""
    return np.argsort(-x if descending else x, axis=1, kind="stable")


@fallback(T.SortF32)
def sort_f32(arena: np.ndarray, t) -> None:
    """Sort (values) or argsort (f32 indices) each fiber of the `[outer, axis_dim, inner]` view."""
    count = t.outer * t.axis_dim * t.inner
    if count == 0:
        return
    x = _view(arena, t.src, np.float32, count).reshape(t.outer, t.axis_dim, t.inner)
    order = sort_order(x, t.descending)
    result = order.astype(np.float32) if t.arg else np.take_along_axis(x, order, axis=1)
    _view(arena, t.dst, np.float32, count)[:] = result.reshape(-1)
