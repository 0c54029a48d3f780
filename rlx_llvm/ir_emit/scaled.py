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
from .context import EmitContext, ScratchRef, pointer
from .rows import Combine, parallel_rows, reduce_row
from .. import jit
from .gemm import ACCUMULATORS, PANEL_VECTORS, PARALLEL_MIN_FMAS, TileShape, _runs
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

PANEL_BYTES = jit.l1d_bytes() // 2   # one decoded f32 panel of B: half of the host's L1d


def check_scaled_matmul(t: T.ScaledMatMul) -> None:
    """Both formats covered by the codecs and a positive block size."""
    minifloat(t.lhs_fmt, t.kind_name, "lhs_fmt")
    minifloat(t.rhs_fmt, t.kind_name, "rhs_fmt")
    check_scaled_layout(t.layout)


def transpose(b: ir.IRBuilder, vs: list[ir.Value]) -> list[ir.Value]:
    """The g×g transpose of g vectors of g lanes (g a power of two): log2 g rounds of interleaving
    vector i with vector i + g/2 (Eklundh)."""
    g = len(vs)
    h = g // 2
    lo = ir.Constant(ir.VectorType(I32, g), [j for i in range(h) for j in (i, i + g)]) if h else None
    hi = ir.Constant(ir.VectorType(I32, g), [j for i in range(h, g) for j in (i, i + g)]) if h else None
    for _ in range(g.bit_length() - 1):
        vs = [b.shuffle_vector(vs[i], vs[i + h], mask) for i in range(h) for mask in (lo, hi)]
    return vs


def decode_transposed(ctx: EmitContext, t, which: str, rows: tuple[Index, int], ks: tuple[int, int],
                      dst: ir.Value, ld: int) -> None:
    """`dst[(kk − k0)·ld + (r − r0)] = decode(code[r, kk])·scale(r, block(kk))` for the `rows` (first, count)
    of `which` ("lhs"/"rhs") and `kk ∈ [k0, k0 + kc)` — a row-major code matrix decoded as its transpose:
    W rows × W codes at a time, decoded as W vectors, transposed in registers, stored as W vectors."""
    f = minifloat(getattr(t, f"{which}_fmt"))
    codes, scales = getattr(t, which), getattr(t, f"{which}_scale")
    k0, kc = ks
    block = block_of(t.layout, t.k)
    seg = block if t.layout.name != "PerTensor" else kc
    b, w = ctx.b, ctx.lanes

    def tile(r0: Index, rr0: Index, g: int, first: Index, count: int) -> None:
        """Rows `[r0, r0 + g)`, codes `[first, first + count)` of one scale block (`count % g == 0`)."""
        block_index = b.udiv(as_value(first), I64(block))
        ss = [splat(b, load_scale(ctx, t.layout, scales, iadd(b, imul(b, iadd(b, r0, i), cdiv(t.k, block)),
                                                                  block_index)), g) for i in range(g)]
        with ctx.for_range(0, count, g, name="dk") as j:
            kk = iadd(b, first, j)
            vs = [b.fmul(lp.decode(ctx, f, ctx.load(codes, I8, iadd(b, imul(b, iadd(b, r0, i), t.k), kk), g)), ss[i])
                  for i in range(g)]
            at = iadd(b, imul(b, b.sub(as_value(kk), as_value(k0)), ld), rr0)
            for lane, v in enumerate(transpose(b, vs)):
                ctx.store(0, v, iadd(b, at, lane * ld), base=dst)

    def segment(r0: Index, rr0: Index, g: int, first: Index, count: int) -> None:
        main, rest = count - count % g, count % g
        if main:
            tile(r0, rr0, g, first, main)
        if rest:
            with ctx.for_range(0, g, name="drest") as i:
                tile(iadd(b, r0, i), iadd(b, rr0, i), 1, iadd(b, first, main), rest)

    def row_group(rr0: Index, g: int) -> None:
        r0 = iadd(b, rows[0], rr0)
        full, tail = divmod(kc, seg)
        if full:
            with ctx.for_range(0, full, name="seg") as sj:
                segment(r0, rr0, g, iadd(b, imul(b, sj, seg), k0), seg)
        if tail:
            segment(r0, rr0, g, iadd(b, k0, full * seg), tail)

    groups, rest = divmod(rows[1], w)
    if groups:
        with ctx.for_range(0, groups, name="dgroup") as gi:
            row_group(imul(b, gi, w), w)
    if rest:
        with ctx.for_range(groups * w, rows[1], name="drow") as rr:
            row_group(rr, 1)


