"""NumPy references of the solves, factorizations and SortF32 (semantics.md §3.2), in float64.

Failures (singular, not positive definite) raise `numpy.linalg.LinAlgError`.  The SVD/QR sign
conventions are those documented in `kernels/fallbacks.py`, re-derived here independently.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg

from .. import thunks as T
from . import reference, view
from .gemm import matrix, put


@reference(T.DenseSolveF32, T.DenseSolveF64, T.BatchedDenseSolveF32, T.BatchedDenseSolveF64)
def dense_solve(arena: np.ndarray, t) -> None:
    """`X_i = A_i⁻¹·B_i` per slice (`batch` 1 for the unbatched kinds)."""
    kind = type(t).__name__
    dt = np.float64 if kind.endswith("F64") else np.float32
    size, n, nrhs = np.dtype(dt).itemsize, t.n, t.nrhs
    batch = getattr(t, "batch", 1)
    xs = [np.linalg.solve(matrix(arena, t.a + i * n * n * size, n, n, dt),
                          matrix(arena, t.b + i * n * nrhs * size, n, nrhs, dt)) for i in range(batch)]
    for i, x in enumerate(xs):
        put(arena, t.x + i * n * nrhs * size, x, dt)


@reference(T.CholeskyF32)
def cholesky_f32(arena: np.ndarray, t) -> None:
    """Lower L of the symmetric matrix given by A's lower triangle; strict upper zero."""
    a = np.tril(matrix(arena, t.a, t.n, t.n))
    put(arena, t.l, np.linalg.cholesky(a + np.tril(a, -1).T))


@reference(T.TriangularSolveF32)
def triangular_solve_f32(arena: np.ndarray, t) -> None:
    """`op(A)·X = B` reading only A's `lower`/upper triangle."""
    a = matrix(arena, t.a, t.n, t.n)
    a = np.tril(a) if t.lower else np.triu(a)
    b = matrix(arena, t.b, t.n, t.nrhs)
    with np.errstate(all="ignore"):
        x = scipy.linalg.solve_triangular(a, b, lower=t.lower, trans="T" if t.transpose else "N",
                                          check_finite=False)
    put(arena, t.x, x)


@reference(T.DetF32)
def det_f32(arena: np.ndarray, t) -> None:
    """`det(A)` or `log|det(A)|` (0 / -inf when singular)."""
    a = matrix(arena, t.a, t.n, t.n)
    with np.errstate(divide="ignore"):
        value = np.linalg.slogdet(a)[1] if t.log_abs else np.linalg.det(a)
    put(arena, t.out, np.array([value]))


@reference(T.SvdF32)
def svd_f32(arena: np.ndarray, t) -> None:
    """Thin SVD factor `part` (U, S, Vt); U's largest-magnitude entry per column positive."""
    k = min(t.m, t.n)
    if k == 0:
        return
    u, s, vt = np.linalg.svd(matrix(arena, t.a, t.m, t.n), full_matrices=False)
    for i in range(k):
        if u[np.argmax(np.abs(u[:, i])), i] < 0:
            u[:, i], vt[i] = -u[:, i], -vt[i]
    put(arena, t.out, (u, s, vt)[t.part])


@reference(T.QrF32)
def qr_f32(arena: np.ndarray, t) -> None:
    """Thin QR factor `part` (Q, R) with a non-negative diagonal of R."""
    if min(t.m, t.n) == 0:
        return
    q, r = np.linalg.qr(matrix(arena, t.a, t.m, t.n), mode="reduced")
    for i in range(r.shape[0]):
        if r[i, i] < 0:
            q[:, i], r[i] = -q[:, i], -r[i]
    put(arena, t.out, (q, r)[t.part])


@reference(T.SortF32)
def sort_f32(arena: np.ndarray, t) -> None:
    """Stable sort / argsort of each fiber along the middle axis, NaNs last in both directions."""
    count = t.outer * t.axis_dim * t.inner
    x = view(arena, t.src, np.float32, count).reshape(t.outer, t.axis_dim, t.inner)
    out = np.empty_like(x)
    for o in range(t.outer):
        for i in range(t.inner):
            fiber = x[o, :, i]
            finite = [j for j in range(t.axis_dim) if not np.isnan(fiber[j])]
            nans = [j for j in range(t.axis_dim) if np.isnan(fiber[j])]
            order = sorted(finite, key=lambda j: -fiber[j] if t.descending else fiber[j]) + nans
            out[o, :, i] = np.array(order, dtype=np.float32) if t.arg else fiber[order]
    put(arena, t.dst, out)
