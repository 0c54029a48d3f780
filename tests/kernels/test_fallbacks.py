"""SvdF32, QrF32 and SortF32: SciPy/NumPy on arena views, interleaved with native segments."""
from __future__ import annotations

import numpy as np
import pytest

import rlx_llvm as rl
import rlx_llvm.ir_emit.gemm  # noqa: F401
import rlx_llvm.ir_emit.linalg  # noqa: F401  (registers the fallbacks too)
import rlx_llvm.reference.gemm  # noqa: F401
import rlx_llvm.reference.linalg  # noqa: F401
from rlx_llvm import thunks as T
from rlx_llvm.errors import ExecutionError, ValidationError
from tests.harness import NAN_FILL, Outcome, Suite, f32_at, suite_tests

SVD_SHAPES = [(1, 1), (5, 3), (3, 5), (8, 8), (17, 4)]


def fallback_cases(lay: Suite) -> list[tuple[str, object]]:
    cases = []
    for m, n in SVD_SHAPES:
        a = lay.put(lay.normal(m, n))
        k = min(m, n)
        for part, count in enumerate((m * k, k, k * n)):
            cases.append((f"svd {m}x{n} part={part}", T.SvdF32(a=a, out=lay.slot(count * 4), m=m, n=n, part=part)))
        for part, count in enumerate((m * k, k * n)):
            cases.append((f"qr {m}x{n} part={part}", T.QrF32(a=a, out=lay.slot(count * 4), m=m, n=n, part=part)))
    for outer, axis, inner in ((1, 1, 1), (2, 9, 3), (1, 40, 1), (3, 5, 7)):
        x = np.round(lay.normal(outer, axis, inner) * 2) / 2  # many ties
        x.reshape(-1)[::7] = np.nan
        x.reshape(-1)[3::11] = -0.0
        src = lay.put(x.astype(np.float32))
        for descending in (False, True):
            for arg in (False, True):
                cases.append((f"sort {outer}x{axis}x{inner} desc={descending} arg={arg}", T.SortF32(
                    src=src, dst=lay.slot(x.size * 4), outer=outer, axis_dim=axis, inner=inner,
                    descending=descending, arg=arg)))
    return cases


def fallback_suite() -> Suite:
    """Fallbacks between native GEMMs in one program: [gemm, fallbacks..., gemm]; sorts bit-exact (−0.0
    included), factors within f32 rounding."""
    s = Suite(21, fill=NAN_FILL)
    a, b = s.put(s.normal(4, 4)), s.put(s.normal(4, 4))
    cases = fallback_cases(s)
    first = T.Sgemm(a=a, b=b, c=s.slot(64), m=4, k=4, n=4)
    last = T.Sgemm(a=first.c, b=b, c=s.slot(64), m=4, k=4, n=4)
    s.add_each([("gemm before the fallbacks", first), *cases, ("gemm after the fallbacks", last)],
               lambda t: dict(dtype=np.uint32) if isinstance(t, T.SortF32) else
               dict(dtype=np.float32, rtol=1e-5, atol=1e-6))
    return s


SUITE = fallback_suite()

(outcome, test_fallbacks_match_the_numpy_references, test_fallbacks_touch_only_their_declared_outputs,
 test_thread_count_does_not_change_results, _) = suite_tests(SUITE)


def test_native_segments_around_fallbacks_still_run(outcome: Outcome) -> None:
    outcome.check("gemm after the fallbacks")


def test_report_shows_scipy_for_fallbacks_and_blas_for_gemms(outcome: Outcome) -> None:
    paths = {(row.kind, row.path) for row in outcome.program.report()}
    # a small Sgemm runs as IR tiles ("llvm"); with RLX_LLVM_GEMM=blas it would say "blas"
    assert paths <= {("Sgemm", "blas"), ("Sgemm", "llvm"), ("SvdF32", "scipy"), ("QrF32", "scipy"),
                     ("SortF32", "scipy")}
    assert {p for k, p in paths if k != "Sgemm"} == {"scipy"}


