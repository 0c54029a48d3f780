"""Element-wise thunks against the NumPy reference: every op × indexing path × dtype, one compile.

All cases live in one schedule (compiled once per module); each output is compared with the
reference run on a copy of the same arena: bit-exact (any NaN matches any NaN) for exact ops,
within a tolerance for transcendental ones.
"""
from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import rlx_llvm as rl
from rlx_llvm import reference as ref
from rlx_llvm import thunks as T
from rlx_llvm.ops import Activation, BinaryOp, CmpOp
from tests.harness import WIDTHS, W, Outcome, Suite, assert_same, f32_values, f64_values, suite_tests

N = 4 * W + 3  # four vector iterations plus a tail
SIZES = (0, 1, W - 1, W, W + 1, 1_000_003)

I64_SPECIALS = np.array([0, 1, -1, 2, -2, 63, 64, 65, -64, 2**31, -2**31, 2**62, 2**63 - 1, -2**63, 1000, -7],
                        dtype=np.int64)

TRIG_ACTS = {Activation.Sin, Activation.Cos, Activation.Tan}
TRIG_LIMIT = 1e5  # f64 sin/cos/tan reduce exactly only for |x| ≲ 1e13 (f32: every finite x)
EXACT_ACTS = {Activation.Relu, Activation.Neg, Activation.Abs, Activation.Round, Activation.Floor,
              Activation.Ceil, Activation.Sign}
INEXACT_OPS = {BinaryOp.Pow, BinaryOp.Atan2}


# ── data ────────────────────────────────────────────────────────────────────

