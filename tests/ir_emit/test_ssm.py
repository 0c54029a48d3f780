"""SelectiveScan, Mamba2, GatedDeltaNet and GatedDeltaNetBackward.

* Against the float64 references (rtol 1e-5, plus 1e-5 of the output's magnitude Σ|C·h|) over seq 0, 1 and
  several, state sizes W − 1, W, W + 1, 1 and 128, scalar and per-channel gates, carry on and off; all in one
  program, with cases big enough to split across threads.
* Against independent float64 re-derivations: the diagonal scans in their quadratic ("attention") form
  `y_t = Σ_{s≤t} C_t·exp(A·Σ_{s<r≤t} Δ_r)·B_s·Δ_s·x_s`, the DeltaNet forward element by element from the spec.
* Bad input: every `check` rule, and a buffer one byte short.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import pytest

from rlx_llvm import thunks as T
from rlx_llvm.reference import ssm as ref
from tests.harness import W, Suite, assert_close, expect_invalid, f32_at, suite_tests

RTOL = 1e-5


# ── independent float64 forms ────────────────────────────────────────────────

def decay_between(steps: np.ndarray) -> np.ndarray:
    """`[..., t, s]`: Σ_{s<r≤t} steps[r] for s ≤ t, −inf above the diagonal (so exp(A·…) is 0 there for A < 0)."""
    cs = np.cumsum(steps, axis=-1)
    diff = cs[..., :, None] - cs[..., None, :]
    return np.where(np.tril(np.ones(diff.shape[-2:], bool)), diff, np.inf)


def selective_scan_quadratic(x, delta, a, bb, cc) -> np.ndarray:
    """y `[b,s,d]` = Σ_{s≤t} Σ_i C[t,i]·exp(A[c,i]·Σ_{s<r≤t} Δ[r,c])·Δ[s,c]·B[s,i]·x[s,c] (float64)."""
    span = decay_between(np.moveaxis(delta, 1, -1))                       # [b, d, t, s]
    kernel = np.exp(a[None, :, None, None, :] * span[..., None])          # [b, d, t, s, n]
    cb = np.einsum("bti,bsi,bdtsi->bdts", cc, bb, kernel)
    return np.einsum("bdts,bsd->btd", cb, delta * x)


def mamba2_quadratic(x, dt, a, bb, cc) -> np.ndarray:
    """y `[b,s,h,p]` = Σ_{s≤t} (c_t·b_s)·exp(a·Σ_{s<r≤t} dt_r)·dt_s·x_s — SSD's masked "attention" form (float64)."""
    span = decay_between(np.moveaxis(dt, 1, -1))                          # [b, h, t, s]
    scores = np.einsum("bthn,bshn->bhts", cc, bb) * np.exp(a[None, :, None, None] * span)
    return np.einsum("bhts,bshp->bthp", scores, dt[..., None] * x)


# ── the suite ────────────────────────────────────────────────────────────────

def add_selective_scan(s: Suite, batch: int, seq: int, hidden: int, n: int) -> str:
    """Δ ∈ [0.01, 0.5), A ∈ [−2, −0.2), normal x, B, C; atol from the quadratic form on |x|, |B|, |C|."""
    x, bb, cc = s.normal(batch, seq, hidden), s.normal(batch, seq, n), s.normal(batch, seq, n)
    delta = s.rng.uniform(0.01, 0.5, (batch, seq, hidden)).astype(np.float32)
    a = s.rng.uniform(-2.0, -0.2, (hidden, n)).astype(np.float32)
    dst, o = s.out(np.float32, batch * seq * hidden)
    t = T.SelectiveScan(x=s.put(x), delta=s.put(delta), a=s.put(a), b=s.put(bb), c=s.put(cc), dst=dst,
                        batch=batch, seq=seq, hidden=hidden, state_size=n)
    f64 = lambda v: np.abs(v.astype(np.float64))
    magnitude = selective_scan_quadratic(f64(x), f64(delta), -f64(a), f64(bb), f64(cc))
    name = f"SelectiveScan-b{batch}-s{seq}-d{hidden}-n{n}"
    s.add(name, t, [o], atol=RTOL * magnitude.reshape(-1))
    return name


