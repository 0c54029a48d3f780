"""Hypothesis-generated schedules: random sequences of example thunks over one arena match the NumPy oracle."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import rlx_llvm as rl
from rlx_llvm import reference as ref
from rlx_llvm import testing

SLOW = {ex.name for ex in testing.examples(family="fused_layers")}   # whole transformer layers: compile slowly
SEEDS = [ex for ex in testing.examples() if ex.schedule.thunks and ex.name not in SLOW]


@st.composite
def schedules(draw):
    """2–6 examples side by side in one arena, their thunks run in a random order on valid random data."""
    picks = draw(st.lists(st.integers(0, len(SEEDS) - 1), min_size=2, max_size=6))
    whole = testing.pack([SEEDS[p] for p in picks])
    order = draw(st.permutations(range(len(whole.schedule.thunks))))
    seed = draw(st.integers(0, 2**32 - 1))
    return whole, [whole.schedule.thunks[i] for i in order], seed


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_random_schedules_match_the_reference(case):
    whole, thunks, seed = case
    sched = rl.ThunkSchedule(thunks, arena_bytes=whole.schedule.arena_bytes)
    arena = rl.Arena(sched.arena_bytes)
    rng = np.random.default_rng(seed)
    arena.bytes[:] = rng.integers(0, 256, arena.nbytes, dtype=np.uint8)
    whole.init(arena, rng)
    expected = rl.Arena.from_bytes(arena.bytes)
    ref.run(sched, expected)
    rl.compile(sched, cache=False).run(arena)
    testing.assert_outputs_match(whole, arena.bytes, expected.bytes)
