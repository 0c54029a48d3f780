"""Vectorizable transcendental functions, emitted as straight-line LLVM IR.

Every public function takes an `llvmlite.ir.IRBuilder` and values of type `float`, `double`,
`<W x float>` or `<W x double>` and returns a value of the same type.  The code is range
reduction + polynomial, with 2^n built from integer exponent bits; the only intrinsics used are
single instructions on AVX-512 (`llvm.fma`, `llvm.fabs`, `llvm.floor`, `llvm.trunc`, `llvm.rint`,
`llvm.minnum/maxnum`, `llvm.sqrt`, `llvm.copysign`, `llvm.fptosi.sat`).  There are no libm calls and
no `llvm.exp`/`llvm.sin`/... intrinsics (x86 would scalarize those into libm calls), so a
`<16 x float>` loop stays 16 lanes wide.  No `nnan`/`ninf` fast-math flag is ever set: ±inf and NaN
inputs give the IEEE / C99 results.

Algorithms, coefficient derivation and the measured errors are in docs/transcendentals.md.
Which element types each function supports: everything here works for f32 and f64, except
`erfc`, which is f32 only.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from llvmlite import ir

from .toolkit import F32, F64, I1, I32, I64, scalar_of, splat_like, suffix, vec, width_of

# ── polynomial coefficients (lowest degree first) ────────────────────────────
# Chebyshev fits (mpmath.chebyfit, 60 digits) of the auxiliary functions named in each comment,
# rounded to the working precision; see docs/transcendentals.md for the script.

# (e^r − 1 − r)/r², r ∈ [−ln2/2, ln2/2]
EXP_P = {
    F32: (0.5, 0.16666576266288757, 0.04166655242443085, 0.008363292552530766, 0.0013926326064392924),
    F64: (0.5, 0.1666666666666667, 0.04166666666666667, 0.008333333333326025, 0.001388888888888367,
          0.00019841269875205077, 2.4801587325822283e-05, 2.75572549134867e-06, 2.7557273295539724e-07,
          2.5105419192016337e-08, 2.091483135138041e-09),
}
# (2^r − 1)/r, r ∈ [−½, ½]   (f32; `scaled_by_sigmoid2`: 2^r = 1 + r·Q(r), 6 fmas)
EXP2_Q_F32 = (0.6931471824645996, 0.24022650718688965, 0.05550355091691017, 0.009618080221116543,
              0.0013392016990110278, 0.0001545416162116453)
# (log1p(f) − f)/f², f ∈ [√½ − 1, √2 − 1]   (f32)
LOG_Q_F32 = (-0.4999999701976776, 0.333333283662796, -0.25000813603401184, 0.2000134140253067,
             -0.16625535488128662, 0.14201240241527557, -0.1313554048538208, 0.12754997611045837,
             -0.07693386822938919)
# 2(atanh(s) − s)/s³ as a function of z = s², |s| ≤ 3 − 2√2   (f64: log1p(f) = 2·atanh(f/(2+f)))
LOG_R_F64 = (0.6666666666666666, 0.40000000000001007, 0.2857142857072325, 0.22222222409750114,
             0.18181793732111753, 0.15386342449645143, 0.13266048812203002, 0.131148348695975)
# (tanh(x) − x)/x³ as a function of z = x², |x| ≤ 0.55   (f32)
TANH_P_F32 = (-0.3333333134651184, 0.1333310604095459, -0.05390780791640282, 0.021299486979842186,
              -0.006591692566871643)
# erf(x)/x − 1 as a function of z = x², |x| ≤ 0.5 (the constant term is 2/√π − 1 to full precision,
# so erf = x + x·P(z) rounds like a single fma)
ERF_P = {
    F32: (0.12837916709551257, -0.37612608075141907, 0.11282803118228912, -0.02675563469529152,
          0.004714318085461855),
    F64: (0.1283791670955126, -0.3761263890318345, 0.11283791670923238, -0.026866170632147555,
          0.005223977360401588, -0.00085482965935455, 0.00012053276387318782, -1.4844308536294882e-05,
          1.4709519034055563e-06),
}
# g(x) = ln(erfc(x)) + x², piecewise on [lo, hi), as a polynomial in (x − mid)
ERFC_G_F32 = (  # pieces [0.5, 1.25) [1.25, 2.5) [2.5, 5) [5, 10.25]
    (1.25, 0.875, (-0.7671994566917419, -0.6802197098731995, 0.1734583079814911, -0.046896036714315414,
                   0.011323336511850357, -0.002144444966688752, 0.00020085905271116644,
                   6.330515316221863e-05, -3.9994458347791806e-05)),
    (2.5, 1.875, (-1.3114466667175293, -0.43802371621131897, 0.08277314901351929, -0.018370382487773895,
                  0.004061658401042223, -0.0008410304435528815, 0.0001543161051813513,
                  -2.2020585674908943e-05, 1.3271345551402192e-06)),
    (5.0, 3.75, (-1.9269627332687378, -0.2504040598869324, 0.029633671045303345, -0.004437028896063566,
                 0.0007104649557732046, -0.0001150854877778329, 1.847419662226457e-05,
                 -3.1018462323118e-06, 4.5552496885647997e-07)),
    (math.inf, 7.625, (-2.6122195720672607, -0.12898306548595428, 0.008185324259102345,
                       -0.0006818824913352728, 6.291048339335248e-05, -6.036684226273792e-06,
                       5.999019663249783e-07, -7.177673921887617e-08, 7.2458754551973925e-09)),
)
ERFC_G_F64 = (  # pieces [0.5, 1.5) [1.5, 3) [3, 6]
    (1.5, 1.0, (-0.8496055099332482, -0.6389675142347913, 0.15689274364151445, -0.041561098046523845,
                0.010033825434310048, -0.0019779030210815797, 0.00023732470727622442,
                2.627036995725534e-05, -2.7141086180364213e-05, 9.57732828003227e-06,
                -2.0189017269749675e-06, 1.0350273207778775e-07, 1.2568263082106658e-07,
                -6.608954059915894e-08, 1.8397209172104108e-08, -2.2842045497927597e-09)),
    (3.0, 2.25, (-1.4649598963658184, -0.3829138105445521, 0.06513243312188384, -0.013312548394200369,
                 0.0027713368321659426, -0.000554840909815998, 0.0001026377882550421,
                 -1.6603895359953798e-05, 2.0482876528854938e-06, -7.209594642483789e-08,
                 -6.162147470208592e-08, 2.66203740679734e-08, -7.354951526389415e-09,
                 1.5759638251718497e-09, -2.3993069880959475e-10, 1.3966335110585718e-11)),
    (math.inf, 4.5, (-2.0997683034359405, -0.2124012752861617, 0.021637110340649728,
                     -0.002825260853433405, 0.00039943384148070595, -5.798295049629301e-05,
                     8.43203366710788e-06, -1.2102891588503223e-06, 1.6948917877395433e-07,
                     -2.288478790649615e-08, 2.9316978266687325e-09, -3.4752170741157373e-10,
                     3.6876923980230527e-11, -2.930112763499166e-12, -1.7862704265707722e-13,
                     9.559574580550395e-14)),
)
# (sin(r) − r)/r³ and (cos(r) − 1 + r²/2)/r⁴ as functions of z = r², |r| ≤ π/4·1.01
SIN_S = {
    F32: (-0.1666666716337204, 0.008333331905305386, -0.00019840039021801203, 2.7243811473454116e-06),
    F64: (-0.16666666666666666, 0.008333333333333331, -0.0001984126984126457, 2.755731921895673e-06,
          -2.5052106100926675e-08, 1.605851097953535e-10, -7.58549250782124e-13),
}
COS_C = {
    F32: (0.0416666641831398, -0.0013888279208913445, 2.4542896426282823e-05),
    F64: (0.041666666666666664, -0.0013888888888887241, 2.4801587298533456e-05, -2.755731715246704e-07,
          2.087612165887116e-09, -1.1380876948169717e-11),
}
# (atan(u) − u)/u³ as a function of z = u², |u| ≤ tan(π/8)·1.01
ATAN_A = {
    F32: (-0.3333333432674408, 0.19999974966049194, -0.14284035563468933, 0.11069243401288986,
          -0.08609013259410858, 0.05008123442530632),
    F64: (-0.3333333333333333, 0.19999999999999762, -0.1428571428564902, 0.11111111104112661,
          -0.09090908702135936, 0.07692294904896305, -0.06666398746388635, 0.05878631460320977,
          -0.05228284767565546, 0.045417954500753324, -0.034321082112901316, 0.016012008547392122),
}

# ln2 split for Cody–Waite: n·LN2_HI is exact for every n the reductions produce.
LN2_HI = {F32: 0.693145751953125, F64: 0.6931471803691238}
LN2_LO = {F32: 1.428606765330187e-06, F64: 1.9082149292705877e-10}
# π/2 in three doubles (≈159 bits), used with fma for sin/cos/tan reduction (f32 reduces in f64).
PIO2 = (1.5707963267948966, 6.123233995736766e-17, -1.4973849048591698e-33)
# π/4, π/2, π as hi + lo of the working precision (atan / atan2 offsets)
_PI = {"pio4": math.pi / 4, "pio2": math.pi / 2, "pi": math.pi}


class _Fmt:
    """Facts about one float format."""

    def __init__(self, fty: ir.Type) -> None:
        self.fty = fty
        self.is64 = isinstance(fty, ir.DoubleType)
        self.ity = I64 if self.is64 else I32
        self.mant = 52 if self.is64 else 23
        self.bias = 1023 if self.is64 else 127
        self.tiny = 2.0 ** (-1022 if self.is64 else -126)  # smallest normal


# Low parts of π-multiples in double (π = PI_HI + PI_LO exactly to ~107 bits).
_PI_LO = {math.pi / 4: 3.061616997868383e-17, math.pi / 2: 6.123233995736766e-17,
          math.pi: 1.2246467991473532e-16}


# ── types and constants ─────────────────────────────────────────────────────

def _fmt(x: ir.Value) -> _Fmt:
    ety = scalar_of(x.type)
    if not isinstance(ety, (ir.FloatType, ir.DoubleType)):
        raise TypeError(f"vecmath expects float or double values, got {x.type}")
    return _Fmt(ety)


def intrinsic(b: ir.IRBuilder, name: str, args: list[ir.Value], ret: ir.Type | None = None,
              overload: list[ir.Type] | None = None) -> ir.Value:
    """Call `llvm.<name>.<mangled overload types>` (declared once per module)."""
    ret = ret or args[0].type
    overload = overload if overload is not None else [args[0].type]
    full = ".".join([f"llvm.{name}"] + [suffix(t) for t in overload])
    fn = b.module.globals.get(full)
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(ret, [a.type for a in args]), full)
    return b.call(fn, args)


def fma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    """x·y + z with one rounding."""
    return intrinsic(b, "fma", [x, y, z])


def fabs(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return intrinsic(b, "fabs", [x])


def floor(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return intrinsic(b, "floor", [x])


def ceil(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return intrinsic(b, "ceil", [x])


def trunc(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return intrinsic(b, "trunc", [x])


def rint(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Round to nearest, ties to even (the default rounding mode)."""
    return intrinsic(b, "rint", [x])


