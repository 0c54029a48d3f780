"""Copies and casts: Copy/CopyF64/CopyI64, the 23 Cast* kinds, CastGeneric and RoundHalf.

Every cast is one element conversion chosen by `(src DType, dst DType)` (docs/lowering-casts.md):
`decode` turns a stored element into a real (f32/f64), an integer (iN + signedness; Bool is an
unsigned i1) or a complex pair, and `encode` writes it in the destination type.  The same
`convert` runs on `<W x …>` vectors in the main loop and on scalars in the tail.

Rounding is done once, directly: a float destination narrower than its source gets the value
rounded to odd at f32 (f64 sources) or f64 (i64 sources) first, which makes the final
round-to-nearest-even correct (≥ 2 extra bits; odd rounding never creates a false tie).
Float → int saturates with clamps and `fptosi`/`fptoui` (the `llvm.fpto*i.sat` intrinsics
scalarize on x86 for narrow results), NaN → 0.  No libcalls: f64 → f16 `fptrunc` would be a
`__truncdfhf2` call per element.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from .. import thunks as T
from ..dtypes import DType
from ..errors import ValidationError
from ..thunks.base import USIZE_MAX
from ..reference.casts import CAST_DTYPES, COPY_ITEMSIZE
from .context import EmitContext
from .rows import parallel_elements, parallel_rows
from .toolkit import (F32, F64, I32, I64, I8, STORAGE, bf16_bits_to_f32, call_intrinsic, copy_bytes, f32_to_bf16_bits,
                      scalar_of, splat_like, vec_like, width_of)
from ..registry import lowering

_PART = {DType.C64: DType.F32, DType.C128: DType.F64}


@dataclass(frozen=True)
class Value:
    """A decoded element (scalar or vector): `kind` is "real", "int" or "complex"."""

    kind: str
    re: ir.Value
    im: ir.Value | None = None
    signed: bool = False


def _flag(b: ir.IRBuilder, cond: ir.Value, ty: ir.Type) -> ir.Value:
    return b.zext(cond, vec_like(cond, ty))


# ── exact intermediate steps ────────────────────────────────────────────────

def f64_to_f32_odd(ctx: EmitContext, d: ir.Value) -> ir.Value:
    """f64 → f32 rounded to odd: the RNE result, stepped one ulp toward zero if it overshot, with
    its last bit set if inexact (NaN: the plain `fptrunc`, quiet)."""
    b = ctx.b
    f = b.fptrunc(d, vec_like(d, F32))
    back = b.fpext(f, d.type)
    inexact = b.fcmp_ordered("!=", back, d)
    overshot = b.fcmp_ordered(">", call_intrinsic(ctx, "llvm.fabs", [back]), call_intrinsic(ctx, "llvm.fabs", [d]))
    bits = b.bitcast(f, vec_like(d, I32))
    bits = b.or_(b.sub(bits, _flag(b, overshot, I32)), _flag(b, inexact, I32))
    return b.bitcast(bits, vec_like(d, F32))


_BELOW_2_63 = 2.0 ** 63 - 1024  # the largest f64 below 2^63


def i64_to_f64_odd(ctx: EmitContext, x: ir.Value) -> ir.Value:
    """i64 → f64 rounded to odd (the RNE conversion, moved one ulp toward zero when it overshot)."""
    b = ctx.b
    d = b.sitofp(x, vec_like(x, F64))
    big = b.fcmp_ordered(">", d, splat_like(d, _BELOW_2_63, F64))          # d == 2^63 > every i64
    back = b.fptosi(b.select(big, splat_like(d, _BELOW_2_63, F64), d), x.type)
    above = b.or_(big, b.icmp_signed(">", back, x))
    below = b.icmp_signed("<", back, x)
    overshot = b.select(b.icmp_signed(">=", x, splat_like(x, 0, I64)), above, below)
    inexact = b.or_(big, b.icmp_signed("!=", back, x))
    bits = b.bitcast(d, vec_like(x, I64))
    bits = b.or_(b.sub(bits, _flag(b, overshot, I64)), _flag(b, inexact, I64))
    return b.bitcast(bits, vec_like(x, F64))


def _int_to_float(b: ir.IRBuilder, v: Value, ty: ir.Type) -> ir.Value:
    """Integer → f32/f64, correctly rounded (LLVM's sitofp/uitofp)."""
    conv = b.sitofp if v.signed else b.uitofp
    return conv(v.re, vec_like(v.re, ty))


def _int_to_wide_float(ctx: EmitContext, v: Value) -> ir.Value:
    """Integer → f32 or f64 exactly, or (i64) rounded to odd at f64 — a safe start for a half."""
    bits = scalar_of(v.re.type).width
    if bits <= 24:
        return _int_to_float(ctx.b, v, F32)
    if bits <= 53:
        return _int_to_float(ctx.b, v, F64)
    return i64_to_f64_odd(ctx, v.re)


def round_real(ctx: EmitContext, x: ir.Value, dst: DType) -> ir.Value:
    """An f32/f64 value rounded once (RNE) to float dtype `dst`'s storage."""
    b = ctx.b
    is_f64 = scalar_of(x.type) == F64
    if dst is DType.F64:
        return x if is_f64 else b.fpext(x, vec_like(x, F64))
    if dst is DType.F32:
        return b.fptrunc(x, vec_like(x, F32)) if is_f64 else x
    x = f64_to_f32_odd(ctx, x) if is_f64 else x
    if dst is DType.F16:
        return b.fptrunc(x, vec_like(x, STORAGE[DType.F16]))       # F16C vcvtps2ph: RNE, exact
    return f32_to_bf16_bits(b, x)


# ── decode / encode ─────────────────────────────────────────────────────────

def decode(ctx: EmitContext, dtype: DType, raw) -> Value:
    """A stored element (complex: a (re, im) pair) → Value."""
    b = ctx.b
    if dtype.is_complex:
        return Value("complex", *raw)
    if dtype is DType.Bool:
        return Value("int", b.icmp_unsigned("!=", raw, splat_like(raw, 0, I8)))   # any non-zero byte
    if dtype.is_int:
        return Value("int", raw, signed=dtype.is_signed)
    if dtype is DType.F16:
        return Value("real", b.fpext(raw, vec_like(raw, F32)))
    if dtype is DType.BF16:
        return Value("real", bf16_bits_to_f32(b, raw))
    return Value("real", raw)


def _nonzero(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.fcmp_unordered("!=", x, splat_like(x, 0.0, scalar_of(x.type)))   # NaN is non-zero


def _float_to_int(b: ir.IRBuilder, x: ir.Value, dst: DType) -> ir.Value:
    """Truncate toward zero, saturate at `dst`'s range, NaN → 0."""
    fty = scalar_of(x.type)
    bits = STORAGE[dst].width
    lo, hi = (-(1 << bits - 1), (1 << bits - 1) - 1) if dst.is_signed else (0, (1 << bits) - 1)
    hi_f = _largest_float_at_most(hi, fty)
    x = b.select(b.fcmp_unordered("uno", x, x), splat_like(x, 0.0, fty), x)
    x = b.select(b.fcmp_ordered("<", x, splat_like(x, float(lo), fty)), splat_like(x, float(lo), fty), x)
    clamped = b.select(b.fcmp_ordered(">", x, splat_like(x, hi_f, fty)), splat_like(x, hi_f, fty), x)
    wide = I64 if bits == 64 else I32
    conv = b.fptoui if dst is DType.U32 else b.fptosi
    r = conv(clamped, vec_like(x, wide))
    if hi_f != hi:  # hi itself is not a float: anything above hi_f is ≥ hi + 1
        r = b.select(b.fcmp_ordered(">", x, splat_like(x, hi_f, fty)), splat_like(x, hi, wide), r)
    return r if bits >= 32 else b.trunc(r, vec_like(x, STORAGE[dst]))


def _largest_float_at_most(n: int, fty: ir.Type) -> float:
    t = np.float32 if fty is F32 else np.float64
    f = t(n)
    return float(f if int(f) <= n else np.nextafter(f, t(0)))


def _resize_int(b: ir.IRBuilder, v: Value, ty: ir.Type) -> ir.Value:
    """int → int: wrap (truncate), sign- or zero-extend."""
    src = scalar_of(v.re.type).width
    if src > ty.width:
        return b.trunc(v.re, vec_like(v.re, ty))
    if src < ty.width:
        return (b.sext if v.signed else b.zext)(v.re, vec_like(v.re, ty))
    return v.re


def _to_float(ctx: EmitContext, v: Value, dst: DType) -> ir.Value:
    if v.kind == "int":
        if dst in (DType.F32, DType.F64):
            return _int_to_float(ctx.b, v, STORAGE[dst])
        return round_real(ctx, _int_to_wide_float(ctx, v), dst)
    return round_real(ctx, v.re, dst)


def encode(ctx: EmitContext, v: Value, dst: DType):
    """Value → stored element of `dst` (complex: a (re, im) pair)."""
    b = ctx.b
    if dst.is_complex:
        part = _PART[dst]
        if v.kind == "complex":
            return round_real(ctx, v.re, part), round_real(ctx, v.im, part)
        re = _to_float(ctx, v, part)
        return re, splat_like(re, 0.0, STORAGE[part])
    if dst is DType.Bool:
        if v.kind == "int":
            nz = b.icmp_unsigned("!=", v.re, ir.Constant(v.re.type, None))
        elif v.kind == "real":
            nz = _nonzero(b, v.re)
        else:
            nz = b.or_(_nonzero(b, v.re), _nonzero(b, v.im))
        return b.zext(nz, vec_like(nz, I8))
    if dst.is_int:
        return _resize_int(b, v, STORAGE[dst]) if v.kind == "int" else _float_to_int(b, v.re, dst)
    return _to_float(ctx, v, dst)


def convert(ctx: EmitContext, src: DType, dst: DType, raw):
    """Stored `src` element(s) → stored `dst` element(s)."""
    return encode(ctx, decode(ctx, src, raw), dst)


# ── memory ──────────────────────────────────────────────────────────────────

def load(ctx: EmitContext, dtype: DType, offset: int, i: "ir.Value | int", w: int):
    """`w` stored elements of `dtype` from element `i`; complex as a deinterleaved (re, im) pair."""
    if not dtype.is_complex:
        return ctx.load(offset, STORAGE[dtype], i, w)
    b, part = ctx.b, STORAGE[_PART[dtype]]
    size = dtype.itemsize // 2
    pairs = b.load(ctx.addr(offset, i, dtype.itemsize), typ=ir.VectorType(part, 2 * w), align=_align(offset, size))
    if w == 1:
        return b.extract_element(pairs, I32(0)), b.extract_element(pairs, I32(1))
    return tuple(b.shuffle_vector(pairs, ir.Constant(pairs.type, None), _indices(range(k, 2 * w, 2)))
                 for k in (0, 1))


def store(ctx: EmitContext, dtype: DType, offset: int, raw, i: "ir.Value | int") -> None:
    """Store what `load`/`convert` produced for `dtype` at element `i`."""
    if not dtype.is_complex:
        return ctx.store(offset, raw, i)
    b, (re, im) = ctx.b, raw
    w = width_of(re)
    if w == 1:
        pairs = ir.Constant(ir.VectorType(re.type, 2), None)
        pairs = b.insert_element(b.insert_element(pairs, re, I32(0)), im, I32(1))
    else:
        pairs = b.shuffle_vector(re, im, _indices(j for k in range(w) for j in (k, w + k)))
    b.store(pairs, ctx.addr(offset, i, dtype.itemsize), align=_align(offset, dtype.itemsize // 2))


def _indices(seq) -> ir.Constant:
    seq = list(seq)
    return ir.Constant(ir.VectorType(I32, len(seq)), [ir.Constant(I32, k) for k in seq])


def _align(offset: int, size: int) -> int:
    return size if offset == 0 else min(size, offset & -offset)


COPY_GRAIN = 4096  # a split copy moves whole pages, each thread from a page boundary


def copy_slot(ctx: EmitContext, src: int, dst: int, nbytes: int) -> None:
    """memcpy of `nbytes` between arena slots (nothing when the source is the destination), split
    across threads by byte ranges when it moves enough (`rows.parallel_rows`)."""
    if not nbytes or src == dst:
        return

    def pages(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        copy_bytes(sub, sub.addr(dst, start), sub.addr(src, start), sub.b.sub(stop, start))

    if nbytes < 2 * COPY_GRAIN:
        return copy_bytes(ctx, ctx.addr(dst), ctx.addr(src), nbytes)
    parallel_rows(ctx, nbytes, 2, pages, grain=COPY_GRAIN)  # each byte is read and written once


# ── the lowerings ───────────────────────────────────────────────────────────

def bit_identical(src: DType, dst: DType) -> bool:
    """Same dtype, or integers of the same width (i8 ↔ u8, i32 ↔ u32: wrapping keeps the bits)."""
    return src is dst or src.is_int and dst.is_int and src.itemsize == dst.itemsize


def emit_cast(ctx: EmitContext, src: DType, dst: DType, src_off: int, dst_off: int, n: int) -> None:
    """Convert `n` elements: a `<W x …>` loop plus a scalar tail; a bit-identical cast is a memcpy."""
    if n == 0:
        return
    if bit_identical(src, dst):
        return copy_slot(ctx, src_off, dst_off, n * src.itemsize)

    def body(sub: EmitContext, i: ir.Value, w: int) -> None:
        store(sub, dst, dst_off, convert(sub, src, dst, load(sub, src, src_off, i, w)), i)

    parallel_elements(ctx, n, src.itemsize + dst.itemsize, body)  # (buffers are disjoint or the same)


def check_buffers(t) -> None:
    """`src`/`dst` may be absent (usize::MAX) only when there is nothing to move."""
    for field in ("src", "dst"):
        if t.len and getattr(t, field) == USIZE_MAX:
            raise ValidationError(f"absent buffer (usize::MAX) with len = {t.len}", field=field)


def check_cast_generic(t) -> None:
    """Buffers present, and both dtypes are DTypes."""
    check_buffers(t)
    for field in ("src_dtype", "dst_dtype"):
        if not isinstance(getattr(t, field), DType):
            raise ValidationError(f"{getattr(t, field)!r} is not a DType", field=field)


@lowering(*(T.ALL_THUNKS[kind] for kind in COPY_ITEMSIZE), check=check_buffers, inplace=True)
def copy(ctx: EmitContext, t) -> None:
    """Copy / CopyF64 / CopyI64: `len` elements of 4 or 8 bytes."""
    copy_slot(ctx, t.src, t.dst, t.len * COPY_ITEMSIZE[type(t).__name__])


@lowering(*(T.ALL_THUNKS[kind] for kind in CAST_DTYPES), check=check_buffers, inplace=True)
def cast(ctx: EmitContext, t) -> None:
    """A fixed-pair Cast kind."""
    src, dst = CAST_DTYPES[type(t).__name__]
    emit_cast(ctx, src, dst, t.src, t.dst, t.len)


@lowering(T.CastGeneric, check=check_cast_generic, inplace=True)
def cast_generic(ctx: EmitContext, t) -> None:
    """Any dtype pair."""
    emit_cast(ctx, t.src_dtype, t.dst_dtype, t.src, t.dst, t.len)


@lowering(T.RoundHalf, check=check_buffers, inplace=True)
def round_half(ctx: EmitContext, t) -> None:
    """f32 → bf16/f16 (RNE) → f32, in f32 storage."""
    half = DType.BF16 if t.bf16 else DType.F16

    def body(sub: EmitContext, i: ir.Value, w: int) -> None:
        x = sub.load(t.src, F32, i, w)
        sub.store(t.dst, convert(sub, half, DType.F32, convert(sub, DType.F32, half, x)), i)

    parallel_elements(ctx, t.len, 8, body)
