"""Solves and factorizations through LAPACK from JIT code, against float64 NumPy/SciPy references.

One schedule holds every parity case (compiled once); the failure tests check that LAPACK's `info`
becomes an ExecutionError naming the thunk while every output computed before it stays intact.
"""
from __future__ import annotations

import numpy as np
import pytest

import rlx_llvm as rl
import rlx_llvm.ir_emit.linalg  # noqa: F401  (registers the lowerings and fallbacks)
import rlx_llvm.reference.linalg  # noqa: F401
from rlx_llvm import reference as ref
from rlx_llvm import thunks as T
from rlx_llvm.errors import ExecutionError, ValidationError
from rlx_llvm.kernels.blas import Status, describe_status
from tests.harness import NAN_FILL as SENTINEL
from tests.harness import Outcome, Suite, assert_close, suite_tests

F64_KINDS = {"DenseSolveF64", "BatchedDenseSolveF64"}


def well_conditioned(lay: Suite, n: int, dtype=np.float32) -> np.ndarray:
    return (lay.normal(n, n) + n * np.eye(n)).astype(dtype)


def spd(lay: Suite, n: int) -> np.ndarray:
    a = lay.normal(n, n).astype(np.float64)
    return (a @ a.T + n * np.eye(n)).astype(np.float32)


def with_garbage_above(a: np.ndarray, lay: Suite, lower: bool = True) -> np.ndarray:
    """`a` with the triangle that must not be read replaced by noise."""
    noise = lay.normal(*a.shape) * 100
    keep = np.tril(np.ones(a.shape, bool)) if lower else np.triu(np.ones(a.shape, bool))
    return np.where(keep, a, noise).astype(a.dtype)


def linalg_cases(lay: Suite) -> list[tuple[str, object]]:
    cases = []
    for n in (1, 2, 7, 33):
        for nrhs in (1, 3):
            for kind, dt, size in (("DenseSolveF32", np.float32, 4), ("DenseSolveF64", np.float64, 8)):
                cases.append((f"{kind} n={n} nrhs={nrhs}", getattr(T, kind)(
                    a=lay.put(well_conditioned(lay, n, dt)), b=lay.put(lay.normal(n, nrhs, dtype=dt)),
                    x=lay.slot(n * nrhs * size), n=n, nrhs=nrhs)))
    for batch, n, nrhs in ((1, 3, 2), (4, 5, 1), (3, 9, 4)):
        for kind, dt, size in (("BatchedDenseSolveF32", np.float32, 4), ("BatchedDenseSolveF64", np.float64, 8)):
            a = np.stack([well_conditioned(lay, n, dt) for _ in range(batch)])
            cases.append((f"{kind} batch={batch} n={n} nrhs={nrhs}", getattr(T, kind)(
                a=lay.put(a), b=lay.put(lay.normal(batch, n, nrhs, dtype=dt)), x=lay.slot(batch * n * nrhs * size),
                batch=batch, n=n, nrhs=nrhs)))
    for n in (1, 2, 6, 31):
        cases.append((f"cholesky n={n}", T.CholeskyF32(a=lay.put(with_garbage_above(spd(lay, n), lay)),
                                                      l=lay.slot(n * n * 4), n=n)))
    for n, nrhs in ((1, 1), (5, 3), (24, 7)):
        for lower in (False, True):
            for transpose in (False, True):
                tri = lay.normal(n, n) + np.float32(2 * n) * np.eye(n, dtype=np.float32)
                cases.append((f"trsm n={n} nrhs={nrhs} lower={lower} transpose={transpose}", T.TriangularSolveF32(
                    a=lay.put(with_garbage_above(tri, lay, lower)), b=lay.put(lay.normal(n, nrhs)),
                    x=lay.slot(n * nrhs * 4), n=n, nrhs=nrhs, lower=lower, transpose=transpose)))
    singular = np.float32([[1, 2, 3], [2, 4, 6], [1, 0, 1]])
    for n, a in ((1, None), (2, None), (5, None), (16, None), (3, singular)):
        data = lay.normal(n, n) if a is None else a
        for log_abs in (False, True):
            cases.append((f"det n={n} log_abs={log_abs}{' singular' if a is not None else ''}", T.DetF32(
                a=lay.put(data), out=lay.slot(4), n=n, log_abs=log_abs)))
    return cases


def how_to_compare(t) -> dict:
    """f64 solves near f64 precision; sgesv works in f32; the rest compute in f64 inside."""
    if type(t).__name__ in F64_KINDS:
        return dict(dtype=np.float64, rtol=1e-11, atol=1e-12)
    if type(t).__name__ in ("DenseSolveF32", "BatchedDenseSolveF32"):
        return dict(dtype=np.float32, rtol=2e-5, atol=2e-6)
    return dict(dtype=np.float32, rtol=1e-6, atol=1e-7)


def linalg_suite() -> Suite:
    """Every linalg case in one arena whose outputs start as the NaN sentinel."""
    s = Suite(11, fill=SENTINEL)
    s.add_each(linalg_cases(s), how_to_compare)
    return s


SUITE = linalg_suite()

(outcome, test_every_case_matches_the_float64_reference, test_inputs_are_never_overwritten,
 test_thread_count_does_not_change_results, test_every_solve_reports_blas) = suite_tests(SUITE, paths={"blas"})