def i64_values(n: int, seed: int) -> np.ndarray:
    """Small random ints with the i64 extremes sprinkled in."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-1000, 1000, n, dtype=np.int64)
    if n:
        k = min(n, I64_SPECIALS.size)
        x[rng.choice(n, k, replace=False)] = I64_SPECIALS[:k]
    return x


def bool_values(n: int, seed: int) -> np.ndarray:
    """Random 0/1 bytes."""
    return np.random.default_rng(seed).integers(0, 2, n, dtype=np.uint8)


def c64_values(n: int, seed: int) -> np.ndarray:
    """Interleaved complex pairs (2·n f32) with specials in both parts."""
    return np.stack([f32_values(n, seed), f32_values(n, seed + 7777)], axis=1).reshape(-1)


MAKERS = {"f32": f32_values, "f64": f64_values, "i64": i64_values, "bool": bool_values, "c64": c64_values}
NP_DTYPE = {"f32": np.float32, "f64": np.float64, "i64": np.int64, "bool": np.uint8, "c64": np.float32,
            "u32": np.uint32, "u64": np.uint64}
ITEMSIZE = {"f32": 4, "f64": 8, "i64": 8, "bool": 1, "c64": 8, "u32": 4, "u64": 8}


# ── one schedule of many cases ──────────────────────────────────────────────

def data(s: Suite, kind: str, n: int, values: "np.ndarray | None" = None) -> tuple[int, np.ndarray]:
    """A slot holding `n` elements of `kind` (random + specials, seeded by the slot count, unless `values`)."""
    arr = np.asarray(MAKERS[kind](n, len(s.inputs) + 1) if values is None else values, NP_DTYPE[kind])
    return s.put(arr), arr


def add(s: Suite, name: str, thunk, outputs: list, **how) -> None:
    """Register a case whose outputs are `(offset, kind, count)` (a c64 count is of complex pairs)."""
    s.add(name, thunk, [(off, np.dtype(NP_DTYPE[kind]), count * (2 if kind == "c64" else 1))
                        for off, kind, count in outputs], **how)


# ── BinaryFull family ───────────────────────────────────────────────────────

KIND_OF = {4: "f32", 8: "i64"}


def bcast_strides(shape: tuple, out: tuple) -> tuple[int, ...]:
    """NumPy broadcasting strides of `shape` (right-aligned) inside `out`: 0 on size-1/missing axes."""
    shape = (1,) * (len(out) - len(shape)) + tuple(shape)
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(0 if d == 1 else acc)
        acc *= d
    return tuple(reversed(strides))


def binary_case(bd: Suite, name: str, kind: str, op: BinaryOp, n: int, lhs_len: int, rhs_len: int,
                out_dims=(), lhs_strides=(), rhs_strides=(), lhs=None, rhs=None) -> None:
    """A BinaryFull / BinaryFullF64 / BinaryFullC64 case over fresh slots."""
    lo, la = data(bd, kind, max(lhs_len, 1), lhs)
    ro, ra = data(bd, kind, max(rhs_len, 1), rhs)
    dst = bd.slot(n * ITEMSIZE[kind])
    common = dict(lhs=lo, rhs=ro, dst=dst, len=n, lhs_len=lhs_len, rhs_len=rhs_len, op=op,
                  out_dims_bcast=tuple(out_dims), bcast_lhs_strides=tuple(lhs_strides),
                  bcast_rhs_strides=tuple(rhs_strides))
    if kind == "f64":
        t = T.BinaryFullF64(**common)
    elif kind == "c64":
        t = T.BinaryFullC64(**common)
    else:
        t = T.BinaryFull(**common, elem_bytes=ITEMSIZE[kind])
    inexact = op in INEXACT_OPS or kind == "c64" and op in (BinaryOp.Mul, BinaryOp.Div)
    rtol = {"f32": 4e-6, "c64": 4e-6, "f64": 1e-14}.get(kind, 0.0) if inexact else 0.0
    add(bd, name, t, [(dst, kind, n)], rtol=rtol, atol=rtol,
           zero_sign=op not in (BinaryOp.Max, BinaryOp.Min))


def bcast_case(bd: Suite, name: str, kind: str, op: BinaryOp, lshape: tuple, rshape: tuple) -> None:
    """A broadcast-path case from two NumPy-broadcastable shapes."""
    out = np.broadcast_shapes(lshape, rshape)
    binary_case(bd, name, kind, op, math.prod(out), math.prod(lshape), math.prod(rshape), out,
                bcast_strides(lshape, out), bcast_strides(rshape, out))


CHEAP_OPS = (BinaryOp.Add, BinaryOp.Sub, BinaryOp.Mul, BinaryOp.Div, BinaryOp.Max, BinaryOp.Min)


def add_binary_cases(bd: Suite) -> None:
    """Every op on the plain and the bidirectional-broadcast path for f32, i64 and f64; the other
    paths (whose loop code does not depend on the op) with the cheap ops; C64's four ops."""
    for op in BinaryOp:
        o = op.name
        for kind in ("f32", "i64", "f64"):
            binary_case(bd, f"{kind}_{o}_plain", kind, op, N, N, N)
            if op in CHEAP_OPS or kind == "f32":
                bcast_case(bd, f"{kind}_{o}_col_x_row", kind, op, (7, 1), (1, W + 3))
        if op not in CHEAP_OPS:
            continue
        bcast_case(bd, f"f32_{o}_rank3_mid", "f32", op, (3, 1, W + 3), (5, 1))
        binary_case(bd, f"f32_{o}_legacy_scalar_lhs", "f32", op, N, 1, N)
        binary_case(bd, f"f32_{o}_legacy_tiled", "f32", op, 5 * (W + 1), 5 * (W + 1), W + 1)
        binary_case(bd, f"f32_{o}_legacy_modular", "f32", op, 60, 12, 10)
        for kind in ("i64", "f64"):
            binary_case(bd, f"{kind}_{o}_legacy_scalar_rhs", kind, op, N, N, 1)
    for op in (BinaryOp.Add, BinaryOp.Sub, BinaryOp.Mul, BinaryOp.Div):
        o = op.name
        binary_case(bd, f"c64_{o}_plain", "c64", op, N, N, N)
        bcast_case(bd, f"c64_{o}_col_x_row", "c64", op, (9, 1), (1, W + 1))
        if op in (BinaryOp.Add, BinaryOp.Mul):
            bcast_case(bd, f"c64_{o}_bias", "c64", op, (6, W - 1), (W - 1,))
            binary_case(bd, f"c64_{o}_legacy_scalar_lhs", "c64", op, N, 1, N)
            binary_case(bd, f"c64_{o}_legacy_tiled", "c64", op, 3 * W, 3 * W, W)
            binary_case(bd, f"c64_{o}_legacy_modular", "c64", op, 24, 8, 6)
    for n in SIZES:
        binary_case(bd, f"f32_Add_size_{n}", "f32", BinaryOp.Add, n, n, n)
    for n in SIZES[:5]:
        bcast_case(bd, f"f32_Mul_col_x_row_{n}", "f32", BinaryOp.Mul, (max(n, 1), 1), (1, n))
        bcast_case(bd, f"f32_Sub_row_bias_{n}", "f32", BinaryOp.Sub, (3, n), (n,))
        binary_case(bd, f"f32_Max_legacy_scalar_{n}", "f32", BinaryOp.Max, n, n, 1)
        binary_case(bd, f"i64_Add_size_{n}", "i64", BinaryOp.Add, n, n, n)
    bcast_case(bd, "f32_Div_large_row_bias", "f32", BinaryOp.Div, (1000, 1001), (1001,))
    bcast_case(bd, "f32_Add_rank4", "f32", BinaryOp.Add, (2, 1, 3, W + 1), (4, 1, 1))
    bcast_case(bd, "f32_Add_scalar_rank0", "f32", BinaryOp.Add, (2, 3, 5), ())
    bcast_case(bd, "f32_Add_inner_splat", "f32", BinaryOp.Add, (5, 1), (5, W + 2))
    # a permuted (transposed) lhs walk: gathers on the innermost axis (rhs_len ≠ len selects the walk)
    for kind in ("f32", "i64", "c64"):
        binary_case(bd, f"{kind}_Mul_transposed_lhs", kind, BinaryOp.Mul, 6 * (W + 1), 6 * (W + 1), W + 1,
                    (W + 1, 6), (1, W + 1), (1, 0))
    binary_case(bd, "i64_Sub_legacy_modular", "i64", BinaryOp.Sub, 60, 12, 10)
    binary_case(bd, "f64_Min_legacy_modular", "f64", BinaryOp.Min, 50, 50, 7)


