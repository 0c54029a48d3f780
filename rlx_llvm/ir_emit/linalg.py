"""Solves and factorizations, lowered to JIT code that calls SciPy's LAPACK (semantics.md §3.2).

Every routine works on scratch copies (LAPACK overwrites its operands), so inputs are never
touched; an output is written only after LAPACK succeeded.  LAPACK is column-major: a row-major
matrix read as column-major is its transpose, which each lowering turns to its advantage:

* `?gesv` needs the matrix itself, so A and B are transposed while being copied to scratch and
  X is transposed back (`n²` + `2·n·nrhs` moves next to an `n³` factorization).
* `dpotrf` on the row-major buffer with `uplo='U'` factors the row-major *lower* triangle, and the
  column-major upper factor read row-major is L.
* `dtrsm`: row-major `op(A)·X = B` is column-major `Xᵀ·op(A)ᵀ = Bᵀ`, i.e. `side='R'`, with
  `uplo` swapped and `transa = 'T'` exactly when `transpose` is set.
* `dgetrf` for DetF32 needs no transpose: `det(Aᵀ) = det(A)`.

Failures return a status (`kernels.blas.Status`, low byte; a batched solve puts the failing slice
in the bits above): a singular `?gesv` → SINGULAR, a non-positive-definite `dpotrf` →
NOT_POSITIVE_DEFINITE.  Program.run raises ExecutionError naming the thunk; the failing thunk
writes nothing, and every output computed before it stays as it was.  DetF32 of a singular matrix
is not a failure: it is `0` (`log|det| = -inf`).  TriangularSolveF32 does not test the diagonal
(as BLAS `trsm`): a zero on it gives IEEE inf/NaN.

Importing this module also registers the SciPy/NumPy fallbacks (`kernels.fallbacks`).
"""
from __future__ import annotations

from llvmlite import ir

from .. import thunks as T
from ..kernels.blas import Status
from .context import EmitContext
from .toolkit import F32, F64, I32, I64, const, entry_alloca, fail_unless, lane_index, scratch_ptr, splat, vec
from .gemm import check_blas_ints, copy_matrix
from ..registry import lowering
from .blas_calls import FortranArgs

FLOAT = {"s": (F32, 4), "d": (F64, 8)}


def lapack_status(ctx: EmitContext, info: ir.Value, positive: Status, slice_index: "ir.Value | None" = None
                  ) -> ir.Value:
    """i32 status for a non-zero `info`: `positive` when info > 0, LAPACK_ARGUMENT when < 0, plus the slice."""
    b = ctx.b
    reason = b.select(b.icmp_signed(">", info, I32(0)), I32(int(positive)), I32(int(Status.LAPACK_ARGUMENT)))
    if slice_index is None:
        return reason
    return b.or_(reason, b.shl(b.trunc(slice_index, I32), I32(8)))


def check_info(ctx: EmitContext, info_slot: ir.Value, positive: Status, slice_index: "ir.Value | None" = None
               ) -> None:
    """Return the LAPACK failure as the thunk's status unless `info == 0`."""
    info = ctx.b.load(info_slot)
    fail_unless(ctx, ctx.b.icmp_signed("==", info, I32(0)), lapack_status(ctx, info, positive, slice_index))


# ── dense solves ─────────────────────────────────────────────────────────────

def _solve(ctx: EmitContext, t, prec: str, batch: int) -> None:
    """`X_i = A_i⁻¹·B_i` by `?gesv` per slice; X is written only once every slice succeeded."""
    n, nrhs = t.n, t.nrhs
    if batch == 0 or n == 0 or nrhs == 0:
        return
    fa = FortranArgs(ctx)
    ty, size = FLOAT[prec]
    a_s = ctx.scratch_alloc(n * n * size)
    x_s = ctx.scratch_alloc(batch * n * nrhs * size)
    ipiv = ctx.scratch_alloc(n * 4)
    info = fa.mutable_int()

    def solve_slice(i: "ir.Value | int") -> None:
        x_i = scratch_ptr(ctx, x_s, i, n * nrhs * size)
        copy_matrix(ctx, ctx.addr(t.a, i, n * n * size), scratch_ptr(ctx, a_s), n, n, ty, ty, transpose=True)
        copy_matrix(ctx, ctx.addr(t.b, i, n * nrhs * size), x_i, n, nrhs, ty, ty, transpose=True)
        fa.call(f"{prec}gesv", fa.int(n), fa.int(nrhs), scratch_ptr(ctx, a_s), fa.int(n),
                scratch_ptr(ctx, ipiv), x_i, fa.int(n), info)
        check_info(ctx, info, Status.SINGULAR, None if isinstance(i, int) else i)

    def write_slice(i: "ir.Value | int") -> None:
        copy_matrix(ctx, scratch_ptr(ctx, x_s, i, n * nrhs * size), ctx.addr(t.x, i, n * nrhs * size),
                    nrhs, n, ty, ty, transpose=True)

    if batch == 1:
        solve_slice(0)
        write_slice(0)
        return
    with ctx.for_range(0, batch, name="solve") as i:
        solve_slice(i)
    with ctx.for_range(0, batch, name="write") as i:
        write_slice(i)


_SOLVE_CHECK = check_blas_ints("n", "nrhs")


@lowering(T.DenseSolveF32, path="blas", check=_SOLVE_CHECK)
def dense_solve_f32(ctx: EmitContext, t) -> None:
    """`X = A⁻¹·B` by LAPACK sgesv."""
    _solve(ctx, t, "s", 1)


@lowering(T.DenseSolveF64, path="blas", check=_SOLVE_CHECK)
def dense_solve_f64(ctx: EmitContext, t) -> None:
    """`X = A⁻¹·B` by LAPACK dgesv."""
    _solve(ctx, t, "d", 1)


