"""Normalization thunks (semantics.md §3.3) as explicit vector loops.

Row norms (LayerNorm, RmsNorm, FusedResidualLN, FusedResidualRmsNorm, AdaLayerNorm) share one
emitter, `emit_row_norm`: per row a statistics pass (`row_stats`: Σv and Σv² together in one
pass for LayerNorm's one-pass variance, Σv² for RMS, or Σv then Σ(v−μ)² for a two-pass
variance), then a normalize pass that re-reads the row — still in L1 — and writes
`affine((v−μ)·inv)`.  What `v` is (x, or x + res + bias) and what the affine is (g, b or
1 + scale, shift) is a `RowIO` bound per row.  GroupNorm reuses `row_stats` on each contiguous
group; LayerNorm2d vectorizes across the H·W positions and reduces over the channels;
BatchNormInference precomputes per-channel α, β in scratch.  Rows split across rlx_llvm's threads
when the thunk moves enough bytes (`rows.parallel_rows`); outputs ≥ 8 MiB use streaming stores.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from . import vecmath as vm
from .context import EmitContext
from .toolkit import (F32, FASTMATH, I64, Index, carried_loop, iadd, imul, load_lanes, prefetch, span_loop, splat, sqrt,
                      store_lanes, width_of)
from ..registry import lowering
from .rows import SUM, SUM_SQUARES, next_row_base, offset_table, parallel_rows, reduce_row, row_offset, stream_rows

Load = Callable[[Index, int], ir.Value]            # (element j of the row, lanes) → v
Store = Callable[[Index, ir.Value], None]          # (element j, ŷ) → applies the affine, stores


@dataclass(frozen=True)
class Stats:
    """Which statistics a row norm computes: centered (LayerNorm) or RMS, variance method, eps."""

    center: bool
    two_pass: bool
    eps: float


def _f(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value) -> ir.Value:
    return getattr(b, op)(x, y, flags=FASTMATH)


def inv_sqrt(ctx: EmitContext, x: ir.Value) -> ir.Value:
    """`1/√x` with an IEEE sqrt and divide (what RLX computes; no rsqrt estimate)."""
    return ctx.b.fdiv(ir.Constant(F32, 1.0), sqrt(ctx, x))


def row_stats(ctx: EmitContext, n: int, load: Load, stats: Stats) -> tuple[ir.Value | None, ir.Value]:
    """(μ or None for RMS, 1/√(var + eps)) of the `n` values `load` yields (f32 scalars)."""
    b = ctx.b
    count = ir.Constant(F32, float(n))
    eps = ir.Constant(F32, stats.eps)
    if not stats.center:
        (s2,) = reduce_row(ctx, n, lambda j, w: (load(j, w),), [SUM_SQUARES])
        return None, inv_sqrt(ctx, b.fadd(b.fdiv(s2, count), eps))
    if stats.two_pass:
        (s1,) = reduce_row(ctx, n, lambda j, w: (load(j, w),), [SUM])
        mean = b.fdiv(s1, count)
        (s2,) = reduce_row(ctx, n, lambda j, w: (_f(b, "fsub", load(j, w), splat(b, mean, w)),), [SUM_SQUARES])
        var = b.fdiv(s2, count)
    else:
        def both(j: Index, w: int) -> tuple[ir.Value, ir.Value]:
            v = load(j, w)
            return v, v
        s1, s2 = reduce_row(ctx, n, both, [SUM, SUM_SQUARES])
        mean = b.fdiv(s1, count)
        var = b.fsub(b.fdiv(s2, count), b.fmul(mean, mean))  # one-pass, biased, unclamped (RLX)
    return mean, inv_sqrt(ctx, b.fadd(var, eps))


def normalized(ctx: EmitContext, v: ir.Value, mean: ir.Value | None, inv: ir.Value) -> ir.Value:
    """`(v − μ)·inv` (or `v·inv` for RMS), lane by lane."""
    b, w = ctx.b, width_of(v)
    centered = v if mean is None else _f(b, "fsub", v, splat(b, mean, w))
    return _f(b, "fmul", centered, splat(b, inv, w))


RowIO = Callable[[EmitContext, ir.Value], tuple[Load, Store]]


def emit_row_norm(ctx: EmitContext, rows: int, h: int, stats: Stats, bind: RowIO, bytes_per_row: int,
                  streams: tuple[int, ...] = ()) -> None:
    """Per row: statistics pass, then the normalize pass writing `store(j, (v − μ)·inv)`.

    The normalize pass also prefetches the next row of each slot in `streams` (the row inputs),
    one line per vector, so its statistics pass finds it in L1 instead of stalling on memory.
    """
    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="row") as r:
            b = sub.b
            load, store = bind(sub, r)
            mean, inv = row_stats(sub, h, load, stats)
            nxt = next_row_base(sub, r, rows, h)

            def out(j: Index, w: int) -> None:
                if w > 1:
                    for off in streams:
                        prefetch(sub, off, iadd(b, nxt, j), 4)
                store(j, normalized(sub, load(j, w), mean, inv))
            sub.vector_loop(h, out, name="norm")
    if h:
        parallel_rows(ctx, rows, bytes_per_row, body)


def affine_store(ctx: EmitContext, g: int, bias: int, dst: int, base: ir.Value, streaming: bool) -> Store:
    """`dst[base + j] = ŷ·g[j] + b[j]`, one explicit fma (the same bits on every tier)."""
    def store(j: Index, y: ir.Value) -> None:
        w = width_of(y)
        out = vm.fma(ctx.b, y, ctx.load(g, F32, j, w), ctx.load(bias, F32, j, w))
        ctx.store(dst, out, iadd(ctx.b, base, j), streaming=streaming)
    return store


def row_loader(ctx: EmitContext, base: ir.Value, offs: tuple[int, ...], bias: int | None = None) -> Load:
    """`v[j] = Σ_k src_k[base + j] (+ bias[j])`, added left to right as RLX does."""
    def load(j: Index, w: int) -> ir.Value:
        b = ctx.b
        idx = iadd(b, base, j)
        v = ctx.load(offs[0], F32, idx, w)
        for off in offs[1:]:
            v = b.fadd(v, ctx.load(off, F32, idx, w), flags=FASTMATH)
        if bias is not None:
            v = b.fadd(v, ctx.load(bias, F32, j, w), flags=FASTMATH)
        return v
    return load


# ── LayerNorm / RmsNorm / FusedResidual* ────────────────────────────────────

def _affine_norm(ctx: EmitContext, t, inputs: tuple[int, ...], bias: int | None, dst: int, center: bool) -> None:
    streaming = stream_rows(ctx, dst, t.h, t.rows)

    def bind(sub: EmitContext, r: ir.Value) -> tuple[Load, Store]:
        base = imul(sub.b, r, t.h)
        return row_loader(sub, base, inputs, bias), affine_store(sub, t.g, t.b, dst, base, streaming)
    emit_row_norm(ctx, t.rows, t.h, Stats(center, False, t.eps), bind, (len(inputs) + 1) * 4 * t.h, inputs)


@lowering(T.LayerNorm, inplace=True)
def layer_norm(ctx: EmitContext, t) -> None:
    """`(x−μ)·(1/√(Σx²/h − μ² + eps))·g + b` per row (one-pass, biased, unclamped variance)."""
    _affine_norm(ctx, t, (t.src,), None, t.dst, center=True)


@lowering(T.RmsNorm, inplace=True)
def rms_norm(ctx: EmitContext, t) -> None:
    """`x·(1/√(Σx²/h + eps))·g + b` per row."""
    _affine_norm(ctx, t, (t.src,), None, t.dst, center=False)


@lowering(T.FusedResidualLN, inplace=True, shared_body=True)
def fused_residual_ln(ctx: EmitContext, t) -> None:
    """LayerNorm of `x + res (+ bias)`; the sum is recomputed in the normalize pass, never stored."""
    _affine_norm(ctx, t, (t.x, t.res), t.bias if t.has_bias else None, t.out, center=True)


@lowering(T.FusedResidualRmsNorm, inplace=True)
def fused_residual_rms_norm(ctx: EmitContext, t) -> None:
    """RmsNorm of `x + res (+ bias)`."""
    _affine_norm(ctx, t, (t.x, t.res), t.bias if t.has_bias else None, t.out, center=False)


# ── AdaLayerNorm / GatedResidual (per-row broadcast offsets) ────────────────

def check_row_offsets(offs, rows: int, h: int, length: int, name: str, length_name: str) -> None:
    """`offs` has one entry per row and every `[offs[r], offs[r] + h)` lies inside `length`."""
    if len(offs) != rows:
        raise ValidationError(f"{name} has {len(offs)} entries for {rows} rows", field=name)
    for r, o in enumerate(offs):
        if not isinstance(o, int) or isinstance(o, bool) or o < 0 or o + h > length:
            raise ValidationError(f"{name}[{r}] = {o!r}: elements [{o}, {o}+{h}) are outside the "
                                  f"{length_name} = {length} elements", field=name)


def check_ada_layer_norm(t) -> None:
    """`mod_off` has one entry per row, each h-slice inside `mod_len`."""
    check_row_offsets(t.mod_off, t.rows, t.h, t.mod_len, "mod_off", "mod_len")


@lowering(T.AdaLayerNorm, check=check_ada_layer_norm)
def ada_layer_norm(ctx: EmitContext, t) -> None:
    """`norm(x)·(1 + scale[m + j]) + shift[m + j]`, m = mod_off[row]; norm without affine,
    LayerNorm with a two-pass variance (PyTorch's numerics; RLX's is UNKNOWN) or RMS."""
    table = offset_table(ctx, t.mod_off, "mod_off")
    streaming = stream_rows(ctx, t.dst, t.h, t.rows)
    one = ir.Constant(F32, 1.0)

    def bind(sub: EmitContext, r: ir.Value) -> tuple[Load, Store]:
        base = imul(sub.b, r, t.h)
        m = row_offset(sub, t.mod_off, r, table)

        def store(j: Index, y: ir.Value) -> None:
            b, w = sub.b, width_of(y)
            k = iadd(b, m, j)
            scale = _f(b, "fadd", splat(b, one, w), sub.load(t.scale, F32, k, w))
            out = vm.fma(b, y, scale, sub.load(t.shift, F32, k, w))
            sub.store(t.dst, out, iadd(b, base, j), streaming=streaming)
        return row_loader(sub, base, (t.src,)), store
    emit_row_norm(ctx, t.rows, t.h, Stats(t.layer_norm, True, t.eps), bind, 8 * t.h, (t.src,))


def check_gated_residual(t) -> None:
    """`gate_off` has one entry per row, each h-slice inside `gate_len`."""
    check_row_offsets(t.gate_off, t.rows, t.h, t.gate_len, "gate_off", "gate_len")


@lowering(T.GatedResidual, check=check_gated_residual)
def gated_residual(ctx: EmitContext, t) -> None:
    """`out[row, j] = x + gate[gate_off[row] + j]·y`."""
    table = offset_table(ctx, t.gate_off, "gate_off")
    streaming = stream_rows(ctx, t.dst, t.h, t.rows)

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="row") as r:
            base = imul(sub.b, r, t.h)
            m = row_offset(sub, t.gate_off, r, table)

            def step(j: Index, w: int) -> None:
                b = sub.b
                idx = iadd(b, base, j)
                gy = _f(b, "fmul", sub.load(t.gate, F32, iadd(b, m, j), w), sub.load(t.y, F32, idx, w))
                sub.store(t.dst, _f(b, "fadd", sub.load(t.x, F32, idx, w), gy), idx, streaming=streaming)
            sub.vector_loop(t.h, step)
    if t.h:
        parallel_rows(ctx, t.rows, 12 * t.h, body)


# ── GroupNorm ───────────────────────────────────────────────────────────────

def check_group_norm(t) -> None:
    """At least one group, and the groups divide the channels."""
    if t.num_groups < 1:
        raise ValidationError(f"num_groups = {t.num_groups}; need at least 1", field="num_groups")
    if t.c % t.num_groups:
        raise ValidationError(f"num_groups = {t.num_groups} does not divide c = {t.c}", field="num_groups")


@lowering(T.GroupNorm, check=check_group_norm, inplace=True)
def group_norm(ctx: EmitContext, t) -> None:
    """Per (batch, group) — a contiguous block of (C/G)·H·W — two-pass μ, var, then
    `((x−μ)·inv)·g[c] + b[c]` channel by channel."""
    hw, cpg = t.h * t.w, t.c // t.num_groups
    size = cpg * hw
    stats = Stats(True, True, t.eps)
    streaming = stream_rows(ctx, t.dst, hw, t.n * t.c)

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="group") as u:
            b = sub.b
            base = imul(b, u, size)
            c0 = imul(b, b.urem(u, I64(t.num_groups)), cpg)
            mean, inv = row_stats(sub, size, row_loader(sub, base, (t.src,)), stats)
            if hw == 1:  # channels are consecutive elements: g, b load as vectors
                sub.vector_loop(cpg, lambda j, w: _group_out(sub, t, base, j, c0, j, w, mean, inv, streaming))
            else:
                with sub.for_range(0, cpg, name="chan") as cc:
                    cbase = iadd(b, base, imul(b, cc, hw))
                    c = iadd(b, c0, cc)
                    sub.vector_loop(hw, lambda j, w: _group_out(sub, t, cbase, j, c, None, w, mean, inv,
                                                                streaming))
    if size:
        parallel_rows(ctx, t.n * t.num_groups, 8 * size, body)


def _group_out(ctx: EmitContext, t, base: Index, j: Index, c: Index, lane_channel: Index | None, w: int,
               mean: ir.Value, inv: ir.Value, streaming: bool) -> None:
    """`dst = ((x−μ)·inv)·g[ch] + b[ch]` at `base + j`; ch = c + lane_channel (vector) or c (splat)."""
    b = ctx.b
    idx = iadd(b, base, j)
    y = normalized(ctx, ctx.load(t.src, F32, idx, w), mean, inv)
    if lane_channel is not None:
        ch = iadd(b, c, lane_channel)
        g, bias = ctx.load(t.g, F32, ch, w), ctx.load(t.b, F32, ch, w)
    else:
        g, bias = splat(b, ctx.load(t.g, F32, c), w), splat(b, ctx.load(t.b, F32, c), w)
    ctx.store(t.dst, vm.fma(b, y, g, bias), idx, streaming=streaming)


# ── LayerNorm2d ─────────────────────────────────────────────────────────────

POSITION_BLOCK = 64  # positions per work unit: one cache line per channel per W=16 vector


@lowering(T.LayerNorm2d, inplace=True)
def layer_norm_2d(ctx: EmitContext, t) -> None:
    """Per (n, h, w) across the C channels: two-pass μ, var, `(x−μ)·inv·g[c] + b[c]`; vectorized
    across W neighbouring positions, so every channel step is one contiguous vector load."""
    hw, c = t.h * t.w, t.c
    if not (t.n and hw and c):
        return
    blocks = -(-hw // POSITION_BLOCK)
    count, eps = ir.Constant(F32, float(c)), ir.Constant(F32, t.eps)

    def positions(sub: EmitContext, nn: ir.Value, p: ir.Value, w: int, mask) -> None:
        b = sub.b
        base = iadd(b, imul(b, nn, c * hw), p)

        def at(ch: ir.Value) -> ir.Value:
            return load_lanes(sub, t.src, F32, iadd(b, base, imul(b, ch, hw)), w, mask)
        zero = splat(b, ir.Constant(F32, 0.0), w)
        (s1,) = carried_loop(sub, 0, c, 1, [zero], lambda ch, a: [b.fadd(a[0], at(ch), flags=FASTMATH)], "sum")
        mean = _f(b, "fdiv", s1, splat(b, count, w))
        (s2,) = carried_loop(sub, 0, c, 1, [zero],
                             lambda ch, a: [SUM_SQUARES.accumulate(sub, a[0], _f(b, "fsub", at(ch), mean))], "var")
        var = _f(b, "fdiv", s2, splat(b, count, w))
        inv = b.fdiv(splat(b, ir.Constant(F32, 1.0), w), sqrt(sub, b.fadd(var, splat(b, eps, w))))
        with sub.for_range(0, c, name="out") as ch:
            y = _f(b, "fmul", _f(b, "fsub", at(ch), mean), inv)
            g = splat(b, sub.load(t.g, F32, ch), w)
            bias = splat(b, sub.load(t.b, F32, ch), w)
            store_lanes(sub, t.dst, vm.fma(b, y, g, bias), iadd(b, base, imul(b, ch, hw)), mask)

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="unit") as u:
            b = sub.b
            nn = b.udiv(u, I64(blocks))
            p0 = imul(b, b.urem(u, I64(blocks)), POSITION_BLOCK)
            p1 = b.add(p0, I64(POSITION_BLOCK))
            p1 = b.select(b.icmp_signed("<", p1, I64(hw)), p1, I64(hw))
            span_loop(sub, p0, p1, lambda p, w, mask: positions(sub, nn, p, w, mask), name="pos")
    parallel_rows(ctx, t.n * blocks, 8 * c * POSITION_BLOCK, body)


# ── BatchNormInference ──────────────────────────────────────────────────────

MAX_TILE = 16384  # elements of the per-thread α/β tile


@lowering(T.BatchNormInference, inplace=True)
def batch_norm_inference(ctx: EmitContext, t) -> None:
    """`x·α[c] + β[c]` with α = g/√(var+eps), β = b − mean·α (PyTorch's CPU inference form).

    α, β are tiled over P = lcm(channels, W) elements in per-thread scratch, so the flattened
    `[count·channels]` walk is whole vectors even for channel counts like 3 (then one short pass
    over the last partial tile).
    """
    ch, total = t.channels, t.count * t.channels
    if not total:
        return
    w = ctx.lanes
    period = ch * w // math.gcd(ch, w)
    if period > MAX_TILE:
        period = ch  # rows are long: vectors plus a scalar tail per row
    full, rest = divmod(total, period)
    streaming = stream_rows(ctx, t.dst, period, full)

    def tile(sub: EmitContext) -> tuple[int, int]:
        alpha, beta = sub.scratch_alloc(4 * period), sub.scratch_alloc(4 * period)
        b = sub.b
        with sub.for_range(0, period, name="tile") as k:
            c = b.urem(k, I64(ch))
            inv = inv_sqrt(sub, b.fadd(sub.load(t.var, F32, c), ir.Constant(F32, t.eps)))
            a = b.fmul(sub.load(t.g, F32, c), inv)
            sub.store(alpha, a, k, base=sub.scratch)
            sub.store(beta, b.fsub(sub.load(t.b, F32, c), b.fmul(sub.load(t.mean, F32, c), a)), k, base=sub.scratch)
        return alpha, beta

    def run(sub: EmitContext, alpha: int, beta: int, base: Index, n: int, streaming: bool = False) -> None:
        def step(j: Index, lanes: int) -> None:
            b = sub.b
            idx = iadd(b, base, j)
            y = vm.fma(b, sub.load(t.src, F32, idx, lanes), sub.load(alpha, F32, j, lanes, base=sub.scratch),
                       sub.load(beta, F32, j, lanes, base=sub.scratch))
            sub.store(t.dst, y, idx, streaming=streaming)
        sub.vector_loop(n, step)

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        alpha, beta = tile(sub)
        with sub.for_range(start, stop, name="tile.row") as r:
            run(sub, alpha, beta, imul(sub.b, r, period), period, streaming)

    if full:
        parallel_rows(ctx, full, 8 * period, body)
    if rest:
        alpha, beta = tile(ctx)
        run(ctx, alpha, beta, full * period, rest)