# ── the rest of the family ──────────────────────────────────────────────────

def add_bias_add_cases(bd: Suite) -> None:
    """BiasAdd over several [m, n]."""
    for m, n in ((5, W + 3), (3, 1), (2, W), (0, 4), (4, 0), (64, 33)):
        so, sa = data(bd, "f32", m * n)
        bo, ba = data(bd, "f32", n)
        dst = bd.slot(m * n * 4)
        add(bd, f"bias_add_{m}x{n}", T.BiasAdd(src=so, bias=bo, dst=dst, m=m, n=n),
               [(dst, "f32", m * n)])


def add_activation_cases(bd: Suite) -> None:
    """Every f32 activation in place; every supported f64 and c64 activation."""
    for act in Activation:
        off, arr = data(bd, "f32", N)
        tol = 0.0 if act in EXACT_ACTS else 4e-6
        add(bd, f"act_{act.name}", T.ActivationInPlace(data=off, len=N, act=act), [(off, "f32", N)],
               rtol=tol, atol=tol, zero_sign=act is not Activation.Relu)  # Relu(−0) = max(−0, 0): either zero
    for n in SIZES[:5]:
        off, arr = data(bd, "f32", n)
        add(bd, f"act_Relu_size_{n}", T.ActivationInPlace(data=off, len=n, act=Activation.Relu),
               [(off, "f32", n)], zero_sign=False)
    off, arr = data(bd, "f32", SIZES[-1])
    add(bd, "act_Gelu_size_large", T.ActivationInPlace(data=off, len=SIZES[-1], act=Activation.Gelu),
           [(off, "f32", SIZES[-1])], rtol=4e-6, atol=4e-6)
    for act in Activation:
        if act in (Activation.Gelu, Activation.GeluApprox, Activation.Silu):
            continue
        so, sa = data(bd, "f64", N)
        if act in TRIG_ACTS:
            sa[np.abs(sa) > TRIG_LIMIT] = TRIG_LIMIT
        dst = bd.slot(N * 8)
        tol = 0.0 if act in EXACT_ACTS else 1e-14
        add(bd, f"act_f64_{act.name}", T.ActivationF64(src=so, dst=dst, len=N, kind=act),
               [(dst, "f64", N)], rtol=tol, atol=tol, zero_sign=act is not Activation.Relu)
    so, sa = data(bd, "f64", N)
    add(bd, "act_f64_in_place_Exp", T.ActivationF64(src=so, dst=so, len=N, kind=Activation.Exp),
           [(so, "f64", N)], rtol=1e-14, atol=1e-14)
    for act in (Activation.Neg, Activation.Exp, Activation.Log, Activation.Sqrt):
        so, sa = data(bd, "c64", N)
        # exp(a + ib) takes cos/sin of b in f64, exact only for |b| ≲ 1e13 (docs/transcendentals.md)
        sa[1::2][np.abs(sa[1::2]) > TRIG_LIMIT] = np.float32(TRIG_LIMIT)
        dst = bd.slot(N * 8)
        tol = 0.0 if act is Activation.Neg else 4e-6
        add(bd, f"act_c64_{act.name}", T.ActivationC64(src=so, dst=dst, len=N, kind=act),
               [(dst, "c64", N)], rtol=tol, atol=tol)


def compare_case(bd: Suite, name: str, op: CmpOp, kind: str, out: str, n: int, *, lhs_scalar=False,
                 rhs_scalar=False, lshape=None, rshape=None) -> None:
    """A Compare case; `lshape`/`rshape` select the broadcast path."""
    dims, ls, rs = (), (), ()
    lhs_len, rhs_len = (1 if lhs_scalar else n), (1 if rhs_scalar else n)
    if lshape is not None:
        dims = np.broadcast_shapes(lshape, rshape)
        n, lhs_len, rhs_len = math.prod(dims), math.prod(lshape), math.prod(rshape)
        ls, rs = bcast_strides(lshape, dims), bcast_strides(rshape, dims)
    lo, la = data(bd, kind, lhs_len)
    ro, ra = data(bd, kind, rhs_len)
    if lhs_len == rhs_len:  # make some pairs equal so Eq/Le/Ge fire
        ra[::3] = la[::3]
    dst = bd.slot(n * ITEMSIZE[out])
    t = T.Compare(lhs=lo, rhs=ro, dst=dst, len=n, op=op, inputs_i64=int(kind == "i64"),
                  inputs_elem_bytes=ITEMSIZE[kind], dst_elem_bytes=ITEMSIZE[out], lhs_scalar=lhs_scalar,
                  rhs_scalar=rhs_scalar, lhs_len=lhs_len, rhs_len=rhs_len, out_dims_bcast=tuple(dims),
                  bcast_lhs_strides=tuple(ls), bcast_rhs_strides=tuple(rs))
    add(bd, name, t, [(dst, out, n)])


