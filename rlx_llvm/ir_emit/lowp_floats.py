"""Low-precision float codecs in IR, written once for every `Minifloat` (FP8 / FP6 / FP4 / custom) and E8M0.

All work on scalars or `<W x …>` vectors alike, with integer bit arithmetic (no tables, no libcalls):

* decode: a normal code's magnitude bits shifted into an f32's exponent/mantissa field and the
  exponent re-biased by one add; a subnormal is `m·2^(1−bias−M)` (an exact f32 product); then the
  sign bit and the format's NaN/inf codes.
* encode: |x| ≥ the smallest normal rounds its f32 bits to M mantissa bits with the round-to-nearest-
  even bit trick (the carry walks into the exponent), smaller |x| is `roundeven(|x|·2^(bias−1+M))`;
  the magnitude is clamped to the largest finite code (overflow and ±inf saturate), NaN → 0.
* E8M0: `2^(b−127)` and its round-up encoding, both from the f32 exponent field.
* `decode_via_f16`: the same decode through the host's half → float conversion (F16C `vcvtph2ps`), a few
  instructions per vector for the formats whose exponent fits f16's (used by the dequantizing GEMMs).
"""
from __future__ import annotations

from llvmlite import ir

from ..reference.scaled import E8M0_BIAS, Minifloat
from .context import EmitContext
from .. import jit
from .toolkit import F16, F32, I16, I32, I8, call_intrinsic, fconst, splat_like, vec_like

F32_MANT = 23
F32_BIAS = 127
QUIET_NAN = 0x7FC00000
INF = 0x7F800000


def _k(like: ir.Value, value: int) -> ir.Constant:
    return splat_like(like, value)


