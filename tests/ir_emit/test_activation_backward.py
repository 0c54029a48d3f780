"""ReluBackward[F64] and ActivationBackward[F64] against the NumPy reference, all in one compile.

Every case lives in one schedule over one guarded arena (tests/harness.py).  Exact derivatives (Relu, Neg, Abs,
Round, Floor, Ceil, Sign) must match bit for bit (any NaN matches any NaN); the others within
`ulps·eps·(|want| + c·|dy|)`, where c = 1 only for the kinds whose derivative has a zero crossing
made of two cancelling terms (Gelu, GeluApprox, Silu) and 0 otherwise.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import reference as ref
from rlx_llvm import thunks as T
from rlx_llvm import registry
from rlx_llvm.registry import load_all
from rlx_llvm.ir_emit.parallel import THREADS_SYMBOL, fork_symbol
from rlx_llvm.ops import Activation
from rlx_llvm.reference import elementmath as rem
from rlx_llvm.reference.activation_backward import DECOMPOSED, derivative
from tests.harness import F32_SPECIALS, F64_SPECIALS, W, Outcome, Suite, f32_values, f64_values, suite_tests

A = Activation
ACTS = [a for a in Activation if a not in DECOMPOSED]
EXACT = {A.Relu, A.Neg, A.Abs, A.Round, A.Floor, A.Ceil, A.Sign}
CANCEL = {A.Gelu, A.GeluApprox, A.Silu}
ULPS = {A.Tan: 5}                        # measured ≤ 3.4 ulp for f'(x), + 1 for the multiply by dy
DEFAULT_ULPS = 4                          # measured ≤ 2.9 (Sigmoid, Tanh), most ≤ 1
WF64 = max(1, W // 2)
SIZES = (0, 1, W - 1, W, W + 1)
LARGE = 1_000_003
DT = {"f32": np.float32, "f64": np.float64}
DY_SPECIALS = [1.0, -1.0, 0.0, -0.0, 2.5, -0.75, np.inf, -np.inf, np.nan, 1e-40, 3e38]
RELU = {"f32": T.ReluBackward, "f64": T.ReluBackwardF64}
ACT = {"f32": T.ActivationBackward, "f64": T.ActivationBackwardF64}


# ── data ────────────────────────────────────────────────────────────────────

def specials_grid(kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Every special x against every special dy."""
    xs = F32_SPECIALS if kind == "f32" else F64_SPECIALS
    x = np.repeat(xs, len(DY_SPECIALS)).astype(DT[kind])
    dy = np.tile(np.array(DY_SPECIALS), len(xs)).astype(DT[kind])
    return x, dy


def wide_values(kind: str, n: int, seed: int) -> np.ndarray:
    """Normals (with specials), log-uniform magnitudes over the whole range, and a dense ramp."""
    rng = np.random.default_rng(seed)
    top = 38 if kind == "f32" else 300
    k = n // 3
    base = (f32_values if kind == "f32" else f64_values)(n - 2 * k, seed)
    wide = np.sign(rng.standard_normal(k)) * 10.0 ** rng.uniform(-top - 6, top, k)
    ramp = np.linspace(-30.0, 30.0, k)
    return np.concatenate([base, wide, ramp]).astype(DT[kind])


def tame_trig(kind: str, act: Activation, x: np.ndarray) -> np.ndarray:
    """f64 sin/cos/tan reduce exactly only for |x| ≲ 1e13 (docs/transcendentals.md)."""
    if kind == "f64" and act in (A.Sin, A.Cos, A.Tan):
        x[np.isfinite(x) & (np.abs(x) > 1e5)] = 1e5
    return x


# ── cases ───────────────────────────────────────────────────────────────────

def tolerance(act: Activation | None) -> float:
    """0 for exact kinds, else the ulp budget."""
    if act is None or act in EXACT:
        return 0.0
    return float(ULPS.get(act, DEFAULT_ULPS))


def add(bd: Suite, name: str, kind: str, cls, n: int, x: np.ndarray, dy: np.ndarray, act=None,
        alias: str = "") -> None:
    """One case; `alias` in {"", "dx=dy", "dx=x", "x=dy"} places buffers on top of each other."""
    x = x.astype(DT[kind])
    dy = x if alias == "x=dy" else dy.astype(DT[kind])
    xo = bd.put(x)
    dyo = xo if alias == "x=dy" else bd.put(dy)
    dxo = {"dx=dy": dyo, "dx=x": xo}[alias] if alias.startswith("dx") else bd.slot(x.nbytes)
    fields = dict(x=xo, dy=dyo, dx=dxo, len=n)
    if act is not None:
        fields["kind"] = act
    ulps = tolerance(act)
    compare = functools.partial(assert_within_ulps, dy=dy, ulps=ulps, c=float(act in CANCEL)) if ulps else None
    bd.add(name, cls(**fields), [(dxo, np.dtype(DT[kind]), n)], compare=compare)


