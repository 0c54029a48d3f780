"""Activation backward kernels as native code (semantics.md §2.3 derivatives).

ReluBackward[F64] is a select: `dx = x > 0 ? dy : +0` (a NaN x gives 0, whatever dy is).
ActivationBackward[F64] is `dx = f'(x)·dy`, one IEEE multiply after `derivative(b, kind, x)`, so a
NaN or infinite `dy` propagates even where f' is 0.  The derivatives avoid the cancellations of the
textbook forms (docs/lowering-backward.md): with `s = σ(x)` and `s̄ = σ(−x)` both from one
overflow-free exponential, σ' = s·s̄, tanh'(x) = 4·σ(2x)·σ(−2x), Silu' = s·(1 + x·s̄), GeluApprox'
= S + x·S·S̄·2c0(1 + 3c1x²) with S = σ(2u).  f32 Gelu uses erfc for Φ; f64 evaluates both Gelu
kinds in the exact-erf form with Φ = ½ + ½·erf (absolute accuracy in the far left tail).
Erf/HardSwish/HardSigmoid/Mish/Softsign/LogSigmoid are decomposed by autodiff in RLX (its kernel
panics): `check` refuses them.
"""
from __future__ import annotations

import math
from typing import Callable

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..ops import Activation
from . import vecmath as vm
from .context import EmitContext
from .toolkit import scalar_of, splat_like
from .elementwise import F32_ELEM, F64_ELEM, Elem, Operand, Output, emit_walk
from ..registry import lowering

A = Activation
DECOMPOSED = (A.Erf, A.HardSwish, A.HardSigmoid, A.Mish, A.Softsign, A.LogSigmoid)
GELU_C0, GELU_C1 = 0.7978846, 0.044715          # RLX's tanh-form Gelu constants
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
PHI_LIMIT_F32, PHI_LIMIT_F64 = 20.0, 40.0          # φ(x) is 0 beyond these |x|


def _is_f64(x: ir.Value) -> bool:
    return scalar_of(x.type) == ir.DoubleType()


# ── pieces ──────────────────────────────────────────────────────────────────

