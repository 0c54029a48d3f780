"""A big module compiles in parts on several threads (`rlx_llvm.partition`, `jit.compile_parts`):
each function keeps its IR and its passes, the parts load into one engine and call each other, and
the program computes the same bits as from one part."""
from __future__ import annotations

import ctypes
import locale
import re
import threading

import llvmlite.binding as llvm
from llvmlite import ir
import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import jit, partition, program, testing
from rlx_llvm.cache import ObjectCache
from rlx_llvm.codegen import NativeStep
from rlx_llvm.kernels import pool

# t0_a and t1_b share an internal helper; t2_c and t3_d an external one that may be inlined; t4_e
# (called by the driver) calls t0_a; private data goes wherever it is read; the driver calls them all.
MODULE = """\
@table = private constant [2 x i32] [i32 20, i32 22]

define internal i32 @helper(i32 %x) {
entry:
  %y = add i32 %x, 1
  ret i32 %y
}

define i32 @inlinable(i32 %x) {
entry:
  %y = mul i32 %x, 2
  ret i32 %y
}

define i32 @t0_a() noinline {
entry:
  %v = load i32, ptr @table
  %r = call i32 @helper(i32 %v)
  ret i32 %r
}

define i32 @t1_b() noinline {
entry:
  %r = call i32 @helper(i32 100)
  ret i32 %r
}

define i32 @t2_c() noinline {
entry:
  %p = getelementptr [2 x i32], ptr @table, i64 0, i64 1
  %v = load i32, ptr %p
  %r = call i32 @inlinable(i32 %v)
  ret i32 %r
}

define i32 @t3_d() noinline {
entry:
  %r = call i32 @inlinable(i32 1000)
  ret i32 %r
}

define i32 @t4_e() noinline {
entry:
  %v = call i32 @t0_a()
  %r = add i32 %v, 10000
  ret i32 %r
}

define i64 @segment0() {
entry:
  %a = call i32 @t0_a()
  %b = call i32 @t1_b()
  %c = call i32 @t2_c()
  %d = call i32 @t3_d()
  %e = call i32 @t4_e()
  %ab = add i32 %a, %b
  %cd = add i32 %c, %d
  %abcd = add i32 %ab, %cd
  %all = add i32 %abcd, %e
  %r = zext i32 %all to i64
  ret i64 %r
}
"""
EXPECTED = 21 + 101 + 44 + 2000 + 10021


def definitions(text: str) -> dict[str, str]:
    """Function name → its `define … }` text."""
    return {m.group(1): m.group(0) for m in re.finditer(r'^define [^@\n]*@"?([\w.]+)"?\(.*?^}', text, re.M | re.S)}


def test_split_ties_what_the_optimizer_sees_across_functions():
    parts = partition.split(MODULE, 2)
    assert len(parts.texts) == 2
    assert parts.defined == {"inlinable", "t0_a", "t1_b", "t2_c", "t3_d", "t4_e", "segment0"}
    whole = definitions(MODULE)
    owner = {}
    for text in parts.texts:
        llvm.parse_assembly(text).verify()
        for name, body in definitions(text).items():
            assert body == whole[name]              # the same IR, function by function
            assert name not in owner                # defined once
            owner[name] = text
    assert set(owner) == set(whole)
    assert owner["helper"] is owner["t0_a"] is owner["t1_b"]        # an internal callee and all its callers
    assert owner["t4_e"] is owner["t0_a"]                           # a called function and its callees
    assert owner["inlinable"] is owner["t2_c"] is owner["t3_d"]     # an inlinable callee and all its callers
    assert owner["segment0"] is not owner["t0_a"]                   # the driver's calls cross parts
    for text in parts.texts:                                        # private data: in every part that reads it
        reads = any("@table" in body for body in definitions(text).values())
        assert ("@table = private" in text) == reads


def test_split_leaves_modules_it_cannot_or_need_not_split():
    assert partition.split(MODULE, 1).texts == [MODULE]
    shared = MODULE.replace("@table = private constant", "@table = constant")   # seen from outside
    assert partition.split(shared, 2).texts == [shared]
    weak = MODULE.replace("define i32 @t1_b()", "define weak i32 @t1_b()")
    assert partition.split(weak, 2).texts == [weak]


def test_parts_compile_at_once_and_call_each_other():
    parts = partition.split(MODULE, 2)
    progress = []
    code = jit.compile_parts(parts, on_part=lambda done, total: progress.append((done, total)))
    assert isinstance(code, jit.ObjectSet) and len(code.parts) == 2
    assert code.externals == []                     # the other part's functions are not unresolved
    assert progress[-1] == (2, 2) and progress == sorted(progress)
    engine = jit.Engine()
    engine.load(code)
    assert ctypes.CFUNCTYPE(ctypes.c_int64)(engine.address("segment0"))() == EXPECTED


