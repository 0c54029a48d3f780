"""INT8 GEMM and convolution with int32 accumulation and ONNX requantization (semantics.md §3.8;
docs/lowering-qgemm.md).

One kernel serves both kinds: `out[i, j] = rq(bias + Σ_p (a[i, p] − a_zp)·(b[p, j] − b_zp))` over
int8 `a [m, k]` and `b [k, n]`, `rq(v) = clamp(roundeven(f64(v)·f64(mult) + out_zp), −128, 127)` —
the float64 product ONNX's reference computes (an f32 multiplier against an int32 array promotes
to float64 in NumPy), so the bytes match `QLinearMatMul`/`QLinearConv` exactly.

* The register tile is `MR` rows × `2W` int32 columns (two vector registers a row): per `p`, one
  row slice of `b` is sign-extended once and multiplied by each row's broadcast `a[i, p]`; the
  accumulators stay in registers over the whole `k` loop, then are requantized and stored as int8.
  Column tails run one vector each of W, W/2, …, 1 lanes; row tails one row at a time.
* **QMatMul**: `a = x`, `b = w`, bias per column; rows split across threads.
* **QConv2d**: per (image, group) an int8 im2col `col [K, P]` in per-thread scratch (padded taps
  hold `x_zp`, so they contribute exactly 0), then the kernel with `a = w_g [c_out/g, K]`,
  `b = col` and bias per row (output channel); (image, group) pairs split across threads.
  A 1×1 stride-1 unpadded kernel reads the input directly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..registry import lowering
from .context import EmitContext
from .conv import FLAT, Axis, _check_conv_geometry, split_index
from .toolkit import F64, I32, I64, I8, call_intrinsic, carried_loop, const, iadd, imul, scratch_ptr, splat, vec

MR = 4          # rows of the register tile
I8_RANGE = (-128, 127)
PAR_MACS = 1 << 16  # multiply-adds a thread should get before rows are split across threads


# ── validation ───────────────────────────────────────────────────────────────

def _check_requant(t) -> None:
    """Zero points inside int8 (ONNX's zero-point type) and a finite multiplier."""
    for field in ("x_zp", "w_zp", "out_zp"):
        value = getattr(t, field)
        if not I8_RANGE[0] <= value <= I8_RANGE[1]:
            raise ValidationError(f"{field} = {value} is outside the int8 range [-128, 127]", field=field)
    if not math.isfinite(t.mult):
        raise ValidationError(f"mult = {t.mult} is not finite", field="mult")


def check_qmatmul(t: T.QMatMul) -> None:
    """QMatMul: int8 zero points, finite multiplier."""
    _check_requant(t)


def qconv_axes(t: T.QConv2d) -> tuple[Axis, Axis, Axis]:
    """(depth, height, width) of a QConv2d (its input width is `w_in`: `w` is the weight)."""
    return FLAT, Axis(t.h, t.h_out, t.kh, t.sh, t.ph, t.dh), Axis(t.w_in, t.w_out, t.kw, t.sw, t.pw, t.dw)


def check_qconv2d(t: T.QConv2d) -> None:
    """QConv2d: Conv2D's geometry rules, int8 zero points, finite multiplier."""
    _check_conv_geometry(t, qconv_axes(t))
    _check_requant(t)


# ── the kernel ───────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class QGemm:
    """`out[i, j] = rq(bias + (a − a_zp)·(b − b_zp))` on pointers: `a [·, k]`, `b [k, n]`, `out [·, n]`;
    `bias` int32 per column, or per row when `bias_per_row`."""

    a: ir.Value
    b: ir.Value
    bias: ir.Value
    out: ir.Value
    n: int
    k: int
    a_zp: int
    b_zp: int
    out_zp: int
    mult: float
    bias_per_row: bool = False


def column_blocks(n: int, widest: int) -> Iterator[tuple[int, int, int]]:
    """`(start, stop, width)` runs covering `[0, n)`: whole `widest` vectors, then one step each of
    every smaller power-of-two width that still fits."""
    main = n - n % widest
    if main:
        yield 0, main, widest
    w = widest
    while w > 1 and main < n:
        w //= 2
        if n - main >= w:
            yield main, main + w, w
            main += w


def widened(ctx: EmitContext, ptr: ir.Value, index: ir.Value, width: int, zp: int) -> ir.Value:
    """`width` int8 elements from `ptr[index]`, sign-extended to int32, minus the zero point."""
    b = ctx.b
    raw = b.sext(ctx.load(0, I8, index, width, base=ptr), vec(I32, width))
    return b.sub(raw, const(I32, zp, width))


def requantize(ctx: EmitContext, acc: ir.Value, mult: float, out_zp: int) -> ir.Value:
    """int32 lanes → int8: `clamp(roundeven(f64(acc)·f64(mult) + out_zp), −128, 127)`, `mult` the f32
    field's value (no fused multiply-add: the product is rounded to float64 first, as in NumPy)."""
    b, w = ctx.b, (acc.type.count if isinstance(acc.type, ir.VectorType) else 1)
    scale = const(F64, float(np.float32(mult)), w)
    real = b.fadd(b.fmul(b.sitofp(acc, vec(F64, w)), scale), const(F64, out_zp, w))
    rounded = call_intrinsic(ctx, "llvm.roundeven", [real])
    low, high = I8_RANGE
    clamped = call_intrinsic(ctx, "llvm.maxnum", [call_intrinsic(ctx, "llvm.minnum", [rounded, const(F64, high, w)]),
                                                  const(F64, low, w)])
    return b.trunc(b.fptosi(clamped, vec(I32, w)), vec(I8, w))


def tile(ctx: EmitContext, q: QGemm, row: ir.Value, rows: int, col: "ir.Value | int", width: int) -> None:
    """Rows `[row, row + rows)` × columns `[col, col + width)`: int32 accumulators over all of k,
    then bias, requantization and int8 stores."""
    b = ctx.b

    def step(p: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        bv = widened(ctx, q.b, iadd(b, imul(b, p, q.n), col), width, q.b_zp)
        av = [widened(ctx, q.a, iadd(b, imul(b, iadd(b, row, r), q.k), p), 1, q.a_zp) for r in range(rows)]
        return [b.add(acc, b.mul(splat(b, a, width) if width > 1 else a, bv)) for acc, a in zip(accs, av)]

    accs = carried_loop(ctx, 0, q.k, 1, [const(I32, 0, width)] * rows, step, name="p")
    for r, acc in enumerate(accs):
        i = iadd(b, row, r)
        if q.bias_per_row:
            bias = ctx.load(0, I32, i, base=q.bias)
            bias = splat(b, bias, width) if width > 1 else bias
        else:
            bias = ctx.load(0, I32, as_index(col), width, base=q.bias)
        out = requantize(ctx, b.add(acc, bias), q.mult, q.out_zp)
        ctx.store(0, out, iadd(b, imul(b, i, q.n), col), base=q.out)


def as_index(x: "ir.Value | int") -> ir.Value:
    """An i64 index value."""
    return I64(x) if isinstance(x, int) else x


def row_block(ctx: EmitContext, q: QGemm, row: ir.Value, rows: int) -> None:
    """Every column of rows `[row, row + rows)`: two-register tiles, then the narrowing tails."""
    for start, stop, width in column_blocks(q.n, 2 * ctx.lanes):
        if stop - start > width:
            with ctx.for_range(start, stop, width, name="col") as col:
                tile(ctx, q, row, rows, col, width)
        else:
            tile(ctx, q, row, rows, start, width)


def qgemm_rows(ctx: EmitContext, q: QGemm, start: "ir.Value | int", stop: "ir.Value | int") -> None:
    """Rows `[start, stop)` of the int8 GEMM: `MR`-row tiles, then the last rows one at a time."""
    b = ctx.b
    start, stop = as_index(start), as_index(stop)
    full = b.add(start, b.mul(b.sdiv(b.sub(stop, start), I64(MR)), I64(MR)))
    with ctx.for_range(start, full, MR, name="rows") as row:
        row_block(ctx, q, row, MR)
    with ctx.for_range(full, stop, name="row") as row:
        row_block(ctx, q, row, 1)


# ── QMatMul ──────────────────────────────────────────────────────────────────

@lowering(T.QMatMul, check=check_qmatmul)
def qmatmul(ctx: EmitContext, t: T.QMatMul) -> None:
    """`out = rq(bias + (x − x_zp)·(w − w_zp))`, rows of `x` split across threads."""
    if t.m == 0 or t.n == 0:
        return

    def rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        q = QGemm(sub.addr(t.x), sub.addr(t.w), sub.addr(t.bias), sub.addr(t.out), t.n, t.k,
                  t.x_zp, t.w_zp, t.out_zp, t.mult)
        qgemm_rows(sub, q, start, stop)

    ctx.parallel_for(t.m, rows, grain=MR, min_work=max(1, PAR_MACS // max(1, t.n * t.k)))


# ── QConv2d ──────────────────────────────────────────────────────────────────

def im2col_i8(ctx: EmitContext, t: T.QConv2d, src: ir.Value, col: ir.Value) -> None:
    """`col[(ci, ki, kj), (oh, ow)] = x[ci, oh·sh + ki·dh − ph, ow·sw + kj·dw − pw]`, `x_zp` for padded taps."""
    b = ctx.b
    _, hz, wz = qconv_axes(t)
    cin_g, p = t.c_in // t.groups, hz.out * wz.out
    with ctx.for_range(0, cin_g * hz.k * wz.k, name="tap") as tap:
        ci, ki, kj = split_index(b, tap, hz.k, wz.k)
        with ctx.for_range(0, p, name="pix") as pix:
            oh, ow = split_index(b, pix, wz.out)
            ih = b.sub(b.add(imul(b, oh, hz.s), imul(b, ki, hz.dil)), I64(hz.p))
            iw = b.sub(b.add(imul(b, ow, wz.s), imul(b, kj, wz.dil)), I64(wz.p))
            inside = b.and_(b.icmp_unsigned("<", ih, I64(hz.size)), b.icmp_unsigned("<", iw, I64(wz.size)))
            at = b.select(inside, b.add(imul(b, ci, hz.size * wz.size), b.add(imul(b, ih, wz.size), iw)), I64(0))
            value = b.select(inside, ctx.load(0, I8, at, base=src), I8(t.x_zp))
            ctx.store(0, value, b.add(imul(b, tap, p), pix), base=col)


@lowering(T.QConv2d, check=check_qconv2d)
def qconv2d(ctx: EmitContext, t: T.QConv2d) -> None:
    """Per (image, group): int8 im2col, then the int8 GEMM `w_g · col`; pairs split across threads."""
    groups = t.groups
    cin_g, cout_g = t.c_in // groups, t.c_out // groups
    k, p = cin_g * t.kh * t.kw, t.h_out * t.w_out
    items = t.n * groups
    if items == 0 or cout_g == 0 or p == 0:
        return
    direct = t.kh == t.kw == t.sh == t.sw == 1 and t.ph == t.pw == 0

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        col = None if direct else scratch_ptr(sub, sub.scratch_alloc(max(1, k * p)))
        with sub.for_range(start, stop, name="item") as item:
            i, g = split_index(b, item, groups)
            x = sub.addr(t.x, b.add(imul(b, i, t.c_in * t.h * t.w_in), imul(b, g, cin_g * t.h * t.w_in)))
            if col is not None:
                im2col_i8(sub, t, x, col)
            q = QGemm(sub.addr(t.w, imul(b, g, cout_g * k)), x if col is None else col,
                      sub.addr(t.bias, imul(b, g, cout_g), 4),
                      sub.addr(t.out, b.add(imul(b, i, t.c_out * p), imul(b, g, cout_g * p))), p, k,
                      t.w_zp, t.x_zp, t.out_zp, t.mult, bias_per_row=True)
            qgemm_rows(sub, q, 0, cout_g)

    ctx.parallel_for(items, body, min_work=max(1, PAR_MACS // max(1, cout_g * k * p)))
