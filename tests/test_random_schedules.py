"""Hypothesis-generated schedules: random sequences of thunks over one arena match the NumPy oracle."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import rlx_llvm as rl
from rlx_llvm import reference as ref
from tests.examples import examples
from tests.test_sentinel import _shift

SEEDS = examples()
STRIDE = max(n for _, n in SEEDS)


@st.composite
def schedules(draw):
    """2–6 example thunks, each in its own arena region, run in a random order on random data."""
    picks = draw(st.lists(st.integers(0, len(SEEDS) - 1), min_size=2, max_size=6))
    thunks = [_shift(SEEDS[p][0], k * STRIDE) for k, p in enumerate(picks)]
    order = draw(st.permutations(range(len(thunks))))
    seed = draw(st.integers(0, 2**32 - 1))
    return [thunks[i] for i in order], seed


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    if np.array_equal(got, want):
        return True
    if got.size % 4:
        return False
    g, w = got.view(np.float32).astype(np.float64), want.view(np.float32).astype(np.float64)
    return bool(np.all(np.isclose(g, w, rtol=2e-5, atol=2e-6, equal_nan=True)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_random_schedules_match_the_reference(case):
    thunks, seed = case
    nbytes = STRIDE * (len(thunks) + 1)
    sched = rl.ThunkSchedule(thunks, arena_bytes=nbytes)
    arena = rl.Arena(nbytes)
    rng = np.random.default_rng(seed)
    arena.view(0, "f32", nbytes // 4)[:] = rng.standard_normal(nbytes // 4).astype(np.float32)
    expected = rl.Arena.from_bytes(arena.bytes)
    ref.run(sched, expected)
    rl.compile(sched, cache=False).run(arena)
    for t in thunks:
        for ext in t.writes():
            got = arena.bytes[ext.offset:ext.end]
            want = expected.bytes[ext.offset:ext.end]
            assert _same(got, want), (t, ext)
