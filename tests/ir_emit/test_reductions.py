"""Softmax, Reduce, ReduceSumF64, ArgReduce, TopK, Cumsum, CumScan, Histogram and CumsumBackward against
the NumPy references — one schedule, compiled once (tests/harness.py) — and CumsumBackward's reference
against the transposed Jacobian of Cumsum's."""
from __future__ import annotations

import numpy as np
import pytest

from rlx_llvm import thunks as T
from rlx_llvm.dtypes import DType
from rlx_llvm.ops import ReduceOp
from tests.harness import (HUGE, WIDTHS, W, Outcome, Suite, expect_invalid, f32_at, forward_matrix, run_reference,
                           suite_tests)

SHAPES = ((3, 1, 1), (4, W - 1, 1), (2, W, 1), (3, W + 1, 1), (5, 4 * W + 3, 1), (1, HUGE, 1),    # contiguous
          (2, 7, 3), (3, 40, W), (2, 9, W + 4), (1, 1, 33), (2, 3, 1000))                         # inner > 1
THREADED = ((129, 1000, 1), (3, 300, 97))  # ≥ 256 KiB: rows (or row × position blocks) split over threads


def with_specials(s: Suite, n: int, scale: float = 1.0) -> np.ndarray:
    """Normals with NaN, +inf and −inf planted (n ≥ 8) and some exact ties."""
    x = s.normal(n, scale=scale)
    if n >= 8:
        x[s.rng.choice(n, 3, replace=False)] = [np.nan, np.inf, -np.inf]
        x[s.rng.choice(n, 2, replace=False)] = x[0]
    return x


def sum_tolerance(x: np.ndarray, outer: int, reduced: int, inner: int) -> np.ndarray:
    """Per output: 1e-6·Σ|x| (+1e-6) — the scale of a reassociated f32 sum's rounding."""
    a = np.abs(x.astype(np.float64)).reshape(outer, reduced, inner).sum(axis=1).reshape(-1)
    return np.nan_to_num(2e-6 * a, posinf=0.0) + 1e-6


def add_softmax(s: Suite) -> None:
    for outer, cols, inner in SHAPES + THREADED + ((4, 1024, 1), (2, 1, 1)):
        n = outer * cols * inner
        x = s.normal(n, scale=3.0).reshape(outer, cols, inner)
        if cols >= 4:
            x[0, 1, 0] = -np.inf                      # exp(−inf − m) = 0
            if outer > 1:
                x[1, :, 0] = x[1, 0, 0]               # a constant column: uniform 1/cols
        if outer > 2 and cols >= 2:
            x[2, 0, 0] = np.nan                       # NaN poisons its row
        data = s.put(x.reshape(-1))
        s.add(f"Softmax-{outer}x{cols}x{inner}", T.Softmax(data=data, rows=outer * inner, cols=cols, inner=inner),
              [(data, np.dtype(np.float32), n)], rtol=1e-5, atol=1e-6)
    rows = s.normal(3 * 20, scale=5.0).reshape(3, 20)
    rows[0, 3], rows[1, :], rows[2, :] = np.inf, -np.inf, 80.0   # +inf → NaN row, all −inf → NaN, large equal
    data = s.put(rows.reshape(-1))
    s.add("Softmax-specials", T.Softmax(data=data, rows=3, cols=20, inner=1), [(data, np.dtype(np.float32), 60)],
          rtol=1e-5, atol=1e-6)


