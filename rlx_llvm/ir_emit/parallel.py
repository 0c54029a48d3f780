"""rlx_llvm's own threads: `EmitContext.parallel_for` on rlx_llvm's pool (`kernels.pool`, docs/runtime.md).

The region's body is emitted once into an outlined function `void <thunk>.par<K>(ptr data, i64
chunk, i64 slot)` that runs chunk `chunk` of the region's near-equal chunks of whole `grain`s of
items with the per-thread scratch of `slot`; the caller forks with `rlx_parallel(body, data,
chunks, threads)`, which runs the chunks on the pool (the caller works too, and joins only the chunks workers claimed).  With
`RLX_LLVM_RUNTIME=gomp` the same bodies run under libgomp's `GOMP_parallel` instead (for A/B runs).
"""
from __future__ import annotations

import os
import re

import llvmlite.binding as llvm
from llvmlite import ir

from ..kernels.pool import FORK_SYMBOL, MAX_THREADS, THREADS_SYMBOL, get_threads, set_threads  # noqa: F401  (re-exported)
from ..kernels.pool import register_runtime as _register_pool
from .context import EmitContext
from .toolkit import I32, I64, PTR, entry_alloca

# The outlined body gets `[6 x ptr]`: arena, per-thread scratch base, a pointer to the i64
# per-thread scratch stride (known only after the body is emitted), the caller's shared scratch
# (where the thunk keeps its intermediates, `EmitContext.shared`), a pointer to the i64 pair
# `[units per chunk, chunks with one more]` (known at run time, from the thread count), and — under
# GOMP only — a pointer to the `[next chunk, chunks]` pair its threads claim from.  Array GEPs keep llvmlite's pointer types
# consistent where struct GEPs do not.
#
# No overlap: a thunk's scratch offsets only ever grow (a bump allocator, never reused), and the
# per-thread regions are reserved in the caller *after* the body is emitted, so they lie beyond
# every intermediate allocated so far and before any allocated later.  A parallel_for inside a
# parallel body runs inline on the thread that reached it, in that thread's own scratch.
_ARGS = ir.ArrayType(PTR, 6)
_BODY = ir.FunctionType(ir.VoidType(), [PTR, I64, I64])
CHUNKS_PER_THREAD = 4  # chunks per thread (fewer: less balance; more: more per-chunk setup)
RUNTIME_ENV = "RLX_LLVM_RUNTIME"  # "pool" (default) or "gomp"
_OUTLINED = re.compile(r"\.par\d+$")


def uses_gomp() -> bool:
    """Whether regions fork through libgomp (`RLX_LLVM_RUNTIME=gomp`, for A/B runs) instead of the pool."""
    return os.environ.get(RUNTIME_ENV, "pool").lower() == "gomp"


def fork_symbol() -> str:
    """The symbol a forking region calls (for tests that count forks)."""
    return "GOMP_parallel" if uses_gomp() else FORK_SYMBOL


def register_runtime() -> None:
    """Build the pool runtime (and, under `RLX_LLVM_RUNTIME=gomp`, load libgomp); idempotent."""
    _register_pool()
    if uses_gomp() and not llvm.address_of_symbol("GOMP_parallel"):
        llvm.load_library_permanently("libgomp.so.1")


def _num_threads_global(module: ir.Module) -> ir.GlobalVariable:
    g = module.globals.get("rlx_num_threads")
    if g is None:
        g = ir.GlobalVariable(module, I32, "rlx_num_threads")
        g.linkage = "external"
    return g


def _outline(ctx: EmitContext, n: int, grain: int, body) -> tuple[ir.Function, EmitContext]:
    """The body as `void <thunk>.par<K>(ptr data, i64 chunk, i64 slot)`."""
    ctx._outlined += 1
    outlined = ir.Function(ctx.module, _BODY, name=f"{ctx.fn.name}.par{ctx._outlined}")
    outlined.linkage = "internal"
    outlined.attributes.add("nounwind")
    data, chunk, slot = outlined.args
    ob = ir.IRBuilder(outlined.append_basic_block("entry"))
    field = [ob.gep(data, [I64(8 * k)], source_etype=ir.IntType(8)) for k in range(5)]
    arena, scratch0, stride_at, shared, split_at = (ob.load(f, typ=PTR) for f in field)
    scratch = ob.gep(scratch0, [ob.mul(slot, ob.load(stride_at, typ=I64))], source_etype=ir.IntType(8))
    # the region's units (of `grain` items) in near-equal chunks, `[units // chunks, units % chunks]`
    # at `split_at`: chunk c runs `each` units, one more when c < extra, from c·each + min(c, extra)
    each = ob.load(split_at, typ=I64)
    extra = ob.load(ob.gep(split_at, [I64(8)], source_etype=ir.IntType(8)), typ=I64)
    longer = ob.icmp_signed("<", chunk, extra)
    first = ob.add(ob.mul(chunk, each), ob.select(longer, chunk, extra))
    start = ob.mul(first, I64(grain))
    end = ob.mul(ob.add(first, ob.add(each, ob.zext(longer, I64))), I64(grain))
    stop = ob.select(ob.icmp_signed("<", end, I64(n)), end, I64(n))
    sub = EmitContext(ctx.module, outlined, ctx.index, ctx.thunk, ctx.schedule, ctx.lanes, ctx._declare,
                      arena=arena, scratch=scratch, builder=ob, shared=shared, fields=ctx.fields)
    body(sub, start, stop)
    if sub._streamed:
        ob.fence("seq_cst")
    ob.ret_void()
    return outlined, sub


