"""The `[k, n]`-layout dequantizing GEMMs — `DequantMatMul` (Int8Block, sym/asym), `DequantMatMulInt4`,
`DequantMatMulFp8`, `DequantMatMulNvfp4` and `DequantMatMulMxFp4x2` — with the decode fused into the
matmul (semantics.md §2.11, §3.8; docs/lowering-dequant.md).

`C = X @ W` with `W` `[k, n]` stored as codes and per-block scales along k.  W is never materialised in
f32: a tile of `MR` rows of x × `NC` vectors of columns keeps its accumulators in registers; per k-block
the tile's scales are loaded once, and per row `p` of W each vector of codes is decoded into a register
and multiplied into every row's accumulators.  So `m ≤ MR` is one streaming pass over the codes.
From 2 rows of x the weights are instead decoded once per slab into an L1-sized f32 panel that register
tiles multiply with every row (`DecodedPanels`); Int8 and Int4 at m ≤ 4 take a folded GEMV
(`FoldedGemv`).  Column panels are split across threads.  Each kind is one `Scheme`: its rows per
scale block, how a block's scales are loaded, and how a row's codes become weights — the tiles, the
decoded panels and the driver are shared.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

from llvmlite import ir

from .. import jit
from .. import thunks as T
from ..errors import ValidationError
from ..reference.dequant import E2M1, FP8, NVFP4_GROUP, mxfp4x2_planes
from ..reference.scaled import FORMATS, Minifloat
from ..registry import lowering
from . import lowp_floats as lp
from .context import EmitContext
from .gemm import PANEL_VECTORS
from .toolkit import (F32, FASTMATH, I1, I32, I64, I8, carried_loop, const, is_nan, scratch_ptr, splat, vec,
                      vec_like, vector_registers)

MR = 4   # rows of x sharing each decoded vector of weights
NC = 2   # vectors of columns per tile (MR·NC accumulators: 8 of AVX2's 16 registers)

Dequant = Union[T.DequantMatMul, T.DequantMatMulInt4, T.DequantMatMulFp8, T.DequantMatMulNvfp4,
                T.DequantMatMulMxFp4x2]
Scales = tuple[ir.Value, ...]


# ── codes of one row of W: columns j…j + width ──────────────────────────────

def int8_codes(ctx: EmitContext, t: T.DequantMatMul, flat: ir.Value, width: int) -> ir.Value:
    """Signed bytes `w_q[flat…]` as i32 lanes."""
    return ctx.b.sext(ctx.load(t.w_q, I8, flat, width), vec(I32, width))


def nibbles(ctx: EmitContext, plane: int, flat: ir.Value, width: int) -> ir.Value:
    """Nibbles of flat elements `flat…` packed at arena offset `plane`: element f is nibble `f & 1` (low
    first) of byte `f // 2`, as i32 lanes.

    A vector loads the `width/2` bytes from `flat // 2` plus the byte holding the last element (never
    past it), spreads them to `width + 2` nibbles in order, and takes lanes `flat & 1 …`."""
    b = ctx.b
    first, odd = b.lshr(flat, I64(1)), b.trunc(b.and_(flat, I64(1)), I1)
    if width == 1:
        shift = b.mul(b.zext(odd, I32), I32(4))
        return b.and_(b.lshr(b.zext(ctx.load(plane, I8, first), I32), shift), I32(15))
    half = width // 2
    last = ctx.load(plane, I8, b.lshr(b.add(flat, I64(width - 1)), I64(1)))
    head = ctx.load(plane, I8, first, half)
    head = b.shuffle_vector(head, head, ir.Constant(vec(I32, half + 1), [*range(half), 0]))
    raw = b.zext(b.insert_element(head, last, I32(half)), vec(I32, half + 1))
    low = b.and_(raw, const(I32, 15, half + 1))
    high = b.lshr(raw, const(I32, 4, half + 1))
    order = [lane for i in range(half + 1) for lane in (i, half + 1 + i)]
    spread = b.shuffle_vector(low, high, ir.Constant(vec(I32, 2 * half + 2), order))
    even, shifted = (b.shuffle_vector(spread, spread, ir.Constant(vec(I32, width), list(range(s, s + width))))
                     for s in (0, 1))
    return b.select(odd, shifted, even)


def int4_codes(ctx: EmitContext, t: T.DequantMatMulInt4, flat: ir.Value, width: int) -> ir.Value:
    """Unsigned nibbles of `w_q` (even flat index low) as i32 lanes."""
    return nibbles(ctx, t.w_q, flat, width)


def values(ctx: EmitContext, f: Minifloat, code: ir.Value, rebias: bool = True) -> ir.Value:
    """Codes of `f` → f32, through an f16 where the host converts halves in hardware, else by integer bit
    arithmetic; `rebias=False` leaves out the exact factor `left_out(f)` (for the caller to fold into a scale)."""
    if lp.f16_decodes(f):
        return lp.decode_via_f16(ctx, f, code, rebias)
    return lp.decode(ctx, f, code)


def left_out(f: Minifloat) -> float:
    """The factor `values(…, rebias=False)` leaves out."""
    return lp.f16_rebias(f) if lp.f16_decodes(f) else 1.0


def e2m1(ctx: EmitContext, plane: int, flat: ir.Value, width: int, rebias: bool = True) -> ir.Value:
    """The E2M1 values of the nibbles at `flat…` of `plane`."""
    codes = nibbles(ctx, plane, flat, width)
    return values(ctx, E2M1, ctx.b.trunc(codes, vec_like(codes, I8)), rebias)


# ── per kind: a block's scales (at element `at` = kb·n + column of the scale tables) and a row's weights ──

def int_scales(ctx: EmitContext, t: "T.DequantMatMul | T.DequantMatMulInt4", at: ir.Value, width: int) -> Scales:
    """f32 scale and zero point (0 when symmetric)."""
    zp = ctx.load(t.zp, F32, at, width) if t.is_asymmetric else const(F32, 0.0, width)
    return ctx.load(t.scale, F32, at, width), zp


def int_weights(codes: Callable) -> Callable:
    """`(f32(q) − z)·s` of the integer codes `codes(ctx, t, flat, width)` (two roundings)."""
    def weights(ctx: EmitContext, t: Dequant, scales: Scales, flat: ir.Value, width: int) -> ir.Value:
        b, (s, z) = ctx.b, scales
        return b.fmul(b.fsub(b.sitofp(codes(ctx, t, flat, width), vec(F32, width)), z), s)
    return weights


def fp8_scales(ctx: EmitContext, t: T.DequantMatMulFp8, at: ir.Value, width: int) -> Scales:
    """The per-column f32 scale (one block spans every row, so `at` is the column)."""
    return (ctx.load(t.scale, F32, at, width),)


def fp8_weights(ctx: EmitContext, t: T.DequantMatMulFp8, scales: Scales, flat: ir.Value, width: int) -> ir.Value:
    """`fp8(q)·s` with the IEEE-like E4M3 or E5M2 decoder."""
    return ctx.b.fmul(values(ctx, FP8[t.e5m2], ctx.load(t.w_q, I8, flat, width)), scales[0])


def nvfp4_scales(ctx: EmitContext, t: T.DequantMatMulNvfp4, at: ir.Value, width: int) -> Scales:
    """The E4M3 block scale (its NaN codes decoded as 0) times E2M1's `left_out` factor (exact: |s| ≤ 448),
    and the f32 global scale."""
    b = ctx.b
    s = values(ctx, FORMATS["F8E4M3"], ctx.load(t.scale, I8, at, width))
    s = b.select(is_nan(b, s), const(F32, 0.0, width), b.fmul(s, const(F32, left_out(E2M1), width)))
    return s, splat(b, ctx.load(t.global_scale, F32, 0), width)


def nvfp4_weights(ctx: EmitContext, t: T.DequantMatMulNvfp4, scales: Scales, flat: ir.Value, width: int
                  ) -> ir.Value:
    """`(e2m1(q)·s)·g` — the first product is exact (also with E2M1's rebias factor moved into s)."""
    b, (s, g) = ctx.b, scales
    return b.fmul(b.fmul(e2m1(ctx, t.w_q, flat, width, rebias=False), s), g)


def mxfp4x2_scales(ctx: EmitContext, t: T.DequantMatMulMxFp4x2, at: ir.Value, width: int) -> Scales:
    """The two levels' f32 scales."""
    return tuple(ctx.load(scale, F32, at, width) for _, scale in mxfp4x2_planes(t))


def mxfp4x2_weights(ctx: EmitContext, t: T.DequantMatMulMxFp4x2, scales: Scales, flat: ir.Value, width: int
                    ) -> ir.Value:
    """`e2m1(q0)·s0 + e2m1(q1)·s1` (each product and the sum rounded: no contraction)."""
    b = ctx.b
    q0, q1 = (b.fmul(e2m1(ctx, codes, flat, width), s) for (codes, _), s in zip(mxfp4x2_planes(t), scales))
    return b.fadd(q0, q1)


@dataclass(frozen=True)
class Scheme:
    """How a kind stores W: rows of W per scale block, a block's scales, a row's weights from them."""

    block_rows: Callable[[Dequant], int]
    scales: Callable[[EmitContext, Dequant, ir.Value, int], Scales]
    weights: Callable[[EmitContext, Dequant, Scales, ir.Value, int], ir.Value]


SCHEMES: dict[type, Scheme] = {
    T.DequantMatMul: Scheme(lambda t: t.block_size, int_scales, int_weights(int8_codes)),
    T.DequantMatMulInt4: Scheme(lambda t: t.block_size, int_scales, int_weights(int4_codes)),
    T.DequantMatMulFp8: Scheme(lambda t: max(t.k, 1), fp8_scales, fp8_weights),
    T.DequantMatMulNvfp4: Scheme(lambda t: NVFP4_GROUP, nvfp4_scales, nvfp4_weights),
    T.DequantMatMulMxFp4x2: Scheme(lambda t: t.group, mxfp4x2_scales, mxfp4x2_weights),
}


# ── a tile of dst ────────────────────────────────────────────────────────────

def tile(ctx: EmitContext, t: Dequant, row: ir.Value, rows: int, j: ir.Value, cols: int, width: int) -> None:
    """`dst[row + r, j + c·width + l]` for r < rows, c < cols, l < width, accumulated over k in registers."""
    b, n, scheme = ctx.b, t.n, SCHEMES[type(t)]
    block_rows = scheme.block_rows(t)
    zero = const(F32, 0.0, width)
    columns = [b.add(j, I64(c * width)) for c in range(cols)]
    x_rows = [b.mul(b.add(row, I64(r)), I64(t.k)) for r in range(rows)]

    def block(kb: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        scales = [scheme.scales(ctx, t, b.add(b.mul(kb, I64(n)), col), width) for col in columns]
        start = b.mul(kb, I64(block_rows))
        stop = b.add(start, I64(block_rows))
        stop = b.select(b.icmp_signed("<", stop, I64(t.k)), stop, I64(t.k))

        def step(p: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
            accs = list(accs)
            flat = b.mul(p, I64(n))
            weights = [scheme.weights(ctx, t, s, b.add(flat, col), width) for col, s in zip(columns, scales)]
            for r, x_row in enumerate(x_rows):
                x = splat(b, ctx.load(t.x, F32, b.add(x_row, p)), width)
                for c, w in enumerate(weights):
                    accs[r * cols + c] = b.fadd(accs[r * cols + c], b.fmul(x, w, flags=FASTMATH), flags=FASTMATH)
            return accs

        return carried_loop(ctx, start, stop, 1, accs, step, name="p")

    accs = carried_loop(ctx, 0, -(-t.k // block_rows), 1, [zero] * (rows * cols), block, name="kb")
    for r in range(rows):
        for c, col in enumerate(columns):
            ctx.store(t.dst, accs[r * cols + c], b.add(b.mul(b.add(row, I64(r)), I64(n)), col))


def column_panel(ctx: EmitContext, t: Dequant, j: ir.Value, cols: int, width: int) -> None:
    """Every row of x against columns `j…j + cols·width`: `MR`-row tiles, then single rows (one loop each)."""
    full = t.m - t.m % MR
    for start, stop, rows in ((0, full, MR), (full, t.m, 1)):
        if stop > start:
            with ctx.for_range(start, stop, rows, name=f"rows{rows}") as row:
                tile(ctx, t, row, rows, j, cols, width)


def emit_dequant_matmul(ctx: EmitContext, t: Dequant) -> None:
    """`dst = x @ dequant(w_q)`: the folded GEMV's or the decoded panels' columns when one serves `t`, then
    (or else) the tiles' column panels of `NC` vectors, single vectors and single columns."""
    if t.m == 0 or t.n == 0:
        return
    lanes, sweep = ctx.lanes, folded_gemv(ctx, t) or decoded_panels(ctx, t)
    step = sweep.columns if sweep else NC * lanes

    def columns(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        j = sweep.sweep(sub, t, start, stop) if sweep else start
        for cols, width in ((NC, lanes), (1, lanes), (1, 1)):
            j = whole_steps(sub, j, stop, cols * width, lambda col: column_panel(sub, t, col, cols, width))

    work = max(1, t.m * t.k)
    ctx.parallel_for(t.n, columns, grain=step, min_work=max(step, (1 << 16) // work))


def whole_steps(ctx: EmitContext, start: ir.Value, stop: ir.Value, step: int, body: Callable[[ir.Value], None]
                ) -> ir.Value:
    """`body(j)` for j = start, start + step, … while `j + step ≤ stop`; returns where the steps end."""
    end = steps_end(ctx.b, start, stop, step)
    with ctx.for_range(start, end, step, name=f"j{step}") as j:
        body(j)
    return end


def steps_end(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, step: int) -> ir.Value:
    """Where whole steps of `step` from `start` end before `stop`."""
    return b.add(start, b.mul(b.udiv(b.sub(stop, start), I64(step)), I64(step)))


# ── the folded GEMV (Int8Block, Int4 with n even; m ≤ MR) ───────────────────
#
# Per block of rows and column, Σ_p x_p·(q_p − z)·s = s·(Σ_p x_p·q_p − z·Σ_p x_p): the inner loop is a
# code load, a convert and an FMA per vector; the scale, zero point and `Σ x` of the block are applied
# once per block.  Blocks are the outer loop and panels of columns the inner one, so a block's rows are
# read as a few sequential streams; the running sums live in dst (one load and store per block).

PANEL = 8   # vectors of columns per GEMV panel at most (int8: a 64-byte line of codes per row on AVX2)


def int8_panel(ctx: EmitContext, t: T.DequantMatMul, flat: ir.Value, cols: int, width: int) -> list[ir.Value]:
    """The codes of `cols` vectors of columns from `flat`, as f32 vectors in column order."""
    return [ctx.b.sitofp(int8_codes(ctx, t, ctx.b.add(flat, I64(c * width)), width), vec(F32, width))
            for c in range(cols)]


def int4_panel(ctx: EmitContext, t: T.DequantMatMulInt4, flat: ir.Value, cols: int, width: int
               ) -> list[ir.Value]:
    """The nibbles of `cols` vectors of columns from an even `flat`, as f32 vectors: per `width` bytes the
    low nibbles (even columns) then the high ones (odd columns) — `in_column_order` interleaves them."""
    b, codes = ctx.b, []
    for c in range(0, cols, 2):
        raw = b.zext(ctx.load(t.w_q, I8, b.add(b.lshr(flat, I64(1)), I64(c * width // 2)), width), vec(I32, width))
        for nibble in (b.and_(raw, const(I32, 15, width)), b.lshr(raw, const(I32, 4, width))):
            codes.append(b.sitofp(nibble, vec(F32, width)))
    return codes


def in_column_order(b: ir.IRBuilder, sums: list[ir.Value], width: int) -> list[ir.Value]:
    """`int4_panel`'s (even columns, odd columns) vector pairs interleaved into column order."""
    out = []
    for even, odd in zip(sums[::2], sums[1::2]):
        mixed = b.shuffle_vector(even, odd, ir.Constant(vec(I32, 2 * width), [l for i in range(width)
                                                                            for l in (i, width + i)]))
        out += [b.shuffle_vector(mixed, mixed, ir.Constant(vec(I32, width), list(range(h, h + width))))
                for h in (0, width)]
    return out


@dataclass(frozen=True)
class FoldedGemv:
    """The folded GEMV of `m` rows of x over panels of `cols` vectors of `width` columns."""

    panel: Callable[[EmitContext, Dequant, ir.Value, int, int], list[ir.Value]]
    in_order: Callable[[ir.IRBuilder, list[ir.Value], int], list[ir.Value]]
    cols: int
    width: int

    @property
    def columns(self) -> int:
        """Columns per panel."""
        return self.cols * self.width

    def sweep(self, ctx: EmitContext, t: "T.DequantMatMul | T.DequantMatMulInt4", start: ir.Value,
              stop: ir.Value) -> ir.Value:
        """`dst[:, j]` for the whole panels of `start…stop`, block by block; returns where they end."""
        b, end = ctx.b, steps_end(ctx.b, start, stop, self.columns)
        with ctx.for_range(0, -(-t.k // t.block_size), name="kb") as kb:
            first = b.mul(kb, I64(t.block_size))
            last = b.add(first, I64(t.block_size))
            last = b.select(b.icmp_signed("<", last, I64(t.k)), last, I64(t.k))
            x_sums = block_sums(ctx, t, first, last) if t.is_asymmetric else []
            with ctx.for_range(start, end, self.columns, name="panel") as j:
                self.block(ctx, t, kb, first, last, x_sums, j)
        return end

    def block(self, ctx: EmitContext, t: "T.DequantMatMul | T.DequantMatMulInt4", kb: ir.Value, first: ir.Value,
              last: ir.Value, x_sums: list[ir.Value], j: ir.Value) -> None:
        """Rows `first…last` of W (block `kb`) at the panel's columns `j…`, added into dst."""
        b, rows, cols, width = ctx.b, t.m, self.cols, self.width

        def row(p: ir.Value, dots: list[ir.Value]) -> list[ir.Value]:
            codes = self.panel(ctx, t, b.add(b.mul(p, I64(t.n)), j), cols, width)
            dots = list(dots)
            for r in range(rows):
                x = splat(b, ctx.load(t.x, F32, b.add(p, I64(r * t.k))), width)
                for c, q in enumerate(codes):
                    dots[r * cols + c] = b.fadd(dots[r * cols + c], b.fmul(x, q, flags=FASTMATH), flags=FASTMATH)
            return dots

        dots = carried_loop(ctx, first, last, 1, [const(F32, 0.0, width)] * (rows * cols), row, name="p")
        opening = b.icmp_signed("==", kb, I64(0))
        for r in range(rows):
            in_order = self.in_order(b, dots[r * cols:(r + 1) * cols], width)
            for c, dot in enumerate(in_order):
                col = b.add(j, I64(c * width))
                at, out = b.add(b.mul(kb, I64(t.n)), col), b.add(col, I64(r * t.n))
                s, z = int_scales(ctx, t, at, width)
                if t.is_asymmetric:   # Σ x·q − z·Σ x
                    dot = b.fsub(dot, b.fmul(z, splat(b, x_sums[r], width), flags=FASTMATH), flags=FASTMATH)
                before = b.select(opening, const(F32, 0.0, width), ctx.load(t.dst, F32, out, width))
                ctx.store(t.dst, b.fadd(before, b.fmul(s, dot, flags=FASTMATH), flags=FASTMATH), out)


def block_sums(ctx: EmitContext, t: Dequant, first: ir.Value, last: ir.Value) -> list[ir.Value]:
    """`Σ x[r, first…last]` for each row r of x."""
    b = ctx.b

    def add(p: ir.Value, sums: list[ir.Value]) -> list[ir.Value]:
        return [b.fadd(s, ctx.load(t.x, F32, b.add(p, I64(r * t.k)))) for r, s in enumerate(sums)]
    return carried_loop(ctx, first, last, 1, [F32(0.0)] * t.m, add, name="xsum")


def folded_gemv(ctx: EmitContext, t: Dequant) -> "FoldedGemv | None":
    """The folded GEMV for Int8Block, or Int4 with n even (every row of W starts on a byte), when `m ≤ MR`
    and `k ≥ 1`: panels as wide as the vector registers hold `m` rows of accumulators for (up to `PANEL`)."""
    int8 = isinstance(t, T.DequantMatMul)
    if not (int8 or isinstance(t, T.DequantMatMulInt4) and t.n % 2 == 0) or t.m > MR or t.k == 0:
        return None
    registers = vector_registers(ctx.lanes)
    cols = max(2, min(PANEL, (registers - 4) // t.m) // 2 * 2)
    return FoldedGemv(int8_panel, lambda b, sums, width: sums, cols, ctx.lanes) if int8 else \
        FoldedGemv(int4_panel, in_column_order, cols, ctx.lanes)


# ── decoded panels (m ≥ `PANEL_MIN_ROWS`): decode once, then Sgemm's register tiles over every row ──
#
# The tiles decode each weight once per MR rows of x.  For more rows, per column panel of
# `PANEL_VECTORS` vectors and per slab of k rows (the f32 panel sized to half the L1 data cache), the
# weights are decoded once into this thread's scratch and register tiles of `tile_rows` rows × 2 vectors
# multiply every row of x with them; later slabs add onto dst.  The weights are the tiles' own
# (`Scheme.weights`), so only the sum order differs.

@dataclass(frozen=True)
class DecodedPanels:
    """Panels of `vectors` vectors of `width` columns, decoded `rows` rows of W at a time."""

    vectors: int
    width: int
    rows: int

    @property
    def columns(self) -> int:
        """Columns per panel."""
        return self.vectors * self.width

    def sweep(self, ctx: EmitContext, t: Dequant, start: ir.Value, stop: ir.Value) -> ir.Value:
        """`dst[:, j]` for the whole panels of `start…stop`, slab by slab; returns where they end."""
        b, end = ctx.b, steps_end(ctx.b, start, stop, self.columns)
        panel = scratch_ptr(ctx, ctx.scratch_alloc(4 * self.rows * self.columns))
        with ctx.for_range(start, end, self.columns, name="decoded") as j:
            with ctx.for_range(0, -(-t.k // self.rows), name="slab") as slab:
                first = b.mul(slab, I64(self.rows))
                last = b.add(first, I64(self.rows))
                last = b.select(b.icmp_signed("<", last, I64(t.k)), last, I64(t.k))
                self.decode(ctx, t, panel, j, first, last)
                self.multiply(ctx, t, panel, j, first, b.sub(last, first), b.icmp_signed("==", slab, I64(0)))
        return end

    def decode(self, ctx: EmitContext, t: Dequant, panel: ir.Value, j: ir.Value, first: ir.Value,
               last: ir.Value) -> None:
        """`panel[p − first, c] = w[p, j + c]` for rows `first…last`, scale block by scale block."""
        b, scheme, n = ctx.b, SCHEMES[type(t)], t.n
        block_rows = scheme.block_rows(t)
        columns = [b.add(j, I64(v * self.width)) for v in range(self.vectors)]
        even = t.n % 2 == 0   # every flat index below is even: nibble decoders need no odd start
        kb_stop = b.add(b.udiv(b.sub(last, I64(1)), I64(block_rows)), I64(1))
        with ctx.for_range(b.udiv(first, I64(block_rows)), kb_stop, name="kb") as kb:
            scales = [scheme.scales(ctx, t, b.add(b.mul(kb, I64(n)), col), self.width) for col in columns]
            lo, hi = b.mul(kb, I64(block_rows)), b.mul(b.add(kb, I64(1)), I64(block_rows))
            lo = b.select(b.icmp_signed(">", lo, first), lo, first)
            hi = b.select(b.icmp_signed("<", hi, last), hi, last)
            with ctx.for_range(lo, hi, name="p") as p:
                at = b.mul(b.sub(p, first), I64(self.columns))
                for v, (col, s) in enumerate(zip(columns, scales)):
                    flat = b.add(b.mul(p, I64(n)), col)
                    w = scheme.weights(ctx, t, s, b.and_(flat, I64(-2)) if even else flat, self.width)
                    ctx.store(0, w, b.add(at, I64(v * self.width)), base=panel)

    def multiply(self, ctx: EmitContext, t: Dequant, panel: ir.Value, j: ir.Value, first: ir.Value,
                 count: ir.Value, opening: ir.Value) -> None:
        """`dst[:, j…] (+)= x[:, first…first + count] @ panel` by register tiles of `tile_rows` rows × `TILE_VECTORS`
        vectors (the opening slab stores)."""
        height = tile_rows(self.width)
        full = t.m - t.m % height
        for start, stop, rows in ((0, full, height), (full, t.m, t.m - full)):
            if stop > start:
                with ctx.for_range(start, stop, rows, name=f"tile{rows}") as row:
                    for v in range(0, self.vectors, TILE_VECTORS):
                        self.tile(ctx, t, panel, j, first, count, opening, row, rows, v)

    def tile(self, ctx: EmitContext, t: Dequant, panel: ir.Value, j: ir.Value, first: ir.Value, count: ir.Value,
             opening: ir.Value, row: ir.Value, rows: int, vector: int) -> None:
        """Rows `row…row + rows` of dst at the panel's vectors `vector…vector + TILE_VECTORS`: one FMA chain
        per accumulator register over the slab."""
        b, w, k = ctx.b, self.width, t.k
        x_rows = [b.add(b.mul(b.add(row, I64(r)), I64(k)), first) for r in range(rows)]
        offsets = [I64((vector + v) * w) for v in range(TILE_VECTORS)]

        def step(p: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
            at = b.mul(p, I64(self.columns))
            ws = [ctx.load(0, F32, b.add(at, off), w, base=panel) for off in offsets]
            out = []
            for r, x_row in enumerate(x_rows):
                x = splat(b, ctx.load(t.x, F32, b.add(x_row, p)), w)
                out += [b.fadd(acc, b.fmul(x, wv, flags=FASTMATH), flags=FASTMATH)
                        for acc, wv in zip(accs[r * TILE_VECTORS:], ws)]
            return out

        accs = carried_loop(ctx, 0, count, 1, [const(F32, 0.0, w)] * (rows * TILE_VECTORS), step, name="fma")
        for r in range(rows):
            for v, off in enumerate(offsets):
                out = b.add(b.add(b.mul(b.add(row, I64(r)), I64(t.n)), j), off)
                before = b.select(opening, const(F32, 0.0, w), ctx.load(t.dst, F32, out, w))
                ctx.store(t.dst, b.fadd(before, accs[r * TILE_VECTORS + v]), out)


TILE_VECTORS = 2   # vectors of columns per register tile of the decoded panels


def tile_rows(lanes: int) -> int:
    """Rows per register tile: its accumulators, `TILE_VECTORS` weight vectors and a broadcast x in the
    host's vector registers (6 of AVX2's 16, 14 of AVX-512's 32)."""
    return (vector_registers(lanes) - TILE_VECTORS - 1) // TILE_VECTORS


PANEL_MIN_ROWS = 2
"""Rows of x from which decoding once beats the tiles (measured on AVX2: faster from m = 2 for every kind;
the tiles decode per row below MR rows and per MR rows above; m = 1 streams better through the tiles)."""


def decoded_panels(ctx: EmitContext, t: Dequant) -> "DecodedPanels | None":
    """Decoded panels when `m ≥ PANEL_MIN_ROWS` and `k ≥ 1`, `rows` filling half the host's L1 data cache."""
    if t.m < PANEL_MIN_ROWS or t.k == 0:
        return None
    columns = PANEL_VECTORS * ctx.lanes
    return DecodedPanels(PANEL_VECTORS, ctx.lanes, max(8, jit.l1d_bytes() // 2 // (4 * columns)))


# ── validation and registration ──────────────────────────────────────────────

def at_least_one(field: str, what: str) -> Callable[[Dequant], None]:
    """A check that `field` is at least 1 (`what` says why)."""
    def check(t: Dequant) -> None:
        if getattr(t, field) == 0:
            raise ValidationError(f"{field} must be at least 1 ({what})", field=field)
    return check


check_block = at_least_one("block_size", "scale and zp hold one row per block of block_size rows of W")
check_group = at_least_one("group", "each scale plane holds one row per group of `group` rows of W")


@lowering(T.DequantMatMul, T.DequantMatMulInt4, check=check_block)
def dequant_matmul_int(ctx: EmitContext, t: "T.DequantMatMul | T.DequantMatMulInt4") -> None:
    """Int8Block (i8 codes) or Int4 (unsigned nibbles) dequant fused into the matmul."""
    emit_dequant_matmul(ctx, t)


@lowering(T.DequantMatMulFp8, T.DequantMatMulNvfp4)
def dequant_matmul_float(ctx: EmitContext, t: "T.DequantMatMulFp8 | T.DequantMatMulNvfp4") -> None:
    """FP8 (IEEE-like E4M3 / E5M2, per-column scale) or NVFP4 (E2M1, E4M3 per 16 rows, global) fused into the matmul."""
    emit_dequant_matmul(ctx, t)


@lowering(T.DequantMatMulMxFp4x2, check=check_group)
def dequant_matmul_mxfp4x2(ctx: EmitContext, t: T.DequantMatMulMxFp4x2) -> None:
    """Two-level residual E2M1 dequant fused into the matmul."""
    emit_dequant_matmul(ctx, t)
