"""Random fills `RngNormal` / `RngUniform` and token sampling `Sample`, exactly as RLX draws them
(semantics.md §2.14, §2.15; docs/lowering-rng.md).

The schedule's `RngOptions` (seen here as `ctx.schedule.rng`) choose the generator when the program is
compiled.  Every thunk builds its generator from constants, so each run re-seeds and two runs write the
same bytes.  RLX's Philox4x32-10 is counter based: output word j is word `j mod 4` of the block whose
counter is `j div 4`, so a vector computes W consecutive blocks at once (the 32×32→64-bit products as
i64 multiplies) and groups of blocks are split across threads, equal to the sequential stream.  The
ORT-compatible Lehmer LCG (with rejection in the polar normals) is inherently sequential and runs as a
scalar loop.  ln, cos and exp are evaluated in f64 and rounded once to f32; the rest is f32 arithmetic in
RLX's order.
"""
from __future__ import annotations

from typing import Callable, Union

import numpy as np
from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..ops import RngBackend
from ..reference.rng import (BUMP0, BUMP1, F32_MIN_POSITIVE, LCG_A, LCG_M, M0, M1, ROUNDS, SAMPLE_DEFAULT_SEED,
                             TWO_PI_F32, combine_seed, ort_seed)
from ..registry import lowering
from . import vecmath as vm
from .context import EmitContext
from .rows import parallel_rows
from .toolkit import F32, F64, I1, I32, I64, carried_loop, const, counted_loop, lane_ids, splat, vec, width_of

Fill = Union[T.RngNormal, T.RngUniform]


# ── RLX's Philox4x32-10 ─────────────────────────────────────────────────────

def mul_wide(b: ir.IRBuilder, x: ir.Value, m: int) -> tuple[ir.Value, ir.Value]:
    """(hi, lo) 32-bit halves of the 64-bit product `x·m` of u32 lanes."""
    wide = vec(I64, width_of(x))
    p = b.mul(b.zext(x, wide), const(I64, m, width_of(x)))
    return b.trunc(b.lshr(p, const(I64, 32, width_of(x))), x.type), b.trunc(p, x.type)


def philox(b: ir.IRBuilder, counter: ir.Value, key: int) -> list[ir.Value]:
    """The four words of the blocks with counters `(counter, 0, 0, 0)` (u32 lanes) under the 64-bit `key`."""
    w = width_of(counter)
    zero = const(I32, 0, w)
    c = [counter, zero, zero, zero]
    k0, k1 = key & 0xFFFFFFFF, key >> 32
    for _ in range(ROUNDS):
        (hi0, lo0), (hi1, lo1) = mul_wide(b, c[0], M0), mul_wide(b, c[2], M1)
        c = [b.xor(b.xor(hi1, c[1]), const(I32, k0, w)), lo1, b.xor(b.xor(hi0, c[3]), const(I32, k1, w)), lo0]
        k0, k1 = (k0 + BUMP0) & 0xFFFFFFFF, (k1 + BUMP1) & 0xFFFFFFFF
    return c


def interleave(b: ir.IRBuilder, parts: list[ir.Value]) -> ir.Value:
    """Lanes `parts[0][0], parts[1][0], …, parts[0][1], …`: the words of consecutive blocks in stream order."""
    w, k = width_of(parts[0]), len(parts)
    while len(parts) > 1:   # concatenate pairwise (2 or 4 parts of equal width)
        parts = [b.shuffle_vector(x, y, ir.Constant(vec(I32, 2 * width_of(x)), list(range(2 * width_of(x)))))
                 for x, y in zip(parts[0::2], parts[1::2])]
    whole = parts[0]
    return b.shuffle_vector(whole, whole, ir.Constant(vec(I32, k * w), [j * w + blk for blk in range(w)
                                                                        for j in range(k)]))


def unit_f32(b: ir.IRBuilder, words: ir.Value) -> ir.Value:
    """`next_f32`: `(u32 >> 8) / 2^24` ∈ [0, 1) (exact)."""
    top = b.uitofp(b.lshr(words, const(I32, 8, width_of(words))), vec(F32, width_of(words)))
    return b.fmul(top, const(F32, 2.0 ** -24, width_of(words)))


def in_f64(b: ir.IRBuilder, fn: Callable, x: ir.Value) -> ir.Value:
    """`fn` of f32 lanes evaluated in f64, rounded once to f32."""
    return b.fptrunc(fn(b, b.fpext(x, vec(F64, width_of(x)))), x.type)


