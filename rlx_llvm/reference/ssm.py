"""NumPy references of the state-space scans: `SelectiveScan`, `Mamba2`, `GatedDeltaNet` and its backward
(semantics.md §3.9; docs/lowering-ssm.md, docs/semantics-choices.md "state-space").

Float64 throughout, rounded to f32 once when stored.  Each recurrence steps over time vectorized over
everything else (batches, channels, heads, the state), written as the spec states it.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import thunks as T
from . import read_f64, reference, write_f32


def _f64(arena: np.ndarray, offset: int, *shape: int) -> np.ndarray:
    """The f32 buffer of `shape` at `offset`, as float64."""
    return read_f64(arena, offset, int(np.prod(shape))).reshape(shape)


@reference(T.SelectiveScan)
def selective_scan(arena: np.ndarray, t: T.SelectiveScan) -> None:
    """`h[c,i] ← exp(Δ·A[c,i])·h[c,i] + Δ·B[i]·x[c]`, `y[c] = Σ_i C[i]·h[c,i]` per batch, h starting at 0."""
    b, s, d, n = t.batch, t.seq, t.hidden, t.state_size
    x, delta = _f64(arena, t.x, b, s, d), _f64(arena, t.delta, b, s, d)
    a = _f64(arena, t.a, d, n)
    bb, cc = _f64(arena, t.b, b, s, n), _f64(arena, t.c, b, s, n)
    h, y = np.zeros((b, d, n)), np.zeros((b, s, d))
    with np.errstate(all="ignore"):
        for step in range(s):
            dt = delta[:, step, :, None]
            h = np.exp(dt * a) * h + dt * bb[:, step, None, :] * x[:, step, :, None]
            y[:, step] = (h * cc[:, step, None, :]).sum(-1)
    write_f32(arena, t.dst, y)


@reference(T.Mamba2)
def mamba2(arena: np.ndarray, t: T.Mamba2) -> None:
    """`S ← exp(dt·a)·S + (dt·x) ⊗ b`, `y[p] = Σ_n S[p,n]·c[n]` per (batch, head), S `[P, N]` starting at 0."""
    b, s, h, p, n = t.batch, t.seq, t.heads, t.head_dim, t.state_size
    x, dt = _f64(arena, t.x, b, s, h, p), _f64(arena, t.dt, b, s, h)
    a = _f64(arena, t.a, h)
    bb, cc = _f64(arena, t.b, b, s, h, n), _f64(arena, t.c, b, s, h, n)
    state, y = np.zeros((b, h, p, n)), np.zeros((b, s, h, p))
    with np.errstate(all="ignore"):
        for step in range(s):
            decay = np.exp(dt[:, step] * a)[..., None, None]
            u = dt[:, step, :, None] * x[:, step]
            state = decay * state + u[..., None] * bb[:, step, :, None, :]
            y[:, step] = (state * cc[:, step, :, None, :]).sum(-1)
    write_f32(arena, t.dst, y)


# ── gated DeltaNet ───────────────────────────────────────────────────────────

class DeltaNetInputs(NamedTuple):
    """The float64 inputs of a gated DeltaNet thunk: q, k, v `[b,s,h,n]`, g `[b,s,h(,n)]`, beta `[b,s,h]`,
    the initial state `[b,h,n,n]` (zeros without `carry_state`)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    g: np.ndarray
    beta: np.ndarray
    state: np.ndarray


def deltanet_inputs(arena: np.ndarray, t: T._DeltaNet) -> DeltaNetInputs:
    """Read q, k, v, g, beta and the initial state as float64."""
    b, s, h, n = t.batch, t.seq, t.heads, t.state_size
    qkv = [_f64(arena, getattr(t, name), b, s, h, n) for name in ("q", "k", "v")]
    g = _f64(arena, t.g, b, s, h, n) if t.gate_per_channel else _f64(arena, t.g, b, s, h)
    state = _f64(arena, t.state, b, h, n, n) if t.carry_state else np.zeros((b, h, n, n))
    return DeltaNetInputs(*qkv, g, _f64(arena, t.beta, b, s, h), state)


