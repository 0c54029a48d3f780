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
from .gemm import ACCUMULATORS, PANEL_VECTORS, TileShape, _runs
from .toolkit import F32, I32, I64, I8, Index, as_value, call_intrinsic, iadd, imul, scratch_ptr, splat, zero_bytes

AMAX = Combine("fmax", 0.0)   # NaN-ignoring max of |x|, 0 for an empty or all-NaN block
E4M3 = FORMATS["F8E4M3"]

# body(ctx, scale index, first element, element count) for one scale block
BlockBody = Callable[[EmitContext, Index, Index, int], None]


def check_scaled(t) -> None:
    """A format the codecs cover (a `Custom` one that fits a byte and f32) and a positive block size."""
    minifloat(t.fmt, t.kind_name)
    check_scaled_layout(t.layout)


def check_scaled_layout(layout: ScaleLayout) -> None:
    """A block / group layout has at least one element per scale."""
    size = getattr(layout, "block", getattr(layout, "group", 1))
    if size < 1:
        raise ValidationError(f"layout {layout!r}: the block size must be ≥ 1", field="layout")


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


# ── ScaledMatMul: decode into L1 panels, multiply with gemm's register tiles ─

PANEL_BYTES = 16 << 10   # one decoded f32 panel of B: half of L1


def check_scaled_matmul(t: T.ScaledMatMul) -> None:
    """Both formats covered by the codecs and a positive block size."""
    minifloat(t.lhs_fmt, t.kind_name, "lhs_fmt")
    minifloat(t.rhs_fmt, t.kind_name, "rhs_fmt")
    check_scaled_layout(t.layout)


def decode_transposed(ctx: EmitContext, t, which: str, rows: tuple[Index, int], ks: tuple[int, int],
                      dst: ir.Value, ld: int) -> None:
    """`dst[(kk − k0)·ld + (r − r0)] = decode(code[r, kk])·scale(r, block(kk))` for the `rows` (first, count)
    of `which` ("lhs"/"rhs") and `kk ∈ [k0, k0 + kc)` — a row-major code matrix decoded as its transpose."""
    f = minifloat(getattr(t, f"{which}_fmt"))
    codes, scales = getattr(t, which), getattr(t, f"{which}_scale")
    k0, kc = ks
    block = block_of(t.layout, t.k)
    seg = block if t.layout.name != "PerTensor" else kc
    b = ctx.b

    def segment(r: ir.Value, rr: ir.Value, first: Index, count: int) -> None:
        s = load_scale(ctx, t.layout, scales, iadd(b, imul(b, r, cdiv(t.k, block)), b.udiv(as_value(first), I64(block))))

        def lanes(j: ir.Value, w: int) -> None:
            kk = iadd(b, first, j)
            v = b.fmul(lp.decode(ctx, f, ctx.load(codes, I8, iadd(b, imul(b, r, t.k), kk), w)), splat(b, s, w))
            at = iadd(b, imul(b, b.sub(as_value(kk), I64(k0)), ld), rr)
            for lane in range(w):
                x = v if w == 1 else b.extract_element(v, I32(lane))
                ctx.store(0, x, iadd(b, at, lane * ld), base=dst)
        ctx.vector_loop(count, lanes, name="dec")

    first_row, count = rows
    with ctx.for_range(0, count, name="drow") as rr:
        r = iadd(b, first_row, rr)
        full, tail = divmod(kc, seg)
        if full:
            with ctx.for_range(0, full, name="seg") as sj:
                segment(r, rr, iadd(b, imul(b, sj, seg), k0), seg)
        if tail:
            segment(r, rr, k0 + full * seg, tail)


def k_chunks(t: T.ScaledMatMul, panel_cols: int) -> list[tuple[int, int]]:
    """(first k, length) of the k-chunks whose decoded `[kc, panel_cols]` panel fits `PANEL_BYTES`; each
    chunk is a whole number of scale blocks."""
    kc = max(1, PANEL_BYTES // (4 * panel_cols))
    if t.layout.name != "PerTensor":
        block = block_of(t.layout, t.k)
        kc = max(1, kc // block) * block
    return [(k0, min(kc, t.k - k0)) for k0 in range(0, t.k, kc)]


@lowering(T.ScaledMatMul, check=check_scaled_matmul)
def scaled_matmul(ctx: EmitContext, t: T.ScaledMatMul) -> None:
    """`dst = decode(lhs)·scale ⋅ (decode(rhs)·scale)ᵀ (+ bias)`: the lhs decoded once (transposed) into
    scratch; per column panel and k-chunk the rhs decoded into an L1 panel and multiplied by gemm's tiles."""
    if not t.m * t.n:
        return
    b, w = ctx.b, ctx.lanes
    dst = ctx.addr(t.dst)
    if t.k == 0:
        zero_bytes(ctx, dst, 4 * t.m * t.n)
    else:
        panel_cols = min(PANEL_VECTORS * w, -(-t.n // w) * w)
        a_t = scratch_ptr(ctx, ctx.scratch_alloc(4 * t.m * t.k))
        decode_transposed(ctx, t, "lhs", (I64(0), t.m), (0, t.k), a_t, t.m)
        panel = scratch_ptr(ctx, ctx.scratch_alloc(PANEL_BYTES))
        full, rest = divmod(t.n, panel_cols)
        if full:
            with ctx.for_range(0, full, name="panel") as j:
                _panel(ctx, t, imul(b, j, panel_cols), panel_cols, panel_cols, a_t, panel)
        if rest:
            _panel(ctx, t, I64(full * panel_cols), rest, panel_cols, a_t, panel)
    if t.has_bias:
        with ctx.for_range(0, t.m, name="brow") as i:
            def add_bias(j: ir.Value, lanes: int) -> None:
                at = iadd(b, imul(b, i, t.n), j)
                ctx.store(t.dst, b.fadd(ctx.load(t.dst, F32, at, lanes), ctx.load(t.bias, F32, j, lanes)), at)
            ctx.vector_loop(t.n, add_bias, name="bias")


def _panel(ctx: EmitContext, t: T.ScaledMatMul, col: ir.Value, width: int, ld: int, a_t: ir.Value,
           panel: ir.Value) -> None:
    """Columns `[col, col + width)` of dst: per k-chunk, decode the rhs panel, then every row tile."""
    b, w = ctx.b, ctx.lanes
    nv = -(-width // w)
    mr = max(1, min(t.m, ACCUMULATORS.get(w, 12) // nv))
    for k0, kc in k_chunks(t, ld):
        decode_transposed(ctx, t, "rhs", (col, width), (k0, kc), panel, ld)
        for i0, rows, count in _runs(t.m, mr):
            fn = TileShape(F32, w, rows, nv, k0 != 0).function(ctx)
            with ctx.for_range(0, count, name="rtile") as tr:
                row0 = iadd(b, imul(b, tr, rows), i0)
                b.call(fn, [ctx.addr(0, iadd(b, row0, k0 * t.m), 4, base=a_t), panel,
                            ctx.addr(t.dst, iadd(b, imul(b, row0, t.n), col), 4),
                            I64(1), I64(t.m), I64(ld), I64(t.n), I64(kc), I64(width - (nv - 1) * w),
                            ir.Constant(F32, 1.0), ir.Constant(F32, 1.0)])