def _store_split(b: ir.IRBuilder, split: ir.Value, units: ir.Value, chunks: ir.Value) -> None:
    """`split = [units // chunks, units % chunks]`: what each chunk's body derives its range from."""
    each = b.udiv(units, chunks)
    b.store(each, b.gep(split, [I32(0), I32(0)], inbounds=True))
    b.store(b.sub(units, b.mul(each, chunks)), b.gep(split, [I32(0), I32(1)], inbounds=True))


def _gomp_wrapper(ctx: EmitContext, outlined: ir.Function) -> ir.Function:
    """`void <body>.gomp(ptr data)`: GOMP's team claims chunks from the `[next, chunks]` pair."""
    fn = ir.Function(ctx.module, ir.FunctionType(ir.VoidType(), [PTR]), name=f"{outlined.name}.gomp")
    fn.linkage = "internal"
    data = fn.args[0]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    pair = b.load(b.gep(data, [I64(8 * 5)], source_etype=ir.IntType(8)), typ=PTR)
    tid = b.sext(b.call(ctx.declare("omp_get_thread_num", ir.FunctionType(I32, [])), []), I64)
    claim, run, done = (fn.append_basic_block(name) for name in ("claim", "run", "done"))
    b.branch(claim)
    b.position_at_end(claim)
    chunk = b.atomic_rmw("add", pair, I64(1), "monotonic")
    total = b.load(b.gep(pair, [I64(8)], source_etype=ir.IntType(8)), typ=I64)
    b.cbranch(b.icmp_signed("<", chunk, total), run, done)
    b.position_at_end(run)
    b.call(outlined, [data, chunk, tid])
    b.branch(claim)
    b.position_at_end(done)
    b.ret_void()
    return fn


def emit_parallel_for(ctx: EmitContext, n: int, body, grain: int, min_work: int) -> None:
    """See `EmitContext.parallel_for`."""
    register_runtime()
    if n <= 0:
        return
    if _OUTLINED.search(ctx.fn.name):  # already inside a region: this thread runs it all
        body(ctx, I64(0), I64(n))
        return
    outlined, sub = _outline(ctx, n, grain, body)
    ctx.paths |= sub.paths
    units = (n + grain - 1) // grain
    # A body that calls BLAS runs on the calling thread alone: BLAS threads itself, and our threads
    # times its threads would oversubscribe the cores (docs/runtime.md).
    max_useful = 1 if "blas" in sub.paths else max(1, min(MAX_THREADS, n // max(1, min_work), units))
    stride_bytes = (sub.scratch_bytes + 63) // 64 * 64
    base = ctx.scratch_alloc(stride_bytes * max_useful) if stride_bytes else 0

    b = ctx.b
    args = entry_alloca(ctx, _ARGS, "par.args")
    stride_slot, split = entry_alloca(ctx, I64, "par.stride"), entry_alloca(ctx, ir.ArrayType(I64, 2), "par.split")
    pair = entry_alloca(ctx, ir.ArrayType(I64, 2), "par.next")
    b.store(I64(stride_bytes), stride_slot)
    for k, value in enumerate((ctx.arena, b.gep(ctx.scratch, [I64(base)], source_etype=ir.IntType(8)),
                               stride_slot, ctx.shared, split, pair)):
        b.store(value, b.gep(args, [I32(0), I32(k)], inbounds=True))
    if max_useful == 1:
        _store_split(b, split, I64(units), I64(1))
        b.call(outlined, [args, I64(0), I64(0)])
        return
    want = b.sext(b.load(_num_threads_global(ctx.module), typ=I32), I64)
    if not uses_gomp():   # the pool's word on it: 1 while it backs off from a busy neighbour
        now = ctx.declare(THREADS_SYMBOL, ir.FunctionType(I64, [I64]))
        want = b.call(now, [want])
    threads = b.select(b.icmp_signed("<", want, I64(max_useful)), want, I64(max_useful))
    # as many chunks as ⌈units / (CHUNKS_PER_THREAD·threads)⌉-unit pieces make (one chunk on one thread),
    # the units spread evenly over them: no chunk is cut smaller than it has to be (a GEMM chunk's
    # column panels share the loads of A), and no short last chunk idles a thread at the join
    pieces = b.select(b.icmp_signed(">", threads, I64(1)), b.mul(threads, I64(CHUNKS_PER_THREAD)), I64(1))
    size = b.udiv(b.add(I64(units), b.sub(pieces, I64(1))), pieces)
    chunks = b.udiv(b.add(I64(units), b.sub(size, I64(1))), size)
    _store_split(b, split, I64(units), chunks)
    fork, inline, joined = (ctx.fn.append_basic_block(f"par.{name}") for name in ("fork", "inline", "joined"))
    b.cbranch(b.icmp_signed(">", threads, I64(1)), fork, inline)
    b.position_at_end(fork)
    if uses_gomp():
        b.store(I64(0), b.gep(pair, [I32(0), I32(0)], inbounds=True))
        b.store(chunks, b.gep(pair, [I32(0), I32(1)], inbounds=True))
        gomp = ctx.declare("GOMP_parallel", ir.FunctionType(ir.VoidType(), [PTR, PTR, I32, I32]))
        b.call(gomp, [_gomp_wrapper(ctx, outlined), args, b.trunc(threads, I32), I32(0)])
    else:
        fork_fn = ctx.declare(FORK_SYMBOL, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64]))
        b.call(fork_fn, [outlined, args, chunks, threads])
    b.branch(joined)
    b.position_at_end(inline)
    b.call(outlined, [args, I64(0), I64(0)])
    b.branch(joined)
    b.position_at_end(joined)