@lowering(T.BatchedDenseSolveF32, path="blas", check=_SOLVE_CHECK)
def batched_dense_solve_f32(ctx: EmitContext, t) -> None:
    """Per slice `X_i = A_i⁻¹·B_i` by sgesv."""
    _solve(ctx, t, "s", t.batch)


@lowering(T.BatchedDenseSolveF64, path="blas", check=_SOLVE_CHECK)
def batched_dense_solve_f64(ctx: EmitContext, t) -> None:
    """Per slice `X_i = A_i⁻¹·B_i` by dgesv."""
    _solve(ctx, t, "d", t.batch)


# ── factorizations ───────────────────────────────────────────────────────────

@lowering(T.CholeskyF32, path="blas", check=check_blas_ints("n"))
def cholesky_f32(ctx: EmitContext, t) -> None:
    """Lower `L` with `A = L·Lᵀ` by dpotrf in f64 (reads A's lower triangle); strict upper zeroed."""
    n = t.n
    if n == 0:
        return
    fa, b = FortranArgs(ctx), ctx.b
    a_s = ctx.scratch_alloc(n * n * 8)
    copy_matrix(ctx, ctx.addr(t.a), scratch_ptr(ctx, a_s), n, n, F32, F64, transpose=False)
    info = fa.mutable_int()
    fa.call("dpotrf", fa.char("U"), fa.int(n), scratch_ptr(ctx, a_s), fa.int(n), info)
    check_info(ctx, info, Status.NOT_POSITIVE_DEFINITE)
    with ctx.for_range(0, n, name="row") as i:
        row = b.mul(i, I64(n))

        def body(j: ir.Value, w: int) -> None:
            x = b.fptrunc(ctx.load(a_s, F64, b.add(row, j), w, base=ctx.scratch), vec(F32, w))
            upper = b.icmp_unsigned(">", lane_index(b, j, w), splat(b, i, w))
            ctx.store(t.l, b.select(upper, const(F32, 0.0, w), x), b.add(row, j))

        ctx.vector_loop(n, body, name="col")


@lowering(T.TriangularSolveF32, path="blas", check=check_blas_ints("n", "nrhs"))
def triangular_solve_f32(ctx: EmitContext, t) -> None:
    """`op(A)·X = B` by dtrsm in f64 (only the `lower`/upper triangle of A is read, non-unit diagonal)."""
    n, nrhs = t.n, t.nrhs
    if n == 0 or nrhs == 0:
        return
    fa = FortranArgs(ctx)
    a_s, x_s = ctx.scratch_alloc(n * n * 8), ctx.scratch_alloc(n * nrhs * 8)
    copy_matrix(ctx, ctx.addr(t.a), scratch_ptr(ctx, a_s), n, n, F32, F64, transpose=False)
    copy_matrix(ctx, ctx.addr(t.b), scratch_ptr(ctx, x_s), n, nrhs, F32, F64, transpose=False)
    fa.call("dtrsm", fa.char("R"), fa.char("U" if t.lower else "L"), fa.char("T" if t.transpose else "N"),
            fa.char("N"), fa.int(nrhs), fa.int(n), fa.f64(1.0), scratch_ptr(ctx, a_s), fa.int(n),
            scratch_ptr(ctx, x_s), fa.int(nrhs))
    copy_matrix(ctx, scratch_ptr(ctx, x_s), ctx.addr(t.x), n, nrhs, F64, F32, transpose=False)


@lowering(T.DetF32, path="blas", check=check_blas_ints("n"))
def det_f32(ctx: EmitContext, t) -> None:
    """`det(A)` or `log|det(A)|` from dgetrf's U in f64; singular → 0 / -inf."""
    n, b = t.n, ctx.b
    if n == 0:
        ctx.store(t.out, F32(0.0 if t.log_abs else 1.0), 0)
        return
    fa = FortranArgs(ctx)
    a_s, ipiv = ctx.scratch_alloc(n * n * 8), ctx.scratch_alloc(n * 4)
    copy_matrix(ctx, ctx.addr(t.a), scratch_ptr(ctx, a_s), n, n, F32, F64, transpose=False)
    info = fa.mutable_int()
    fa.call("dgetrf", fa.int(n), fa.int(n), scratch_ptr(ctx, a_s), fa.int(n), scratch_ptr(ctx, ipiv), info)
    code = b.load(info)
    fail_unless(ctx, b.icmp_signed(">=", code, I32(0)), I32(int(Status.LAPACK_ARGUMENT)))
    acc = entry_alloca(ctx, F64)
    b.store(F64(0.0 if t.log_abs else 1.0), acc)
    fabs = ctx.intrinsic("llvm.fabs.f64", F64, [F64])
    log = ctx.intrinsic("llvm.log.f64", F64, [F64])
    with ctx.for_range(0, n, name="diag") as i:
        u = ctx.load(a_s, F64, b.mul(i, I64(n + 1)), base=ctx.scratch)
        if t.log_abs:
            b.store(b.fadd(b.load(acc), b.call(log, [b.call(fabs, [u])])), acc)
        else:
            swapped = b.icmp_signed("!=", ctx.load(ipiv, I32, i, base=ctx.scratch), b.trunc(b.add(i, I64(1)), I32))
            b.store(b.fmul(b.load(acc), b.select(swapped, b.fneg(u), u)), acc)
    singular = b.icmp_signed(">", code, I32(0))
    result = b.select(singular, F64(float("-inf") if t.log_abs else 0.0), b.load(acc))
    ctx.store(t.out, b.fptrunc(result, F32), 0)
