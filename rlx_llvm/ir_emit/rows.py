"""Row machinery shared by norms, softmax, reductions and losses.

* `reduce_row` — one pass over a contiguous row with several independent `<W x T>` accumulators
  per statistic (`reassoc` adds, so the chains overlap), a horizontal `llvm.vector.reduce.*` at
  the end and a scalar tail; one call can carry several statistics at once (Σx and Σx²).
* `Combine` — the associative reductions: Sum/Prod reassociate, Max/Min are NaN-ignoring
  (`llvm.maxnum`/`llvm.minnum`, Rust's `f32::max/min`).
* `carried_loop` — a counted loop whose body threads values from one iteration to the next.
* `span_loop` — W-wide steps over a run-time range `[start, stop)`, the last partial vector masked
  (`load_lanes`/`store_lanes`).
* `row_offset` — per-row element offsets given as a compile-time list (`mod_off`, `gate_off`),
  folded into arithmetic when the list is affine in `row // period`, else a constant table.
* `parallel_rows` — split rows over rlx_llvm's threads when the thunk moves enough bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from llvmlite import ir

from .core import F32, F64, FASTMATH, I32, I64, EmitContext, const, vec, width_of

REASSOC = FASTMATH + ("reassoc",)
Index = "ir.Value | int"

# Work (bytes moved) below which a row kernel stays on the calling thread, and the least work
# worth a thread of its own: a fork/join costs a few µs, ~20-40 KB of memory traffic.
PARALLEL_MIN_BYTES = 256 << 10


# ── small value helpers ─────────────────────────────────────────────────────

def scalar_of(ty: ir.Type) -> ir.Type:
    """Element type of a vector type (the type itself for a scalar)."""
    return ty.element if isinstance(ty, ir.VectorType) else ty


def suffix(ty: ir.Type) -> str:
    """Intrinsic name suffix: `f32`, `v16f32`, `v8f64`, `i64`."""
    s = scalar_of(ty)
    base = {F32: "f32", F64: "f64"}.get(s) if s in (F32, F64) else f"i{s.width}"
    return f"v{ty.count}{base}" if isinstance(ty, ir.VectorType) else base


def splat(b: ir.IRBuilder, x: ir.Value, w: int) -> ir.Value:
    """Broadcast a scalar to `w` lanes (the scalar itself for w = 1)."""
    if w == 1:
        return x
    vty = ir.VectorType(x.type, w)
    v = b.insert_element(ir.Constant(vty, None), x, I32(0))
    return b.shuffle_vector(v, ir.Constant(vty, None), ir.Constant(ir.VectorType(I32, w), [0] * w))


def lane_ids(w: int, ty: ir.Type = I64) -> ir.Constant:
    """`<0, 1, …, w-1>` (scalar 0 for w = 1)."""
    if w == 1:
        return ir.Constant(ty, 0)
    return ir.Constant(ir.VectorType(ty, w), [ir.Constant(ty, j) for j in range(w)])


def iadd(b: ir.IRBuilder, x: Index, y: Index) -> Index:
    """`x + y` on i64 indices, folding Python ints."""
    if isinstance(x, int) and isinstance(y, int):
        return x + y
    if isinstance(y, int) and y == 0:
        return x
    if isinstance(x, int) and x == 0:
        return y
    x = I64(x) if isinstance(x, int) else x
    y = I64(y) if isinstance(y, int) else y
    return b.add(x, y, flags=("nsw",))


def imul(b: ir.IRBuilder, x: Index, k: int) -> Index:
    """`x · k` on an i64 index, folding Python ints."""
    if isinstance(x, int):
        return x * k
    return x if k == 1 else b.mul(x, I64(k), flags=("nsw",))


def as_value(x: Index) -> ir.Value:
    """A Python int as an i64 constant; a value unchanged."""
    return I64(x) if isinstance(x, int) else x


def call_intrinsic(ctx: EmitContext, name: str, args: Sequence[ir.Value], ret: ir.Type | None = None,
                   fastmath: tuple = ()) -> ir.Value:
    """Call `llvm.<name>.<suffix of the last operand>` (`name` used as is when already suffixed)."""
    full = name if name.count(".") > 1 else f"{name}.{suffix(args[-1].type)}"
    fn = ctx.intrinsic(full, ret or args[-1].type, [a.type for a in args])
    return ctx.b.call(fn, list(args), fastmath=fastmath)


def nan_max(ctx: EmitContext, x: ir.Value, y: ir.Value) -> ir.Value:
    """Rust `f32::max`: the larger operand, ignoring a NaN (`llvm.maxnum`)."""
    return call_intrinsic(ctx, "llvm.maxnum", [x, y])


def nan_min(ctx: EmitContext, x: ir.Value, y: ir.Value) -> ir.Value:
    """Rust `f32::min`: the smaller operand, ignoring a NaN (`llvm.minnum`)."""
    return call_intrinsic(ctx, "llvm.minnum", [x, y])


def sqrt(ctx: EmitContext, x: ir.Value) -> ir.Value:
    """IEEE square root (`llvm.sqrt`, one instruction — not a libm call)."""
    return call_intrinsic(ctx, "llvm.sqrt", [x])


def fconst(like: ir.Value | ir.Type, value: float) -> ir.Constant:
    """A float constant (splat) of the type of `like`."""
    ty = like if isinstance(like, ir.Type) else like.type
    if isinstance(ty, ir.VectorType):
        return const(ty.element, value, ty.count)
    return ir.Constant(ty, value)


def is_nan(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """`x != x` lane by lane."""
    return b.fcmp_unordered("uno", x, x)


def entry_alloca(ctx: EmitContext, ty: ir.Type, name: str = "") -> ir.Value:
    """A stack slot in the function's entry block (promoted to registers by SROA)."""
    with ctx.b.goto_entry_block():
        return ctx.b.alloca(ty, name=name)


