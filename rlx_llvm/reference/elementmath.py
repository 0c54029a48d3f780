"""NumPy reference of one element of every Activation, BinaryOp and CmpOp (semantics.md §2.3–§2.5).

This is the oracle the JIT kernels are tested against, and a readable statement of the rules:

    from rlx_llvm.reference import elementmath as em
    em.activation(Activation.Gelu, x)                 # float32 in, float32 out
    em.binary(BinaryOp.Pow, l, r)
    em.compare(CmpOp.Lt, l, r)                        # bool array

f32 results are computed in float64 from the f32 inputs and rounded once to f32: for + − × ÷ √,
fmod, floor/ceil/round, max/min, the bitwise ops and the comparisons that *is* the exact f32 result;
for the transcendental functions it is the correctly rounded value up to NumPy's float64 error
(≲1e-16), i.e. what the JIT's ≤ a few ulp are measured against.  Where a textbook formula loses
accuracy in float64 itself (1 + tanh u for u ≪ 0, 1 + erf z for z ≪ 0) the mathematically equal
stable form is used.

Rust semantics that NumPy does not share, spelled out here: `f32::max/min` ignore NaN (np.fmax /
np.fmin, with signed zeros ordered: max(−0, +0) = +0, min(−0, +0) = −0), `f32::round` rounds half
away from zero, `x as i64` truncates toward zero, saturates and maps NaN to 0, `powf` is C pow,
`%` is C fmod.  The conventions this project chose where RLX
leaves room are listed in `rlx_llvm.ir_emit.elementmath` and docs/transcendentals.md.
"""
from __future__ import annotations

import numpy as np
from scipy import special

from ..ops import Activation, BinaryOp, CmpOp

A = Activation
GELU_C0 = float(np.float32(0.7978846))   # RLX's f32 constants of the tanh-form Gelu
GELU_C1 = float(np.float32(0.044715))
I64_MIN, I64_MAX = -2**63, 2**63 - 1


# ── helpers ─────────────────────────────────────────────────────────────────

def round_half_away(x: np.ndarray) -> np.ndarray:
    """Rust `f32::round`: nearest integer, ties away from zero, −0 kept."""
    x = np.asarray(x)
    return np.copysign(np.floor(np.abs(x) + 0.5), x).astype(x.dtype)


def float_to_int_sat(x: np.ndarray, bits: int = 64, signed: bool = True) -> np.ndarray:
    """Rust `x as iN/uN`: truncate toward zero, saturate at the range, NaN → 0 (returns int64/uint64)."""
    t = np.trunc(np.nan_to_num(np.asarray(x, np.float64), nan=0.0))
    lo, hi = (-2**(bits - 1), 2**(bits - 1) - 1) if signed else (0, 2**bits - 1)
    out_dtype = np.int64 if signed else np.uint64
    big = t >= float(hi)                # hi itself may not be representable (2^63 − 1)
    small = t <= float(lo)
    safe = np.where(big | small, 0.0, t).astype(out_dtype)
    return np.where(big, out_dtype(hi), np.where(small, out_dtype(lo), safe))


