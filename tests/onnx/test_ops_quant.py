"""ONNX integer quantization against onnx.reference, bit for bit: one model holds every case.

The float inputs include exact halves of the scale (ties: ONNX rounds them to even) and values past
the integer range (saturation)."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP, helper as h  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from tests.onnx.onnx_models import model, reference_run  # noqa: E402

RNG = np.random.default_rng(17)
N, C, W = 2, 3, 8          # x [N, C, W]
M, K, P = 5, 37, 6         # a [M, K] @ b [K, P]
SCALE = np.float32(0.05)


def _x() -> np.ndarray:
    """Random values, exact ties (k + ½)·scale, and values far outside every integer range."""
    x = RNG.standard_normal((N, C, W)).astype(np.float32) * 4
    x.flat[:12] = (np.arange(-6, 6) + 0.5).astype(np.float32) * SCALE
    x.flat[12:16] = [1e4, -1e4, 300.0, -300.0]
    return x


def _cases():
    """(node, initializers, (output, elem type)) per case."""
    per_c = (RNG.uniform(0.02, 0.1, C).astype(np.float32))
    yield (h.make_node("QuantizeLinear", ["x", "s", "zp_u8"], ["q_u8"]), {"s": SCALE, "zp_u8": np.uint8(128)},
           ("q_u8", TP.UINT8))
    yield h.make_node("QuantizeLinear", ["x", "s"], ["q_default"]), {}, ("q_default", TP.UINT8)
    yield (h.make_node("QuantizeLinear", ["x", "s_c", "zp_c"], ["q_axis"], axis=1),
           {"s_c": per_c, "zp_c": np.array([-3, 0, 5], np.int8)}, ("q_axis", TP.INT8))
    yield (h.make_node("QuantizeLinear", ["x", "s_w", "zp_w"], ["q_last"], axis=-1),
           {"s_w": RNG.uniform(0.02, 0.1, W).astype(np.float32), "zp_w": RNG.integers(-9, 9, W).astype(np.int8)},
           ("q_last", TP.INT8))
    yield (h.make_node("DequantizeLinear", ["xq", "s_c", "zpq"], ["dq_axis"], axis=1),
           {"zpq": np.array([-3, 0, 5], np.int8)}, ("dq_axis", TP.FLOAT))
    yield h.make_node("DequantizeLinear", ["xu", "s", "zp_u8"], ["dq_u8"]), {}, ("dq_u8", TP.FLOAT)
    yield h.make_node("DequantizeLinear", ["xi32", "s"], ["dq_i32"]), {}, ("dq_i32", TP.FLOAT)
    yield (h.make_node("DynamicQuantizeLinear", ["x"], ["dy", "dy_scale", "dy_zp"]), {},
           ("dy", TP.UINT8), ("dy_scale", TP.FLOAT), ("dy_zp", TP.UINT8))
    yield (h.make_node("DynamicQuantizeLinear", ["xpos"], ["dp", "dp_scale", "dp_zp"]), {},
           ("dp", TP.UINT8), ("dp_scale", TP.FLOAT), ("dp_zp", TP.UINT8))
    b_u8, b_i8 = RNG.integers(0, 256, (K, P), dtype=np.uint8), RNG.integers(-128, 128, (K, P), dtype=np.int8)
    yield (h.make_node("MatMulInteger", ["au", "b_u8", "azp", "bzp"], ["mmi_u8"]),
           {"b_u8": b_u8, "azp": np.uint8(131), "bzp": RNG.integers(0, 256, P, dtype=np.uint8)}, ("mmi_u8", TP.INT32))
    yield (h.make_node("MatMulInteger", ["ai", "b_i8", "azp_rows"], ["mmi_i8"]),
           {"b_i8": b_i8, "azp_rows": RNG.integers(-5, 5, M).astype(np.int8)}, ("mmi_i8", TP.INT32))
    yield (h.make_node("QLinearMatMul", ["au", "as", "azp", "b_u8", "bs", "bzp0", "ys", "yzp"], ["qlm_u8"]),
           {"as": np.float32(0.02), "bs": np.float32(0.015), "bzp0": np.uint8(120), "ys": np.float32(0.5),
            "yzp": np.uint8(128)}, ("qlm_u8", TP.UINT8))
    yield (h.make_node("MatMulInteger", ["a3", "b3", "a3zp"], ["mmi_batched"]),
           {"b3": RNG.integers(0, 256, (2, K, P), dtype=np.uint8), "a3zp": np.uint8(3)}, ("mmi_batched", TP.INT32))
    yield (h.make_node("QLinearMatMul", ["ai", "as", "azp_i8", "b_i8", "bs_cols", "bzp_i8", "ys2", "yzp_i8"],
                       ["qlm_i8"]),
           {"azp_i8": np.int8(-2), "bs_cols": RNG.uniform(0.01, 0.03, P).astype(np.float32), "bzp_i8": np.int8(0),
            "ys2": np.float32(8.0 / 3.0), "yzp_i8": np.int8(-1)}, ("qlm_i8", TP.INT8))


def _model(cases, inits: dict):
    outputs = [o for c in cases for o in c[2:]]
    return model([c[0] for c in cases],
                 [("x", TP.FLOAT, [N, C, W]), ("xpos", TP.FLOAT, [N, C, W]), ("xq", TP.INT8, [N, C, W]),
                  ("xu", TP.UINT8, [N, C, W]), ("xi32", TP.INT32, [N, C, W]), ("au", TP.UINT8, [M, K]),
                  ("ai", TP.INT8, [M, K]), ("a3", TP.UINT8, [2, M, K])], outputs, list(inits.items()), opset=21)


@pytest.fixture(scope="module")
def results():
    """Ours and the expected outputs: onnx.reference's, but NumPy's for a per-row MatMulInteger zero point
    (onnx.reference broadcasts a [M] zero point along K, not along the rows as the spec says)."""
    cases = list(_cases())
    by_reference = [c for c in cases if c[2][0] != "mmi_i8"]
    inits = {k: v for _, i, *_ in cases for k, v in i.items()}
    feeds = {"x": _x(), "xpos": np.abs(_x()) + 0.25, "xq": RNG.integers(-128, 128, (N, C, W), dtype=np.int8),
             "xu": RNG.integers(0, 256, (N, C, W), dtype=np.uint8),
             "xi32": RNG.integers(-2 ** 20, 2 ** 20, (N, C, W)).astype(np.int32),
             "au": RNG.integers(0, 256, (M, K), dtype=np.uint8), "ai": RNG.integers(-128, 128, (M, K), dtype=np.int8),
             "a3": RNG.integers(0, 256, (2, M, K), dtype=np.uint8)}
    names = [o for c in cases for o, _ in c[2:]]
    expected = dict(zip([o for c in by_reference for o, _ in c[2:]], reference_run(_model(by_reference, inits), feeds)))
    rows = feeds["ai"].astype(np.int64) - inits["azp_rows"].astype(np.int64)[:, None]
    expected["mmi_i8"] = (rows @ inits["b_i8"].astype(np.int64)).astype(np.int32)
    return dict(zip(names, rl.onnx.run(_model(cases, inits), feeds))), expected


@pytest.mark.parametrize("name", [o for c in _cases() for o, _ in c[2:]])
def test_bit_exact_against_reference(results, name):
    ours, ref = results
    want = np.asarray(ref[name])
    assert ours[name].dtype == want.dtype and ours[name].shape == want.shape, (ours[name].dtype, want.dtype)
    np.testing.assert_array_equal(ours[name], want, err_msg=name)


def test_ties_round_to_even(results):
    ours, _ = results
    q = ours["q_u8"].ravel()[:12].astype(int) - 128          # (k + ½) for k = −6 … 5
    assert q.tolist() == [-6, -4, -4, -2, -2, 0, 0, 2, 2, 4, 4, 6]


def test_unsupported_forms_are_each_named():
    nodes = [h.make_node("QuantizeLinear", ["x", "sb"], ["a"], block_size=2, axis=1, name="blocked"),
             h.make_node("MatMulInteger", ["ab", "ab3"], ["b"], name="batched")]
    m = model(nodes, [("x", TP.FLOAT, [2, 4]), ("ab", TP.INT8, [2, 3, 3]), ("ab3", TP.INT8, [3, 3, 3])],
              [("a", TP.UINT8), ("b", TP.INT32)],
              [("sb", np.ones((2, 3), np.float32))], opset=21)        # 4 / block 2 is 2 scales, not 3
    with pytest.raises(rl.onnx.OnnxImportError) as err:
        rl.onnx.load(m)
    text = str(err.value)
    assert "QuantizeLinear 'blocked'" in text and "block_size 2" in text
    assert "MatMulInteger 'batched'" in text and "a batched B must have A's batch dims" in text
