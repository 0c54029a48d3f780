"""Helpers emitted once per process (ir_emit/printed.py): a module that reuses the printed text of the
GEMM tiles and packers is, character for character, the module a fresh emission prints."""
from __future__ import annotations

import re

import rlx_llvm as rl
from rlx_llvm import testing
from rlx_llvm.ir_emit import printed


def _ir(example: testing.Example) -> str:
    return rl.compile(example.schedule, cache=False, opt_level=0).llvm_ir()


def _tiles(ir_text: str) -> set[str]:
    return set(re.findall(r'^define internal void @"(rlx\.tile\.[^"]+)"', ir_text, re.M))


def test_reused_tiles_print_the_module_a_fresh_emission_prints():
    first, second = testing.examples("FusedBertLayer")[0], testing.examples("FusedNomicLayer")[0]
    tiles = _tiles(_ir(first))   # the tiles are printed once here …
    reused = _ir(second)         # … and reused here (the host's register tiles are in both)
    assert tiles & _tiles(reused), f"no register tile shared: {sorted(tiles)} / {sorted(_tiles(reused))}"
    printed._printed.clear()
    assert _ir(second) == reused


def test_a_body_that_names_other_globals_is_not_kept():
    from llvmlite import ir
    module = ir.Module()
    data = ir.GlobalVariable(module, ir.IntType(32), "some_data")
    fnty = ir.FunctionType(ir.IntType(32), [])

    def emit_loading(fn, declare):
        b = ir.IRBuilder(fn.append_basic_block())
        b.ret(b.load(data))
    printed.define_once(module, ("test-not-kept",), fnty, "reads_data", module.globals.get, emit_loading)
    assert ("test-not-kept",) not in printed._printed
