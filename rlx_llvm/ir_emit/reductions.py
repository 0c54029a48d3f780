"""Softmax, reductions, scans (and CumsumBackward), selection and histograms (semantics.md §2.6, §3.3, §3.6).

Every kernel is an explicit vector loop.  Layout `[outer, reduced, inner]`: with `inner == 1` a
row is contiguous and is reduced with several `<W x T>` accumulators (`rows.reduce_row`); with
`inner > 1` the W lanes of a vector are W neighbouring `inner` positions, so each step along the
reduced axis is one contiguous vector load (never a strided scalar walk).  Max/Min ignore NaN
(Rust `f32::max/min`), sums reassociate across lanes (as RLX's SIMD paths do).  Work splits
across rlx_llvm's threads by rows (or row × position blocks) when there is enough of it.
CumsumBackward is the reverse running sum: a forward scan of each reversed W-vector from the end.
"""
from __future__ import annotations

import math
from typing import Callable

from llvmlite import ir

from .. import thunks as T
from ..dtypes import DType
from ..errors import ValidationError
from ..ops import ReduceOp
from .context import EmitContext
from .toolkit import (F32, F64, FASTMATH, I1, I32, I64, Index, as_value, call_intrinsic, carried_loop, const,
                      entry_alloca, fconst, iadd, imul, is_nan, lane_ids, lane_index, load_lanes, nan_max, nan_min,
                      prefetch, span_loop, splat, store_lanes, vec, width_of)
from ..registry import lowering
from .rows import MAX, MIN, PROD, SUM, Combine, exp_sum, next_row_base, parallel_rows, reduce_row, row_max

ARG_ACCS = 4           # independent (value, index) accumulator pairs per ArgReduce row
POSITION_BLOCK = 64    # inner positions per work unit when the reduced axis is strided
ACC_BLOCK = 2048       # inner elements accumulated in dst per sweep of the reduced axis (8 KiB)


def position_units(ctx: EmitContext, outer: int, inner: int, block: int, bytes_per_unit: int,
                   each: Callable[[EmitContext, ir.Value, ir.Value, ir.Value], None]) -> None:
    """Split `[outer] × [inner in blocks of block]` into work units; `each(sub, o, i0, i1)`."""
    blocks = -(-inner // block)

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="unit") as u:
            b = sub.b
            o = b.udiv(u, I64(blocks))
            i0 = imul(b, b.urem(u, I64(blocks)), block)
            i1 = b.add(i0, I64(block))
            each(sub, o, i0, b.select(b.icmp_signed("<", i1, I64(inner)), i1, I64(inner)))
    parallel_rows(ctx, outer * blocks, bytes_per_unit, body)


# ── Softmax ─────────────────────────────────────────────────────────────────

def check_softmax(t) -> None:
    """`inner ≥ 1` divides `rows` (rows = outer·inner)."""
    if t.inner < 1:
        raise ValidationError(f"inner = {t.inner}; the softmax axis stride must be ≥ 1", field="inner")
    if t.rows % t.inner:
        raise ValidationError(f"inner = {t.inner} does not divide rows = {t.rows} (rows = outer·inner)",
                              field="inner")


@lowering(T.Softmax, check=check_softmax, inplace=True)
def softmax(ctx: EmitContext, t) -> None:
    """In place: `m = max` (NaN-ignoring), `e = exp(x − m)`, `y = e · (1/Σe)`.

    Contiguous rows take three passes over a row held in L1 (max; exp, stored, summed; scale);
    with `inner > 1` the same three passes run over W neighbouring columns at once."""
    softmax_from(ctx, t, t.data)


def softmax_from(ctx: EmitContext, t, src: int) -> None:
    """Softmax `t` reading its input from `src` (disjoint from `t.data`, or `t.data` itself) and
    writing `t.data`: out of place, `Copy(src → data)` then the in-place Softmax without the copy's
    pass, bit for bit (`ir_emit.peephole`).  The max and exp passes read `src`; the exponentials go
    to `data`, which the scale pass rescales in place (ONNX Runtime's MLAS kernel does the same)."""
    if not (t.rows and t.cols):
        return
    if t.inner == 1:
        parallel_rows(ctx, t.rows, 8 * t.cols, lambda sub, s, e: _softmax_rows(sub, t, src, s, e))
        return
    outer = t.rows // t.inner
    position_units(ctx, outer, t.inner, POSITION_BLOCK, 8 * t.cols * POSITION_BLOCK,
                   lambda sub, o, i0, i1: span_loop(sub, i0, i1,
                                                    lambda i, w, m: _softmax_columns(sub, t, src, o, i, w, m)))


