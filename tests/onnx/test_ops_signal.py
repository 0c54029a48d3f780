"""ONNX DFT (opsets 17 and 20) and STFT against ONNX Runtime and onnx.reference: one model per opset."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP, helper as h  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from tests.onnx.onnx_models import assert_scaled_close, model, ort_run, reference_run  # noqa: E402

RNG = np.random.default_rng(18)
B, N, M = 2, 12, 5         # real [B, N, 1], complex [B, N, 2], a 4-D [B, N, M, 2] signal for another axis


def _i64(v):
    return np.array(v, np.int64)


# opset → (node, outputs, initializers) per case
CASES = {
    20: [(h.make_node("DFT", ["real", "", "ax1"], ["dft_real"]), {"ax1": _i64(1)}),
         (h.make_node("DFT", ["cplx", "", "ax1"], ["dft_inverse"], inverse=1), {}),
         (h.make_node("DFT", ["real", "len16", "ax1"], ["dft_onesided_pad"], onesided=1), {"len16": _i64(16)}),
         (h.make_node("DFT", ["cplx", "len7"], ["dft_truncated"]), {"len7": _i64(7)}),
         (h.make_node("DFT", ["grid", "", "ax1"], ["dft_axis1_of_4d"]), {}),
         (h.make_node("DFT", ["half", "", "ax1"], ["dft_irfft"], onesided=1, inverse=1), {}),
         (h.make_node("STFT", ["real", "step", "window"], ["stft_window"]),
          {"step": _i64(3), "window": np.hanning(6).astype(np.float32)}),
         (h.make_node("STFT", ["cplx", "step", "", "len4"], ["stft_complex"], onesided=0), {"len4": _i64(4)})],
    17: [(h.make_node("DFT", ["cplx"], ["dft17"], axis=1), {}),
         (h.make_node("DFT", ["grid"], ["dft17_axis2"], axis=2, onesided=0, inverse=1), {})],
}
NAMES = [(opset, n.output[0]) for opset, cases in CASES.items() for n, _ in cases]


def _model(opset: int):
    inits = {k: v for _, i in CASES[opset] for k, v in i.items()}
    return model([n for n, _ in CASES[opset]], [("real", TP.FLOAT, [B, N, 1]), ("cplx", TP.FLOAT, [B, N, 2]),
                                               ("grid", TP.FLOAT, [B, N, M, 2]),
                                               ("half", TP.FLOAT, [B, N // 2 + 1, 2])],
                 [n.output[0] for n, _ in CASES[opset]], list(inits.items()), opset=opset)


@pytest.fixture(scope="module")
def results():
    feeds = {"real": RNG.standard_normal((B, N, 1)).astype(np.float32),
             "cplx": RNG.standard_normal((B, N, 2)).astype(np.float32),
             "grid": RNG.standard_normal((B, N, M, 2)).astype(np.float32),
             "half": RNG.standard_normal((B, N // 2 + 1, 2)).astype(np.float32)}
    out = {}
    for opset in CASES:
        m = _model(opset)
        names = [o.name for o in m.graph.output]
        for oracle, key in ((rl.onnx.run, "ours"), (ort_run, "ort"), (reference_run, "reference")):
            out.setdefault(key, {}).update(zip(names, oracle(m, feeds)))
    return out


@pytest.mark.parametrize("name", [n for _, n in NAMES])
def test_matches_onnxruntime_and_reference(results, name):
    for oracle in ("ort", "reference"):
        assert_scaled_close(results["ours"][name], np.asarray(results[oracle][name]), f"{name} vs {oracle}")


def test_unsupported_forms_are_each_named():
    nodes = [h.make_node("DFT", ["x", "", "ax"], ["a"], name="last_axis"),
             h.make_node("STFT", ["x", "step", "w", "flen"], ["b"], name="short_window", onesided=1)]
    m = model(nodes, [("x", TP.FLOAT, [1, 8, 1])], ["a", "b"],
              [("ax", _i64(2)), ("step", _i64(2)), ("w", np.ones(3, np.float32)), ("flen", _i64(4))], opset=20)
    with pytest.raises(rl.onnx.OnnxImportError) as err:
        rl.onnx.load(m)
    text = str(err.value)
    assert "DFT 'last_axis'" in text and "axis is the last (re, im) axis" in text
    assert "STFT 'short_window'" in text and "window of shape [3] for frame_length 4" in text
