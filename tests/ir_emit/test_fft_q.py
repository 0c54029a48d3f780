"""Fft1dQ, the fixed-point FFT (docs/semantics-choices.md "fft"): i32 real-block rows, Q30 twiddles, radix-2.

* Bit-exact against the NumPy model (`reference.fft.fft1d_q_rows`, int64 arithmetic) for n = 1 … 1024, both
  directions, every norm, both scale policies, and sums that saturate.
* Against `numpy.fft` within the fixed-point error: one rounding per butterfly stage.
* Bad input: a length that is not a power of two, an unknown norm or scale tag.
"""
from __future__ import annotations

import numpy as np
import pytest

from rlx_llvm import thunks as T
from rlx_llvm.reference.fft import norm_scale
from tests.harness import Suite, expect_invalid, suite_tests

LENGTHS = (1, 2, 4, 8, 16, 64, 256, 1024)


def add(s: Suite, n: int, inverse: bool, norm: int, scale: int, magnitude: int = 1 << 20, outer: int = 2) -> None:
    x = s.rng.integers(-magnitude, magnitude, (outer, 2, n)).astype(np.int32)
    t = T.Fft1dQ(src=s.put(x), dst=s.slot(x.nbytes), outer=outer, n_complex=n, inverse=inverse, norm_tag=norm,
                 scale_tag=scale)
    s.add(f"n{n}_{'inv' if inverse else 'fwd'}_norm{norm}_scale{scale}" + ("_saturating" if magnitude > 1 << 28 else ""),
          t, dtype=np.int32)


def build() -> Suite:
    s = Suite(seed=21)
    for i, n in enumerate(LENGTHS):
        for inverse in (False, True):
            for scale in (0, 1):
                add(s, n, inverse, (i + scale) % 3, scale)
    add(s, 64, False, 0, 0, magnitude=1 << 31)   # the first stages already saturate
    add(s, 64, True, 2, 1, magnitude=1 << 31)
    return s


SUITE = build()
(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


@pytest.mark.parametrize("name", [c for c in SUITE.names if not c.endswith("saturating")])
def test_close_to_numpy_fft(outcome, name: str) -> None:
    """Within one rounding per stage (plus the norm's) of the exact DFT, scaled by 1/n under PerStage."""
    t = outcome.case(name).thunk
    n = t.n_complex
    x = outcome.before[t.src:t.src + 8 * t.outer * n].view(np.int32).reshape(t.outer, 2, n).astype(np.float64)
    z = x[:, 0] + 1j * x[:, 1]
    exact = (np.fft.ifft(z) * n if t.inverse else np.fft.fft(z)) * norm_scale(t.norm_tag, t.inverse, n)
    if t.scale_tag == 1:
        exact /= n
    y = outcome.output(name).reshape(t.outer, 2, n).astype(np.float64)
    err = np.abs(y[:, 0] + 1j * y[:, 1] - exact)
    stages = n.bit_length() - 1
    bound = 2.0 * (stages + 1) * (1 if t.scale_tag else max(1.0, np.sqrt(n))) + 1e-9 * np.abs(exact).max()
    assert err.max() <= bound, (err.max(), bound)


def test_saturation_is_reached(outcome) -> None:
    """The saturating case does hit the i32 bounds (so the clamp is exercised, not just present)."""
    got = outcome.output("n64_fwd_norm0_scale0_saturating")
    assert np.isin(got, [np.iinfo(np.int32).min, np.iinfo(np.int32).max]).any()


def base(**changes) -> T.Fft1dQ:
    fields = dict(src=0, dst=1024, outer=1, n_complex=16, inverse=False, norm_tag=0, scale_tag=0)
    return T.Fft1dQ(**{**fields, **changes})


@pytest.mark.parametrize("change, field, match", [
    (dict(n_complex=12), "n_complex", "power of two, got 12"),
    (dict(n_complex=0), "n_complex", "power of two, got 0"),
    (dict(norm_tag=3), "norm_tag", "unknown norm_tag 3"),
    (dict(scale_tag=2), "scale_tag", "unknown scale_tag 2"),
])
def test_bad_input_is_refused(change: dict, field: str, match: str) -> None:
    expect_invalid(base(**change), 4096, field, match)
