"""The math of one element (scalar or `<W x T>` vector) of every Activation, BinaryOp and CmpOp.

Exactly semantics.md §2.3–§2.5 (Rust float semantics: NaN-ignoring max/min, half-away-from-zero
Round on f32, saturating float→int casts, C `powf`/`fmod`).  Every function takes the IRBuilder
first and returns values shaped like its operands; the transcendental parts come from `vecmath`
(straight-line, no libm calls) except `Mod`, which is `frem` (x86 lowers it to `fmodf` calls).
`rlx_llvm.reference.elementmath` is the NumPy oracle of the same rules.

Choices where the semantics leave room (documented in docs/transcendentals.md):
* Max/Min (and Relu, Softplus, LogSigmoid) order signed zeros: max(−0, +0) = +0, min = −0
  (Rust/LLVM leave the sign unspecified; NumPy's fmax is not even consistent across SIMD paths).
* f32 `Gelu` = 0.5·x·erfc(−x/√2) with our erfc (max abs error ≈1e-7, relative accuracy kept in
  the left tail); RLX uses Abramowitz–Stegun 7.1.26 (abs error ≈1.5e-7), so we are at least as
  accurate.  `GeluApprox` = x·σ(2u) ≡ 0.5·x·(1+tanh u) (no cancellation for x ≪ 0).
  Silu = x·σ(x) (`vm.scaled_by_sigmoid`); σ is the overflow-free sigmoid.  As in the plain formulas, f(−inf) is NaN for
  Gelu, GeluApprox, Silu and Mish, and Softsign(±inf) is NaN.
* `Elu` uses expm1 (exact near 0); `HardSigmoid` is (x+3)/6 clamped, NaN → NaN (Rust `clamp`).
* ActivationC64 and complex Mul/Div evaluate in f64 and round once to f32 (no spurious overflow).
* i64: Div and Mod by 0 give 0; MIN/−1 wraps (Rust `wrapping_div`/`wrapping_rem`); Pow with a
  negative exponent is 0 except for bases ±1; Atan2 is atan2 in f64 truncated toward zero.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from ..errors import ValidationError
from ..ops import Activation, BinaryOp, CmpOp
from . import vecmath as vm
from .toolkit import F32, F64, I64, scalar_of, splat_like, vec_like

A = Activation


# ── Rust casts ──────────────────────────────────────────────────────────────

def f32_to_int_sat(b: ir.IRBuilder, x: ir.Value, bits: int, signed: bool) -> ir.Value:
    """Rust `x as iN/uN` for f32 or f64 lanes: truncate toward zero, saturate, NaN → 0.

    Clamp, then a plain `fptosi/fptoui`: `llvm.fpto*i.sat` would be scalarized on x86.
    """
    import numpy as np
    ity = vec_like(x, ir.IntType(bits))
    lo, hi = (-2 ** (bits - 1), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)
    npf = np.float64 if scalar_of(x.type) == ir.DoubleType() else np.float32
    below_top = float(np.nextafter(npf(hi + 1), npf(0)))          # largest float < 2^k
    clamped = vm.minnum(b, vm.maxnum(b, x, splat_like(x, float(lo))), splat_like(x, below_top))
    v = b.fptosi(clamped, ity) if signed else b.fptoui(clamped, ity)
    v = b.select(b.fcmp_ordered(">=", x, splat_like(x, float(hi + 1))), ir.Constant(ity, [hi] * ity.count)
                 if isinstance(ity, ir.VectorType) else ir.Constant(ity, hi), v)
    zero = ir.Constant(ity, None)
    return b.select(b.fcmp_unordered("uno", x, x), zero, v)


def round_half_away(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Rust `f32::round`: nearest integer, ties away from zero (keeps −0)."""
    return vm.round_half_away(b, x)


def _to_float(b, i, x):
    """Rust `i64 as f32/f64` (round to nearest)."""
    return b.sitofp(i, x.type)


def _zero_tie(b, l, r, picked, combine):
    """Where l == r (only ±0 vs ∓0 can differ in bits) merge the bit patterns with `combine`."""
    merged = vm.from_bits(b, combine(vm.to_bits(b, l), vm.to_bits(b, r)), scalar_of(l.type))
    return b.select(b.fcmp_ordered("==", l, r), merged, picked)


def rust_max(b: ir.IRBuilder, l: ir.Value, r: ir.Value) -> ir.Value:
    """NaN-ignoring max (Rust `f32::max`); max(−0, +0) = +0 (IEEE 754-2019 maximumNumber)."""
    picked = b.select(b.or_(b.fcmp_ordered(">", l, r), vm.is_nan(b, r)), l, r)
    return _zero_tie(b, l, r, picked, b.and_)


