"""INT8 GEMM and convolution with int32 accumulation and RLX's requantization (semantics.md §3.8;
docs/lowering-qgemm.md).

One kernel serves both kinds: `out[i, j] = rq(bias + Σ_p (a[i, p] − a_zp)·(b[p, j] − b_zp))` over
int8 `a [m, k]` and `b [k, n]`, `rq(v) = clamp(round_half_away(f32(v)·mult) + out_zp, −128, 127)`
as RLX defines it (the product in f32, Rust's `f32::round`). ONNX's `QLinearMatMul`/`QLinearConv`
round half to even in float64 instead: the two differ only where the product is (nearly) a half
(tests/oracles/test_onnx_qgemm.py checks the integer part against ONNX's MatMulInteger/ConvInteger).

* Both operands are packed once into scratch as 32-bit words of `group` k elements (`DotScheme`,
  chosen by the host's features): int16 pairs `x − zp` multiplied by `pmaddwd`, or, where the host
  has AVX-512 VNNI / AVX-VNNI, u8/s8 quads (`a + 128`, raw `b`) multiplied by `vpdpbusd`, the zero
  points and the +128 restored exactly by int32 row and column terms computed while packing. A
  portable form of each gives the same numbers on other hosts.
* The register tile is `tile_rows` rows × `2W` int32 columns (two vector registers a row): per k
  word, two loads of `b` and, per row, one broadcast word of `a` and two dot instructions; the
  accumulators stay in registers over the whole k loop, then get the int32 terms, are
  requantized and stored as int8 (the last partial tile of a row through a stack buffer). The
  columns go a `2W` strip at a time (its packed `b` stays in L1 across the rows); row tails run
  one row at a time.
* **QMatMul**: `a = x`, `b = w`, bias per column; rows split across threads.
* **QConv2d**: per (image, group) an int8 im2col `col [K, P]` (padded taps hold `x_zp`, so they
  contribute exactly 0), packed, then the kernel with `a = w_g [c_out/g, K]` and bias per row
  (output channel). A 1×1 stride-1 unpadded kernel packs the input directly. Few pairs: each
  GEMM's rows split across threads; many: the pairs themselves.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Iterator

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
                      entry_alloca, iadd, imul, scratch_ptr, sizeof, splat, splat_like, vec, vec_like, vector_registers,
                      zero_bytes)

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


# ── the inner product ────────────────────────────────────────────────────────

@dataclass(frozen=True)
class DotScheme:
    """How the k axis is packed into 32-bit words and multiplied: `group` elements of type `elem` per
    word, one word of `a` times one of `b` giving one exact int32 lane of the product.

    `centred`: both operands hold `x − zp` as int16 (`pmaddwd`: signed × signed, no correction).
    Otherwise `a` holds `x + 128` as u8 and `b` the raw int8 (`vpdpbusd`: unsigned × signed), and the
    zero points and the +128 come back as a per-row and a per-column int32 term (`zero_point_terms`)."""

    name: str
    group: int
    elem: ir.IntType
    centred: bool
    accumulates: bool                                    # the instruction adds into the accumulator itself
    intrinsics: dict[int, tuple[tuple[tuple[str, ...], ...], str]]   # i32 lanes → (feature sets, any suffices; name)

    def intrinsic(self, lanes: int, features: set[str]) -> str:
        """The x86 intrinsic for `lanes` int32 lanes if `features` have it, else "" (the portable form)."""
        needs, name = self.intrinsics.get(lanes, ((), ""))
        return name if any(set(need) <= features for need in needs) else ""


PAIRS = DotScheme("pmaddwd", 2, I16, True, False, {
    16: ((("+avx512bw",),), "llvm.x86.avx512.pmaddw.d.512"),
    8: ((("+avx2",),), "llvm.x86.avx2.pmadd.wd"),
    4: ((("+sse2",),), "llvm.x86.sse2.pmadd.wd")})
QUADS = DotScheme("vnni", 4, I8, False, True, {
    16: ((("+avx512vnni",),), "llvm.x86.avx512.vpdpbusd.512"),
    8: ((("+avxvnni",), ("+avx512vnni", "+avx512vl")), "llvm.x86.avx512.vpdpbusd.256")})


def host_features() -> set[str]:
    """The host's LLVM feature flags (`+avx2`, `-avx512vnni`, …)."""
    return set(host().features.split(","))


