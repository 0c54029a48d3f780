"""Every lowered kind touches only its declared outputs: bytes outside `writes()` never change."""
from __future__ import annotations

import numpy as np
import pytest

import rlx_llvm as rl
from tests.examples import examples


def _outside_writes_mask(thunk, nbytes: int) -> np.ndarray:
    keep = np.ones(nbytes, dtype=bool)
    for ext in thunk.writes():
        keep[ext.offset:ext.offset + ext.nbytes] = False
    return keep


@pytest.fixture(scope="module")
def compiled():
    """All examples in one program, each in its own region of one big arena."""
    cases = examples()
    stride = max(n for _, n in cases)
    shifted = []
    from dataclasses import fields, replace
    for k, (t, _) in enumerate(cases):
        shifted.append(_shift(t, k * stride))
    sched = rl.ThunkSchedule(shifted, arena_bytes=stride * len(shifted))
    return sched, rl.compile(sched, cache=False)


def _shift(t, delta: int):
    """The same thunk with every arena offset moved by `delta` bytes."""
    from dataclasses import replace
    ext_fields = {e.field for e in (*t.reads(), *t.writes())}
    changes = {}
    for name in ext_fields:
        base = name.split("[")[0]
        value = getattr(t, base)
        if isinstance(value, int):
            changes[base] = value + delta
        elif isinstance(value, tuple) and all(isinstance(v, int) for v in value):
            changes[base] = tuple(v + delta for v in value)
    return replace(t, **changes)


def test_sentinel_bytes_survive(compiled):
    sched, prog = compiled
    rng = np.random.default_rng(7)
    arena = rl.Arena(sched.arena_bytes)
    arena.bytes[:] = rng.integers(0, 256, arena.nbytes, dtype=np.uint8)
    before = arena.bytes.copy()
    keep = np.ones(arena.nbytes, dtype=bool)
    for t in sched.thunks:
        keep &= _outside_writes_mask(t, arena.nbytes)
    prog.run(arena)
    changed = np.flatnonzero((arena.bytes != before) & keep)
    assert changed.size == 0, f"bytes outside every declared output changed, first at {changed[:8]}"


def test_every_example_kind_is_lowered_natively():
    cov = rl.coverage()
    kinds = {type(t).__name__ for t, _ in examples()}
    assert {k: cov[k] for k in kinds if cov[k] not in ("llvm", "blas")} == {}
