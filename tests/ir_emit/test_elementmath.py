"""elementmath: every Activation / BinaryOp / CmpOp (f32, f64, i64, c64) against the NumPy reference.

One module holds a kernel per op and type; each test feeds a mix of random and special values
through the `<W x T>` main loop and the scalar tail.  Exact ops are compared bit for bit (NaN ==
NaN); approximate ones in ulp of the reference (bounds as in docs/transcendentals.md).
"""
from __future__ import annotations

import numpy as np
import pytest
from llvmlite import ir

from rlx_llvm.errors import ValidationError
from rlx_llvm.ir_emit import elementmath as em
from rlx_llvm.ops import Activation, BinaryOp, CmpOp
from rlx_llvm.reference import elementmath as ref

from tests.harness import Kernel

A = Activation
F64_ACTS = [a for a in Activation if a not in (A.Gelu, A.GeluApprox, A.Silu)]
C64_ACTS = [A.Neg, A.Exp, A.Log, A.Sqrt]
C64_OPS = [BinaryOp.Add, BinaryOp.Sub, BinaryOp.Mul, BinaryOp.Div]
CASTS = [(8, True), (16, True), (32, True), (64, True), (8, False), (32, False)]


def _act(act, region=False):
    return lambda b, x: em.activation(b, act, x, region=region)


def _cast(bits, signed):
    """`x as iN/uN`, widened to i64 lanes for the harness."""
    def emit(b, x):
        v = em.f32_to_int_sat(b, x, bits, signed)
        if bits == 64:
            return v
        wide = ir.VectorType(ir.IntType(64), v.type.count) if isinstance(v.type, ir.VectorType) else ir.IntType(64)
        return b.sext(v, wide) if signed else b.zext(v, wide)
    return emit


def _complex_binary(op):
    return lambda b, lr, li, rr, ri: em.binary_c64(b, op, (lr, li), (rr, ri))


@pytest.fixture(scope="module")
def k(jit):
    """One kernel per op and element type, all in one module."""
    ks = [Kernel(f"act_{a.name}", _act(a), ins=("f32",)) for a in Activation]
    ks.append(Kernel("act_region_Gelu", _act(A.Gelu, region=True), ins=("f32",)))
    ks += [Kernel(f"act64_{a.name}", (lambda a: lambda b, x: em.activation_f64(b, a, x))(a), ins=("f64",),
                  outs=("f64",), width=8) for a in F64_ACTS]
    ks += [Kernel(f"c64_{a.name}", (lambda a: lambda b, re, im: em.activation_c64(b, a, re, im))(a),
                  ins=("f32", "f32"), outs=("f32", "f32")) for a in C64_ACTS]
    ks += [Kernel(f"bin_{op.name}", (lambda op: lambda b, l, r: em.binary(b, op, l, r))(op)) for op in BinaryOp]
    ks += [Kernel(f"bin64_{op.name}", (lambda op: lambda b, l, r: em.binary_f64(b, op, l, r))(op),
                  ins=("f64", "f64"), outs=("f64",), width=8) for op in BinaryOp]
    ks += [Kernel(f"bini64_{op.name}", (lambda op: lambda b, l, r: em.binary_i64(b, op, l, r))(op),
                  ins=("i64", "i64"), outs=("i64",), width=8) for op in BinaryOp]
    ks += [Kernel(f"binc_{op.name}", _complex_binary(op), ins=("f32",) * 4, outs=("f32", "f32")) for op in C64_OPS]
    ks += [Kernel(f"cmp_{op.name}", (lambda op: lambda b, l, r: em.compare(b, op, l, r))(op), outs=("bool",))
           for op in CmpOp]
    ks += [Kernel(f"cmpi64_{op.name}", (lambda op: lambda b, l, r: em.compare(b, op, l, r))(op),
                  ins=("i64", "i64"), outs=("bool",), width=8) for op in CmpOp]
    ks += [Kernel(f"cast_{bits}_{int(s)}", _cast(bits, s), ins=("f32",), outs=("i64",)) for bits, s in CASTS]
    return jit.build("test_elementmath", ks)


# ── inputs ──────────────────────────────────────────────────────────────────

SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-40, 1.1754944e-38, 1e-30, -1e-30, 1e-8, -1e-8,
           0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, -0.49999997, 1.0, -1.0, 3.0, -3.0, 2.9999998, -2.9999998,
           6.0, -6.0, 8388607.5, 1e10, -1e10, 9.3e18, 9.3e19, -9.3e19, 1e30, -1e30, 3e38, -3e38, 88.7, -88.7,
           100.0, -100.0, -20.0]


def f32_inputs(seed=0, n=3000):
    """Special values, uniform [-10, 10], log-uniform magnitudes 1e-20…1e20 of both signs, half-integers."""
    rng = np.random.default_rng(seed)
    mags = np.exp(rng.uniform(np.log(1e-20), np.log(1e20), n)) * rng.choice([-1, 1], n)
    halves = rng.integers(-1000, 1000, 200) + 0.5
    return np.concatenate([SPECIAL, rng.uniform(-10, 10, n), mags, halves]).astype(np.float32)


def ulp_error(y, want, bits=24):
    emin = -125 if bits == 24 else -1021
    y, want = np.asarray(y, np.float64), np.asarray(want, np.float64)
    with np.errstate(all="ignore"):
        e = np.frexp(np.abs(want))[1].astype(np.int64)
        err = np.abs(y - want) / np.ldexp(1.0, np.maximum(e, emin) - bits)
    same = (y == want) | (np.isnan(y) & np.isnan(want))
    return np.where(same, 0.0, np.nan_to_num(err, nan=np.inf))


def assert_close(got, want, ulps, bits=24, rtol=0.0, atol=0.0, what=""):
    """Equal, or within `ulps` of the reference, or within relative `rtol`, or within `atol`."""
    err = ulp_error(got, want, bits)
    with np.errstate(all="ignore"):
        diff = np.asarray(got, np.float64) - np.asarray(want, np.float64)
        rel = np.abs(diff / np.asarray(want, np.float64))
    bad = (err > ulps) & ~(rel <= rtol) & ~(np.abs(diff) <= atol)
    assert not bad.any(), f"{what}: {list(zip(np.asarray(got)[bad][:6], np.asarray(want)[bad][:6]))}"


def assert_exact(got, want, what=""):
    np.testing.assert_array_equal(got, want, err_msg=what)


# ── activations ─────────────────────────────────────────────────────────────

EXACT_ACTS = {A.Relu, A.Neg, A.Abs, A.Floor, A.Ceil, A.Round, A.Sign, A.Recip, A.Sqrt}
# max ulp; Gelu-type ops also accept relative error 3e-5 for x ≪ 0 (the f32 rounding of the inner
# argument u, |u|·2^-24, is amplified by the steep left tail — the reference gets the exact u).
ACT_ULPS = {A.Gelu: 4, A.GeluApprox: 4, A.Silu: 4, A.Sigmoid: 3, A.Tanh: 2, A.Exp: 2, A.Log: 1, A.Rsqrt: 1,
            A.Sin: 2, A.Cos: 2, A.Tan: 4, A.Atan: 2, A.Softplus: 3, A.Elu: 2, A.Erf: 2, A.HardSwish: 2,
            A.HardSigmoid: 1, A.Mish: 4, A.Softsign: 1, A.LogSigmoid: 3}
RTOL_ACTS = {A.Gelu: 3e-5, A.GeluApprox: 3e-5, A.Mish: 3e-6}
# results in the denormal range carry the error of a denormal intermediate (σ(x) or e^x for x < −87)
ATOL_ACTS = {A.Gelu: 1e-39, A.GeluApprox: 1e-39, A.Silu: 1e-39, A.Mish: 1e-39}


def _inputs_for(act, x):
    if act in (A.Sin, A.Cos, A.Tan):
        return x[~(np.abs(x) > 1e12)]
    return x


@pytest.mark.parametrize("act", list(Activation), ids=[a.name for a in Activation])
def test_activation_f32(k, act):
    x = _inputs_for(act, f32_inputs())
    got, want = k[f"act_{act.name}"](x), ref.activation(act, x)
    if act in EXACT_ACTS:
        assert_exact(got, want, act.name)
    else:
        assert_close(got, want, ACT_ULPS[act], rtol=RTOL_ACTS.get(act, 0.0), atol=ATOL_ACTS.get(act, 0.0),
                     what=act.name)


