"""Scaled low-precision kinds (semantics.md §2.12, §3.8): ScaledQuantize, ScaledQuantScale, ScaledDequantize.

A `[rows, cols]` matrix is cut along each row into scale blocks (`block` / `group` elements, the
whole row for a per-tensor scale; the last block of a row may be short).  Each block loads its
scale once (an f32, an E8M0 byte or an E4M3 byte, decoded by `lowp_floats`) and runs one vector
loop of the element codec over its elements; rows split across threads when the thunk is big.
Every loop length is a compile-time constant (full blocks, then the row's short tail block).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..ops import ScaleLayout
from ..reference.scaled import FORMATS, Minifloat, block_of, minifloat
from ..registry import lowering
from ..thunks.base import cdiv
from . import lowp_floats as lp
from .context import ArenaRef, EmitContext, Operand, ScratchRef, pointer
from .rows import Combine, parallel_rows, reduce_row
from .. import jit
from .gemm import ACCUMULATORS, PANEL_VECTORS, PARALLEL_MIN_FMAS, TileShape, _runs, expert_of
from .gguf import horizontal_sum
from .gemm import expert_status
from .toolkit import (F32, I32, I64, I8, Index, as_value, call_intrinsic, entry_alloca, fail_unless, iadd, imul,
                      scratch_ptr, splat, transpose_vectors, vec, zero_bytes)

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


def load_scale(ctx: EmitContext, layout: ScaleLayout, offset: int, index: Index, tensor: Index = 0) -> ir.Value:
    """The f32 scale of block `index` (a decoded E8M0 / E4M3 byte), or per-tensor f32 number `tensor`."""
    if isinstance(layout, ScaleLayout.BlockMxE8M0):
        return lp.e8m0_decode(ctx, ctx.load(offset, I8, index))
    if isinstance(layout, ScaleLayout.Nvfp4):
        return lp.decode(ctx, E4M3, ctx.load(offset, I8, index))
    return ctx.load(offset, F32, tensor)


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


# ── ScaledMatMul / ScaledGroupedMatMul: decode into L1 panels, multiply with gemm's register tiles ─

PANEL_BYTES = jit.l1d_bytes() // 2   # one decoded f32 panel of B: half of the host's L1d

# row(r) → the source row of row r of a decoded block (a run-time index)
RowMap = Callable[[Index], Index]
# tile(first row, rows): one register tile at a run of rows
RowTile = Callable[[Index, int], None]


@dataclass(frozen=True)
class Codes:
    """A row-major code matrix of `k` columns: its format, code and scale offsets; a per-tensor scale covers
    `slab_rows` rows (a grouped weight's `[n, k]` expert slab; 0: the whole matrix)."""

    fmt: Minifloat
    codes: int
    scales: int
    slab_rows: int = 0


@dataclass(frozen=True)
class ScaledGemm:
    """`C[m, n] = decode(A)·decode(B)ᵀ` of one ScaledMatMul, or of a ScaledGroupedMatMul where B is the
    `[E·n, k]` stack of expert slabs."""

    lhs: Codes
    rhs: Codes
    layout: ScaleLayout
    m: int
    k: int
    n: int


def check_scaled_matmul(t: T.ScaledMatMul) -> None:
    """Both formats covered by the codecs and a positive block size."""
    minifloat(t.lhs_fmt, t.kind_name, "lhs_fmt")
    minifloat(t.rhs_fmt, t.kind_name, "rhs_fmt")
    check_scaled_layout(t.layout)


def check_scaled_grouped(t: T.ScaledGroupedMatMul) -> None:
    """As ScaledMatMul, and an expert for every row."""
    check_scaled_matmul(t)
    if t.m and t.num_experts == 0:
        raise ValidationError(f"num_experts = 0 but m = {t.m} rows need an expert", field="num_experts")


def row_scale(ctx: EmitContext, g: ScaledGemm, m: Codes, r: Index, first: Index) -> ir.Value:
    """The f32 scale of source row `r` of `m` at code `first`."""
    b = ctx.b
    block = block_of(g.layout, g.k)
    block_index = iadd(b, imul(b, r, cdiv(g.k, block)), b.udiv(as_value(first), I64(block)))
    slab = b.udiv(as_value(r), I64(m.slab_rows)) if m.slab_rows else I64(0)
    return load_scale(ctx, g.layout, m.scales, block_index, slab)


def scale_segments(ctx: EmitContext, g: ScaledGemm, ks: tuple[Index, int], body: Callable[[Index, int], None]) -> None:
    """`body(first, count)` over the scale blocks of codes `[k0, k0 + kc)` (`k0` on a block boundary; one
    segment for a per-tensor scale): a run-time loop over the whole blocks, then the short one."""
    k0, kc = ks
    b = ctx.b
    seg = block_of(g.layout, g.k) if g.layout.name != "PerTensor" else kc
    full, tail = divmod(kc, seg)
    if full:
        with ctx.for_range(0, full, name="seg") as sj:
            body(iadd(b, imul(b, sj, seg), k0), seg)
    if tail:
        body(iadd(b, k0, full * seg), tail)


def decode_transposed(ctx: EmitContext, g: ScaledGemm, m: Codes, row: RowMap, count: int, ks: tuple[Index, int],
                      dst: ir.Value, ld: int) -> None:
    """`dst[(kk − k0)·ld + r] = decode(code[row(r), kk])·scale(row(r), block(kk))` for `r < count` and
    `kk ∈ [k0, k0 + kc)` — rows of a row-major code matrix decoded as its transpose: W rows × W codes at a
    time, decoded as W vectors, transposed in registers, stored as W vectors."""
    b, w = ctx.b, ctx.lanes

    def tile(rr0: Index, n: int, first: Index, count: int) -> None:
        """Rows `[rr0, rr0 + n)`, codes `[first, first + count)` of one scale block (`count % n == 0`)."""
        rows = [row(iadd(b, rr0, i)) for i in range(n)]
        ss = [splat(b, row_scale(ctx, g, m, r, first), n) for r in rows]
        with ctx.for_range(0, count, n, name="dk") as j:
            kk = iadd(b, first, j)
            vs = [b.fmul(lp.decode(ctx, m.fmt, ctx.load(m.codes, I8, iadd(b, imul(b, r, g.k), kk), n)), s)
                  for r, s in zip(rows, ss)]
            at = iadd(b, imul(b, b.sub(as_value(kk), as_value(ks[0])), ld), rr0)
            for lane, v in enumerate(transpose_vectors(b, vs)):
                ctx.store(0, v, iadd(b, at, lane * ld), base=dst)

    def row_group(rr0: Index, n: int) -> None:
        def segment(first: Index, count: int) -> None:
            main, rest = count - count % n, count % n
            if main:
                tile(rr0, n, first, main)
            if rest:
                with ctx.for_range(0, n, name="drest") as i:
                    tile(iadd(b, rr0, i), 1, iadd(b, first, main), rest)
        scale_segments(ctx, g, ks, segment)

    groups, rest = divmod(count, w)
    if groups:
        with ctx.for_range(0, groups, name="dgroup") as gi:
            row_group(imul(b, gi, w), w)
    if rest:
        with ctx.for_range(groups * w, count, name="drow") as rr:
            row_group(rr, 1)


GEMV_ROWS = 4   # weight rows dotted at once (each decoded lhs vector feeds 4 FMAs)


def dot_rows(ctx: EmitContext, g: ScaledGemm, a: ir.Value, row: Index, n: int) -> list[ir.Value]:
    """`Σ_k a[k]·decode(rhs[row + r, k])·scale(row + r, block(k))` for `r < n`, `a` the decoded f32 lhs row:
    codes decoded W at a time along k straight into FMAs (no panel, no transpose), lanes summed last."""
    b, w = ctx.b, ctx.lanes

    def zeroed(ty: ir.Type) -> ir.Value:
        slot = entry_alloca(ctx, ty)
        b.store(ir.Constant(ty, None), slot)
        return slot
    accs = {width: [zeroed(vec(F32, width)) for _ in range(n)] for width in (w, 1)}   # vector lanes, the tail

    def lanes(first: Index, scales: list[ir.Value], j: ir.Value, width: int) -> None:
        kk = iadd(b, first, j)
        x = ctx.load(0, F32, kk, width, base=a)
        for r, (s, acc) in enumerate(zip(scales, accs[width])):
            code = ctx.load(g.rhs.codes, I8, iadd(b, imul(b, iadd(b, row, r), g.k), kk), width)
            v = b.fmul(lp.decode(ctx, g.rhs.fmt, code), splat(b, s, width) if width > 1 else s)
            b.store(call_intrinsic(ctx, "llvm.fma", [v, x, b.load(acc)]), acc)

    def segment(first: Index, count: int) -> None:
        scales = [row_scale(ctx, g, g.rhs, iadd(b, row, r), first) for r in range(n)]
        ctx.vector_loop(count, lambda j, width: lanes(first, scales, j, width), name="dot")
    scale_segments(ctx, g, (0, g.k), segment)
    return [b.fadd(horizontal_sum(ctx, b.load(v)), b.load(s)) for v, s in zip(accs[w], accs[1])]


def chunk_size(g: ScaledGemm, panel_cols: int) -> int:
    """The k-chunk length whose decoded `[kc, panel_cols]` panel fits `PANEL_BYTES`, a whole number of
    scale blocks, at most k."""
    kc = max(1, PANEL_BYTES // (4 * panel_cols))
    if g.layout.name != "PerTensor":
        block = block_of(g.layout, g.k)
        kc = max(1, kc // block) * block
    return min(kc, g.k)


def row_tiles(ctx: EmitContext, first: Index, count: Index, mr: int, tile: RowTile) -> None:
    """`tile(row, rows)` over rows `[first, first + count)`: tiles of `mr` rows, then the remainder (as its
    binary digits when `count` is known only at run time, so every tile size is a compile-time constant)."""
    b = ctx.b
    if isinstance(count, int):
        for i0, rows, n in _runs(count, mr):
            with ctx.for_range(0, n, name="rtile") as i:
                tile(iadd(b, first, iadd(b, imul(b, i, rows), i0)), rows)
        return
    whole = b.udiv(count, I64(mr))
    with ctx.for_range(0, whole, name="rtile") as i:
        tile(iadd(b, first, imul(b, i, mr)), mr)
    done = iadd(b, first, imul(b, whole, mr))
    rest = b.sub(count, imul(b, whole, mr))
    for size in reversed([1 << i for i in range(mr.bit_length()) if 1 << i < mr]):
        with b.if_then(b.icmp_unsigned("!=", b.and_(rest, I64(size)), I64(0))):
            tile(iadd(b, done, b.and_(rest, I64(-2 * size))), size)


def multiply_panel(ctx: EmitContext, g: ScaledGemm, b_rows: Index, col: ir.Value, width: int, ld: int,
                   rows: tuple[Index, Index], a_t: ir.Value, panel: ir.Value, c: ir.Value,
                   a_rows: "ir.Value | None" = None) -> None:
    """Columns `[col, col + width)` of C's `rows` (first, count) against rhs rows `b_rows + col …`: per
    k-chunk, decode the rhs panel once, then every row tile (the first chunk writes C, the others
    accumulate; a run-time loop over the middle chunks). Given the lhs also decoded row-major (`a_rows`),
    a run of one row is a GEMV over the panel's columns instead (nothing to share a panel with)."""
    b, w = ctx.b, ctx.lanes
    if a_rows is not None:
        first = rows[0]
        with b.if_else(b.icmp_unsigned("==", as_value(rows[1]), I64(1))) as (one, many):
            with one:
                dot_range(ctx, g, ctx.addr(0, imul(b, first, g.k), 4, base=a_rows), b_rows, col,
                          b.add(col, I64(width)), lambda j, v: ctx.store(0, v, iadd(b, imul(b, first, g.n), j), base=c))
            with many:
                multiply_panel(ctx, g, b_rows, col, width, ld, rows, a_t, panel, c)
        return
    kc = chunk_size(g, ld)
    whole, tail = divmod(g.k, kc)
    nv = -(-width // w)
    mr = max(1, min(g.m, ACCUMULATORS.get(w, 12) // nv))
    first_col = iadd(b, b_rows, col)

    def chunk(k0: Index, kc: int, accumulate: bool) -> None:
        decode_transposed(ctx, g, g.rhs, lambda r: iadd(b, first_col, r), width, (k0, kc), panel, ld)

        def tile(row0: Index, n: int) -> None:
            fn = TileShape(F32, w, n, nv, accumulate).function(ctx)
            b.call(fn, [ctx.addr(0, iadd(b, row0, imul(b, k0, g.m)), 4, base=a_t), panel,
                        ctx.addr(0, iadd(b, imul(b, row0, g.n), col), 4, base=c),
                        I64(1), I64(g.m), I64(ld), I64(g.n), I64(kc), I64(width - (nv - 1) * w),
                        ir.Constant(F32, 1.0), ir.Constant(F32, 1.0)])
        row_tiles(ctx, *rows, mr, tile)
    chunk(I64(0), kc, False)
    if whole > 1:
        with ctx.for_range(1, whole, name="kchunk") as i:
            chunk(imul(b, i, kc), kc, True)
    if tail:
        chunk(I64(whole * kc), tail, True)


def dot_range(ctx: EmitContext, g: ScaledGemm, a: ir.Value, b_rows: Index, start: Index, stop: Index,
              store: Callable[[ir.Value, ir.Value], None]) -> None:
    """`store(j, dot_rows(a, rhs row b_rows + j))` for `j ∈ [start, stop)`, `GEMV_ROWS` rows at a time."""
    b = ctx.b
    start, stop = as_value(start), as_value(stop)
    whole = b.add(start, b.mul(b.udiv(b.sub(stop, start), I64(GEMV_ROWS)), I64(GEMV_ROWS)))
    for lo, hi, n in ((start, whole, GEMV_ROWS), (whole, stop, 1)):
        with ctx.for_range(lo, hi, n, name="jdot") as j:
            for r, v in enumerate(dot_rows(ctx, g, a, iadd(b, b_rows, j), n)):
                store(iadd(b, j, r), v)


def gemv(ctx: EmitContext, g: ScaledGemm, a_off: int, b_rows: Callable[[EmitContext], Index], dst: int) -> None:
    """`dst[j] = dot_rows(a, rhs row b_rows + j)` for the one lhs row (decoded at shared scratch `a_off`),
    weight rows split across threads."""
    def rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        dot_range(sub, g, pointer(sub, ScratchRef(a_off)), b_rows(sub), start, stop,
                  lambda j, v: sub.store(dst, v, j))
    ctx.parallel_for(g.n, rows, grain=GEMV_ROWS, min_work=max(1, PARALLEL_MIN_FMAS // g.k))


# groups(ctx, body): body(first rhs row, (first row, row count)) for each expert's run of rows
Groups = Callable[[EmitContext, Callable[[Index, tuple[Index, Index]], None]], None]
# finish(ctx, first column, width) once a column panel of C is complete
PanelDone = Callable[[EmitContext, ir.Value, int], None]


def panel_products(ctx: EmitContext, g: ScaledGemm, a_off: int, c: Operand, groups: Groups,
                   done: "PanelDone | None" = None, a_rows_off: "int | None" = None) -> None:
    """C = A·Bᵀ by column panels of `4·W` columns split across threads: per panel, each group of rows
    against its rhs rows (`multiply_panel`), then `done`; A is the decoded `[k, m]` lhs in shared scratch
    (and, given `a_rows_off`, also `[m, k]`, for groups of one row)."""
    w = ctx.lanes
    panel_cols = min(PANEL_VECTORS * w, -(-g.n // w) * w)
    full, rest = divmod(g.n, panel_cols)

    def columns(sub: EmitContext, col: ir.Value, width: int) -> None:
        a_t, c_at = pointer(sub, ScratchRef(a_off)), pointer(sub, c)
        a_rows = None if a_rows_off is None else pointer(sub, ScratchRef(a_rows_off))
        panel = scratch_ptr(sub, sub.scratch_alloc(PANEL_BYTES))
        groups(sub, lambda b_rows, rows: multiply_panel(sub, g, b_rows, col, width, panel_cols, rows, a_t, panel,
                                                        c_at, a_rows))
        if done:
            done(sub, col, width)

    def panels(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="panel") as j:
            with sub.b.if_else(sub.b.icmp_signed("<", j, I64(full))) as (whole, last):
                with whole:
                    if full:
                        columns(sub, imul(sub.b, j, panel_cols), panel_cols)
                with last:
                    if rest:
                        columns(sub, I64(full * panel_cols), rest)
    min_panels = max(1, PARALLEL_MIN_FMAS // (g.m * g.k * panel_cols))
    ctx.parallel_for(full + (rest > 0), panels, min_work=min_panels)


def add_bias(ctx: EmitContext, t, expert: RowMap) -> None:
    """`dst[i, :] += bias[expert(i), :]`."""
    b = ctx.b
    with ctx.for_range(0, t.m, name="brow") as i:
        first = imul(b, expert(i), t.n)

        def lanes(j: ir.Value, width: int) -> None:
            at = iadd(b, imul(b, i, t.n), j)
            bias = ctx.load(t.bias, F32, iadd(b, first, j), width)
            ctx.store(t.dst, b.fadd(ctx.load(t.dst, F32, at, width), bias), at)
        ctx.vector_loop(t.n, lanes, name="bias")


def decode_lhs(ctx: EmitContext, g: ScaledGemm, row: RowMap) -> int:
    """The lhs decoded as `[k, m]` f32 into shared scratch (row `r` of it from lhs row `row(r)`); its offset."""
    a_off = ctx.scratch_alloc(4 * g.m * g.k)
    decode_transposed(ctx, g, g.lhs, row, g.m, (0, g.k), scratch_ptr(ctx, a_off), g.m)
    return a_off


def decode_lhs_rows(ctx: EmitContext, g: ScaledGemm, row: RowMap) -> int:
    """The lhs decoded as `[m, k]` f32 into shared scratch (row `r` from lhs row `row(r)`); its offset."""
    a_off = ctx.scratch_alloc(4 * g.m * g.k)
    with ctx.for_range(0, g.m, name="arow") as r:
        at = scratch_ptr(ctx, a_off, imul(ctx.b, r, g.k), 4)
        decode_transposed(ctx, g, g.lhs, lambda _: row(r), 1, (0, g.k), at, 1)
    return a_off


@lowering(T.ScaledMatMul, check=check_scaled_matmul)
def scaled_matmul(ctx: EmitContext, t: T.ScaledMatMul) -> None:
    """`dst = decode(lhs)·scale ⋅ (decode(rhs)·scale)ᵀ (+ bias)`: the lhs decoded once (transposed) into
    scratch; per column panel and k-chunk the rhs decoded into an L1 panel and multiplied by gemm's tiles;
    column panels split across threads when there is enough work."""
    if not t.m * t.n:
        return
    g = ScaledGemm(Codes(minifloat(t.lhs_fmt), t.lhs, t.lhs_scale), Codes(minifloat(t.rhs_fmt), t.rhs, t.rhs_scale),
                   t.layout, t.m, t.k, t.n)
    if t.k == 0:
        zero_bytes(ctx, ctx.addr(t.dst), 4 * t.m * t.n)
    else:
        a_off = decode_lhs(ctx, g, lambda r: r)
        if t.m == 1:
            gemv(ctx, g, a_off, lambda sub: 0, t.dst)
        else:
            panel_products(ctx, g, a_off, ArenaRef(t.dst), lambda sub, body: body(0, (0, t.m)))
    if t.has_bias:
        add_bias(ctx, t, lambda i: 0)


def sort_rows_by_expert(ctx: EmitContext, t: T.ScaledGroupedMatMul) -> tuple[int, int]:
    """Check every row's expert id (`as usize` below `E`, else `INDEX_OUT_OF_RANGE | (row + 1) << 8` naming the
    first bad row: gemm's `expert_status`) and counting-sort the rows by expert, stably, into shared scratch:
    `starts[E + 1]` (expert e's rows are sorted positions `[starts[e], starts[e + 1])`) and `perm[m]` (sorted
    position → row). Returns their offsets."""
    b, e_count = ctx.b, t.num_experts
    starts, perm = ctx.scratch_alloc(8 * (e_count + 1)), ctx.scratch_alloc(8 * t.m)
    zero_bytes(ctx, scratch_ptr(ctx, starts), 8 * (e_count + 1))

    def bump(e: ir.Value, by: ir.Value) -> ir.Value:
        """`starts[e] += by`; the new value."""
        new = b.add(ctx.load(starts, I64, e, base=ctx.scratch), by)
        ctx.store(starts, new, e, base=ctx.scratch)
        return new
    with ctx.for_range(0, t.m, name="count") as i:
        fail_unless(ctx, *expert_status(ctx, t, i))
        bump(expert_of(ctx, t.expert_idx, i), I64(1))
    with ctx.for_range(1, e_count, name="scan") as e:       # inclusive prefix sums: the end of each expert
        bump(e, ctx.load(starts, I64, b.sub(e, I64(1)), base=ctx.scratch))
    ctx.store(starts, I64(t.m), e_count, base=ctx.scratch)
    with ctx.for_range(0, t.m, name="place") as j:          # last rows first: each end walks down to its start
        i = b.sub(I64(t.m - 1), j)
        ctx.store(perm, i, bump(expert_of(ctx, t.expert_idx, i), I64(-1)), base=ctx.scratch)
    return starts, perm


@lowering(T.ScaledGroupedMatMul, check=check_scaled_grouped)
def scaled_grouped_matmul(ctx: EmitContext, t: T.ScaledGroupedMatMul) -> None:
    """`dst[i] = decode(input[i])·scale ⋅ (decode(weight[idx[i]])·scale)ᵀ (+ bias[idx[i]])`: every id checked
    before anything is written; rows counting-sorted by expert, the lhs decoded in that order; per column
    panel and expert, each k-chunk of the expert's rhs panel decoded once for all its rows; the sorted
    products scattered back to their rows."""
    if not t.m * t.n:
        return
    g = ScaledGemm(Codes(minifloat(t.lhs_fmt), t.input, t.input_scale),
                   Codes(minifloat(t.rhs_fmt), t.weight, t.weight_scale, t.n), t.layout, t.m, t.k, t.n)
    starts, perm = sort_rows_by_expert(ctx, t)
    if t.k == 0:
        zero_bytes(ctx, ctx.addr(t.dst), 4 * t.m * t.n)
    elif t.m == 1:
        gemv(ctx, g, decode_lhs(ctx, g, lambda r: r), lambda sub: imul(sub.b, expert_of(sub, t.expert_idx, 0), t.n),
             t.dst)
    else:
        def sorted_row(r: Index) -> ir.Value:
            return ctx.load(perm, I64, r, base=ctx.scratch)
        a_off, a_rows_off = decode_lhs(ctx, g, sorted_row), decode_lhs_rows(ctx, g, sorted_row)
        c_off = ctx.scratch_alloc(4 * t.m * t.n)

        def experts(sub: EmitContext, body) -> None:
            with sub.for_range(0, t.num_experts, name="expert") as e:
                first = sub.load(starts, I64, e, base=sub.shared)
                count = sub.b.sub(sub.load(starts, I64, sub.b.add(e, I64(1)), base=sub.shared), first)
                with sub.b.if_then(sub.b.icmp_unsigned("!=", count, I64(0))):
                    body(imul(sub.b, e, t.n), (first, count))

        def scatter(sub: EmitContext, col: ir.Value, width: int) -> None:
            """Copy the panel's sorted rows of C to their rows of dst."""
            with sub.for_range(0, t.m, name="scatter") as p:
                row = sub.load(perm, I64, p, base=sub.shared)

                def lanes(j: ir.Value, n: int) -> None:
                    jj = iadd(sub.b, col, j)
                    value = sub.load(c_off, F32, iadd(sub.b, imul(sub.b, p, t.n), jj), n, base=sub.shared)
                    sub.store(t.dst, value, iadd(sub.b, imul(sub.b, row, t.n), jj))
                sub.vector_loop(width, lanes, name="scol")
        panel_products(ctx, g, a_off, ScratchRef(c_off), experts, scatter, a_rows_off)
    if t.has_bias:
        add_bias(ctx, t, lambda i: expert_of(ctx, t.expert_idx, i))
