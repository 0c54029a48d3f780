"""`DequantMatMul` (Int8Block, symmetric or asymmetric) and `DequantMatMulInt4` with the decode fused
into the matmul (semantics.md §3.8; docs/lowering-dequant.md).

`W_q` is `[k, n]` row-major (i8 codes, or unsigned nibbles of the flat index `f = p·n + j`, even `f`
in the low nibble), `scale`/`zp` are f32 `[ceil(k/block), n]`; `w[p, j] = (q − z)·s`, `C = X @ W`.
W is never materialised in f32: a tile of `MR` rows of x × `NC` vectors of columns keeps its
accumulators in registers; per k-block the tile's scales and zero points are loaded once, and per
row `p` of W each vector of codes is decoded into a register (`(f32(q) − z)·s`, two roundings) and
multiplied into every row's accumulators.  So `m ≤ MR` is one streaming pass over the codes.
Column panels are split across threads.
"""
from __future__ import annotations

from typing import Union

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..registry import lowering
from .context import EmitContext
from .toolkit import F32, FASTMATH, I1, I32, I64, I8, carried_loop, const, splat, vec

MR = 4   # rows of x sharing each decoded vector of weights
NC = 2   # vectors of columns per tile (MR·NC accumulators: 8 of AVX2's 16 registers)

Dequant = Union[T.DequantMatMul, T.DequantMatMulInt4]


def check_block(t: Dequant) -> None:
    """A block of at least one row of W."""
    if t.block_size == 0:
        raise ValidationError("block_size must be at least 1 (scale and zp hold one row per block of "
                              "block_size rows of W)", field="block_size")


# ── codes of one row of W: columns j…j + width ──────────────────────────────

def int8_codes(ctx: EmitContext, t: T.DequantMatMul, flat: ir.Value, width: int) -> ir.Value:
    """Signed bytes `w_q[flat…]` as i32 lanes."""
    return ctx.b.sext(ctx.load(t.w_q, I8, flat, width), vec(I32, width))


def int4_codes(ctx: EmitContext, t: T.DequantMatMulInt4, flat: ir.Value, width: int) -> ir.Value:
    """Nibbles of flat elements `flat…`: element f is nibble `f & 1` (low first) of byte `f // 2`.

    A vector loads the `width/2` bytes from `flat // 2` plus the byte holding the last element (never
    past it), spreads them to `width + 2` nibbles in order, and takes lanes `flat & 1 …`."""
    b = ctx.b
    first, odd = b.lshr(flat, I64(1)), b.trunc(b.and_(flat, I64(1)), I1)
    if width == 1:
        shift = b.mul(b.zext(odd, I32), I32(4))
        return b.and_(b.lshr(b.zext(ctx.load(t.w_q, I8, first), I32), shift), I32(15))
    half = width // 2
    last = ctx.load(t.w_q, I8, b.lshr(b.add(flat, I64(width - 1)), I64(1)))
    head = ctx.load(t.w_q, I8, first, half)
    head = b.shuffle_vector(head, head, ir.Constant(vec(I32, half + 1), [*range(half), 0]))
    raw = b.zext(b.insert_element(head, last, I32(half)), vec(I32, half + 1))
    low = b.and_(raw, const(I32, 15, half + 1))
    high = b.lshr(raw, const(I32, 4, half + 1))
    order = [lane for i in range(half + 1) for lane in (i, half + 1 + i)]
    spread = b.shuffle_vector(low, high, ir.Constant(vec(I32, 2 * half + 2), order))
    even, shifted = (b.shuffle_vector(spread, spread, ir.Constant(vec(I32, width), list(range(s, s + width))))
                     for s in (0, 1))
    return b.select(odd, shifted, even)


CODES = {T.DequantMatMul: int8_codes, T.DequantMatMulInt4: int4_codes}


# ── a tile of dst ────────────────────────────────────────────────────────────

