"""Tiered compilation (docs/compile.md): quick code runs first, the O3 object is built on a background
thread, stored in the cache and swapped in between runs; results and the cache are those of O3."""
from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import jit, testing

# Kinds whose quick-tier code gives the same bits as O3 (the norms' multiply-adds are explicit
# llvm.fma, so O3's vectorizer cannot leave a product unfused where the quick tier fuses it);
# FusedBertLayer's O3 code reassociates its reductions, so its tiers agree only within tolerance.
SAME_BITS = ("LayerNorm", "Softmax", "Sgemm", "ElementwiseRegion", "RmsNorm", "LayerNorm2d", "AdaLayerNorm",
             "GroupNorm", "BatchNormInference")


def _example(kinds) -> testing.Example:
    return testing.pack([testing.examples(kind)[0] for kind in kinds])


@pytest.fixture(scope="module")
def same_bits() -> testing.Example:
    return _example(SAME_BITS)


@pytest.fixture(scope="module")
def bert() -> testing.Example:
    return testing.examples("FusedBertLayer")[0]


def _run(program, example: testing.Example) -> np.ndarray:
    arena = rl.Arena(example.schedule.arena_bytes)
    example.init(arena, np.random.default_rng(0))
    program.run(arena)
    return arena.bytes.copy()


def _quick_run(program, example: testing.Example) -> np.ndarray:
    """Run `program` on its quick-tier code, whatever tier it is on (deterministic)."""
    program._steps = program._bound_steps(jit.compile_quick(program.llvm_ir()))
    return _run(program, example)


def test_quick_tier_gives_o3_bits_on_these_kinds(same_bits):
    program = rl.compile(same_bits.schedule, cache=False, tiered=False)
    assert program.tier == 2
    o3 = _run(program, same_bits)
    np.testing.assert_array_equal(_quick_run(program, same_bits), o3)


def test_quick_tier_of_a_bert_layer_matches_within_tolerance(bert):
    program = rl.compile(bert.schedule, cache=False, tiered=False)
    testing.assert_outputs_match(bert, _quick_run(program, bert), _run(program, bert))


def test_tier_up_swaps_in_o3_and_fills_the_cache(same_bits, tmp_path):
    reference = _run(rl.compile(same_bits.schedule, cache=False, tiered=False), same_bits)
    program = rl.compile(same_bits.schedule, cache=tmp_path, tiered=True)
    first = _run(program, same_bits)          # tier 1, or 2 if the background thread was quick
    assert program.wait_optimized(timeout=300)
    assert program.tier == 2 and "tier-up" in program.report().timings_ms
    np.testing.assert_array_equal(first, reference)
    np.testing.assert_array_equal(_run(program, same_bits), reference)
    warm = rl.compile(same_bits.schedule, cache=tmp_path)   # the cache holds the O3 object
    assert warm.report().from_cache and warm.tier == 2
    np.testing.assert_array_equal(_run(warm, same_bits), reference)


def test_runs_on_other_threads_during_the_swap_stay_consistent(same_bits):
    reference = _run(rl.compile(same_bits.schedule, cache=False, tiered=False), same_bits)
    program = rl.compile(same_bits.schedule, cache=False, tiered=True)
    results, stop = [], threading.Event()

    def hammer():
        while not stop.is_set():
            results.append(_run(program, same_bits))

    threads = [threading.Thread(target=hammer) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        assert program.wait_optimized(timeout=300)
    finally:
        stop.set()
        for t in threads:
            t.join()
    results.append(_run(program, same_bits))
    for got in results:
        np.testing.assert_array_equal(got, reference)


def test_untiered_and_env_switch(same_bits, monkeypatch):
    monkeypatch.setenv("RLX_LLVM_TIERED", "0")
    assert rl.compile(same_bits.schedule, cache=False).tier == 2
    monkeypatch.setenv("RLX_LLVM_TIERED", "1")   # tiers only modules of TIER_UP_IR_CHARS or more
    assert rl.compile(same_bits.schedule, cache=False).tier == 1
    assert rl.compile(testing.examples("Softmax")[0].schedule, cache=False).tier == 2
    assert rl.compile(same_bits.schedule, cache=False, opt_level=1, tiered=True).tier == 2


def test_a_program_dropped_before_its_tier_up_is_released(same_bits):
    program = rl.compile(same_bits.schedule, cache=False, tiered=True)
    ref = __import__("weakref").ref(program)
    del program
    gc.collect()
    assert ref() is None   # the background job holds only a weak reference
    again = rl.compile(same_bits.schedule, cache=False, tiered=True)
    assert again.wait_optimized(timeout=300)