# ── reductions ──────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Combine:
    """An associative reduction of floats: its identity, pairwise combine and horizontal form."""

    name: str        # "fadd", "fmul", "fmax", "fmin" (the llvm.vector.reduce.* suffix)
    identity: float

    def __call__(self, ctx: EmitContext, acc: ir.Value, y: ir.Value) -> ir.Value:
        """Combine an accumulator (never NaN: it starts at the identity) with `y`, lane by lane.

        Max/Min are `y > acc ? y : acc`: a NaN `y` keeps `acc` — Rust's `f32::max` for a non-NaN
        accumulator — and x86 does it in one `vmaxps`/`vminps` (`llvm.maxnum` needs three)."""
        b = ctx.b  # no `reassoc` here: it lets LLVM fold the independent accumulators into one chain
        if self.name == "fadd":
            return b.fadd(acc, y, flags=FASTMATH)
        if self.name == "fmul":
            return b.fmul(acc, y, flags=FASTMATH)
        return b.select(b.fcmp_ordered(">" if self.name == "fmax" else "<", y, acc), y, acc)

    def horizontal(self, ctx: EmitContext, v: ir.Value) -> ir.Value:
        """Reduce a vector's lanes to one scalar (a scalar is returned unchanged)."""
        if width_of(v) == 1:
            return v
        elem = scalar_of(v.type)
        name = f"llvm.vector.reduce.{self.name}.{suffix(v.type)}"
        if self.name in ("fadd", "fmul"):
            start = ir.Constant(elem, -0.0 if self.name == "fadd" else 1.0)
            fn = ctx.intrinsic(name, elem, [elem, v.type])
            return ctx.b.call(fn, [start, v], fastmath=REASSOC)
        fn = ctx.intrinsic(name, elem, [v.type])
        return ctx.b.call(fn, [v])


SUM = Combine("fadd", 0.0)
PROD = Combine("fmul", 1.0)
MAX = Combine("fmax", -math.inf)
MIN = Combine("fmin", math.inf)


