"""Graph quantize / requantize / integer_matmul (bit for bit: ties to even, saturation, exact i32 sums) and
dequant_matmul_int4 (float64) against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

import rlx_llvm as rl

M, K, N = 4, 300, 5


@pytest.fixture(scope="module")
def results():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((M, N)) * 40).astype(np.float32)
    x.flat[:6] = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 1e6], np.float32) * 0.25
    a = rng.integers(0, 256, (M, K), dtype=np.uint8)
    b = rng.integers(0, 256, (K, N), dtype=np.uint8)
    scale = np.float32(0.25)
    col_scale = rng.uniform(0.1, 1.0, N).astype(np.float32)
    a_zp, b_zp = np.uint8(7), rng.integers(0, 256, N, dtype=np.uint8)
    mult = np.float32(1e-4)
    block = 32
    codes = rng.integers(0, 16, (K, N))
    q_scale = rng.uniform(0.01, 0.1, (-(-K // block), N)).astype(np.float32)
    q_zero = rng.integers(0, 16, q_scale.shape).astype(np.float32)
    flat = codes.ravel()
    nibbles = (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)
    g = rl.Graph("quant")
    xv, av, bv = g.input("x", [M, N]), g.input("a", [M, K], "u8"), g.input("b", [K, N], "u8")
    acc = g.integer_matmul(av, bv, g.constant(a_zp, "u8"), g.constant(b_zp, "u8"))
    g.set_outputs([g.quantize(xv, g.constant(scale), g.constant(np.int8(3), "i8"), "i8"),
                   g.quantize(xv, g.constant(col_scale), g.constant(np.uint8(128), "u8"), "u8"),
                   acc, g.requantize(acc, g.constant(mult), g.constant(np.uint8(100), "u8"), "u8"),
                   g.dequant_matmul_int4(g.cast(av, "f32"), g.constant(nibbles, "u8"), g.constant(q_scale),
                                         g.constant(q_zero), block)])
    got = rl.Session().compile(g).run({"x": x, "a": a, "b": b})
    exact = (a.astype(np.int64) - a_zp) @ (b.astype(np.int64) - b_zp.astype(np.int64))
    want = [np.clip(np.rint(x / scale) + 3, -128, 127).astype(np.int8),
            np.clip(np.rint(x / col_scale) + 128, 0, 255).astype(np.uint8),
            exact.astype(np.int32),
            np.clip(np.rint(exact * np.float64(mult)) + 100, 0, 255).astype(np.uint8),
            a.astype(np.float64) @ ((codes - q_zero[np.arange(K) // block]) * q_scale[np.arange(K) // block])]
    return got, want


@pytest.mark.parametrize("i", range(4))
def test_matches_numpy_bit_for_bit(results, i):
    got, want = results
    assert got[i].dtype == want[i].dtype
    np.testing.assert_array_equal(got[i], want[i])


def test_dequant_matmul_int4_matches_float64(results):
    got, want = results
    np.testing.assert_allclose(got[4], want[4], rtol=0, atol=1e-5 * np.abs(want[4]).max())


def test_ties_go_to_even(results):
    got, _ = results
    assert (got[0].ravel()[:6] - 3).tolist() == [0, 2, 2, 0, -2, 124]


def test_operands_are_checked():
    g = rl.Graph()
    x = g.input("x", [2, 3])
    with pytest.raises(rl.GraphError, match="quantize"):
        g.quantize(x, g.constant(np.ones(4, np.float32)), g.constant(np.uint8(0), "u8"), "u8")
    with pytest.raises(rl.GraphError, match="integer_matmul"):
        g.integer_matmul(x, x, x, x)