def test_streamed_parts_are_cut_while_emitting_and_checked_at_the_end():
    module = ir.Module("m")
    i32 = ir.IntType(32)

    def function(name: str, linkage: str = "", calls: "ir.Function | None" = None) -> ir.Function:
        fn = ir.Function(module, ir.FunctionType(i32, []), name=name)
        fn.linkage = linkage
        fn.attributes.add("noinline")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.ret(b.call(calls, []) if calls is not None else i32(7))
        return fn

    helper = function("helper", "internal")
    function("t0_a", calls=helper)
    streamed = partition.Streamed(module)
    first, provided = streamed.cut(1)
    assert provided == frozenset() and "define internal i32 @\"helper\"" in first
    t1 = function("t1_b", calls=module.get_global("t0_a"))   # calls an earlier part's function
    second, provided = streamed.cut(1)
    assert provided == {"t0_a"} and 'declare i32 @"t0_a"()' in second and "@\"helper\"" not in second
    assert streamed.holds() and streamed.text() == str(module)
    for text in (first, second):
        llvm.parse_assembly(text).verify()
    function("t2_c", calls=helper)        # an earlier part's internal helper: the cuts no longer hold
    assert not streamed.holds() and streamed.text() == str(module)
    assert t1.name in partition.split(streamed.text(), 2).defined


def walked_externals(text: str) -> list[str]:
    """The externals of a module found by walking its functions and globals."""
    mod = llvm.parse_assembly(text)
    return sorted([f.name for f in mod.functions if f.is_declaration and not f.name.startswith("llvm.")]
                  + [g.name for g in mod.global_variables if g.is_declaration])


def test_externals_read_from_the_text_are_the_declarations():
    module = ir.Module("m")
    ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType()]), name="rlx.custom.x")
    ir.GlobalVariable(module, ir.IntType(32), name="rlx_num_threads")
    ir.Function(module, ir.FunctionType(ir.FloatType(), [ir.FloatType()]), name="llvm.sqrt.f32")
    for text in (str(module), str(llvm.parse_assembly(str(module)))):   # as llvmlite and as LLVM print it
        assert jit._declared_externals(text) == walked_externals(text) == ["rlx.custom.x", "rlx_num_threads"]


# ── a program of many kinds: same bits, same code ──
KINDS = ("ElementwiseRegion", "Sgemm", "QMatMul", "Scan", "CustomOp", "Fft1d", "LayerNorm", "Copy")


@pytest.fixture(scope="module")
def chosen():
    """One example of each of KINDS (GEMM tiles, parallel bodies, a nested scan, a linked IR
    kernel, shared bodies: every internal function the emitters make)."""
    return [testing.examples(kind)[0] for kind in KINDS]


@pytest.fixture(scope="module")
def mixed(chosen):
    """The examples of KINDS side by side in one schedule."""
    return testing.pack(chosen)


def run(ex, prog) -> bytes:
    arena = rl.Arena(ex.schedule.arena_bytes)
    ex.init(arena, np.random.default_rng(0))
    prog.run(arena)
    return arena.bytes.tobytes()


def compiled(ex, monkeypatch, parts: int, cache=False):
    """`ex` compiled in `parts` parts."""
    monkeypatch.setattr(program, "PARALLEL_IR_CHARS", 0 if parts > 1 else 1 << 62)
    monkeypatch.setattr(pool, "get_threads", lambda: parts)
    return rl.compile(ex.schedule, cache=cache)


@pytest.fixture(scope="module")
def one_part(mixed):
    with pytest.MonkeyPatch.context() as mp:
        prog = compiled(mixed, mp, 1)
    return prog, run(mixed, prog)


def normalized(ir: str) -> str:
    """Function IR without the module-wide numbering of attribute groups and metadata."""
    return re.sub(r"[#!]\d+", "#", ir)


def asm_labels(asm: str) -> str:
    """Assembly without the module-wide numbering of local labels."""
    return re.sub(r"\.(LBB|LCPI|Ltmp|Lfunc_end)\d+(_\d+)?", r".\1", asm)


def test_parts_give_the_same_code_and_bits(mixed, one_part, monkeypatch):
    whole, expected = one_part
    prog = compiled(mixed, monkeypatch, 3)
    assert "compile (3 parts at once)" in prog.report().timings_ms
    assert "define internal" in whole.llvm_ir(optimized=True)   # the tie rule is exercised
    assert run(mixed, prog) == expected
    for row in whole.report().rows:
        if not row.symbol.startswith("<python"):
            assert normalized(prog.llvm_ir(optimized=True, thunk=row.index)) == \
                normalized(whole.llvm_ir(optimized=True, thunk=row.index))
    gemm = next(i for i, t in enumerate(mixed.schedule.thunks) if type(t).__name__ == "Sgemm")
    assert asm_labels(prog.asm(thunk=gemm)) == asm_labels(whole.asm(thunk=gemm))
    assert prog.llvm_ir() == whole.llvm_ir()
    assert jit._declared_externals(whole.llvm_ir()) == walked_externals(whole.llvm_ir())