def rust_min(b: ir.IRBuilder, l: ir.Value, r: ir.Value) -> ir.Value:
    """NaN-ignoring min (Rust `f32::min`); min(−0, +0) = −0."""
    picked = b.select(b.or_(b.fcmp_ordered("<", l, r), vm.is_nan(b, r)), l, r)
    return _zero_tie(b, l, r, picked, b.or_)


# ── activations ─────────────────────────────────────────────────────────────

def _softplus(b, x):
    """max(x, 0) + log1p(e^−|x|)."""
    return b.fadd(rust_max(b, x, splat_like(x, 0.0)), vm.log1p(b, vm.exp(b, b.fneg(vm.fabs(b, x)))))


def _log_sigmoid(b, x):
    """min(x, 0) − log1p(e^−|x|)."""
    return b.fsub(rust_min(b, x, splat_like(x, 0.0)), vm.log1p(b, vm.exp(b, b.fneg(vm.fabs(b, x)))))


def _sign(b, x):
    """+1 / −1 / 0 (0 for ±0 and NaN)."""
    pos = b.fcmp_ordered(">", x, splat_like(x, 0.0))
    neg = b.fcmp_ordered("<", x, splat_like(x, 0.0))
    return b.select(pos, splat_like(x, 1.0), b.select(neg, splat_like(x, -1.0), splat_like(x, 0.0)))


# tanh Gelu: 2u·log2(e) = x·(A + C·x²) for RLX's f32 constants u = c0·(x + c1·x³); A as two f32 (hi + lo)
_GELU_A = 2.0 * float(np.float32(0.7978846)) / math.log(2.0)
GELU_A_HI = float(np.float32(_GELU_A))
GELU_A_LO, GELU_C = _GELU_A - GELU_A_HI, _GELU_A * float(np.float32(0.044715))


def _gelu_tanh(b, x):
    """0.5·x·(1 + tanh u) = x·σ(2u), with v = 2u·log2(e) = x·A_hi + x·(A_lo + C·x²) fed to exp2
    (`vm.scaled_by_sigmoid2`)."""
    rest = b.fmul(x, vm.fma(b, b.fmul(x, x), splat_like(x, GELU_C), splat_like(x, GELU_A_LO)))
    return vm.scaled_by_sigmoid2(b, x, vm.fma(b, x, splat_like(x, GELU_A_HI), rest))


def _gelu_erf(b, x):
    """0.5·x·(1 + erf(x/√2)) = 0.5·x·erfc(−x/√2)."""
    z = b.fmul(x, splat_like(x, -1.0 / math.sqrt(2.0)))
    return b.fmul(b.fmul(splat_like(x, 0.5), x), vm.erfc(b, z))


def _hard_swish(b, x):
    """x·clamp(x+3, 0, 6)/6 (NaN-ignoring clamp; a NaN x still gives NaN)."""
    c = vm.minnum(b, vm.maxnum(b, b.fadd(x, splat_like(x, 3.0)), splat_like(x, 0.0)), splat_like(x, 6.0))
    return b.fmul(x, b.fdiv(c, splat_like(x, 6.0)))            # x·(c/6): no overflow of x·c near FLT_MAX


def _hard_sigmoid(b, x):
    """clamp(x/6 + 0.5, 0, 1) evaluated as (x+3)/6 (exact near −3); NaN stays NaN."""
    return vm.clamp_nan_keep(b, b.fdiv(b.fadd(x, splat_like(x, 3.0)), splat_like(x, 6.0)), 0.0, 1.0)


