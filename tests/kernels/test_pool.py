"""rlx_llvm's thread pool (`kernels.pool`) and the regions `ir_emit.parallel` emits on it: every chunk
runs exactly once, each slot is used by one thread at a time, a region inside a region or one whose
body calls BLAS runs inline, two Python threads and a spinning neighbour neither hang nor break it,
and a forked child gets a pool of its own.  Anything that could hang runs in a subprocess under a timeout."""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from llvmlite import ir

import rlx_llvm as rl
import rlx_llvm.ir_emit.gemm  # noqa: F401  (registers the lowerings)
from rlx_llvm import jit
from rlx_llvm import thunks as T
from rlx_llvm.ir_emit import parallel
from rlx_llvm.ir_emit.context import EmitContext
from rlx_llvm.ir_emit.toolkit import I32, I64, PTR
from rlx_llvm.kernels import pool
from tests.harness import num_threads

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHUNKS, SLOTS = 37, 8
# the driver's data: i64 runs[CHUNKS], i64 in_use[SLOTS], i64 faults
RUNS, IN_USE, FAULTS = 0, 8 * CHUNKS, 8 * (CHUNKS + SLOTS)
DATA_BYTES = FAULTS + 8


# ── the runtime alone: a JIT-compiled driver forks many tiny regions back to back ──

def _i64_at(b: ir.IRBuilder, data: ir.Value, offset: int, index: "ir.Value | int" = 0) -> ir.Value:
    return b.gep(data, [b.add(I64(offset), b.mul(I64(index) if isinstance(index, int) else index, I64(8)))],
                 source_etype=ir.IntType(8))


def _driver():
    """`drive(data, regions, threads)`: `regions` forks of CHUNKS chunks; each chunk counts itself in
    `runs` and counts a fault if its slot is ≥ threads or another thread is using the slot."""
    pool.register_runtime()
    module = ir.Module("pool_test")
    module.triple = jit.host().triple
    body = ir.Function(module, pool.BODY, "body")
    data, chunk, slot = body.args
    b = ir.IRBuilder(body.append_basic_block("entry"))
    in_use = _i64_at(b, data, IN_USE, slot)
    clash = b.icmp_unsigned("!=", b.atomic_rmw("xchg", in_use, I64(1), "acq_rel"), I64(0))
    with b.if_then(b.or_(clash, b.icmp_unsigned(">=", slot, I64(SLOTS)))):
        b.atomic_rmw("add", _i64_at(b, data, FAULTS), I64(1), "monotonic")
    b.atomic_rmw("add", _i64_at(b, data, RUNS, chunk), I64(1), "monotonic")
    b.atomic_rmw("xchg", in_use, I64(0), "acq_rel")
    b.ret_void()

    drive = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]), "drive")
    data, regions, threads = drive.args
    b = ir.IRBuilder(drive.append_basic_block("entry"))
    fork = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64]), pool.FORK_SYMBOL)
    head, step, out = (drive.append_basic_block(n) for n in ("head", "step", "out"))
    entry = b.block
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64)
    i.add_incoming(I64(0), entry)
    b.cbranch(b.icmp_unsigned("<", i, regions), step, out)
    b.position_at_end(step)
    b.call(fork, [body, data, I64(CHUNKS), threads])
    i.add_incoming(b.add(i, I64(1)), step)
    b.branch(head)
    b.position_at_end(out)
    b.ret_void()
    engine = jit.Engine()
    engine.load(jit.compile_ir(str(module)))
    run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(engine.address("drive"))
    run.engine = engine
    return run