def _bits(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.bitcast(x, vec_like(x, I32))


def _f32(b: ir.IRBuilder, u: ir.Value) -> ir.Value:
    return b.bitcast(u, vec_like(u, F32))


def decode(ctx: EmitContext, f: Minifloat, code: ir.Value) -> ir.Value:
    """i8 codes → f32 values (bits above the format's width are ignored)."""
    b = ctx.b
    wide = b.zext(code, vec_like(code, I32))
    c = b.and_(wide, _k(wide, (2 << f.sign_shift) - 1))
    mag = b.and_(c, _k(c, (1 << f.sign_shift) - 1))
    exp = b.lshr(mag, _k(c, f.mant_bits))
    normal = b.add(b.shl(mag, _k(c, F32_MANT - f.mant_bits)), _k(c, (F32_BIAS - f.bias) << F32_MANT))
    man = b.and_(mag, _k(c, (1 << f.mant_bits) - 1))
    sub = b.fmul(b.sitofp(man, vec_like(c, F32)), fconst(vec_like(c, F32), 2.0 ** (f.min_normal_exp - f.mant_bits)))
    value = b.select(b.icmp_unsigned("==", exp, _k(c, 0)), _bits(b, sub), normal)
    value = _special(b, f, c, mag, exp, man, value)
    sign = b.shl(b.lshr(c, _k(c, f.sign_shift)), _k(c, 31))
    return _f32(b, b.or_(value, sign))


def f16_decodes(f: Minifloat) -> bool:
    """Whether `decode_via_f16` serves `f` on this host: the host converts halves in hardware (F16C), and
    f16's 5-bit exponent field holds f's exponent — narrower, or as wide with f16's own inf/NaN codes."""
    return "+f16c" in jit.host().features.split(",") and (f.exp_bits < 5 or (f.exp_bits == 5 and f.specials == "ieee"))


def f16_rebias(f: Minifloat) -> float:
    """The exact factor `2^(15 − bias)` from `decode_via_f16(…, rebias=False)`'s values to f's."""
    return 2.0 ** (15 - f.bias)


def decode_via_f16(ctx: EmitContext, f: Minifloat, code: ir.Value, rebias: bool = True) -> ir.Value:
    """i8 codes → f32 values as `decode` gives them, through an f16 (only where `f16_decodes(f)`).

    The code's magnitude bits, mantissa aligned to f16's, and its sign make an f16 worth
    `value·2^(bias−15)` exactly (normal or subnormal); a non-finite code gets f16's all-ones exponent
    (its mantissa kept: inf stays inf) or a quiet NaN; the conversion to f32 is exact, and so is the
    multiply by `f16_rebias(f)` (left to the caller when `rebias` is false, e.g. to fold into a scale)."""
    b = ctx.b
    c = b.zext(code, vec_like(code, I16))
    c = b.and_(c, _k(c, (2 << f.sign_shift) - 1))
    mag = b.and_(c, _k(c, (1 << f.sign_shift) - 1))
    bits = b.or_(b.shl(mag, _k(c, 10 - f.mant_bits)), b.shl(b.lshr(c, _k(c, f.sign_shift)), _k(c, 15)))
    if f.specials == "ieee":
        top = ((1 << f.exp_bits) - 1) << f.mant_bits
        bits = b.select(b.icmp_unsigned(">=", mag, _k(c, top)), b.or_(bits, _k(c, 0x7C00)), bits)
    elif f.specials == "ocp":
        bits = b.select(b.icmp_unsigned("==", mag, _k(c, (1 << f.sign_shift) - 1)), _k(c, 0x7E00), bits)
    elif f.specials == "fnuz":
        bits = b.select(b.icmp_unsigned("==", c, _k(c, 1 << f.sign_shift)), _k(c, 0x7E00), bits)
    value = b.fpext(b.bitcast(bits, vec_like(c, F16)), vec_like(c, F32))
    return b.fmul(value, fconst(value, f16_rebias(f))) if rebias and f.bias != 15 else value


def _special(b: ir.IRBuilder, f: Minifloat, c: ir.Value, mag: ir.Value, exp: ir.Value, man: ir.Value,
             value: ir.Value) -> ir.Value:
    """The unsigned f32 bits of the format's NaN / inf codes in place of `value`."""
    if f.specials == "ocp":
        return b.select(b.icmp_unsigned("==", mag, _k(c, (1 << f.sign_shift) - 1)), _k(c, QUIET_NAN), value)
    if f.specials == "ieee":
        inf_or_nan = b.select(b.icmp_unsigned("==", man, _k(c, 0)), _k(c, INF), _k(c, QUIET_NAN))
        return b.select(b.icmp_unsigned("==", exp, _k(c, (1 << f.exp_bits) - 1)), inf_or_nan, value)
    if f.specials == "fnuz":   # 0x80: a NaN whose sign bit the caller ORs in — still a NaN
        return b.select(b.icmp_unsigned("==", c, _k(c, 1 << f.sign_shift)), _k(c, QUIET_NAN), value)
    return value


def encode(ctx: EmitContext, f: Minifloat, x: ir.Value) -> ir.Value:
    """f32 → i8 codes: nearest, ties to even, overflow/±inf saturate to ±max, NaN → 0 (semantics §2.12)."""
    b = ctx.b
    u = _bits(b, x)
    a = b.and_(u, _k(u, 0x7FFFFFFF))
    shift = F32_MANT - f.mant_bits
    lsb = b.and_(b.lshr(a, _k(u, shift)), _k(u, 1))
    rounded = b.lshr(b.add(b.add(a, _k(u, (1 << (shift - 1)) - 1)), lsb), _k(u, shift))
    normal = b.sub(rounded, _k(u, (F32_BIAS - f.bias) << f.mant_bits))
    scaled = b.fmul(_f32(b, a), fconst(x, 2.0 ** (f.mant_bits - f.min_normal_exp)))
    sub = b.fptosi(call_intrinsic(ctx, "llvm.roundeven", [scaled]), vec_like(u, I32))
    small = b.icmp_unsigned("<", a, _k(u, (F32_BIAS + f.min_normal_exp) << F32_MANT))
    mag = b.select(small, sub, normal)
    mag = b.select(b.icmp_unsigned(">", mag, _k(u, f.max_code)), _k(u, f.max_code), mag)
    mag = b.select(b.icmp_unsigned(">", a, _k(u, INF)), _k(u, 0), mag)
    sign = b.lshr(u, _k(u, 31))
    if f.specials == "fnuz":   # no −0: a zero magnitude keeps no sign
        sign = b.select(b.icmp_unsigned("==", mag, _k(u, 0)), _k(u, 0), sign)
    sign = b.select(b.icmp_unsigned(">", a, _k(u, INF)), _k(u, 0), sign)
    return b.trunc(b.or_(mag, b.shl(sign, _k(u, f.sign_shift))), vec_like(u, I8))


def e8m0_decode(ctx: EmitContext, byte: ir.Value) -> ir.Value:
    """E8M0 bytes → f32 `2^(b−127)`; b = 0 is the f32 subnormal 2^−127, 0xFF NaN."""
    b = ctx.b
    e = b.zext(byte, vec_like(byte, I32))
    bits = b.select(b.icmp_unsigned("==", e, _k(e, 0)), _k(e, 1 << (F32_MANT - 1)), b.shl(e, _k(e, F32_MANT)))
    bits = b.select(b.icmp_unsigned("==", e, _k(e, 255)), _k(e, QUIET_NAN), bits)
    return _f32(b, bits)


def e8m0_encode_up(ctx: EmitContext, s: ir.Value) -> ir.Value:
    """f32 scale → E8M0 byte rounded up: `clamp(⌈log2 s⌉ + 127, 0, 254)`; s ≤ 0, NaN, ±inf → 0."""
    b = ctx.b
    u = _bits(b, s)
    inexact = b.zext(b.icmp_unsigned("!=", b.and_(u, _k(u, (1 << F32_MANT) - 1)), _k(u, 0)), u.type)
    byte = b.add(b.lshr(u, _k(u, F32_MANT)), inexact)               # ⌈log2 s⌉ + 127 for a normal s
    byte = b.select(b.icmp_unsigned(">", byte, _k(u, 2 * E8M0_BIAS)), _k(u, 2 * E8M0_BIAS), byte)
    # a subnormal s ≤ 2^−127 (and +0) rounds up to at most 2^−127 → 0; s ≥ inf or negative → 0
    invalid = b.or_(b.icmp_unsigned("<=", u, _k(u, 1 << (F32_MANT - 1))), b.icmp_unsigned(">=", u, _k(u, INF)))
    return b.trunc(b.select(invalid, _k(u, 0), byte), vec_like(u, I8))
