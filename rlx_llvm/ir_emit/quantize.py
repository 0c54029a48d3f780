"""Per-channel int8 quantization and QAT fake-quantization as vector IR (semantics.md §2.9, §3.8;
docs/lowering-quantize.md).

Every kind views its `len` elements as `[len / (chan_dim·inner), chan_dim, inner]`: element `i`
belongs to channel `c = (i / inner) mod chan_dim`.  A *segment* is one run of `inner` elements of one
channel.  Element-wise passes (`for_each_channel_run`) run a vector loop over each segment with the
channel's parameters splatted; per tensor over an even split of the whole tensor; for short segments
over whole `[chan_dim, inner]` periods with per-position parameters laid out in scratch.  Channel
reductions (`channel_total`) walk the channel's segments with `rows.reduce_row`.

* **Quantize**: `q = clamp(round_half_away(x·(1/scale[c])) + zp[c], −128, 127)`, a NaN product → `zp[c]`.
* **Dequantize**: `x = f32(q − zp[c])·scale[c]`.
* **FakeQuantize**: a per-channel scale `s[c]` first (PerBatch `max(maxabs/q_max, 1e-12)`, EMA blending
  that into the state it writes back, Fixed `max(state, 1e-12)`), then
  `out = clamp(round_half_away(x/s), ±q_max)·s` (NaN stays NaN).
* **FakeQuantizeBackward**: the PerBatch scale again, then `dx` by the straight-through estimator.
* **LSQ** (learned scale `s = max(scale[c], 1e-12)`): the same forward; `dx = dy·[|x/s| ≤ q_max]`;
  `dscale[c] = Σ ψ(x/s)·dy`, `ψ(z) = round(z) − z` inside the range, `sign(z)·q_max` beyond.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..ops import ScaleMode, SteKind
from ..registry import lowering
from . import vecmath as vm
from .context import EmitContext
from .rows import MAX, SUM, Combine, reduce_row
from .toolkit import F32, I8, I32, I64, carried_loop, iadd, imul, splat, splat_like, vec, vec_like

I8_RANGE = (-128, 127)
Q_MAX = {8: 127.0, 4: 7.0, 2: 1.0}   # fake-quantization range ±q_max by bit width
MIN_SCALE = 1e-12                    # the floor of every fake-quantization scale
PAR_ELEMS = 1 << 15   # elements a thread should get before segments are split across threads
MAX_PERIOD = 1 << 14  # longest `chan_dim·inner` whose per-element parameters are laid out in scratch

Segment = Callable[[EmitContext, ir.Value, ir.Value], None]   # (ctx, channel, first element)
ParamsOf = Callable[[EmitContext, ir.Value], list[ir.Value]]  # (ctx, channel) → that channel's parameters
Lanes = Callable[[EmitContext, list[ir.Value], ir.Value, int], None]   # (ctx, splatted params, element, width)


# ── validation ───────────────────────────────────────────────────────────────

def check_channels(t) -> None:
    """`chan_dim ≥ 1`, `inner ≥ 1` and `len` a whole number of `[chan_dim, inner]` blocks."""
    for field in ("chan_dim", "inner"):
        if getattr(t, field) < 1:
            raise ValidationError(f"{field} = {getattr(t, field)} must be at least 1", field=field)
    block = t.chan_dim * t.inner
    if t.len % block:
        raise ValidationError(f"len = {t.len} is not a multiple of chan_dim·inner = {block}", field="len")


def check_int8_params(t: "T.Quantize | T.Dequantize") -> None:
    """Per-channel layout, one scale and one int8 zero point per channel, finite scales."""
    check_channels(t)
    for field in ("scales", "zero_points"):
        if len(getattr(t, field)) != t.chan_dim:
            raise ValidationError(f"{field} has {len(getattr(t, field))} entries, chan_dim = {t.chan_dim}",
                                  field=field)
    bad = [z for z in t.zero_points if not I8_RANGE[0] <= z <= I8_RANGE[1]]
    if bad:
        raise ValidationError(f"zero point {bad[0]} is outside the int8 range [-128, 127]", field="zero_points")
    if not all(math.isfinite(s) for s in t.scales):
        raise ValidationError(f"scales {t.scales} are not all finite", field="scales")


# ── walking the channels ─────────────────────────────────────────────────────

def for_each_segment(ctx: EmitContext, t, segment: Segment) -> None:
    """`segment(ctx, c, first)` for every run of `inner` elements (channel `c`, starting at element
    `first`), the runs split across threads."""
    def run(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="seg") as s:
            segment(sub, sub.b.urem(s, I64(t.chan_dim)), imul(sub.b, s, t.inner))

    ctx.parallel_for(t.len // t.inner, run, min_work=max(1, PAR_ELEMS // t.inner))


def for_each_channel_run(ctx: EmitContext, t, params_of: ParamsOf, lanes: Lanes) -> None:
    """`lanes(ctx, params, i, w)` over every element, `params` the splatted `params_of(ctx, c)` of its channel
    (loaded once per segment; per tensor, once per thread over an even split of all elements)."""
    if t.chan_dim == 1:
        per_tensor_run(ctx, t, params_of, lanes)
        return
    if t.inner < ctx.lanes and t.chan_dim * t.inner <= MAX_PERIOD:
        periodic_run(ctx, t, params_of, lanes)
        return

    def segment(sub: EmitContext, c: ir.Value, first: ir.Value) -> None:
        params = params_of(sub, c)
        sub.vector_loop(t.inner, lambda j, w: lanes(sub, [splat(sub.b, p, w) for p in params], sub.b.add(first, j), w))

    for_each_segment(ctx, t, segment)


def per_tensor_run(ctx: EmitContext, t, params_of: ParamsOf, lanes: Lanes) -> None:
    """One channel: whole vectors split across threads, then the scalar tail on the calling thread."""
    w = ctx.lanes
    main = t.len - t.len % w

    def run(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        params = [splat(sub.b, p, w) for p in params_of(sub, I64(0))]
        with sub.for_range(start, stop, w, name="vec") as i:
            lanes(sub, params, i, w)

    if main:
        ctx.parallel_for(main, run, grain=w, min_work=PAR_ELEMS)
    if t.len > main:
        params = params_of(ctx, I64(0))
        with ctx.for_range(main, t.len, name="tail") as i:
            lanes(ctx, params, i, 1)


def periodic_run(ctx: EmitContext, t, params_of: ParamsOf, lanes: Lanes) -> None:
    """Short segments (`inner < W`): the parameters of every position of one `[chan_dim, inner]` period
    laid out in the calling thread's scratch, then each period a vector loop reading them as vectors
    (periods split across threads)."""
    b, period = ctx.b, t.chan_dim * t.inner
    tables: list[tuple[int, ir.Type]] = []
    with ctx.for_range(0, period, name="pos") as j:
        for k, p in enumerate(params_of(ctx, b.udiv(j, I64(t.inner)))):
            if k == len(tables):
                tables.append((ctx.scratch_alloc(4 * period), p.type))
            ctx.store(tables[k][0], p, j, base=ctx.scratch)

    def run(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="period") as o:
            first = imul(sub.b, o, period)

            def body(j: ir.Value, w: int) -> None:
                params = [sub.load(at, ty, j, w, base=sub.shared) for at, ty in tables]
                lanes(sub, params, sub.b.add(first, j), w)
            sub.vector_loop(period, body)

    ctx.parallel_for(t.len // period, run, min_work=max(1, PAR_ELEMS // period))


def constant_table(ctx: EmitContext, name: str, ty: ir.Type, values: Sequence) -> ir.GlobalVariable:
    """A private constant array `values` of element type `ty` in this thunk's module."""
    aty = ir.ArrayType(ty, len(values))
    g = ir.GlobalVariable(ctx.module, aty, name=f"{ctx.fn.name}.{name}")
    g.global_constant, g.linkage = True, "private"
    g.initializer = ir.Constant(aty, [ir.Constant(ty, v) for v in values])
    return g