def row_decay(g: np.ndarray) -> np.ndarray:
    """`e^g` shaped to scale the state's rows: `[b,h,1,1]` (scalar gate) or `[b,h,n,1]` (per channel)."""
    alpha = np.exp(g)
    return alpha[..., None] if alpha.ndim == 3 else alpha[..., None, None]


def deltanet_step(S: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """One token for every (batch, head): returns (the new state, the output `o`)."""
    n = S.shape[-1]
    S = row_decay(g) * S
    sk = np.einsum("bhij,bhi->bhj", S, k)
    d = (v - sk) * beta[..., None]
    S = S + k[..., :, None] * d[..., None, :]
    return S, np.einsum("bhij,bhi->bhj", S, q) / np.sqrt(n)


def deltanet_forward(x: DeltaNetInputs) -> tuple[np.ndarray, np.ndarray]:
    """Every token in order: (outputs `[b,s,h,n]`, final state `[b,h,n,n]`)."""
    S, out = x.state, np.zeros_like(x.q)
    with np.errstate(all="ignore"):
        for step in range(x.q.shape[1]):
            S, out[:, step] = deltanet_step(S, *(a[:, step] for a in x[:5]))
    return out, S


@reference(T.GatedDeltaNet)
def gated_delta_net(arena: np.ndarray, t: T.GatedDeltaNet) -> None:
    """Outputs to dst; with `carry_state` the final state written back over the initial one."""
    out, final = deltanet_forward(deltanet_inputs(arena, t))
    write_f32(arena, t.dst, out)
    if t.carry_state:
        write_f32(arena, t.state, final)


def deltanet_backward(x: DeltaNetInputs, dy: np.ndarray) -> DeltaNetInputs:
    """Gradients of Σ dy·o with respect to every input (the final state's gradient taken as zero)."""
    n = x.q.shape[-1]
    states = [x.state]                       # states[t] = S before token t
    with np.errstate(all="ignore"):
        for step in range(x.q.shape[1]):
            states.append(deltanet_step(states[-1], *(a[:, step] for a in x[:5]))[0])
        grads = DeltaNetInputs(*(np.zeros_like(a) for a in x))
        dS = np.zeros_like(x.state)          # ∂L/∂S after the token being undone
        for step in reversed(range(x.q.shape[1])):
            q, k, v, g, beta = (a[:, step] for a in x[:5])
            do = dy[:, step] / np.sqrt(n)
            decayed = row_decay(g) * states[step]                      # S' = e^g·S
            sk = np.einsum("bhij,bhi->bhj", decayed, k)
            d = (v - sk) * beta[..., None]
            after = decayed + k[..., :, None] * d[..., None, :]        # S_t
            dS = dS + q[..., :, None] * do[..., None, :]               # o = S_tᵀq/√n
            grads.q[:, step] = np.einsum("bhij,bhj->bhi", after, do)
            dd = np.einsum("bhij,bhi->bhj", dS, k)                     # S_t = S' + k dᵀ
            dk = np.einsum("bhij,bhj->bhi", dS, d)
            grads.v[:, step] = dd * beta[..., None]                    # d = (v − sk)·β
            grads.beta[:, step] = (dd * (v - sk)).sum(-1)
            dsk = -dd * beta[..., None]
            dS = dS + k[..., :, None] * dsk[..., None, :]              # sk = S'ᵀk
            grads.k[:, step] = dk + np.einsum("bhij,bhj->bhi", decayed, dsk)
            gate = (dS * decayed).sum(-1)                              # ∂/∂g of S' = e^g·S
            grads.g[:, step] = gate if x.g.ndim == 4 else gate.sum(-1)
            dS = row_decay(g) * dS
    return grads._replace(state=dS)


@reference(T.GatedDeltaNetBackward)
def gated_delta_net_backward(arena: np.ndarray, t: T.GatedDeltaNetBackward) -> None:
    """`dst = [dq ‖ dk ‖ dv ‖ dg ‖ dbeta ‖ dstate]`, each in its input's layout (dstate only with `carry_state`)."""
    x = deltanet_inputs(arena, t)
    grads = deltanet_backward(x, _f64(arena, t.dy, *x.q.shape))
    at = t.dst
    for name, count in t.parts():
        write_f32(arena, at, getattr(grads, name).reshape(-1)[:count])
        at += 4 * count