def add_compare_cases(bd: Suite) -> None:
    """Every CmpOp × input kind × output kind; scalar operands; the broadcast walk."""
    for op in CmpOp:
        for kind in ("f32", "i64", "bool"):
            for out in ("bool", "f32"):
                compare_case(bd, f"cmp_{op.name}_{kind}_to_{out}", op, kind, out, N)
        compare_case(bd, f"cmp_{op.name}_lhs_scalar", op, "f32", "bool", N, lhs_scalar=True)
        compare_case(bd, f"cmp_{op.name}_rhs_scalar_i64", op, "i64", "f32", N, rhs_scalar=True)
        compare_case(bd, f"cmp_{op.name}_bcast", op, "f32", "bool", 0, lshape=(4, W + 1, 1), rshape=(4, 1, W + 1))
        compare_case(bd, f"cmp_{op.name}_bcast_i64", op, "i64", "f32", 0, lshape=(W + 2,), rshape=(3, 1))
    for n in SIZES[:5]:
        compare_case(bd, f"cmp_Lt_size_{n}", CmpOp.Lt, "f32", "bool", n)


def add_where_cases(bd: Suite) -> None:
    """cond Bool / f32 (with NaN) × data 4 / 8 bytes × every scalar pattern."""
    for cond_kind in ("bool", "f32"):
        for eb in (4, 8):
            for mask in range(8):
                cs, ts, fs = bool(mask & 1), bool(mask & 2), bool(mask & 4)
                n = N
                data_kind = "f32" if eb == 4 else "f64"
                if cond_kind == "f32":
                    cond = np.where(np.random.default_rng(mask).random(n) < 0.5, 0.0, f32_values(n, mask))
                    cond = cond.astype(np.float32)
                    cond[:4] = [np.nan, -0.0, 0.0, np.inf]
                    co, ca = data(bd, "f32", 1 if cs else n, cond[:1] if cs else cond)
                else:
                    co, ca = data(bd, "bool", 1 if cs else n)
                to, ta = data(bd, data_kind, 1 if ts else n)
                fo, fa = data(bd, data_kind, 1 if fs else n)
                dst = bd.slot(n * eb)
                t = T.Where(cond=co, on_true=to, on_false=fo, dst=dst, len=n, elem_bytes=eb,
                            cond_elem_bytes=ITEMSIZE[cond_kind], cond_scalar=cs, true_scalar=ts, false_scalar=fs)
                add(bd, f"where_{cond_kind}_{eb}_{mask}", t,
                       [(dst, "u32" if eb == 4 else "u64", n)])
    for n in SIZES[:5]:
        co, ca = data(bd, "bool", n)
        to, ta = data(bd, "f32", n)
        fo, fa = data(bd, "f32", n)
        dst = bd.slot(n * 4)
        add(bd, f"where_size_{n}", T.Where(cond=co, on_true=to, on_false=fo, dst=dst, len=n, elem_bytes=4,
                                          cond_elem_bytes=1, cond_scalar=False, true_scalar=False,
                                          false_scalar=False), [(dst, "u32", n)])


FMA_HARD_F32 = [  # (a, b, c) where round(round(a·b) + c) ≠ round(a·b + c) in f32
    (1 + 2**-23, 1 - 2**-23, -1.0),
    (1 + 2**-12, 1 + 2**-12, -(1 + 2**-11)),
    (3.0, 1 / 3, -1.0),
    (0.1, 10.0, -1.0),
    (1e-20, 1e-20, 1e-45),
]
FMA_HARD_F64 = [  # the same trap in f64
    (1 + 2**-52, 1 - 2**-52, -1.0),
    (1 + 2**-27, 1 + 2**-27, -(1 + 2**-26)),
    (0.1, 10.0, -1.0),
    (3.0, 1 / 3, -1.0),
    (1e-200, 1e-200, 5e-324),
]