def sigmoid_pair(b: ir.IRBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(σ(x), σ(−x)) from one e = e^−|x|: 1/(1+e) and e/(1+e), swapped for x < 0 (no cancellation)."""
    e = vm.exp(b, b.fneg(vm.fabs(b, x)))
    den = b.fadd(splat_like(x, 1.0), e)
    big, small = b.fdiv(splat_like(x, 1.0), den), b.fdiv(e, den)
    neg = b.fcmp_ordered("<", x, splat_like(x, 0.0))
    return b.select(neg, small, big), b.select(neg, big, small)


def normal_pdf(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """φ(x) = e^(−x²/2)/√(2π), x² split exactly as hi + lo; |x| beyond PHI_LIMIT (and NaN) gives 0."""
    a = vm.minnum(b, vm.fabs(b, x), splat_like(x, PHI_LIMIT_F64 if _is_f64(x) else PHI_LIMIT_F32))
    hi = b.fmul(a, a)
    lo = vm.fma(b, a, a, b.fneg(hi))
    e = vm.exp(b, b.fmul(hi, splat_like(x, -0.5)))
    return b.fmul(b.fmul(e, vm.fma(b, lo, splat_like(x, -0.5), splat_like(x, 1.0))), splat_like(x, INV_SQRT_2PI))


def normal_cdf(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Φ(x): ½·erfc(−x/√2) in f32 (relative accuracy in the left tail), ½ + ½·erf(x/√2) in f64."""
    z = b.fmul(x, splat_like(x, 1.0 / math.sqrt(2.0)))
    if _is_f64(x):
        return vm.fma(b, vm.erf(b, z), splat_like(x, 0.5), splat_like(x, 0.5))
    return b.fmul(splat_like(x, 0.5), vm.erfc(b, b.fneg(z)))


def _sign(b, x):
    """+1 / −1 / 0 (0 for ±0 and NaN)."""
    pos = b.select(b.fcmp_ordered(">", x, splat_like(x, 0.0)), splat_like(x, 1.0), splat_like(x, 0.0))
    return b.select(b.fcmp_ordered("<", x, splat_like(x, 0.0)), splat_like(x, -1.0), pos)


# ── derivatives ─────────────────────────────────────────────────────────────

def _d_silu(b, x):
    """s·(1 + x·s̄)."""
    s, sbar = sigmoid_pair(b, x)
    return b.fmul(s, vm.fma(b, x, sbar, splat_like(x, 1.0)))


def _d_gelu_erf(b, x):
    """Φ(x) + x·φ(x)."""
    return vm.fma(b, x, normal_pdf(b, x), normal_cdf(b, x))


def _d_gelu_tanh(b, x):
    """d/dx x·σ(2u), u = c0·(x + c1x³): S + (x·S·S̄)·2c0·(1 + 3c1·x²) (x² capped: no inf·0)."""
    inner = vm.fma(b, b.fmul(splat_like(x, GELU_C1), x), b.fmul(x, x), x)
    s, sbar = sigmoid_pair(b, b.fmul(splat_like(x, 2.0 * GELU_C0), inner))
    x2 = vm.minnum(b, b.fmul(x, x), splat_like(x, 1e30))
    slope = b.fmul(splat_like(x, 2.0 * GELU_C0), vm.fma(b, splat_like(x, 3.0 * GELU_C1), x2, splat_like(x, 1.0)))
    return vm.fma(b, b.fmul(b.fmul(x, s), sbar), slope, s)


def _d_sqrt(b, x):
    """0.5/√x, 0 where √x = 0."""
    r = vm.sqrt(b, x)
    return b.select(b.fcmp_ordered("==", r, splat_like(x, 0.0)), splat_like(x, 0.0), b.fdiv(splat_like(x, 0.5), r))


def _d_rsqrt(b, x):
    """−0.5·x^(−3/2) as (−0.5/√x)/x (halved first: no overflow just past the range), 0 where x ≤ 0."""
    d = b.fdiv(b.fdiv(splat_like(x, -0.5), vm.sqrt(b, x)), x)
    return b.select(b.fcmp_ordered("<=", x, splat_like(x, 0.0)), splat_like(x, 0.0), d)


def _d_tan(b, x):
    """1 + tan²."""
    t = vm.tan(b, x)
    return vm.fma(b, t, t, splat_like(x, 1.0))


def _d_atan(b, x):
    """1/(1 + x²); for |x| > 1 as (1/|x|)·1/(|x| + 1/|x|), so a huge x² never overflows."""
    a = vm.fabs(b, x)
    r = b.fdiv(splat_like(x, 1.0), a)
    far = b.fmul(r, b.fdiv(splat_like(x, 1.0), b.fadd(a, r)))
    near = b.fdiv(splat_like(x, 1.0), vm.fma(b, x, x, splat_like(x, 1.0)))
    return b.select(b.fcmp_ordered(">", a, splat_like(x, 1.0)), far, near)


def _d_recip(b, x):
    """−1/x² = −(1/x)² (no denormal x² in between)."""
    r = b.fdiv(splat_like(x, 1.0), x)
    return b.fneg(b.fmul(r, r))


def _d_sigmoid(b, x):
    """σ(x)·σ(−x)."""
    s, sbar = sigmoid_pair(b, x)
    return b.fmul(s, sbar)


def _d_tanh(b, x):
    """1 − tanh² = 4·σ(2x)·σ(−2x)."""
    s, sbar = sigmoid_pair(b, b.fmul(x, splat_like(x, 2.0)))
    return b.fmul(b.fmul(s, splat_like(x, 4.0)), sbar)


_DERIVATIVES: dict[Activation, Callable] = {
    A.Relu: lambda b, x: b.select(b.fcmp_ordered(">", x, splat_like(x, 0.0)), splat_like(x, 1.0), splat_like(x, 0.0)),
    A.Sigmoid: _d_sigmoid,
    A.Tanh: _d_tanh,
    A.Silu: _d_silu,
    A.Exp: lambda b, x: vm.exp(b, x),
    A.Log: lambda b, x: b.fdiv(splat_like(x, 1.0), x),
    A.Sqrt: _d_sqrt,
    A.Rsqrt: _d_rsqrt,
    A.Neg: lambda b, x: splat_like(x, -1.0),
    A.Abs: _sign,
    A.Round: lambda b, x: splat_like(x, 1.0),
    A.Sin: lambda b, x: vm.cos(b, x),
    A.Cos: lambda b, x: b.fneg(vm.sin(b, x)),
    A.Tan: _d_tan,
    A.Atan: _d_atan,
    A.Recip: _d_recip,
    A.Floor: lambda b, x: splat_like(x, 0.0),
    A.Ceil: lambda b, x: splat_like(x, 0.0),
    A.Sign: lambda b, x: splat_like(x, 0.0),
    A.Softplus: lambda b, x: sigmoid_pair(b, x)[0],
    # PyTorch's elu_backward: e^x where x ≤ 0, else 1 (so a NaN x gives 1)
    A.Elu: lambda b, x: b.select(b.fcmp_ordered("<=", x, splat_like(x, 0.0)), vm.exp(b, x), splat_like(x, 1.0)),
}


def derivative(b: ir.IRBuilder, kind: Activation, x: ir.Value) -> ir.Value:
    """f'(x) of `kind` on f32 or f64 lanes; f64 takes both Gelu kinds in the exact-erf form."""
    if kind is A.Gelu or (kind is A.GeluApprox and _is_f64(x)):
        return _d_gelu_erf(b, x)
    if kind is A.GeluApprox:
        return _d_gelu_tanh(b, x)
    fn = _DERIVATIVES.get(kind)
    if fn is None:
        raise ValidationError(f"ActivationBackward does not support {kind.name} (RLX decomposes it)",
                              field="kind")
    return fn(b, x)


# ── lowerings ───────────────────────────────────────────────────────────────

def check_activation_backward(t) -> None:
    """Erf/HardSwish/HardSigmoid/Mish/Softsign/LogSigmoid are decomposed by autodiff (RLX panics)."""
    if t.kind in DECOMPOSED:
        raise ValidationError(f"{type(t).__name__} does not support {t.kind.name} (RLX decomposes it "
                              "into other ops and panics here)", field="kind")


def _elem(t) -> Elem:
    return F64_ELEM if t.elem_bytes == 8 else F32_ELEM


def _grad_map(ctx: EmitContext, t, grad: Callable) -> None:
    """dx[i] = grad(b, x[i], dy[i]) over `len` elements (dx may alias x or dy exactly)."""
    elem = _elem(t)
    emit_walk(ctx, (t.len,), [Operand(t.x, elem, (1,)), Operand(t.dy, elem, (1,))], [Output(t.dx, elem)], grad)


@lowering(T.ReluBackward, T.ReluBackwardF64, inplace=True)
def relu_backward(ctx: EmitContext, t) -> None:
    """dx = dy where x > 0, else +0 (a select: NaN x → 0, NaN dy passes only where x > 0)."""
    _grad_map(ctx, t, lambda b, x, dy: b.select(b.fcmp_ordered(">", x, splat_like(x, 0.0)), dy, splat_like(x, 0.0)))


@lowering(T.ActivationBackward, T.ActivationBackwardF64, check=check_activation_backward, inplace=True)
def activation_backward(ctx: EmitContext, t) -> None:
    """dx = kind'(x)·dy."""
    _grad_map(ctx, t, lambda b, x, dy: b.fmul(derivative(b, t.kind, x), dy))
