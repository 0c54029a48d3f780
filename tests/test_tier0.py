"""Tier 0 (rlx_llvm/tier0.py): a schedule run by NumPy in float32 — within the example's tolerance of the
float64 reference and of the native code, nothing outside the outputs written."""
from __future__ import annotations

import numpy as np
import pytest

import rlx_llvm as rl
import rlx_llvm.reference as ref
from rlx_llvm import testing, tier0


def _bytes(example: testing.Example, run) -> np.ndarray:
    arena = rl.Arena(example.schedule.arena_bytes)
    example.init(arena, np.random.default_rng(0))
    run(arena)
    return arena.bytes.copy()


@pytest.mark.parametrize("example", testing.examples("FusedBertLayer") + testing.examples("Sgemm"),
                         ids=lambda ex: ex.name)
def test_tier0_matches_the_reference_and_the_native_code(example):
    got = _bytes(example, lambda arena: tier0.run(example.schedule, arena))
    testing.assert_outputs_match(example, got, _bytes(example, lambda arena: ref.run(example.schedule, arena)))
    testing.assert_outputs_match(example, got, _bytes(example, rl.compile(example.schedule, cache=False).run))
    untouched = _bytes(example, lambda arena: None)
    outputs = np.zeros(len(got), bool)
    for offset, dtype, count in example.outputs():
        outputs[offset:offset + count * dtype.itemsize] = True
    np.testing.assert_array_equal(got[~outputs], untouched[~outputs])


def test_a_fully_masked_sequence_gives_what_the_reference_gives():
    example = testing.examples("FusedBertLayer")[0]
    t = example.schedule.thunks[0]

    def masked(arena, run):
        arena.view(t.mask, "f32", (t.batch * t.seq,))[:] = 0.0
        run(arena)
    got = _bytes(example, lambda a: masked(a, lambda arena: tier0.run(example.schedule, arena)))
    testing.assert_outputs_match(example, got, _bytes(example, lambda a: masked(a, lambda arena: ref.run(
        example.schedule, arena))))