def add_fma_sgd_cases(bd: Suite) -> None:
    """Fma f32/f64 (with double-rounding traps) and SgdMomentum out of place and aliased."""
    for eb, kind in ((4, "f32"), (8, "f64")):
        for n in (N, 1, 0):
            offs = [data(bd, kind, n) for _ in range(3)]
            dst = bd.slot(n * eb)
            t = T.Fma(a=offs[0][0], b=offs[1][0], c=offs[2][0], dst=dst, len=n, elem_bytes=eb)
            add(bd, f"fma_{kind}_{n}", t, [(dst, kind, n)])
    for n in SIZES[:5] + (3 * W + 5,):
        p, v, g = (data(bd, "f32", n) for _ in range(3))
        po, vo = bd.slot(4 * n), bd.slot(4 * n)
        add(bd, f"sgd_{n}", T.SgdMomentum(param=p[0], vel=v[0], grad=g[0], p_out=po, v_out=vo, lr=0.01, mom=0.9,
                                         len=n), [(po, "f32", n), (vo, "f32", n)])
    p, v, g = (data(bd, "f32", N) for _ in range(3))
    add(bd, "sgd_in_place", T.SgdMomentum(param=p[0], vel=v[0], grad=g[0], p_out=p[0], v_out=v[0], lr=0.125,
                                         mom=0.875, len=N), [(p[0], "f32", N), (v[0], "f32", N)])


def add_complex_cases(bd: Suite) -> None:
    """ComplexNormSqF32, its backward, ConjugateC64 over several sizes."""
    for n in SIZES[:5] + (N,):
        so, sa = data(bd, "c64", n)
        dst = bd.slot(4 * n)
        add(bd, f"norm_sq_{n}", T.ComplexNormSqF32(src=so, dst=dst, len=n), [(dst, "f32", n)])
        zo, za = data(bd, "c64", n)
        go, ga = data(bd, "f32", n)
        dz = bd.slot(8 * n)
        add(bd, f"norm_sq_bwd_{n}", T.ComplexNormSqBackwardF32(z=zo, g=go, dz=dz, len=n),
               [(dz, "c64", n)])
        co, ca = data(bd, "c64", n)
        dst = bd.slot(8 * n)
        add(bd, f"conj_{n}", T.ConjugateC64(src=co, dst=dst, len=n), [(dst, "c64", n)])
    co, ca = data(bd, "c64", N)
    add(bd, "conj_in_place", T.ConjugateC64(src=co, dst=co, len=N), [(co, "c64", N)])


SPLINE_GRIDS = {"std": (-2.0, 2.0), "wide": (-5.0, 3.0), "reversed": (2.0, -1.0), "flat": (0.5, 0.5)}


def spline_x(s: Suite, rows: int, ch: int, gmin: float, gmax: float) -> np.ndarray:
    """Normals over the grid, then exact grid points, far-outside values, NaN and ±inf."""
    x = s.normal(rows * ch, scale=1.5 * max(abs(gmax - gmin), 1.0) / 2, shift=(gmin + gmax) / 2)
    special = [gmin, gmax, np.nan, np.inf, -np.inf, 1e30, -40.0, 0.0]
    k = min(x.size, len(special))
    x[s.rng.choice(x.size, k, replace=False)] = np.array(special[:k], np.float32)
    return x


def add_spline(s: Suite, rows: int, ch: int, nb: int, grid: str, tag: str = "", inplace: bool = False) -> None:
    """One SplineActivation over `rows`×`ch` (in place: dst is x)."""
    gmin, gmax = SPLINE_GRIDS[grid]
    x = s.put(spline_x(s, rows, ch, gmin, gmax))
    dst, o = (x, (x, np.dtype(np.float32), rows * ch)) if inplace else s.out(np.float32, rows * ch)
    s.add(f"SplineActivation-{rows}x{ch}-nb{nb}-{grid}{tag}",
          T.SplineActivation(x=x, coeff=s.put(s.normal(ch * nb)), dst=dst, rows=rows, channels=ch, num_basis=nb,
                             grid_min=gmin, grid_max=gmax), [o], rtol=1e-5, atol=1e-5)


def add_spline_cases(s: Suite) -> None:
    """SplineActivation over the norm widths, every grid shape, a threaded size and in place."""
    for ch in WIDTHS:
        for rows in ((0, 1, 7) if ch in (W + 1, 771) else (7,)):
            for nb in (1, 2, 8):
                add_spline(s, rows, ch, nb, "std")
    for grid in SPLINE_GRIDS:
        for nb in (0, 1, 5, 33):
            add_spline(s, 5, W + 3, nb, grid)
    add_spline(s, 97, 771, 8, "std", tag="-threads")
    add_spline(s, 6, 2 * W + 1, 4, "wide", tag="-inplace", inplace=True)


def all_cases() -> Suite:
    """Every case of the family, in one arena."""
    bd = Suite(21)
    add_binary_cases(bd)
    add_bias_add_cases(bd)
    add_activation_cases(bd)
    add_compare_cases(bd)
    add_where_cases(bd)
    add_fma_sgd_cases(bd)
    add_complex_cases(bd)
    add_spline_cases(bd)
    return bd


SUITE = all_cases()

