"""rlx_llvm's thread pool: a small runtime written in LLVM IR, compiled once per process (docs/runtime.md).

Emitted code forks a parallel region with `rlx_parallel(fn, data, chunks, threads)`, where
`fn(data, chunk, slot)` runs one chunk and `slot` is the per-thread scratch slot it owns while it
runs (0 for the caller, k for worker k).  The contract:

* the calling thread works too: it claims chunks from the shared counter like every worker;
* the join waits only for chunks already claimed — never for a worker that has not arrived (a
  late worker finds the counter exhausted and goes back to waiting);
* workers spin briefly (`WORKER_SPIN_CYCLES`), then sleep on a futex;
* a join held up by a worker's chunk (a busy neighbour preempted it) makes `rlx_threads_now` — which
  emitted regions ask for their thread count — answer 1 for a window that doubles while it recurs;
* a worker that finds itself on the CPU its caller runs on (where a wake-up put it: a host that
  packs wake-ups onto busy vCPUs does so every time) moves to another CPU it may run on before it
  spins or claims there — it narrows its affinity, then restores it; a caller that futex-woke
  sleeping workers yields once, so one queued on its CPU gets to run and move at once;
* one pool per process, grown to `threads - 1` workers on demand (`set_threads` caps it);
* a caller that finds the pool busy (another Python thread's region, or a region inside a region)
  runs every chunk itself; after `fork` the child starts with an empty pool.

State (one word per cache line): `counter` = generation << 32 | next chunk; the job `fn`, `data`,
`total`, `threads`; `done` (chunks finished, the caller's futex); `epoch` and `sleepers` (the
workers' futex); `busy` (who owns the job slot); `started` (workers created); `published` and
`caller_cpu` (when and on which CPU the current job was published); `stats()` reads counters
kept beside them.  A worker claims chunk c of generation g by CAS (g, c) → (g, c+1) only if
c < total; a job's owner first moves the counter to (g+1, CLOSED) — so no CAS expecting
generation g can succeed any more — then writes the job and publishes (g+1, 0).  A successful CAS therefore proves the job it read was generation g's,
which is not replaced before every claimed chunk of g has finished.

The thread count native code reads (`@rlx_num_threads`) lives here too.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from typing import Iterator

import llvmlite.binding as llvm
from llvmlite import ir

MAX_THREADS = max(1, os.cpu_count() or 1)
NUM_THREADS = ctypes.c_int32(MAX_THREADS)  # what @rlx_num_threads points at
RESERVED = ctypes.c_int32(0)  # what @rlx_reserved_threads points at: cores background compiles are using
RESERVED_SYMBOL = "rlx_reserved_threads"

FORK_SYMBOL = "rlx_parallel"  # void (ptr fn, ptr data, i64 chunks, i64 threads)
THREADS_SYMBOL = "rlx_threads_now"  # i64 (i64 want): 1 while backing off from a busy neighbour, else want
WORKER_SPIN_CYCLES = 400_000  # TSC cycles (~0.1 ms) a worker spins for the next job before sleeping
JOIN_SPIN_MIN = 20_000        # the caller spins at least this long (and 2 of its own chunks) for claimed chunks
SLOW_JOIN_CYCLES = 1_000_000  # a join that waited longer than this (~0.25 ms) and 4 of the caller's chunks: a worker was preempted
BACKOFF_CYCLES = 20_000_000   # after a second slow join, regions run on the caller alone for this long (~5 ms) …
BACKOFF_MAX_LEVEL = 8         # … doubled per further slow join within CLEAN_REGIONS pooled regions, up to 2**8 ×
CLEAN_REGIONS = 256           # a slow join more pooled regions than this after the last is isolated: no back-off
CLOSED = 0xFFFF_FFFF          # `next chunk` of a closed generation: above every job's total
_FUTEX = {"x86_64": 202, "aarch64": 98}
_FUTEX_WAIT, _FUTEX_WAKE = 128, 129  # FUTEX_*_PRIVATE

# Counters (`stats()`): the job owner's, then the workers' (each set on its own cache line).
STATS = ("regions", "woke", "chunks", "caller_chunks", "join_cycles", "join_sleeps", "slow_joins")
WORKER_STATS = ("arrivals", "arrival_cycles", "arrivals_on_callers_cpu", "sleeps", "moves", "backed_off")

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
BODY = ir.FunctionType(ir.VoidType(), [PTR, I64, I64])


class _CalleePtr(ir.PointerType):
    """An opaque `ptr` that llvmlite may call: it remembers the function type it points at."""

    def __init__(self, fnty: ir.FunctionType) -> None:
        super().__init__()
        self.pointee = fnty


BODY_PTR = _CalleePtr(BODY)

_lock = threading.RLock()
_runtime = None  # (engine, {name: address}) once built


# ── the runtime module ───────────────────────────────────────────────────────

def _size(ty: ir.Type) -> int:
    return 8 if isinstance(ty, ir.PointerType) else ty.width // 8


class _Runtime:
    """Builds the runtime module: its globals and the helpers every function shares."""

    def __init__(self, arch: str) -> None:
        self.module = ir.Module("rlx_pool")
        self.module.triple = llvm.get_process_triple()
        self.arch = arch
        self.word = {name: self._global(name, ty) for name, ty in (
            ("counter", I64), ("fn", PTR), ("data", PTR), ("total", I64), ("threads", I64),
            ("done", I32), ("waiting", I32), ("epoch", I32), ("sleepers", I32), ("busy", I32),
            ("started", I32), ("published", I64), ("caller_cpu", I32),
            ("alone_until", I64), ("dirty", I64), ("level", I64))}
        self.stats = self._global("stats", ir.ArrayType(I64, len(STATS)))  # the job owner's counters
        self.worker_stats = self._global("worker_stats", ir.ArrayType(I64, len(WORKER_STATS)))

    def _global(self, name: str, ty: ir.Type) -> ir.GlobalVariable:
        g = ir.GlobalVariable(self.module, ty, f"rlx_pool.{name}")
        g.initializer = ir.Constant(ty, None)
        g.linkage, g.align = "internal", 64
        return g

    def declare(self, name: str, ty: ir.FunctionType) -> ir.Function:
        return self.module.globals.get(name) or ir.Function(self.module, ty, name)

    # small helpers on a builder
    def load(self, b: ir.IRBuilder, name: str, order: str = "acquire") -> ir.Value:
        g = self.word[name]
        return b.load_atomic(g, order, _size(g.value_type), typ=BODY_PTR if name == "fn" else g.value_type)

    def store(self, b: ir.IRBuilder, name: str, value: ir.Value, order: str = "release") -> None:
        g = self.word[name]  # (IRBuilder.store_atomic wants a typed pointer)
        b._insert(ir.instructions.StoreAtomicInstr(b.block, value, g, order, _size(g.value_type)))

    def count(self, b: ir.IRBuilder, stat: str, value: ir.Value) -> None:
        """Add `value` to the counter `stat`: one of `STATS`, which only the job's owner writes (a
        plain load and store), or of `WORKER_STATS` (an atomic add: workers share them)."""
        if stat in STATS:
            at = b.gep(self.stats, [I32(0), I32(STATS.index(stat))], inbounds=True)
            old = b.load_atomic(at, "monotonic", 8, typ=I64)
            b._insert(ir.instructions.StoreAtomicInstr(b.block, b.add(old, value), at, "monotonic", 8))
        else:
            at = b.gep(self.worker_stats, [I32(0), I32(WORKER_STATS.index(stat))], inbounds=True)
            b.atomic_rmw("add", at, value, "monotonic")

    def cpu(self, b: ir.IRBuilder) -> ir.Value:
        return b.call(self.declare("sched_getcpu", ir.FunctionType(I32, [])), [])

    def cycles(self, b: ir.IRBuilder) -> ir.Value:
        return b.call(self.declare("llvm.readcyclecounter", ir.FunctionType(I64, [])), [])

    def pause(self, b: ir.IRBuilder) -> None:
        if self.arch == "x86_64":
            b.call(self.declare("llvm.x86.sse2.pause", ir.FunctionType(ir.VoidType(), [])), [])
        else:
            b.call(self.declare("sched_yield", ir.FunctionType(I32, [])), [])

    def futex(self, b: ir.IRBuilder, name: str, op: int, value: ir.Value) -> None:
        syscall = self.declare("syscall", ir.FunctionType(I64, [I64], var_arg=True))
        b.call(syscall, [I64(_FUTEX[self.arch]), self.word[name], I64(op), b.zext(value, I64)
                         if value.type == I32 else value, ir.Constant(PTR, None), ir.Constant(PTR, None), I64(0)])


def _function(rt: _Runtime, name: str, ty: ir.FunctionType,
              linkage: str = "external") -> tuple[ir.Function, ir.IRBuilder]:
    fn = ir.Function(rt.module, ty, name)
    fn.linkage = linkage
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


def _run_inline(rt: _Runtime) -> ir.Function:
    """`rlx_pool.inline(fn, data, total)`: every chunk on the calling thread, slot 0."""
    f, b = _function(rt, "rlx_pool.inline", ir.FunctionType(ir.VoidType(), [BODY_PTR, PTR, I64]), "internal")
    body, data, total = f.args
    _chunk_loop(b, lambda c: c, total, body, data)
    b.ret_void()
    return f


def _chunk_loop(b: ir.IRBuilder, next_chunk, total: ir.Value, body: ir.Value, data: ir.Value) -> ir.Value:
    """Run `body(data, chunk, 0)` for `chunk = next_chunk(i)`, i = 0, 1, … while `chunk < total`;
    leaves `b` after the loop and returns how many chunks ran."""
    f = b.function
    head, step, out = (f.append_basic_block(n) for n in ("head", "step", "out"))
    entry = b.block
    b.branch(head)
    b.position_at_end(head)
    ran = b.phi(I64)
    ran.add_incoming(I64(0), entry)
    chunk = next_chunk(ran)
    b.cbranch(b.icmp_unsigned("<", chunk, total), step, out)
    b.position_at_end(step)
    b.call(body, [data, chunk, I64(0)])
    ran.add_incoming(b.add(ran, I64(1)), step)
    b.branch(head)
    b.position_at_end(out)
    return ran


def _pause_or(rt: _Runtime, b: ir.IRBuilder, early: ir.Value, retry: ir.Block, give_up: ir.Block) -> None:
    """While `early`, pause and go back to `retry`; else go on to `give_up` (a spin with a deadline)."""
    relax = b.function.append_basic_block("relax")
    b.cbranch(early, relax, give_up)
    b.position_at_end(relax)
    rt.pause(b)
    b.branch(retry)


def _finish_chunk(rt: _Runtime, b: ir.IRBuilder, count: ir.Value, total: ir.Value) -> ir.Value:
    """Add `count` finished chunks to `done`; wake a sleeping caller when that completes the job.
    Returns whether it did."""
    now = b.add(b.atomic_rmw("add", rt.word["done"], count, "seq_cst"), count)
    complete = b.icmp_unsigned("==", b.zext(now, I64), total)
    with b.if_then(complete):
        with b.if_then(b.icmp_unsigned("!=", rt.load(b, "waiting", "seq_cst"), I32(0))):
            rt.futex(b, "done", _FUTEX_WAKE, I32(1))
    return complete


CPU_SET = ir.ArrayType(I64, 16)  # cpu_set_t: 1024 CPUs


def _affinity(rt: _Runtime, b: ir.IRBuilder, call: str, mask: ir.Value) -> None:
    """`sched_getaffinity` / `sched_setaffinity` of the calling thread with `mask` (a CPU_SET)."""
    fn = rt.declare(call, ir.FunctionType(I32, [I32, I64, PTR]))
    b.call(fn, [I32(0), I64(CPU_SET.count * 8), mask])


def _cpu_count(rt: _Runtime, b: ir.IRBuilder, mask: ir.Value) -> ir.Value:
    """How many CPUs `mask` (a CPU_SET) holds."""
    ctpop = rt.declare("llvm.ctpop.i64", ir.FunctionType(I64, [I64]))
    words = [b.load(b.gep(mask, [I32(0), I32(i)], inbounds=True), typ=I64) for i in range(CPU_SET.count)]
    total = I64(0)
    for w in words:
        total = b.add(total, b.call(ctpop, [w]))
    return total


def _leave_callers_cpu(rt: _Runtime, b: ir.IRBuilder, allowed: ir.Value, elsewhere: ir.Value,
                       spread: ir.Value) -> None:
    """If this worker runs on the CPU the job's caller runs on (a wake-up placed it there) and
    `spread` (it could run on another when it started), move: read its affinity into `allowed`
    (someone may have changed it since), narrow it to that minus this CPU, then give `allowed` back
    (the thread stays where it was moved; the affinity is not left narrowed; with no other CPU
    allowed any more, the narrowing fails and it stays)."""
    cpu = rt.cpu(b)
    same = b.icmp_signed("==", cpu, rt.load(b, "caller_cpu", "monotonic"))
    in_set = b.icmp_unsigned("<", cpu, I32(CPU_SET.count * 64))   # a bit of CPU_SET (sched_getcpu's −1 is not)
    with b.if_then(b.and_(spread, b.and_(same, in_set))):
        _affinity(rt, b, "sched_getaffinity", allowed)
        b.store(b.load(allowed, typ=CPU_SET), elsewhere)
        word = b.gep(elsewhere, [I32(0), b.lshr(cpu, I32(6))], inbounds=True)
        bit = b.shl(I64(1), b.zext(b.and_(cpu, I32(63)), I64))
        b.store(b.and_(b.load(word, typ=I64), b.not_(bit)), word)
        _affinity(rt, b, "sched_setaffinity", elsewhere)
        _affinity(rt, b, "sched_setaffinity", allowed)
        rt.count(b, "moves", I64(1))


def _worker(rt: _Runtime) -> ir.Function:
    """`rlx_pool.worker(k)`: wait for a job (spin, then futex; off the caller's CPU), claim its chunks
    by CAS, repeat."""
    f, b = _function(rt, "rlx_pool.worker", ir.FunctionType(PTR, [PTR]), "internal")
    k = b.ptrtoint(f.args[0], I64)
    joined = b.alloca(I64)  # the last generation this worker ran a chunk of
    b.store(I64(CLOSED << 32), joined)
    allowed, elsewhere = b.alloca(CPU_SET), b.alloca(CPU_SET)
    b.store(ir.Constant(CPU_SET, None), allowed)   # a failed read (more CPUs than CPU_SET holds) counts none
    _affinity(rt, b, "sched_getaffinity", allowed)
    spread = b.icmp_unsigned(">", _cpu_count(rt, b, allowed), I64(1))
    top, spin, idle, sleep, claim, run = (f.append_basic_block(n)
                                          for n in ("top", "spin", "idle", "sleep", "claim", "run"))
    b.branch(top)

    def has_work(cnt: ir.Value) -> ir.Value:
        low = b.and_(cnt, I64(CLOSED))
        return b.and_(b.icmp_unsigned("<", low, rt.load(b, "total", "monotonic")),
                      b.icmp_unsigned("<", k, rt.load(b, "threads", "monotonic")))

    b.position_at_end(top)
    t0 = rt.cycles(b)
    b.branch(spin)

    b.position_at_end(spin)
    cnt = rt.load(b, "counter")
    b.cbranch(has_work(cnt), claim, idle)

    b.position_at_end(idle)
    _leave_callers_cpu(rt, b, allowed, elsewhere, spread)
    _pause_or(rt, b, b.icmp_unsigned("<", b.sub(rt.cycles(b), t0), I64(WORKER_SPIN_CYCLES)), spin, sleep)

    # Sleep: read the epoch, count ourselves asleep, look once more (a caller publishing now sees
    # sleepers > 0 and bumps the epoch, so the futex wait returns at once), then wait.
    b.position_at_end(sleep)
    epoch = rt.load(b, "epoch", "seq_cst")
    b.atomic_rmw("add", rt.word["sleepers"], I32(1), "seq_cst")
    again = rt.load(b, "counter", "seq_cst")
    work = has_work(again)
    with b.if_then(b.not_(work)):
        rt.futex(b, "epoch", _FUTEX_WAIT, epoch)
        rt.count(b, "sleeps", I64(1))
        _leave_callers_cpu(rt, b, allowed, elsewhere, spread)  # before it claims a chunk there
    b.atomic_rmw("sub", rt.word["sleepers"], I32(1), "seq_cst")
    b.branch(top)

    b.position_at_end(claim)
    seen = cnt
    body = rt.load(b, "fn", "monotonic")
    data = rt.load(b, "data", "monotonic")
    total = rt.load(b, "total", "monotonic")
    chunk = b.and_(seen, I64(CLOSED))
    won = b.extract_value(b.cmpxchg(rt.word["counter"], seen, b.add(seen, I64(1)), "acq_rel", "acquire"), 1)
    b.cbranch(won, run, spin)

    b.position_at_end(run)
    gen = b.lshr(seen, I64(32))
    with b.if_then(b.icmp_unsigned("!=", gen, b.load(joined, typ=I64))):
        b.store(gen, joined)
        rt.count(b, "arrivals", I64(1))
        rt.count(b, "arrival_cycles", b.sub(rt.cycles(b), rt.load(b, "published", "monotonic")))
        on_callers = b.icmp_signed("==", rt.cpu(b), rt.load(b, "caller_cpu", "monotonic"))
        rt.count(b, "arrivals_on_callers_cpu", b.zext(on_callers, I64))
    b.call(body, [data, chunk, k])
    _finish_chunk(rt, b, I32(1), total)
    b.branch(top)  # the loop never returns
    return f


def _spawn(rt: _Runtime, worker: ir.Function) -> ir.Function:
    """`rlx_pool.spawn(workers)`: create workers `started+1 … workers` (detached); the job owner calls it."""
    f, b = _function(rt, "rlx_pool.spawn", ir.FunctionType(ir.VoidType(), [I32]), "internal")
    want = f.args[0]
    create = rt.declare("pthread_create", ir.FunctionType(I32, [PTR, PTR, PTR, PTR]))
    detach = rt.declare("pthread_detach", ir.FunctionType(I32, [I64]))
    handle = b.alloca(I64)
    head, step, out = (f.append_basic_block(n) for n in ("head", "step", "out"))
    b.branch(head)
    b.position_at_end(head)
    have = rt.load(b, "started", "monotonic")
    b.cbranch(b.icmp_signed("<", have, want), step, out)
    b.position_at_end(step)
    k = b.add(have, I32(1))
    failed = b.icmp_unsigned("!=", b.call(create, [handle, ir.Constant(PTR, None), worker,
                                                   b.inttoptr(b.zext(k, I64), PTR)]), I32(0))
    made = f.append_basic_block("made")
    b.cbranch(failed, out, made)  # no more threads: the pool stays smaller, every chunk still runs
    b.position_at_end(made)
    b.call(detach, [b.load(handle, typ=I64)])
    rt.store(b, "started", k, "monotonic")
    b.branch(head)
    b.position_at_end(out)
    b.ret_void()
    return f


def _parallel(rt: _Runtime, inline: ir.Function, spawn: ir.Function) -> ir.Function:
    """`rlx_parallel(fn, data, total, threads)`: run chunks `0 … total-1` on up to `threads` threads."""
    f, b = _function(rt, FORK_SYMBOL, ir.FunctionType(ir.VoidType(), [BODY_PTR, PTR, I64, I64]))
    body, data, total, threads = f.args
    alone, pooled = f.append_basic_block("alone"), f.append_basic_block("pooled")
    wide = b.and_(b.icmp_unsigned(">", total, I64(1)), b.icmp_unsigned(">", threads, I64(1)))
    own = f.append_basic_block("own")
    b.cbranch(wide, own, alone)
    b.position_at_end(own)
    taken = b.extract_value(b.cmpxchg(rt.word["busy"], I32(0), I32(1), "acquire", "monotonic"), 1)
    b.cbranch(taken, pooled, alone)

    b.position_at_end(alone)
    b.call(inline, [body, data, total])
    b.ret_void()

    b.position_at_end(pooled)
    b.call(spawn, [b.trunc(b.sub(threads, I64(1)), I32)])
    gen = b.add(b.lshr(rt.load(b, "counter", "monotonic"), I64(32)), I64(1))
    b.atomic_rmw("xchg", rt.word["counter"], b.or_(b.shl(gen, I64(32)), I64(CLOSED)), "acq_rel")
    for name, value in (("fn", body), ("data", data), ("total", total), ("threads", threads)):
        rt.store(b, name, value, "monotonic")
    rt.store(b, "done", I32(0), "monotonic")
    rt.store(b, "published", rt.cycles(b), "monotonic")
    rt.store(b, "caller_cpu", rt.cpu(b), "monotonic")
    rt.store(b, "counter", b.shl(gen, I64(32)), "seq_cst")
    rt.count(b, "regions", I64(1))
    rt.count(b, "chunks", total)
    with b.if_then(b.icmp_signed(">", rt.load(b, "sleepers", "seq_cst"), I32(0))):
        rt.count(b, "woke", I64(1))
        b.atomic_rmw("add", rt.word["epoch"], I32(1), "seq_cst")
        rt.futex(b, "epoch", _FUTEX_WAKE, I32(2**31 - 1))  # all: which sleeper wakes is the kernel's choice
        # a worker the wake-up put on our CPU runs now (and moves off it), not after our time slice
        b.call(rt.declare("sched_yield", ir.FunctionType(I32, [])), [])

    # The caller claims chunks too (it owns the generation: a fetch-add is enough).
    start = rt.cycles(b)
    mine = _chunk_loop(b, lambda _: b.and_(b.atomic_rmw("add", rt.word["counter"], I64(1), "acq_rel"), I64(CLOSED)),
                       total, body, data)

    # Join: wait for the chunks workers claimed — spin about two of our own chunks' time, then sleep.
    now = rt.cycles(b)
    per_chunk = b.udiv(b.sub(now, start), b.select(b.icmp_unsigned(">", mine, I64(0)), mine, I64(1)))
    budget = b.add(b.mul(per_chunk, I64(2)), I64(JOIN_SPIN_MIN))
    deadline = b.add(now, budget)
    rt.count(b, "caller_chunks", mine)
    complete = _finish_chunk(rt, b, b.trunc(mine, I32), total)
    finish, wait = f.append_basic_block("finish"), f.append_basic_block("wait")
    b.cbranch(complete, finish, wait)

    b.position_at_end(wait)
    d = rt.load(b, "done")
    ready = b.icmp_unsigned("==", b.zext(d, I64), total)
    slow = f.append_basic_block("slow")
    spin = f.append_basic_block("spin")
    b.cbranch(ready, finish, spin)
    b.position_at_end(spin)
    _pause_or(rt, b, b.icmp_unsigned("<", rt.cycles(b), deadline), wait, slow)
    b.position_at_end(slow)
    rt.count(b, "join_sleeps", I64(1))
    rt.store(b, "waiting", I32(1), "seq_cst")
    d2 = rt.load(b, "done", "seq_cst")
    with b.if_then(b.icmp_unsigned("!=", b.zext(d2, I64), total)):
        rt.futex(b, "done", _FUTEX_WAIT, d2)
        rt.store(b, "caller_cpu", rt.cpu(b), "monotonic")  # a wake-up may have moved the caller
    b.branch(wait)

    b.position_at_end(finish)
    end = rt.cycles(b)
    waited = b.sub(end, now)
    rt.count(b, "join_cycles", waited)
    # slow: longer than 4 of the caller's chunks (uneven chunks, e.g. causal attention rows, stay under that)
    slow_join = b.and_(b.icmp_unsigned(">", waited, b.mul(per_chunk, I64(4))),
                       b.icmp_unsigned(">", waited, I64(SLOW_JOIN_CYCLES)))
    _back_off(rt, b, end, slow_join)
    rt.store(b, "waiting", I32(0), "monotonic")
    rt.store(b, "busy", I32(0), "release")
    b.ret_void()
    return f


def _back_off(rt: _Runtime, b: ir.IRBuilder, now: ir.Value, slow: ir.Value) -> None:
    """After a join at `now` (`slow`: a worker held it up).  A slow join within CLEAN_REGIONS pooled
    regions of the last one (a neighbour that stays) makes the next regions run alone until
    `now + BACKOFF_CYCLES << level`, and the level grow by one (the probe after each window fails at
    once while the neighbour stays); an isolated slow join (something woke briefly) only starts the
    count again, at level 0.  Only the job's owner runs this."""
    dirty = rt.load(b, "dirty", "monotonic")   # pooled regions left in which a slow join is not isolated
    with b.if_else(slow) as (then, otherwise):
        with then:
            rt.count(b, "slow_joins", I64(1))
            recent = b.icmp_unsigned(">", dirty, I64(0))
            level = rt.load(b, "level", "monotonic")
            with b.if_then(recent):
                rt.store(b, "alone_until", b.add(now, b.shl(I64(BACKOFF_CYCLES), level)), "monotonic")
            grown = b.select(b.icmp_unsigned("<", level, I64(BACKOFF_MAX_LEVEL)), b.add(level, I64(1)), level)
            rt.store(b, "level", b.select(recent, grown, I64(0)), "monotonic")
            rt.store(b, "dirty", I64(CLEAN_REGIONS), "monotonic")
        with otherwise:   # a clean pooled region: CLEAN_REGIONS of them in a row start the level over
            with b.if_then(b.icmp_unsigned(">", dirty, I64(0))):
                rt.store(b, "dirty", b.sub(dirty, I64(1)), "monotonic")
                with b.if_then(b.icmp_unsigned("==", dirty, I64(1))):
                    rt.store(b, "level", I64(0), "monotonic")


def _threads_now(rt: _Runtime) -> None:
    """`rlx_threads_now(want)`: the threads a region should use now — 1 while backing off after a slow
    join (a worker preempted while it held a chunk: a busy neighbour), so the region runs as one
    thread does (one chunk, no fork) instead of a scheduler slice late; `want` otherwise."""
    f, b = _function(rt, THREADS_SYMBOL, ir.FunctionType(I64, [I64]))
    backing = b.icmp_unsigned("<", rt.cycles(b), rt.load(b, "alone_until", "monotonic"))
    with b.if_then(backing):
        rt.count(b, "backed_off", I64(1))
    want = b.select(backing, I64(1), f.args[0])
    # leave the cores a background compile uses (`reserve_core`): its build would preempt our workers
    reserved = ir.GlobalVariable(rt.module, I32, RESERVED_SYMBOL)
    taken = b.sext(b.load_atomic(reserved, "monotonic", 4, typ=I32), I64)
    free = b.sub(I64(MAX_THREADS), taken)
    free = b.select(b.icmp_signed("<", free, I64(1)), I64(1), free)
    b.ret(b.select(b.icmp_signed("<", want, free), want, free))


def _after_fork(rt: _Runtime) -> None:
    """`rlx_pool_forked()`: the child of a fork has no workers — start over with an empty pool."""
    f, b = _function(rt, "rlx_pool_forked", ir.FunctionType(ir.VoidType(), []))
    gen = b.add(b.lshr(rt.load(b, "counter", "monotonic"), I64(32)), I64(1))
    rt.store(b, "counter", b.or_(b.shl(gen, I64(32)), I64(CLOSED)), "seq_cst")
    for name in ("started", "sleepers", "waiting", "done", "busy"):
        rt.store(b, name, I32(0), "seq_cst")
    b.ret_void()


def _stats(rt: _Runtime) -> None:
    """`rlx_pool_stats(ptr out)`: copy the counters (`STATS`, then `WORKER_STATS`) to `out`."""
    f, b = _function(rt, "rlx_pool_stats", ir.FunctionType(ir.VoidType(), [PTR]))
    cells = [(rt.stats, i) for i in range(len(STATS))] + [(rt.worker_stats, i) for i in range(len(WORKER_STATS))]
    for slot, (table, i) in enumerate(cells):
        value = b.load_atomic(b.gep(table, [I32(0), I32(i)], inbounds=True), "monotonic", 8, typ=I64)
        b.store(value, b.gep(f.args[0], [I64(8 * slot)], source_etype=ir.IntType(8)))
    b.ret_void()


def _workers(rt: _Runtime) -> None:
    """`rlx_pool_workers()`: how many worker threads this process has started."""
    f, b = _function(rt, "rlx_pool_workers", ir.FunctionType(I32, []))
    b.ret(rt.load(b, "started", "acquire"))


def runtime_ir() -> str:
    """The runtime module's IR text."""
    arch = llvm.get_process_triple().split("-")[0]
    if arch not in _FUTEX:
        from ..errors import RlxError
        raise RlxError(f"rlx_llvm's thread pool knows the futex syscall on {sorted(_FUTEX)}, not on {arch}")
    rt = _Runtime(arch)
    worker = _worker(rt)
    _parallel(rt, _run_inline(rt), _spawn(rt, worker))
    _threads_now(rt)
    _after_fork(rt)
    _workers(rt)
    _stats(rt)
    return str(rt.module)


# ── loading it into the process ──────────────────────────────────────────────

def _build() -> tuple[object, dict[str, int]]:
    """Compile the runtime (through the object cache), load it into its own engine, and publish
    `rlx_parallel` and `rlx_num_threads` to the JIT's symbol table."""
    from .. import jit
    llvm.add_symbol("rlx_num_threads", ctypes.addressof(NUM_THREADS))
    llvm.add_symbol(RESERVED_SYMBOL, ctypes.addressof(RESERVED))
    engine = jit.Engine()
    code = _object()
    engine.load(code)
    names = (FORK_SYMBOL, THREADS_SYMBOL, "rlx_pool_forked", "rlx_pool_workers", "rlx_pool_stats")
    addresses = {name: engine.address(name) for name in names}
    llvm.add_symbol(FORK_SYMBOL, addresses[FORK_SYMBOL])
    llvm.add_symbol(THREADS_SYMBOL, addresses[THREADS_SYMBOL])
    os.register_at_fork(after_in_child=_forked)
    return engine, addresses


def _object():
    """The runtime's object code: from the object cache under a key of this file's source and spin
    constants (so a warm process does not even build the IR), else compiled and stored there."""
    import hashlib

    from .. import cache, jit
    store = cache.resolve_cache(None)
    with open(__file__, "rb") as fh:
        source = hashlib.sha256(fh.read()).hexdigest()
    # the spin constants too: a process that changes them (an experiment) must not load the old object
    key = jit.cache_key(f"rlx_pool {source} {WORKER_SPIN_CYCLES} {JOIN_SPIN_MIN} {SLOW_JOIN_CYCLES} "
                        f"{BACKOFF_CYCLES} {BACKOFF_MAX_LEVEL} {CLEAN_REGIONS} {MAX_THREADS}", 2)
    hit = store.load(key) if store is not None else None
    if hit is not None and not jit.missing_symbols(hit.externals):
        return hit
    code = jit.compile_ir(runtime_ir(), opt=2)
    code.key = key
    if store is not None:
        store.store(code)
    return code


def register_runtime() -> None:
    """Build the pool runtime once per process and publish its symbols (idempotent, thread-safe)."""
    global _runtime
    if _runtime is None:
        with _lock:
            if _runtime is None:
                _runtime = _build()


def _native_address(name: str) -> int:
    register_runtime()
    return _runtime[1][name]


def _native(name: str, restype=None):
    return ctypes.CFUNCTYPE(restype)(_native_address(name))


def _forked() -> None:
    _native("rlx_pool_forked")()


def workers() -> int:
    """Worker threads the pool has started in this process (0 until the first parallel region)."""
    return int(_native("rlx_pool_workers", ctypes.c_int32)())


def stats() -> dict[str, int]:
    """The pool's counters since the process started: regions forked, those that had to wake a
    sleeping worker, chunks (all / run by the caller), TSC cycles the caller waited at joins and
    joins it slept in, slow joins (a second within CLEAN_REGIONS starts a back-off); worker arrivals (regions a worker ran a
    chunk of), their summed TSC delay from the job's publication to the first claim, the workers'
    futex sleeps and moves, and regions told to run as one thread while backing off."""
    names = STATS + WORKER_STATS
    out = (ctypes.c_int64 * len(names))()
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_native_address("rlx_pool_stats"))(ctypes.addressof(out))
    return dict(zip(names, out))


@contextlib.contextmanager
def reserve_core() -> Iterator[None]:
    """While the block runs (a background compile), regions leave one core to it: `rlx_threads_now`
    answers at most cores − reserved (and at least 1) — the build would otherwise preempt our workers
    mid-chunk, and the slow joins would back the pool off for seconds after it ends."""
    with _lock:
        RESERVED.value += 1
    try:
        yield
    finally:
        with _lock:
            RESERVED.value -= 1


def set_threads(n: int) -> None:
    """Threads rlx_llvm's own parallel loops use from now on (capped at MAX_THREADS)."""
    NUM_THREADS.value = max(1, min(int(n), MAX_THREADS))


def get_threads() -> int:
    """Threads rlx_llvm's own parallel loops use."""
    return int(NUM_THREADS.value)