def table_at(ctx: EmitContext, table: ir.GlobalVariable, index: ir.Value) -> ir.Value:
    """`table[index]` (a scalar)."""
    b = ctx.b
    ptr = b.gep(table, [I64(0), index], inbounds=True, source_etype=table.value_type)
    return b.load(ptr, typ=table.value_type.element, align=4)


def channel_tables(ctx: EmitContext, t: "T.Quantize | T.Dequantize", reciprocal: bool
                   ) -> tuple[ir.GlobalVariable, ir.GlobalVariable]:
    """(scale or f32 `1/scale`, zero point as f32 or i32) per channel, as constant tables."""
    scales = np.asarray(t.scales, np.float32)
    if reciprocal:
        with np.errstate(divide="ignore"):
            scales = np.float32(1.0) / scales
    zp_ty = F32 if reciprocal else I32
    return (constant_table(ctx, "scale", F32, [float(s) for s in scales]),
            constant_table(ctx, "zp", zp_ty, [float(z) if reciprocal else int(z) for z in t.zero_points]))


# ── Quantize / Dequantize ────────────────────────────────────────────────────

def quantize_lanes(b: ir.IRBuilder, x: ir.Value, inv: ir.Value, zp: ir.Value) -> ir.Value:
    """int8 `clamp(round_half_away(x·inv) + zp, −128, 127)`, `zp` (an f32 splat) where `x·inv` is NaN."""
    v = b.fmul(x, inv)
    q = vm.clamp_num(b, b.fadd(vm.round_half_away(b, v), zp), *I8_RANGE)
    q = b.select(vm.is_nan(b, v), zp, q)
    return b.trunc(b.fptosi(q, vec_like(q, I32)), vec_like(q, I8))