def _softmax_rows(ctx: EmitContext, t, src: int, start: ir.Value, stop: ir.Value) -> None:
    """Rows `[start, stop)` of `src`: max; exp, stored in `data`, summed; scale `data` by 1/Σ."""
    b = ctx.b
    dst = t.data
    with ctx.for_range(start, stop, name="row") as r:
        base = imul(b, r, t.cols)

        def load(j: Index, w: int, at: int = src) -> ir.Value:
            return ctx.load(at, F32, iadd(b, base, j), w)
        m = row_max(ctx, t.cols, load)
        ahead = next_row_base(ctx, r, t.rows, t.cols)

        def keep(j: Index, e: ir.Value) -> None:
            if width_of(e) > 1:  # the next row comes in while exp keeps the core busy
                prefetch(ctx, src, iadd(b, ahead, j), 4)
            ctx.store(dst, e, iadd(b, base, j))
        s = exp_sum(ctx, t.cols, load, m, store=keep)
        rinv = b.fdiv(ir.Constant(F32, 1.0), s)
        ctx.vector_loop(t.cols, lambda j, w: ctx.store(
            dst, b.fmul(load(j, w, dst), splat(b, rinv, w), flags=FASTMATH), iadd(b, base, j)), name="scale")


def _softmax_columns(ctx: EmitContext, t, src: int, o: ir.Value, i: ir.Value, w: int, mask) -> None:
    """Softmax of the W columns (the lanes in `mask`) from inner position `i` of outer slice `o`."""
    from . import vecmath as vm
    b = ctx.b
    base = iadd(b, imul(b, o, t.cols * t.inner), i)

    def at(j: ir.Value) -> ir.Value:
        return iadd(b, base, imul(b, j, t.inner))

    def load(j: ir.Value, offset: int = src) -> ir.Value:
        return load_lanes(ctx, offset, F32, at(j), w, mask)
    (m,) = carried_loop(ctx, 0, t.cols, 1, [fconst(vec(F32, w), -math.inf)],
                        lambda j, a: [MAX(ctx, a[0], load(j))], name="max")

    def exps(j: ir.Value, a: list) -> list:
        e = vm.exp_shifted(b, b.fsub(load(j), m, flags=FASTMATH))
        store_lanes(ctx, t.data, e, at(j), mask)
        return [b.fadd(a[0], e, flags=FASTMATH)]
    (s,) = carried_loop(ctx, 0, t.cols, 1, [fconst(vec(F32, w), 0.0)], exps, name="exp")
    rinv = b.fdiv(fconst(s, 1.0), s)
    with ctx.for_range(0, t.cols, name="scale") as j:
        store_lanes(ctx, t.data, b.fmul(load(j, t.data), rinv, flags=FASTMATH), at(j), mask)


# ── Reduce / ReduceSumF64 ───────────────────────────────────────────────────

COMBINE = {ReduceOp.Sum: SUM, ReduceOp.Mean: SUM, ReduceOp.Max: MAX, ReduceOp.Min: MIN, ReduceOp.Prod: PROD}


@lowering(T.Reduce)
def reduce(ctx: EmitContext, t) -> None:
    """`[outer, reduced, inner] → [outer, inner]`: Sum, Mean (= Sum / reduced), Max/Min (NaN-ignoring,
    from ∓inf), Prod (from 1)."""
    emit_reduce(ctx, F32, COMBINE[t.op], t.op is ReduceOp.Mean, t.src, t.dst, t.outer, t.reduced, t.inner)


@lowering(T.ReduceSumF64)
def reduce_sum_f64(ctx: EmitContext, t) -> None:
    """f64 sum over the reduced axis."""
    emit_reduce(ctx, F64, SUM, False, t.src, t.dst, t.outer, t.reduced, t.inner)