def rust_max(l: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Rust `f32::max`: NaN-ignoring; signed zeros ordered, max(−0, +0) = +0."""
    both_zero = (l == 0) & (r == 0)
    return np.where(both_zero, np.where(np.signbit(l) & np.signbit(r), -0.0, 0.0), np.fmax(l, r))


def rust_min(l: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Rust `f32::min`: NaN-ignoring; min(−0, +0) = −0."""
    both_zero = (l == 0) & (r == 0)
    return np.where(both_zero, np.where(np.signbit(l) | np.signbit(r), -0.0, 0.0), np.fmin(l, r))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1/(1+e^−x) without overflow (e^x/(1+e^x) for x < 0)."""
    e = np.exp(-np.abs(x))
    return np.where(x < 0, e, 1.0) / (1.0 + e)


def _softplus(x):
    return rust_max(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


def _sign(x):
    return np.where(x > 0, 1.0, np.where(x < 0, -1.0, 0.0))


def _gelu_tanh(x):
    """0.5·x·(1 + tanh(c0·(x + c1·x³))) = x·σ(2u) (no cancellation for x ≪ 0)."""
    return x * sigmoid(2.0 * GELU_C0 * (x + GELU_C1 * x**3))


def _gelu_erf(x):
    """0.5·x·(1 + erf(x/√2)) = 0.5·x·erfc(−x/√2)."""
    return 0.5 * x * special.erfc(-x / np.sqrt(2.0))


_COMMON = {
    A.Relu: lambda x: rust_max(x, 0.0),
    A.Sigmoid: sigmoid,
    A.Tanh: np.tanh,
    A.Exp: np.exp,
    A.Log: np.log,
    A.Sqrt: np.sqrt,
    A.Rsqrt: lambda x: 1.0 / np.sqrt(x),
    A.Neg: np.negative,
    A.Abs: np.abs,
    A.Sin: np.sin,
    A.Cos: np.cos,
    A.Tan: np.tan,
    A.Atan: np.arctan,
    A.Recip: lambda x: 1.0 / x,
    A.Floor: np.floor,
    A.Ceil: np.ceil,
    A.Sign: _sign,
    A.Softplus: _softplus,
    A.Elu: lambda x: np.where(x > 0, x, np.expm1(x)),
    A.Erf: special.erf,
    A.HardSwish: lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    A.HardSigmoid: lambda x: np.clip((x + 3.0) / 6.0, 0.0, 1.0),       # NaN stays NaN
    A.Mish: lambda x: x * np.tanh(_softplus(x)),
    A.Softsign: lambda x: x / (1.0 + np.abs(x)),
    A.LogSigmoid: lambda x: rust_min(x, 0.0) - np.log1p(np.exp(-np.abs(x))),
}


# ── activations ─────────────────────────────────────────────────────────────

def activation(act: Activation, x: np.ndarray, region: bool = False) -> np.ndarray:
    """f32 activation; `region=True` evaluates Gelu in the tanh form (as ElementwiseRegion does)."""
    x64 = np.asarray(x, np.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        if act is A.Gelu:
            y = _gelu_tanh(x64) if region else _gelu_erf(x64)
        elif act is A.GeluApprox:
            y = _gelu_tanh(x64)
        elif act is A.Silu:
            y = x64 * sigmoid(x64)
        elif act is A.Round:
            y = round_half_away(x64)
        else:
            y = _COMMON[act](x64)
        return np.asarray(y).astype(np.float32)


def activation_f64(act: Activation, x: np.ndarray) -> np.ndarray:
    """f64 activation (ActivationF64): no Gelu/GeluApprox/Silu; Round is ties-to-even."""
    if act in (A.Gelu, A.GeluApprox, A.Silu):
        raise ValueError(f"ActivationF64 does not support {act.name}")
    x64 = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        y = np.rint(x64) if act is A.Round else _COMMON[act](x64)
        return np.asarray(y, np.float64)


def activation_c64(act: Activation, re: np.ndarray, im: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Complex activation on f32 (re, im): Neg, Exp, Log, Sqrt; evaluated in float64, rounded once."""
    a, c = np.asarray(re, np.float64), np.asarray(im, np.float64)
    with np.errstate(all="ignore"):
        if act is A.Neg:
            out = (-a, -c)
        elif act is A.Exp:                       # e^a·(cos c + i sin c); a zero imaginary part stays
            e = np.exp(a)
            out = (e * np.cos(c), np.where(c == 0, c, e * np.sin(c)))
        elif act is A.Log:                       # ln|z| + i·atan2(c, a)
            out = (0.5 * np.log(a * a + c * c), np.arctan2(c, a))
        elif act is A.Sqrt:
            out = _csqrt(a, c)
        else:
            raise ValueError(f"ActivationC64 supports Neg, Exp, Log, Sqrt, not {act.name}")
        return out[0].astype(np.float32), out[1].astype(np.float32)


def _csqrt(a, c):
    """Principal √z, stable: t = √((|a|+|z|)/2); a ≥ 0 → (t, c/2t) else (|c|/2t, ±t), sign from c < 0."""
    t = np.sqrt(0.5 * (np.abs(a) + np.sqrt(a * a + c * c)))
    pos = ~(a < 0)
    re = np.where(pos, t, np.abs(c) / (2 * t))
    im = np.where(pos, c / (2 * t), np.where(c < 0, -t, t))
    re, im = np.where(t == 0, 0.0, re), np.where(t == 0, c, im)
    inf_c = np.abs(c) == np.inf
    return np.where(inf_c, np.inf, re), np.where(inf_c, c, im)


# ── binary ops ──────────────────────────────────────────────────────────────

def _shift_amount(r_as_int: np.ndarray) -> np.ndarray:
    return (r_as_int.astype(np.uint64) & np.uint64(63)).astype(np.uint64)


def _float_binary(op: BinaryOp, l: np.ndarray, r: np.ndarray) -> np.ndarray:
    """op on float64 operands (the exact value for f32 inputs where one exists)."""
    if op is BinaryOp.Add:
        return l + r
    if op is BinaryOp.Sub:
        return l - r
    if op is BinaryOp.Mul:
        return l * r
    if op is BinaryOp.Div:
        return l / r
    if op is BinaryOp.Max:
        return rust_max(l, r)
    if op is BinaryOp.Min:
        return rust_min(l, r)
    if op is BinaryOp.Pow:
        return np.power(l, r)
    if op is BinaryOp.Mod:
        return np.fmod(l, r)
    if op is BinaryOp.Atan2:
        return np.arctan2(l, r)
    li = float_to_int_sat(l)
    if op in (BinaryOp.BitAnd, BinaryOp.BitOr, BinaryOp.BitXor):
        ri = float_to_int_sat(r)
        fn = {BinaryOp.BitAnd: np.bitwise_and, BinaryOp.BitOr: np.bitwise_or, BinaryOp.BitXor: np.bitwise_xor}[op]
        return fn(li, ri)
    if op in (BinaryOp.Shl, BinaryOp.Shr):
        amount = _shift_amount(float_to_int_sat(r, 32, signed=False))
        return _shift(op, li, amount)
    raise ValueError(f"unknown binary op {op!r}")


def _shift(op: BinaryOp, li: np.ndarray, amount: np.ndarray) -> np.ndarray:
    """Wrapping i64 shift (Shl on the bits, Shr arithmetic) by an amount already masked to 0..63."""
    if op is BinaryOp.Shl:
        return (li.astype(np.int64).view(np.uint64) << amount).view(np.int64)
    return np.right_shift(li.astype(np.int64), amount.astype(np.int64))


def binary(op: BinaryOp, l: np.ndarray, r: np.ndarray) -> np.ndarray:
    """f32 `l op r`."""
    l64 = np.asarray(l, np.float32).astype(np.float64)
    r64 = np.asarray(r, np.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        y = _float_binary(op, *np.broadcast_arrays(l64, r64))
        return np.asarray(y).astype(np.float32)


def binary_f64(op: BinaryOp, l: np.ndarray, r: np.ndarray) -> np.ndarray:
    """f64 `l op r`."""
    with np.errstate(all="ignore"):
        y = _float_binary(op, *np.broadcast_arrays(np.asarray(l, np.float64), np.asarray(r, np.float64)))
        return np.asarray(y).astype(np.float64)


def _int_pow(base: np.ndarray, exp: np.ndarray) -> np.ndarray:
    """Wrapping base^exp for exp ≥ 0; exp < 0 → 1 for base 1, ±1 for base −1, else 0."""
    acc = np.ones_like(base)
    sq = base.copy()
    e = exp.view(np.uint64).copy()
    for _ in range(63):
        acc = np.where(e & np.uint64(1), acc * sq, acc)
        sq = sq * sq
        e >>= np.uint64(1)
    at_neg = np.where(base == 1, 1, np.where(base == -1, np.where(exp & 1, -1, 1), 0))
    return np.where(exp < 0, at_neg, acc).astype(np.int64)


def binary_i64(op: BinaryOp, l: np.ndarray, r: np.ndarray) -> np.ndarray:
    """i64 `l op r`: wrapping + − ×, truncating ÷ and Rust `%` (0 when r = 0), masked shifts."""
    l, r = np.broadcast_arrays(np.asarray(l, np.int64), np.asarray(r, np.int64))
    with np.errstate(all="ignore"):
        if op is BinaryOp.Add:
            return l + r
        if op is BinaryOp.Sub:
            return l - r
        if op is BinaryOp.Mul:
            return l * r
        if op in (BinaryOp.Div, BinaryOp.Mod):
            special_r = (r == 0) | (r == -1)
            safe = np.where(special_r, 1, r)
            rem = np.fmod(l, safe)                         # C %: sign of the dividend
            if op is BinaryOp.Mod:
                return np.where(special_r, 0, rem)
            quot = (l - rem) // safe                       # exact division: truncation toward zero
            return np.where(r == 0, 0, np.where(r == -1, np.negative(l), quot))
        if op is BinaryOp.Max:
            return np.maximum(l, r)
        if op is BinaryOp.Min:
            return np.minimum(l, r)
        if op is BinaryOp.Pow:
            return _int_pow(l, r)
        if op is BinaryOp.BitAnd:
            return l & r
        if op is BinaryOp.BitOr:
            return l | r
        if op is BinaryOp.BitXor:
            return l ^ r
        if op in (BinaryOp.Shl, BinaryOp.Shr):
            return _shift(op, l, _shift_amount(r))
        if op is BinaryOp.Atan2:
            return float_to_int_sat(np.arctan2(l.astype(np.float64), r.astype(np.float64)))
    raise ValueError(f"unknown binary op {op!r}")


def binary_c64(op: BinaryOp, lhs: tuple, rhs: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Complex (re, im) f32: Add, Sub exact; Mul and Div = (a·b̄)/|b|² in float64, rounded once."""
    (lr, li), (rr, ri) = lhs, rhs
    if op in (BinaryOp.Add, BinaryOp.Sub):
        f = np.add if op is BinaryOp.Add else np.subtract
        with np.errstate(all="ignore"):
            return (f(np.asarray(lr, np.float32), np.asarray(rr, np.float32)),
                    f(np.asarray(li, np.float32), np.asarray(ri, np.float32)))
    a, c, x, y = (np.asarray(v, np.float32).astype(np.float64) for v in (lr, li, rr, ri))
    with np.errstate(all="ignore"):
        if op is BinaryOp.Mul:
            re, im = a * x - c * y, c * x + a * y
        elif op is BinaryOp.Div:
            den = x * x + y * y
            re, im = (a * x + c * y) / den, (c * x - a * y) / den
        else:
            raise ValueError(f"complex binary supports Add, Sub, Mul, Div, not {op.name}")
        return re.astype(np.float32), im.astype(np.float32)


# ── comparisons ─────────────────────────────────────────────────────────────

_CMP = {CmpOp.Eq: np.equal, CmpOp.Ne: np.not_equal, CmpOp.Lt: np.less, CmpOp.Le: np.less_equal,
        CmpOp.Gt: np.greater, CmpOp.Ge: np.greater_equal}


def compare(op: CmpOp, l: np.ndarray, r: np.ndarray) -> np.ndarray:
    """`l op r` as a bool array: IEEE for floats (NaN compares false except Ne), signed for ints."""
    return _CMP[op](np.asarray(l), np.asarray(r))


__all__ = ["activation", "activation_f64", "activation_c64", "binary", "binary_f64", "binary_i64",
           "binary_c64", "compare", "round_half_away", "float_to_int_sat", "sigmoid", "rust_max", "rust_min"]