def carried_loop(ctx: EmitContext, start: Index, stop: Index, step: int, init: Sequence[ir.Value],
                 body: Callable[[ir.Value, list[ir.Value]], Sequence[ir.Value]], name: str = "r"
                 ) -> list[ir.Value]:
    """`for i in range(start, stop, step): vals = body(i, vals)`; returns the final `vals`."""
    b = ctx.b
    pre = b.block
    header = ctx.fn.append_basic_block(f"{name}.header")
    loop = ctx.fn.append_basic_block(f"{name}.body")
    done = ctx.fn.append_basic_block(f"{name}.done")
    b.branch(header)
    b.position_at_end(header)
    i = b.phi(I64, name=name)
    i.add_incoming(as_value(start), pre)
    vals = []
    for v in init:
        p = b.phi(v.type)
        p.add_incoming(v, pre)
        vals.append(p)
    b.cbranch(b.icmp_signed("<", i, as_value(stop)), loop, done)
    b.position_at_end(loop)
    new = list(body(i, list(vals)))
    assert len(new) == len(vals)
    nxt = b.add(i, I64(step), flags=("nsw",))
    i.add_incoming(nxt, b.block)
    for p, v in zip(vals, new):
        p.add_incoming(v, b.block)
    b.branch(header)
    b.position_at_end(done)
    return vals


Terms = Callable[[Index, int], Sequence[ir.Value]]


def reduce_row(ctx: EmitContext, n: int, terms: Terms, ops: Sequence[Combine], elem: ir.Type = F32,
               accs: int = 4, width: int | None = None) -> list[ir.Value]:
    """Reduce `terms(i, w)` (one value per op, `w` lanes from element `i`) over `i ∈ [0, n)`.

    `accs` independent vector accumulators per op in the main loop, the leftover whole vectors
    unrolled, a horizontal reduction, then a scalar loop over the last `n mod W` elements.
    """
    w = width or ctx.lanes * 4 // _bytes(elem)
    block = w * accs
    main = n - n % block
    vec_end = n - n % w
    acc = [[fconst(vec(elem, w), op.identity) for _ in range(accs)] for op in ops]

    def step(i: ir.Value, flat: list[ir.Value]) -> list[ir.Value]:
        out = list(flat)
        for u in range(accs):
            vals = terms(iadd(ctx.b, i, u * w), w)
            for k, op in enumerate(ops):
                out[k * accs + u] = op(ctx, out[k * accs + u], vals[k])
        return out

    if main:
        flat = carried_loop(ctx, 0, main, block, [a for per in acc for a in per], step, name="acc")
        acc = [flat[k * accs:(k + 1) * accs] for k in range(len(ops))]
    for s in range(main, vec_end, w):
        vals = terms(s, w)
        for k, op in enumerate(ops):
            acc[k][0] = op(ctx, acc[k][0], vals[k])
    totals = []
    for k, op in enumerate(ops):
        lanes = acc[k]
        while len(lanes) > 1:  # pairwise tree of the accumulators
            lanes = [op(ctx, lanes[j], lanes[j + 1]) if j + 1 < len(lanes) else lanes[j]
                     for j in range(0, len(lanes), 2)]
        totals.append(op.horizontal(ctx, lanes[0]) if vec_end else ir.Constant(elem, op.identity))
    if n > vec_end:
        def tail(i: ir.Value, cur: list[ir.Value]) -> list[ir.Value]:
            vals = terms(i, 1)
            return [op(ctx, c, v) for op, c, v in zip(ops, cur, vals)]
        totals = carried_loop(ctx, vec_end, n, 1, totals, tail, name="acc.tail")
    return totals


def _bytes(ty: ir.Type) -> int:
    return 4 if ty == F32 else 8


Lanes = "ir.Value | None"  # a `<W x i1>` lane mask, or None for a full vector