def tables_of(ctx: EmitContext, t: "T.Quantize | T.Dequantize", reciprocal: bool) -> ParamsOf:
    """The loader of a channel's (scale or reciprocal, zero point) from `channel_tables`."""
    tables = channel_tables(ctx, t, reciprocal)
    return lambda sub, c: [table_at(sub, table, c) for table in tables]


@lowering(T.Quantize, check=check_int8_params)
def quantize(ctx: EmitContext, t: T.Quantize) -> None:
    """f32 → int8 with the channel's reciprocal scale and zero point."""
    def lanes(sub: EmitContext, params: list[ir.Value], i: ir.Value, w: int) -> None:
        sub.store(t.q, quantize_lanes(sub.b, sub.load(t.x, F32, i, w), *params), i)

    for_each_channel_run(ctx, t, tables_of(ctx, t, reciprocal=True), lanes)


@lowering(T.Dequantize, check=check_int8_params)
def dequantize(ctx: EmitContext, t: T.Dequantize) -> None:
    """int8 → f32: `f32(q − zp)·scale` per channel."""
    def lanes(sub: EmitContext, params: list[ir.Value], i: ir.Value, w: int) -> None:
        b, (scale, zp) = sub.b, params
        q = b.sext(sub.load(t.q, I8, i, w), vec(I32, w))
        sub.store(t.x, b.fmul(b.sitofp(b.sub(q, zp), vec(F32, w)), scale), i)

    for_each_channel_run(ctx, t, tables_of(ctx, t, reciprocal=False), lanes)


# ── fake quantization: the scale ─────────────────────────────────────────────

def check_fake(t) -> None:
    """Per-channel layout and a bit width with a known range (8, 4 or 2)."""
    check_channels(t)
    if t.bits not in Q_MAX:
        raise ValidationError(f"bits = {t.bits} is not one of 8, 4, 2", field="bits")


def check_fake_quantize(t: T.FakeQuantize) -> None:
    """FakeQuantize: `check_fake`, a state buffer for EMA and Fixed, a finite EMA decay."""
    check_fake(t)
    if t.scale_mode != ScaleMode.PerBatch and t.state_off is None:
        raise ValidationError(f"scale_mode {t.scale_mode!r} needs a state buffer", field="state_off")
    if isinstance(t.scale_mode, ScaleMode.EMA) and not math.isfinite(t.scale_mode.decay):
        raise ValidationError(f"EMA decay {t.scale_mode.decay} is not finite", field="scale_mode")


def f32c(value: float) -> ir.Constant:
    """An f32 constant holding `value` rounded to f32."""
    return ir.Constant(F32, float(np.float32(value)))


