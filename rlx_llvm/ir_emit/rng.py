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

from typing import Callable

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..ops import RngBackend
from ..reference.rng import (BUMP0, BUMP1, F32_MIN_POSITIVE, LCG_A, LCG_M, M0, M1, ROUNDS, TWO_PI_F32,
                             combine_seed, ort_seed)
from ..registry import lowering
from . import vecmath as vm
from .context import EmitContext
from .rows import parallel_rows
from .toolkit import F32, F64, I32, I64, const, counted_loop, lane_ids, splat, vec, width_of

Fill = "T.RngNormal | T.RngUniform"


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