def emit_reduce(ctx: EmitContext, elem: ir.Type, op: Combine, mean: bool, src: int, dst: int, outer: int,
                reduced: int, inner: int) -> None:
    """One reduction kernel for every op and element type."""
    if not (outer and inner):
        return
    size = 4 if elem == F32 else 8
    w = ctx.lanes * 4 // size
    b_count = ir.Constant(elem, float(reduced))

    def finish(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
        return b.fdiv(v, splat(b, b_count, width_of(v))) if mean else v

    if inner == 1:
        def rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
            b = sub.b
            with sub.for_range(start, stop, name="row") as o:
                base = imul(b, o, reduced)
                (v,) = reduce_row(sub, reduced, lambda j, lanes: (sub.load(src, elem, iadd(b, base, j), lanes),),
                                  [op], elem=elem)
                sub.store(dst, finish(b, v), o)
        parallel_rows(ctx, outer, size * reduced, rows)
        return

    def sweep(sub: EmitContext, o: ir.Value, i0: ir.Value, i1: ir.Value) -> None:
        """dst[o, i0:i1] accumulates src[o, r, i0:i1] for r = 0, 1, … (each element in order)."""
        b = sub.b
        out = imul(b, o, inner)
        row = imul(b, o, reduced * inner)
        def first(i: ir.Value, lanes: int, mask) -> None:  # identity ⊕ slice 0 (max(−inf, NaN) = −inf)
            v = fconst(vec(elem, lanes), op.identity)
            if reduced:
                v = op(sub, v, load_lanes(sub, src, elem, iadd(b, row, i), lanes, mask))
            store_lanes(sub, dst, v, iadd(b, out, i), mask)
        span_loop(sub, i0, i1, first, width=w)
        if reduced > 1:
            with sub.for_range(1, reduced, name="red") as r:
                rbase = iadd(b, row, imul(b, r, inner))

                def acc(i: ir.Value, lanes: int, mask) -> None:
                    cur = load_lanes(sub, dst, elem, iadd(b, out, i), lanes, mask)
                    nxt = op(sub, cur, load_lanes(sub, src, elem, iadd(b, rbase, i), lanes, mask))
                    store_lanes(sub, dst, nxt, iadd(b, out, i), mask)
                span_loop(sub, i0, i1, acc, width=w)
        if mean:
            span_loop(sub, i0, i1, lambda i, lanes, mask: store_lanes(
                sub, dst, finish(b, load_lanes(sub, dst, elem, iadd(b, out, i), lanes, mask)), iadd(b, out, i), mask),
                width=w)
    position_units(ctx, outer, inner, ACC_BLOCK, size * max(1, reduced) * min(inner, ACC_BLOCK), sweep)


# ── ArgReduce ───────────────────────────────────────────────────────────────

def check_arg_reduce(t) -> None:
    """A non-empty reduced axis (there is no index of the max of nothing)."""
    if t.reduced == 0 and t.outer and t.inner:
        raise ValidationError("reduced = 0: arg-max/min of an empty axis has no index", field="reduced")


def beats(ctx: EmitContext, is_max: bool, v: ir.Value, best: ir.Value) -> ir.Value:
    """`v` replaces `best` when strictly better, or when `v` is the first NaN (NaN is the extreme,
    as in PyTorch/NumPy argmax)."""
    b = ctx.b
    strict = b.fcmp_ordered(">" if is_max else "<", v, best)
    first_nan = b.and_(is_nan(b, v), b.not_(is_nan(b, best)))
    return b.or_(strict, first_nan)


def beats_with_index(ctx: EmitContext, is_max: bool, v: ir.Value, vi: ir.Value, best: ir.Value, bi: ir.Value
                     ) -> ir.Value:
    """`beats`, or the same value (or both NaN) at a smaller index — for merging lanes."""
    b = ctx.b
    same = b.or_(b.fcmp_ordered("==", v, best), b.and_(is_nan(b, v), is_nan(b, best)))
    return b.or_(beats(ctx, is_max, v, best), b.and_(same, b.icmp_signed("<", vi, bi)))


def merge_lanes(ctx: EmitContext, is_max: bool, best: ir.Value, idx: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Reduce per-lane (value, index) candidates to one by halving the vector (first index on ties)."""
    b = ctx.b
    w = width_of(best)
    while w > 1:
        h = w // 2

        def half(v: ir.Value, lo: int) -> ir.Value:
            mask = ir.Constant(ir.VectorType(I32, h), [ir.Constant(I32, lo + k) for k in range(h)])
            out = b.shuffle_vector(v, ir.Constant(v.type, None), mask)
            return b.extract_element(out, I32(0)) if h == 1 else out
        lo_v, hi_v, lo_i, hi_i = half(best, 0), half(best, h), half(idx, 0), half(idx, h)
        take = beats_with_index(ctx, is_max, hi_v, hi_i, lo_v, lo_i)
        best, idx = b.select(take, hi_v, lo_v), b.select(take, hi_i, lo_i)
        w = h
    return best, idx


@lowering(T.ArgReduce, check=check_arg_reduce)
def arg_reduce(ctx: EmitContext, t) -> None:
    """f32 index of the max (`is_max`) or min along the reduced axis; first occurrence on ties,
    a NaN counts as the extreme (first NaN wins)."""
    if not (t.outer and t.inner):
        return
    if t.inner == 1:
        parallel_rows(ctx, t.outer, 4 * t.reduced, lambda sub, s, e: _argreduce_rows(sub, t, s, e))
        return
    position_units(ctx, t.outer, t.inner, POSITION_BLOCK, 4 * t.reduced * POSITION_BLOCK,
                   lambda sub, o, i0, i1: span_loop(sub, i0, i1,
                                                    lambda i, w, m: _argreduce_columns(sub, t, o, i, w, m)))


def _argreduce_rows(ctx: EmitContext, t, start: ir.Value, stop: ir.Value) -> None:
    b, w, n = ctx.b, ctx.lanes, t.reduced
    with ctx.for_range(start, stop, name="row") as o:
        base = imul(b, o, n)

        def load(j: Index, lanes: int) -> ir.Value:
            return ctx.load(t.src, F32, iadd(b, base, j), lanes)

        def update(j: Index, lanes: int, cur: list) -> list:
            v = load(j, lanes)
            at = lane_index(b, j, lanes)
            take = beats(ctx, t.is_max, v, cur[0])
            return [b.select(take, v, cur[0]), b.select(take, at, cur[1])]
        if n >= w:
            # ARG_ACCS independent (value, index) pairs, each seeing its vectors in index order
            accs = min(ARG_ACCS, n // w)
            block = accs * w
            main = n - n % block
            init = [x for u in range(accs) for x in (load(u * w, w), b.add(lane_ids(w), const(I64, u * w, w)))]

            def step(j: ir.Value, cur: list) -> list:
                return [x for u in range(accs) for x in update(iadd(b, j, u * w), w, cur[2 * u:2 * u + 2])]
            flat = carried_loop(ctx, block, main, block, init, step, name="arg")
            pairs = [flat[2 * u:2 * u + 2] for u in range(accs)]
            for s in range(main, n - n % w, w):  # leftover whole vectors (larger indices) → pair 0
                pairs[0] = update(s, w, pairs[0])
            best, idx = pairs[0]
            for other_v, other_i in pairs[1:]:
                take = beats_with_index(ctx, t.is_max, other_v, other_i, best, idx)
                best, idx = b.select(take, other_v, best), b.select(take, other_i, idx)
            best, idx = merge_lanes(ctx, t.is_max, best, idx)
            first = n - n % w
        else:
            best, idx, first = load(0, 1), I64(0), 1
        best, idx = carried_loop(ctx, first, n, 1, [best, idx], lambda j, cur: update(j, 1, cur), name="arg.tail")
        ctx.store(t.dst, b.sitofp(idx, F32), o)


def _argreduce_columns(ctx: EmitContext, t, o: ir.Value, i: ir.Value, w: int, mask) -> None:
    b = ctx.b
    base = iadd(b, imul(b, o, t.reduced * t.inner), i)

    def update(r: ir.Value, cur: list) -> list:
        v = load_lanes(ctx, t.src, F32, iadd(b, base, imul(b, r, t.inner)), w, mask)
        take = beats(ctx, t.is_max, v, cur[0])
        return [b.select(take, v, cur[0]), b.select(take, splat(b, r, w), cur[1])]
    zero = const(I64, 0, w)
    _, idx = carried_loop(ctx, 1, t.reduced, 1, [load_lanes(ctx, t.src, F32, base, w, mask), zero], update,
                          name="arg")
    store_lanes(ctx, t.dst, b.sitofp(idx, vec(F32, w)), iadd(b, imul(b, o, t.inner), i), mask)


# ── TopK ────────────────────────────────────────────────────────────────────

def check_top_k(t) -> None:
    """Rows are non-empty when indices are asked for (round one reads element 0)."""
    if t.axis_dim == 0 and t.k and t.outer:
        raise ValidationError("axis_dim = 0: top-k of an empty row has no element 0 to return",
                              field="axis_dim")


@lowering(T.TopK, check=check_top_k)
def top_k(ctx: EmitContext, t) -> None:
    """RLX's k rounds of strictly-greater arg-max from element 0 (chosen element → −inf), computed
    in one pass: a list of the best `min(k, axis_dim)` (value, index) pairs sorted by value, a
    vector pre-filter of each W elements against the list's last value, and insertion after equal
    values (ties → smaller index).  Element 0 enters first with key +inf when it is NaN; −inf and
    NaN at j ≥ 1 never beat the filter; unused slots are (−inf, index 0), which is why
    `k > axis_dim` repeats index 0 — exactly the rounds' results.  Up to W entries the list lives
    in two vector registers (branch-free insertion); longer lists live in per-thread scratch."""
    if not (t.outer and t.k):
        return
    parallel_rows(ctx, t.outer, 4 * t.axis_dim + 8 * t.k, lambda sub, s, e: _top_k_rows(sub, t, s, e))


class RegisterList:
    """The sorted (value, index) list as `<kk x float>`, `<kk x i64>` (kk ≤ W)."""

    def __init__(self, ctx: EmitContext, kk: int) -> None:
        self.ctx, self.kk = ctx, kk
        self.vals = entry_alloca(ctx, vec(F32, kk), "topk.vals")
        self.idxs = entry_alloca(ctx, vec(I64, kk), "topk.idxs")

    def reset(self, key0: ir.Value) -> None:
        """Slot 0 = (key0, 0), the rest (−inf, 0)."""
        b = self.ctx.b
        filler = fconst(vec(F32, self.kk), -math.inf)
        b.store(b.insert_element(filler, key0, I32(0)) if self.kk > 1 else key0, self.vals)
        b.store(const(I64, 0, self.kk), self.idxs)

    def last(self) -> ir.Value:
        """The k-th kept value (the filter threshold)."""
        b = self.ctx.b
        v = b.load(self.vals, typ=vec(F32, self.kk))
        return v if self.kk == 1 else b.extract_element(v, I32(self.kk - 1))

    def insert(self, v: ir.Value, j: ir.Value) -> None:
        """Lanes before p = #(kept ≥ v) stay, lane p takes (v, j), later lanes shift up by one."""
        b, kk = self.ctx.b, self.kk
        if kk == 1:
            cur = b.load(self.vals, typ=F32)
            better = b.fcmp_ordered(">", v, cur)
            b.store(b.select(better, v, cur), self.vals)
            b.store(b.select(better, j, b.load(self.idxs, typ=I64)), self.idxs)
            return
        vals, idxs = b.load(self.vals, typ=vec(F32, kk)), b.load(self.idxs, typ=vec(I64, kk))
        keep = b.fcmp_unordered(">=", vals, splat(b, v, kk))  # a NaN v keeps every lane
        bits = b.bitcast(keep, ir.IntType(kk))
        pos = b.zext(call_intrinsic(self.ctx, f"llvm.ctpop.i{kk}", [bits]), I64)
        lanes = lane_ids(kk)
        before = b.icmp_signed("<", lanes, splat(b, pos, kk))
        at = b.icmp_signed("==", lanes, splat(b, pos, kk))
        down = ir.Constant(ir.VectorType(I32, kk), [ir.Constant(I32, max(0, l - 1)) for l in range(kk)])
        moved_v = b.shuffle_vector(vals, vals, down)
        moved_i = b.shuffle_vector(idxs, idxs, down)
        b.store(b.select(before, vals, b.select(at, splat(b, v, kk), moved_v)), self.vals)
        b.store(b.select(before, idxs, b.select(at, splat(b, j, kk), moved_i)), self.idxs)

    def index(self, p: int) -> ir.Value:
        """Index kept in slot `p` (a compile-time slot)."""
        b = self.ctx.b
        v = b.load(self.idxs, typ=vec(I64, self.kk))
        return v if self.kk == 1 else b.extract_element(v, I32(p))


class ScratchList:
    """The sorted list as `vals[kk]` f32 and `idxs[kk]` i64 in per-thread scratch (kk > W)."""

    def __init__(self, ctx: EmitContext, kk: int) -> None:
        self.ctx, self.kk = ctx, kk
        self.vals_at, self.idxs_at = ctx.scratch_alloc(4 * kk), ctx.scratch_alloc(8 * kk)
        self.pos = entry_alloca(ctx, I64, "topk.pos")

    def _val(self, p: Index) -> ir.Value:
        return self.ctx.load(self.vals_at, F32, p, base=self.ctx.scratch)

    def _idx(self, p: Index) -> ir.Value:
        return self.ctx.load(self.idxs_at, I64, p, base=self.ctx.scratch)

    def _put(self, p: Index, v: ir.Value, j: ir.Value) -> None:
        self.ctx.store(self.vals_at, v, p, base=self.ctx.scratch)
        self.ctx.store(self.idxs_at, j, p, base=self.ctx.scratch)

    def reset(self, key0: ir.Value) -> None:
        """Slot 0 = (key0, 0), the rest (−inf, 0)."""
        with self.ctx.for_range(0, self.kk, name="clear") as p:
            self._put(p, ir.Constant(F32, -math.inf), I64(0))
        self._put(0, key0, I64(0))

    def last(self) -> ir.Value:
        """The k-th kept value."""
        return self._val(self.kk - 1)

    def insert(self, v: ir.Value, j: ir.Value) -> None:
        """Shift the entries smaller than v up by one (dropping the last), put (v, j) in the gap."""
        ctx, b = self.ctx, self.ctx.b
        b.store(I64(self.kk - 1), self.pos)
        header = ctx.fn.append_basic_block("ins.header")
        shift = ctx.fn.append_basic_block("ins.shift")
        done = ctx.fn.append_basic_block("ins.done")
        b.branch(header)
        b.position_at_end(header)
        p = b.load(self.pos, typ=I64)
        has_prev = b.icmp_signed(">", p, I64(0))
        prev = b.select(has_prev, b.sub(p, I64(1)), I64(0))
        b.cbranch(b.and_(has_prev, b.fcmp_ordered("<", self._val(prev), v)), shift, done)
        b.position_at_end(shift)
        self._put(p, self._val(prev), self._idx(prev))
        b.store(prev, self.pos)
        b.branch(header)
        b.position_at_end(done)
        self._put(b.load(self.pos, typ=I64), v, j)

    def index(self, p: Index) -> ir.Value:
        """Index kept in slot `p`."""
        return self._idx(p)


def _top_k_rows(ctx: EmitContext, t, start: ir.Value, stop: ir.Value) -> None:
    b, n, w = ctx.b, t.axis_dim, ctx.lanes
    kk = min(t.k, n)
    kept = RegisterList(ctx, kk) if kk <= w else ScratchList(ctx, kk)
    thr_slot = entry_alloca(ctx, F32, "topk.thr")
    bits_slot = entry_alloca(ctx, ir.IntType(w), "topk.bits")

    with ctx.for_range(start, stop, name="row") as r:
        base = imul(b, r, n)
        x0 = ctx.load(t.src, F32, base)
        kept.reset(b.select(is_nan(b, x0), ir.Constant(F32, math.inf), x0))
        b.store(kept.last(), thr_slot)

        def consider(j: ir.Value) -> None:
            v = ctx.load(t.src, F32, iadd(b, base, j))
            if isinstance(kept, RegisterList):  # branch-free: v ≤ the last value inserts nowhere
                kept.insert(v, j)
                b.store(kept.last(), thr_slot)
                return
            with b.if_then(b.fcmp_ordered(">", v, b.load(thr_slot, typ=F32))):
                kept.insert(v, j)
                b.store(kept.last(), thr_slot)

        def block(j: Index, skip_first: bool) -> None:
            v = ctx.load(t.src, F32, iadd(b, base, j), w)
            hits = b.bitcast(b.fcmp_ordered(">", v, splat(b, b.load(thr_slot, typ=F32), w)), ir.IntType(w))
            if skip_first:  # element 0 is already in the list
                hits = b.and_(hits, ir.Constant(ir.IntType(w), (1 << w) - 2))
            b.store(hits, bits_slot)
            _each_set_bit(ctx, bits_slot, w, lambda lane: consider(iadd(b, as_value(j), lane)))

        vec_end = n - n % w  # aligned W-blocks (element 0's lane masked off), then the tail
        if vec_end:
            block(0, True)
        if vec_end > w:
            with ctx.for_range(w, vec_end, w, name="scan") as j:
                block(j, False)
        with ctx.for_range(max(1, vec_end), n, name="scan.tail") as j:
            consider(j)
        out = imul(b, r, t.k)
        for p in range(t.k) if isinstance(kept, RegisterList) else ():
            idx = kept.index(p) if p < kk else I64(0)
            ctx.store(t.dst, idx if t.indices_i64 else b.sitofp(idx, F32), iadd(b, out, p))
        if isinstance(kept, ScratchList):
            with ctx.for_range(0, t.k, name="emit") as p:
                inside = b.icmp_signed("<", p, I64(kk))
                idx = b.select(inside, kept.index(b.select(inside, p, I64(0))), I64(0))
                ctx.store(t.dst, idx if t.indices_i64 else b.sitofp(idx, F32), iadd(b, out, p))


def _each_set_bit(ctx: EmitContext, bits_slot: ir.Value, w: int, body: Callable[[ir.Value], None]) -> None:
    """`while bits: body(cttz(bits)); bits &= bits - 1` over the `i<w>` mask in `bits_slot`."""
    b = ctx.b
    ity = ir.IntType(w)
    header = ctx.fn.append_basic_block("bits.header")
    loop = ctx.fn.append_basic_block("bits.body")
    done = ctx.fn.append_basic_block("bits.done")
    b.branch(header)
    b.position_at_end(header)
    bits = b.load(bits_slot, typ=ity)
    b.cbranch(b.icmp_unsigned("!=", bits, ir.Constant(ity, 0)), loop, done)
    b.position_at_end(loop)
    lane = b.zext(call_intrinsic(ctx, f"llvm.cttz.i{w}", [bits, ir.Constant(I1, 1)], ret=ity), I64)
    b.store(b.and_(bits, b.sub(bits, ir.Constant(ity, 1))), bits_slot)
    body(lane)
    b.branch(header)
    b.position_at_end(done)


# ── Cumsum / CumScan ────────────────────────────────────────────────────────

def check_cumsum(t) -> None:
    """The scan runs in f32 or i64 lanes."""
    if t.dtype not in (DType.F32, DType.I64):
        raise ValidationError(f"dtype {t.dtype}: Cumsum runs in f32 or i64 lanes", field="dtype")


@lowering(T.Cumsum, check=check_cumsum, inplace=True)
def cumsum(ctx: EmitContext, t) -> None:
    """Running sum along the last axis (f32, or wrapping i64); `exclusive` writes the sum before
    adding.  Each vector is scanned in log₂W shifted adds, then offset by the carried total."""
    elem = I64 if t.dtype is DType.I64 else F32
    emit_scan(ctx, t, elem, "add", 0)


@lowering(T.CumScan, check=None, inplace=True)
def cum_scan(ctx: EmitContext, t) -> None:
    """Running product (`is_max = false`, from 1) or NaN-ignoring maximum (from −inf), f32."""
    emit_scan(ctx, t, F32, "max" if t.is_max else "mul", -math.inf if t.is_max else 1.0)


def _scan_op(ctx: EmitContext, kind: str, x: ir.Value, y: ir.Value) -> ir.Value:
    b = ctx.b
    if kind == "max":
        return nan_max(ctx, x, y)
    if isinstance(x.type.element if isinstance(x.type, ir.VectorType) else x.type, ir.IntType):
        return b.add(x, y)
    return (b.fadd if kind == "add" else b.fmul)(x, y, flags=FASTMATH)


def _shift_in(b: ir.IRBuilder, x: ir.Value, d: int, fill: ir.Value) -> ir.Value:
    """Lanes moved up by `d`, the low `d` lanes taken from `fill`."""
    w = width_of(x)
    mask = [ir.Constant(I32, l - d if l >= d else w + l) for l in range(w)]
    return b.shuffle_vector(x, fill, ir.Constant(ir.VectorType(I32, w), mask))


def _broadcast_last(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    w = width_of(x)
    return b.shuffle_vector(x, ir.Constant(x.type, None), ir.Constant(ir.VectorType(I32, w), [w - 1] * w))


def emit_scan(ctx: EmitContext, t, elem: ir.Type, kind: str, identity: float) -> None:
    """Inclusive/exclusive scan of `kind` ("add", "mul", "max") along rows of `cols` elements."""
    if not (t.rows and t.cols):
        return
    size = 8 if elem == I64 else 4
    w = ctx.lanes * 4 // size
    ident = (lambda lanes: const(elem, int(identity), lanes)) if elem == I64 else \
        (lambda lanes: fconst(vec(elem, lanes), identity))

    def rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        with sub.for_range(start, stop, name="row") as r:
            base = imul(b, r, t.cols)
            vec_end = t.cols - t.cols % w

            def block(j: ir.Value, cur: list) -> list:
                x = sub.load(t.src, elem, iadd(b, base, j), w)
                s, d = x, 1
                while d < w:
                    s = _scan_op(sub, kind, s, _shift_in(b, s, d, ident(w)))
                    d *= 2
                if t.exclusive:
                    y = _scan_op(sub, kind, cur[0], _shift_in(b, s, 1, ident(w)))
                    nxt = _scan_op(sub, kind, cur[0], _broadcast_last(b, s))
                else:
                    y = _scan_op(sub, kind, cur[0], s)
                    nxt = _broadcast_last(b, y)
                sub.store(t.dst, y, iadd(b, base, j))
                return [nxt]
            carry = ident(1)
            if vec_end:
                (cv,) = carried_loop(sub, 0, vec_end, w, [ident(w)], block, name="scan")
                carry = b.extract_element(cv, I32(0))

            def tail(j: ir.Value, cur: list) -> list:
                x = sub.load(t.src, elem, iadd(b, base, j))
                nxt = _scan_op(sub, kind, cur[0], x)
                sub.store(t.dst, cur[0] if t.exclusive else nxt, iadd(b, base, j))
                return [nxt]
            carried_loop(sub, vec_end, t.cols, 1, [carry], tail, name="scan.tail")
    parallel_rows(ctx, t.rows, 2 * size * t.cols, rows)


# ── CumsumBackward ──────────────────────────────────────────────────────────

def _reversed(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    w = width_of(v)
    return b.shuffle_vector(v, ir.Constant(v.type, None), ir.Constant(vec(I32, w), [w - 1 - k for k in range(w)]))


@lowering(T.CumsumBackward, inplace=True)
def cumsum_backward(ctx: EmitContext, t) -> None:
    """`dx[j] = Σ_{k ≥ j} dy[k]` (`k > j` when exclusive), f32 from the row's end: W-vectors taken
    from the end are reversed, scanned in log₂W shifted adds, offset by the carried total, reversed back."""
    cols = t.cols
    if not (t.rows and cols):
        return
    w = ctx.lanes
    blocks, lead = cols // w, cols % w

    def rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        zero = fconst(vec(F32, w), 0.0)
        with sub.for_range(start, stop, name="row") as r:
            base = imul(b, r, cols)

            def block(k: ir.Value, cur: list) -> list:
                at = iadd(b, base, b.sub(I64(cols - w), b.mul(k, I64(w))))
                p, d = _reversed(b, sub.load(t.dy, F32, at, w)), 1
                while d < w:
                    p = b.fadd(p, _shift_in(b, p, d, zero), flags=FASTMATH)
                    d *= 2
                y = b.fadd(cur[0], _shift_in(b, p, 1, zero) if t.exclusive else p, flags=FASTMATH)
                sub.store(t.dx, _reversed(b, y), at)
                return [b.fadd(cur[0], _broadcast_last(b, p), flags=FASTMATH)]
            carry = ir.Constant(F32, 0.0)
            if blocks:
                (cv,) = carried_loop(sub, 0, blocks, 1, [zero], block, name="rscan")
                carry = b.extract_element(cv, I32(0))

            def head(i: ir.Value, cur: list) -> list:
                at = iadd(b, base, b.sub(I64(lead - 1), i))
                nxt = b.fadd(cur[0], sub.load(t.dy, F32, at), flags=FASTMATH)
                sub.store(t.dx, cur[0] if t.exclusive else nxt, at)
                return [nxt]
            carried_loop(sub, 0, lead, 1, [carry], head, name="rscan.head")
    parallel_rows(ctx, t.rows, 8 * cols, rows)


# ── Histogram ───────────────────────────────────────────────────────────────

@lowering(T.Histogram)
def histogram(ctx: EmitContext, t) -> None:
    """f32 counts of `bins` equal-width buckets over [min, max]: bucket `floor((x−min)/(max−min)·bins)`
    in f32, `x == max` → last bin, values outside [min, max] and NaN dropped (u32 counters in
    scratch, converted at the end)."""
    if not t.bins:
        return
    b, bins = ctx.b, t.bins
    counts = ctx.scratch_alloc(4 * bins)
    with ctx.for_range(0, bins, name="zero") as k:
        ctx.store(counts, I32(0), k, base=ctx.scratch)
    lo, hi = ir.Constant(F32, t.min), ir.Constant(F32, t.max)
    span = b.fsub(hi, lo)
    last = ir.Constant(F32, float(bins - 1))

    def step(i: Index, lanes: int) -> None:
        x = ctx.load(t.src, F32, i, lanes)
        inside = b.and_(b.fcmp_ordered(">=", x, splat(b, lo, lanes)), b.fcmp_ordered("<=", x, splat(b, hi, lanes)))
        scaled = b.fmul(b.fdiv(b.fsub(x, splat(b, lo, lanes)), splat(b, span, lanes)),
                        fconst(vec(F32, lanes), float(bins)))
        floor = call_intrinsic(ctx, "llvm.floor", [scaled])
        at_max = b.fcmp_ordered("==", x, splat(b, hi, lanes))
        bucket = b.select(at_max, splat(b, last, lanes), floor)
        bucket = nan_min(ctx, nan_max(ctx, bucket, fconst(vec(F32, lanes), 0.0)), splat(b, last, lanes))
        k = b.fptosi(bucket, vec(I64, lanes))  # in [0, bins-1] (NaN → 0 by maxnum): no poison
        top = const(I64, bins - 1, lanes)
        k = b.select(b.icmp_signed(">", k, top), top, k)  # f32(bins-1) may round up for huge bins
        hit = b.zext(inside, vec(I32, lanes))
        for lane in range(lanes):
            kl = k if lanes == 1 else b.extract_element(k, I32(lane))
            hl = hit if lanes == 1 else b.extract_element(hit, I32(lane))
            ki = kl
            ctx.store(counts, b.add(ctx.load(counts, I32, ki, base=ctx.scratch), hl), ki, base=ctx.scratch)
    ctx.vector_loop(t.n, step)
    with ctx.for_range(0, bins, name="emit") as k:
        ctx.store(t.dst, b.uitofp(ctx.load(counts, I32, k, base=ctx.scratch), F32), k)