def span_loop(ctx: EmitContext, start: Index, stop: Index, body: Callable[[ir.Value, int, Lanes], None],
              width: int | None = None, name: str = "s") -> None:
    """W-wide steps over the run-time range `[start, stop)`: `body(i, W, None)` for whole
    vectors, then once `body(i, W, mask)` for the remaining < W elements (masked loads/stores,
    so even a 3-wide range runs as one vector and nothing past `stop` is touched)."""
    b = ctx.b
    w = width or ctx.lanes
    start, stop = as_value(start), as_value(stop)
    vec_stop = b.add(start, b.and_(b.sub(stop, start), I64(~(w - 1))))  # w is a power of two
    with ctx.for_range(start, vec_stop, w, name=f"{name}.vec") as i:
        body(i, w, None)
    with b.if_then(b.icmp_signed("<", vec_stop, stop)):
        count = b.sub(stop, vec_stop)
        body(vec_stop, w, b.icmp_signed("<", lane_ids(w), splat(b, count, w)))


def load_lanes(ctx: EmitContext, offset: int, ty: ir.Type, index: Index, w: int, mask: Lanes = None,
               base: ir.Value | None = None) -> ir.Value:
    """`ctx.load` of `w` elements, or only the lanes in `mask` (`llvm.masked.load`, others 0)."""
    if mask is None:
        return ctx.load(offset, ty, index, w, base=base)
    vty = vec(ty, w)
    size = _bytes(ty) if ty in (F32, F64) else ty.width // 8
    fn = ctx.intrinsic(f"llvm.masked.load.{suffix(vty)}.p0", vty, [ctx.arena.type, I32, mask.type, vty])
    return ctx.b.call(fn, [ctx.addr(offset, index, size, base), I32(size), mask, ir.Constant(vty, None)])


def store_lanes(ctx: EmitContext, offset: int, value: ir.Value, index: Index, mask: Lanes = None,
                base: ir.Value | None = None) -> None:
    """`ctx.store` of a vector, or only the lanes in `mask` (`llvm.masked.store`)."""
    if mask is None:
        ctx.store(offset, value, index, base=base)
        return
    ty = scalar_of(value.type)
    size = _bytes(ty) if ty in (F32, F64) else ty.width // 8
    fn = ctx.intrinsic(f"llvm.masked.store.{suffix(value.type)}.p0", ir.VoidType(),
                       [value.type, ctx.arena.type, I32, mask.type])
    ctx.b.call(fn, [value, ctx.addr(offset, index, size, base), I32(size), mask])


# ── per-row offsets (AdaLayerNorm.mod_off, GatedResidual.gate_off) ──────────