def add_kind_cases(bd: Suite) -> None:
    """Every supported kind, f32 and f64: the specials grid, then wide random data."""
    for kind in ("f32", "f64"):
        x, dy = specials_grid(kind)
        add(bd, f"relu_{kind}_grid", kind, RELU[kind], x.size, x, dy)
        for act in ACTS:
            add(bd, f"{act.name}_{kind}_grid", kind, ACT[kind], x.size, tame_trig(kind, act, x.copy()), dy, act)
        for k, act in enumerate(ACTS):
            n = 3 * 1000 + 7
            x = tame_trig(kind, act, wide_values(kind, n, 100 + k))
            dy = (f32_values if kind == "f32" else f64_values)(n, 200 + k)
            add(bd, f"{act.name}_{kind}_wide", kind, ACT[kind], n, x, dy, act)
        n = 3 * 1000 + 7
        add(bd, f"relu_{kind}_wide", kind, RELU[kind], n, wide_values(kind, n, 7),
            (f32_values if kind == "f32" else f64_values)(n, 8))


def add_size_cases(bd: Suite) -> None:
    """Sizes 0, 1, W−1, W, W+1 (and the f64 vector width ± 1), plus one large run per kernel."""
    for kind, act in (("f32", A.Gelu), ("f64", A.Silu)):
        sizes = sorted(set(SIZES + (WF64 - 1, WF64, WF64 + 1)) - {-1})
        for n in sizes + [LARGE]:
            x = (f32_values if kind == "f32" else f64_values)(n, n + 1)
            dy = (f32_values if kind == "f32" else f64_values)(n, n + 2)
            add(bd, f"relu_{kind}_n{n}", kind, RELU[kind], n, x, dy)
            add(bd, f"{act.name}_{kind}_n{n}", kind, ACT[kind], n, x, dy, act)


def add_alias_cases(bd: Suite) -> None:
    """dx on top of dy, dx on top of x, and x and dy the same buffer."""
    n = 4 * W + 3
    for kind, act in (("f32", A.Silu), ("f64", A.Sigmoid), ("f32", A.Floor)):
        for alias in ("dx=dy", "dx=x", "x=dy"):
            x = (f32_values if kind == "f32" else f64_values)(n, 11)
            dy = (f32_values if kind == "f32" else f64_values)(n, 12)
            tag = alias.replace("=", "_is_")
            add(bd, f"relu_{kind}_{act.name}_{tag}", kind, RELU[kind], n, x, dy, alias=alias)
            add(bd, f"{act.name}_{kind}_{tag}", kind, ACT[kind], n, x, dy, act, alias=alias)


def all_cases() -> Suite:
    """Every case of the family, in one arena."""
    bd = Suite()
    add_kind_cases(bd)
    add_size_cases(bd)
    add_alias_cases(bd)
    return bd


def scaled_error(got: np.ndarray, want: np.ndarray, dy: np.ndarray, c: float) -> np.ndarray:
    """|got − want| / (eps·(|want| + c·|dy|) + 2·denorm·(1 + |dy|)) over the finite wants."""
    fi = np.finfo(got.dtype)
    g, w, d = got.astype(np.float64), want.astype(np.float64), np.abs(dy.astype(np.float64))
    m = np.isfinite(w) & np.isfinite(d)
    den = fi.eps * (np.abs(w[m]) + c * d[m]) + 2.0 * float(fi.smallest_subnormal) * (1.0 + d[m])
    with np.errstate(invalid="ignore"):
        return np.abs(g[m] - w[m]) / den


def assert_within_ulps(got, want, dy, ulps: float, c: float) -> None:
    """Same NaNs and infinities; finite values within `ulps` scaled units."""
    assert np.array_equal(np.isnan(got), np.isnan(want)), \
        f"NaN positions differ at {np.flatnonzero(np.isnan(got) != np.isnan(want))[:5]}"
    inf = np.isinf(want)
    assert np.array_equal(got[inf], want[inf]), f"infinities differ at {np.flatnonzero(got[inf] != want[inf])[:5]}"
    err = scaled_error(got, want, dy, c)
    assert err.size == 0 or err.max() <= ulps, f"max error {err.max():.2f} units > {ulps}"


SUITE = all_cases()

