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

DEFAULT_RTOL = {4: 1e-5, 8: 1e-12, 2: 1e-3}   # by float width (complex: by its parts)

# Examples that reveal a real bug: name → reason (xfail, strict).
KNOWN_BUGS: dict[str, str] = {}


@functools.cache
def family_run(family: str) -> tuple[list[testing.Example], dict[str, np.ndarray]]:
    """The family's examples side by side, and the arena bytes after each kind of run."""
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


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float, what: str) -> None:
    """Integers bit-exact; floats with NaN in the same places, else within rtol·(|want| + max|want|)."""
    if want.dtype.kind == "c":
        got, want = (a.view(f"f{a.dtype.itemsize // 2}") for a in (got, want))
    if want.dtype.kind != "f" or rtol == 0:
        nan = np.isnan(want) if want.dtype.kind == "f" else np.zeros(want.shape, bool)
        bad = np.flatnonzero((got.view(f"u{got.itemsize}") != want.view(f"u{want.itemsize}")) & ~(nan & np.isnan(got)))
    else:
        g, w = got.astype(np.float64), want.astype(np.float64)
        scale = np.max(np.abs(w[np.isfinite(w)]), initial=0.0)
        with np.errstate(invalid="ignore"):
            ok = (g == w) | (np.isnan(g) & np.isnan(w)) | (np.abs(g - w) <= rtol * (np.abs(w) + scale))
        bad = np.flatnonzero(~ok)
    assert bad.size == 0, f"{what}: {bad.size} of {want.size} differ, first at {bad[:5]}: " \
                          f"got {got[bad[:5]]}, want {want[bad[:5]]}"


def _params() -> list:
    return [pytest.param(family, ex.name, id=ex.name, marks=[pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[ex.name])]
                         if ex.name in KNOWN_BUGS else []) for family in testing.FAMILIES
            for ex in testing.examples(family=family)]


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


@pytest.mark.parametrize("family, name", _params())
def test_example_matches_the_reference_at_any_thread_count(family: str, name: str) -> None:
    exs, runs = family_run(family)
    ex = next(e for e in exs if e.name == name)
    for offset, dtype, count in ex.outputs():
        got1, got2, want = (runs[k][offset:offset + count * dtype.itemsize].view(dtype) for k in (1, 2, "reference"))
        rtol = ex.rtol if ex.rtol is not None else DEFAULT_RTOL.get(dtype.itemsize // (2 if dtype.kind == "c" else 1), 0)
        assert_close(got1, want, rtol, f"{name} output @{offset}")
        assert np.array_equal(got1.view(np.uint8), got2.view(np.uint8)), f"{name}: 1 and 2 threads differ @{offset}"
