"""The conv_bias_act pass (graph/fuse_conv.py): narrow-output convolutions with their bias and activation
become Im2Col + FusedMmBiasAct, the others keep the Conv2D thunk — one model holding every case, against
ONNX Runtime, with the fusion log saying which fired."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto as TP, helper as h  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from tests.onnx.onnx_models import assert_scaled_close, model, ort_run  # noqa: E402

RNG = np.random.default_rng(7)
B = 2


def weights(name: str, c_out: int, c_in: int, *kernel: int) -> list:
    return [(f"{name}_w", RNG.standard_normal((c_out, c_in, *kernel)).astype(np.float32) * 0.3),
            (f"{name}_b", RNG.standard_normal(c_out).astype(np.float32))]


# (output, nodes, initializers, what the log says for it, or None when the conv is kept)
CASES = [
    ("c1d", [h.make_node("Conv", ["x1", "k1_w", "k1_b"], ["k1"], pads=[1, 1], strides=[2]),
             h.make_node("Relu", ["k1"], ["c1d"])], weights("k1", 6, 4, 3), "conv2d + bias + Relu"),
    ("c2d", [h.make_node("Conv", ["x2", "k2_w", "k2_b"], ["k2"], pads=[1, 0, 2, 1], dilations=[2, 1]),
             h.make_node("Sigmoid", ["k2"], ["c2d"])], weights("k2", 5, 3, 3, 2), "conv2d + bias + Sigmoid"),
    ("nobias", [h.make_node("Conv", ["x2", "k3_w"], ["nobias"], strides=[2, 2])], weights("k3", 4, 3, 2, 2)[:1],
     "conv2d → Im2Col"),
    ("shared", [h.make_node("Conv", ["x1", "k4_w", "k4_b"], ["shared"], pads=[2, 2]),    # read twice: no act
                h.make_node("Relu", ["shared"], ["shared_relu"]), h.make_node("Tanh", ["shared"], ["shared_tanh"])],
     weights("k4", 3, 4, 5), "conv2d + bias → Im2Col"),
    ("grouped", [h.make_node("Conv", ["x2", "k5_w", "k5_b"], ["k5"], group=3),
                 h.make_node("Relu", ["k5"], ["grouped"])], weights("k5", 6, 1, 3, 3), None),
    ("wide", [h.make_node("Conv", ["x3", "k6_w", "k6_b"], ["k6"], pads=[1, 1, 1, 1]),
              h.make_node("Relu", ["k6"], ["wide"])], weights("k6", 2, 3, 3, 3), None),
]
INPUTS = {"x1": (B, 4, 9), "x2": (B, 3, 7, 6), "x3": (B, 3, 10, 10)}      # wide: 100 positions > MAX_POSITIONS


@pytest.fixture(scope="module")
def compiled():
    nodes = [n for _, ns, _, _ in CASES for n in ns]
    outs = [o for n in nodes for o in n.output if o[0] != "k"]
    m = model(nodes, [(k, TP.FLOAT, list(s)) for k, s in INPUTS.items()], outs,
              [i for _, _, inits, _ in CASES for i in inits])
    feeds = {k: RNG.standard_normal(s).astype(np.float32) for k, s in INPUTS.items()}
    ours = rl.onnx.OnnxModel(m)
    got = dict(zip(outs, ours.run(feeds)))
    want = dict(zip(outs, ort_run(m, feeds)))
    log = str(ours.compiled({k: v.shape for k, v in feeds.items()}).report())
    return got, want, log


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_onnxruntime(compiled, case):
    got, want, _ = compiled
    for name in [o for n in case[1] for o in n.output if o in got]:
        assert_scaled_close(got[name], want[name], name)


def test_the_log_names_each_rewrite(compiled):
    log = compiled[2]
    fired = [line for line in log.splitlines() if "conv_bias_act" in line]
    assert len(fired) == sum(1 for c in CASES if c[3]), log
    for _, _, _, text in CASES:
        if text:
            assert any(text in line for line in fired), (text, fired)
    assert log.count("Conv2D ") == 2, log          # the grouped and the wide conv keep their thunk
