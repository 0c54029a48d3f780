"""CustomOp: registered kernels of every kind called from native code (docs/custom-ops.md).

* One program: the demo IR kernel (an 8-lane vector loop and a scalar tail) at n ∈ {0, 1, 7, 8, 9, 37,
  1000}, a ctypes CFUNCTYPE kernel, the same IR compiled on its own and registered as a raw C address,
  a Python kernel over three inputs weighted by its attribute bytes — against the references (the
  kernels called through ctypes), bit-exact, at 1 and 2 threads, nothing outside the outputs written;
  report() shows "llvm", "c" and "python".
* A numba `@cfunc` kernel (skipped without numba).
* A failure status and an exception in a Python kernel are ExecutionErrors naming the op.
* Bad input: an unregistered name lists the registered ones; `len` ≠ prod(shape) for an input or the
  output, and a kernel's own `check`, are ValidationErrors; registration refuses bad IR, a taken
  name (unless `replace=True`), non-kernels.
* Warm starts: in this process and in fresh ones, a replaced kernel (IR or Python) is never called.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import custom_ops
from rlx_llvm import thunks as T
from rlx_llvm.testing.custom_op import DEMO, DEMO_IR, scaled_add
from tests.harness import Suite, assert_same, expect_invalid, suite_tests


def weighted_sum(inputs: list[np.ndarray], out: np.ndarray, attrs: bytes) -> None:
    """out = Σ attrs[i] · inputs[i] (a Python kernel)."""
    out[:] = sum(np.float32(w) * x for w, x in zip(attrs, inputs))


@custom_ops.KERNEL
def negate(inputs, lens, n_inputs, out, out_len, attrs, n_attrs) -> int:
    """out = −inputs[0] (a ctypes kernel)."""
    src = (ctypes.c_float * out_len).from_address(inputs[0])
    (ctypes.c_float * out_len).from_address(out)[:] = [-v for v in src]
    return 0


def fails_with_5(inputs, out, attrs) -> int:
    return 5


def raises(inputs, out, attrs) -> None:
    raise ValueError("boom")


def register_once(name: str, kernel, **kw) -> None:
    custom_ops.register_custom_op(name, kernel, replace=True, **kw)


register_once("test_co_weighted_sum", weighted_sum)
register_once("test_co_negate", negate)
register_once("test_co_raw_demo", custom_ops.entry_address(custom_ops.lookup(DEMO)))
register_once("test_co_fails", fails_with_5)
register_once("test_co_raises", raises)


def op(kernel: str, inputs: list[int], out: int, n: int, attrs=(), shape=None) -> T.CustomOp:
    shape = (n,) if shape is None else shape
    return T.CustomOp(kernel=kernel, inputs=tuple((off, n, shape) for off in inputs), output=(out, n, shape),
                      attrs=tuple(attrs))


def build() -> Suite:
    s = Suite(seed=12, fill=0xFF)
    for n in (0, 1, 7, 8, 9, 37, 1000):
        x, y = s.put(s.normal(n)), s.put(s.normal(n))
        s.add(f"ir_n{n}", op(DEMO, [x, y], s.out(np.float32, n)[0], n, attrs=(3,)))
    x, y = s.put(s.normal(37)), s.put(s.normal(37))
    s.add("raw_address_n37", op("test_co_raw_demo", [x, y], s.out(np.float32, 37)[0], 37, attrs=(5,)))
    x = s.put(s.normal(6, 5))
    s.add("ctypes_2x3x5", op("test_co_negate", [x], s.out(np.float32, 30)[0], 30, shape=(2, 3, 5)))
    ins = [s.put(s.normal(11)) for _ in range(3)]
    s.add("python_three_inputs", op("test_co_weighted_sum", ins, s.out(np.float32, 11)[0], 11, attrs=(1, 2, 7)))
    return s


SUITE = build()
outcome, test_matches_reference, test_nothing_outside_the_outputs_changes, test_thread_count_does_not_change_results, \
    test_every_kind_is_native = suite_tests(SUITE, paths=frozenset({"llvm", "c", "python"}))


def test_results_match_the_formulas(outcome) -> None:
    """The kernels did what they say (not only what the reference, which calls them too, did)."""
    inputs = dict(SUITE.inputs)

    def output(case: str) -> np.ndarray:
        return outcome.output(case).view(np.float32)

    def operand(case: str, k: int) -> np.ndarray:
        return inputs[outcome.case(case).thunk.inputs[k][0]].reshape(-1)

    assert_same(output("ir_n37"), np.float32(3) * operand("ir_n37", 0) + operand("ir_n37", 1))
    assert_same(output("raw_address_n37"),
                np.float32(5) * operand("raw_address_n37", 0) + operand("raw_address_n37", 1))
    assert_same(output("ctypes_2x3x5"), -operand("ctypes_2x3x5", 0))
    want = sum(np.float32(w) * operand("python_three_inputs", k) for k, w in enumerate((1, 2, 7)))
    assert_same(output("python_three_inputs"), want)


def test_report_names_the_path_of_each_kind(outcome) -> None:
    paths = {r.index: r.path for r in outcome.program.report()}
    assert paths[outcome.index("ir_n9")] == "llvm"
    assert paths[outcome.index("ctypes_2x3x5")] == "c"
    assert paths[outcome.index("raw_address_n37")] == "c"
    assert paths[outcome.index("python_three_inputs")] == "python"


def one_op_program(kernel: str, n: int = 4, attrs=()) -> tuple[rl.Program, rl.Arena]:
    sched = rl.ThunkSchedule([op(kernel, [0], 64, n, attrs)], arena_bytes=128)
    arena = rl.Arena(128)
    arena.bytes[:] = 0
    return rl.compile(sched, cache=False), arena


def test_numba_cfunc() -> None:
    numba = pytest.importorskip("numba")
    sig = numba.types.int32(numba.types.CPointer(numba.types.voidptr), numba.types.CPointer(numba.types.int64),
                            numba.types.int32, numba.types.CPointer(numba.types.float32), numba.types.int64,
                            numba.types.CPointer(numba.types.uint8), numba.types.int64)

    @numba.cfunc(sig)
    def twice(inputs, lens, n_inputs, out, out_len, attrs, n_attrs):
        x = numba.carray(inputs[0], out_len, numba.float32)  # pragma: no cover
        for i in range(out_len):
            out[i] = 2 * x[i]
        return 0

    register_once("test_co_numba", twice)
    prog, arena = one_op_program("test_co_numba")
    arena.bytes[:16].view(np.float32)[:] = [1, 2, 3, 4]
    prog.run(arena)
    assert list(arena.bytes[64:80].view(np.float32)) == [2, 4, 6, 8]


def test_failure_status_is_an_execution_error() -> None:
    prog, arena = one_op_program("test_co_fails")
    with pytest.raises(rl.ExecutionError, match="custom op 'test_co_fails' returned status 5") as info:
        prog.run(arena)
    assert (info.value.index, info.value.kind) == (0, "CustomOp")


def test_python_exception_is_an_execution_error_naming_the_op() -> None:
    prog, arena = one_op_program("test_co_raises")
    with pytest.raises(rl.ExecutionError, match="custom op 'test_co_raises' raised ValueError: boom") as info:
        prog.run(arena)
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(rl.ExecutionError, match="boom"):
        prog.run(arena)


def test_unregistered_name_lists_the_registered_ones() -> None:
    sched = rl.ThunkSchedule([op("no_such_op", [0], 64, 4)], arena_bytes=128)
    with pytest.raises(rl.UnsupportedThunkError, match="'no_such_op' is not registered") as info:
        rl.compile(sched, cache=False)
    assert DEMO in str(info.value) and "test_co_negate" in str(info.value)


@pytest.mark.parametrize("thunk, field, match", [
    (T.CustomOp(kernel="test_co_negate", inputs=((0, 5, (2, 3)),), output=(64, 5, (5,)), attrs=()),
     "inputs[0]", "len 5 is not the product of shape (2, 3)"),
    (T.CustomOp(kernel="test_co_negate", inputs=((0, 6, (2, 3)),), output=(64, 6, (7,)), attrs=()),
     "output", "len 6 is not the product of shape (7,)"),
    (T.CustomOp(kernel=DEMO, inputs=((0, 4, (4,)),), output=(64, 4, (4,)), attrs=(1,)),
     "inputs", "takes 2 inputs"),
    (T.CustomOp(kernel=DEMO, inputs=((0, 4, (4,)), (16, 3, (3,))), output=(64, 4, (4,)), attrs=(1,)),
     "inputs", "operands of one length"),
])
def test_bad_operands_are_validation_errors(thunk, field, match) -> None:
    expect_invalid(thunk, 128, field, match)


def test_a_failing_check_becomes_a_validation_error() -> None:
    def check(t):
        raise KeyError("nope")
    register_once("test_co_checked", weighted_sum, check=check)
    expect_invalid(op("test_co_checked", [0], 64, 4), 128, "kernel", "refused its operands")


@pytest.mark.parametrize("kernel, match", [
    ("define i32 @other(ptr %a) { ret i32 0 }", "defines no function @test_co_bad"),
    ("define void @test_co_bad(ptr %a) { ret void }", r"has type void \(ptr\), expected i32"),
    ("define i32 @test_co_bad( {", "invalid LLVM IR"),
    (0, "NULL function pointer"),
])
def test_registration_refuses_bad_kernels(kernel, match) -> None:
    with pytest.raises(ValueError, match=match):
        custom_ops.register_custom_op("test_co_bad", kernel)
    assert "test_co_bad" not in rl.registered_custom_ops()


def test_registration_refuses_a_taken_name_unless_replacing() -> None:
    with pytest.raises(ValueError, match="already registered"):
        rl.register_custom_op(DEMO, weighted_sum)
    with pytest.raises(ValueError, match="name must match"):
        rl.register_custom_op("has space", weighted_sum)
    with pytest.raises(TypeError, match="not float"):
        rl.register_custom_op("test_co_float", 1.5)
    rl.register_custom_op("test_co_tmp", weighted_sum)
    rl.unregister_custom_op("test_co_tmp")
    assert "test_co_tmp" not in rl.registered_custom_ops()
    with pytest.raises(KeyError):
        rl.unregister_custom_op("test_co_tmp")


def adds(k: float):
    """A Python kernel: out = inputs[0] + k."""
    def kernel(inputs: list[np.ndarray], out: np.ndarray, attrs: bytes) -> None:
        np.add(inputs[0], np.float32(k), out=out)
    return kernel


def scale_ir(name: str, factor: float) -> str:
    """IR text of `out = factor · inputs[0]` (scalar loop)."""
    return textwrap.dedent(f"""
        define i32 @{name}(ptr %inputs, ptr %lens, i32 %n_inputs, ptr %out, i64 %n, ptr %attrs, i64 %n_attrs) {{
        entry:
          %x = load ptr, ptr %inputs
          br label %loop
        loop:
          %i = phi i64 [0, %entry], [%next, %body]
          %more = icmp ult i64 %i, %n
          br i1 %more, label %body, label %done
        body:
          %xi.at = getelementptr float, ptr %x, i64 %i
          %xi = load float, ptr %xi.at
          %yi = fmul float %xi, {factor:.1f}
          %yi.at = getelementptr float, ptr %out, i64 %i
          store float %yi, ptr %yi.at
          %next = add i64 %i, 1
          br label %loop
        done:
          ret i32 0
        }}""")


def test_warm_start_in_process_calls_the_registered_kernel(tmp_path) -> None:
    """Replacing a kernel after a compile: the warm start (IR: a miss; Python: re-resolved) calls the new one."""
    sched = rl.ThunkSchedule([op("test_co_warm_ir", [0], 64, 4), op("test_co_warm_py", [0], 128, 4)],
                             arena_bytes=192)

    def results() -> tuple[list, list, bool]:
        arena = rl.Arena(192)
        arena.bytes[:16].view(np.float32)[:] = [1, 2, 3, 4]
        prog = rl.compile(sched, cache=tmp_path)
        prog.run(arena)
        return list(arena.bytes[64:80].view(np.float32)), list(arena.bytes[128:144].view(np.float32)), \
            prog.report().from_cache

    register_once("test_co_warm_ir", scale_ir("test_co_warm_ir", 2.0))
    register_once("test_co_warm_py", adds(1))
    assert results() == ([2, 4, 6, 8], [2, 3, 4, 5], False)
    assert results()[2]
    register_once("test_co_warm_py", adds(10))
    assert results() == ([2, 4, 6, 8], [11, 12, 13, 14], True)
    register_once("test_co_warm_ir", scale_ir("test_co_warm_ir", 3.0))
    assert results()[:2] == ([3, 6, 9, 12], [11, 12, 13, 14])
    rl.unregister_custom_op("test_co_warm_py")
    with pytest.raises(rl.UnsupportedThunkError, match="test_co_warm_py"):
        results()


WARM = textwrap.dedent("""
    import json, sys, textwrap
    import numpy as np
    import rlx_llvm as rl
    from rlx_llvm import thunks as T
    from tests.ir_emit.test_custom_op import adds, scale_ir
    factor, offset = float(sys.argv[1]), float(sys.argv[2])
    rl.register_custom_op("w_ir", scale_ir("w_ir", factor))
    rl.register_custom_op("w_py", adds(offset))
    ops = [T.CustomOp(kernel=k, inputs=((0, 4, (4,)),), output=(o, 4, (4,)), attrs=()) for k, o in (("w_ir", 64), ("w_py", 128))]
    sched = rl.ThunkSchedule(ops, arena_bytes=192)
    arena = rl.Arena(192)
    arena.bytes[:16].view(np.float32)[:] = [1, 2, 3, 4]
    prog = rl.compile(sched)
    prog.run(arena)
    print(json.dumps({"ir": arena.bytes[64:80].view(np.float32).tolist(),
                      "py": arena.bytes[128:144].view(np.float32).tolist(), "hit": prog.report().from_cache}))
    """)


def test_warm_start_in_a_fresh_process_never_calls_a_stale_kernel(tmp_path) -> None:
    """Fresh processes: the same kernels registered again start warm; other kernels under the same names run."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, RLX_LLVM_CACHE_DIR=str(tmp_path), RLX_LLVM_CACHE="1",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))

    def run(factor: float, offset: float) -> dict:
        out = subprocess.run([sys.executable, "-c", WARM, str(factor), str(offset)], env=env, capture_output=True,
                             text=True, timeout=300, cwd=root)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert run(2, 1) == {"ir": [2, 4, 6, 8], "py": [2, 3, 4, 5], "hit": False}
    assert run(2, 1) == {"ir": [2, 4, 6, 8], "py": [2, 3, 4, 5], "hit": True}
    assert run(3, 10) == {"ir": [3, 6, 9, 12], "py": [11, 12, 13, 14], "hit": False}