def test_cholesky_zeroes_the_strict_upper_triangle(outcome: Outcome) -> None:
    for c in SUITE.cases:
        if isinstance(t := c.thunk, T.CholeskyF32):
            lower = outcome.output(c.name).reshape(t.n, t.n)
            assert not np.triu(lower, 1).any(), c.name
            a = outcome.got[t.a:t.a + 4 * t.n * t.n].view(np.float32).reshape(t.n, t.n).astype(np.float64)
            a = np.tril(a) + np.tril(a, -1).T
            assert np.allclose(lower.astype(np.float64) @ lower.T, a, rtol=1e-5, atol=1e-4), c.name


def test_det_of_a_singular_matrix_is_zero_not_an_error(outcome: Outcome) -> None:
    dets = {name: outcome.output(name)[0] for name in SUITE.names if "singular" in name}
    assert dets == {"det n=3 log_abs=False singular": 0.0, "det n=3 log_abs=True singular": -np.inf}


# ── failures ─────────────────────────────────────────────────────────────────

def _failing_run(make_bad) -> tuple[ExecutionError, rl.Arena, rl.Arena, object, object, object]:
    """[good Sgemm, bad thunk, good Sgemm] on a sentinel arena; returns the error and the pieces."""
    lay = Suite(2, fill=SENTINEL)
    a, b = lay.put(lay.normal(3, 3)), lay.put(lay.normal(3, 3))
    before = T.Sgemm(a=a, b=b, c=lay.slot(36), m=3, k=3, n=3)
    bad = make_bad(lay)
    after = T.Sgemm(a=a, b=b, c=lay.slot(36), m=3, k=3, n=3)
    arena, expected = lay.arena(), lay.arena()
    ref.run_thunk(expected.bytes, before)
    prog = rl.compile(rl.ThunkSchedule([before, bad, after], arena_bytes=lay.nbytes), cache=False)
    with pytest.raises(ExecutionError) as info:
        prog.run(arena)
    return info.value, arena, expected, before, bad, after


def _assert_failure_kept_the_rest(err: ExecutionError, arena, expected, before, bad, after, kind: str) -> None:
    assert (err.index, err.kind) == (1, kind) and f"thunk 1 {kind}" in str(err)
    assert_close(arena.view(before.c, "f32", 9), expected.view(before.c, "f32", 9), 1e-5, 1e-6,
                 "the output computed before the failure")
    for t in (bad, after):
        for ext in t.writes():
            assert (arena.bytes[ext.offset:ext.offset + ext.nbytes] == SENTINEL).all(), \
                f"{type(t).__name__} wrote {ext.field} although the run stopped"


@pytest.mark.parametrize("kind", ["DenseSolveF32", "DenseSolveF64"])
def test_singular_solve_is_an_execution_error(kind: str) -> None:
    dt = np.float64 if kind.endswith("F64") else np.float32
    size = np.dtype(dt).itemsize

    def bad(lay: Suite):
        a = np.array([[1, 2], [2, 4]], dt)
        return getattr(T, kind)(a=lay.put(a), b=lay.put(np.ones((2, 1), dt)), x=lay.slot(2 * size), n=2, nrhs=1)

    err, *rest = _failing_run(bad)
    assert err.status == Status.SINGULAR and describe_status(err.status) == "singular"
    _assert_failure_kept_the_rest(err, *rest, kind)


@pytest.mark.parametrize("kind", ["BatchedDenseSolveF32", "BatchedDenseSolveF64"])
def test_singular_slice_of_a_batched_solve_names_the_slice(kind: str) -> None:
    dt = np.float64 if kind.endswith("F64") else np.float32
    size = np.dtype(dt).itemsize

    def bad(lay: Suite):
        a = np.stack([np.eye(2, dtype=dt), 2 * np.eye(2, dtype=dt), np.zeros((2, 2), dt), np.eye(2, dtype=dt)])
        return getattr(T, kind)(a=lay.put(a), b=lay.put(np.ones((4, 2, 1), dt)), x=lay.slot(8 * size),
                                batch=4, n=2, nrhs=1)

    err, *rest = _failing_run(bad)
    assert err.status == Status.SINGULAR | 2 << 8
    assert describe_status(err.status) == "singular (batch slice 2)"
    _assert_failure_kept_the_rest(err, *rest, kind)


def test_non_positive_definite_cholesky_is_an_execution_error() -> None:
    def bad(lay: Suite):
        return T.CholeskyF32(a=lay.put(np.float32([[1, 2], [2, 1]])), l=lay.slot(16), n=2)

    err, *rest = _failing_run(bad)
    assert err.status == Status.NOT_POSITIVE_DEFINITE
    _assert_failure_kept_the_rest(err, *rest, "CholeskyF32")


def test_validation_bounds_name_their_field() -> None:
    with pytest.raises(ValidationError) as info:
        rl.compile(rl.ThunkSchedule([T.DenseSolveF32(a=0, b=2**40, x=2**42, n=1, nrhs=2**31)], arena_bytes=2**46),
                   cache=False)
    assert info.value.field == "nrhs" and "2147483647" in str(info.value)
    with pytest.raises(ValidationError) as info:
        rl.compile(rl.ThunkSchedule([T.CholeskyF32(a=0, l=256, n=9)], arena_bytes=512), cache=False)
    assert info.value.field in ("a", "l") and "512" in str(info.value)