def magnitude_by_recurrence(x, delta, a, bb, cc) -> np.ndarray:
    """Σ_i |C|·h on |x|, |B|, |C| with the same decays (NaN decays as 1): the size of what y sums (float64)."""
    with np.errstate(all="ignore"):
        decay = np.nan_to_num(np.exp(delta[..., None] * a), nan=1.0)      # [b, s, d, n]
    h, out = np.zeros(decay.shape[:1] + decay.shape[2:]), np.zeros(x.shape)
    for step in range(x.shape[1]):
        h = decay[:, step] * h + (delta * np.abs(x))[:, step, :, None] * np.abs(bb)[:, step, None, :]
        out[:, step] = (h * np.abs(cc)[:, step, None, :]).sum(-1)
    return out


def add_selective_scan_extremes(s: Suite, seq: int, hidden: int, wild: int) -> str:
    """Decay arguments Δ·A beyond the fast exp's range: A = −inf (decay 0), −1e4 and Δ = 60 at step `wild`
    (underflow to 0), 0 (decay 1), 0.5 (growth e^30), NaN (that channel's y is NaN from step 0) — in the
    first block of channels and in the tail strips, so the steps around `wild` take the checked exps."""
    batch, n = 1, 5
    x, bb, cc = s.normal(batch, seq, hidden), s.normal(batch, seq, n), s.normal(batch, seq, n)
    delta = s.rng.uniform(0.01, 0.5, (batch, seq, hidden)).astype(np.float32)
    delta[:, wild] = 60.0
    a = s.rng.uniform(-2.0, -0.2, (hidden, n)).astype(np.float32)
    for c, i, value in ((0, 0, -np.inf), (1, 1, -1e4), (2, 2, 0.0), (3, 3, 0.5), (4, 4, np.nan),
                        (hidden - 2, 0, -np.inf), (hidden - 1, 1, 0.5)):
        a[c, i] = value
    dst, o = s.out(np.float32, batch * seq * hidden)
    t = T.SelectiveScan(x=s.put(x), delta=s.put(delta), a=s.put(a), b=s.put(bb), c=s.put(cc), dst=dst,
                        batch=batch, seq=seq, hidden=hidden, state_size=n)
    magnitude = magnitude_by_recurrence(*(v.astype(np.float64) for v in (x, delta, a, bb, cc)))
    name = f"Extremes-SelectiveScan-s{seq}-d{hidden}-at{wild}"
    s.add(name, t, [o], atol=RTOL * magnitude.reshape(-1))
    return name


def add_mamba2(s: Suite, batch: int, seq: int, heads: int, p: int, n: int) -> str:
    """dt ∈ [0.01, 0.5), a ∈ [−2, −0.2), normal x, b, c; atol from the quadratic form on |x|, |b|, |c|."""
    x, bb, cc = s.normal(batch, seq, heads, p), s.normal(batch, seq, heads, n), s.normal(batch, seq, heads, n)
    dt = s.rng.uniform(0.01, 0.5, (batch, seq, heads)).astype(np.float32)
    a = s.rng.uniform(-2.0, -0.2, heads).astype(np.float32)
    dst, o = s.out(np.float32, x.size)
    t = T.Mamba2(x=s.put(x), dt=s.put(dt), a=s.put(a), b=s.put(bb), c=s.put(cc), dst=dst, batch=batch, seq=seq,
                 heads=heads, head_dim=p, state_size=n)
    f64 = lambda v: np.abs(v.astype(np.float64))
    magnitude = mamba2_quadratic(f64(x), f64(dt), -f64(a), f64(bb), f64(cc))
    name = f"Mamba2-b{batch}-s{seq}-h{heads}-p{p}-n{n}"
    s.add(name, t, [o], atol=RTOL * magnitude.reshape(-1))
    return name


def unit_rows(s: Suite, *shape: int) -> np.ndarray:
    """Normal rows scaled to unit length along the last axis (the caller L2-normalizes q and k)."""
    x = s.normal(*shape).astype(np.float64)
    return (x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-3)).astype(np.float32)


def within_max(got: np.ndarray, want: np.ndarray) -> None:
    """Within RTOL·(|want| + max|want|) (the DeltaNet update subtracts: no per-element magnitude bound)."""
    scale = np.max(np.abs(want.astype(np.float64)), initial=0.0)
    assert_close(got, want, RTOL, RTOL * scale)


