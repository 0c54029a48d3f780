"""Row machinery shared by norms, softmax, reductions and losses.

* `reduce_row` — one pass over a contiguous row with several independent `<W x T>` accumulators
  per statistic (`reassoc` adds, so the chains overlap), a horizontal `llvm.vector.reduce.*` at
  the end and a scalar tail; one call can carry several statistics at once (Σx and Σx²).
* `Combine` — the associative reductions: Sum/Prod reassociate, Max/Min are NaN-ignoring
  (`llvm.maxnum`/`llvm.minnum`, Rust's `f32::max/min`).
* `row_offset` — per-row element offsets given as a compile-time list (`mod_off`, `gate_off`),
  folded into arithmetic when the list is affine in `row // period`, else a constant table.
* `parallel_rows` — split rows over rlx_llvm's threads when the thunk moves enough bytes.
* `row_max`, `exp_sum` — the softmax pieces.

Loops, masked tails, splats and index arithmetic are the toolkit's (`ir_emit.toolkit`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from llvmlite import ir

from . import vecmath as vm
from .context import EmitContext
from .toolkit import (F32, FASTMATH, I32, I64, REASSOC, Index, carried_loop, fconst, iadd, imul, scalar_of, sizeof,
                      splat, suffix, vec, width_of)

# Work (bytes moved) below which a row kernel stays on the calling thread, and the least work
# worth a thread of its own: a fork/join costs a few µs, ~20-40 KB of memory traffic.
PARALLEL_MIN_BYTES = 256 << 10


# ── reductions ──────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Combine:
    """An associative reduction of floats: its identity, pairwise combine and horizontal form."""

    name: str        # "fadd", "fmul", "fmax", "fmin" (the llvm.vector.reduce.* suffix)
    identity: float
    squares: bool = False   # a sum of squares: each term y enters as y², fused into the sum (`accumulate`)

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

    def accumulate(self, ctx: EmitContext, acc: ir.Value, y: ir.Value) -> ir.Value:
        """Fold the term `y` into an accumulator: `acc + y²` as one `llvm.fma` for a sum of squares, else
        `self(acc, y)`.  Explicit, not a `contract` fmul + fadd: whether that pair fuses is up to the
        optimizer (O3 on AVX-512 vectorizes a scalar tail's squares apart from their adds; the quick tier
        fuses them), and the bits must not depend on the tier or the target."""
        if self.squares:
            return vm.fma(ctx.b, y, y, acc)
        return self(ctx, acc, y)

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
SUM_SQUARES = Combine("fadd", 0.0, squares=True)   # Σ y² (partial sums combine as SUM's)
PROD = Combine("fmul", 1.0)
MAX = Combine("fmax", -math.inf)
MIN = Combine("fmin", math.inf)


Terms = Callable[[Index, int], Sequence[ir.Value]]


def reduce_row(ctx: EmitContext, n: int, terms: Terms, ops: Sequence[Combine], elem: ir.Type = F32,
               accs: int = 4, width: int | None = None) -> list[ir.Value]:
    """Reduce `terms(i, w)` (one value per op, `w` lanes from element `i`) over `i ∈ [0, n)`.

    `accs` independent vector accumulators per op in the main loop, the leftover whole vectors
    unrolled, a horizontal reduction, then a scalar loop over the last `n mod W` elements.
    """
    w = width or ctx.lanes * 4 // sizeof(elem)
    block = w * accs
    main = n - n % block
    vec_end = n - n % w
    acc = [[fconst(vec(elem, w), op.identity) for _ in range(accs)] for op in ops]

    def step(i: ir.Value, flat: list[ir.Value]) -> list[ir.Value]:
        out = list(flat)
        for u in range(accs):
            vals = terms(iadd(ctx.b, i, u * w), w)
            for k, op in enumerate(ops):
                out[k * accs + u] = op.accumulate(ctx, out[k * accs + u], vals[k])
        return out

    if main:
        flat = carried_loop(ctx, 0, main, block, [a for per in acc for a in per], step, name="acc")
        acc = [flat[k * accs:(k + 1) * accs] for k in range(len(ops))]
    for s in range(main, vec_end, w):
        vals = terms(s, w)
        for k, op in enumerate(ops):
            acc[k][0] = op.accumulate(ctx, acc[k][0], vals[k])
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
            return [op.accumulate(ctx, c, v) for op, c, v in zip(ops, cur, vals)]
        totals = carried_loop(ctx, vec_end, n, 1, totals, tail, name="acc.tail")
    return totals


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


def parallel_rows(ctx: EmitContext, rows: int, bytes_per_row: int, body: RowsBody, grain: int = 1) -> None:
    """Run `body(ctx, start, stop)` over row ranges of `[0, rows)`: split across rlx_llvm's
    threads (`ctx.parallel_for`, ranges start at multiples of `grain`) when the thunk moves
    ≥ PARALLEL_MIN_BYTES, else inline."""
    if rows <= 0:
        return
    if rows < 2 * grain or rows * bytes_per_row < PARALLEL_MIN_BYTES:
        body(ctx, I64(0), I64(rows))
        return
    min_rows = max(1, -(-(PARALLEL_MIN_BYTES // 2) // max(1, bytes_per_row)))
    ctx.parallel_for(rows, body, grain=grain, min_work=min_rows)


# Element ranges of a split streaming loop start at multiples of this many elements: a multiple
# of every vector width (≤ 64 lanes), so a vector never straddles two threads, a tiled input's
# lanes stay contiguous, and a 64-byte-aligned output stays aligned for streaming stores.
SPAN_GRAIN = 64

SpanBody = Callable[[EmitContext, ir.Value, int], None]


def parallel_elements(ctx: EmitContext, n: int, bytes_per_elem: int, body: SpanBody, width: int | None = None,
                      name: str = "i") -> None:
    """`body(ctx, i, W)` over whole vectors of `[0, n)` and `body(ctx, i, 1)` over the tail, the
    range split across rlx_llvm's threads when it moves ≥ PARALLEL_MIN_BYTES (`parallel_rows`;
    `bytes_per_elem = 0` keeps it on the calling thread, in order).  `body` must address everything through the `ctx` it gets (a split runs in its own function)."""
    parallel_rows(ctx, n, bytes_per_elem,
                  lambda sub, start, stop: span_vector_loop(sub, start, stop, lambda i, w: body(sub, i, w),
                                                            width, name),
                  grain=SPAN_GRAIN)


def span_vector_loop(ctx: EmitContext, start: Index, stop: Index, body: Callable[[ir.Value, int], None],
                     width: int | None = None, name: str = "i") -> None:
    """`toolkit.vector_loop` over the range `[start, stop)`: `body(i, W)` over whole vectors
    from `start`, then `body(i, 1)` over the last `(stop − start) mod W` elements."""
    b = ctx.b
    w = width or ctx.lanes
    first, last = (getattr(v, "constant", v) for v in (start, stop))
    if first == 0 and isinstance(last, int):  # the whole range, unsplit: the constant-bound loop
        return ctx.vector_loop(last, body, w, name)
    vec_stop = b.sub(stop, b.urem(b.sub(stop, start), I64(w))) if w > 1 else start
    if w > 1:
        with ctx.for_range(start, vec_stop, w, name=f"{name}.vec") as i:
            body(i, w)
    with ctx.for_range(vec_stop, stop, 1, name=f"{name}.tail") as i:
        body(i, 1)


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
    """`Σ exp(v − m)` over a row (v ≤ m: `vecmath.exp_shifted`); `store(j, e)` keeps each exponential."""
    from . import vecmath as vm
    b = ctx.b

    def term(j: Index, w: int) -> tuple[ir.Value]:
        e = vm.exp_shifted(b, b.fsub(load(j, w), splat(b, m, w), flags=FASTMATH))
        if store is not None:
            store(j, e)
        return (e,)
    (s,) = reduce_row(ctx, n, term, [SUM], accs=1)  # exp's own ILP hides the one add chain
    return s


def next_row_base(ctx: EmitContext, r: ir.Value, rows: int, row_len: int) -> ir.Value:
    """Element index of row `min(r + 1, rows − 1)` — a prefetch target that stays in the slot."""
    b = ctx.b
    nxt = b.add(r, I64(1))
    return imul(b, b.select(b.icmp_signed("<", nxt, I64(rows)), nxt, I64(rows - 1)), row_len)