def affine_pattern(offs: Sequence[int]) -> tuple[int, int] | None:
    """`(period, step)` when `offs[r] == (r // period) · step` for every r, else None."""
    if not offs:
        return (1, 0)
    if offs[0] != 0:
        return None
    n = len(offs)
    period = next((r for r in range(1, n) if offs[r] != offs[0]), n)
    step = offs[period] if period < n else 0
    if all(o == (r // period) * step for r, o in enumerate(offs)):
        return period, step
    return None


def row_offset(ctx: EmitContext, offs: Sequence[int], row: ir.Value, table: ir.GlobalVariable | None
               ) -> ir.Value:
    """Element offset `offs[row]` as an i64: arithmetic for an affine list, else a table load."""
    b = ctx.b
    pattern = affine_pattern(offs)
    if pattern is not None:
        period, step = pattern
        if step == 0:
            return I64(0)
        q = row if period == 1 else b.udiv(row, I64(period))
        return b.mul(q, I64(step), flags=("nuw", "nsw"))
    assert table is not None
    ptr = b.gep(table, [I64(0), row], inbounds=True, source_etype=table.value_type)
    return b.zext(b.load(ptr, typ=I32), I64)


def offset_table(ctx: EmitContext, offs: Sequence[int], tag: str) -> ir.GlobalVariable | None:
    """A private constant `[rows x i32]` of `offs` when no affine pattern describes them."""
    if affine_pattern(offs) is not None:
        return None
    ty = ir.ArrayType(I32, len(offs))
    g = ir.GlobalVariable(ctx.module, ty, name=f"{ctx.fn.name}.{tag}")
    g.global_constant = True
    g.linkage = "private"
    g.initializer = ir.Constant(ty, [ir.Constant(I32, o) for o in offs])
    return g


# ── threads ─────────────────────────────────────────────────────────────────

RowsBody = Callable[[EmitContext, ir.Value, ir.Value], None]


def parallel_rows(ctx: EmitContext, rows: int, bytes_per_row: int, body: RowsBody) -> None:
    """Run `body(ctx, start, stop)` over row ranges of `[0, rows)`: split across rlx_llvm's
    threads (`ctx.parallel_for`) when the thunk moves ≥ PARALLEL_MIN_BYTES, else inline."""
    if rows <= 0:
        return
    if rows < 2 or rows * bytes_per_row < PARALLEL_MIN_BYTES:
        body(ctx, I64(0), I64(rows))
        return
    min_rows = max(1, -(-(PARALLEL_MIN_BYTES // 2) // max(1, bytes_per_row)))
    ctx.parallel_for(rows, body, grain=1, min_work=min_rows)


def for_rows(ctx: EmitContext, start: ir.Value, stop: ir.Value, body: Callable[[ir.Value], None],
             name: str = "row") -> None:
    """`for r in range(start, stop): body(r)`."""
    with ctx.for_range(start, stop, 1, name=name) as r:
        body(r)


def stream_rows(ctx: EmitContext, offset: int, row_len: int, rows: int, itemsize: int = 4) -> bool:
    """Whether a row-major output may use streaming stores: big, and every row starts aligned."""
    w = ctx.lanes * 4 // itemsize
    return ctx.streams(offset, itemsize, rows * row_len, w) and (row_len * itemsize) % (w * itemsize) == 0



# ── softmax pieces (Softmax, the cross-entropy losses) ──────────────────────

def row_max(ctx: EmitContext, n: int, load: Callable[[Index, int], ir.Value]) -> ir.Value:
    """NaN-ignoring max of a row (−inf for an empty or all-NaN row)."""
    (m,) = reduce_row(ctx, n, lambda j, w: (load(j, w),), [MAX])
    return m


def exp_sum(ctx: EmitContext, n: int, load: Callable[[Index, int], ir.Value], m: ir.Value,
            store: Callable[[Index, ir.Value], None] | None = None) -> ir.Value:
    """`Σ exp(v − m)` over a row with our vector exp; `store(j, e)` keeps each exponential."""
    from . import vecmath as vm
    b = ctx.b

    def term(j: Index, w: int) -> tuple[ir.Value]:
        e = vm.exp(b, b.fsub(load(j, w), splat(b, m, w), flags=FASTMATH))
        if store is not None:
            store(j, e)
        return (e,)
    (s,) = reduce_row(ctx, n, term, [SUM], accs=1)  # exp's own ILP hides the one add chain
    return s


def prefetch(ctx: EmitContext, offset: int, index: Index, itemsize: int = 4) -> None:
    """Hint the cache line of element `index` of the slot at `offset` into L1 (`llvm.prefetch`);
    the index must lie inside the slot (the address is an inbounds gep)."""
    fn = ctx.intrinsic("llvm.prefetch.p0", ir.VoidType(), [ctx.arena.type, I32, I32, I32])
    ctx.b.call(fn, [ctx.addr(offset, index, itemsize), I32(0), I32(3), I32(1)])


def next_row_base(ctx: EmitContext, r: ir.Value, rows: int, row_len: int) -> ir.Value:
    """Element index of row `min(r + 1, rows − 1)` — a prefetch target that stays in the slot."""
    b = ctx.b
    nxt = b.add(r, I64(1))
    return imul(b, b.select(b.icmp_signed("<", nxt, I64(rows)), nxt, I64(rows - 1)), row_len)