def channel_total(ctx: EmitContext, t, c: ir.Value, terms: Callable[[ir.Value, int], ir.Value], op: Combine
                  ) -> ir.Value:
    """`op` over `terms(i, w)` for every element `i` of channel `c` (segment by segment)."""
    b = ctx.b

    def segment(o: ir.Value, acc: list[ir.Value]) -> list[ir.Value]:
        first = imul(b, iadd(b, imul(b, o, t.chan_dim), c), t.inner)
        [part] = reduce_row(ctx, t.inner, lambda j, w: [terms(iadd(b, first, j), w)], [op])
        return [op(ctx, acc[0], part)]

    return carried_loop(ctx, 0, t.len // (t.chan_dim * t.inner), 1, [f32c(op.identity)], segment, name="outer")[0]


def batch_scale(ctx: EmitContext, t, c: ir.Value) -> ir.Value:
    """`max(maxabs/q_max, 1e-12)` over channel `c` of `x` (NaN ignored, as Rust's `f32::max`)."""
    b = ctx.b
    maxabs = channel_total(ctx, t, c, lambda i, w: vm.fabs(b, ctx.load(t.x, F32, i, w)), MAX)
    maxabs = vm.maxnum(b, maxabs, f32c(0.0))
    return vm.maxnum(b, b.fdiv(maxabs, f32c(Q_MAX[t.bits])), f32c(MIN_SCALE))


def tracked_scale(ctx: EmitContext, t: T.FakeQuantize, c: ir.Value) -> ir.Value:
    """FakeQuantize's scale of channel `c` under its ScaleMode (EMA writes the state back)."""
    b, mode = ctx.b, t.scale_mode
    if mode == ScaleMode.PerBatch:
        return batch_scale(ctx, t, c)
    state = ctx.load(t.state_off, F32, c)
    if mode == ScaleMode.Fixed:
        return vm.maxnum(b, state, f32c(MIN_SCALE))
    current = batch_scale(ctx, t, c)
    decay = np.float32(mode.decay)
    blended = b.fadd(b.fmul(f32c(decay), state), b.fmul(f32c(np.float32(1.0) - decay), current))
    new = b.select(b.fcmp_ordered("<=", state, f32c(0.0)), current, blended)
    ctx.store(t.state_off, new, c)
    return new


def scales_in_scratch(ctx: EmitContext, t, scale_of: Callable[[ir.Value], ir.Value]) -> ParamsOf:
    """Compute `scale_of(c)` for every channel into the calling thread's scratch; returns the loader
    of a channel's scale from there (in any thread)."""
    at = ctx.scratch_alloc(4 * t.chan_dim)
    with ctx.for_range(0, t.chan_dim, name="chan") as c:
        ctx.store(at, scale_of(c), c, base=ctx.scratch)
    return lambda sub, c: [sub.load(at, F32, c, base=sub.shared)]


def lsq_scale(ctx: EmitContext, t, c: ir.Value) -> ir.Value:
    """LSQ's scale of channel `c`: `max(scale[c], 1e-12)` (a NaN scale gives 1e-12)."""
    return vm.maxnum(ctx.b, ctx.load(t.scale_off, F32, c), f32c(MIN_SCALE))


# ── fake quantization: forward and backward ─────────────────────────────────

def fake_quantize_lanes(b: ir.IRBuilder, x: ir.Value, s: ir.Value, q_max: float) -> ir.Value:
    """`clamp(round_half_away(x/s), −q_max, q_max)·s`, a NaN passing through."""
    return b.fmul(vm.clamp_nan_keep(b, vm.round_half_away(b, b.fdiv(x, s)), -q_max, q_max), s)


def emit_fake_quantize(ctx: EmitContext, t, scale_of: ParamsOf) -> None:
    """`out = clamp(round_half_away(x/s), ±q_max)·s` over every element, `[s] = scale_of(ctx, c)`."""
    def lanes(sub: EmitContext, params: list[ir.Value], i: ir.Value, w: int) -> None:
        sub.store(t.out, fake_quantize_lanes(sub.b, sub.load(t.x, F32, i, w), params[0], Q_MAX[t.bits]), i)

    for_each_channel_run(ctx, t, scale_of, lanes)


@lowering(T.FakeQuantize, check=check_fake_quantize)
def fake_quantize(ctx: EmitContext, t: T.FakeQuantize) -> None:
    """Per-channel scales (per its ScaleMode), then quantize-dequantize every element."""
    emit_fake_quantize(ctx, t, scales_in_scratch(ctx, t, lambda c: tracked_scale(ctx, t, c)))


def as_f32(b: ir.IRBuilder, flag: ir.Value) -> ir.Value:
    """1.0 where `flag` holds, else 0.0."""
    return b.uitofp(flag, vec_like(flag, F32))


def ste_factor(b: ir.IRBuilder, ste: SteKind, x: ir.Value, s: ir.Value, q_max: float) -> ir.Value:
    """The straight-through derivative `d out/d x` of FakeQuantize at `x` with scale `s` (semantics.md §2.9)."""
    if ste is SteKind.ClippedIdentity:
        return as_f32(b, b.fcmp_ordered("<=", vm.fabs(b, x), b.fmul(splat_like(s, q_max), s)))
    if ste is SteKind.Tanh:
        th = vm.tanh(b, b.fdiv(x, s))
        return b.fsub(splat_like(x, 1.0), b.fmul(th, th))
    assert ste is SteKind.HardTanh, ste
    ramp = b.fsub(splat_like(x, 1.0), vm.fabs(b, b.fdiv(x, b.fmul(splat_like(s, q_max), s))))
    return vm.maxnum(b, splat_like(x, 0.0), ramp)


@lowering(T.FakeQuantizeBackward, check=check_fake)
def fake_quantize_backward(ctx: EmitContext, t: T.FakeQuantizeBackward) -> None:
    """`dx = dy` (Identity), else `dy·ste(x, s)` with the forward's PerBatch scale `s`."""
    if t.ste is SteKind.Identity:
        for_each_channel_run(ctx, t, lambda sub, c: [],
                             lambda sub, _, i, w: sub.store(t.dx, sub.load(t.dy, F32, i, w), i))
        return
    emit_scaled_gradient(ctx, t, scales_in_scratch(ctx, t, lambda c: batch_scale(ctx, t, c)),
                         lambda b, x, s: ste_factor(b, t.ste, x, s, Q_MAX[t.bits]))


def emit_scaled_gradient(ctx: EmitContext, t, scale_of: ParamsOf,
                         factor: Callable[[ir.IRBuilder, ir.Value, ir.Value], ir.Value]) -> None:
    """`dx = dy·factor(x, s)` over every element, `[s] = scale_of(ctx, c)`."""
    def lanes(sub: EmitContext, params: list[ir.Value], i: ir.Value, w: int) -> None:
        b = sub.b
        sub.store(t.dx, b.fmul(sub.load(t.dy, F32, i, w), factor(b, sub.load(t.x, F32, i, w), params[0])), i)

    for_each_channel_run(ctx, t, scale_of, lanes)


# ── LSQ: learned per-channel scales ─────────────────────────────────────────

@lowering(T.FakeQuantizeLSQ, check=check_fake)
def fake_quantize_lsq(ctx: EmitContext, t: T.FakeQuantizeLSQ) -> None:
    """FakeQuantize with the learned scale `max(scale[c], 1e-12)`."""
    emit_fake_quantize(ctx, t, lambda sub, c: [lsq_scale(sub, t, c)])


@lowering(T.FakeQuantizeLSQBackwardX, check=check_fake)
def fake_quantize_lsq_backward_x(ctx: EmitContext, t: T.FakeQuantizeLSQBackwardX) -> None:
    """`dx = dy·[|x/s| ≤ q_max]`."""
    def inside(b: ir.IRBuilder, x: ir.Value, s: ir.Value) -> ir.Value:
        return as_f32(b, b.fcmp_ordered("<=", vm.fabs(b, b.fdiv(x, s)), splat_like(x, Q_MAX[t.bits])))

    emit_scaled_gradient(ctx, t, lambda sub, c: [lsq_scale(sub, t, c)], inside)


def lsq_psi(b: ir.IRBuilder, z: ir.Value, q_max: float) -> ir.Value:
    """LSQ's `ψ(z)`: `round(z) − z` for `|z| ≤ q_max`, `sign(z)·q_max` beyond (NaN stays NaN)."""
    beyond = b.fcmp_ordered(">", vm.fabs(b, z), splat_like(z, q_max))
    return b.select(beyond, vm.copysign(b, splat_like(z, q_max), z), b.fsub(vm.round_half_away(b, z), z))


@lowering(T.FakeQuantizeLSQBackwardScale, check=check_fake)
def fake_quantize_lsq_backward_scale(ctx: EmitContext, t: T.FakeQuantizeLSQBackwardScale) -> None:
    """`dscale[c] = Σ ψ(x/s[c])·dy` over channel `c`, summed in f32 lanes."""
    b = ctx.b
    with ctx.for_range(0, t.chan_dim, name="chan") as c:
        s = lsq_scale(ctx, t, c)

        def term(i: ir.Value, w: int) -> ir.Value:
            z = b.fdiv(ctx.load(t.x, F32, i, w), splat(b, s, w))
            return b.fmul(lsq_psi(b, z, Q_MAX[t.bits]), ctx.load(t.dy, F32, i, w))

        ctx.store(t.dscale, channel_total(ctx, t, c, term, SUM), c)
