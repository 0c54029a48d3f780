"""The quick tier split function by function (partition.split_functions, program._split_quick): every
function may land in any part, local ones made external — the same bytes as the quick code of the
whole module, on schedules with fused layers, GEMM tiles, parallel bodies, constant tables."""
from __future__ import annotations

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import jit, partition, testing

KINDS = ("FusedBertLayer", "FusedNomicLayer", "FusedAttnBlock", "Sgemm", "LayerNorm", "Softmax", "Attention",
         "ElementwiseRegion", "Gather")


@pytest.fixture(scope="module")
def example() -> testing.Example:
    return testing.pack([ex for kind in KINDS for ex in testing.examples(kind)[:2] if "CustomOp" not in ex.kinds])


def _bytes(example: testing.Example, program, code) -> np.ndarray:
    program._steps = program._bound_steps(code)
    arena = rl.Arena(example.schedule.arena_bytes)
    example.init(arena, np.random.default_rng(0))
    program.run(arena)
    return arena.bytes.copy()


@pytest.mark.parametrize("parts", [2, 5])
def test_split_by_function_gives_the_bytes_of_the_whole_module(example, parts):
    program = rl.compile(example.schedule, cache=False, tiered=False)
    ir_text = program.llvm_ir()
    split = partition.split_functions(ir_text, parts)
    assert len(split.texts) == parts
    assert any("define internal" in ir_text and "define internal" not in t for t in split.texts)
    whole = _bytes(example, program, jit.compile_quick(ir_text, borrow=False))
    np.testing.assert_array_equal(_bytes(example, program, jit.compile_parts(split, quick=True)), whole)


def test_one_part_is_the_text_itself(example):
    ir_text = rl.compile(example.schedule, cache=False, tiered=False).llvm_ir()
    assert partition.split_functions(ir_text, 1).texts == [ir_text]
    assert partition.split_functions(ir_text, 2, min_code_chars=len(ir_text) + 1).texts == [ir_text]


def test_a_tiered_program_on_two_threads_runs_split_quick_code(example):
    before = rl.get_num_threads()
    rl.set_num_threads(2)
    try:
        program = rl.compile(example.schedule, cache=False, tiered=True)
        assert program.tier == 1 and len(program.llvm_ir()) >= rl.program.QUICK_PARALLEL_IR_CHARS
        assert "quick compile (2 parts at once)" in program.report().timings_ms
        program.wait_optimized()
        reference = rl.compile(example.schedule, cache=False, tiered=False)
        testing.assert_outputs_match(example, _bytes(example, program, program._code),
                                     _bytes(example, reference, reference._code))
    finally:
        rl.set_num_threads(before)