def test_svd_factors_reconstruct_and_follow_the_sign_convention(outcome: Outcome) -> None:
    for m, n in SVD_SHAPES:
        k = min(m, n)
        parts = {c.thunk.part: c.thunk for c in SUITE.cases if c.name.startswith(f"svd {m}x{n} ")}
        u = f32_at(outcome.got, parts[0].out, m, k).astype(np.float64)
        s = f32_at(outcome.got, parts[1].out, k).astype(np.float64)
        vt = f32_at(outcome.got, parts[2].out, k, n).astype(np.float64)
        a = f32_at(outcome.got, parts[0].a, m, n)
        assert np.allclose(u * s @ vt, a, atol=1e-5) and np.all(np.diff(s) <= 0) and np.all(s >= 0)
        pivots = np.argmax(np.abs(u), axis=0)
        assert np.all(u[pivots, np.arange(k)] > 0), "largest-magnitude entry of each U column is positive"


def test_qr_factors_reconstruct_with_a_non_negative_diagonal(outcome: Outcome) -> None:
    for m, n in SVD_SHAPES:
        k = min(m, n)
        parts = {c.thunk.part: c.thunk for c in SUITE.cases if c.name.startswith(f"qr {m}x{n} ")}
        q = f32_at(outcome.got, parts[0].out, m, k).astype(np.float64)
        r = f32_at(outcome.got, parts[1].out, k, n).astype(np.float64)
        a = f32_at(outcome.got, parts[0].a, m, n)
        assert np.allclose(q @ r, a, atol=1e-5) and np.allclose(q.T @ q, np.eye(k), atol=1e-6)
        assert np.all(np.diagonal(r) >= 0) and not np.tril(r, -1).any()


def test_sort_is_stable_with_nans_last_in_both_directions() -> None:
    x = np.float32([2.0, np.nan, 1.0, 2.0, -0.0, 0.0, np.nan, 1.0])
    lay = Suite()
    src = lay.put(x)
    ts = [T.SortF32(src=src, dst=lay.slot(32), outer=1, axis_dim=8, inner=1, descending=d, arg=True)
          for d in (False, True)]
    arena = lay.arena()
    rl.compile(rl.ThunkSchedule(ts, arena_bytes=lay.nbytes), cache=False).run(arena)
    assert arena.view(ts[0].dst, "f32", 8).tolist() == [4, 5, 2, 7, 0, 3, 1, 6]
    assert arena.view(ts[1].dst, "f32", 8).tolist() == [0, 3, 2, 7, 4, 5, 1, 6]


def test_non_finite_svd_input_is_an_execution_error() -> None:
    lay = Suite()
    t = T.SvdF32(a=lay.put(np.float32([[1, np.nan], [0, 1]])), out=lay.slot(8), m=2, n=2, part=1)
    with pytest.raises(ExecutionError) as info:
        rl.compile(rl.ThunkSchedule([t], arena_bytes=lay.nbytes), cache=False).run(lay.arena())
    assert (info.value.index, info.value.kind) == (0, "SvdF32")


@pytest.mark.parametrize("thunk", [T.SvdF32(a=0, out=64, m=2, n=2, part=3), T.QrF32(a=0, out=64, m=2, n=2, part=2)])
def test_a_part_that_names_no_factor_is_a_validation_error(thunk) -> None:
    with pytest.raises(ValidationError) as info:
        rl.compile(rl.ThunkSchedule([thunk], arena_bytes=4096), cache=False)
    assert info.value.field == "part"


def test_coverage_lists_every_thunk_of_this_issue_as_blas_or_scipy() -> None:
    by_size = {"Sgemm", "SgemmT", "Dgemm", "BatchedSgemm", "BatchedDgemmF64", "SgemmBf16", "SgemmF16", "SgemmHalf",
               "FusedMmBiasAct", "LoraMatMul", "Conv2D1x1", "SynthMatMul"}   # IR tiles or BLAS, by size
    always = {"CgemmC64", "GroupedMatMul", "DenseSolveF32", "DenseSolveF64", "BatchedDenseSolveF32",
              "BatchedDenseSolveF64", "CholeskyF32", "TriangularSolveF32", "DetF32"}
    cov = rl.coverage()
    assert {k: cov[k] for k in by_size} == dict.fromkeys(by_size, "llvm|blas")
    assert {k: cov[k] for k in always} == dict.fromkeys(always, "blas")
    assert {k: cov[k] for k in ("SvdF32", "QrF32", "SortF32")} == {k: "scipy" for k in ("SvdF32", "QrF32", "SortF32")}
