"""The quick tier's kernel library (rlx_llvm/kernel_library.py): GEMM tiles and packers compiled once
per process and declared by later modules — same bytes as quick code that defines them itself."""
from __future__ import annotations

import numpy as np

import rlx_llvm as rl
from rlx_llvm import jit, kernel_library, testing


def _run_quick(example: testing.Example, borrow: bool) -> tuple[np.ndarray, str]:
    """The example's bytes after a run on quick code compiled with or without the library."""
    program = rl.compile(example.schedule, cache=False, tiered=False)
    ir_text = program.llvm_ir()
    program._steps = program._bound_steps(jit.compile_quick(ir_text, borrow=borrow))
    arena = rl.Arena(example.schedule.arena_bytes)
    example.init(arena, np.random.default_rng(0))
    program.run(arena)
    return arena.bytes.copy(), ir_text


def test_borrowed_tiles_give_the_same_bytes():
    bert = testing.examples("FusedBertLayer")[0]
    own, ir_text = _run_quick(bert, borrow=False)
    jit.compile_quick(ir_text)   # lends the helpers to the library, in the background
    assert kernel_library.settled()
    borrowed, _ = _run_quick(bert, borrow=True)
    np.testing.assert_array_equal(borrowed, own)
    tiles = [n for n in kernel_library.names() if f'@"{n}"' in ir_text]
    assert any(n.startswith("rlx.tile.") for n in tiles)


def test_a_borrowing_module_declares_the_tiles_and_keeps_the_rest():
    bert = testing.examples("FusedBertLayer")[0]
    ir_text = rl.compile(bert.schedule, cache=False, tiered=False).llvm_ir()
    jit.compile_quick(ir_text)   # fills the library
    assert kernel_library.settled()
    lent = kernel_library.borrow(ir_text, jit.compile_quick)
    held = [n for n in kernel_library.names() if f'@"{n}"' in ir_text]
    assert held
    for name in held:
        assert f'declare void @"{name}"' in lent and f'define internal void @"{name}"' not in lent
    assert lent.count("\ndefine ") == ir_text.count("\ndefine ") - len(held)


def test_a_different_body_under_a_held_name_is_not_borrowed():
    bert = testing.examples("FusedBertLayer")[0]
    ir_text = rl.compile(bert.schedule, cache=False, tiered=False).llvm_ir()
    jit.compile_quick(ir_text)
    assert kernel_library.settled()
    name = next(n for n in kernel_library.names() if f'@"{n}"' in ir_text)
    changed = ir_text.replace(f'define internal void @"{name}"(', f'define internal void @"{name}"(', 1)
    start = changed.index(f'define internal void @"{name}"(')
    end = changed.index("\n}\n", start)
    body = changed[start:end]
    changed = changed[:start] + body.replace("ret void", "br label %\"rlx.extra\"\nrlx.extra:\n  ret void", 1) \
        + changed[end:]
    lent = kernel_library.borrow(changed, jit.compile_quick)
    assert f'define internal void @"{name}"(' in lent


def test_a_helper_the_library_lacks_stays_defined_until_lent():
    bert = testing.examples("FusedBertLayer")[0]
    ir_text = rl.compile(bert.schedule, cache=False, tiered=False).llvm_ir()
    renamed = ir_text.replace('"rlx.tile.', '"rlx.tile.test_renamed.')
    assert kernel_library.settled()
    first = kernel_library.borrow(renamed, jit.compile_quick)
    assert 'define internal void @"rlx.tile.test_renamed.' in first
    assert kernel_library.settled()
    assert 'declare void @"rlx.tile.test_renamed.' in kernel_library.borrow(renamed, jit.compile_quick)