def _common(b, act: Activation, x: ir.Value):
    """The formulas shared by the f32 and f64 activation kernels (None if not one of them)."""
    one = splat_like(x, 1.0)
    table = {
        A.Relu: lambda: rust_max(b, x, splat_like(x, 0.0)),
        A.Sigmoid: lambda: vm.sigmoid(b, x),
        A.Tanh: lambda: vm.tanh(b, x),
        A.Exp: lambda: vm.exp(b, x),
        A.Log: lambda: vm.log(b, x),
        A.Sqrt: lambda: vm.sqrt(b, x),
        A.Rsqrt: lambda: b.fdiv(one, vm.sqrt(b, x)),
        A.Neg: lambda: b.fneg(x),
        A.Abs: lambda: vm.fabs(b, x),
        A.Sin: lambda: vm.sin(b, x),
        A.Cos: lambda: vm.cos(b, x),
        A.Tan: lambda: vm.tan(b, x),
        A.Atan: lambda: vm.atan(b, x),
        A.Recip: lambda: b.fdiv(one, x),
        A.Floor: lambda: vm.floor(b, x),
        A.Ceil: lambda: vm.ceil(b, x),
        A.Sign: lambda: _sign(b, x),
        A.Softplus: lambda: _softplus(b, x),
        A.Elu: lambda: b.select(b.fcmp_ordered(">", x, splat_like(x, 0.0)), x, vm.expm1(b, x)),
        A.Erf: lambda: vm.erf(b, x),
        A.HardSwish: lambda: _hard_swish(b, x),
        A.HardSigmoid: lambda: _hard_sigmoid(b, x),
        A.Mish: lambda: b.fmul(x, vm.tanh(b, _softplus(b, x))),
        A.Softsign: lambda: b.fdiv(x, b.fadd(one, vm.fabs(b, x))),
        A.LogSigmoid: lambda: _log_sigmoid(b, x),
    }
    fn = table.get(act)
    return None if fn is None else fn()


def _check_float(x: ir.Value, ety: ir.Type, what: str) -> None:
    if scalar_of(x.type) != ety:
        raise TypeError(f"{what} expects {ety} lanes, got {x.type}")


def activation(b: ir.IRBuilder, act: Activation, x: ir.Value, *, region: bool = False) -> ir.Value:
    """One f32 element of `act` (semantics.md §2.3); `region=True` makes Gelu the tanh form."""
    _check_float(x, F32, "activation")
    if act is A.Gelu:
        return _gelu_tanh(b, x) if region else _gelu_erf(b, x)
    if act is A.GeluApprox:
        return _gelu_tanh(b, x)
    if act is A.Silu:
        return vm.scaled_by_sigmoid(b, x, x)
    if act is A.Round:
        return vm.round_half_away(b, x)
    out = _common(b, act, x)
    if out is None:
        raise ValidationError(f"unknown activation {act!r}", field="act")
    return out


def activation_f64(b: ir.IRBuilder, act: Activation, x: ir.Value) -> ir.Value:
    """One f64 element of ActivationF64: everything but Gelu/GeluApprox/Silu; Round ties-to-even."""
    _check_float(x, F64, "activation_f64")
    if act in (A.Gelu, A.GeluApprox, A.Silu):
        raise ValidationError(f"ActivationF64 does not support {act.name} (RLX panics)", field="kind")
    if act is A.Round:
        return vm.rint(b, x)
    out = _common(b, act, x)
    if out is None:
        raise ValidationError(f"unknown activation {act!r}", field="kind")
    return out


def activation_c64(b: ir.IRBuilder, act: Activation, re: ir.Value, im: ir.Value) -> tuple[ir.Value, ir.Value]:
    """ActivationC64 on (re, im) f32 lanes: Neg, Exp, Log, Sqrt (evaluated in f64, rounded once)."""
    _check_float(re, F32, "activation_c64")
    if act is A.Neg:
        return b.fneg(re), b.fneg(im)
    if act not in (A.Exp, A.Log, A.Sqrt):
        raise ValidationError(f"ActivationC64 supports Neg, Exp, Log, Sqrt, not {act.name}", field="kind")
    dty = vec_like(re, F64)
    a, c = b.fpext(re, dty), b.fpext(im, dty)
    if act is A.Exp:
        out = _cexp(b, a, c)
    elif act is A.Log:
        out = _clog(b, a, c)
    else:
        out = _csqrt(b, a, c)
    return b.fptrunc(out[0], re.type), b.fptrunc(out[1], re.type)


def _cexp(b, a, c):
    """e^a·(cos c + i·sin c); an imaginary part of ±0 stays ±0 (so e^(inf+0i) = inf+0i)."""
    e = vm.exp(b, a)
    im = b.select(b.fcmp_ordered("==", c, splat_like(c, 0.0)), c, b.fmul(e, vm.sin(b, c)))
    return b.fmul(e, vm.cos(b, c)), im


def _clog(b, a, c):
    """ln|z| + i·atan2(c, a), |z|² = a² + c² is exact enough in f64 for f32 inputs."""
    mag2 = b.fadd(b.fmul(a, a), b.fmul(c, c))
    return b.fmul(splat_like(a, 0.5), vm.log(b, mag2)), vm.atan2(b, c, a)


