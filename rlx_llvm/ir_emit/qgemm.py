"""INT8 GEMM and convolution with int32 accumulation and RLX's requantization (semantics.md §3.8;
docs/lowering-qgemm.md).

One kernel serves both kinds: `out[i, j] = rq(bias + Σ_p (a[i, p] − a_zp)·(b[p, j] − b_zp))` over
int8 `a [m, k]` and `b [k, n]`, `rq(v) = clamp(round_half_away(f32(v)·mult) + out_zp, −128, 127)`
as RLX defines it (the product in f32, Rust's `f32::round`). ONNX's `QLinearMatMul`/`QLinearConv`
round half to even in float64 instead: the two differ only where the product is (nearly) a half
(tests/oracles/test_onnx_qgemm.py checks the integer part against ONNX's MatMulInteger/ConvInteger).

* Both operands are packed once into scratch as centred int16 with k in pairs (`x − zp` fits
  int16): `a16 [rows, 2·⌈k/2⌉]`, `b16 [⌈k/2⌉, n_pad, 2]`, so `pmaddwd` (two exact multiply-adds
  per int32 lane) does the inner product; the intrinsic is chosen by the host's features, with a
  portable form elsewhere.
* The register tile is `MR` rows × `2W` int32 columns (two vector registers a row): per k pair,
  two loads of `b16` and, per row, one broadcast pair of `a16` and two `pmaddwd`; the accumulators
  stay in registers over the whole k loop, then are requantized and stored as int8 (the last
  partial tile of a row through a stack buffer). Row tails run one row at a time.
* **QMatMul**: `a = x`, `b = w`, bias per column; rows split across threads.
* **QConv2d**: per (image, group) an int8 im2col `col [K, P]` (padded taps hold `x_zp`, so they
  contribute exactly 0), packed, then the kernel with `a = w_g [c_out/g, K]` and bias per row
  (output channel). A 1×1 stride-1 unpadded kernel packs the input directly. Few pairs: each
  GEMM's rows split across threads; many: the pairs themselves.
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
from ..jit import host
from . import vecmath as vm
from .context import EmitContext, ScratchRef, pointer
from .conv import FLAT, Axis, _check_conv_geometry, split_index
from .toolkit import (F32, I16, I32, I64, I8, Index, as_value, call_intrinsic, carried_loop, const, copy_bytes,
                      entry_alloca, iadd, imul, scratch_ptr, splat, splat_like, vec, vec_like, zero_bytes)

MR = 4          # rows of the register tile
I8_RANGE = (-128, 127)
PAR_MACS = 1 << 16  # multiply-adds a thread should get before rows are split across threads
UNROLL_ITEMS = 4    # QConv2d (image, group) pairs run one by one (each GEMM threaded) up to this many


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

# `pmaddwd` by i32 lanes: (host feature, intrinsic); narrower tails use the portable form.
PAIR_MADD = {16: ("+avx512bw", "llvm.x86.avx512.pmaddw.d.512"), 8: ("+avx2", "llvm.x86.avx2.pmadd.wd"),
             4: ("+sse2", "llvm.x86.sse2.pmadd.wd")}


@dataclass(frozen=True)
class QGemm:
    """`out[i, j] = rq(bias + Σ_p a[i, p]·b[p, j])` over operands packed by `pack_rows`/`pack_pairs`
    (centred int16, k in pairs): `a [·, 2·k2]`, `b [k2, n_pad, 2]` (zero columns past n),
    `out [·, n]` int8; `bias` int32 per column (`n_pad` of them), or per row when `bias_per_row`."""

    a: ir.Value
    b: ir.Value
    bias: ir.Value
    out: ir.Value
    n: int
    n_pad: int
    k2: int
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


def as_vector(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """`x` itself if a vector, else `<1 x T>`."""
    if isinstance(x.type, ir.VectorType):
        return x
    return b.insert_element(ir.Constant(ir.VectorType(x.type, 1), None), x, I32(0))


def centred(ctx: EmitContext, ptr: ir.Value, index: Index, width: int, zp: int) -> ir.Value:
    """`width` int8 elements from `ptr[index]`, sign-extended to int16, minus the zero point (|·| ≤ 255)."""
    b = ctx.b
    raw = b.sext(ctx.load(0, I8, index, width, base=ptr), vec(I16, width))
    return b.sub(raw, const(I16, zp, width))


def pack_rows(ctx: EmitContext, src: ir.Value, rows: Index, k: int, zp: int, dst: ir.Value) -> None:
    """`dst[i, p] = src[i, p] − zp` as int16 rows of `2·⌈k/2⌉` (an odd k padded with 0)."""
    b, k2 = ctx.b, (k + 1) // 2
    with ctx.for_range(0, rows, name="arow") as i:
        for start, stop, width in column_blocks(k, 2 * ctx.lanes):
            with ctx.for_range(start, stop, width, name="acol") as p:
                ctx.store(0, centred(ctx, src, b.add(imul(b, i, k), p), width, zp), b.add(imul(b, i, 2 * k2), p),
                          base=dst)
        if k % 2:
            ctx.store(0, I16(0), iadd(b, imul(b, i, 2 * k2), k), base=dst)


def pack_pairs(ctx: EmitContext, src: ir.Value, k: int, n: int, zp: int, dst: ir.Value) -> None:
    """`dst[p2, j] = (src[2·p2, j] − zp, src[2·p2 + 1, j] − zp)` as int16 pairs in rows of `padded(ctx, n)`
    pairs, zero past column n (an odd k's last pair ends in 0)."""
    b, n_pad = ctx.b, padded(ctx, n)

    def pair_row(p2: Index, second: bool) -> None:
        for start, stop, width in column_blocks(n, 2 * ctx.lanes):
            with ctx.for_range(start, stop, width, name="bcol") as j:
                lo = as_vector(b, centred(ctx, src, iadd(b, imul(b, p2, 2 * n), j), width, zp))
                hi = (as_vector(b, centred(ctx, src, iadd(b, iadd(b, imul(b, p2, 2 * n), n), j), width, zp))
                      if second else ir.Constant(lo.type, [I16(0)] * width))
                zipped = ir.Constant(ir.VectorType(I32, 2 * width), [I32(i // 2 + (i % 2) * width)
                                                                      for i in range(2 * width)])
                ctx.store(0, b.shuffle_vector(lo, hi, zipped), b.mul(iadd(b, imul(b, p2, n_pad), j), I64(2)), base=dst)
        zero_bytes(ctx, ctx.addr(0, iadd(b, imul(b, p2, 4 * n_pad), 4 * n), base=dst), 4 * (n_pad - n))

    with ctx.for_range(0, k // 2, name="pair") as p2:
        pair_row(p2, True)
    if k % 2:
        pair_row(k // 2, False)


def madd_pairs(ctx: EmitContext, x: ir.Value, y: ir.Value) -> ir.Value:
    """Lane j = `x[2j]·y[2j] + x[2j+1]·y[2j+1]` in int32 (`pmaddwd` where the host has it)."""
    b, width = ctx.b, x.type.count // 2
    feature, name = PAIR_MADD.get(width, ("", ""))
    if name and feature in host().features.split(","):
        return call_intrinsic(ctx, name, [x, y], ret=ir.VectorType(I32, width))

    def lanes(v: ir.Value, parity: int) -> ir.Value:
        if width == 1:
            return b.sext(b.extract_element(v, I32(parity)), I32)
        pick = ir.Constant(ir.VectorType(I32, width), [I32(2 * j + parity) for j in range(width)])
        return b.sext(b.shuffle_vector(v, ir.Constant(v.type, None), pick), vec(I32, width))

    return b.add(b.mul(lanes(x, 0), lanes(y, 0)), b.mul(lanes(x, 1), lanes(y, 1)))


def requantize(ctx: EmitContext, acc: ir.Value, mult: float, out_zp: int) -> ir.Value:
    """int32 lanes → int8 as RLX: `clamp(round_half_away(f32(acc)·mult) + out_zp, −128, 127)`, the
    product in f32 (`mult` is the f32 field), rounded half away from zero (Rust `f32::round`)."""
    b = ctx.b
    real = b.fmul(b.sitofp(acc, vec_like(acc, F32)), splat_like(acc, float(np.float32(mult)), F32))
    rounded = vm.round_half_away(b, real)
    wide = float(1 << 10)   # any bound past ±(128 + |out_zp|) keeps the conversion exact and in range
    rounded = call_intrinsic(ctx, "llvm.maxnum", [call_intrinsic(ctx, "llvm.minnum", [rounded, splat_like(real, wide)]),
                                                  splat_like(real, -wide)])
    shifted = b.add(b.fptosi(rounded, acc.type), splat_like(acc, out_zp))
    low, high = I8_RANGE
    clamped = b.select(b.icmp_signed("<", shifted, splat_like(acc, low)), splat_like(acc, low), shifted)
    clamped = b.select(b.icmp_signed(">", clamped, splat_like(acc, high)), splat_like(acc, high), clamped)
    return b.trunc(clamped, vec_like(acc, I8))


def tile(ctx: EmitContext, q: QGemm, row: ir.Value, rows: int, col: Index, keep: int) -> None:
    """Rows `[row, row + rows)` × the `2W` columns from `col`: int32 accumulators (one per row and
    vector register) over all k pairs, then bias, requantization, and the first `keep` columns
    stored as int8 (a partial tile goes through a stack buffer: nothing past column n is written)."""
    b, reg = ctx.b, ctx.lanes
    chunks = (0, reg)

    def step(p2: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        bv = [ctx.load(0, I16, b.mul(iadd(b, iadd(b, imul(b, p2, q.n_pad), col), c), I64(2)), 2 * reg, base=q.b)
              for c in chunks]
        new = []
        for r in range(rows):
            pair = ctx.load(0, I32, iadd(b, imul(b, iadd(b, row, r), q.k2), p2), base=q.a)
            av = b.bitcast(splat(b, pair, reg), ir.VectorType(I16, 2 * reg))
            new += [b.add(accs[2 * r + ci], madd_pairs(ctx, av, bvc)) for ci, bvc in enumerate(bv)]
        return new

    accs = carried_loop(ctx, 0, q.k2, 1, [const(I32, 0, reg)] * (2 * rows), step, name="p")
    staging = None if keep == 2 * reg else entry_alloca(ctx, ir.VectorType(I8, 2 * reg), "partial")
    for r in range(rows):
        i = iadd(b, row, r)
        bias = [splat(b, ctx.load(0, I32, i, base=q.bias), reg) if q.bias_per_row
                else ctx.load(0, I32, iadd(b, col, c), reg, base=q.bias) for c in chunks]
        lo, hi = (requantize(ctx, b.add(acc, bv), q.mult, q.out_zp) for acc, bv in zip(accs[2 * r:2 * r + 2], bias))
        out = b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 2 * reg), [I32(j) for j in range(2 * reg)]))
        at = iadd(b, imul(b, i, q.n), col)
        if staging is None:
            ctx.store(0, out, at, base=q.out)
        else:
            b.store(out, staging)
            copy_bytes(ctx, ctx.addr(0, at, base=q.out), staging, keep)


def row_block(ctx: EmitContext, q: QGemm, row: ir.Value, rows: int) -> None:
    """Every column of rows `[row, row + rows)`: whole `2W` tiles, then one partial tile."""
    wide = 2 * ctx.lanes
    main = q.n - q.n % wide
    if main:
        with ctx.for_range(0, main, wide, name="col") as col:
            tile(ctx, q, row, rows, col, wide)
    if main < q.n:
        tile(ctx, q, row, rows, main, q.n - main)


def qgemm_rows(ctx: EmitContext, q: QGemm, start: Index, stop: Index) -> None:
    """Rows `[start, stop)` of the int8 GEMM: `MR`-row tiles, then the last rows one at a time."""
    b = ctx.b
    start, stop = as_value(start), as_value(stop)
    full = b.add(start, b.mul(b.sdiv(b.sub(stop, start), I64(MR)), I64(MR)))
    with ctx.for_range(start, full, MR, name="rows") as row:
        row_block(ctx, q, row, MR)
    with ctx.for_range(full, stop, name="row") as row:
        row_block(ctx, q, row, 1)


def packed_bytes(rows: int, k: int) -> int:
    """Bytes of `rows` int16 rows of `2·⌈k/2⌉` (at least 1)."""
    return max(1, rows * 2 * ((k + 1) // 2) * 2)


def padded(ctx: EmitContext, n: int) -> int:
    """`n` rounded up to whole `2W` tiles."""
    return -(-n // (2 * ctx.lanes)) * 2 * ctx.lanes


# ── QMatMul ──────────────────────────────────────────────────────────────────

@lowering(T.QMatMul, check=check_qmatmul)
def qmatmul(ctx: EmitContext, t: T.QMatMul) -> None:
    """Pack `x − x_zp` and `w − w_zp` as int16 k-pairs in scratch, then the tiles; rows split across threads."""
    if t.m == 0 or t.n == 0:
        return
    n_pad = padded(ctx, t.n)
    a16, b16 = ctx.scratch_alloc(packed_bytes(t.m, t.k)), ctx.scratch_alloc(packed_bytes(n_pad, t.k))
    bias = ctx.scratch_alloc(4 * n_pad)
    pack_rows(ctx, ctx.addr(t.x), t.m, t.k, t.x_zp, scratch_ptr(ctx, a16))
    pack_pairs(ctx, ctx.addr(t.w), t.k, t.n, t.w_zp, scratch_ptr(ctx, b16))
    copy_bytes(ctx, scratch_ptr(ctx, bias), ctx.addr(t.bias), 4 * t.n)
    zero_bytes(ctx, scratch_ptr(ctx, bias + 4 * t.n), 4 * (n_pad - t.n))

    def rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        q = QGemm(*(pointer(sub, ScratchRef(off)) for off in (a16, b16, bias)), sub.addr(t.out),
                  t.n, n_pad, (t.k + 1) // 2, t.out_zp, t.mult)
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


def conv_item(ctx: EmitContext, t: T.QConv2d, item: Index, col: "ir.Value | None", col16: ir.Value
              ) -> tuple[Index, Index]:
    """Im2col and pack (image, group) `item` into `col16`; returns (its output block, its group)."""
    b, groups = ctx.b, t.groups
    cin_g, plane = t.c_in // groups, t.h * t.w_in
    i, g = divmod(item, groups) if isinstance(item, int) else split_index(b, item, groups)
    x = ctx.addr(t.x, iadd(b, imul(b, i, t.c_in * plane), imul(b, g, cin_g * plane)))
    if col is not None:
        im2col_i8(ctx, t, x, col)
    k, p = cin_g * t.kh * t.kw, t.h_out * t.w_out
    pack_pairs(ctx, x if col is None else col, k, p, t.x_zp, col16)
    return iadd(b, imul(b, i, t.c_out * p), imul(b, g, t.c_out // groups * p)), g


def conv_gemm(ctx: EmitContext, t: T.QConv2d, w16: int, col16: ir.Value, out: Index, g: Index) -> QGemm:
    """The GEMM `w_g · col` of one (image, group) writing output block `out` (an element index)."""
    b, cout_g = ctx.b, t.c_out // t.groups
    k, p = t.c_in // t.groups * t.kh * t.kw, t.h_out * t.w_out
    weights = ctx.addr(0, imul(b, g, cout_g * packed_bytes(1, k)), base=pointer(ctx, ScratchRef(w16)))
    return QGemm(weights, col16, ctx.addr(t.bias, imul(b, g, cout_g), 4), ctx.addr(t.out, out), p, padded(ctx, p),
                 (k + 1) // 2, t.out_zp, t.mult, bias_per_row=True)


@lowering(T.QConv2d, check=check_qconv2d)
def qconv2d(ctx: EmitContext, t: T.QConv2d) -> None:
    """Per (image, group): int8 im2col and packing, then the int8 GEMM `w_g · col`.  Up to
    `UNROLL_ITEMS` pairs run one after another, each GEMM's rows split across threads; more
    pairs are split across threads whole."""
    cout_g = t.c_out // t.groups
    k, p = t.c_in // t.groups * t.kh * t.kw, t.h_out * t.w_out
    items = t.n * t.groups
    if items == 0 or cout_g == 0 or p == 0:
        return
    direct = t.kh == t.kw == t.sh == t.sw == 1 and t.ph == t.pw == 0
    w16 = ctx.scratch_alloc(packed_bytes(t.c_out, k))
    pack_rows(ctx, ctx.addr(t.w), t.c_out, k, t.w_zp, scratch_ptr(ctx, w16))

    def buffers(c: EmitContext) -> tuple["int | None", int]:
        return (None if direct else c.scratch_alloc(k * p)), c.scratch_alloc(packed_bytes(padded(ctx, p), k))

    if items <= UNROLL_ITEMS:
        col, col16 = buffers(ctx)
        for item in range(items):
            out, g = conv_item(ctx, t, item, None if col is None else scratch_ptr(ctx, col), scratch_ptr(ctx, col16))

            def rows(sub: EmitContext, start: ir.Value, stop: ir.Value, out=out, g=g) -> None:
                qgemm_rows(sub, conv_gemm(sub, t, w16, pointer(sub, ScratchRef(col16)), out, g), start, stop)

            ctx.parallel_for(cout_g, rows, grain=MR, min_work=max(1, PAR_MACS // max(1, k * p)))
        return

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        col, col16 = (None if off is None else scratch_ptr(sub, off) for off in buffers(sub))
        with sub.for_range(start, stop, name="item") as item:
            out, g = conv_item(sub, t, item, col, col16)
            qgemm_rows(sub, conv_gemm(sub, t, w16, col16, out, g), 0, cout_g)

    ctx.parallel_for(items, body, min_work=max(1, PAR_MACS // max(1, cout_g * k * p)))
