"""The FFT family: Fft1d in one compiled program.

* Every n in 1…64 and 100, 127, 256, 1000, 1024, 4096 (radix-2, the naive DFT and Bluestein), each in
  both directions — an f32-real row type one way, an f64 one the other — the norms and row layouts
  rotating; every (row type, direction, norm) at n = 12, 64 and 100.  Against `numpy.fft` with the
  norm mapped from §2.16 written out here (not the reference's), f32 rows within 1e-5·log2(n)·max|X|,
  f64 rows within 1e-12·max|X|; and against the reference like every family.
* Hand examples of the sign convention (an impulse at 1) and of the norms (ifft(fft(x)) = N·x for Backward).
* Rows split across threads (1 and 2 threads give the same bytes).
* Bad input: n = 0, an unknown norm tag, an integer row type, each buffer one byte past the arena.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from rlx_llvm import thunks as T
from rlx_llvm.dtypes import DType
from rlx_llvm.reference.fft import REAL
from tests.harness import Suite, expect_invalid, suite_tests

NS = [*range(1, 65), 100, 127, 256, 1000, 1024, 4096]
F32_ROWS, F64_ROWS = (DType.F32, DType.C64), (DType.F64, DType.C128)
COMBOS = list(itertools.product((*F32_ROWS, *F64_ROWS), (False, True), (0, 1, 2)))

NUMPY_NORM = {   # (norm_tag, inverse) → NumPy's function and norm giving §2.16's scale
    (0, False): (np.fft.fft, "backward"), (0, True): (np.fft.ifft, "forward"),      # no scaling either way
    (1, False): (np.fft.fft, "backward"), (1, True): (np.fft.ifft, "backward"),     # the inverse by 1/N
    (2, False): (np.fft.fft, "ortho"), (2, True): (np.fft.ifft, "ortho"),           # both by 1/√N
}


def as_complex(rows: np.ndarray, dtype: DType, n: int) -> np.ndarray:
    """`[outer, n]` complex128 of rows in real-block (F32/F64) or interleaved (C64/C128) layout."""
    x = rows.astype(np.float64).reshape(-1, 2 * n)
    return x[:, 0::2] + 1j * x[:, 1::2] if dtype.is_complex else x[:, :n] + 1j * x[:, n:]


def tolerance(dtype: DType, n: int) -> float:
    """The allowed error relative to max|X|."""
    return 1e-5 * max(1.0, math.log2(n)) if dtype in F32_ROWS else 1e-12


def spectrum_close(t: T.Fft1d):
    """Compare within `tolerance · max|want|` (the harness's `compare` hook)."""
    def compare(got: np.ndarray, want: np.ndarray) -> None:
        scale = float(np.max(np.abs(want.astype(np.float64)), initial=0.0))
        err = np.abs(got.astype(np.float64) - want)
        assert np.all(err <= tolerance(t.dtype, t.n_complex) * scale), (
            f"{t!r}: error {err.max() / max(scale, 1e-300):.3g} of max|X|")
    return compare


INPUTS: dict[str, np.ndarray] = {}


def add_fft(s: Suite, n: int, dtype: DType, inverse: bool, norm: int, outer: int = 2, name: str = "") -> str:
    real = REAL[dtype]
    x = s.normal(2 * outer * n, dtype=real)
    dst, o = s.out(real, 2 * outer * n)
    t = T.Fft1d(src=s.put(x), dst=dst, outer=outer, n_complex=n, inverse=inverse, norm_tag=norm, dtype=dtype)
    name = name or f"n{n}-{dtype.value}-{'inv' if inverse else 'fwd'}-norm{norm}-x{outer}"
    s.add(name, t, [o], compare=spectrum_close(t))
    INPUTS[name] = x
    return name


def build() -> Suite:
    s = Suite(13)
    for i, n in enumerate(NS):
        inverse = bool(i % 2)
        add_fft(s, n, F32_ROWS[i % 2], inverse, i % 3)
        add_fft(s, n, F64_ROWS[(i // 2) % 2], not inverse, (i + 1) % 3)
    for n in (12, 64, 100):
        for dtype, inverse, norm in COMBOS:
            add_fft(s, n, dtype, inverse, norm, outer=1, name=f"grid-n{n}-{dtype.value}-{inverse}-{norm}")
    add_fft(s, 256, DType.C64, False, 0, outer=67, name="threads-radix2")
    add_fft(s, 100, DType.F32, True, 2, outer=41, name="threads-bluestein")
    add_fft(s, 12, DType.F64, False, 1, outer=700, name="threads-naive")
    impulse = np.zeros(8, np.float32)
    impulse[1] = 1.0                                          # x = δ_1 of n = 4, real block
    dst, o = s.out(np.float32, 8)
    s.add("hand-impulse", T.Fft1d(src=s.put(impulse), dst=dst, outer=1, n_complex=4, inverse=False, norm_tag=0,
                                  dtype=DType.F32), [o], exact=True, zero_sign=False,
          expect=(dst, np.array([1, 0, -1, 0, 0, -1, 0, 1], np.float32)))   # X_k = e^{−2πik/4} = 1, −i, −1, i
    return s


SUITE = build()
(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_matches_numpy_fft(outcome, name: str) -> None:
    """The output equals `numpy.fft` of the input with §2.16's normalization, within the tolerance."""
    t = outcome.case(name).thunk
    fn, norm = NUMPY_NORM[(t.norm_tag, t.inverse)]
    want = fn(as_complex(INPUTS[name], t.dtype, t.n_complex), axis=1, norm=norm)
    got = as_complex(outcome.output(name), t.dtype, t.n_complex)
    err = np.abs(got - want).max()
    assert err <= tolerance(t.dtype, t.n_complex) * np.abs(want).max(), f"{name}: error {err:.3g}"


def test_every_length_runs_both_directions_in_both_precisions() -> None:
    """The coverage the module docstring promises (a check of the suite's layout)."""
    for n in NS:
        runs = {(c.thunk.inverse, c.thunk.dtype in F32_ROWS) for c in SUITE.cases if c.thunk.n_complex == n}
        assert {inv for inv, _ in runs} == {False, True} and {f32 for _, f32 in runs} == {False, True}, n


def test_impulse_hand_example(outcome) -> None:
    outcome.check_spec("hand-impulse")


def test_backward_norm_round_trip(outcome) -> None:
    """With Backward on both sides, ifft(fft(x)) = N·x: the inverse of the forward grid case."""
    fwd = outcome.output("grid-n100-c128-False-0")
    inv = np.fft.ifft(as_complex(fwd, DType.C128, 100), norm="forward")
    x = as_complex(INPUTS["grid-n100-c128-False-0"], DType.C128, 100)
    np.testing.assert_allclose(inv, 100 * x, rtol=0, atol=1e-11 * np.abs(100 * x).max())


# ── bad input ────────────────────────────────────────────────────────────────

def fft_thunk(**changes) -> T.Fft1d:
    """Two rows of 10 f32 points (160 bytes each way): src at 0, dst at 256."""
    return T.Fft1d(**(dict(src=0, dst=256, outer=2, n_complex=10, inverse=False, norm_tag=0, dtype=DType.F32)
                      | changes))


def test_zero_length_is_refused() -> None:
    expect_invalid(fft_thunk(n_complex=0), 512, "n_complex", "at least 1")


def test_unknown_norm_tag_is_refused() -> None:
    expect_invalid(fft_thunk(norm_tag=3), 512, "norm_tag", "unknown")


def test_integer_rows_are_refused() -> None:
    expect_invalid(fft_thunk(dtype=DType.I32), 512, "dtype", "i32")


@pytest.mark.parametrize("field", ["src", "dst"])
def test_buffer_longer_than_the_arena_is_refused(field: str) -> None:
    """A row buffer that does not fit: the buffer placed at 1024, the arena one byte short of its 160 bytes."""
    expect_invalid(fft_thunk(**{field: 1024}), 1024 + 160 - 1, field)