@pytest.mark.parametrize("case", ["plain", "twice", "kernel", "kernel_last"])
def test_parts_compiled_while_emitting_give_the_same_bits(chosen, monkeypatch, case):
    """A part per thunk as soon as it is emitted.  Twice the examples: the second GEMM uses the
    first's register tiles (internal functions), so the cuts do not hold and the module is split
    anew, in 2; so is a module with an IR kernel to link (never streamed) — also when the kernel
    comes last, found only by the last cut (which once left the parts cut before it as the whole)."""
    plain = testing.pack([ex for ex in chosen if "CustomOp" not in ex.kinds])
    kernel_last = testing.pack([*(ex for ex in chosen if "CustomOp" not in ex.kinds),
                                *(ex for ex in chosen if "CustomOp" in ex.kinds)])
    ex = {"plain": plain, "twice": testing.pack([plain, plain]), "kernel": testing.pack(chosen),
          "kernel_last": kernel_last}[case]
    expected = run(ex, compiled(ex, monkeypatch, 1))
    monkeypatch.setattr(program, "STREAM_PART_CHARS", 1)
    monkeypatch.setattr(program, "STREAM_CHECK_EVERY", 1)
    locale_before = locale.setlocale(locale.LC_ALL)
    prog = compiled(ex, monkeypatch, 2)
    assert locale.setlocale(locale.LC_ALL) == locale_before   # printers at once once left the process in "C"
    assert run(ex, prog) == expected
    parts = len(prog._code.parts)
    assert parts > len(plain.schedule.thunks) // 2 if case == "plain" else parts == 2


def test_parts_are_cached_and_load_warm(mixed, one_part, monkeypatch, tmp_path):
    _, expected = one_part
    cold = compiled(mixed, monkeypatch, 2, cache=str(tmp_path))
    assert not cold.report().from_cache and len(list(tmp_path.rglob("*.o"))) == 2
    warm = compiled(mixed, monkeypatch, 2, cache=str(tmp_path))
    assert warm.report().from_cache and run(mixed, warm) == expected
    assert isinstance(ObjectCache(tmp_path).load_all(cold._code.key), jit.ObjectSet)
    tiered = rl.compile(mixed.schedule, cache=False, tiered=True)   # quick parts now, O3 parts behind
    assert tiered.wait_optimized(120) and tiered.tier == 2
    assert run(mixed, tiered) == expected


def test_compile_threads_take_the_largest_waiting_part_first(monkeypatch):
    """Parts queued while every compile thread is busy start largest first: the last part of a
    streamed module (the segment drivers) does not wait behind smaller parts cut before it."""
    monkeypatch.setattr(pool, "get_threads", lambda: 1)
    jit._compile_threads(1)
    busy = {f"busy{k}": threading.Event() for k in range(jit._threads_size)}
    entered, started = threading.Semaphore(0), []

    def compile_part(text, *_):
        if text in busy:
            entered.release()
            busy[text].wait(30)
        else:
            started.append(text)
        return text

    monkeypatch.setattr(jit, "_compile_part", compile_part)
    blockers = [jit.submit_part(name, frozenset()) for name in busy]
    for _ in busy:
        assert entered.acquire(timeout=30)   # every compile thread is busy
    texts = ["mm", "mmmm", "m", "mmm"]
    parts = [jit.submit_part(text, frozenset()) for text in texts]
    busy["busy0"].set()                      # one thread is free: it takes the waiting parts in turn
    assert [job.result(30) for job in parts] == texts
    for event in busy.values():
        event.set()
    assert [job.result(30) for job in blockers] == list(busy)
    assert started == ["mmmm", "mmm", "mm", "m"]


def test_a_streamed_segment_driver_is_a_part_of_its_own(chosen, monkeypatch):
    """Once parts are being cut, what was emitted before the last segment's driver becomes a part:
    the driver (a call per thunk) is the last part alone, and the same bits come out."""
    ex = testing.pack([ex for ex in chosen if "CustomOp" not in ex.kinds])
    expected = run(ex, compiled(ex, monkeypatch, 1))
    monkeypatch.setattr(program, "STREAM_PART_CHARS", 1)
    monkeypatch.setattr(program, "STREAM_CHECK_EVERY", 3)
    prog = compiled(ex, monkeypatch, 2)
    assert run(ex, prog) == expected
    last = prog._code.parts[-1].optimized_ir
    drivers = [step.symbol for step in prog._steps if isinstance(step, NativeStep)]
    assert re.findall(r'^define [^@]*@"?([^"(]+)', last, re.M) == drivers[-1:]
