"""Peephole fusion of `Copy(src → dst)` + `Softmax(dst)` (rlx_llvm/ir_emit/peephole.py): parity with the
reference, the same bytes as the unfused pair, at 1 and 2 threads; pairs that must not fuse stay apart."""
from __future__ import annotations

import numpy as np
import pytest

from rlx_llvm import thunks as T
from rlx_llvm.ir_emit import peephole
from rlx_llvm.ops import Activation
from tests.harness import HUGE, W, Outcome, Suite, run_on_copy, suite_tests

SHAPES = ((3, 1, 1), (4, W - 1, 1), (2, W, 1), (3, W + 1, 1), (5, 4 * W + 3, 1), (1, HUGE, 1),   # rows (HUGE: no
          (2, 7, 3), (3, 40, W), (129, 1000, 1), (3, 300, 97), (2048, 1024, 1))                 # scratch row),
TOL = dict(rtol=1e-5, atol=1e-6)                                                                 # split, streamed


def softmax_input(s: Suite, outer: int, cols: int, inner: int) -> np.ndarray:
    """Normals with a −inf, a constant column and a NaN planted (as test_reductions does)."""
    x = s.normal(outer, cols, inner, scale=3.0)
    if cols >= 4:
        x[0, 1, 0] = -np.inf
        if outer > 1:
            x[1, :, 0] = x[1, 0, 0]
    if outer > 2 and cols >= 2:
        x[2, 0, 0] = np.nan
    return x.reshape(-1)


def add_pair(s: Suite, name: str, x: np.ndarray, rows: int, cols: int, inner: int, between=None) -> None:
    """`Copy(x → y)`, optionally `between(y)`, then `Softmax(y)`; y is checked after the last thunk."""
    src = s.put(x)
    dst, out = s.out(np.float32, x.size)
    s.add(f"{name}/copy", T.Copy(src=src, dst=dst, len=x.size), [out], **TOL)
    if between is not None:
        s.add(f"{name}/between", between(dst, x.size), [out], **TOL)
    s.add(f"{name}/softmax", T.Softmax(data=dst, rows=rows, cols=cols, inner=inner), [out], **TOL)


def build() -> Suite:
    s = Suite(11, **TOL)
    for outer, cols, inner in SHAPES:
        add_pair(s, f"{outer}x{cols}x{inner}", softmax_input(s, outer, cols, inner), outer * inner, cols, inner)
    rows = s.normal(4, 2 * W + 1, scale=5.0)
    rows[0, 3], rows[1, :], rows[2, :], rows[3, 5] = np.inf, -np.inf, 80.0, np.nan  # +inf / all −inf / NaN → NaN rows
    add_pair(s, "specials", rows.reshape(-1), 4, 2 * W + 1, 1)
    add_pair(s, "relu-between", s.normal(3 * 50), 3, 50, 1,
             between=lambda y, n: T.ActivationInPlace(data=y, len=n, act=Activation.Relu))
    return s


SUITE = build()
(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, _) = suite_tests(SUITE)


def test_report_shows_each_pair(outcome: Outcome) -> None:
    """Every adjacent Copy → Softmax runs fused (the Copy's function holds the kernel); the pair with
    an ActivationInPlace on y in between is not fused."""
    report = {r.index: r.path for r in outcome.program.report()}
    for i, case in enumerate(SUITE.cases):
        if case.name.endswith("/copy") and not case.name.startswith("relu"):
            assert (report[i], report[i + 1]) == (f"llvm (fused with t{i + 1})", f"llvm (fused into t{i})")
        elif case.name.startswith("relu"):
            assert report[i] == "llvm", (case.name, report[i])


def test_same_bytes_as_the_unfused_pair(outcome: Outcome, monkeypatch) -> None:
    """The fused kernel does the in-place Softmax's arithmetic on the copied values: the arena matches
    the unfused program's byte for byte, at 1 and 2 threads."""
    monkeypatch.setattr(peephole, "fusions", lambda thunks: {})
    unfused = SUITE.compile()
    assert all(r.path == "llvm" for r in unfused.report())
    for threads in (1, 2):
        assert np.array_equal(run_on_copy(unfused, outcome.before, threads),
                              run_on_copy(outcome.program, outcome.before, threads))


@pytest.mark.parametrize("copy,soft", [
    (T.Copy(src=0, dst=64, len=32), T.Softmax(data=64, rows=4, cols=8, inner=1)),      # src overlaps dst
    (T.Copy(src=0, dst=4096, len=33), T.Softmax(data=4096, rows=4, cols=8, inner=1)),  # copies one more
    (T.Copy(src=0, dst=4096, len=32), T.Softmax(data=4100, rows=4, cols=8, inner=1)),  # another start
    (T.Copy(src=0, dst=4096, len=32), T.Softmax(data=4096, rows=4, cols=8, inner=3)),  # invalid inner
])
def test_pairs_that_do_not_fuse(copy, soft) -> None:
    assert peephole.copy_then_softmax(copy, soft) is None
    assert peephole.fusions([copy, soft]) == {}


def test_a_pair_fuses_once() -> None:
    """Copy, Softmax, Softmax: the first two fuse, the second Softmax stays on its own."""
    c, s = T.Copy(src=0, dst=4096, len=32), T.Softmax(data=4096, rows=4, cols=8, inner=1)
    found = peephole.fusions([c, s, s])
    assert sorted(found) == [0, 1] and found[0].first == 0