def test_gelu_tanh_dense_sweep(k):
    """The exp2 tanh Gelu (`vm.scaled_by_sigmoid2`) on 2^20 points of [−12, 12] and 2^18 magnitudes up to
    3e38: ≤ 2 ulp for x ≥ 0 and ≤ 7 ulp on [−2, 0); further left, the f32 rounding of u (|2u|·2^−24,
    the reference takes u exact) bounds the relative error by 2e-5; denormal results within 1e-39."""
    mags = np.exp(np.linspace(np.log(1e-30), np.log(3e38), 1 << 17))
    x = np.concatenate([np.linspace(-12, 12, 1 << 20), mags, -mags]).astype(np.float32)
    got, want = k["act_GeluApprox"](x), ref.activation(A.GeluApprox, x)
    err = ulp_error(got, want)
    normal = np.abs(want) >= 2.0 ** -126
    assert err[normal & (x >= 0)].max() <= 2 and err[normal & (x >= -2) & (x < 0)].max() <= 7
    with np.errstate(all="ignore"):
        rel = np.abs((got.astype(np.float64) - want) / want)
    assert np.nanmax(np.where(normal, rel, 0)) <= 2e-5
    assert np.abs(got[~normal].astype(np.float64) - want[~normal]).max() <= 1e-39


def test_silu_dense_sweep(k):
    """Silu = `vm.scaled_by_sigmoid(x, x)` on 2^20 points of [−110, 40] and 2^18 magnitudes up to 3e38: ≤ 3.5
    ulp (exhaustive over 1/16 ≤ |x| < 128: 3.15), denormal results (x < −87) within 2e−45 (1.3 denormal ulp)."""
    mags = np.exp(np.linspace(np.log(1e-30), np.log(3e38), 1 << 17))
    x = np.concatenate([np.linspace(-110, 40, 1 << 20), mags, -mags]).astype(np.float32)
    got, want = k["act_Silu"](x), ref.activation(A.Silu, x)
    normal = np.abs(want) >= 2.0 ** -126
    assert ulp_error(got, want)[normal].max() <= 3.5
    assert np.abs(got[~normal].astype(np.float64) - want[~normal]).max() <= 2e-45


def test_region_gelu_is_tanh_form(k):
    x = f32_inputs(1)
    got = k["act_region_Gelu"](x)
    assert_close(got, ref.activation(A.Gelu, x, region=True), 4, rtol=3e-5, atol=1e-39, what="region Gelu")
    np.testing.assert_array_equal(got, k["act_GeluApprox"](x))
    with np.errstate(invalid="ignore"):
        assert np.nanmax(np.abs(ref.activation(A.Gelu, x, region=True) - ref.activation(A.Gelu, x))) > 1e-4


def test_activation_specific_rules(k):
    f = np.float32
    nan, inf = np.nan, np.inf
    assert k["act_Relu"](f([nan, -0.0, -1.0, 2.0])).tolist() == [0.0, 0.0, 0.0, 2.0]
    assert k["act_Sign"](f([nan, 0.0, -0.0, -3.0, 1e-45])).tolist() == [0.0, 0.0, 0.0, -1.0, 1.0]
    assert k["act_Round"](f([0.5, -0.5, 1.5, 2.5, -2.5, 0.49999997])).tolist() == [1.0, -1.0, 2.0, 3.0, -3.0, 0.0]
    assert k["act64_Round"](np.array([0.5, 1.5, 2.5, -2.5])).tolist() == [0.0, 2.0, 2.0, -2.0]
    assert k["act_Softplus"](f([inf, -inf, 100.0])).tolist() == [inf, 0.0, 100.0]
    assert k["act_LogSigmoid"](f([inf, -inf])).tolist() == [0.0, -inf]
    assert np.isnan(k["act_HardSigmoid"](f([nan]))).all()
    assert k["act_HardSigmoid"](f([-3.0, 3.0, -inf, inf])).tolist() == [0.0, 1.0, 0.0, 1.0]
    assert k["act_Elu"](f([1e-30]))[0] == f(1e-30) and k["act_Elu"](f([-1e-30]))[0] == f(-1e-30)
    assert k["act_Gelu"](f([inf, 0.0]))[:1].tolist() == [inf]
    # RLX's own Gelu uses A&S 7.1.26 (abs err ≈ 1.5e-7 in erf); ours is at least that accurate
    x = np.linspace(-8, 8, 200001, dtype=np.float32)
    assert np.abs(k["act_Gelu"](x) - ref.activation(A.Gelu, x)).max() < 0.5 * 8 * 1.5e-7