def _csqrt(b, a, c):
    """Principal square root, stable form: t = √((|a|+|z|)/2); a ≥ 0 → (t, c/2t), else (|c|/2t, ±t).

    The imaginary sign is that of c with c = ±0 counting as + (b=0, a<0 → +i√|a|); z = 0 → (0, c);
    c = ±inf → (inf, c)."""
    zero = splat_like(a, 0.0)
    mod = vm.sqrt(b, b.fadd(b.fmul(a, a), b.fmul(c, c)))
    t = vm.sqrt(b, b.fmul(splat_like(a, 0.5), b.fadd(vm.fabs(b, a), mod)))
    two_t = b.fmul(splat_like(a, 2.0), t)
    pos = b.fcmp_unordered(">=", a, zero)
    re = b.select(pos, t, b.fdiv(vm.fabs(b, c), two_t))
    im = b.select(pos, b.fdiv(c, two_t), b.select(b.fcmp_ordered("<", c, zero), b.fneg(t), t))
    is_zero = b.fcmp_ordered("==", t, zero)
    re, im = b.select(is_zero, zero, re), b.select(is_zero, c, im)
    inf_c = b.fcmp_ordered("==", vm.fabs(b, c), splat_like(a, math.inf))
    return b.select(inf_c, splat_like(a, math.inf), re), b.select(inf_c, c, im)


# ── binary ops ──────────────────────────────────────────────────────────────

def _float_binary(b, op: BinaryOp, l, r):
    """The f32/f64 binary ops (both widths share the Rust semantics)."""
    if op is BinaryOp.Add:
        return b.fadd(l, r)
    if op is BinaryOp.Sub:
        return b.fsub(l, r)
    if op is BinaryOp.Mul:
        return b.fmul(l, r)
    if op is BinaryOp.Div:
        return b.fdiv(l, r)
    if op is BinaryOp.Max:
        return rust_max(b, l, r)
    if op is BinaryOp.Min:
        return rust_min(b, l, r)
    if op is BinaryOp.Pow:
        return vm.pow(b, l, r)
    if op is BinaryOp.Mod:
        return b.frem(l, r)
    if op is BinaryOp.Atan2:
        return vm.atan2(b, l, r)
    li = f32_to_int_sat(b, l, 64, True)
    if op in (BinaryOp.BitAnd, BinaryOp.BitOr, BinaryOp.BitXor):
        ri = f32_to_int_sat(b, r, 64, True)
        fn = {BinaryOp.BitAnd: b.and_, BinaryOp.BitOr: b.or_, BinaryOp.BitXor: b.xor}[op]
        return _to_float(b, fn(li, ri), l)
    if op in (BinaryOp.Shl, BinaryOp.Shr):
        amount = b.zext(f32_to_int_sat(b, r, 32, False), vec_like(l, I64))   # r as u32
        amount = b.and_(amount, splat_like(amount, 63))                      # wrapping_shl masks
        shifted = b.shl(li, amount) if op is BinaryOp.Shl else b.ashr(li, amount)
        return _to_float(b, shifted, l)
    raise ValidationError(f"unknown binary op {op!r}", field="op")


def binary(b: ir.IRBuilder, op: BinaryOp, l: ir.Value, r: ir.Value) -> ir.Value:
    """One f32 element of `l op r` (semantics.md §2.4)."""
    _check_float(l, F32, "binary")
    return _float_binary(b, op, l, r)


def binary_f64(b: ir.IRBuilder, op: BinaryOp, l: ir.Value, r: ir.Value) -> ir.Value:
    """One f64 element of `l op r` (same rules as f32, at f64)."""
    _check_float(l, F64, "binary_f64")
    return _float_binary(b, op, l, r)


def _ipow(b, base, exp):
    """Wrapping base^exp by square-and-multiply over the 63 magnitude bits; exp < 0 → 0 unless |base| = 1."""
    one = splat_like(base, 1)
    acc, sq, e = one, base, exp
    for _ in range(63):
        bit = b.icmp_signed("!=", b.and_(e, one), splat_like(e, 0))
        acc = b.select(bit, b.mul(acc, sq), acc)
        sq = b.mul(sq, sq)
        e = b.lshr(e, one)
    neg = b.icmp_signed("<", exp, splat_like(exp, 0))
    odd = b.icmp_signed("!=", b.and_(exp, one), splat_like(exp, 0))
    minus_one = splat_like(base, -1)
    at_neg = b.select(b.icmp_signed("==", base, one), one,
                      b.select(b.icmp_signed("==", base, minus_one), b.select(odd, minus_one, one),
                               splat_like(base, 0)))
    return b.select(neg, at_neg, acc)