def box_muller(b: ir.IRBuilder, u1: ir.Value, u2: ir.Value) -> ir.Value:
    """`sqrt(−2·ln max(u1, MIN_POSITIVE))·cos(2π·u2)` (the cosine branch)."""
    w = width_of(u1)
    u1 = vm.maxnum(b, u1, const(F32, float(F32_MIN_POSITIVE), w))
    radius = vm.sqrt(b, b.fmul(const(F32, -2.0, w), in_f64(b, vm.log, u1)))
    return b.fmul(radius, in_f64(b, vm.cos, b.fmul(const(F32, float(TWO_PI_F32), w), u2)))


def affine(b: ir.IRBuilder, t: Fill, x: ir.Value) -> ir.Value:
    """Normal: `mean + scale·x`; uniform: `low + x·(high − low)` (each op rounded to f32)."""
    w = width_of(x)
    if isinstance(t, T.RngNormal):
        return b.fadd(const(F32, t.mean, w), b.fmul(const(F32, t.scale, w), x))
    return b.fadd(const(F32, t.low, w), b.fmul(x, b.fsub(const(F32, t.high, w), const(F32, t.low, w))))


def per_block(t: Fill) -> int:
    """Values per Philox block: 4 uniforms, or 2 normals (two words each)."""
    return 2 if isinstance(t, T.RngNormal) else 4


def philox_values(b: ir.IRBuilder, t: Fill, key: int, block0: ir.Value, w: int) -> ir.Value:
    """The `per_block(t)·w` values drawn from blocks `block0 … block0 + w` (u32 lanes), in stream order."""
    words = philox(b, b.add(splat(b, b.trunc(block0, I32), w), lane_ids(w, I32)), key)
    if isinstance(t, T.RngNormal):
        u1, u2 = (unit_f32(b, interleave(b, [words[j], words[j + 2]])) for j in (0, 1))
        return affine(b, t, box_muller(b, u1, u2))
    return affine(b, t, unit_f32(b, interleave(b, words)))


def philox_fill(ctx: EmitContext, t: Fill) -> None:
    """Groups of W whole blocks in parallel, then the last group's values lane by lane."""
    key, w, k = combine_seed(ctx.schedule.rng.seed, t.key), ctx.lanes, per_block(t)
    groups = t.len // k // w

    def run(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="group") as g:
            block0 = sub.b.mul(g, I64(w))
            sub.store(t.dst, philox_values(sub.b, t, key, block0, w), sub.b.mul(block0, I64(k)))
    parallel_rows(ctx, groups, 4 * k * w, run)
    done = groups * w * k
    if done < t.len:
        last = philox_values(ctx.b, t, key, I64(groups * w), w)
        for j in range(t.len - done):
            ctx.store(t.dst, ctx.b.extract_element(last, I32(j)), done + j)


# ── the ONNX-Runtime-compatible Lehmer LCG ───────────────────────────────────