@pytest.mark.parametrize("act", F64_ACTS, ids=[a.name for a in F64_ACTS])
def test_activation_f64(k, act):
    x = f32_inputs(2).astype(np.float64) * (1 + 1e-9)
    x = _inputs_for(act, x)
    got, want = k[f"act64_{act.name}"](x), ref.activation_f64(act, x)
    if act in EXACT_ACTS:
        assert_exact(got, want, act.name)
    else:
        assert_close(got, want, 5, bits=53, rtol=1e-15 if act is not A.Tan else 1e-14, what=act.name)


def test_activation_f64_rejects_gelu_silu():
    fn = ir.Function(ir.Module(), ir.FunctionType(ir.DoubleType(), [ir.DoubleType()]), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    for act in (A.Gelu, A.GeluApprox, A.Silu):
        with pytest.raises(ValidationError):
            em.activation_f64(b, act, fn.args[0])
    f = ir.Constant(ir.FloatType(), 1.0)
    with pytest.raises(ValidationError):
        em.activation_c64(b, A.Tanh, f, f)
    with pytest.raises(ValueError):
        ref.activation_f64(A.Gelu, np.zeros(1))


def _complex_inputs(seed=3):
    rng = np.random.default_rng(seed)
    s = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-40, 3e38, -4.0, 1e-20], np.float32)
    sr, si = (g.ravel() for g in np.meshgrid(s, s))
    n = 2000
    re = (rng.standard_normal(n) * np.exp(rng.uniform(-10, 10, n))).astype(np.float32)
    im = (rng.standard_normal(n) * np.exp(rng.uniform(-10, 10, n))).astype(np.float32)
    small = rng.uniform(-5, 5, (2, n)).astype(np.float32)
    return np.concatenate([sr, re, small[0]]), np.concatenate([si, im, small[1]])


@pytest.mark.parametrize("act", C64_ACTS, ids=[a.name for a in C64_ACTS])
def test_activation_c64(k, act):
    re, im = _complex_inputs()
    if act is A.Exp:
        keep = ~(np.abs(im) > 1e12)
        re, im = re[keep], im[keep]
    got, want = k[f"c64_{act.name}"](re, im), ref.activation_c64(act, re, im)
    for g, w, part in zip(got, want, ("re", "im")):
        if act in (A.Neg, A.Sqrt):
            assert_exact(g, w, f"{act.name}.{part}")
        else:   # f64 transcendental, rounded once: at most 1 f32 ulp from the float64 oracle
            assert_close(g, w, 1, rtol=1e-12, what=f"{act.name}.{part}")


def test_complex_conventions(k):
    f = np.float32
    re, im = k["c64_Sqrt"](f([-4.0, -4.0, 0.0, 4.0]), f([0.0, -0.0, 0.0, 0.0]))
    assert re.tolist() == [0.0, 0.0, 0.0, 2.0] and im.tolist() == [2.0, 2.0, 0.0, 0.0]
    re, im = k["c64_Exp"](f([np.inf, 0.0]), f([0.0, np.pi / 2]))
    assert re[0] == np.inf and im[0] == 0.0 and abs(im[1] - 1) < 1e-7
    re, im = k["c64_Log"](f([0.0, -1.0]), f([0.0, 0.0]))
    assert re[0] == -np.inf and abs(im[1] - np.pi) < 1e-6


# ── binary ops ──────────────────────────────────────────────────────────────

def _pairs(seed=4):
    rng = np.random.default_rng(seed)
    s = np.array(SPECIAL[:30] + [7.0, -7.0, 64.0, 63.0, 65.0, 1e10, 4.5], np.float32)
    sl, sr = (g.ravel() for g in np.meshgrid(s, s))
    n = 3000
    l = np.concatenate([sl, rng.uniform(-100, 100, n), rng.standard_normal(n) * np.exp(rng.uniform(-20, 20, n))])
    r = np.concatenate([sr, rng.uniform(-100, 100, n), rng.standard_normal(n) * np.exp(rng.uniform(-20, 20, n))])
    ints_l, ints_r = rng.integers(-70, 70, (2, 1000))
    return (np.concatenate([l, ints_l]).astype(np.float32), np.concatenate([r, ints_r]).astype(np.float32))