def add_reduce(s: Suite) -> None:
    for outer, reduced, inner in SHAPES + THREADED + ((3, 0, 2), (2, 0, 1), (1, 1, 5)):
        n = outer * reduced * inner
        for op in ReduceOp:
            if op is ReduceOp.Prod:
                x = (1.0 + 0.01 * s.normal(n)).astype(np.float32)
                x[: min(n, 2) // 2] = 0.0
                tol = dict(rtol=1e-4 if reduced > 1000 else 2e-5, atol=1e-6)
            elif op in (ReduceOp.Max, ReduceOp.Min):
                x = with_specials(s, n)
                if n and outer > 1 and reduced:
                    x.reshape(outer, reduced, inner)[1, :, 0] = np.nan   # all-NaN → ∓inf
                tol = dict(exact=True)
            else:
                x = s.normal(n, scale=1.0, shift=0.3)
                atol = sum_tolerance(x, outer, reduced, inner) / (max(reduced, 1) if op is ReduceOp.Mean else 1)
                tol = dict(rtol=1e-6, atol=atol)
            dst, o = s.out(np.float32, outer * inner)
            s.add(f"Reduce-{op.name}-{outer}x{reduced}x{inner}",
                  T.Reduce(src=s.put(x), dst=dst, outer=outer, reduced=reduced, inner=inner, op=op), [o], **tol)
        x = s.rng.standard_normal(n)
        dst, o = s.out(np.float64, outer * inner)
        s.add(f"ReduceSumF64-{outer}x{reduced}x{inner}",
              T.ReduceSumF64(src=s.put(x), dst=dst, outer=outer, reduced=reduced, inner=inner), [o],
              rtol=1e-12, atol=1e-12 * (1 + reduced))


def add_arg_reduce(s: Suite) -> None:
    for outer, reduced, inner in SHAPES + THREADED:
        n = outer * reduced * inner
        for is_max in (True, False):
            x = np.round(with_specials(s, n, 2.0)).astype(np.float32)   # many ties
            dst, o = s.out(np.float32, outer * inner)
            s.add(f"ArgReduce-{'max' if is_max else 'min'}-{outer}x{reduced}x{inner}",
                  T.ArgReduce(src=s.put(x), dst=dst, outer=outer, reduced=reduced, inner=inner, is_max=is_max), [o],
                  exact=True)


def add_top_k(s: Suite) -> None:
    for outer, n, k in ((3, 1, 1), (4, W + 1, 1), (4, W + 1, W + 1), (3, 100, 8), (2, 5, 9), (6, 1000, 8),
                        (2, 2 * W + 1, 2 * W + 1), (5, 40, 3), (3, 4 * W, W), (3, 4 * W, W + 1), (4, 300, 40),
                        (2, 64, 0), (301, 1000, 8), (77, 1000, 40)):
        for i64 in (0, 1):
            x = np.round(with_specials(s, outer * n, 3.0)).astype(np.float32).reshape(outer, n)
            if outer > 1:
                x[0, 0] = np.nan                 # NaN at 0 is chosen in round one only
                x[1, 0] = -np.inf                # −inf at 0 comes after every finite value
            dst, o = s.out(np.int64 if i64 else np.float32, outer * k)
            s.add(f"TopK-{outer}x{n}-k{k}-i64{i64}",
                  T.TopK(src=s.put(x.reshape(-1)), dst=dst, outer=outer, axis_dim=n, k=k, indices_i64=i64), [o],
                  exact=True)


def add_scans(s: Suite) -> None:
    for rows, cols in ((3, 1), (2, W - 1), (2, W), (3, W + 1), (2, 1000), (1, HUGE), (3, HUGE)):
        n = rows * cols
        for exclusive in (False, True):
            x = s.normal(n)
            atol = 2e-6 * np.cumsum(np.abs(x.astype(np.float64)).reshape(rows, cols), axis=1).reshape(-1) + 1e-6
            dst, o = s.out(np.float32, n)
            s.add(f"Cumsum-f32-{rows}x{cols}-ex{int(exclusive)}",
                  T.Cumsum(src=s.put(x), dst=dst, rows=rows, cols=cols, exclusive=exclusive, dtype=DType.F32), [o],
                  rtol=1e-6, atol=atol)
            xi = s.rng.integers(-2**62, 2**62, n, dtype=np.int64)   # wraps: i64 adds are modular
            dst, o = s.out(np.int64, n)
            s.add(f"Cumsum-i64-{rows}x{cols}-ex{int(exclusive)}",
                  T.Cumsum(src=s.put(xi), dst=dst, rows=rows, cols=cols, exclusive=exclusive, dtype=DType.I64), [o])
            for is_max in (False, True):
                x = with_specials(s, n) if is_max else (1.0 + 0.001 * s.normal(n)).astype(np.float32)
                dst, o = s.out(np.float32, n)
                s.add(f"CumScan-{'max' if is_max else 'prod'}-{rows}x{cols}-ex{int(exclusive)}",
                      T.CumScan(src=s.put(x), dst=dst, rows=rows, cols=cols, exclusive=exclusive, is_max=is_max), [o],
                      exact=is_max, rtol=min(1e-4, 1e-7 * cols + 1e-6), atol=0)
    off = s.put(s.normal(40))
    s.add("Cumsum-inplace", T.Cumsum(src=off, dst=off, rows=2, cols=20, exclusive=False, dtype=DType.F32),
          [(off, np.dtype(np.float32), 40)])


def add_histogram(s: Suite) -> None:
    for n, bins, lo, hi in ((1000, 10, -1.0, 1.0), (37, 1, 0.0, 0.0), (50, 5, 1.0, -1.0), (100, 7, -2.5, 0.3),
                            (0, 3, 0.0, 1.0), (HUGE, 256, -3.0, 3.0), (W + 1, 4, -np.inf, 0.0), (20, 0, 0.0, 1.0)):
        x = with_specials(s, n)
        if n >= 8:   # both edges, just inside max, exactly representable interior points
            x[:5] = [hi, lo, np.nextafter(np.float32(hi), np.float32(-np.inf)), 0.0, 0.0]
        dst, o = s.out(np.float32, bins)
        s.add(f"Histogram-{n}-b{bins}-[{lo},{hi}]", T.Histogram(src=s.put(x), dst=dst, n=n, bins=bins, min=lo, max=hi),
              [o], exact=True)


def add_cumsum_backward(s: Suite) -> None:
    """CumsumBackward over the norm widths (NaN and ±inf in dy), a threaded size and in place."""
    shapes = [(rows, cols) for cols in WIDTHS for rows in ((0, 1, 5) if cols == 771 else (5,))] + [(97, 3001)]
    for rows, cols in shapes:
        for exclusive in (False, True):
            dy = s.normal(rows * cols)
            if rows == 5 and cols > 2:
                dy[cols + 1], dy[2 * cols], dy[3 * cols + cols // 2] = np.nan, np.inf, -np.inf
            dx, o = s.out(np.float32, rows * cols)
            s.add(f"CumsumBackward-{rows}x{cols}-ex{int(exclusive)}",
                  T.CumsumBackward(dy=s.put(dy), dx=dx, rows=rows, cols=cols, exclusive=exclusive), [o],
                  rtol=1e-4, atol=1e-4)
    dy = s.put(s.normal(3 * 50))
    s.add("CumsumBackward-inplace", T.CumsumBackward(dy=dy, dx=dy, rows=3, cols=50, exclusive=True),
          [(dy, np.dtype(np.float32), 150)], rtol=1e-4, atol=1e-4)


def build() -> Suite:
    s = Suite(6, rtol=2e-5, atol=2e-5)
    add_softmax(s)
    add_reduce(s)
    add_arg_reduce(s)
    add_top_k(s)
    add_scans(s)
    add_histogram(s)
    add_cumsum_backward(s)
    return s


SUITE = build()


(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


def test_top_k_edge_rules(outcome: Outcome) -> None:
    """k > axis_dim repeats index 0; a NaN at 0 is picked first; a −inf at 0 comes last."""
    def indices(name):
        off, dtype, count = outcome.case(name).outputs[0]
        return outcome.got[off:off + count * dtype.itemsize].view(dtype)
    assert list(indices("TopK-2x5-k9-i641").reshape(2, 9)[:, 5:].ravel()) == [0] * 8
    full = indices(f"TopK-4x{W + 1}-k{W + 1}-i641").reshape(4, W + 1)
    assert full[0, 0] == 0 and full[1, -1] == 0


def test_histogram_drops_and_edges(outcome: Outcome) -> None:
    """min == max puts exact hits in the last bin; min > max counts nothing."""
    def counts(name):
        off, _, bins = outcome.case(name).outputs[0]
        return outcome.got[off:off + 4 * bins].view(np.float32)
    assert counts("Histogram-37-b1-[0.0,0.0]")[0] >= 3
    assert not counts("Histogram-50-b5-[1.0,-1.0]").any()


# ── bad inputs: one per check rule ──────────────────────────────────────────

def test_softmax_inner_must_divide_rows() -> None:
    expect_invalid(T.Softmax(data=0, rows=10, cols=4, inner=3), 4096, "inner")


def test_softmax_inner_at_least_one() -> None:
    expect_invalid(T.Softmax(data=0, rows=10, cols=4, inner=0), 4096, "inner")


def test_arg_reduce_needs_elements() -> None:
    expect_invalid(T.ArgReduce(src=0, dst=1024, outer=2, reduced=0, inner=3, is_max=True), 4096, "reduced")


def test_top_k_needs_a_row() -> None:
    expect_invalid(T.TopK(src=0, dst=1024, outer=2, axis_dim=0, k=3, indices_i64=0), 4096, "axis_dim")


def test_cumsum_dtype_is_f32_or_i64() -> None:
    expect_invalid(T.Cumsum(src=0, dst=1024, rows=2, cols=3, exclusive=False, dtype=DType.I32), 4096, "dtype")


@pytest.mark.parametrize("exclusive", [False, True])
def test_cumsum_backward_is_the_transpose_of_cumsum(exclusive: bool) -> None:
    rows, cols = 2, 9
    cumsum = T.Cumsum(src=0, dst=1024, rows=rows, cols=cols, exclusive=exclusive, dtype=DType.F32)
    fwd = lambda e, m: f32_at(run_reference(cumsum, 2048, {0: e}), 1024, m)  # noqa: E731
    jac = forward_matrix(fwd, rows * cols, rows * cols)
    dy = np.random.default_rng(3).standard_normal(rows * cols).astype(np.float32)
    got = f32_at(run_reference(T.CumsumBackward(dy=0, dx=1024, rows=rows, cols=cols, exclusive=exclusive), 2048,
                          {0: dy}), 1024, rows * cols)
    np.testing.assert_allclose(got, jac @ dy.astype(np.float64), rtol=1e-6, atol=1e-6)