def lcg_unit(b: ir.IRBuilder, state: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(next state `state·48271 mod (2^31 − 1)`, its unit `next/(M − 1)` rounded to f32)."""
    state = b.urem(b.mul(state, I64(LCG_A)), I64(LCG_M))
    return state, b.fptrunc(b.fdiv(b.uitofp(state, F64), ir.Constant(F64, float(LCG_M - 1))), F32)


def ort_uniform(ctx: EmitContext, t: T.RngUniform, seed: int) -> None:
    """`low + (high − low)·unit`, one unit per element."""
    b = ctx.b
    with counted_loop(ctx, 0, t.len, carried=[I64(seed % LCG_M)], name="draw") as loop:
        state, unit = lcg_unit(b, loop.values[0])
        ctx.store(t.dst, b.fadd(ir.Constant(F32, t.low), b.fmul(b.fsub(ir.Constant(F32, t.high),
                                                                        ir.Constant(F32, t.low)), unit)), loop.index)
        loop.carry([state])


def ort_normal(ctx: EmitContext, t: T.RngNormal, seed: int) -> None:
    """Marsaglia's polar method: draw `u = 2·unit − 1` twice until `0 < s = u1² + u2² < 1`, then
    `f = sqrt(−2·ln s / s)` gives the pair `u1·f·scale + mean`, `u2·f·scale + mean`."""
    if seed % LCG_M == 0 and t.len:
        raise ValidationError(f"the ORT engine seed {seed} is 0 mod 2^31 − 1: RLX's polar method never ends",
                              field="key" if t.op_seed is None else "op_seed")
    b, fn = ctx.b, ctx.fn
    head, accept, done = (fn.append_basic_block(f"polar.{n}") for n in ("draw", "accept", "done"))
    entry = b.block
    b.branch(head)
    b.position_at_end(head)
    i, state = b.phi(I64, name="i"), b.phi(I64, name="state")
    i.add_incoming(I64(0), entry)
    state.add_incoming(I64(seed % LCG_M), entry)
    state1, unit1 = lcg_unit(b, state)
    state2, unit2 = lcg_unit(b, state1)
    u1, u2 = (b.fsub(b.fmul(ir.Constant(F32, 2.0), u), ir.Constant(F32, 1.0)) for u in (unit1, unit2))
    s = b.fadd(b.fmul(u1, u1), b.fmul(u2, u2))
    ok = b.and_(b.fcmp_ordered("<", s, ir.Constant(F32, 1.0)), b.fcmp_ordered("!=", s, ir.Constant(F32, 0.0)))
    i.add_incoming(i, head)
    state.add_incoming(state2, head)
    b.cbranch(ok, accept, head)
    b.position_at_end(accept)
    f = vm.sqrt(b, b.fdiv(b.fmul(ir.Constant(F32, -2.0), in_f64(b, vm.log, s)), s))
    pair = [b.fadd(b.fmul(b.fmul(u, f), ir.Constant(F32, t.scale)), ir.Constant(F32, t.mean)) for u in (u1, u2)]
    ctx.store(t.dst, pair[0], i)
    second = b.add(i, I64(1))
    with b.if_then(b.icmp_signed("<", second, I64(t.len))):
        ctx.store(t.dst, pair[1], second)
    after = b.block
    nxt = b.add(i, I64(2))
    i.add_incoming(nxt, after)
    state.add_incoming(state2, after)
    b.cbranch(b.icmp_signed("<", nxt, I64(t.len)), head, done)
    b.position_at_end(done)


# ── the lowerings ───────────────────────────────────────────────────────────

def zero_fill(ctx: EmitContext, t: Fill) -> None:
    """`RngBackend.Zero`: every element 0."""
    ctx.vector_loop(t.len, lambda j, w: ctx.store(t.dst, const(F32, 0.0, w), j))


@lowering(T.RngNormal, T.RngUniform)
def rng_fill(ctx: EmitContext, t: Fill) -> None:
    """The fill under the schedule's `RngOptions` (Philox, Ort or Zero; Bnns is refused)."""
    backend = ctx.schedule.rng.backend
    if backend is RngBackend.Philox:
        philox_fill(ctx, t)
    elif backend is RngBackend.Zero:
        zero_fill(ctx, t)
    elif backend is RngBackend.Ort:
        if t.len:
            (ort_normal if isinstance(t, T.RngNormal) else ort_uniform)(ctx, t, ort_seed(t, ctx.schedule.rng))
    else:
        raise ValidationError(f"RngBackend.{backend.name} (Apple's AES-CTR stream) is not reproduced", field="rng")


# ── Sample ──────────────────────────────────────────────────────────────────

def check_sample(t: T.Sample) -> None:
    """`top_k ≤ vocab`, `top_p ∈ (0, 1]`, a non-empty vocabulary."""
    if t.top_k > t.vocab:
        raise ValidationError(f"top_k = {t.top_k} exceeds the vocabulary of {t.vocab}", field="top_k")
    if not 0.0 < float(np.float32(t.top_p)) <= 1.0:
        raise ValidationError(f"top_p = {t.top_p} is outside (0, 1]", field="top_p")
    if t.vocab == 0 and t.batch:
        raise ValidationError("vocab = 0: there is no token to sample", field="vocab")


class Row:
    """One row's f32 values (and, for top-p, two i32 orders and a 256-bin histogram) in per-thread scratch."""

    def __init__(self, ctx: EmitContext, vocab: int, sorts: bool) -> None:
        self.ctx, self.vocab = ctx, vocab
        self.values = ctx.scratch_alloc(4 * vocab)
        self.orders = (ctx.scratch_alloc(4 * vocab), ctx.scratch_alloc(4 * vocab)) if sorts else ()
        self.hist = ctx.scratch_alloc(4 * 256) if sorts else 0

    def load(self, at: int, ty: ir.Type, j: ir.Value) -> ir.Value:
        return self.ctx.load(at, ty, j, base=self.ctx.scratch)

    def store(self, at: int, value: ir.Value, j: ir.Value) -> None:
        self.ctx.store(at, value, j, base=self.ctx.scratch)

    def each(self, body: Callable[[ir.Value, ir.Value], None]) -> None:
        """`body(j, p[j])` for every token."""
        with self.ctx.for_range(0, self.vocab, name="tok") as j:
            body(j, self.load(self.values, F32, j))

    def fold(self, init: list[ir.Value], step: Callable) -> list[ir.Value]:
        """Carry `init` over the tokens in index order: `vals = step(j, p[j], vals)`."""
        return carried_loop(self.ctx, 0, self.vocab, 1, init,
                            lambda j, vals: step(j, self.load(self.values, F32, j), vals), name="fold",
                            vectorize=False)   # in order by definition; see toolkit.no_vectorize

    def total(self) -> ir.Value:
        """The sequential f32 sum of the values (RLX's order)."""
        (s,) = self.fold([ir.Constant(F32, 0.0)], lambda j, p, vals: [self.ctx.b.fadd(vals[0], p)])
        return s


def total_order_key(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """u32 whose unsigned order is IEEE totalOrder of the f32 `x`."""
    bits = b.bitcast(x, I32)
    return b.xor(bits, b.select(b.icmp_signed("<", bits, I32(0)), I32(-1), I32(-2**31)))


def from_total_order_key(b: ir.IRBuilder, key: ir.Value) -> ir.Value:
    """The f32 of a `total_order_key`."""
    bits = b.xor(key, b.select(b.icmp_signed("<", key, I32(0)), I32(-2**31), I32(-1)))
    return b.bitcast(bits, F32)


def keep_top_k(row: Row, k: int) -> None:
    """Set every value below the k-th largest to −inf: the k-th largest key is built bit by bit, high to
    low, as the largest key that at least k values reach (so ties at the cutoff all survive)."""
    b = row.ctx.b

    def next_bit(i: ir.Value, vals: list[ir.Value]) -> list[ir.Value]:
        cand = b.or_(vals[0], b.shl(I32(1), b.trunc(b.sub(I64(31), i), I32)))
        (count,) = row.fold([I64(0)], lambda j, z, acc: [b.add(acc[0], b.zext(
            b.icmp_unsigned(">=", total_order_key(b, z), cand), I64))])
        return [b.select(b.icmp_signed(">=", count, I64(k)), cand, vals[0])]
    (prefix,) = carried_loop(row.ctx, 0, 32, 1, [I32(0)], next_bit, name="bit")
    cutoff = from_total_order_key(b, prefix)
    row.each(lambda j, z: row.store(row.values, b.select(b.fcmp_ordered("<", z, cutoff),
                                                         ir.Constant(F32, float("-inf")), z), j))


def softmax(row: Row) -> None:
    """Stable softmax: `e = exp(z − max z)` (NaN-ignoring max), `p = e / max(Σ e, MIN_POSITIVE)`."""
    b = row.ctx.b
    (m,) = row.fold([ir.Constant(F32, float("-inf"))], lambda j, z, vals: [vm.maxnum(b, vals[0], z)])
    row.each(lambda j, z: row.store(row.values, in_f64(b, vm.exp, b.fsub(z, m)), j))
    s = vm.maxnum(b, row.total(), ir.Constant(F32, float(F32_MIN_POSITIVE)))
    row.each(lambda j, e: row.store(row.values, b.fdiv(e, s), j))


def sort_descending(row: Row) -> ir.Value:
    """Token ids ordered by probability descending, equal probabilities in index order: a stable LSD
    radix sort (4 passes of 8 bits, between the two orders) on the inverted bits of the non-negative
    probabilities.  Returns the pointer to the sorted order."""
    ctx, b = row.ctx, row.ctx.b
    first, second = (ctx.addr(at, base=ctx.scratch) for at in row.orders)
    row.each(lambda j, p: ctx.store(0, b.trunc(j, I32), j, base=first))

    def digit(token: ir.Value, shift: ir.Value) -> ir.Value:
        key = b.xor(b.bitcast(row.load(row.values, F32, b.zext(token, I64)), I32), I32(-1))
        return b.zext(b.and_(b.lshr(key, shift), I32(255)), I64)

    def exclusive_scan(d: ir.Value, vals: list[ir.Value]) -> list[ir.Value]:
        count = row.load(row.hist, I32, d)
        row.store(row.hist, vals[0], d)
        return [b.add(vals[0], count)]

    with ctx.for_range(0, 4, name="pass") as k:
        even = b.icmp_signed("==", b.and_(k, I64(1)), I64(0))
        src, dst = b.select(even, first, second), b.select(even, second, first)
        shift = b.trunc(b.mul(k, I64(8)), I32)
        with ctx.for_range(0, 256, name="bin") as d:
            row.store(row.hist, I32(0), d)
        with ctx.for_range(0, row.vocab, name="count") as j:
            d = digit(ctx.load(0, I32, j, base=src), shift)
            row.store(row.hist, b.add(row.load(row.hist, I32, d), I32(1)), d)
        carried_loop(ctx, 0, 256, 1, [I32(0)], exclusive_scan, name="scan")
        with ctx.for_range(0, row.vocab, name="scatter") as j:
            token = ctx.load(0, I32, j, base=src)
            d = digit(token, shift)
            at = row.load(row.hist, I32, d)
            ctx.store(0, token, b.zext(at, I64), base=dst)
            row.store(row.hist, b.add(at, I32(1)), d)
    return first   # an even number of passes ends in the first order


def keep_top_p(row: Row, top_p: float) -> None:
    """Walk the tokens by probability descending until the running sum reaches `top_p` (that token kept),
    zero the rest, renormalize by the sequential sum."""
    ctx, b = row.ctx, row.ctx.b
    order = sort_descending(row)

    def walk(j: ir.Value, vals: list[ir.Value]) -> list[ir.Value]:
        running, cut = vals
        token = b.zext(ctx.load(0, I32, j, base=order), I64)
        p = row.load(row.values, F32, token)
        row.store(row.values, b.select(cut, ir.Constant(F32, 0.0), p), token)
        running = b.select(cut, running, b.fadd(running, p))
        return [running, b.or_(cut, b.fcmp_ordered(">=", running, ir.Constant(F32, top_p)))]
    carried_loop(ctx, 0, row.vocab, 1, [ir.Constant(F32, 0.0), ir.Constant(I1, 0)], walk, name="walk")
    s = row.total()
    row.each(lambda j, p: row.store(row.values, b.fdiv(p, s), j))


def first_reaching(row: Row, r: ir.Value) -> ir.Value:
    """The first index whose cumulative probability is ≥ r (vocab − 1 if none), as an i64."""
    b, none = row.ctx.b, I64(row.vocab)

    def step(j: ir.Value, p: ir.Value, vals: list[ir.Value]) -> list[ir.Value]:
        acc, found = b.fadd(vals[0], p), vals[1]
        first = b.and_(b.icmp_signed("==", found, none), b.fcmp_ordered(">=", acc, r))
        return [acc, b.select(first, j, found)]
    _, found = row.fold([ir.Constant(F32, 0.0), none], step)
    return b.select(b.icmp_signed("==", found, none), I64(row.vocab - 1), found)


def row_draw(b: ir.IRBuilder, key: int, row: ir.Value) -> ir.Value:
    """`next_f32` of stream word `row`: word `row mod 4` of block `row div 4`."""
    words = philox(b, b.trunc(b.lshr(row, I64(2)), I32), key)
    lane = b.trunc(b.and_(row, I64(3)), I32)
    word = words[3]
    for j in (2, 1, 0):
        word = b.select(b.icmp_unsigned("==", lane, I32(j)), words[j], word)
    return unit_f32(b, word)


@lowering(T.Sample, check=check_sample)
def sample(ctx: EmitContext, t: T.Sample) -> None:
    """Rows in parallel; each: `z = logits / max(T, 1e−6)`, top-k, softmax, top-p, then the first index
    whose cumulative probability reaches the row's draw from the shared stream, written as f32."""
    temperature = float(np.float32(max(np.float32(t.temperature), np.float32(1e-6))))
    key, top_p = t.seed or SAMPLE_DEFAULT_SEED, float(np.float32(t.top_p))
    sorts = top_p < 1.0

    def rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b, row = sub.b, Row(sub, t.vocab, sorts)
        with sub.for_range(start, stop, name="row") as r:
            base = b.mul(r, I64(t.vocab))
            with sub.for_range(0, t.vocab, name="scale") as j:
                x = sub.load(t.logits, F32, b.add(base, j))
                row.store(row.values, b.fdiv(x, ir.Constant(F32, temperature)), j)
            if 0 < t.top_k < t.vocab:
                keep_top_k(row, t.top_k)
            softmax(row)
            if sorts:
                keep_top_p(row, top_p)
            sub.store(t.dst, b.uitofp(first_reaching(row, row_draw(b, key, r)), F32), r)
    parallel_rows(ctx, t.batch, 4 * t.vocab * (40 if 0 < t.top_k < t.vocab else 8), rows)