(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


# ── targeted properties ─────────────────────────────────────────────────────

def _round_to_f32(q: Fraction) -> np.float32:
    """The f32 nearest to the exact rational `q` (ties to even)."""
    x = np.float32(float(q))
    cands = [np.nextafter(x, np.float32(-np.inf)), x, np.nextafter(x, np.float32(np.inf))]
    def key(c):
        return (abs(Fraction(float(c)) - q), int(np.array(c).view(np.int32)) & 1)
    return min(cands, key=key)


def test_fma_is_single_rounding() -> None:
    """Inputs where the two-rounding a·b + c differs from the fused result (checked with Fractions)."""
    a, b, c = (np.array([t[k] for t in FMA_HARD_F32], np.float32) for k in range(3))
    a64, b64, c64 = (np.array([t[k] for t in FMA_HARD_F64], np.float64) for k in range(3))
    n = a.size
    arena = rl.Arena(4096)
    for k, arr in enumerate((a, b, c, a64, b64, c64)):
        arena.write(k * 256 + (256 if k > 2 else 0), arr)
    sched = rl.ThunkSchedule([T.Fma(a=0, b=256, c=512, dst=768, len=n, elem_bytes=4),
                              T.Fma(a=1024, b=1280, c=1536, dst=1792, len=n, elem_bytes=8)], arena_bytes=4096)
    rl.compile(sched, cache=False).run(arena)
    got32, got64 = arena.read(768, "f32", n), arena.read(1792, "f64", n)
    two_roundings = (a * b) + c
    exact32 = [Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)) for x, y, z in zip(a, b, c)]
    want32 = np.array([_round_to_f32(q) for q in exact32], np.float32)
    np.testing.assert_array_equal(got32, want32)
    assert (two_roundings != want32).sum() >= 3, "the inputs should expose double rounding"
    want64 = np.array([float(Fraction(x) * Fraction(y) + Fraction(z)) for x, y, z in zip(a64, b64, c64)])
    np.testing.assert_array_equal(got64, want64)
    assert ((a64 * b64) + c64 != want64).sum() >= 3, "the f64 inputs should expose double rounding"
    from rlx_llvm.reference.elementwise import fma_f32, fma_f64
    np.testing.assert_array_equal(fma_f32(a, b, c), want32)
    np.testing.assert_array_equal(fma_f64(a64, b64, c64), want64)


def test_reference_fma_f32_matches_fractions_on_random_inputs() -> None:
    """The round-to-odd reference agrees with exact rational arithmetic."""
    from rlx_llvm.reference.elementwise import fma_f32
    rng = np.random.default_rng(5)
    a = rng.standard_normal(400).astype(np.float32)
    b = rng.standard_normal(400).astype(np.float32)
    c = (-(a.astype(np.float64) * b) * (1 + rng.standard_normal(400) * 1e-7)).astype(np.float32)
    want = np.array([_round_to_f32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
                     for x, y, z in zip(a, b, c)], np.float32)
    np.testing.assert_array_equal(fma_f32(a, b, c), want)


def test_broadcast_hot_loops_have_no_div_or_mod(outcome: Outcome) -> None:
    """The stride walk runs nested loops: no udiv/urem in broadcast or legacy-nesting thunks."""
    names = [n for n in SUITE.names if "col_x_row" in n or "rank3" in n or "legacy_tiled" in n or "bias" in n]
    for name in names:
        ir_text = _loop_functions(outcome.thunk_ir(name))
        assert "urem" not in ir_text and "udiv" not in ir_text, name


def _loop_functions(ir_text: str) -> str:
    """The functions that hold a thunk's loops: its split bodies (`.par<K>`) when it forks across
    threads (the fork's chunk arithmetic runs once, in the caller), else the whole thunk."""
    bodies = re.findall(r"^define [^\n]*\.par\d+\"?\(.*?^}", ir_text, flags=re.M | re.S)
    return "\n".join(bodies) if bodies else ir_text


def test_plain_paths_are_vectorized(outcome: Outcome) -> None:
    assert f"<{W} x float>" in outcome.thunk_ir("f32_Add_plain")
    assert f"<{W // 2} x double>" in outcome.thunk_ir("f64_Add_plain")
    assert f"<{W // 2} x i64>" in outcome.thunk_ir("i64_Add_plain")
    assert f"<{2 * W} x float>" in outcome.thunk_ir("c64_Mul_plain")  # deinterleaving loads


def test_trig_of_huge_arguments() -> None:
    """f32 sin/cos/tan stay accurate up to the largest finite arguments (Payne–Hanek reduction),
    in full vectors and in the scalar tail, mixed with ordinary lanes."""
    bd = Suite()
    big = np.array([3e38, -3e38, 1e38, 1e30, 1e20, 1e10, 2.0 ** 30, -(2.0 ** 30) * 1.5, 3.4028235e38,
                    -1.7014118e38, 6.2831855e9, 1.5707964e12], np.float32)
    x = np.concatenate([big, np.float32([0.5, -2.0, 1e5, np.inf, -np.inf, np.nan]),
                        np.random.default_rng(3).uniform(-3e38, 3e38, 3 * W + 5).astype(np.float32)])
    for act in sorted(TRIG_ACTS, key=lambda a: a.name):
        off, arr = data(bd, "f32", x.size, x)
        add(bd, f"huge_{act.name}", T.ActivationInPlace(data=off, len=x.size, act=act),
               [(off, "f32", x.size)], rtol=4e-6, atol=4e-6)
    checked = bd.run()
    for name in bd.names:
        checked.check(name)


