"""NumPy references of the activation backward kernels (semantics.md §2.3).

`ReluBackward[F64]`: `dx = dy where x > 0 else +0`.  `ActivationBackward[F64]`: `dx = f'(x)·dy`
with f'(x) evaluated in float64 (f32 inputs are exact in float64), rounded once to the element
type, then one multiply in that type — the kernel's arithmetic, so an f'(x) beyond the f32 range
is inf in both.  f' uses the same cancellation-free forms as the JIT (σ' = σ(x)·σ(−x),
tanh' = 4·σ(2x)·σ(−2x), Φ from erfc), so it is the accurate value the kernels are measured
against.  Both Gelu kinds of the f64 kernel are the exact-erf form; the kinds RLX decomposes
(Erf, HardSwish, …) raise ValueError.
"""
from __future__ import annotations

import numpy as np
from scipy import special

from .. import thunks as T
from ..ops import Activation
from . import reference, view

A = Activation
GELU_C0 = float(np.float32(0.7978846))   # the f32 constants of the tanh-form Gelu
GELU_C1 = float(np.float32(0.044715))
DECOMPOSED = (A.Erf, A.HardSwish, A.HardSigmoid, A.Mish, A.Softsign, A.LogSigmoid)


def sigmoid_pair(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(σ(x), σ(−x)) without cancellation: 1/(1+e) and e/(1+e) for e = e^−|x|, swapped for x < 0."""
    e = np.exp(-np.abs(x))
    big, small = 1.0 / (1.0 + e), e / (1.0 + e)
    neg = x < 0
    return np.where(neg, small, big), np.where(neg, big, small)


def _square_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x² = hi + lo exactly (Dekker's product)."""
    c = 134217729.0 * x
    xh = c - (c - x)
    xl = x - xh
    hi = x * x
    return hi, ((xh * xh - hi) + 2.0 * xh * xl) + xl * xl


def normal_pdf(x: np.ndarray) -> np.ndarray:
    """φ(x) = e^(−x²/2)/√(2π) with x² split exactly (|x| capped at 40, where φ is 0 in float64)."""
    hi, lo = _square_parts(np.fmin(np.abs(x), 40.0))
    return np.exp(-0.5 * hi) * np.exp(-0.5 * lo) / np.sqrt(2.0 * np.pi)


def _d_gelu_erf(x):
    """Φ(x) + x·φ(x), Φ = ½·erfc(−x/√2)."""
    return 0.5 * special.erfc(-x / np.sqrt(2.0)) + x * normal_pdf(x)


def _d_gelu_tanh(x):
    """d/dx x·σ(2u), u = c0·(x + c1·x³): S + x·S·S̄·2c0·(1 + 3c1·x²)."""
    s, sbar = sigmoid_pair(2.0 * GELU_C0 * (x + GELU_C1 * x**3))
    return s + x * s * sbar * (2.0 * GELU_C0 * (1.0 + 3.0 * GELU_C1 * x * x))


def _d_silu(x):
    s, sbar = sigmoid_pair(x)
    return s * (1.0 + x * sbar)


def _sign(x):
    return np.where(x > 0, 1.0, np.where(x < 0, -1.0, 0.0))


def _d_sqrt(x):
    r = np.sqrt(x)
    return np.where(r == 0, 0.0, 0.5 / r)


def _d_atan(x):
    """1/(1 + x²), as (1/|x|)/(|x| + 1/|x|) for |x| > 1 (no overflow of x²)."""
    a = np.abs(x)
    return np.where(a > 1, (1.0 / a) / (a + 1.0 / a), 1.0 / (1.0 + x * x))


_DERIVATIVES = {
    A.Relu: lambda x: np.where(x > 0, 1.0, 0.0),
    A.Sigmoid: lambda x: np.multiply(*sigmoid_pair(x)),
    A.Tanh: lambda x: 4.0 * np.multiply(*sigmoid_pair(2.0 * x)),
    A.Silu: _d_silu,
    A.Exp: np.exp,
    A.Log: lambda x: 1.0 / x,
    A.Sqrt: _d_sqrt,
    A.Rsqrt: lambda x: np.where(x <= 0, 0.0, (-0.5 / np.sqrt(x)) / x),
    A.Neg: lambda x: np.full_like(x, -1.0),
    A.Abs: _sign,
    A.Round: np.ones_like,
    A.Sin: np.cos,
    A.Cos: lambda x: -np.sin(x),
    A.Tan: lambda x: 1.0 + np.tan(x) ** 2,
    A.Atan: _d_atan,
    A.Recip: lambda x: -(1.0 / x) ** 2,
    A.Floor: np.zeros_like,
    A.Ceil: np.zeros_like,
    A.Sign: np.zeros_like,
    A.Softplus: lambda x: sigmoid_pair(x)[0],
    A.Elu: lambda x: np.where(x <= 0, np.exp(x), 1.0),       # NaN → 1 (PyTorch's elu_backward)
}


def derivative(kind: Activation, x: np.ndarray, f64: bool = False) -> np.ndarray:
    """f'(x) in float64; `f64=True` takes GeluApprox in the exact-erf form (ActivationBackwardF64)."""
    x = np.asarray(x, np.float64)
    if kind in DECOMPOSED:
        raise ValueError(f"ActivationBackward does not support {kind.name}")
    with np.errstate(all="ignore"):
        if kind is A.Gelu or (kind is A.GeluApprox and f64):
            return _d_gelu_erf(x)
        if kind is A.GeluApprox:
            return _d_gelu_tanh(x)
        return np.asarray(_DERIVATIVES[kind](x), np.float64)


def _views(arena: np.ndarray, t):
    dt = np.float64 if t.elem_bytes == 8 else np.float32
    return (view(arena, t.x, dt, t.len).copy(), view(arena, t.dy, dt, t.len).copy(),
            view(arena, t.dx, dt, t.len))


@reference(T.ReluBackward, T.ReluBackwardF64)
def relu_backward(arena: np.ndarray, t) -> None:
    """dx = dy where x > 0, else +0."""
    x, dy, dx = _views(arena, t)
    dx[:] = np.where(x > 0, dy, dy.dtype.type(0.0))


@reference(T.ActivationBackward, T.ActivationBackwardF64)
def activation_backward(arena: np.ndarray, t) -> None:
    """dx = kind'(x)·dy: f'(x) rounded to the element type, then one rounded multiply (as the kernel)."""
    x, dy, dx = _views(arena, t)
    with np.errstate(all="ignore"):
        d = derivative(t.kind, x, f64=t.elem_bytes == 8).astype(dx.dtype)
        dx[:] = d * dy
