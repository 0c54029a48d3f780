"""Bad input to the ONNX import: each a clear error naming the problem, never a crash or a raw protobuf traceback."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

import rlx_llvm as rl
from rlx_llvm.onnx import OnnxImportError

from tests.onnx.onnx_models import model


def relu_model():
    """y = relu(x + b), x: float[2, 3]."""
    return model([h.make_node("Add", ["x", "b"], ["t"]), h.make_node("Relu", ["t"], ["y"])],
                 [("x", TP.FLOAT, [2, 3])], ["y"], inits=[("b", np.ones(3, np.float32))])


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_truncated_file(tmp_path, cut):
    path = tmp_path / "truncated.onnx"
    data = relu_model().SerializeToString()
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(OnnxImportError, match="truncated.onnx: not a readable ONNX model"):
        rl.onnx.OnnxModel(str(path))


def test_corrupt_file(tmp_path):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(OnnxImportError, match="garbage.onnx: not a readable ONNX model"):
        rl.onnx.run(str(path), {"x": np.zeros((2, 3), np.float32)})


def test_cycle():
    m = model([h.make_node("Add", ["x", "u"], ["t"], name="first"), h.make_node("Relu", ["t"], ["u"], name="second")],
              [("x", TP.FLOAT, [2, 3])], ["u"])
    with pytest.raises(OnnxImportError, match=r"'first' \(Add\): input\(s\) \['u'\].*cycle"):
        rl.onnx.OnnxModel(m)


def test_initializer_size_mismatch():
    m = relu_model()
    b = nh.from_array(np.ones(5, np.float32), "b")
    b.dims[:] = [3]                                # 5 floats of raw data declared as shape [3]
    m.graph.initializer[0].CopyFrom(b)
    with pytest.raises(OnnxImportError, match=r"initializer 'b'.*shape \[3\]"):
        rl.onnx.OnnxModel(m)


@pytest.mark.parametrize("feed, message", [
    (np.zeros((2, 3), np.float64), r"feed 'x': dtype float64, the model declares float32"),
    (np.zeros((2, 4), np.float32), r"feed 'x': shape \[2, 4\], the model declares \[2, 3\]"),
    (np.zeros((6,), np.float32), r"feed 'x': shape \[6\]"),
])
def test_wrong_feed(feed, message):
    with pytest.raises(OnnxImportError, match=message):
        rl.onnx.OnnxModel(relu_model()).run({"x": feed})


def test_good_model_still_runs():
    x = np.array([[-2, 0, 1], [3, -4, 5]], np.float32)
    y, = rl.onnx.OnnxModel(relu_model()).run({"x": x})
    np.testing.assert_array_equal(y, np.maximum(x + 1, 0))