def stress(regions: int, threads: int, callers: int) -> None:
    """`callers` Python threads at once, each forking `regions` regions on `threads` threads; every
    chunk must have run exactly once per region, with no slot fault."""
    drive = _driver()
    datas = [np.zeros(DATA_BYTES // 8, np.int64) for _ in range(callers)]
    workers = [threading.Thread(target=drive, args=(d.ctypes.data, regions, threads)) for d in datas]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for d in datas:
        assert (d[:CHUNKS] == regions).all(), d[:CHUNKS]
        assert d[-1] == 0, f"{d[-1]} slot faults"
    assert 1 <= pool.workers() <= threads - 1


def _in_subprocess(code: str, neighbour: bool = False, timeout: float = 120) -> None:
    """Run `code` in a fresh interpreter (optionally beside a spinning process); it must finish in time."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if neighbour else None
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=timeout, capture_output=True, text=True)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    assert done.returncode == 0, done.stderr[-3000:]


def test_every_chunk_runs_once_on_its_own_slot() -> None:
    stress(regions=300, threads=4, callers=1)


@pytest.mark.parametrize("neighbour", [False, True], ids=["quiet", "spinning neighbour"])
def test_two_python_threads_fork_tiny_regions_back_to_back(neighbour: bool) -> None:
    _in_subprocess("from tests.kernels.test_pool import stress; stress(regions=20000, threads=3, callers=2)",
                   neighbour=neighbour)


def test_a_region_on_one_thread_starts_no_worker() -> None:
    _in_subprocess("from tests.kernels.test_pool import _driver, DATA_BYTES, CHUNKS; import numpy as np\n"
                   "from rlx_llvm.kernels import pool\n"
                   "d = np.zeros(DATA_BYTES // 8, np.int64); _driver()(d.ctypes.data, 50, 1)\n"
                   "assert (d[:CHUNKS] == 50).all() and d[-1] == 0 and pool.workers() == 0")


# ── regions as `ir_emit.parallel` emits them ────────────────────────────────

def _kernel(emit) -> tuple[object, str]:
    """JIT `emit(ctx)` as `i32 kernel(ptr arena, ptr scratch)`; returns `(run(arena), IR text)`."""
    module = ir.Module("parallel_test")
    module.triple = jit.host().triple
    fn = ir.Function(module, ir.FunctionType(I32, [PTR, PTR]), name="kernel")

    def declare(name: str, fnty: ir.FunctionType) -> ir.Function:
        return module.globals.get(name) or ir.Function(module, fnty, name=name)

    ctx = EmitContext(module, fn, 0, None, None, 8, declare)
    emit(ctx)
    ctx.finish()
    engine = jit.Engine()
    engine.load(jit.compile_ir(str(module)))
    kernel = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p)(engine.address("kernel"))
    scratch = np.zeros(max(64, ctx.scratch_bytes), np.uint8)

    def run(arena: np.ndarray) -> int:
        run.engine = engine
        return kernel(arena.ctypes.data, scratch.ctypes.data)
    return run, str(module)


N = 1000


def _count_items(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
    """counts[i] += 1 for i in [start, stop) (i32 counts at arena offset 0)."""
    with sub.for_range(start, stop, name="i") as i:
        sub.b.atomic_rmw("add", sub.addr(0, i, 4), I32(1), "monotonic")


def _nested(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
    """Rows of 10 items: each row's items by a parallel_for of its own."""
    with sub.for_range(start, stop, name="row") as row:
        def items(inner: EmitContext, lo: ir.Value, hi: ir.Value) -> None:
            base = inner.b.mul(row, I64(10))
            _count_items(inner, inner.b.add(base, lo), inner.b.add(base, hi))
        sub.parallel_for(10, items, grain=1, min_work=1)


def _blas_noted(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
    _count_items(sub, start, stop)
    sub.note_path("blas")  # as if the body called ?gemm


@pytest.mark.parametrize("body, n, forks", [(_count_items, N, 1), (_nested, N // 10, 1), (_blas_noted, N, 0)],
                         ids=["flat", "nested runs inline", "blas body runs inline"])
def test_emitted_regions_cover_every_item_once(body, n: int, forks: int) -> None:
    run, text = _kernel(lambda ctx: ctx.parallel_for(n, body, grain=1, min_work=1))
    assert text.count(f'call void @"{parallel.fork_symbol()}"(') == forks
    for threads in (1, 2):
        arena = np.zeros(N, np.int32)
        with num_threads(threads):
            assert run(arena) == 0
        assert (arena == 1).all(), (threads, np.flatnonzero(arena != 1)[:8])


def _record_range(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
    """Append (start, stop) to the i64 list at arena offset 8 (its length, an i64, at offset 0)."""
    b = sub.b
    at = b.atomic_rmw("add", sub.addr(0, I64(0), 8), I64(1), "monotonic")
    slot = b.add(I64(1), b.mul(at, I64(2)))
    b.store(start, sub.addr(0, slot, 8))
    b.store(stop, sub.addr(0, b.add(slot, I64(1)), 8))


@pytest.mark.parametrize("n, grain", [(1, 1), (7, 1), (8, 1), (36, 1), (100, 3), (65, 64), (1000, 16)])
def test_chunks_are_near_equal_runs_of_whole_grains(n: int, grain: int) -> None:
    """The chunks partition [0, n) in whole grains (the last clipped to n), as many as pieces of
    ⌈units / (4·threads)⌉ units make, their unit counts differing by one at most: no short last chunk
    idles a thread at the join."""
    run, _ = _kernel(lambda ctx: ctx.parallel_for(n, _record_range, grain=grain, min_work=1))
    units = -(-n // grain)
    for threads in (1, 2):
        arena = np.zeros(1 + 2 * 64, np.int64)
        with num_threads(threads):
            assert run(arena) == 0
        ranges = sorted(map(tuple, arena[1:1 + 2 * arena[0]].reshape(-1, 2)))
        assert [r[0] for r in ranges] == [0] + [r[1] for r in ranges[:-1]] and ranges[-1][1] == n, ranges
        assert all(start % grain == 0 for start, _ in ranges), ranges
        sizes = [-(-(stop - start) // grain) for start, stop in ranges]
        forked = threads > 1 and pool.MAX_THREADS > 1 and units > 1
        pieces = parallel.CHUNKS_PER_THREAD * min(threads, pool.MAX_THREADS)
        chunks = -(-units // -(-units // pieces))   # as many as pieces of ⌈units / pieces⌉ units make
        # (a pool backing off from a busy neighbour runs the region as one chunk)
        assert len(ranges) in ({1, chunks} if forked else {1}), ranges
        assert max(sizes) - min(sizes) <= 1, sizes


# ── compiled programs: two Python threads at once, and a forked child ───────

def _gemm_program():
    """A schedule of four IR-tile GEMMs that each fork (`tests/ir_emit/test_gemm.py` parallel shapes)."""
    rng = np.random.default_rng(0)
    m, k, n = 64, 512, 200
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    arena = np.zeros((a.size + b.size + 4 * m * n) * 4, np.uint8)
    arena[:a.nbytes] = a.view(np.uint8).ravel()
    arena[a.nbytes:a.nbytes + b.nbytes] = b.view(np.uint8).ravel()
    c0 = a.nbytes + b.nbytes
    thunks = [T.Sgemm(a=0, b=a.nbytes, c=c0 + i * 4 * m * n, m=m, k=k, n=n) for i in range(4)]
    program = rl.compile(rl.ThunkSchedule(thunks=tuple(thunks), arena_bytes=arena.size), cache=False)
    assert parallel.fork_symbol() in program.llvm_ir()
    return program, arena


def _run(program, before: np.ndarray, times: int = 1) -> np.ndarray:
    arena = rl.Arena(before.size)
    for _ in range(times):
        arena.bytes[:] = before
        program.run(arena)
    return arena.bytes.copy()


def test_two_python_threads_run_one_program_at_once() -> None:
    program, before = _gemm_program()
    with num_threads(1):
        want = _run(program, before)
    got = {}
    with num_threads(2):
        callers = [threading.Thread(target=lambda k=k: got.__setitem__(k, _run(program, before, 20))) for k in range(2)]
        for t in callers:
            t.start()
        for t in callers:
            t.join(timeout=300)
    assert all((got[k] == want).all() for k in range(2))


def _child(conn, program, before) -> None:
    fresh = pool.workers()
    with num_threads(2):
        conn.send((fresh, _run(program, before), pool.workers()))


def test_a_forked_child_gets_a_pool_of_its_own() -> None:
    """The child runs the parent's program (inherited, not recompiled) on a pool of its own."""
    program, before = _gemm_program()
    with num_threads(2):
        want = _run(program, before)
    assert pool.workers() >= min(1, pool.MAX_THREADS - 1)
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_child, args=(there, program, before))
    child.start()
    assert here.poll(300), "the forked child hung"
    fresh, got, after = here.recv()
    child.join(60)
    assert child.exitcode == 0
    assert fresh == 0 and (got == want).all()
    assert after == min(1, pool.MAX_THREADS - 1)


# ── counters, and a worker that leaves its caller's CPU ─────────────────────

def test_stats_count_regions_and_chunks() -> None:
    """`pool.stats()`: every region forked on the pool and its chunks, the caller's among them."""
    program, before = _gemm_program()
    with num_threads(2):
        s0 = pool.stats()
        _run(program, before, 5)
        s1 = pool.stats()
    if pool.MAX_THREADS > 1:
        regions, chunks = s1["regions"] - s0["regions"], s1["chunks"] - s0["chunks"]
        # on a busy machine (CI's other test worker) the pool may back off: those regions run as one thread
        told_one = s1["backed_off"] - s0["backed_off"]
        assert regions + told_one >= 5 * 4 and chunks >= 2 * regions
        assert 0 <= s1["caller_chunks"] - s0["caller_chunks"] <= chunks
        assert s1["arrivals"] - s0["arrivals"] <= regions


def _allowed_cpus_of_every_thread(settled: "set[str] | None" = None) -> set[str]:
    """The distinct `Cpus_allowed_list` lines of this process's threads; given `settled`, wait up to
    a second for them to equal it (a worker descheduled in the middle of a move restores its set
    when it runs again)."""
    for _ in range(100):
        lines = _allowed_lines()
        if settled is None or lines == settled:
            break
        time.sleep(0.01)
    return lines


def _allowed_lines() -> set[str]:
    here = f"/proc/{os.getpid()}/task"
    lines = set()
    for tid in os.listdir(here):
        with open(f"{here}/{tid}/status") as fh:
            lines |= {line for line in fh if line.startswith("Cpus_allowed_list")}
    return lines


def test_workers_keep_their_affinity_after_moving() -> None:
    """Regions after sleeps (each wakes the worker, which may move off the caller's CPU) leave every
    thread allowed on the CPUs the process is allowed on."""
    _in_subprocess("import time\n"
                   "import numpy as np\n"
                   "from tests.kernels.test_pool import _driver, _allowed_cpus_of_every_thread, DATA_BYTES, CHUNKS\n"
                   "want = _allowed_cpus_of_every_thread()\n"
                   "drive, d = _driver(), np.zeros(DATA_BYTES // 8, np.int64)\n"
                   "for _ in range(30):\n"
                   "    drive(d.ctypes.data, 20, 2); time.sleep(0.005)\n"
                   "assert (d[:CHUNKS] == 600).all() and d[-1] == 0\n"
                   "got = _allowed_cpus_of_every_thread(want)\n"
                   "assert got == want, (got, want)")


def test_regions_finish_on_a_single_cpu() -> None:
    """Confined to one CPU (the workers inherit it), regions at 2 threads still finish with one
    thread's output: a worker that cannot leave the caller's CPU stays."""
    _in_subprocess("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
                   "from tests.kernels.test_pool import _gemm_program, _run\n"
                   "from tests.harness import num_threads\n"
                   "program, before = _gemm_program()\n"
                   "with num_threads(1): want = _run(program, before)\n"
                   "with num_threads(2): got = _run(program, before, 50)\n"
                   "assert (got == want).all()")


def test_a_narrowing_after_the_workers_started_is_kept() -> None:
    """`taskset -a`-style: every thread confined to one CPU after the workers started; later wake-ups
    put the worker beside its caller, and it must not widen its affinity again to leave."""
    _in_subprocess("import os, time\n"
                   "import numpy as np\n"
                   "from tests.kernels.test_pool import _driver, _allowed_cpus_of_every_thread, DATA_BYTES, CHUNKS\n"
                   "drive, d = _driver(), np.zeros(DATA_BYTES // 8, np.int64)\n"
                   "drive(d.ctypes.data, 20, 2); time.sleep(0.05)  # the worker asleep, not mid-move\n"
                   "one = {min(os.sched_getaffinity(0))}\n"
                   "for tid in os.listdir(f'/proc/{os.getpid()}/task'): os.sched_setaffinity(int(tid), one)\n"
                   "want = _allowed_cpus_of_every_thread()\n"
                   "for _ in range(20):\n"
                   "    drive(d.ctypes.data, 20, 2); time.sleep(0.005)\n"
                   "assert (d[:CHUNKS] == 420).all() and d[-1] == 0\n"
                   "got = _allowed_cpus_of_every_thread(want)\n"
                   "assert len(want) == 1 and got == want, got")


# ── backing off from a busy neighbour ──────────────────────────────────────

BACKOFF_SCRIPT = r"""
import ctypes, time
from llvmlite import ir
from rlx_llvm import jit
from rlx_llvm.kernels import pool

# A body whose chunks run long on a worker (slot > 0: usleep 3 ms), as a preempted worker's chunk does.
pool.register_runtime()
module = ir.Module("backoff_test")
module.triple = jit.host().triple
I64, PTR = ir.IntType(64), ir.PointerType()
body = ir.Function(module, pool.BODY, "body")
data, chunk, slot = body.args
b = ir.IRBuilder(body.append_basic_block("entry"))
with b.if_then(b.icmp_unsigned("!=", slot, I64(0))):
    b.call(ir.Function(module, ir.FunctionType(ir.IntType(32), [ir.IntType(32)]), "usleep"), [ir.IntType(32)(3000)])
b.ret_void()
drive = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "drive")
b = ir.IRBuilder(drive.append_basic_block("entry"))
fork = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64]), pool.FORK_SYMBOL)
b.call(fork, [body, ir.Constant(PTR, None), I64(64), I64(2)])
b.ret_void()
engine = jit.Engine()
engine.load(jit.compile_ir(str(module)))
run = ctypes.CFUNCTYPE(None)(engine.address("drive"))
threads_now = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(pool._native_address(pool.THREADS_SYMBOL))

assert threads_now(2) == 2 and threads_now(1) == 1
deadline = time.monotonic() + 60
while time.monotonic() < deadline and not pool.stats()["slow_joins"]:   # a worker held a join up (a
    run()                                                              # loaded host may keep it off a CPU)
assert pool.stats()["slow_joins"] == 1 and threads_now(2) == 2   # an isolated slow join: no back-off yet
told_one = False
while time.monotonic() < deadline:         # a second one soon after: regions are told to run alone
    run()
    if threads_now(2) == 1:
        told_one = True
        break
stats = pool.stats()
assert told_one and stats["slow_joins"] >= 2 and stats["backed_off"] >= 1, stats
deadline = time.monotonic() + 30
while threads_now(2) == 1 and time.monotonic() < deadline:    # the window ends (≤ 2**8 × BACKOFF_CYCLES)
    time.sleep(0.005)
assert threads_now(2) == 2
print("ok", stats["slow_joins"])
"""


@pytest.mark.skipif(pool.MAX_THREADS < 2, reason="needs 2 CPUs for a worker")
def test_a_join_held_up_by_a_worker_backs_regions_off_to_one_thread_for_a_while() -> None:
    """A worker holding a chunk long past the caller's own (a neighbour preempted it) makes
    `rlx_threads_now` answer 1 — the next regions run as one thread — until the window ends."""
    out = subprocess.run([sys.executable, "-c", BACKOFF_SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-3000:]


def test_a_reserved_core_is_left_to_background_work() -> None:
    """`reserve_core()`: while a background compile runs, regions ask for at most cores − 1 threads."""
    pool.register_runtime()
    threads_now = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(pool._native_address(pool.THREADS_SYMBOL))
    cores = pool.MAX_THREADS
    if threads_now(cores) != cores:
        pytest.skip("the pool is backing off from a busy neighbour in this process")
    with pool.reserve_core():
        assert threads_now(cores) == max(1, cores - 1) and threads_now(1) == 1
        with pool.reserve_core():
            assert threads_now(cores) == max(1, cores - 2)
    assert threads_now(cores) == cores and pool.RESERVED.value == 0