def sqrt(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return intrinsic(b, "sqrt", [x])


def copysign(b: ir.IRBuilder, mag: ir.Value, sign: ir.Value) -> ir.Value:
    return intrinsic(b, "copysign", [mag, sign])


def minnum(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """Smaller operand, NaN-ignoring (Rust f32::min)."""
    return intrinsic(b, "minnum", [x, y])


def maxnum(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """Larger operand, NaN-ignoring (Rust f32::max)."""
    return intrinsic(b, "maxnum", [x, y])


def select(b: ir.IRBuilder, cond: ir.Value, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(cond, x, y)


def is_nan(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.fcmp_unordered("uno", x, x)


def clamp_nan_keep(b: ir.IRBuilder, x: ir.Value, lo: ir.Value, hi: ir.Value) -> ir.Value:
    """min(max(x, lo), hi) that lets NaN through."""
    x = b.select(b.fcmp_ordered("<", x, splat_like(x, lo)), splat_like(x, lo), x)
    return b.select(b.fcmp_ordered(">", x, splat_like(x, hi)), splat_like(x, hi), x)


def clamp_num(b: ir.IRBuilder, x: ir.Value, lo: ir.Value, hi: ir.Value) -> ir.Value:
    """min(max(x, lo), hi) with minnum/maxnum: a NaN lane comes out as `hi` (never NaN)."""
    return maxnum(b, minnum(b, x, splat_like(x, hi)), splat_like(x, lo))


def _ivec(x: ir.Value, ity: ir.Type) -> ir.Type:
    return vec(ity, width_of(x))


def to_bits(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Bit pattern of a float value as i32 / i64 lanes."""
    return b.bitcast(x, _ivec(x, _fmt(x).ity))


def from_bits(b: ir.IRBuilder, i: ir.Value, fty: ir.Type) -> ir.Value:
    return b.bitcast(i, vec(fty, width_of(i)))


def poly(b: ir.IRBuilder, x: ir.Value, coeffs: Sequence[float]) -> ir.Value:
    """Horner evaluation c0 + c1·x + … with fma."""
    acc = splat_like(x, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = fma(b, acc, x, splat_like(x, c))
    return acc


def _to_int(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Integral float lanes (already in range) to i32/i64 lanes of the same width.

    Plain `fptosi`: the lanes are in range by construction, and `llvm.fptosi.sat` would be
    scalarized on x86 (16 conversions per vector — it made exp 10× slower)."""
    return b.fptosi(x, _ivec(x, _fmt(x).ity))


def pow2i(b: ir.IRBuilder, n: ir.Value, fty: ir.Type) -> ir.Value:
    """2^n for integer lanes n with bias+n in [1, 2·bias] (a normal number), from exponent bits."""
    f = _Fmt(fty)
    e = b.add(n, splat_like(n, f.bias))
    return from_bits(b, b.shl(e, splat_like(n, f.mant)), fty)


def ldexp(b: ir.IRBuilder, x: ir.Value, n: ir.Value) -> ir.Value:
    """x·2^n for |n| ≤ ~2·bias, as two exact scalings (so underflow rounds once, to a denormal)."""
    fty = scalar_of(x.type)
    n1 = b.ashr(n, splat_like(n, 1))
    n2 = b.sub(n, n1)
    return b.fmul(b.fmul(x, pow2i(b, n1, fty)), pow2i(b, n2, fty))


def round_half_away(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Round to nearest, ties away from zero (Rust f32::round); keeps the sign of zero."""
    t = trunc(b, x)
    frac = fabs(b, b.fsub(x, t))
    half_up = b.fcmp_ordered(">=", frac, splat_like(x, 0.5))
    step = b.select(half_up, copysign(b, splat_like(x, 1.0), x), splat_like(x, 0.0))
    return copysign(b, b.fadd(t, step), x)


# ── exp family ───────────────────────────────────────────────────────────────

def _exp_reduce(b: ir.IRBuilder, x: ir.Value, tail: ir.Value | None = None) -> tuple[ir.Value, ir.Value]:
    """n = round(x/ln2) and r = x − n·ln2 (+ tail), |r| ≤ ln2/2; x pre-clamped, tail optional."""
    fty = scalar_of(x.type)
    full = x if tail is None else b.fadd(x, tail)
    n = rint(b, b.fmul(full, splat_like(x, 1.0 / math.log(2.0))))
    r = fma(b, n, splat_like(x, -LN2_HI[fty]), x)
    r = fma(b, n, splat_like(x, -LN2_LO[fty]), r)
    if tail is not None:
        r = b.fadd(r, tail)
    return n, r


def _expm1_poly(b: ir.IRBuilder, r: ir.Value) -> ir.Value:
    """e^r − 1 on the reduced range: r + r²·P(r)."""
    return fma(b, b.fmul(r, r), poly(b, r, EXP_P[scalar_of(r.type)]), r)


def _exp_limits(fty: ir.Type) -> tuple[float, float]:
    return (-104.0, 89.0) if fty == F32 else (-746.0, 710.0)


def exp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e^x: overflow → inf, underflow → denormal/0, exp(±inf) = inf/0, NaN → NaN."""
    fty = scalar_of(x.type)
    lo, hi = _exp_limits(fty)
    n, r = _exp_reduce(b, clamp_num(b, x, lo, hi))
    p = b.fadd(_expm1_poly(b, r), splat_like(x, 1.0))
    return b.select(is_nan(b, x), x, ldexp(b, p, _to_int(b, n)))


def exp_nonpositive(b: ir.IRBuilder, t: ir.Value) -> ir.Value:
    """e^t for f32 t ≤ 0, NaN-free (callers screen NaN): flushed to e^−87 below −87, so 2^n comes straight
    from the exponent bits — `exp` without its overflow, denormal and NaN paths (recurrent cells)."""
    return _exp_normal(b, maxnum(b, t, splat_like(t, -87.0)))


def _exp_normal(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e^x for f32 |x| ≤ 87 (not NaN): `exp`'s bits, scaled once by 2^n (normal for every such x)."""
    n, r = _exp_reduce(b, x)
    p = b.fadd(_expm1_poly(b, r), splat_like(x, 1.0))
    return b.fmul(p, pow2i(b, _to_int(b, n), F32))


EXP_FLUSH_F32 = -87.3  # `exp_shifted` gives 0 below it, where e^t < 1.22e−38 (2^n stays normal: n ≥ −126)


def exp_shifted(b: ir.IRBuilder, t: ir.Value) -> ir.Value:
    """e^t for f32 t ≤ 0 or NaN (softmax's x − max): `exp` bit for bit down to −87.3, 0 below (where
    e^t < 1.22e−38), NaN kept — no overflow path, one scaling by 2^n instead of `ldexp`'s two."""
    low = b.fcmp_ordered("<", t, splat_like(t, EXP_FLUSH_F32))
    n = rint(b, b.fmul(maxnum(b, t, splat_like(t, EXP_FLUSH_F32)), splat_like(t, 1.0 / math.log(2.0))))
    r = fma(b, n, splat_like(t, -LN2_HI[F32]), t)   # from t itself, so a NaN lane stays NaN
    r = fma(b, n, splat_like(t, -LN2_LO[F32]), r)
    p = b.fadd(_expm1_poly(b, r), splat_like(t, 1.0))
    return b.select(low, splat_like(t, 0.0), b.fmul(p, pow2i(b, _to_int(b, n), F32)))


ERFC_SCALE = 64   # `_exp_with_tail` builds 2^(n + 64), normal for every n ∈ [−190, 63] (erfc's n ∈ [−156, 0])


def _exp_with_tail(b: ir.IRBuilder, hi: ir.Value, c0: ir.Value, rest: ir.Value) -> ir.Value:
    """e^(hi + c0 + rest) for an exact hi ∈ [−110, 0] and |c0|, |rest| ≲ 3 (erfc: e^(−x²+g)).

    c0 and rest are added after the exact Cody–Waite step, where the partial sum is small, so
    the ~0.5 ulp rounding errors of |hi| and |c0| never enter the result.  n = rint(sum/ln2) comes from
    the rounding sum `shifted` (no rint, no float→int conversion) and the result is (p·2^(n+64))·2^−64:
    the first product exact, the second rounding once — `ldexp`'s bits with one power of two built."""
    shifted = b.fadd(b.fmul(b.fadd(b.fadd(hi, c0), rest), splat_like(hi, 1.0 / math.log(2.0))),
                     splat_like(hi, ROUND_SHIFTER_F32))
    n = b.fsub(shifted, splat_like(hi, ROUND_SHIFTER_F32))
    r = fma(b, n, splat_like(hi, -LN2_HI[F32]), hi)
    r = b.fadd(r, c0)
    r = fma(b, n, splat_like(hi, -LN2_LO[F32]), r)
    r = b.fadd(r, rest)
    p = b.fadd(_expm1_poly(b, r), splat_like(hi, 1.0))
    return b.fmul(b.fmul(p, _pow2_of_shifted(b, shifted, ERFC_SCALE)), splat_like(hi, 2.0 ** -ERFC_SCALE))


def expm1(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e^x − 1 with full relative accuracy near 0 (tiny x → x, keeps −0)."""
    f = _fmt(x)
    lo = -25.0 if not f.is64 else -60.0
    hi = _exp_limits(f.fty)[1]
    n, r = _exp_reduce(b, clamp_num(b, x, lo, hi))
    em = _expm1_poly(b, r)
    ni = _to_int(b, n)
    top = f.bias  # 2^n representable for n ≤ bias
    big = b.icmp_signed(">", ni, splat_like(ni, top))
    s = pow2i(b, b.select(big, splat_like(ni, 0), ni), f.fty)
    small = fma(b, s, em, b.fsub(s, splat_like(x, 1.0)))          # 2^n·em + (2^n − 1)
    large = ldexp(b, b.fadd(em, splat_like(x, 1.0)), ni)          # only for overflow-range n
    res = b.select(big, large, small)
    tiny = b.fcmp_ordered("<", fabs(b, x), splat_like(x, 2.0 ** -(f.mant + 3)))
    return b.select(b.or_(tiny, is_nan(b, x)), x, res)


# `scaled_by_sigmoid(2)`: 2^n comes from the bits of the rounding sum `shifted` = t·k + 1.5·2^23 (its low
# bits hold n = rint(t·k)), scaled by 2^SIG_SCALE, so every n ≥ −157 gives a normal 2^(n+30) and the
# floor n = −157 gives exactly 0 (exponent field 0).
ROUND_SHIFTER_F32 = 12582912.0  # 1.5·2^23
SIG_SCALE, SIG_FLOOR_LOG2 = 30, -157.0


def scaled_by_sigmoid2(b: ir.IRBuilder, x: ir.Value, v: ir.Value) -> ir.Value:
    """x·σ(v·ln2) = x/(1 + 2^−v) for f32 (the tanh Gelu, whose v already carries its rounding error):
    e = 2^t for t = max(−|v|, −157) as 2^n·2^r, n = rint t, r = t − n exactly, 2^r = 1 + r·Q(r)."""
    one = splat_like(x, 1.0)
    t = _floored(b, b.fneg(fabs(b, v)), SIG_FLOOR_LOG2)
    shifted = b.fadd(t, splat_like(t, ROUND_SHIFTER_F32))
    r = b.fsub(t, b.fsub(shifted, splat_like(t, ROUND_SHIFTER_F32)))      # exact, |r| ≤ ½
    return _scaled_by_logistic(b, x, v, shifted, fma(b, r, poly(b, r, EXP2_Q_F32), one))


def scaled_by_sigmoid(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """x·σ(y) = x/(1 + e^−y) for f32 (Silu): e = e^t for t = max(−|y|, −157·ln2) as 2^n·e^r, n = rint(t/ln2),
    r = t − n·ln2 by Cody–Waite (exact t, so relative accuracy for y ≪ 0), e^r = 1 + r + r²·P(r)."""
    one = splat_like(x, 1.0)
    t = _floored(b, b.fneg(fabs(b, y)), SIG_FLOOR_LOG2 * math.log(2.0))
    shifted = fma(b, t, splat_like(t, 1.0 / math.log(2.0)), splat_like(t, ROUND_SHIFTER_F32))
    n = b.fsub(shifted, splat_like(t, ROUND_SHIFTER_F32))
    r = fma(b, n, splat_like(t, -LN2_LO[F32]), fma(b, n, splat_like(t, -LN2_HI[F32]), t))
    return _scaled_by_logistic(b, x, y, shifted, b.fadd(_expm1_poly(b, r), one))


def _pow2_of_shifted(b: ir.IRBuilder, shifted: ir.Value, offset: int) -> ir.Value:
    """2^(n + offset) for the n held in the low bits of `shifted` = n + 1.5·2^23 (f32), as exponent bits:
    the shift drops every bit above the low 9, so n + 127 + offset must lie in [1, 254] (a normal result)."""
    bits = to_bits(b, shifted)
    return from_bits(b, b.shl(b.add(bits, splat_like(bits, 127 + offset)), splat_like(bits, 23)), F32)


def _floored(b: ir.IRBuilder, t: ir.Value, floor: float) -> ir.Value:
    """max(t, floor) as one compare-select (one `maxps`); a NaN t gives the floor."""
    lo = splat_like(t, floor)
    return b.select(b.fcmp_ordered(">", t, lo), t, lo)


def _scaled_by_logistic(b: ir.IRBuilder, x: ir.Value, v: ir.Value, shifted: ir.Value, mantissa: ir.Value
                        ) -> ir.Value:
    """x/(1+e) for v ≥ 0 and x·e/(1+e) for v < 0, e = 2^n·mantissa with n in the low bits of `shifted`.

    e is carried as e·2^30, normal down to 2^−156 and exactly 0 at the floor 2^−157; the result is
    q = x/(1+e), or (q·e·2^30)·2^−30 for v < 0, whose last product rounds once into the denormals.  No
    overflow; ±inf and NaN give the formula's IEEE results (x = −inf with v = −inf: −inf·0 = NaN)."""
    one = splat_like(x, 1.0)
    e_scaled = b.fmul(mantissa, _pow2_of_shifted(b, shifted, SIG_SCALE))  # e·2^30
    q = b.fdiv(x, fma(b, e_scaled, splat_like(x, 2.0 ** -SIG_SCALE), one))
    tail = b.fmul(b.fmul(q, e_scaled), splat_like(x, 2.0 ** -SIG_SCALE))
    return b.select(b.fcmp_ordered("<", v, splat_like(v, 0.0)), tail, q)


def sigmoid(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """1/(1+e^−x) without overflow: e/(1+e) with e = e^−|x| for x < 0 (accurate down to denormals)."""
    e = exp(b, b.fneg(fabs(b, x)))
    num = b.select(b.fcmp_ordered("<", x, splat_like(x, 0.0)), e, splat_like(x, 1.0))
    return b.fdiv(num, b.fadd(splat_like(x, 1.0), e))


def tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """tanh: odd polynomial for |x| < 0.55, 1 − 2/(e^2|x| + 1) above (f32); f64 via expm1."""
    f = _fmt(x)
    ax = fabs(b, x)
    if f.is64:
        t = expm1(b, b.fmul(ax, splat_like(x, -2.0)))
        return copysign(b, b.fdiv(b.fneg(t), b.fadd(t, splat_like(x, 2.0))), x)
    z = b.fmul(x, x)
    small = fma(b, x, b.fmul(z, poly(b, z, TANH_P_F32)), x)
    e = _exp_normal(b, b.fmul(minnum(b, ax, splat_like(x, 10.0)), splat_like(x, 2.0)))  # `exp`'s bits
    large = b.fsub(splat_like(x, 1.0), b.fdiv(splat_like(x, 2.0), b.fadd(e, splat_like(x, 1.0))))
    res = b.select(b.fcmp_unordered("<", ax, splat_like(x, 0.55)), small, copysign(b, large, x))
    return _tiny_keep(b, x, res)


# ── log family ──────────────────────────────────────────────────────────────

def _log_reduce(b: ir.IRBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """x = 2^e·m with m ∈ [√½, √2): returns (e as float, f = m − 1).  x > 0 finite (denormals ok)."""
    f = _fmt(x)
    sub = b.fcmp_ordered("<", x, splat_like(x, f.tiny))
    scale = 2.0 ** (f.mant + 1)
    xs = b.select(sub, b.fmul(x, splat_like(x, scale)), x)
    eadj = b.select(sub, splat_like(x, -(f.mant + 1), f.ity), splat_like(x, 0, f.ity))
    magic = 0x3FE6A09E667F3BCD if f.is64 else 0x3F3504F3          # bits of √½
    i = b.sub(to_bits(b, xs), splat_like(x, magic, f.ity))
    e = b.add(b.ashr(i, splat_like(x, f.mant, f.ity)), eadj)
    mbits = b.add(b.and_(i, splat_like(x, (1 << f.mant) - 1, f.ity)), splat_like(x, magic, f.ity))
    m = from_bits(b, mbits, f.fty)
    return b.sitofp(e, x.type), b.fsub(m, splat_like(x, 1.0))


def _log1p_reduced(b: ir.IRBuilder, f: ir.Value) -> ir.Value:
    """log(1+f) for f ∈ [√½−1, √2−1]."""
    if scalar_of(f.type) == F32:
        return fma(b, b.fmul(f, f), poly(b, f, LOG_Q_F32), f)
    s = b.fdiv(f, b.fadd(f, splat_like(f, 2.0)))
    z = b.fmul(s, s)
    r = b.fmul(z, poly(b, z, LOG_R_F64))
    hfsq = b.fmul(splat_like(f, 0.5), b.fmul(f, f))
    return b.fsub(f, b.fsub(hfsq, b.fmul(s, b.fadd(hfsq, r))))


def _log_combine(b: ir.IRBuilder, e: ir.Value, l1p: ir.Value) -> ir.Value:
    """e·ln2 + l1p with ln2 split so e·ln2_hi is exact."""
    fty = scalar_of(e.type)
    return fma(b, e, splat_like(e, LN2_HI[fty]), fma(b, e, splat_like(e, LN2_LO[fty]), l1p))


def _log_specials(b: ir.IRBuilder, x: ir.Value, res: ir.Value, zero_at: float) -> ir.Value:
    """x == zero_at → −inf; x < zero_at or NaN → NaN; x == +inf → +inf."""
    res = b.select(b.fcmp_ordered("==", x, splat_like(x, math.inf)), x, res)
    res = b.select(b.fcmp_ordered("==", x, splat_like(x, zero_at)), splat_like(x, -math.inf), res)
    return b.select(b.fcmp_unordered("<", x, splat_like(x, zero_at)), splat_like(x, math.nan), res)


def log(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Natural log: log(0) = −inf, log(<0) = NaN, log(inf) = inf; denormals exact-range."""
    e, f = _log_reduce(b, x)
    return _log_specials(b, x, _log_combine(b, e, _log1p_reduced(b, f)), 0.0)


def log1p(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """log(1+x), accurate for tiny x (u = 1+x with the rounding error of u corrected)."""
    one = splat_like(x, 1.0)
    u = b.fadd(x, one)
    e, f = _log_reduce(b, u)
    corr = b.fdiv(b.fsub(x, b.fsub(u, one)), u)              # (x − (u−1))/u
    e_zero = b.fcmp_ordered("==", e, splat_like(x, 0.0))
    f = b.select(e_zero, x, f)
    corr = b.select(e_zero, splat_like(x, 0.0), corr)
    res = _log_combine(b, e, b.fadd(_log1p_reduced(b, f), corr))
    fm = _fmt(x)
    tiny = b.fcmp_ordered("<", fabs(b, x), splat_like(x, 2.0 ** -(fm.mant + 3)))   # log1p(x) = x (keeps −0)
    return _log_specials(b, x, b.select(tiny, x, res), -1.0)


# ── erf ─────────────────────────────────────────────────────────────────────

def _erf_small(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """erf(x) = x + x·P(x²) for |x| ≤ 0.5."""
    return fma(b, x, poly(b, b.fmul(x, x), ERF_P[scalar_of(x.type)]), x)


def _erfc_tail(b: ir.IRBuilder, a: ir.Value) -> ir.Value:
    """erfc(a) = e^(−a² + g(a)) for a ≥ 0.5 (a already clamped to the table range)."""
    fty = scalar_of(a.type)
    mid, coeffs = _piece_of(b, a, ERFC_G_F32 if fty == F32 else ERFC_G_F64)
    s = b.fsub(a, mid)
    g1 = coeffs[-1]                                    # g = c0 + s·g1(s)
    for c in reversed(coeffs[1:-1]):
        g1 = fma(b, g1, s, c)
    if fty == F32:                                     # −a² exactly as hi + lo, then one exp
        hi = b.fmul(a, a)
        lo = fma(b, a, a, b.fneg(hi))
        return _exp_with_tail(b, b.fneg(hi), coeffs[0], b.fsub(b.fmul(s, g1), lo))
    return exp(b, fma(b, b.fneg(a), a, fma(b, s, g1, coeffs[0])))


Pieces = Sequence[tuple[float, float, Sequence[float]]]   # (top, mid, coefficients), tops increasing


def _piece_of(b: ir.IRBuilder, a: ir.Value, pieces: Pieces) -> tuple[ir.Value, list[ir.Value]]:
    """Each lane's (mid, coefficients) of the piece holding a (the first with a < top, else the last):
    one permute per value where the target has a variable lane permute for a's vector type, else selects."""
    if permute_intrinsic(a.type):
        index = _doubling_piece_index(b, a, pieces)
        return (_permute(b, index, [p[1] for p in pieces], pieces, a.type),
                [_permute(b, index, [p[2][k] for p in pieces], pieces, a.type) for k in range(len(pieces[0][2]))])
    return _piece_by_selects(b, a, pieces)


def _piece_by_selects(b: ir.IRBuilder, a: ir.Value, pieces: Pieces) -> tuple[ir.Value, list[ir.Value]]:
    """(mid, coefficients) as a chain of compares and selects, last piece first (any target)."""
    mid = splat_like(a, pieces[-1][1])
    coeffs = [splat_like(a, c) for c in pieces[-1][2]]
    for top, m, cs in reversed(pieces[:-1]):
        inside = b.fcmp_ordered("<", a, splat_like(a, top))
        mid = b.select(inside, splat_like(a, m), mid)
        coeffs = [b.select(inside, splat_like(a, c), old) for c, old in zip(cs, coeffs)]
    return mid, coeffs


# Variable lane permutes (result[i] = table[index[i] mod lanes]) by (element type, lanes): feature, intrinsic.
_PERMUTES = {("float", 16): ("+avx512f", "llvm.x86.avx512.permvar.sf.512"),
             ("float", 8): ("+avx2", "llvm.x86.avx2.permps"),
             ("double", 8): ("+avx512f", "llvm.x86.avx512.permvar.df.512")}


def permute_intrinsic(ty: ir.Type) -> str:
    """The host's variable lane permute for vectors of type `ty` ("" if it has none: scalars, other widths,
    targets without AVX2/AVX-512)."""
    from ..jit import host                             # vecmath itself stays importable without a JIT
    if not isinstance(ty, ir.VectorType):
        return ""
    feature, name = _PERMUTES.get((str(ty.element), ty.count), ("", ""))
    return name if feature and feature in host().features.split(",") else ""


def _doubling_piece_index(b: ir.IRBuilder, a: ir.Value, pieces: Pieces) -> ir.Value:
    """d = ⌊log2(a/top₀)⌋ per lane, as (bits(a) − bits(top₀)) >> mantissa bits: exact because each top is
    twice the one before (a > 0, normal), so piece = clamp(d + 1, 0, last); the table puts it at d mod lanes."""
    f = _fmt(a)
    top0 = splat_like(a, pieces[0][0])
    return b.ashr(b.sub(to_bits(b, a), to_bits(b, top0)), splat_like(a, f.mant, f.ity))


def _piece_table(pieces: Pieces, values: Sequence[float], lanes: int, fty: ir.Type) -> list[float]:
    """`lanes` entries: at d mod lanes, the value of piece clamp(d + 1, 0, last), for every d that a lane
    in [lo, top of the last piece] can have (`_doubling_piece_index`)."""
    tops = [p[0] for p in pieces[:-1]]
    assert all(t2 == 2 * t1 for t1, t2 in zip(tops, tops[1:])), "piece tops must double"
    lo, hi = _PIECE_RANGE[fty]
    first, last = math.floor(math.log2(lo / tops[0])), math.floor(math.log2(hi / tops[0]))
    assert last - first < lanes, "more exponent steps than lanes"
    table = [values[-1]] * lanes
    for d in range(first, last + 1):
        table[d % lanes] = values[min(max(d + 1, 0), len(pieces) - 1)]
    return table


def _permute(b: ir.IRBuilder, index: ir.Value, values: Sequence[float], pieces: Pieces, ty: ir.Type
             ) -> ir.Value:
    """Each lane's entry of the piece table of `values`, by the host's variable permute."""
    table = ir.Constant(ty, [ir.Constant(ty.element, v)
                             for v in _piece_table(pieces, values, ty.count, ty.element)])
    return intrinsic(b, permute_intrinsic(ty)[len("llvm."):], [table, index], ret=ty, overload=[])


_PIECE_RANGE = {F32: (0.5, 10.25), F64: (0.5, 6.0)}   # what `_erf_tail_arg` clamps |x| to


def _erf_tail_arg(b: ir.IRBuilder, ax: ir.Value) -> ir.Value:
    return clamp_num(b, ax, *_PIECE_RANGE[scalar_of(ax.type)])


def erf(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """erf: x·P(x²) for |x| < 0.5, else ±(1 − e^(−x²+g(|x|))); erf(±inf) = ±1, NaN → NaN."""
    ax = fabs(b, x)
    tail = b.fsub(splat_like(x, 1.0), _erfc_tail(b, _erf_tail_arg(b, ax)))
    return b.select(b.fcmp_unordered("<", ax, splat_like(x, 0.5)), _erf_small(b, x), copysign(b, tail, x))


def erfc(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """1 − erf(x) with relative accuracy in the right tail (f32 only); erfc(−inf) = 2, erfc(inf) = 0."""
    if scalar_of(x.type) != F32:
        raise NotImplementedError("vecmath.erfc is implemented for f32 only")
    ax = fabs(b, x)
    e = _erfc_tail(b, _erf_tail_arg(b, ax))
    tail = b.select(b.fcmp_ordered("<", x, splat_like(x, 0.0)), b.fsub(splat_like(x, 2.0), e), e)
    small = b.fsub(splat_like(x, 1.0), _erf_small(b, x))
    return b.select(b.fcmp_unordered("<", ax, splat_like(x, 0.5)), small, tail)


# ── sin / cos / tan ─────────────────────────────────────────────────────────

def _trig_reduce(b: ir.IRBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(r, q): x = q·π/2 + r, |r| ≤ π/4, q mod 4 as int lanes; f32 reduces in f64 (exact r)."""
    f = _fmt(x)
    xd = x if f.is64 else b.fpext(x, vec(F64, width_of(x)))
    k = rint(b, b.fmul(xd, splat_like(xd, 2.0 / math.pi)))
    nk = b.fneg(k)
    r = fma(b, nk, splat_like(xd, PIO2[0]), xd)
    r = fma(b, nk, splat_like(xd, PIO2[1]), r)
    r = fma(b, nk, splat_like(xd, PIO2[2]), r)
    q = b.fsub(k, b.fmul(floor(b, b.fmul(k, splat_like(xd, 0.25))), splat_like(xd, 4.0)))
    q = clamp_num(b, q, 0.0, 3.0)                       # NaN (x = ±inf) → a harmless 3
    qi = b.fptosi(q, _ivec(x, I32))
    if not f.is64:
        r = b.fptrunc(r, x.type)
    # f64 beyond |x| ≈ 1e13 is no longer exact: keep r bounded (results stay in [−1, 1])
    lim = math.pi / 4 * 1.01
    r = clamp_nan_keep(b, r, -lim, lim)
    if not f.is64:
        r, qi = _huge_f32_lanes(b, x, r, qi)
    return r, qi


# ── Payne–Hanek reduction for large f32 arguments ───────────────────────────
#
# |x| = m·2^e (m the 24-bit significand).  x·2/π mod 4 only needs the bits b_i of 2/π with
# i ≥ e − 1 (earlier ones give multiples of 4): with W the 96 bits from b_{e−1}, the product
# P = m·W (three 32×24-bit partial products in i64) holds the quadrant in bits 94–95 and the
# fraction in bits 0–93.  Exact for every finite f32; lanes with |x| ≥ HUGE_F32 take it, in a
# cold block entered only when some lane needs it (one scalar pass over the lanes).

HUGE_F32 = 2.0 ** 30
_TWO_OVER_PI_PAD = 2  # zero words before the first bit of 2/π (windows that start left of it)


def _two_over_pi_words(n_words: int) -> list[int]:
    """2/π as 32-bit words of its binary fraction (word 0 = bits 1…32), exact integer arithmetic."""
    bits = 32 * n_words + 64
    one = 1 << bits
    def atan_inv(k: int) -> int:  # atan(1/k)·2^bits by its Taylor series
        total, term, n = 0, one // k, 0
        while term:
            total += term // (2 * n + 1) * (-1) ** n
            term //= k * k
            n += 1
        return total
    pi = 16 * atan_inv(5) - 4 * atan_inv(239)          # Machin's formula
    frac = (2 * one * one // pi) >> 64                  # 2/π · 2^(32·n_words) (2/π < 1)
    return [(frac >> (32 * (n_words - 1 - j))) & 0xFFFFFFFF for j in range(n_words)]


TWO_OVER_PI_WORDS = _two_over_pi_words(10)


def _two_over_pi_table(b: ir.IRBuilder) -> ir.GlobalVariable:
    module = b.block.function.module
    name = "rlx.two_over_pi"
    g = module.globals.get(name)
    if g is None:
        words = [0] * _TWO_OVER_PI_PAD + TWO_OVER_PI_WORDS
        ty = ir.ArrayType(I32, len(words))
        g = ir.GlobalVariable(module, ty, name=name)
        g.initializer = ir.Constant(ty, [I32(w) for w in words])
        g.global_constant = True
        g.linkage = "internal"
    return g


def _payne_hanek_f32(b: ir.IRBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(r, q) for one finite f32 lane: |x| = q·π/2 + r (mod 2π), |r| ≤ π/4, then x's sign."""
    table = _two_over_pi_table(b)
    u64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    bits = b.and_(b.bitcast(x, I32), I32(0x7FFFFFFF))
    m = b.zext(b.or_(b.and_(bits, I32(0x7FFFFF)), I32(0x800000)), I64)
    e = b.sub(b.zext(b.lshr(bits, I32(23)), I64), u64(150))
    # window start: bit b_{e−1} of 2/π is bit (e − 1) + 63 of the padded table (clamped: safe loads)
    k0 = b.add(e, u64(62))
    k0 = b.select(b.icmp_signed("<", k0, u64(0)), u64(0), k0)
    k0 = b.select(b.icmp_signed(">", k0, u64(32 * 6)), u64(32 * 6), k0)
    j, sh = b.lshr(k0, u64(5)), b.and_(k0, u64(31))

    def word(i):
        at = b.gep(table, [I32(0), b.add(j, u64(i))], inbounds=True)
        return b.zext(b.load(at, typ=I32), I64)
    w = [word(i) for i in range(4)]

    def window(i):  # 32 bits of the window from word j + i on
        pair = b.or_(b.shl(w[i], u64(32)), w[i + 1])
        return b.lshr(b.shl(pair, sh), u64(32))
    w2, w1, w0 = window(0), window(1), window(2)
    lo = b.mul(m, w0)
    mid = b.add(b.mul(m, w1), b.lshr(lo, u64(32)))
    hi = b.add(b.mul(m, w2), b.lshr(mid, u64(32)))
    q = b.and_(b.lshr(hi, u64(30)), u64(3))
    fhi = b.or_(b.shl(b.and_(hi, u64(0x3FFFFFFF)), u64(32)), b.and_(mid, u64(0xFFFFFFFF)))
    flo = b.and_(lo, u64(0xFFFFFFFF))
    f = b.fadd(b.fmul(b.uitofp(fhi, F64), ir.Constant(F64, 2.0 ** -62)),
               b.fmul(b.uitofp(flo, F64), ir.Constant(F64, 2.0 ** -94)))
    up = b.fcmp_ordered(">=", f, ir.Constant(F64, 0.5))  # fold into (−½, ½]: the next quadrant
    f = b.select(up, b.fsub(f, ir.Constant(F64, 1.0)), f)
    q = b.and_(b.select(up, b.add(q, u64(1)), q), u64(3))
    r = b.fptrunc(b.fmul(f, ir.Constant(F64, math.pi / 2)), F32)
    neg = b.icmp_signed("<", b.bitcast(x, I32), I32(0))  # −x = (−q)·π/2 + (−r)
    r = b.select(neg, b.fneg(r), r)
    q = b.select(neg, b.and_(b.sub(u64(4), q), u64(3)), q)
    return r, b.trunc(q, I32)


def _huge_f32_lanes(b: ir.IRBuilder, x: ir.Value, r: ir.Value, qi: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Replace (r, q) by the Payne–Hanek reduction in lanes with HUGE_F32 ≤ |x| < ∞: a cold
    block, entered when any lane needs it, loops over the lanes through stack copies (one copy
    of the scalar code, whatever the width)."""
    lanes = width_of(x)
    if lanes == 1:
        before = b.block
        with b.if_then(_is_huge(b, x), likely=False):
            pr, pq = _payne_hanek_f32(b, x)
            then = b.block
        return _phi(b, r, pr, before, then), _phi(b, qi, pq, before, then)
    with b.goto_entry_block():  # vector-typed slots: aligned for the whole-vector store and load
        slots = [b.alloca(v.type) for v in (x, r, qi)]
    before = b.block
    with b.if_then(intrinsic(b, "vector.reduce.or", [_is_huge(b, x)], ret=I1), likely=False):
        for slot, v in zip(slots, (x, r, qi)):
            b.store(v, slot)
        entry = b.block
        head, body, done = (b.function.append_basic_block(f"ph.{n}") for n in ("lane", "body", "done"))
        b.branch(head)
        b.position_at_end(head)
        lane = b.phi(I32)
        lane.add_incoming(I32(0), entry)
        b.cbranch(b.icmp_unsigned("<", lane, I32(lanes)), body, done)
        b.position_at_end(body)
        at = [b.gep(b.bitcast(slot, ir.ArrayType(t, lanes).as_pointer()), [I32(0), lane], inbounds=True)
              for slot, t in zip(slots, (F32, F32, I32))]
        xl = b.load(at[0], typ=F32)
        with b.if_then(_is_huge(b, xl), likely=False):
            pr, pq = _payne_hanek_f32(b, xl)
            b.store(pr, at[1])
            b.store(pq, at[2])
        lane.add_incoming(b.add(lane, I32(1)), b.block)
        b.branch(head)
        b.position_at_end(done)
        r2, q2 = b.load(slots[1]), b.load(slots[2])
        then = b.block
    return _phi(b, r, r2, before, then), _phi(b, qi, q2, before, then)


def _is_huge(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    ax = fabs(b, x)
    return b.and_(b.fcmp_ordered(">=", ax, splat_like(x, HUGE_F32)), b.fcmp_ordered("<", ax, splat_like(x, math.inf)))


def _phi(b: ir.IRBuilder, skipped: ir.Value, taken: ir.Value, before: ir.Block, then: ir.Block) -> ir.Value:
    """The value after an `if_then`: `skipped` when the branch was not taken, `taken` from `then`."""
    v = b.phi(skipped.type)
    v.add_incoming(skipped, before)
    v.add_incoming(taken, then)
    return v


def _sin_poly(b: ir.IRBuilder, r: ir.Value, z: ir.Value) -> ir.Value:
    return fma(b, b.fmul(r, z), poly(b, z, SIN_S[scalar_of(r.type)]), r)


def _cos_poly(b: ir.IRBuilder, z: ir.Value) -> ir.Value:
    one = splat_like(z, 1.0)
    hz = b.fmul(z, splat_like(z, 0.5))
    w = b.fsub(one, hz)
    tail = fma(b, b.fmul(z, z), poly(b, z, COS_C[scalar_of(z.type)]), b.fsub(b.fsub(one, w), hz))
    return b.fadd(w, tail)


def _flip_sign(b: ir.IRBuilder, v: ir.Value, flip: ir.Value) -> ir.Value:
    """Negate the lanes of v where the i1 lanes of `flip` are set."""
    f = _fmt(v)
    bit = b.shl(b.zext(flip, _ivec(v, f.ity)), splat_like(v, 63 if f.is64 else 31, f.ity))
    return from_bits(b, b.xor(to_bits(b, v), bit), f.fty)


def _qbit(b: ir.IRBuilder, qi: ir.Value, mask: int) -> ir.Value:
    return b.icmp_unsigned("!=", b.and_(qi, splat_like(qi, mask)), splat_like(qi, 0))


def _tiny_keep(b: ir.IRBuilder, x: ir.Value, res: ir.Value) -> ir.Value:
    """|x| tiny: the result is x itself (keeps −0 and denormals exact)."""
    f = _fmt(x)
    lim = 2.0 ** (-27 if f.is64 else -12)
    return b.select(b.fcmp_ordered("<", fabs(b, x), splat_like(x, lim)), x, res)


def sin(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """sin: accurate (abs err ~1e-7 f32 / ~1e-16 f64) for |x| ≤ 1e13; ±inf, NaN → NaN."""
    r, qi = _trig_reduce(b, x)
    z = b.fmul(r, r)
    s, c = _sin_poly(b, r, z), _cos_poly(b, z)
    v = b.select(_qbit(b, qi, 1), c, s)
    return _tiny_keep(b, x, _flip_sign(b, v, _qbit(b, qi, 2)))


def cos(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """cos: same reduction as sin, quadrant shifted by one."""
    r, qi = _trig_reduce(b, x)
    z = b.fmul(r, r)
    s, c = _sin_poly(b, r, z), _cos_poly(b, z)
    v = b.select(_qbit(b, qi, 1), s, c)
    q1 = b.add(qi, splat_like(qi, 1))
    return _flip_sign(b, v, _qbit(b, q1, 2))


def tan(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """tan = sin(r)/cos(r) in even quadrants, −cos(r)/sin(r) in odd ones."""
    r, qi = _trig_reduce(b, x)
    z = b.fmul(r, r)
    s, c = _sin_poly(b, r, z), _cos_poly(b, z)
    odd = _qbit(b, qi, 1)
    num = b.select(odd, b.fneg(c), s)
    den = b.select(odd, s, c)
    return _tiny_keep(b, x, b.fdiv(num, den))


# ── atan / atan2 ────────────────────────────────────────────────────────────

def _pi_const(b: ir.IRBuilder, like: ir.Value, key: str) -> tuple[ir.Value, ir.Value]:
    """(hi, lo) constants of π/4, π/2 or π in the working precision."""
    v = _PI[key]
    if scalar_of(like.type) == F64:
        return splat_like(like, v), splat_like(like, _PI_LO[v])
    hi = np.float32(v)
    return splat_like(like, float(hi)), splat_like(like, float(np.float32(v - float(hi))))


def _atan_ratio(b: ir.IRBuilder, num: ir.Value, den: ir.Value) -> ir.Value:
    """atan(num/den) for 0 ≤ num ≤ den: u = num/den or (num−den)/(num+den) (+π/4), one division."""
    big = b.fcmp_ordered(">", num, b.fmul(den, splat_like(den, math.sqrt(2.0) - 1.0)))
    u = b.fdiv(b.select(big, b.fsub(num, den), num), b.select(big, b.fadd(num, den), den))
    z = b.fmul(u, u)
    p = fma(b, b.fmul(u, z), poly(b, z, ATAN_A[scalar_of(u.type)]), u)
    hi, lo = _pi_const(b, num, "pio4")
    return b.select(big, b.fadd(hi, b.fadd(p, lo)), p)


def _from_pi(b: ir.IRBuilder, a: ir.Value, key: str) -> ir.Value:
    """(π·k − a) with a two-part constant."""
    hi, lo = _pi_const(b, a, key)
    return b.fadd(b.fsub(hi, a), lo)


def atan(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """atan: atan(±inf) = ±π/2, keeps −0, NaN → NaN."""
    ax = fabs(b, x)
    one = splat_like(x, 1.0)
    inv = b.fcmp_ordered(">", ax, one)
    a = _atan_ratio(b, b.select(inv, one, ax), b.select(inv, ax, one))
    return copysign(b, b.select(inv, _from_pi(b, a, "pio2"), a), x)


def atan2(b: ir.IRBuilder, y: ir.Value, x: ir.Value) -> ir.Value:
    """atan2(y, x) per C99 Annex F (all quadrants, signed zeros, infinities); NaN → NaN."""
    ax, ay = fabs(b, x), fabs(b, y)
    swap = b.fcmp_ordered(">", ay, ax)
    num, den = b.select(swap, ax, ay), b.select(swap, ay, ax)
    a = _atan_ratio(b, num, den)
    a = b.select(b.fcmp_ordered("==", den, splat_like(x, 0.0)), splat_like(x, 0.0), a)          # both zero
    pio4 = _pi_const(b, x, "pio4")[0]
    a = b.select(b.fcmp_ordered("==", num, splat_like(x, math.inf)), pio4, a)               # both inf
    a = b.select(swap, _from_pi(b, a, "pio2"), a)
    neg_x = b.icmp_signed("<", to_bits(b, x), splat_like(x, 0, _fmt(x).ity))               # signbit(x)
    a = b.select(neg_x, _from_pi(b, a, "pi"), a)
    res = copysign(b, a, y)
    return b.select(b.fcmp_unordered("uno", x, y), b.fadd(x, y), res)


# ── pow ─────────────────────────────────────────────────────────────────────

def _is_int(b: ir.IRBuilder, y: ir.Value) -> ir.Value:
    return b.fcmp_ordered("==", floor(b, y), y)


def _is_odd_int(b: ir.IRBuilder, y: ir.Value) -> ir.Value:
    h = b.fmul(y, splat_like(y, 0.5))
    return b.and_(_is_int(b, y), b.fcmp_ordered("!=", floor(b, h), h))


def _two_sum(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:
    """x + y = s + err exactly (Knuth's TwoSum, any magnitudes)."""
    s = b.fadd(x, y)
    v = b.fsub(s, x)
    return s, b.fadd(b.fsub(x, b.fsub(s, v)), b.fsub(y, v))


def _two_prod(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:
    """x·y = p + err exactly (one fma)."""
    p = b.fmul(x, y)
    return p, fma(b, x, y, b.fneg(p))


TWO_THIRDS = (0.6666666666666666, 3.700743415417188e-17)        # 2/3 as f64 hi + lo
ATANH_REST = tuple(2.0 / (2 * k + 1) for k in range(2, 12))     # 2/5, 2/7, …, 2/23 (Taylor: |s| ≤ 0.172)


def _log_dd(b: ir.IRBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """ln x as an f64 pair hi + lo (relative error ≈ 2^−66) for x > 0 finite; specials in hi.

    ln x = e·ln2 + 2·atanh(s), s = f/(2+f) in double-double; of the series 2s + 2s³/3 + 2s⁵/5 + …
    the terms 2s and 2s³/3 (≤ 1 % of the sum) are carried exactly, the rest (≤ 0.02 %) in f64.
    """
    e, f = _log_reduce(b, x)
    two = splat_like(f, 2.0)
    d = b.fadd(two, f)
    dl = b.fadd(b.fsub(two, d), f)                                   # 2 + f = d + dl exactly
    sh = b.fdiv(f, d)
    sl = b.fdiv(b.fsub(fma(b, b.fneg(sh), d, f), b.fmul(sh, dl)), d)  # s = sh + sl
    zh, zl = _two_prod(b, sh, sh)
    ch, cl = _two_prod(b, sh, zh)
    cl = fma(b, sh, zl, cl)                                          # s³ = ch + cl
    th, tl = _two_prod(b, ch, splat_like(ch, TWO_THIRDS[0]))
    tl = fma(b, ch, splat_like(ch, TWO_THIRDS[1]), fma(b, cl, splat_like(ch, TWO_THIRDS[0]), tl))
    rest = b.fmul(b.fmul(ch, zh), poly(b, zh, ATANH_REST))
    hi, err1 = _two_sum(b, b.fmul(e, splat_like(e, LN2_HI[F64])), b.fadd(sh, sh))   # e·ln2_hi is exact
    hi, err2 = _two_sum(b, hi, th)
    small = b.fadd(b.fadd(sl, sl), fma(b, b.fadd(zh, zh), sl, b.fadd(tl, rest)))   # 2sl + 2s²·sl + …
    lo = b.fadd(b.fadd(err1, err2), fma(b, e, splat_like(e, LN2_LO[F64]), small))
    top = b.fadd(hi, lo)
    return _log_specials(b, x, top, 0.0), b.fsub(lo, b.fsub(top, hi))


def _exp_dd(b: ir.IRBuilder, hi: ir.Value, lo: ir.Value) -> ir.Value:
    """e^(hi + lo) (f64, |lo| ≤ ulp(hi)) rounded once, to ≈ 0.51 ulp: `exp` whose reduced argument is the exact
    pair r + rl = hi − n·ln2 + lo and whose e^r = (1 + r) + (r²·P(r) + rl) keeps 1 + r exact until the last add.
    (e^hi·(1 + lo) instead rounds twice, up to 1.44 ulp: pow(5.7848358101997675e135, 1.01).)"""
    lo_limit, hi_limit = _exp_limits(F64)
    lo = b.select(b.fcmp_ordered("<", fabs(b, hi), splat_like(hi, hi_limit)), lo, splat_like(lo, 0.0))
    x = clamp_num(b, hi, lo_limit, hi_limit)
    n = rint(b, b.fmul(x, splat_like(x, 1.0 / math.log(2.0))))
    r, rl = _two_sum(b, fma(b, n, splat_like(x, -LN2_HI[F64]), x), fma(b, n, splat_like(x, -LN2_LO[F64]), lo))
    one_r, one_r_err = _fast_two_sum(b, splat_like(x, 1.0), r)
    small = fma(b, b.fmul(r, r), poly(b, r, EXP_P[F64]), b.fadd(rl, one_r_err))
    return b.select(is_nan(b, hi), hi, ldexp(b, b.fadd(one_r, small), _to_int(b, n)))


def _fast_two_sum(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:
    """x + y = s + err exactly for |x| ≥ |y| (Dekker's FastTwoSum)."""
    s = b.fadd(x, y)
    return s, b.fsub(y, b.fsub(s, x))


def _pow_f64_magnitude(b: ir.IRBuilder, ax: ir.Value, y: ir.Value) -> ir.Value:
    """|x|^y = e^(p + pl), where y·ln|x| = p + pl is carried to ~2^−66."""
    hi, lo = _log_dd(b, ax)
    p, pl = _two_prod(b, y, hi)
    return _exp_dd(b, p, fma(b, y, lo, pl))


def pow(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """C powf/pow: |x|^y = e^(y·ln|x|), sign and special cases per C99 F.9.4.4.

    f64 carries y·ln|x| in double-double (`_log_dd`), so the error is that of one exp: ≤ 1 ulp
    measured, also near overflow and for x near 1 with |y| ~ 1000.  f32 evaluates e^(y·ln|x|) in
    f64 (correctly rounded in practice)."""
    f = _fmt(x)
    ax = fabs(b, x)
    if f.is64:
        mag = _pow_f64_magnitude(b, ax, y)
    else:
        dty = vec(F64, width_of(x))
        xd, yd = b.fpext(ax, dty), b.fpext(y, dty)
        mag = b.fptrunc(exp(b, b.fmul(yd, log(b, xd))), x.type)
    neg_x = b.icmp_signed("<", to_bits(b, x), splat_like(x, 0, f.ity))
    res = _flip_sign(b, mag, b.and_(neg_x, _is_odd_int(b, y)))
    finite_neg = b.and_(b.fcmp_ordered("<", x, splat_like(x, 0.0)), b.fcmp_ordered(">", x, splat_like(x, -math.inf)))
    res = b.select(b.and_(finite_neg, b.not_(_is_int(b, y))), splat_like(x, math.nan), res)
    one = b.or_(b.fcmp_ordered("==", y, splat_like(y, 0.0)), b.fcmp_ordered("==", x, splat_like(x, 1.0)))
    minus_one_inf = b.and_(b.fcmp_ordered("==", x, splat_like(x, -1.0)),
                           b.fcmp_ordered("==", fabs(b, y), splat_like(y, math.inf)))
    return b.select(b.or_(one, minus_one_inf), splat_like(x, 1.0), res)


__all__ = ["exp", "expm1", "log", "log1p", "tanh", "sigmoid", "erf", "erfc", "sin", "cos", "tan", "atan",
           "atan2", "pow", "floor", "ceil", "trunc", "rint", "round_half_away", "ldexp", "pow2i", "select",
           "fma", "fabs", "sqrt", "copysign", "minnum", "maxnum", "intrinsic", "poly"]
