"""rlx_llvm's own threads: `EmitContext.parallel_for` on top of libgomp's `GOMP_parallel`.

The thread count native code reads at run time (`@rlx_num_threads`) and the libgomp runtime live in
`kernels.gomp`; this module emits the fork/join and the outlined bodies.
"""
from __future__ import annotations

from llvmlite import ir

from ..kernels.gomp import MAX_THREADS, get_threads, register_runtime, set_threads  # noqa: F401  (re-exported)
from .context import EmitContext
from .toolkit import I32, I64, PTR, entry_alloca

# The outlined body gets `[5 x ptr]`: arena, per-thread scratch base, a pointer to the i64
# per-thread scratch stride (known only after the body is emitted), the caller's shared
# scratch (where the thunk keeps its intermediates, `EmitContext.shared`), and the i64 counter
# threads claim chunks from.  Array GEPs keep
# llvmlite's pointer types consistent where struct GEPs do not.
#
# No overlap: a thunk's scratch offsets only ever grow (a bump allocator, never reused), and the
# per-thread regions are reserved in the caller *after* the body is emitted, so they lie beyond
# every intermediate allocated so far and before any allocated later.  A nested parallel_for
# reserves its regions inside its own thread's region, and passes the same shared pointer on.
_ARGS = ir.ArrayType(PTR, 5)
CHUNKS_PER_THREAD = 4  # dynamic chunks per thread (fewer: less balance; more: more per-chunk setup)


def _num_threads_global(module: ir.Module) -> ir.GlobalVariable:
    g = module.globals.get("rlx_num_threads")
    if g is None:
        g = ir.GlobalVariable(module, I32, "rlx_num_threads")
        g.linkage = "external"
    return g


def emit_parallel_for(ctx: EmitContext, n: int, body, grain: int, min_work: int) -> None:
    """See `EmitContext.parallel_for`."""
    register_runtime()
    if n <= 0:
        return
    b = ctx.b
    ctx._outlined += 1
    outlined = ir.Function(ctx.module, ir.FunctionType(ir.VoidType(), [PTR]), name=f"{ctx.fn.name}.par{ctx._outlined}")
    outlined.linkage = "internal"
    outlined.attributes.add("nounwind")
    data = outlined.args[0]
    ob = ir.IRBuilder(outlined.append_basic_block("entry"))
    field = [ob.gep(data, [I64(8 * k)], source_etype=ir.IntType(8)) for k in range(5)]
    arena, scratch0, stride_at, shared, counter = (ob.load(f, typ=PTR) for f in field)
    stride = ob.load(stride_at, typ=I64)
    tid = ob.sext(ob.call(ctx.declare("omp_get_thread_num", ir.FunctionType(I32, [])), []), I64)
    nt = ob.sext(ob.call(ctx.declare("omp_get_num_threads", ir.FunctionType(I32, [])), []), I64)
    scratch = ob.gep(scratch0, [ob.mul(tid, stride)], source_etype=ir.IntType(8))
    # Chunks are claimed from a shared counter (dynamic scheduling), CHUNKS_PER_THREAD per thread:
    # on a shared machine a descheduled thread then delays one small chunk, not a static share.
    # chunk = ceil(units / (k·nt)) · grain (k = 1 on one thread); [start, stop) = chunk c's items.
    units = (n + grain - 1) // grain
    per_thread = ob.select(ob.icmp_signed(">", nt, I64(1)), I64(CHUNKS_PER_THREAD), I64(1))
    pieces = ob.mul(nt, per_thread)
    chunk = ob.mul(ob.udiv(ob.add(I64(units), ob.sub(pieces, I64(1))), pieces), I64(grain))
    claim = outlined.append_basic_block("claim")
    run = outlined.append_basic_block("run")
    done = outlined.append_basic_block("done")
    ob.branch(claim)
    ob.position_at_end(claim)
    c = ob.atomic_rmw("add", counter, I64(1), "monotonic")
    start = ob.mul(c, chunk)
    stop = ob.select(ob.icmp_signed("<", ob.add(start, chunk), I64(n)), ob.add(start, chunk), I64(n))
    sub = EmitContext(ctx.module, outlined, ctx.index, ctx.thunk, ctx.schedule, ctx.lanes, ctx._declare,
                      arena=arena, scratch=scratch, builder=ob, shared=shared, fields=ctx.fields)
    ob.cbranch(ob.icmp_signed("<", start, I64(n)), run, done)
    ob.position_at_end(run)
    body(sub, start, stop)
    if not ob.block.is_terminated:
        ob.branch(claim)
    ob.position_at_end(done)
    if sub._streamed:
        ob.fence("seq_cst")
    ob.ret_void()

    ctx.paths |= sub.paths
    stride_bytes = (sub.scratch_bytes + 63) // 64 * 64
    base = ctx.scratch_alloc(stride_bytes * MAX_THREADS) if stride_bytes else 0
    args = entry_alloca(ctx, _ARGS, "par.args")
    stride_slot = entry_alloca(ctx, I64, "par.stride")
    counter_slot = entry_alloca(ctx, I64, "par.next")
    b.store(I64(stride_bytes), stride_slot)
    b.store(I64(0), counter_slot)
    for k, value in enumerate((ctx.arena, b.gep(ctx.scratch, [I64(base)], source_etype=ir.IntType(8)),
                               stride_slot, ctx.shared, counter_slot)):
        b.store(value, b.gep(args, [I32(0), I32(k)], inbounds=True))
    max_useful = max(1, min(MAX_THREADS, n // max(1, min_work), units))
    want = b.load(_num_threads_global(ctx.module), typ=I32)
    threads = b.select(b.icmp_signed("<", want, I32(max_useful)), want, I32(max_useful))
    fork = ctx.fn.append_basic_block("par.fork")
    inline = ctx.fn.append_basic_block("par.inline")
    joined = ctx.fn.append_basic_block("par.joined")
    b.cbranch(b.icmp_signed(">", threads, I32(1)), fork, inline)
    b.position_at_end(fork)
    gomp = ctx.declare("GOMP_parallel", ir.FunctionType(ir.VoidType(), [PTR, PTR, I32, I32]))
    b.call(gomp, [outlined, args, threads, I32(0)])
    b.branch(joined)
    b.position_at_end(inline)
    b.call(outlined, [args])  # omp_get_thread_num() = 0, omp_get_num_threads() = 1 outside a region
    b.branch(joined)
    b.position_at_end(joined)
