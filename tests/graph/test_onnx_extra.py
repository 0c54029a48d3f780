"""graph/onnx_extra.py: wide_binary (i64 through BinaryFull's 8-byte lanes, f64 through BinaryFullF64) against
NumPy, with broadcasting; one compiled program for all ops."""
from __future__ import annotations

import numpy as np
import pytest

import rlx_llvm as rl

RNG = np.random.default_rng(15)
I64_RULES = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
             "div": lambda a, b: np.where(b == 0, 0, np.trunc(a / np.where(b == 0, 1, b))).astype(np.int64),
             "mod": lambda a, b: np.where(b == 0, 0, np.fmod(a, np.where(b == 0, 1, b))),
             "bitxor": np.bitwise_xor}
F64_RULES = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "max": np.maximum}


@pytest.fixture(scope="module")
def results():
    g = rl.Graph("wide")
    a, b = g.input("a", [3, 4], "i64"), g.input("b", [4], "i64")
    x, y = g.input("x", [2, 1, 3], "f64"), g.input("y", [4, 1], "f64")
    outs = [g.wide_binary(op, a, b) for op in I64_RULES] + [g.wide_binary(op, x, y) for op in F64_RULES]
    g.set_outputs(outs)
    feeds = {"a": RNG.integers(-50, 50, (3, 4)), "b": np.array([7, -3, 0, 5], np.int64),
             "x": RNG.standard_normal((2, 1, 3)), "y": RNG.standard_normal((4, 1)) + 3.0}
    return feeds, rl.Session().compile(g).run(feeds)


@pytest.mark.parametrize("k, op", list(enumerate(I64_RULES)))
def test_i64(results, k, op):
    feeds, outs = results
    assert outs[k].dtype == np.int64
    np.testing.assert_array_equal(outs[k], I64_RULES[op](feeds["a"], feeds["b"]))


@pytest.mark.parametrize("k, op", list(enumerate(F64_RULES)))
def test_f64(results, k, op):
    feeds, outs = results
    got = outs[len(I64_RULES) + k]
    assert got.dtype == np.float64 and got.shape == (2, 4, 3)
    np.testing.assert_allclose(got, F64_RULES[op](feeds["x"], feeds["y"]), rtol=1e-15)


def test_refuses_mixed_and_float_bits():
    g = rl.Graph("bad")
    with pytest.raises(rl.GraphError, match="must both be i64 or both f64"):
        g.wide_binary("add", g.input("a", [2], "i64"), g.input("b", [2], "f32"))
    with pytest.raises(rl.GraphError, match="bit operations"):
        g.wide_binary("bitand", g.input("x", [2], "f64"), g.input("y", [2], "f64"))
    with pytest.raises(rl.GraphError, match="unknown op"):
        g.wide_binary("atan2", g.input("p", [2], "i64"), g.input("q", [2], "i64"))
    with pytest.raises(rl.GraphError, match="indices must be i32 or i64"):
        g.gather_elements(g.input("d", [2], "f32"), g.input("i", [2], "f32"), 0)
    with pytest.raises(rl.GraphError, match="unknown reduction"):
        g.scatter_nd(g.input("s", [2], "f32"), g.input("j", [1, 1], "i64"), g.input("u", [1], "f32"), "sum")


def test_gathers_and_scatters():
    """gather_elements (i64 data), gather_nd (batch_dims 1), scatter_elements (add), scatter_nd — vs NumPy."""
    g = rl.Graph("index")
    x, t = g.input("x", [3, 4], "f32"), g.input("t", [3, 4], "i64")
    ie, ind = g.input("ie", [2, 4], "i32"), g.input("ind", [3, 1, 1], "i64")
    upd, upd_nd = g.input("upd", [2, 4], "f32"), g.input("upd_nd", [2, 4], "f32")
    nd = g.input("nd", [2, 1], "i64")
    g.set_outputs([g.gather_elements(t, ie, 0), g.gather_nd(x, ind, batch_dims=1),
                   g.scatter_elements(x, ie, upd, 0, "add"), g.scatter_nd(x, nd, upd_nd)])
    feeds = {"x": RNG.standard_normal((3, 4)).astype(np.float32), "t": RNG.integers(-9, 9, (3, 4)),
             "ie": np.array([[0, 2, -1, 1], [2, 2, 0, -3]], np.int32), "ind": np.array([[[3]], [[-1]], [[0]]]),
             "upd": RNG.standard_normal((2, 4)).astype(np.float32),
             "upd_nd": RNG.standard_normal((2, 4)).astype(np.float32), "nd": np.array([[2], [0]])}
    got = rl.Session().compile(g).run(feeds)
    rows = np.where(feeds["ie"] < 0, feeds["ie"] + 3, feeds["ie"])
    np.testing.assert_array_equal(got[0], np.take_along_axis(feeds["t"], rows, 0))
    np.testing.assert_array_equal(got[1], feeds["x"][np.arange(3), [3, 3, 0]][:, None])
    want = feeds["x"].copy()
    np.add.at(want, (rows, np.broadcast_to(np.arange(4), (2, 4))), feeds["upd"])
    np.testing.assert_allclose(got[2], want, rtol=1e-6)
    want = feeds["x"].copy()
    want[[2, 0]] = feeds["upd_nd"]
    np.testing.assert_array_equal(got[3], want)


def test_wide_compare_and_where():
    """i64 comparisons broadcast to bool; Where selects 8-byte (f64) and 4-byte (i32) values, broadcasting."""
    g = rl.Graph("select")
    a, b = g.input("a", [2, 3], "i64"), g.input("b", [3], "i64")
    x, y = g.input("x", [2, 3], "f64"), g.input("y", [], "f64")
    p, q = g.input("p", [2, 1], "i32"), g.input("q", [3], "i32")
    m = g.wide_compare("le", a, b)
    g.set_outputs([m, g.wide_where(m, x, y), g.wide_where(m, p, q)])
    feeds = {"a": RNG.integers(-5, 5, (2, 3)), "b": np.array([0, -2, 4]), "x": RNG.standard_normal((2, 3)),
             "y": np.array(7.0), "p": np.array([[1], [2]], np.int32), "q": np.array([-1, -2, -3], np.int32)}
    mask, sel, sel32 = rl.Session().compile(g).run(feeds)
    want = feeds["a"] <= feeds["b"]
    np.testing.assert_array_equal(mask, want)
    np.testing.assert_array_equal(sel, np.where(want, feeds["x"], 7.0))
    np.testing.assert_array_equal(sel32, np.where(want, feeds["p"], feeds["q"]))
    assert sel32.dtype == np.int32
