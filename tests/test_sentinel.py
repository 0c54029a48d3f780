"""Every lowered kind touches only its declared outputs: bytes outside `writes()` never change.

All of `rlx_llvm.testing`'s examples run in one program over one arena of random bytes (their inputs
initialized valid); the guard bytes between buffers, the inputs and every unused byte must survive.
"""
from __future__ import annotations

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import testing


def outside_writes(schedule: rl.ThunkSchedule) -> np.ndarray:
    """A mask of the arena bytes no thunk of `schedule` declares as an output."""
    keep = np.ones(schedule.arena_bytes, dtype=bool)
    for t in schedule.thunks:
        for ext in t.writes():
            keep[ext.offset:ext.end] = False
    return keep


@pytest.fixture(scope="module")
def everything() -> tuple[testing.Example, rl.Program]:
    """All examples packed into one schedule, compiled once."""
    whole = testing.pack(testing.examples(), name="all examples")
    return whole, rl.compile(whole.schedule, cache=False)


def test_sentinel_bytes_survive(everything) -> None:
    whole, prog = everything
    rng = np.random.default_rng(7)
    arena = rl.Arena(whole.schedule.arena_bytes)
    arena.bytes[:] = rng.integers(0, 256, arena.nbytes, dtype=np.uint8)
    whole.init(arena, rng)
    before = arena.bytes.copy()
    prog.run(arena)
    changed = np.flatnonzero((arena.bytes != before) & outside_writes(whole.schedule))
    moved = testing.side_by_side(testing.examples())
    ends = [ex.schedule.arena_bytes for ex in moved]
    culprits = {moved[np.searchsorted(ends, i, side="right")].name for i in changed[:8]}
    assert changed.size == 0, f"bytes outside every declared output changed, first at {changed[:8]}: {culprits}"


def test_the_sentinel_run_covers_every_example(everything) -> None:
    whole, _ = everything
    assert len(whole.schedule.thunks) == sum(len(ex.schedule.thunks) for ex in testing.examples())


def test_every_example_kind_is_lowered() -> None:
    cov = rl.coverage()
    kinds = set().union(*(ex.kinds for ex in testing.examples()))
    assert {k: cov[k] for k in kinds if cov[k] == "missing"} == {}