EXACT_BINARY = set(BinaryOp) - {BinaryOp.Pow, BinaryOp.Atan2}


@pytest.mark.parametrize("op", list(BinaryOp), ids=[o.name for o in BinaryOp])
def test_binary_f32(k, op):
    l, r = _pairs()
    got, want = k[f"bin_{op.name}"](l, r), ref.binary(op, l, r)
    if op in EXACT_BINARY:
        assert_exact(got, want, op.name)
    else:
        assert_close(got, want, 1.0 if op is BinaryOp.Pow else 2.5, what=op.name)


@pytest.mark.parametrize("op", list(BinaryOp), ids=[o.name for o in BinaryOp])
def test_binary_f64(k, op):
    l, r = (v.astype(np.float64) * (1 + 1e-10) for v in _pairs(5))
    if op in (BinaryOp.Shl, BinaryOp.Shr, BinaryOp.BitAnd, BinaryOp.BitOr, BinaryOp.BitXor):
        l, r = _pairs(5)
        l, r = l.astype(np.float64), r.astype(np.float64)
    got, want = k[f"bin64_{op.name}"](l, r), ref.binary_f64(op, l, r)
    if op in EXACT_BINARY:
        assert_exact(got, want, op.name)
    else:
        assert_close(got, want, 2.5, bits=53, rtol=1e-13 if op is BinaryOp.Pow else 0.0, what=op.name)


def test_binary_rust_rules(k):
    f = np.float32
    nan = np.nan
    assert k["bin_Max"](f([nan, 1.0, nan]), f([2.0, nan, nan]))[:2].tolist() == [2.0, 1.0]
    assert k["bin_Min"](f([nan, 1.0]), f([2.0, nan])).tolist() == [2.0, 1.0]
    z = f([0.0, -0.0, -0.0, 0.0] * 5), f([-0.0, 0.0, -0.0, 0.0] * 5)
    assert np.signbit(k["bin_Max"](*z)).tolist() == [False, False, True, False] * 5      # max(−0, +0) = +0
    assert np.signbit(k["bin_Min"](*z)).tolist() == [True, True, True, False] * 5        # min(−0, +0) = −0
    assert not np.signbit(k["act_Relu"](f([-0.0] * 20))).any()
    assert k["bin_Mod"](f([-7.0, 7.0, 5.5]), f([3.0, -3.0, 2.0])).tolist() == [-1.0, 1.0, 1.5]
    assert k["bin_BitAnd"](f([7.9, -1.5, nan, 1e30]), f([3.2, 5.0, 3.0, 1.0])).tolist() == [3.0, 5.0, 0.0, 1.0]
    assert k["bin_Shl"](f([1.0, 1.0, 1.0, 3.0]), f([3.0, 64.0, -1.0, 65.9])).tolist() == [8.0, 1.0, 1.0, 6.0]
    assert k["bin_Shr"](f([-8.0, 8.0]), f([1.0, 2.0])).tolist() == [-4.0, 2.0]
    pw = k["bin_Pow"](f([-8.0, 0.0, nan, 1.0, -2.0]), f([1 / 3, 0.0, 0.0, nan, 3.0]))
    assert pw[1:].tolist() == [1.0, 1.0, 1.0, -8.0]
    assert np.isnan(k["bin_Pow"](f([-8.0]), f([1 / 3])))[0]


I64_SPECIAL = [0, 1, -1, 2, -2, 3, 7, -7, 63, 64, 65, -64, 2**62, 2**63 - 1, -2**63, 12345678901, -98765]


def _int_pairs(seed=6):
    rng = np.random.default_rng(seed)
    s = np.array(I64_SPECIAL, np.int64)
    sl, sr = (g.ravel() for g in np.meshgrid(s, s))
    big = rng.integers(-2**63, 2**63 - 1, (2, 2000), dtype=np.int64)
    small = rng.integers(-100, 100, (2, 2000), dtype=np.int64)
    return np.concatenate([sl, big[0], small[0]]), np.concatenate([sr, big[1], small[1]])