def chunk_size(t: T.ScaledMatMul, panel_cols: int) -> int:
    """The k-chunk length whose decoded `[kc, panel_cols]` panel fits `PANEL_BYTES`, a whole number of
    scale blocks, at most k."""
    kc = max(1, PANEL_BYTES // (4 * panel_cols))
    if t.layout.name != "PerTensor":
        block = block_of(t.layout, t.k)
        kc = max(1, kc // block) * block
    return min(kc, t.k)


@lowering(T.ScaledMatMul, check=check_scaled_matmul)
def scaled_matmul(ctx: EmitContext, t: T.ScaledMatMul) -> None:
    """`dst = decode(lhs)·scale ⋅ (decode(rhs)·scale)ᵀ (+ bias)`: the lhs decoded once (transposed) into
    scratch; per column panel and k-chunk the rhs decoded into an L1 panel and multiplied by gemm's tiles;
    column panels split across threads when there is enough work."""
    if not t.m * t.n:
        return
    b, w = ctx.b, ctx.lanes
    if t.k == 0:
        zero_bytes(ctx, ctx.addr(t.dst), 4 * t.m * t.n)
    else:
        panel_cols = min(PANEL_VECTORS * w, -(-t.n // w) * w)
        a_off = ctx.scratch_alloc(4 * t.m * t.k)
        decode_transposed(ctx, t, "lhs", (I64(0), t.m), (0, t.k), scratch_ptr(ctx, a_off), t.m)
        full, rest = divmod(t.n, panel_cols)

        def panels(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
            a_t, panel = pointer(sub, ScratchRef(a_off)), scratch_ptr(sub, sub.scratch_alloc(PANEL_BYTES))
            with sub.for_range(start, stop, name="panel") as j:
                with sub.b.if_else(sub.b.icmp_signed("<", j, I64(full))) as (whole, last):
                    with whole:
                        if full:
                            _panel(sub, t, imul(sub.b, j, panel_cols), panel_cols, panel_cols, a_t, panel)
                    with last:
                        if rest:
                            _panel(sub, t, I64(full * panel_cols), rest, panel_cols, a_t, panel)
        min_panels = max(1, PARALLEL_MIN_FMAS // (t.m * t.k * panel_cols))
        ctx.parallel_for(full + (rest > 0), panels, min_work=min_panels)
    if t.has_bias:
        with ctx.for_range(0, t.m, name="brow") as i:
            def add_bias(j: ir.Value, lanes: int) -> None:
                at = iadd(b, imul(b, i, t.n), j)
                ctx.store(t.dst, b.fadd(ctx.load(t.dst, F32, at, lanes), ctx.load(t.bias, F32, j, lanes)), at)
            ctx.vector_loop(t.n, add_bias, name="bias")


def _panel(ctx: EmitContext, t: T.ScaledMatMul, col: ir.Value, width: int, ld: int, a_t: ir.Value,
           panel: ir.Value) -> None:
    """Columns `[col, col + width)` of dst: per k-chunk, decode the rhs panel, then every row tile (the
    first chunk writes dst, the others accumulate; a run-time loop over the middle chunks)."""
    b, w = ctx.b, ctx.lanes
    kc = chunk_size(t, ld)
    whole, tail = divmod(t.k, kc)
    nv = -(-width // w)
    mr = max(1, min(t.m, ACCUMULATORS.get(w, 12) // nv))

    def chunk(k0: Index, kc: int, accumulate: bool) -> None:
        decode_transposed(ctx, t, "rhs", (col, width), (k0, kc), panel, ld)
        for i0, rows, count in _runs(t.m, mr):
            fn = TileShape(F32, w, rows, nv, accumulate).function(ctx)
            with ctx.for_range(0, count, name="rtile") as tr:
                row0 = iadd(b, imul(b, tr, rows), i0)
                b.call(fn, [ctx.addr(0, iadd(b, row0, imul(b, k0, t.m)), 4, base=a_t), panel,
                            ctx.addr(t.dst, iadd(b, imul(b, row0, t.n), col), 4),
                            I64(1), I64(t.m), I64(ld), I64(t.n), I64(kc), I64(width - (nv - 1) * w),
                            ir.Constant(F32, 1.0), ir.Constant(F32, 1.0)])
    chunk(I64(0), kc, False)
    if whole > 1:
        with ctx.for_range(1, whole, name="kchunk") as c:
            chunk(imul(b, c, kc), kc, True)
    if tail:
        chunk(I64(whole * kc), tail, True)
