"""Program: compile, run, inspection, errors, threads and the cross-process object cache."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import thunks as T
from rlx_llvm.ops import Activation, BinaryOp, ChainOperand as In, ChainStep as S

N = 1000


def gelu_schedule(n: int = N) -> rl.ThunkSchedule:
    """y = gelu_tanh(x + b) with a scalar b, then a copy of y."""
    region = T.ElementwiseRegion(dst=4 * n + 64, len=n, input_offs=(0, 4 * n), scalar_input_mask=0b10,
                                 chain=(S.Binary(BinaryOp.Add, In.Input(0), In.Input(1)),
                                        S.Activation(Activation.Gelu, In.Step(0))))
    copy = T.Copy(src=4 * n + 64, dst=8 * n + 128, len=n)
    return rl.ThunkSchedule([region, copy], arena_bytes=12 * n + 192)


@pytest.fixture(scope="module")
def prog() -> rl.Program:
    return rl.compile(gelu_schedule(), cache=False)


def fresh_arena(seed: int = 0) -> rl.Arena:
    a = rl.Arena(gelu_schedule().arena_bytes)
    a.write(0, np.random.default_rng(seed).standard_normal(N).astype(np.float32))
    a.write(4 * N, np.float32([0.25]))
    return a


def expected(a: rl.Arena) -> np.ndarray:
    x = a.read(0, "f32", N).astype(np.float64) + 0.25
    return 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))


def test_run_and_call_are_the_same(prog):
    a, b = fresh_arena(), fresh_arena()
    prog.run(a)
    prog(b)
    assert np.array_equal(a.bytes, b.bytes)
    np.testing.assert_allclose(a.read(8 * N + 128, "f32", N), expected(a), rtol=1e-5, atol=1e-6)


def test_rerun_is_idempotent(prog):
    a = fresh_arena()
    prog.run(a)
    first = a.bytes.copy()
    prog.run(a)
    assert np.array_equal(first, a.bytes)


def test_report_names_paths_and_symbols(prog):
    rep = prog.report()
    assert [r.kind for r in rep] == ["ElementwiseRegion", "Copy"]
    # both kinds share bodies (docs/limits.md "Compile cost"): each thunk is a row calling `<first>.body`
    assert [r.symbol for r in rep] == ["t0_elementwise_region.body", "t1_copy.body"]
    assert all(r.path == "llvm" for r in rep)
    assert "t0_elementwise_region" in str(rep)


def test_ir_and_asm_inspection(prog):
    ir_text = prog.llvm_ir(thunk=0)
    assert ir_text.startswith("; thunk 0: ElementwiseRegion(")
    lanes = rl.jit.host().lanes(32)  # the host's f32 vector width: 16 with AVX-512, 8 with AVX2
    assert "define i32 @\"t0_elementwise_region.body\"" in ir_text and f"<{lanes} x float>" in ir_text
    assert "t1_copy" not in ir_text
    whole = prog.llvm_ir()
    assert "rlx.thunks" in whole and "segment0" in whole
    assert "t0_elementwise_region" in prog.llvm_ir(optimized=True)
    asm = prog.asm(thunk=0)
    assert asm.startswith("t0_elementwise_region.body:") and "ret" in asm


def test_threads_share_one_program(prog):
    arenas = [fresh_arena(seed) for seed in range(4)]
    errors = []

    def work(a):
        try:
            for _ in range(20):
                prog.run(a)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(a,)) for a in arenas]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for a in arenas:
        np.testing.assert_allclose(a.read(8 * N + 128, "f32", N), expected(a), rtol=1e-5, atol=1e-6)


def test_wrong_arena_is_rejected(prog):
    with pytest.raises(rl.ValidationError, match="needs"):
        prog.run(rl.Arena(16))
    with pytest.raises(rl.ValidationError, match="aligned"):
        prog.run(np.zeros(gelu_schedule().arena_bytes + 64, np.uint8)[1:gelu_schedule().arena_bytes + 1])
    with pytest.raises(rl.ValidationError):
        prog.run(np.zeros(10, np.float32))


def test_validation_error_names_index_kind_field_and_bound():
    bad = T.Copy(src=0, dst=64, len=1000)
    sched = rl.ThunkSchedule([T.Copy(src=0, dst=64, len=1), bad], arena_bytes=128)
    with pytest.raises(rl.ValidationError) as e:
        rl.compile(sched, cache=False)
    msg = str(e.value)
    assert e.value.index == 1 and e.value.kind == "Copy" and e.value.field in ("src", "dst")
    assert "thunk 1" in msg and "Copy" in msg and "128" in msg


def test_partial_overlap_is_rejected():
    t = T.Copy(src=0, dst=8, len=16)
    with pytest.raises(rl.ValidationError, match="overlap"):
        rl.compile(rl.ThunkSchedule([t], arena_bytes=256), cache=False)


def test_unsupported_thunks_are_all_listed(monkeypatch):
    from rlx_llvm import registry
    registry.load_all()
    monkeypatch.delitem(registry.LOWERINGS, T.Copy)
    sched = rl.ThunkSchedule([T.Copy(src=0, dst=64, len=1), T.Nop(), T.Copy(src=0, dst=128, len=1)],
                             arena_bytes=256)
    with pytest.raises(rl.UnsupportedThunkError) as e:
        rl.compile(sched, cache=False)
    assert e.value.missing == [(0, "Copy"), (2, "Copy")]


def test_empty_schedule_runs():
    prog = rl.compile(rl.ThunkSchedule([], arena_bytes=0), cache=False)
    prog.run(rl.Arena(0))
    assert prog.report().rows == []


def test_coverage_lists_every_kind():
    cov = rl.coverage()
    assert len(cov) == 196
    assert set(cov.values()) <= {"llvm", "blas", "llvm|blas", "llvm|c|python", "scipy", "missing"}
    assert cov["ElementwiseRegion"] == "llvm"


def test_second_compile_in_a_fresh_process_hits_the_cache(tmp_path):
    """A second compile of the same schedule in a new process loads the cached object, and runs."""
    script = textwrap.dedent("""
        import json, sys, time
        t0 = time.perf_counter()
        import rlx_llvm as rl
        from rlx_llvm.demo import build
        sched, _ = build(256, 768)
        t1 = time.perf_counter()
        prog = rl.compile(sched)
        t2 = time.perf_counter()
        arena = rl.Arena(sched.arena_bytes)
        prog.run(arena)  # a warm start must resolve BLAS, libgomp and rlx_num_threads itself
        print(json.dumps({"compile_ms": (t2 - t1) * 1e3, "hit": prog.report().from_cache}))
        """)
    env = dict(os.environ, RLX_LLVM_CACHE_DIR=str(tmp_path), RLX_LLVM_CACHE="1",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    import json
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                             timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert not runs[0]["hit"] and runs[1]["hit"]
    # The speed-up is measured and printed, not asserted (timings are not tested): see docs.
    print(f"cold {runs[0]['compile_ms']:.1f} ms, warm {runs[1]['compile_ms']:.1f} ms, "
          f"{runs[0]['compile_ms'] / runs[1]['compile_ms']:.0f}x")


def test_execution_error_names_thunk_and_meaning():
    """A singular solve fails at run time with the thunk index, kind and what LAPACK said."""
    sched = rl.ThunkSchedule([T.Copy(src=0, dst=64, len=4), T.DenseSolveF32(a=128, b=256, x=512, n=3, nrhs=1)],
                             arena_bytes=1024)
    with pytest.raises(rl.ExecutionError, match=r"thunk 1 DenseSolveF32: .*singular") as e:
        rl.compile(sched, cache=False).run(rl.Arena(1024))
    assert e.value.index == 1 and e.value.status == 1


# ── the scratch every Program on a thread shares ──

def sgemm_case(m: int, k: int, n: int, seed: int) -> tuple[rl.ThunkSchedule, rl.Arena, np.ndarray]:
    """C = A·B on a fresh arena; returns the schedule, the arena and the float64 product."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    a_off, b_off, c_off = 0, 4 * m * k, 4 * (m * k + k * n)
    sched = rl.ThunkSchedule([T.Sgemm(a=a_off, b=b_off, c=c_off, m=m, k=k, n=n)], arena_bytes=4 * (m * k + k * n + m * n))
    arena = rl.Arena(sched.arena_bytes)
    arena.write(a_off, a)
    arena.write(b_off, b)
    return sched, arena, a.astype(np.float64) @ b.astype(np.float64)