(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


def test_kernels_are_vectorized_and_call_no_libm(outcome: Outcome) -> None:
    assert f"<{W} x float>" in outcome.thunk_ir("Gelu_f32_grid")
    assert f"<{WF64} x double>" in outcome.thunk_ir("Tanh_f64_grid")
    assert f"<{W} x float>" in outcome.thunk_ir("relu_f32_grid")
    declared = [line for line in outcome.program.llvm_ir(optimized=True).splitlines() if line.startswith("declare")]
    assert all("@llvm." in line or f"@{fork_symbol()}(" in line or f"@{THREADS_SYMBOL}(" in line  # a split kernel
               or ".body(" in line for line in declared), declared  # forks; a shared body compiled in another part


# ── the semantics themselves ────────────────────────────────────────────────

def test_edge_values_are_the_documented_ones() -> None:
    """docs/lowering-backward.md, "Edges", spelled out with dy = 1 (and dy = NaN for Relu)."""
    nan, inf = np.nan, np.inf

    def d(act, x, f64=False):
        return derivative(act, np.array(x, np.float64), f64=f64)

    assert np.array_equal(d(A.Relu, [1.0, 0.0, -0.0, -1.0, nan]), [1, 0, 0, 0, 0])
    assert np.array_equal(d(A.Abs, [2.0, 0.0, -0.0, -2.0, nan]), [1, 0, 0, -1, 0])
    assert np.array_equal(d(A.Sqrt, [0.0, -0.0, inf]), [0, 0, 0]) and np.isnan(d(A.Sqrt, [-1.0])).all()
    assert np.array_equal(d(A.Rsqrt, [0.0, -0.0, -4.0, 4.0]), [0, 0, 0, -0.0625])
    assert np.array_equal(d(A.Elu, [nan, 1.0, 0.0, -inf]), [1, 1, 1, 0])
    assert np.array_equal(d(A.Log, [0.0, -0.0, inf]), [inf, -inf, 0])
    assert np.array_equal(d(A.Recip, [0.0, inf]), [-inf, -0.0])
    for act in (A.Gelu, A.GeluApprox, A.Silu):
        assert np.isnan(d(act, [inf, -inf])).all(), act
        assert np.array_equal(d(act, [1e30, -1e30]), [1, 0]), act
    assert np.array_equal(d(A.Round, [nan, 2.5]), [1, 1]) and np.array_equal(d(A.Floor, [nan, 2.5]), [0, 0])
    arena = np.zeros(64, np.uint8)
    arena[:8].view(np.float32)[:] = [nan, -1.0]
    arena[8:16].view(np.float32)[:] = [nan, nan]
    ref.run_thunk(arena, T.ReluBackward(x=0, dy=8, dx=16, len=2))
    assert np.array_equal(arena[16:24].view(np.float32), [0, 0])          # a select: no 0·NaN
    ref.run_thunk(arena, T.ActivationBackward(x=0, dy=8, dx=24, len=2, kind=A.Relu))
    assert np.isnan(arena[24:32].view(np.float32)).all()                   # a product: 0·NaN = NaN


def _forward(act: Activation, x: np.ndarray) -> np.ndarray:
    """The forward activation in float64 (the f64 reference, or the f32 formulas at f64)."""
    if act is A.Gelu:
        from scipy import special
        return 0.5 * x * special.erfc(-x / np.sqrt(2.0))
    if act is A.GeluApprox:
        return x * rem.sigmoid(2.0 * rem.GELU_C0 * (x + rem.GELU_C1 * x**3))
    if act is A.Silu:
        return x * rem.sigmoid(x)
    return rem.activation_f64(act, x)


@pytest.mark.parametrize("act", [a for a in ACTS if a not in (A.Round, A.Floor, A.Ceil, A.Sign)], ids=str)
def test_reference_derivative_is_the_slope_of_the_forward(act: Activation) -> None:
    """Central differences of the forward reference agree with the reference derivative."""
    x = np.concatenate([np.linspace(-6.0, -0.05, 300), np.linspace(0.05, 6.0, 300)])
    if act in (A.Log, A.Sqrt, A.Rsqrt):
        x = np.abs(x)
    if act is A.Tan:
        x = x[np.abs(np.cos(x)) > 0.1]
    h = 1e-6
    slope = (_forward(act, x + h) - _forward(act, x - h)) / (2 * h)
    np.testing.assert_allclose(derivative(act, x), slope, rtol=1e-6, atol=1e-7)


# ── validation ──────────────────────────────────────────────────────────────

@pytest.mark.parametrize("cls", [T.ActivationBackward, T.ActivationBackwardF64], ids=lambda c: c.__name__)
@pytest.mark.parametrize("act", DECOMPOSED, ids=str)
def test_decomposed_kinds_are_refused(cls, act: Activation) -> None:
    t = cls(x=0, dy=256, dx=512, len=8, kind=act)
    load_all()
    with pytest.raises(rl.ValidationError) as info:
        registry.LOWERINGS[cls].check(t)          # the check, before any code is emitted
    assert info.value.field == "kind"
    with pytest.raises(rl.ValidationError) as info:
        rl.compile(rl.ThunkSchedule([t], arena_bytes=4096), cache=False)
    assert info.value.field == "kind" and repr("kind") in str(info.value) and act.name in str(info.value)


@pytest.mark.parametrize("cls", [T.ReluBackward, T.ReluBackwardF64, T.ActivationBackward, T.ActivationBackwardF64],
                         ids=lambda c: c.__name__)
def test_partial_overlap_is_refused(cls) -> None:
    fields = dict(x=0, dy=256, dx=256 + 8, len=16)
    if "kind" in cls.__dataclass_fields__:
        fields["kind"] = A.Tanh
    with pytest.raises(rl.ValidationError) as info:
        rl.compile(rl.ThunkSchedule([cls(**fields)], arena_bytes=4096), cache=False)
    assert info.value.field == "dx"


def test_coverage_lists_the_four_as_native() -> None:
    kinds = ("ReluBackward", "ReluBackwardF64", "ActivationBackward", "ActivationBackwardF64")
    cov = rl.coverage()
    assert {k: cov[k] for k in kinds} == dict.fromkeys(kinds, "llvm")
