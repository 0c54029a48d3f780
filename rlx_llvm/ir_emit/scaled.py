"""Scaled low-precision kinds (semantics.md §2.12, §3.8): ScaledQuantize, ScaledQuantScale, ScaledDequantize.

A `[rows, cols]` matrix is cut along each row into scale blocks (`block` / `group` elements, the
whole row for a per-tensor scale; the last block of a row may be short).  Each block loads its
scale once (an f32, an E8M0 byte or an E4M3 byte, decoded by `lowp_floats`) and runs one vector
loop of the element codec over its elements; rows split across threads when the thunk is big.
Every loop length is a compile-time constant (full blocks, then the row's short tail block).
"""
from __future__ import annotations

from typing import Callable

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..ops import ScaleLayout
from ..reference.scaled import FORMATS, block_of, minifloat
from ..registry import lowering
from ..thunks.base import cdiv
from . import lowp_floats as lp
from .context import EmitContext
from .rows import Combine, parallel_rows, reduce_row
from .toolkit import F32, I64, I8, Index, call_intrinsic, iadd, imul, splat

AMAX = Combine("fmax", 0.0)   # NaN-ignoring max of |x|, 0 for an empty or all-NaN block
E4M3 = FORMATS["F8E4M3"]

# body(ctx, scale index, first element, element count) for one scale block
BlockBody = Callable[[EmitContext, Index, Index, int], None]


def check_scaled(t) -> None:
    """A format the codecs cover (a `Custom` one that fits a byte and f32) and a positive block size."""
    minifloat(t.fmt, t.kind_name)
    size = getattr(t.layout, "block", getattr(t.layout, "group", 1))
    if size < 1:
        raise ValidationError(f"layout {t.layout!r}: the block size must be ≥ 1", field="layout")


def for_each_block(ctx: EmitContext, t, bytes_per_row: int, body: BlockBody) -> None:
    """`body` over every scale block of the `[rows, cols]` matrix, rows in parallel."""
    block = block_of(t.layout, t.cols)
    full, tail = divmod(t.cols, block)
    per_row = cdiv(t.cols, block)

    def rows_body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="row") as r:
            first_scale, first = imul(sub.b, r, per_row), imul(sub.b, r, t.cols)
            if full:
                with sub.for_range(0, full, name="block") as j:
                    body(sub, iadd(sub.b, first_scale, j), iadd(sub.b, first, imul(sub.b, j, block)), block)
            if tail:
                body(sub, iadd(sub.b, first_scale, full), iadd(sub.b, first, full * block), tail)
    if t.cols:
        parallel_rows(ctx, t.rows, bytes_per_row, rows_body)


def load_scale(ctx: EmitContext, layout: ScaleLayout, offset: int, index: Index) -> ir.Value:
    """The f32 scale of block `index` (the one per-tensor f32, or a decoded E8M0 / E4M3 byte)."""
    if isinstance(layout, ScaleLayout.BlockMxE8M0):
        return lp.e8m0_decode(ctx, ctx.load(offset, I8, index))
    if isinstance(layout, ScaleLayout.Nvfp4):
        return lp.decode(ctx, E4M3, ctx.load(offset, I8, index))
    return ctx.load(offset, F32, 0)


def store_scale(ctx: EmitContext, layout: ScaleLayout, offset: int, index: Index, s: ir.Value) -> None:
    """Store f32 scale `s` of block `index` in the layout's encoding (E8M0 rounded up, E4M3 to nearest)."""
    if isinstance(layout, ScaleLayout.BlockMxE8M0):
        ctx.store(offset, lp.e8m0_encode_up(ctx, s), index)
    elif isinstance(layout, ScaleLayout.Nvfp4):
        ctx.store(offset, lp.encode(ctx, E4M3, s), index)
    else:
        ctx.store(offset, s, index)


def elementwise_blocks(ctx: EmitContext, t, src: int, src_ty: ir.Type, dst: int,
                       op: Callable[[EmitContext, ir.Value, ir.Value], ir.Value], bytes_per_elem: int) -> None:
    """`dst[i] = op(src[i], splat(scale(block_of(i))))` over every block."""
    def block(sub: EmitContext, scale_index: Index, first: Index, count: int) -> None:
        s = load_scale(sub, t.layout, t.scale, scale_index)

        def lanes(j: ir.Value, w: int) -> None:
            i = iadd(sub.b, first, j)
            sub.store(dst, op(sub, sub.load(src, src_ty, i, w), splat(sub.b, s, w)), i)
        sub.vector_loop(count, lanes, name="elem")
    for_each_block(ctx, t, t.cols * bytes_per_elem, block)


@lowering(T.ScaledDequantize, check=check_scaled)
def scaled_dequantize(ctx: EmitContext, t: T.ScaledDequantize) -> None:
    """`dst = decode(code)·scale(block)`."""
    f = minifloat(t.fmt)
    elementwise_blocks(ctx, t, t.codes, I8, t.dst, lambda c, code, s: c.b.fmul(lp.decode(c, f, code), s), 5)


@lowering(T.ScaledQuantize, check=check_scaled)
def scaled_quantize(ctx: EmitContext, t: T.ScaledQuantize) -> None:
    """`dst = encode(x / scale(block))`."""
    f = minifloat(t.fmt)
    elementwise_blocks(ctx, t, t.x, F32, t.dst, lambda c, x, s: lp.encode(c, f, c.b.fdiv(x, s)), 5)


def block_amax(ctx: EmitContext, src: int, first: Index, count: int) -> ir.Value:
    """NaN-ignoring `max |x|` of `count` f32 elements from `first` (0 if none)."""
    def terms(j: Index, w: int) -> tuple[ir.Value]:
        return (call_intrinsic(ctx, "llvm.fabs", [ctx.load(src, F32, iadd(ctx.b, first, j), w)]),)
    (amax,) = reduce_row(ctx, count, terms, [AMAX])
    return amax


@lowering(T.ScaledQuantScale, check=check_scaled)
def scaled_quant_scale(ctx: EmitContext, t: T.ScaledQuantScale) -> None:
    """`amax / max_finite(fmt)` per tensor or per block, stored in the layout's encoding."""
    max_finite = ir.Constant(F32, float(minifloat(t.fmt).max_finite))

    def scale(sub: EmitContext, index: Index, first: Index, count: int) -> None:
        s = sub.b.fdiv(block_amax(sub, t.x, first, count), max_finite)
        store_scale(sub, t.layout, t.dst, index, s)
    if t.layout.name == "PerTensor":
        scale(ctx, I64(0), I64(0), t.rows * t.cols)
    else:
        for_each_block(ctx, t, t.cols * 4, scale)