def dot_scheme(lanes: int) -> DotScheme:
    """VNNI quads where the host has `vpdpbusd` for `lanes` int32 lanes, else int16 pairs."""
    return QUADS if QUADS.intrinsic(lanes, host_features()) else PAIRS


def dot_add(ctx: EmitContext, scheme: DotScheme, acc: ir.Value, a: ir.Value, w: ir.Value) -> ir.Value:
    """`acc` plus, per int32 lane, the dot product of the `group` elements packed in words `a` and `w`
    (the host's instruction where it has one)."""
    b, lanes = ctx.b, acc.type.count
    x, y = (b.bitcast(v, ir.VectorType(scheme.elem, scheme.group * lanes)) for v in (a, w))
    name = scheme.intrinsic(lanes, host_features())
    if name and scheme.accumulates:
        return call_intrinsic(ctx, name, [acc, x, y], ret=acc.type)
    if name:
        return b.add(acc, call_intrinsic(ctx, name, [x, y], ret=acc.type))
    return b.add(acc, portable_dot(b, scheme, x, y))


def portable_dot(b: ir.IRBuilder, scheme: DotScheme, x: ir.Value, y: ir.Value) -> ir.Value:
    """Lane j = `Σ_t x[g·j + t]·y[g·j + t]` widened to int32 (`x` zero-extended when it holds u8):
    the same numbers as the x86 instructions, for hosts without them."""
    g = scheme.group
    lanes = ir.VectorType(I32, x.type.count // g)

    def part(v: ir.Value, t: int, signed: bool) -> ir.Value:
        pick = ir.Constant(lanes, [I32(g * j + t) for j in range(lanes.count)])
        picked = b.shuffle_vector(v, ir.Constant(v.type, None), pick)
        return b.sext(picked, lanes) if signed else b.zext(picked, lanes)

    return functools.reduce(b.add, [b.mul(part(x, t, scheme.centred), part(y, t, True)) for t in range(g)])


# ── packing ──────────────────────────────────────────────────────────────────

def as_vector(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """`x` itself if a vector, else `<1 x T>`."""
    if isinstance(x.type, ir.VectorType):
        return x
    return b.insert_element(ir.Constant(ir.VectorType(x.type, 1), None), x, I32(0))


def packed(ctx: EmitContext, scheme: DotScheme, src: ir.Value, index: Index, width: int, zp: int,
           unsigned: bool) -> ir.Value:
    """`width` int8 elements from `src[index]` as the scheme stores them: `x − zp` in int16 when
    centred, else `x + 128` as u8 (`unsigned`, the sign bit flipped) or `x` itself."""
    b = ctx.b
    raw = as_vector(b, ctx.load(0, I8, index, width, base=src))
    if scheme.centred:
        return b.sub(b.sext(raw, vec(I16, width) if width > 1 else ir.VectorType(I16, 1)),
                     ir.Constant(ir.VectorType(I16, width), [I16(zp)] * width))
    return b.xor(raw, ir.Constant(raw.type, [I8(-128)] * width)) if unsigned else raw


def interleave(b: ir.IRBuilder, parts: list[ir.Value]) -> ir.Value:
    """`[p0[0], p1[0], …, p0[1], p1[1], …]`: equal vectors zipped lane by lane."""
    width, g = parts[0].type.count, len(parts)
    while len(parts) > 1:
        n = 2 * parts[0].type.count
        parts = [b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, n), [I32(i) for i in range(n)]))
                 for x, y in zip(parts[::2], parts[1::2])]
    order = ir.Constant(ir.VectorType(I32, g * width), [I32(q % g * width + q // g) for q in range(g * width)])
    return b.shuffle_vector(parts[0], ir.Constant(parts[0].type, None), order)


def words(k: int, scheme: DotScheme) -> int:
    """32-bit words holding k elements of the scheme (`⌈k/group⌉`)."""
    return -(-k // scheme.group)


def pack_rows(ctx: EmitContext, scheme: DotScheme, src: ir.Value, rows: Index, k: int, zp: int,
              dst: ir.Value) -> None:
    """The row operand: `dst[i]` = row i of `src [rows, k]` as packed elements in `words(k)` words
    (u8 when not centred), the last word padded with 0."""
    b, length = ctx.b, scheme.group * words(k, scheme)
    with ctx.for_range(0, rows, name="arow") as i:
        for start, stop, width in column_blocks(k, 2 * ctx.lanes):
            with ctx.for_range(start, stop, width, name="acol") as p:
                ctx.store(0, packed(ctx, scheme, src, b.add(imul(b, i, k), p), width, zp, unsigned=True),
                          b.add(imul(b, i, length), p), base=dst)
        if length > k:
            zero_bytes(ctx, ctx.addr(0, iadd(b, imul(b, i, length), k), sizeof(scheme.elem), base=dst),
                       (length - k) * sizeof(scheme.elem))


def pack_columns(ctx: EmitContext, scheme: DotScheme, src: ir.Value, k: int, n: int, zp: int,
                 dst: ir.Value) -> None:
    """The column operand: word `dst[p, j]` holds `src[group·p + t, j]` for t < group (as packed,
    signed), rows of `padded(ctx, n)` words, zero past column n and past row k."""
    b, g, n_pad = ctx.b, scheme.group, padded(ctx, n)

    def word_row(p: Index, present: int) -> None:
        for start, stop, width in column_blocks(n, 2 * ctx.lanes):
            with ctx.for_range(start, stop, width, name="bcol") as j:
                parts = [packed(ctx, scheme, src, iadd(b, imul(b, p, g * n), iadd(b, j, t * n)), width, zp, False)
                         for t in range(present)]
                parts += [ir.Constant(parts[0].type, None)] * (g - present)   # zeros past row k
                ctx.store(0, interleave(b, parts), imul(b, iadd(b, imul(b, p, n_pad), j), g), base=dst)
        zero_bytes(ctx, ctx.addr(0, iadd(b, imul(b, p, n_pad), n), 4, base=dst), 4 * (n_pad - n))

    with ctx.for_range(0, k // g, name="kword") as p:
        word_row(p, g)
    if k % g:
        word_row(k // g, k % g)


def row_sums(ctx: EmitContext, src: ir.Value, rows: Index, k: int, dst: ir.Value) -> None:
    """`dst[i] = Σ_p src[i, p]` over int8 rows of k (int32)."""
    b = ctx.b
    with ctx.for_range(0, rows, name="srow") as i:
        def add(p: ir.Value, total: list[ir.Value]) -> list[ir.Value]:
            return [b.add(total[0], b.sext(ctx.load(0, I8, b.add(imul(b, i, k), p), base=src), I32))]

        ctx.store(0, carried_loop(ctx, 0, k, 1, [I32(0)], add, name="sp")[0], i, base=dst)


def column_sums(ctx: EmitContext, src: ir.Value, k: int, n: int, dst: ir.Value) -> None:
    """`dst[j] = Σ_p src[p, j]` over an int8 `[k, n]` (int32; row by row, so the inner loop vectorizes)."""
    b = ctx.b
    zero_bytes(ctx, dst, 4 * n)
    with ctx.for_range(0, k, name="sp") as p:
        with ctx.for_range(0, n, name="sj") as j:
            value = b.sext(ctx.load(0, I8, b.add(imul(b, p, n), j), base=src), I32)
            ctx.store(0, b.add(ctx.load(0, I32, j, base=dst), value), j, base=dst)


def affine_terms(ctx: EmitContext, sums: ir.Value, count: Index, scale: int, constant: int,
                 base: "ir.Value | None" = None) -> None:
    """`sums[l] ← base[l] + constant + scale·sums[l]` for l < count (int32, wrapping)."""
    b = ctx.b
    with ctx.for_range(0, count, name="term") as line:
        term = b.add(b.mul(ctx.load(0, I32, line, base=sums), I32(wrap32(scale))), I32(wrap32(constant)))
        if base is not None:
            term = b.add(term, ctx.load(0, I32, line, base=base))
        ctx.store(0, term, line, base=sums)


def wrap32(v: int) -> int:
    """`v` as a two's-complement int32 (the sums wrap, like NumPy's int32 matmul)."""
    return (v + (1 << 31)) % (1 << 32) - (1 << 31)


# ── the GEMM ─────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class QGemm:
    """`out[i, j] = rq(Σ_w a[i, w]·b[w, j] + col_add[j] + row_add[i])` over packed words (`pack_rows`,
    `pack_columns`): `a [·, kw]`, `b [kw, n_pad]` (zero columns past n), `out [·, n]` int8; the int32
    terms (bias, zero-point corrections) per column (`n_pad` of them) and per row, each optional."""

    scheme: DotScheme
    a: ir.Value
    b: ir.Value
    out: ir.Value
    n: int
    n_pad: int
    kw: int
    out_zp: int
    mult: float
    col_add: "ir.Value | None" = None
    row_add: "ir.Value | None" = None


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
    vector register) over all k words, then the int32 terms, requantization, and the first `keep`
    columns stored as int8 (a partial tile goes through a stack buffer: nothing past column n is written)."""
    b, reg = ctx.b, ctx.lanes
    chunks = (0, reg)

    def step(p: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        bv = [ctx.load(0, I32, iadd(b, iadd(b, imul(b, p, q.n_pad), col), c), reg, base=q.b) for c in chunks]
        new = []
        for r in range(rows):
            av = splat(b, ctx.load(0, I32, iadd(b, imul(b, iadd(b, row, r), q.kw), p), base=q.a), reg)
            new += [dot_add(ctx, q.scheme, accs[2 * r + ci], av, bvc) for ci, bvc in enumerate(bv)]
        return new

    accs = carried_loop(ctx, 0, q.kw, 1, [const(I32, 0, reg)] * (2 * rows), step, name="p")
    staging = None if keep == 2 * reg else entry_alloca(ctx, ir.VectorType(I8, 2 * reg), "partial")
    for r in range(rows):
        i = iadd(b, row, r)
        sums = accs[2 * r:2 * r + 2]
        if q.col_add is not None:
            sums = [b.add(s, ctx.load(0, I32, iadd(b, col, c), reg, base=q.col_add)) for s, c in zip(sums, chunks)]
        if q.row_add is not None:
            term = splat(b, ctx.load(0, I32, i, base=q.row_add), reg)
            sums = [b.add(s, term) for s in sums]
        lo, hi = (requantize(ctx, s, q.mult, q.out_zp) for s in sums)
        out = b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 2 * reg), [I32(j) for j in range(2 * reg)]))
        at = iadd(b, imul(b, i, q.n), col)
        if staging is None:
            ctx.store(0, out, at, base=q.out)
        else:
            b.store(out, staging)
            copy_bytes(ctx, ctx.addr(0, at, base=q.out), staging, keep)


def tile_rows(lanes: int) -> int:
    """Rows of the register tile: half the vector registers (32 with AVX-512's 16 lanes, else 16)
    hold its accumulators, two per row."""
    return vector_registers(lanes) // 2 // 2


def qgemm_rows(ctx: EmitContext, q: QGemm, start: Index, stop: Index) -> None:
    """Rows `[start, stop)` of the int8 GEMM, a `2W`-column strip at a time (whole strips, then one
    partial): its packed `b` words are reused from L1 by every `tile_rows`-row tile, then by the
    last rows one at a time."""
    b, wide, mr = ctx.b, 2 * ctx.lanes, tile_rows(ctx.lanes)
    start, stop = as_value(start), as_value(stop)
    full = b.add(start, b.mul(b.sdiv(b.sub(stop, start), I64(mr)), I64(mr)))

    def strip(col: Index, keep: int) -> None:
        with ctx.for_range(start, full, mr, name="rows") as row:
            tile(ctx, q, row, mr, col, keep)
        with ctx.for_range(full, stop, name="row") as row:
            tile(ctx, q, row, 1, col, keep)

    main = q.n - q.n % wide
    if main:
        with ctx.for_range(0, main, wide, name="col") as col:
            strip(col, wide)
    if main < q.n:
        strip(main, q.n - main)


def packed_bytes(rows: int, kw: int) -> int:
    """Bytes of `rows` packed rows of `kw` words (at least 1)."""
    return max(1, rows * kw * 4)


def padded(ctx: EmitContext, n: int) -> int:
    """`n` rounded up to whole `2W` tiles."""
    return -(-n // (2 * ctx.lanes)) * 2 * ctx.lanes


def shared(ctx: EmitContext, offset: "int | None") -> "ir.Value | None":
    """Pointer to the thunk's scratch at `offset` (allocated on its own context), also inside a parallel body."""
    return None if offset is None else pointer(ctx, ScratchRef(offset))


def own(ctx: EmitContext, offset: "int | None") -> "ir.Value | None":
    """Pointer to this thread's scratch at `offset` (allocated on `ctx` itself)."""
    return None if offset is None else scratch_ptr(ctx, offset)


# ── QMatMul ──────────────────────────────────────────────────────────────────

@lowering(T.QMatMul, check=check_qmatmul)
def qmatmul(ctx: EmitContext, t: T.QMatMul) -> None:
    """Pack x as rows and w as column words in scratch, with the bias (and, for VNNI, the zero-point
    terms) per column; then the tiles, rows split across threads."""
    if t.m == 0 or t.n == 0:
        return
    scheme = dot_scheme(ctx.lanes)
    n_pad, kw = padded(ctx, t.n), words(t.k, scheme)
    a, w, cols = (ctx.scratch_alloc(size) for size in (packed_bytes(t.m, kw), packed_bytes(n_pad, kw), 4 * n_pad))
    rows_add = None if scheme.centred else ctx.scratch_alloc(4 * t.m)
    pack_rows(ctx, scheme, ctx.addr(t.x), t.m, t.k, t.x_zp, scratch_ptr(ctx, a))
    pack_columns(ctx, scheme, ctx.addr(t.w), t.k, t.n, t.w_zp, scratch_ptr(ctx, w))
    if scheme.centred:
        copy_bytes(ctx, scratch_ptr(ctx, cols), ctx.addr(t.bias), 4 * t.n)
    else:   # Σ (x − x_zp)(w − w_zp) = Σ (x + 128)·w − (x_zp + 128)·Σ_p w − w_zp·Σ_p x + k·x_zp·w_zp
        column_sums(ctx, ctx.addr(t.w), t.k, t.n, scratch_ptr(ctx, cols))
        affine_terms(ctx, scratch_ptr(ctx, cols), t.n, -(t.x_zp + 128), t.k * t.x_zp * t.w_zp, ctx.addr(t.bias))
        row_sums(ctx, ctx.addr(t.x), t.m, t.k, scratch_ptr(ctx, rows_add))
        affine_terms(ctx, scratch_ptr(ctx, rows_add), t.m, -t.w_zp, 0)
    zero_bytes(ctx, scratch_ptr(ctx, cols + 4 * t.n), 4 * (n_pad - t.n))

    def rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        q = QGemm(scheme, shared(sub, a), shared(sub, w), sub.addr(t.out), t.n, n_pad, kw, t.out_zp, t.mult,
                  col_add=shared(sub, cols), row_add=shared(sub, rows_add))
        qgemm_rows(sub, q, start, stop)

    ctx.parallel_for(t.m, rows, grain=tile_rows(ctx.lanes), min_work=max(1, PAR_MACS // max(1, t.n * t.k)))


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


@dataclass(frozen=True)
class ConvBuffers:
    """Scratch of one (image, group) GEMM: the int8 im2col (None for a direct 1×1), the packed
    columns, and their zero-point terms (None for centred pairs)."""

    col: "ir.Value | None"
    packed: ir.Value
    terms: "ir.Value | None"


def conv_item(ctx: EmitContext, t: T.QConv2d, scheme: DotScheme, item: Index, buf: ConvBuffers
              ) -> tuple[Index, Index]:
    """Im2col and pack (image, group) `item` (and its column terms); returns (its output block, its group)."""
    b, groups = ctx.b, t.groups
    cin_g, plane = t.c_in // groups, t.h * t.w_in
    i, g = divmod(item, groups) if isinstance(item, int) else split_index(b, item, groups)
    x = ctx.addr(t.x, iadd(b, imul(b, i, t.c_in * plane), imul(b, g, cin_g * plane)))
    if buf.col is not None:
        im2col_i8(ctx, t, x, buf.col)
    k, p = cin_g * t.kh * t.kw, t.h_out * t.w_out
    src = x if buf.col is None else buf.col
    pack_columns(ctx, scheme, src, k, p, t.x_zp, buf.packed)
    if buf.terms is not None:   # the columns are the activations here: b = col, b_zp = x_zp, a_zp = w_zp
        column_sums(ctx, src, k, p, buf.terms)
        affine_terms(ctx, buf.terms, p, -(t.w_zp + 128), k * t.w_zp * t.x_zp)
    return iadd(b, imul(b, i, t.c_out * p), imul(b, g, t.c_out // groups * p)), g


def conv_gemm(ctx: EmitContext, t: T.QConv2d, scheme: DotScheme, weights: int, rows_add: ir.Value,
              buf: ConvBuffers, out: Index, g: Index) -> QGemm:
    """The GEMM `w_g · col` of one (image, group) writing output block `out` (an element index)."""
    b, cout_g = ctx.b, t.c_out // t.groups
    k, p = t.c_in // t.groups * t.kh * t.kw, t.h_out * t.w_out
    kw = words(k, scheme)
    a = ctx.addr(0, imul(b, g, cout_g * packed_bytes(1, kw)), base=shared(ctx, weights))
    return QGemm(scheme, a, buf.packed, ctx.addr(t.out, out), p, padded(ctx, p), kw, t.out_zp, t.mult,
                 col_add=buf.terms, row_add=ctx.addr(0, imul(b, g, cout_g), 4, base=rows_add))


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
    scheme = dot_scheme(ctx.lanes)
    direct = t.kh == t.kw == t.sh == t.sw == 1 and t.ph == t.pw == 0
    weights = ctx.scratch_alloc(packed_bytes(t.c_out, words(k, scheme)))
    pack_rows(ctx, scheme, ctx.addr(t.w), t.c_out, k, t.w_zp, scratch_ptr(ctx, weights))
    rows_terms = None if scheme.centred else ctx.scratch_alloc(4 * t.c_out)
    if rows_terms is not None:
        row_sums(ctx, ctx.addr(t.w), t.c_out, k, scratch_ptr(ctx, rows_terms))
        affine_terms(ctx, scratch_ptr(ctx, rows_terms), t.c_out, -t.x_zp, 0, ctx.addr(t.bias))

    def rows_add(c: EmitContext) -> ir.Value:
        """Per output channel: the bias (centred pairs) or the bias and the weights' zero-point terms."""
        return c.addr(t.bias) if rows_terms is None else shared(c, rows_terms)

    def buffers(c: EmitContext) -> tuple["int | None", int, "int | None"]:
        return ((None if direct else c.scratch_alloc(k * p)),
                c.scratch_alloc(packed_bytes(padded(ctx, p), words(k, scheme))),
                (None if scheme.centred else c.scratch_alloc(4 * padded(ctx, p))))

    def pointers(c: EmitContext, offsets: tuple, where: Callable = shared) -> ConvBuffers:
        return ConvBuffers(*(where(c, off) for off in offsets))

    if items <= UNROLL_ITEMS:
        offsets = buffers(ctx)
        for item in range(items):
            out, g = conv_item(ctx, t, scheme, item, pointers(ctx, offsets))

            def rows(sub: EmitContext, start: ir.Value, stop: ir.Value, out=out, g=g) -> None:
                q = conv_gemm(sub, t, scheme, weights, rows_add(sub), pointers(sub, offsets), out, g)
                qgemm_rows(sub, q, start, stop)

            ctx.parallel_for(cout_g, rows, grain=tile_rows(ctx.lanes), min_work=max(1, PAR_MACS // max(1, k * p)))
        return

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        buf = pointers(sub, buffers(sub), own)
        with sub.for_range(start, stop, name="item") as item:
            out, g = conv_item(sub, t, scheme, item, buf)
            qgemm_rows(sub, conv_gemm(sub, t, scheme, weights, rows_add(sub), buf, out, g), 0, cout_g)

    ctx.parallel_for(items, body, min_work=max(1, PAR_MACS // max(1, cout_g * k * p)))