def deltanet_fields(s: Suite, batch: int, seq: int, heads: int, n: int, per_channel: bool, carry: bool) -> dict:
    """Input slots and shape fields of a DeltaNet thunk: unit q, k, normal v, g ∈ [−1, 0), β ∈ [0, 1)."""
    gate_shape = (batch, seq, heads, n) if per_channel else (batch, seq, heads)
    return dict(q=s.put(unit_rows(s, batch, seq, heads, n)), k=s.put(unit_rows(s, batch, seq, heads, n)),
                v=s.put(s.normal(batch, seq, heads, n)),
                g=s.put(s.rng.uniform(-1.0, 0.0, gate_shape).astype(np.float32)),
                beta=s.put(s.rng.uniform(0.0, 1.0, (batch, seq, heads)).astype(np.float32)),
                state=s.put(s.normal(batch, heads, n, n)) if carry else 0, batch=batch, seq=seq, heads=heads,
                state_size=n, gate_per_channel=per_channel, carry_state=carry)


def deltanet_name(kind: str, t) -> str:
    gate = "channel" if t.gate_per_channel else "scalar"
    return f"{kind}-b{t.batch}-s{t.seq}-h{t.heads}-n{t.state_size}-{gate}{'-carry' if t.carry_state else ''}"


def add_deltanet(s: Suite, batch: int, seq: int, heads: int, n: int, per_channel: bool, carry: bool) -> str:
    """A GatedDeltaNet case; its outputs are dst and (with carry) the state written back."""
    fields = deltanet_fields(s, batch, seq, heads, n, per_channel, carry)
    dst, _ = s.out(np.float32, batch * seq * heads * n)
    t = T.GatedDeltaNet(dst=dst, **fields)
    name = deltanet_name("GatedDeltaNet", t)
    s.add(name, t, dtype=np.float32, compare=within_max)
    return name


def by_part(t: T.GatedDeltaNetBackward) -> "Callable[[np.ndarray, np.ndarray], None]":
    """Compare a packed gradient bundle part by part (dq, dk, …: each `within_max` of its own size)."""
    def compare(got: np.ndarray, want: np.ndarray) -> None:
        at = 0
        for name, count in t.parts():
            within_max(got[at:at + count], want[at:at + count])
            at += count
    return compare


def add_backward(s: Suite, batch: int, seq: int, heads: int, n: int, per_channel: bool, carry: bool) -> str:
    """A GatedDeltaNetBackward case with normal dy; the bundle compared part by part."""
    fields = deltanet_fields(s, batch, seq, heads, n, per_channel, carry)
    dy = s.put(s.normal(batch, seq, heads, n))
    t = T.GatedDeltaNetBackward(dy=dy, dst=0, **fields)
    dst, _ = s.out(np.float32, sum(count for _, count in t.parts()))
    t = dataclasses.replace(t, dst=dst)
    name = deltanet_name("GatedDeltaNetBackward", t)
    s.add(name, t, dtype=np.float32, compare=by_part(t))
    return name


def build() -> Suite:
    s = Suite(21, rtol=RTOL)
    for seq in (0, 1, 13):
        for n in (W - 1, W, W + 1):
            add_selective_scan(s, 2, seq, 11, n)      # 11 rows: whole groups of neighbours, then single rows
            add_mamba2(s, 2, seq, 3, 11, n)
    add_selective_scan(s, 1, 9, 3, 1)
    add_selective_scan(s, 1, 6, 2, 128)
    add_selective_scan(s, 2, 40, 64, 17)          # rows split across threads
    add_selective_scan(s, 2, 17, 40, 16)          # blocks of 16 channels split across threads, a tail of 8
    # 9 blocks of a 64-byte line: groups of 8 and 1, chunks of 64 + 6 steps, a tail of 3
    add_selective_scan(s, 1, 70, 9 * 16 + 3, 4)
    add_selective_scan_extremes(s, 12, 19, 5)
    add_selective_scan_extremes(s, 70, 2 * 16 + 3, 66)   # the first chunk fast, the second checked
    add_mamba2(s, 1, 7, 2, 3, 1)
    add_mamba2(s, 1, 5, 2, 4, 128)
    add_mamba2(s, 2, 30, 4, 16, 17)               # blocks split across threads
    add_mamba2(s, 1, 70, 2, 2 * 4 * W + 3, 3)     # two blocks of 4 vectors and a tail per head, two chunks
    for per_channel in (False, True):
        for carry in (False, True):
            for seq, n in ((0, W), (1, W - 1), (9, W + 1)):
                add_deltanet(s, 2, seq, 3, n, per_channel, carry)
            # 10 tokens: checkpoints every 4, a last chunk of 2
            add_backward(s, 2, 10, 3, W - 1 if carry else W + 1, per_channel, carry)
        add_backward(s, 2, 1, 3, W, per_channel, per_channel)
        add_deltanet(s, 1, 3, 1, 128, per_channel, True)
        add_deltanet(s, 2, 12, 4, 17, per_channel, True)   # (batch, head) pairs split across threads
    add_backward(s, 1, 0, 2, W, False, True)               # no tokens: dstate = 0
    add_backward(s, 2, 12, 4, 17, True, True)              # (batch, head) pairs split across threads
    add_backward(s, 1, 3, 1, 128, False, True)
    return s