def product(sched: rl.ThunkSchedule, arena: rl.Arena) -> np.ndarray:
    t = sched.thunks[-1]
    return arena.read(t.c, "f32", (t.m, t.n))


def test_programs_on_one_thread_share_a_scratch_buffer_grown_to_the_largest():
    from rlx_llvm import program as program_module
    # more than gemm.B_IN_PLACE_MAX_ROWS rows: each GEMM packs B into scratch
    cases = [sgemm_case(300, 64, 64, 1), sgemm_case(296, 80, 112, 2), sgemm_case(261, 17, 65, 3)]
    progs = [rl.compile(s, cache=False) for s, _, _ in cases]
    assert all(p.scratch_bytes for p in progs)
    program_module.release_scratch()
    for _ in range(2):
        for p, (sched, arena, want) in zip(progs, cases):
            arena.write(sched.thunks[0].c, np.full(want.shape, np.nan, np.float32))
            p.run(arena)
            np.testing.assert_allclose(product(sched, arena), want, rtol=1e-4, atol=1e-4)
    assert program_module._scratch.nbytes == max(p.scratch_bytes for p in progs)
    program_module.release_scratch()
    assert program_module._scratch.nbytes == 0


def test_a_run_nested_in_a_python_step_gets_its_own_scratch():
    inner_sched, inner_arena, inner_want = sgemm_case(400, 400, 400, 4)   # packs B (> 256 rows)
    inner = rl.compile(inner_sched, cache=False)

    from rlx_llvm import program as program_module
    shared_seen = []

    def run_inner(inputs, out, attrs) -> None:
        held = (program_module._scratch.address, program_module._scratch.nbytes)
        inner.run(inner_arena)                       # nested: the outer run holds the shared buffer
        shared_seen.append((held, (program_module._scratch.address, program_module._scratch.nbytes)))
        out[:] = product(inner_sched, inner_arena).ravel()[:out.size]

    rl.register_custom_op("test_program_nested_run", run_inner, replace=True)
    m = 264   # > gemm.B_IN_PLACE_MAX_ROWS: packs B into scratch
    first, arena, want = sgemm_case(m, m, m, 5)
    gemm = first.thunks[0]
    side = 4 * 3 * m * m
    again = T.Sgemm(a=gemm.a, b=gemm.b, c=side, m=m, k=m, n=m)
    nested = T.CustomOp(kernel="test_program_nested_run", inputs=((gemm.c, 16, (16,)),),
                        output=(side + 4 * m * m, 16, (16,)), attrs=())
    sched = rl.ThunkSchedule([gemm, nested, again], arena_bytes=side + 4 * m * m + 64)
    big = rl.Arena(sched.arena_bytes)
    big.write(0, arena.read(0, "u8", (4 * 2 * m * m,)))
    outer = rl.compile(sched, cache=False)
    assert 0 < outer.scratch_bytes < inner.scratch_bytes   # a nested grow would free the outer run's buffer
    program_module.release_scratch()
    outer.run(big)
    assert len(shared_seen) == 1 and shared_seen[0][0] == shared_seen[0][1] and shared_seen[0][0][1] == outer.scratch_bytes
    np.testing.assert_allclose(big.read(gemm.c, "f32", (m, m)), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(big.read(side, "f32", (m, m)), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(big.read(side + 4 * m * m, "f32", (16,)), inner_want.ravel()[:16], rtol=1e-4, atol=1e-4)


def test_threads_running_programs_at_once_use_their_own_scratch():
    cases = [sgemm_case(96, 80, 112, 10 + i) for i in range(4)]
    prog = rl.compile(cases[0][0], cache=False)
    errors = []

    def work(i: int) -> None:
        sched, arena, want = cases[i]
        for _ in range(30):
            prog.run(arena)
            if not np.allclose(product(sched, arena), want, rtol=1e-4, atol=1e-4):
                errors.append(i)
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