def test_ir_kernels_with_clashing_helpers_link_side_by_side() -> None:
    """Two IR kernels each defining `@helper` and `@table` (made internal, renamed by the linker); scalar shapes."""
    def text(name: str, factor: str) -> str:
        return textwrap.dedent(f"""
            @table = constant [1 x float] [float {factor}]
            define float @helper(float %x) {{
              %t = load float, ptr @table
              %r = fmul float %x, %t
              ret float %r
            }}
            define i32 @{name}(ptr %inputs, ptr %lens, i32 %n_inputs, ptr %out, i64 %n, ptr %attrs, i64 %n_attrs) {{
              %x = load ptr, ptr %inputs
              %v = load float, ptr %x
              %r = call float @helper(float %v)
              store float %r, ptr %out
              ret i32 0
            }}""")
    register_once("test_co_twice", text("test_co_twice", "2.0"))
    register_once("test_co_five", text("test_co_five", "5.0"))
    ops = [T.CustomOp(kernel=k, inputs=((0, 1, ()),), output=(at, 1, ()), attrs=())
           for k, at in (("test_co_twice", 64), ("test_co_five", 128), ("test_co_twice", 192))]
    arena = rl.Arena(256)
    arena.bytes[:4].view(np.float32)[0] = 3
    rl.compile(rl.ThunkSchedule(ops, arena_bytes=256), cache=False).run(arena)
    assert [arena.bytes[at:at + 4].view(np.float32)[0] for at in (64, 128, 192)] == [6, 15, 6]