def test_in_place_binary_full() -> None:
    """dst == lhs with an identity walk is allowed and matches the reference."""
    bd = Suite()
    lo, la = data(bd, "f32", N)
    ro, ra = data(bd, "f32", 1)
    t = T.BinaryFull(lhs=lo, rhs=ro, dst=lo, len=N, lhs_len=N, rhs_len=1, op=BinaryOp.Mul, out_dims_bcast=(),
                     bcast_lhs_strides=(), bcast_rhs_strides=(), elem_bytes=4)
    add(bd, "in_place", t, [(lo, "f32", N)])
    bd.run().check("in_place")


# ── hypothesis: random broadcast shapes, one compile per example ────────────

_KINDS = ("f32", "f64", "i64", "c64")
_OPS = (BinaryOp.Add, BinaryOp.Sub, BinaryOp.Mul, BinaryOp.Max, BinaryOp.Min)


@settings(max_examples=3, derandomize=True, deadline=None, database=None, phases=(Phase.explicit, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.tuples(mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, min_side=1,
                                                        max_side=7),
                          st.sampled_from(_KINDS), st.sampled_from(_OPS)), min_size=40, max_size=40))
def test_random_broadcasts_match_reference(cases) -> None:
    """40 random NumPy-broadcastable shape pairs (rank ≤ 4, random size-1 axes) in one schedule."""
    bd = Suite()
    for k, (shapes, kind, op) in enumerate(cases):
        lshape, rshape = shapes.input_shapes
        if kind == "c64" and op in (BinaryOp.Max, BinaryOp.Min):
            op = BinaryOp.Sub
        bcast_case(bd, f"rand{k}", kind, op, lshape, rshape)
    checked = bd.run()
    for name in bd.names:
        checked.check(name)
    # and the reference agrees with NumPy broadcasting itself
    for (shapes, kind, op), c in zip(cases, bd.cases):
        if kind != "f32" or op not in (BinaryOp.Add, BinaryOp.Mul):
            continue
        lshape, rshape = shapes.input_shapes
        la, ra = (checked.before[off:off + 4 * math.prod(shape)].view(np.float32)
                  for off, shape in ((c.thunk.lhs, lshape), (c.thunk.rhs, rshape)))
        want = (np.add if op is BinaryOp.Add else np.multiply)(la.reshape(lshape), ra.reshape(rshape))
        got = checked.output(c.name, arena=checked.want)[:want.size]
        assert_same(got, want.reshape(-1).astype(np.float32))


# ── validation ──────────────────────────────────────────────────────────────

def _bf(**kw):
    base = dict(lhs=0, rhs=256, dst=512, len=16, lhs_len=16, rhs_len=16, op=BinaryOp.Add, out_dims_bcast=(),
                bcast_lhs_strides=(), bcast_rhs_strides=(), elem_bytes=4)
    base.update(kw)
    return T.BinaryFull(**base)


def _cmp(**kw):
    base = dict(lhs=0, rhs=256, dst=512, len=16, op=CmpOp.Lt, inputs_i64=0, inputs_elem_bytes=4, dst_elem_bytes=1,
                lhs_scalar=False, rhs_scalar=False, lhs_len=16, rhs_len=16, out_dims_bcast=(),
                bcast_lhs_strides=(), bcast_rhs_strides=())
    base.update(kw)
    return T.Compare(**base)


def _where(**kw):
    base = dict(cond=0, on_true=256, on_false=512, dst=768, len=16, elem_bytes=4, cond_elem_bytes=1,
                cond_scalar=False, true_scalar=False, false_scalar=False)
    base.update(kw)
    return T.Where(**base)


