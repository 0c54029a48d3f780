"""Per-channel int8 quantization and QAT fake-quantization as vector IR (semantics.md §2.9, §3.8;
docs/lowering-quantize.md).

Every kind views its `len` elements as `[len / (chan_dim·inner), chan_dim, inner]`: element `i`
belongs to channel `c = (i / inner) mod chan_dim`.  A *segment* is one run of `inner` elements of one
channel; the kernels walk segments (split across threads where the kind is element-wise) and run a
vector loop inside each with the channel's parameters splatted.

* **Quantize**: `q = clamp(round_half_away(x·(1/scale[c])) + zp[c], −128, 127)`, a NaN product → `zp[c]`.
* **Dequantize**: `x = f32(q − zp[c])·scale[c]`.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..registry import lowering
from . import vecmath as vm
from .context import EmitContext
from .toolkit import F32, I8, I32, I64, imul, splat, vec, vec_like

I8_RANGE = (-128, 127)
PAR_ELEMS = 1 << 15   # elements a thread should get before segments are split across threads

Segment = Callable[[EmitContext, ir.Value, ir.Value], None]   # (ctx, channel, first element)


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

def for_each_segment(ctx: EmitContext, t, segment: Segment, parallel: bool = True) -> None:
    """`segment(ctx, c, first)` for every run of `inner` elements (channel `c`, starting at element
    `first`), the runs split across threads when `parallel`."""
    count = t.len // t.inner

    def run(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="seg") as s:
            segment(sub, sub.b.urem(s, I64(t.chan_dim)), imul(sub.b, s, t.inner))

    if count == 0:
        return
    if parallel:
        ctx.parallel_for(count, run, min_work=max(1, PAR_ELEMS // t.inner))
    else:
        run(ctx, I64(0), I64(count))


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


@lowering(T.Quantize, check=check_int8_params)
def quantize(ctx: EmitContext, t: T.Quantize) -> None:
    """f32 → int8 with the channel's reciprocal scale and zero point."""
    inv_table, zp_table = channel_tables(ctx, t, reciprocal=True)

    def segment(sub: EmitContext, c: ir.Value, first: ir.Value) -> None:
        b = sub.b
        inv, zp = table_at(sub, inv_table, c), table_at(sub, zp_table, c)

        def body(j: ir.Value, w: int) -> None:
            i = b.add(first, j)
            sub.store(t.q, quantize_lanes(b, sub.load(t.x, F32, i, w), splat(b, inv, w), splat(b, zp, w)), i)
        sub.vector_loop(t.inner, body)

    for_each_segment(ctx, t, segment)


@lowering(T.Dequantize, check=check_int8_params)
def dequantize(ctx: EmitContext, t: T.Dequantize) -> None:
    """int8 → f32: `f32(q − zp)·scale` per channel."""
    scale_table, zp_table = channel_tables(ctx, t, reciprocal=False)

    def segment(sub: EmitContext, c: ir.Value, first: ir.Value) -> None:
        b = sub.b
        scale, zp = table_at(sub, scale_table, c), table_at(sub, zp_table, c)

        def body(j: ir.Value, w: int) -> None:
            i = b.add(first, j)
            q = b.sext(sub.load(t.q, I8, i, w), vec(I32, w))
            centered = b.sitofp(b.sub(q, splat(b, zp, w)), vec(F32, w))
            sub.store(t.x, b.fmul(centered, splat(b, scale, w)), i)
        sub.vector_loop(t.inner, body)

    for_each_segment(ctx, t, segment)
