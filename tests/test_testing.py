"""`rlx_llvm.testing`: an example for every lowered kind, each matching the NumPy reference at any thread count.

Each family's examples are packed into one schedule (one compile), run natively at 1 and 2 threads and
by `rlx_llvm.reference` on copies of the same initialized arena; each example is then checked alone.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import reference as ref
from rlx_llvm import testing

# Examples that reveal a real bug: name → reason (xfail, strict).
KNOWN_BUGS: dict[str, str] = {}


@functools.cache
def family_run(family: str) -> tuple[list[testing.Example], dict[str | int, np.ndarray]]:
    """The family's examples side by side, and the arena bytes after the reference run and native runs at 1 and 2
    threads (keys "reference", 1, 2)."""
    exs = testing.examples(family=family)
    whole = testing.pack(exs)
    arena = rl.Arena(whole.schedule.arena_bytes)
    rng = np.random.default_rng(20261203)
    arena.bytes[:] = rng.integers(0, 256, arena.nbytes, dtype=np.uint8)
    whole.init(arena, rng)
    prog = rl.compile(whole.schedule, cache=False)
    runs = {"reference": rl.Arena.from_bytes(arena.bytes)}
    ref.run(whole.schedule, runs["reference"])
    saved = rl.get_num_threads()
    try:
        for threads in (1, 2):
            rl.set_num_threads(threads)
            runs[threads] = rl.Arena.from_bytes(arena.bytes)
            prog.run(runs[threads])
    finally:
        rl.set_num_threads(saved)
    return testing.side_by_side(exs), {k: a.bytes for k, a in runs.items()}


def _params() -> list:
    """(family, example name) of every example, a known bug marked xfail."""
    def marks(name: str) -> list:
        return [pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[name])] if name in KNOWN_BUGS else []
    return [pytest.param(family, ex.name, id=ex.name, marks=marks(ex.name))
            for family in testing.FAMILIES for ex in testing.examples(family=family)]


def test_every_lowered_kind_has_an_example() -> None:
    lowered = {k for k, path in rl.coverage().items() if path != "missing"}
    covered = set().union(*(ex.kinds for ex in testing.examples()))
    assert sorted(lowered - covered) == [], "lowered kinds without an example in rlx_llvm.testing"


def test_example_names_are_unique() -> None:
    names = [ex.name for ex in testing.examples()]
    assert len(names) == len(set(names))


def test_examples_by_kind() -> None:
    assert {ex.name for ex in testing.examples("LayerNorm")} >= {"LayerNorm/rows3_h37"}
    assert testing.examples("NoSuchKind") == []


def test_shift_moves_every_offset() -> None:
    t = rl.thunks.Concat(dst=64, outer=1, inner=1, total_axis=3, inputs=((0, 1, 1), (32, 2, 2)))
    moved = testing.shift(t, 1000)
    assert moved.dst == 1064 and moved.inputs == ((1000, 1, 1), (1032, 2, 2))
    assert [e.offset - 1000 for e in moved.reads()] == [e.offset for e in t.reads()]


def test_outputs_that_differ_are_reported() -> None:
    ex = testing.examples("LayerNorm")[0]
    want = np.zeros(ex.schedule.arena_bytes, np.uint8)
    got = want.copy()
    offset, dtype, _ = ex.outputs()[0]
    got[offset:offset + 4] = np.float32([1e-3]).view(np.uint8)
    with pytest.raises(AssertionError, match="1 of 111 differ"):
        testing.assert_outputs_match(ex, got, want)
    testing.assert_outputs_match(ex, want, want.copy())


@pytest.mark.parametrize("family, name", _params())
def test_example_matches_the_reference_at_any_thread_count(family: str, name: str) -> None:
    exs, runs = family_run(family)
    ex = next(e for e in exs if e.name == name)
    testing.assert_outputs_match(ex, runs[1], runs["reference"])
    for offset, dtype, count in ex.outputs():
        one, two = (runs[k][offset:offset + count * dtype.itemsize] for k in (1, 2))
        assert np.array_equal(one, two), f"{name}: 1 and 2 threads differ in the output at byte {offset}"