SUITE = build()
(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


def inputs(outcome, t, *fields_shapes) -> list[np.ndarray]:
    """The case's input buffers (float64) as the named (field, shape) pairs."""
    return [f32_at(outcome.before, getattr(t, f), *shape).astype(np.float64) for f, shape in fields_shapes]


@pytest.mark.parametrize("case", [c.name for c in SUITE.cases if c.name.startswith("SelectiveScan")
                                  and "-s0-" not in c.name])
def test_selective_scan_matches_quadratic_form(outcome, case: str) -> None:
    t = outcome.case(case).thunk
    b, s, d, n = t.batch, t.seq, t.hidden, t.state_size
    x, delta, a, bb, cc = inputs(outcome, t, ("x", (b, s, d)), ("delta", (b, s, d)), ("a", (d, n)),
                                 ("b", (b, s, n)), ("c", (b, s, n)))
    want = selective_scan_quadratic(x, delta, a, bb, cc)
    assert_close(outcome.output(case), want.reshape(-1), RTOL, outcome.case(case).atol, case)


@pytest.mark.parametrize("case", [c.name for c in SUITE.cases if c.name.startswith("Mamba2") and "-s0-" not in c.name])
def test_mamba2_matches_quadratic_form(outcome, case: str) -> None:
    t = outcome.case(case).thunk
    b, s, h, p, n = t.batch, t.seq, t.heads, t.head_dim, t.state_size
    x, dt, a, bb, cc = inputs(outcome, t, ("x", (b, s, h, p)), ("dt", (b, s, h)), ("a", (h,)),
                              ("b", (b, s, h, n)), ("c", (b, s, h, n)))
    want = mamba2_quadratic(x, dt, a, bb, cc)
    assert_close(outcome.output(case), want.reshape(-1), RTOL, outcome.case(case).atol, case)


def deltanet_by_the_spec(q, k, v, g, beta, state) -> tuple[np.ndarray, np.ndarray]:
    """semantics.md §3.9 element by element in float64: (outputs `[b,s,h,n]`, final state `[b,h,n,n]`)."""
    b, seq, h, n = q.shape
    out, S = np.zeros(q.shape), state.copy()
    for bi, hi in np.ndindex(b, h):
        M = S[bi, hi]
        for t in range(seq):
            for i in range(n):
                M[i, :] *= np.exp(g[bi, t, hi, i] if g.ndim == 4 else g[bi, t, hi])
            for j in range(n):
                sk = sum(M[i, j] * k[bi, t, hi, i] for i in range(n))
                d = (v[bi, t, hi, j] - sk) * beta[bi, t, hi]
                for i in range(n):
                    M[i, j] += k[bi, t, hi, i] * d
            for j in range(n):
                out[bi, t, hi, j] = sum(M[i, j] * q[bi, t, hi, i] for i in range(n)) / np.sqrt(n)
    return out, S


def deltanet_inputs(outcome, t) -> list[np.ndarray]:
    """q, k, v, g, beta and the initial state (zeros without carry) of a case, float64."""
    b, s, h, n = t.batch, t.seq, t.heads, t.state_size
    gate = (b, s, h, n) if t.gate_per_channel else (b, s, h)
    state = (f32_at(outcome.before, t.state, b, h, n, n).astype(np.float64) if t.carry_state
             else np.zeros((b, h, n, n)))
    return [*inputs(outcome, t, ("q", (b, s, h, n)), ("k", (b, s, h, n)), ("v", (b, s, h, n)), ("g", gate),
                    ("beta", (b, s, h))), state]


@pytest.mark.parametrize("case", [c.name for c in SUITE.cases if c.name.startswith("GatedDeltaNet-")
                                  and c.thunk.state_size <= W + 1 and 0 < c.thunk.seq <= 9])
def test_deltanet_matches_the_spec_element_by_element(outcome, case: str) -> None:
    t = outcome.case(case).thunk
    out, final = deltanet_by_the_spec(*deltanet_inputs(outcome, t))
    within_max(outcome.output(case), out.reshape(-1))
    if t.carry_state:
        within_max(f32_at(outcome.got, t.state, final.size), final.reshape(-1))


# ── the backward: finite differences and a generic reverse-mode autograd ────

class Var:
    """A float64 array on a reverse-mode tape (+, −, ·, e^x, sums, indexing): the chain rule done generically,
    independent of the hand-derived backward."""

    def __init__(self, value, parents: tuple = ()) -> None:
        self.value, self.parents, self.grad = np.asarray(value, np.float64), parents, None

    @staticmethod
    def of(x) -> "Var":
        return x if isinstance(x, Var) else Var(x)

    def __add__(self, other) -> "Var":
        other = Var.of(other)
        return Var(self.value + other.value, ((self, lambda g: g), (other, lambda g: g)))

    def __sub__(self, other) -> "Var":
        other = Var.of(other)
        return Var(self.value - other.value, ((self, lambda g: g), (other, lambda g: -g)))

    def __mul__(self, other) -> "Var":
        other = Var.of(other)
        return Var(self.value * other.value, ((self, lambda g: g * other.value), (other, lambda g: g * self.value)))

    def exp(self) -> "Var":
        e = np.exp(self.value)
        return Var(e, ((self, lambda g: g * e),))

    def sum(self, axis=None) -> "Var":
        shape = self.value.shape
        grow = (lambda g: np.broadcast_to(g, shape)) if axis is None else (
            lambda g: np.broadcast_to(np.expand_dims(g, axis), shape))
        return Var(self.value.sum(axis), ((self, grow),))

    def __getitem__(self, index) -> "Var":
        def scatter(g: np.ndarray) -> np.ndarray:
            z = np.zeros_like(self.value)
            z[index] += g
            return z
        return Var(self.value[index], ((self, scatter),))

    def backward(self) -> None:
        """Gradients of this scalar into every Var it depends on (`grad`), in reverse topological order."""
        order, seen = [], set()

        def visit(v: Var) -> None:
            if id(v) not in seen:
                seen.add(id(v))
                for parent, _ in v.parents:
                    visit(parent)
                order.append(v)
        visit(self)
        self.grad = np.ones_like(self.value)
        for v in reversed(order):
            for parent, vjp in v.parents:
                g = unbroadcast(vjp(v.grad), parent.value.shape)
                parent.grad = g if parent.grad is None else parent.grad + g


def unbroadcast(g: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum a broadcast gradient back to `shape`."""
    g = g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
    return g.sum(axis=tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1), keepdims=True)


def autograd_gradients(q, k, v, g, beta, state, dy) -> list[np.ndarray]:
    """∂(Σ dy·o)/∂(q, k, v, g, beta, state) through the recurrence written with `Var` ops."""
    leaves = [Var(a) for a in (q, k, v, g, beta, state)]
    q_, k_, v_, g_, beta_, S = leaves
    n, loss = q.shape[-1], Var(0.0)
    for t in range(q.shape[1]):
        alpha = g_[:, t].exp()
        S = S * (alpha[:, :, :, None] if g.ndim == 4 else alpha[:, :, None, None])
        kt = k_[:, t][:, :, :, None]
        d = (v_[:, t] - (S * kt).sum(2)) * beta_[:, t][:, :, None]
        S = S + kt * d[:, :, None, :]
        o = (S * q_[:, t][:, :, :, None]).sum(2) * (1.0 / np.sqrt(n))
        loss = loss + (o * dy[:, t]).sum()
    loss.backward()
    return [leaf.grad if leaf.grad is not None else np.zeros_like(leaf.value) for leaf in leaves]


def finite_differences(q, k, v, g, beta, state, dy, eps: float = 1e-6, samples: int = 16) -> list[np.ndarray]:
    """Central differences of Σ dy·o (the float64 reference forward) in `samples` random elements of every
    input (NaN at the others)."""
    x = ref.DeltaNetInputs(q, k, v, g, beta, state)
    loss = lambda y: float((ref.deltanet_forward(y)[0] * dy).sum())
    rng, grads = np.random.default_rng(5), []
    for name, a in zip(x._fields, x):
        fd = np.full_like(a, np.nan)
        for flat in rng.choice(a.size, min(samples, a.size), replace=False):
            i = np.unravel_index(flat, a.shape)
            up, down = a.copy(), a.copy()
            up[i] += eps
            down[i] -= eps
            fd[i] = (loss(x._replace(**{name: up})) - loss(x._replace(**{name: down}))) / (2 * eps)
        grads.append(fd)
    return grads


def native_gradients(outcome, case: str) -> list[np.ndarray]:
    """The packed bundle of a backward case split into its parts (dstate zeros without carry)."""
    t = outcome.case(case).thunk
    bundle, at, parts = outcome.output(case).astype(np.float64), 0, []
    for name, count in t.parts():
        parts.append(bundle[at:at + count])
        at += count
    return parts


def backward_cases(max_seq: int) -> list[str]:
    return [c.name for c in SUITE.cases if c.name.startswith("GatedDeltaNetBackward")
            and 0 < c.thunk.seq <= max_seq and c.thunk.state_size <= W + 1]


@pytest.mark.parametrize("case", backward_cases(10))
@pytest.mark.parametrize("derive", [finite_differences, autograd_gradients])
def test_backward_matches_an_independent_derivative(outcome, case: str, derive) -> None:
    """The native gradients, and the float64 reference's (to 1e-7), against central differences in float64 /
    a generic reverse-mode autograd of the recurrence."""
    t = outcome.case(case).thunk
    x = deltanet_inputs(outcome, t)
    dy = f32_at(outcome.before, t.dy, *x[0].shape).astype(np.float64)
    want = derive(*x, dy)
    hand = ref.deltanet_backward(ref.DeltaNetInputs(*x), dy)
    for (name, count), got, expect, exact in zip(t.parts(), native_gradients(outcome, case), want, hand):
        if count:
            expect, exact = expect.reshape(-1), exact.reshape(-1)
            sampled = ~np.isnan(expect)      # finite differences sample some elements
            scale = np.abs(exact).max()
            assert_close(got[sampled], expect[sampled], RTOL, RTOL * scale, f"d{name}")
            assert_close(exact[sampled], expect[sampled], 1e-7, 1e-7 * scale, f"d{name} (reference)")


# ── bad input ────────────────────────────────────────────────────────────────

SLOT = 1 << 18     # room for n = 129 (a 129 × 129 state, 2 heads)
LAST = 8 * SLOT    # the slot of the buffer a test makes too short

def selective_scan(**changes) -> T.SelectiveScan:
    """b = 1, s = 2, hidden 3, n 4: every buffer in its own slot, b last."""
    fields = dict(x=0, delta=SLOT, a=2 * SLOT, c=3 * SLOT, dst=4 * SLOT, b=LAST, batch=1, seq=2, hidden=3, state_size=4)
    return T.SelectiveScan(**(fields | changes))


def mamba2(**changes) -> T.Mamba2:
    """b = 1, s = 2, 2 heads of 3, n 4: every buffer in its own slot, c last."""
    fields = dict(x=0, dt=SLOT, a=2 * SLOT, b=3 * SLOT, dst=4 * SLOT, c=LAST, batch=1, seq=2, heads=2, head_dim=3, state_size=4)
    return T.Mamba2(**(fields | changes))


def deltanet(**changes) -> T.GatedDeltaNet:
    """b = 1, s = 2, 2 heads, n 4, per-channel gate, carry: every buffer in its own slot, state last."""
    fields = dict(q=0, k=SLOT, v=2 * SLOT, g=3 * SLOT, beta=4 * SLOT, dst=5 * SLOT, state=LAST, batch=1, seq=2,
                  heads=2, state_size=4, gate_per_channel=True, carry_state=True)
    return T.GatedDeltaNet(**(fields | changes))


def deltanet_backward(**changes) -> T.GatedDeltaNetBackward:
    """The same shapes as `deltanet`, dy last."""
    fields = dict(q=0, k=SLOT, v=2 * SLOT, g=3 * SLOT, beta=4 * SLOT, dst=5 * SLOT, state=6 * SLOT, dy=LAST,
                  batch=1, seq=2, heads=2, state_size=4, gate_per_channel=True, carry_state=True)
    return T.GatedDeltaNetBackward(**(fields | changes))


@pytest.mark.parametrize("make", [selective_scan, mamba2, deltanet, deltanet_backward])
def test_state_above_128_is_refused(make) -> None:
    expect_invalid(make(state_size=129), 1 << 22, "state_size", "above 128")


@pytest.mark.parametrize("make,field,needed", [(selective_scan, "b", 4 * 2 * 4), (mamba2, "c", 4 * 2 * 2 * 4),
                                               (deltanet, "state", 4 * 2 * 4 * 4),
                                               (deltanet_backward, "dy", 4 * 2 * 2 * 4)])
def test_buffer_too_short_is_refused(make, field: str, needed: int) -> None:
    expect_invalid(make(), LAST + needed - 1, field)