def tile(ctx: EmitContext, t: Dequant, row: ir.Value, rows: int, j: ir.Value, cols: int, width: int) -> None:
    """`dst[row + r, j + c·width + l]` for r < rows, c < cols, l < width, accumulated over k in registers."""
    b, n, codes = ctx.b, t.n, CODES[type(t)]
    zero = const(F32, 0.0, width)
    columns = [b.add(j, I64(c * width)) for c in range(cols)]
    x_rows = [b.mul(b.add(row, I64(r)), I64(t.k)) for r in range(rows)]

    def block(kb: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        at = [b.add(b.mul(kb, I64(n)), col) for col in columns]
        scales = [ctx.load(t.scale, F32, a, width) for a in at]
        zps = [ctx.load(t.zp, F32, a, width) if t.is_asymmetric else zero for a in at]
        start = b.mul(kb, I64(t.block_size))
        stop = b.add(start, I64(t.block_size))
        stop = b.select(b.icmp_signed("<", stop, I64(t.k)), stop, I64(t.k))

        def step(p: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
            accs = list(accs)
            flat = b.mul(p, I64(n))
            weights = [b.fmul(b.fsub(b.sitofp(codes(ctx, t, b.add(flat, col), width), vec(F32, width)), z), s)
                       for col, s, z in zip(columns, scales, zps)]
            for r, x_row in enumerate(x_rows):
                x = splat(b, ctx.load(t.x, F32, b.add(x_row, p)), width)
                for c, w in enumerate(weights):
                    accs[r * cols + c] = b.fadd(accs[r * cols + c], b.fmul(x, w, flags=FASTMATH), flags=FASTMATH)
            return accs

        return carried_loop(ctx, start, stop, 1, accs, step, name="p")

    accs = carried_loop(ctx, 0, -(-t.k // t.block_size), 1, [zero] * (rows * cols), block, name="kb")
    for r in range(rows):
        for c, col in enumerate(columns):
            ctx.store(t.dst, accs[r * cols + c], b.add(b.mul(b.add(row, I64(r)), I64(n)), col))


def column_panel(ctx: EmitContext, t: Dequant, j: ir.Value, cols: int, width: int) -> None:
    """Every row of x against columns `j…j + cols·width`: `MR`-row tiles, then single rows."""
    full = t.m - t.m % MR
    if full:
        with ctx.for_range(0, full, MR, name="rows") as row:
            tile(ctx, t, row, MR, j, cols, width)
    for r in range(full, t.m):
        tile(ctx, t, I64(r), 1, j, cols, width)


def emit_dequant_matmul(ctx: EmitContext, t: Dequant) -> None:
    """`dst = x @ dequant(w_q)`: column panels of `NC` vectors, then single vectors, then single columns."""
    if t.m == 0 or t.n == 0:
        return
    lanes = ctx.lanes

    def columns(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b, j = sub.b, start
        for cols, width in ((NC, lanes), (1, lanes), (1, 1)):
            step = cols * width
            end = b.add(j, b.mul(b.udiv(b.sub(stop, j), I64(step)), I64(step)))
            with sub.for_range(j, end, step, name=f"j{step}") as col:
                column_panel(sub, t, col, cols, width)
            j = end

    work = max(1, t.m * t.k)
    ctx.parallel_for(t.n, columns, grain=NC * lanes, min_work=max(NC * lanes, (1 << 16) // work))


@lowering(T.DequantMatMul, check=check_block)
def dequant_matmul(ctx: EmitContext, t: T.DequantMatMul) -> None:
    """Int8Block dequant fused into the matmul."""
    emit_dequant_matmul(ctx, t)


@lowering(T.DequantMatMulInt4, check=check_block)
def dequant_matmul_int4(ctx: EmitContext, t: T.DequantMatMulInt4) -> None:
    """Int4 (unsigned nibbles) dequant fused into the matmul."""
    emit_dequant_matmul(ctx, t)