@pytest.mark.parametrize("op", list(BinaryOp), ids=[o.name for o in BinaryOp])
def test_binary_i64(k, op):
    l, r = _int_pairs()
    if op is BinaryOp.Pow:
        rng = np.random.default_rng(8)
        l = np.concatenate([l, rng.integers(-5, 6, 2000)])
        r = np.concatenate([r, rng.integers(-3, 70, 2000)])
    assert_exact(k[f"bini64_{op.name}"](l, r), ref.binary_i64(op, l, r), op.name)


def test_i64_rules(k):
    i = np.int64
    mn = -2**63
    div = k["bini64_Div"](np.array([7, -7, 7, mn, 5], i), np.array([2, 2, 0, -1, -1], i))
    assert div.tolist() == [3, -3, 0, mn, -5]
    assert k["bini64_Mod"](np.array([7, -7, 7, mn], i), np.array([3, 3, 0, -1], i)).tolist() == [1, -1, 0, 0]
    assert k["bini64_Pow"](np.array([2, 3, -1, -1, 1, 2, 0], i), np.array([10, 0, -3, -2, -5, -1, 0], i)).tolist() == \
        [1024, 1, -1, 1, 1, 0, 1]
    assert k["bini64_Pow"](np.array([2], i), np.array([64], i)).tolist() == [0]          # wraps
    assert k["bini64_Shl"](np.array([1, 1], i), np.array([64, 65], i)).tolist() == [1, 2]  # masked


@pytest.mark.parametrize("op", C64_OPS, ids=[o.name for o in C64_OPS])
def test_binary_c64(k, op):
    (lr, li), (rr, ri) = _complex_inputs(10), _complex_inputs(11)
    got = k[f"binc_{op.name}"](lr, li, rr, ri)
    want = ref.binary_c64(op, (lr, li), (rr, ri))
    for g, w, part in zip(got, want, ("re", "im")):
        assert_exact(g, w, f"{op.name}.{part}")



# ── comparisons and casts ───────────────────────────────────────────────────

@pytest.mark.parametrize("op", list(CmpOp), ids=[o.name for o in CmpOp])
def test_compare(k, op):
    l, r = _pairs(12)
    assert_exact(k[f"cmp_{op.name}"](l, r).astype(bool), ref.compare(op, l, r), op.name)
    li, ri = _int_pairs(13)
    assert_exact(k[f"cmpi64_{op.name}"](li, ri).astype(bool), ref.compare(op, li, ri), op.name)


def test_compare_nan(k):
    nan = np.float32(np.nan)
    one = np.ones(3, np.float32)
    for op in CmpOp:
        assert k[f"cmp_{op.name}"](np.full(3, nan), one).tolist() == [op is CmpOp.Ne] * 3


@pytest.mark.parametrize("bits,signed", CASTS)
def test_f32_to_int_sat(k, bits, signed):
    x = f32_inputs(14)
    got = k[f"cast_{bits}_{int(signed)}"](x)
    want = ref.float_to_int_sat(x, bits, signed)
    if not signed and bits == 64:
        want = want.view(np.int64)
    np.testing.assert_array_equal(got, want.astype(np.int64))


# ── loop shapes ─────────────────────────────────────────────────────────────

@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 1000])
def test_sizes_through_the_loop(k, n):
    rng = np.random.default_rng(n)
    x = rng.uniform(-5, 5, n).astype(np.float32)
    y = rng.uniform(0.1, 3, n).astype(np.float32)
    assert_close(k["act_Tanh"](x), ref.activation(A.Tanh, x), 2, what="Tanh")
    assert_close(k["bin_Pow"](y, x), ref.binary(BinaryOp.Pow, y, x), 1, what="Pow")
    assert_exact(k["bin_Mod"](x, y), ref.binary(BinaryOp.Mod, x, y), "Mod")
    li = rng.integers(-1000, 1000, n)
    assert_exact(k["bini64_Div"](li, li // 7), ref.binary_i64(BinaryOp.Div, li, li // 7), "i64 Div")
    xd = x.astype(np.float64)
    assert_close(k["act64_Erf"](xd), ref.activation_f64(A.Erf, xd), 4, bits=53, what="f64 Erf")
    assert k["cmp_Lt"](x, y).shape == (n,)