def binary_i64(b: ir.IRBuilder, op: BinaryOp, l: ir.Value, r: ir.Value) -> ir.Value:
    """One i64 element of `l op r`: wrapping arithmetic, x/0 = x%0 = 0, masked shifts."""
    zero, one, minus_one = splat_like(l, 0), splat_like(l, 1), splat_like(l, -1)
    if op is BinaryOp.Add:
        return b.add(l, r)
    if op is BinaryOp.Sub:
        return b.sub(l, r)
    if op is BinaryOp.Mul:
        return b.mul(l, r)
    if op in (BinaryOp.Div, BinaryOp.Mod):
        by_zero = b.icmp_signed("==", r, zero)
        by_minus_one = b.icmp_signed("==", r, minus_one)
        safe = b.select(b.or_(by_zero, by_minus_one), one, r)        # no UB: never /0, never MIN/−1
        if op is BinaryOp.Div:
            out = b.select(by_minus_one, b.sub(zero, l), b.sdiv(l, safe))
        else:
            out = b.select(by_minus_one, zero, b.srem(l, safe))
        return b.select(by_zero, zero, out)
    if op is BinaryOp.Max:
        return b.select(b.icmp_signed(">", l, r), l, r)
    if op is BinaryOp.Min:
        return b.select(b.icmp_signed("<", l, r), l, r)
    if op is BinaryOp.Pow:
        return _ipow(b, l, r)
    if op is BinaryOp.BitAnd:
        return b.and_(l, r)
    if op is BinaryOp.BitOr:
        return b.or_(l, r)
    if op is BinaryOp.BitXor:
        return b.xor(l, r)
    if op in (BinaryOp.Shl, BinaryOp.Shr):
        amount = b.and_(r, splat_like(r, 63))
        return b.shl(l, amount) if op is BinaryOp.Shl else b.ashr(l, amount)
    if op is BinaryOp.Atan2:
        dty = vec_like(l, F64)
        return f32_to_int_sat(b, vm.atan2(b, b.sitofp(l, dty), b.sitofp(r, dty)), 64, True)
    raise ValidationError(f"unknown binary op {op!r}", field="op")


def binary_c64(b: ir.IRBuilder, op: BinaryOp, lhs: tuple, rhs: tuple) -> tuple[ir.Value, ir.Value]:
    """Complex (re, im) f32 lanes: Add, Sub; Mul and Div = (a·b̄)/|b|² evaluated in f64."""
    (lr, li), (rr, ri) = lhs, rhs
    _check_float(lr, F32, "binary_c64")
    if op is BinaryOp.Add:
        return b.fadd(lr, rr), b.fadd(li, ri)
    if op is BinaryOp.Sub:
        return b.fsub(lr, rr), b.fsub(li, ri)
    if op not in (BinaryOp.Mul, BinaryOp.Div):
        raise ValidationError(f"complex binary supports Add, Sub, Mul, Div, not {op.name}", field="op")
    dty = vec_like(lr, F64)
    a, c, x, y = (b.fpext(v, dty) for v in (lr, li, rr, ri))
    if op is BinaryOp.Mul:
        re = b.fsub(b.fmul(a, x), b.fmul(c, y))
        im = b.fadd(b.fmul(c, x), b.fmul(a, y))
    else:
        den = b.fadd(b.fmul(x, x), b.fmul(y, y))
        re = b.fdiv(b.fadd(b.fmul(a, x), b.fmul(c, y)), den)
        im = b.fdiv(b.fsub(b.fmul(c, x), b.fmul(a, y)), den)
    return b.fptrunc(re, lr.type), b.fptrunc(im, lr.type)


# ── comparisons ─────────────────────────────────────────────────────────────

_PRED = {CmpOp.Eq: "==", CmpOp.Ne: "!=", CmpOp.Lt: "<", CmpOp.Le: "<=", CmpOp.Gt: ">", CmpOp.Ge: ">="}


def compare(b: ir.IRBuilder, op: CmpOp, l: ir.Value, r: ir.Value) -> ir.Value:
    """`l op r` as i1 lanes: IEEE for floats (NaN → false, except Ne → true), signed for ints."""
    pred = _PRED[op]
    if isinstance(scalar_of(l.type), (ir.FloatType, ir.DoubleType)):
        if op is CmpOp.Ne:
            return b.fcmp_unordered(pred, l, r)
        return b.fcmp_ordered(pred, l, r)
    return b.icmp_signed(pred, l, r)


__all__ = ["activation", "activation_f64", "activation_c64", "binary", "binary_f64", "binary_i64",
           "binary_c64", "compare", "f32_to_int_sat", "round_half_away", "rust_max", "rust_min"]