BAD = [
    ("elem_bytes", _bf(elem_bytes=2)),
    ("bcast_lhs_strides", _bf(len=12, lhs_len=4, rhs_len=3, out_dims_bcast=(4, 3), bcast_lhs_strides=(1,),
                               bcast_rhs_strides=(0, 1))),
    ("bcast_rhs_strides", _bf(len=12, lhs_len=4, rhs_len=3, out_dims_bcast=(4, 3), bcast_lhs_strides=(1, 0),
                               bcast_rhs_strides=(0, 1, 0))),
    ("out_dims_bcast", _bf(len=12, lhs_len=4, rhs_len=3, out_dims_bcast=(4, 4), bcast_lhs_strides=(1, 0),
                            bcast_rhs_strides=(0, 1))),
    ("bcast_lhs_strides", _bf(len=12, lhs_len=4, rhs_len=3, out_dims_bcast=(4, 3), bcast_lhs_strides=(2, 0),
                               bcast_rhs_strides=(0, 1))),
    ("bcast_rhs_strides", _bf(len=12, lhs_len=4, rhs_len=3, out_dims_bcast=(4, 3), bcast_lhs_strides=(1, 0),
                               bcast_rhs_strides=(1, 1))),
    ("dst", _bf(dst=0, len=12, lhs_len=12, rhs_len=3, out_dims_bcast=(4, 3), bcast_lhs_strides=(1, 4),
                bcast_rhs_strides=(0, 1))),
    ("op", T.BinaryFullC64(lhs=0, rhs=256, dst=512, len=16, lhs_len=16, rhs_len=16, op=BinaryOp.Max,
                           out_dims_bcast=(), bcast_lhs_strides=(), bcast_rhs_strides=())),
    ("bcast_lhs_strides", T.BinaryFullF64(lhs=0, rhs=256, dst=512, len=8, lhs_len=4, rhs_len=8, op=BinaryOp.Add,
                                          out_dims_bcast=(8,), bcast_lhs_strides=(1,), bcast_rhs_strides=(1,))),
    ("kind", T.ActivationF64(src=0, dst=256, len=8, kind=Activation.Gelu)),
    ("kind", T.ActivationF64(src=0, dst=256, len=8, kind=Activation.Silu)),
    ("kind", T.ActivationC64(src=0, dst=256, len=8, kind=Activation.Tanh)),
    ("inputs_elem_bytes", _cmp(inputs_elem_bytes=2)),
    ("dst_elem_bytes", _cmp(dst_elem_bytes=2)),
    ("bcast_lhs_strides", _cmp(len=12, lhs_len=4, rhs_len=3, out_dims_bcast=(4, 3), bcast_lhs_strides=(3, 0),
                               bcast_rhs_strides=(0, 1))),
    ("cond_elem_bytes", _where(cond_elem_bytes=2)),
    ("elem_bytes", _where(elem_bytes=2)),
    ("elem_bytes", T.Fma(a=0, b=256, c=512, dst=768, len=16, elem_bytes=2)),
]


@pytest.mark.parametrize("fld,thunk", BAD, ids=[f"{k}-{type(t).__name__}-{i}" for i, (k, t) in enumerate(BAD)])
def test_bad_thunk_is_rejected(fld: str, thunk) -> None:
    with pytest.raises(rl.ValidationError) as info:
        rl.compile(rl.ThunkSchedule([thunk], arena_bytes=4096), cache=False)
    assert info.value.field == fld
    assert repr(fld) in str(info.value)


def test_spline_reference_is_the_formula() -> None:
    """The reference against a literal per-element loop of semantics.md §3.8 in float64 (grid in f32)."""
    rows, ch, nb, gmin, gmax = 3, 4, 6, -1.5, 2.5
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(rows * ch) * 2).astype(np.float32)
    coeff = rng.standard_normal(ch * nb).astype(np.float32)
    arena = np.zeros(1024, np.uint8)
    arena[:x.nbytes] = x.view(np.uint8)
    arena[256:256 + coeff.nbytes] = coeff.view(np.uint8)
    ref.REFERENCES[T.SplineActivation](arena, T.SplineActivation(x=0, coeff=256, dst=512, rows=rows, channels=ch,
                                                                   num_basis=nb, grid_min=gmin, grid_max=gmax))
    got = arena[512:512 + 4 * rows * ch].view(np.float32)
    step = (gmax - gmin) / (nb - 1)
    want = [sum(float(coeff[c * nb + g]) * math.exp(-(((float(x[r * ch + c]) - (gmin + g * step)) / step) ** 2))
                for g in range(nb)) for r in range(rows) for c in range(ch)]
    np.testing.assert_allclose(got, np.array(want, np.float32), rtol=1e-6, atol=1e-6)


def test_spline_edge_values(outcome) -> None:
    """NaN x → NaN; ±inf and far-away x → exactly 0; a flat grid (step 0, inv_h = inf) is NaN exactly at the
    grid point, 0 elsewhere; num_basis = 0 gives 0."""
    def y_of(name: str) -> tuple[np.ndarray, np.ndarray]:
        c = outcome.case(name)
        off, _, n = c.outputs[0]
        xs = outcome.before[c.thunk.x:c.thunk.x + 4 * n].view(np.float32)
        return xs, outcome.got[off:off + 4 * n].view(np.float32)
    x, y = y_of(f"SplineActivation-5x{W + 3}-nb5-std")
    assert np.isnan(y[np.isnan(x)]).all() and (y[np.isinf(x) | (np.abs(x) > 1e20)] == 0).all()
    x, y = y_of(f"SplineActivation-5x{W + 3}-nb5-flat")
    assert np.isnan(y[x == 0.5]).all() and (y[(x != 0.5) & ~np.isnan(x)] == 0).all()
    _, y = y_of(f"SplineActivation-5x{W + 3}-nb0-std")
    assert (y == 0).all()
