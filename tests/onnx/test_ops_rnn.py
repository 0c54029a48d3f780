"""ONNX LSTM / GRU / RNN against onnx.reference (all cases) and ONNX Runtime (layout 0: ORT refuses layout 1):
directions, initial states, full-length sequence_lens; refused forms listed by name."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP, helper as h  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from tests.onnx.onnx_models import assert_scaled_close, model, ort_run, reference_run  # noqa: E402

RNG = np.random.default_rng(15)
S, B, I, H = 6, 3, 5, 4
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}

# (name, op, direction, layout, extra inputs, attributes)
CASES = [
    ("lstm_fwd", "LSTM", "forward", 0, ("B", "h0", "c0"), {}),
    ("lstm_bi", "LSTM", "bidirectional", 0, (), {}),
    ("lstm_rev", "LSTM", "reverse", 1, ("B", "h0"), {}),
    ("gru_bi", "GRU", "bidirectional", 0, ("B", "h0"), {"linear_before_reset": 1}),
    ("gru_rev", "GRU", "reverse", 1, ("B", "lens"), {"linear_before_reset": 1}),
    ("rnn_fwd", "RNN", "forward", 1, ("B", "h0"), {}),
    ("rnn_bi_relu", "RNN", "bidirectional", 0, ("B",), {"activations": ["Relu", "Relu"]}),
    # unrolled: one step (no thunk), peepholes, GRU's reset before R_h
    ("lstm_step", "LSTM", "forward", 0, ("step", "B", "h0", "c0"), {}),
    ("lstm_step_bi", "LSTM", "bidirectional", 1, ("step", "B", "h0"), {}),
    ("gru_step", "GRU", "reverse", 0, ("step", "B", "h0"), {"linear_before_reset": 1}),
    ("rnn_step", "RNN", "forward", 0, ("step",), {}),
    ("lstm_peep", "LSTM", "bidirectional", 0, ("B", "h0", "c0", "P"), {}),
    ("gru_lbr0", "GRU", "forward", 0, ("B", "h0"), {}),
    ("gru_lbr0_bi", "GRU", "bidirectional", 1, ("B",), {"linear_before_reset": 0}),
]


def _layer(name, op, direction, layout, extra, attrs):
    """One recurrent node and its initializers; outputs Y, Y_h (and Y_c)."""
    d, g = (2 if direction == "bidirectional" else 1), GATES[op]
    w = {f"{name}_W": RNG.standard_normal((d, g * H, I)).astype(np.float32) * 0.5,
         f"{name}_R": RNG.standard_normal((d, g * H, H)).astype(np.float32) * 0.5,
         f"{name}_B": RNG.standard_normal((d, 2 * g * H)).astype(np.float32) * 0.5,
         f"{name}_lens": np.full(B, S, np.int32),
         f"{name}_P": RNG.standard_normal((d, 3 * H)).astype(np.float32) * 0.5}
    state = (B, d, H) if layout == 1 else (d, B, H)
    for s in ("h0", "c0"):
        w[f"{name}_{s}"] = RNG.standard_normal(state).astype(np.float32)
    slots = {"B": 3, "lens": 4, "h0": 5, "c0": 6, "P": 7}
    x = ("xs1" if layout else "xs0") if "step" in extra else ("x1" if layout else "x0")
    inputs = [x, f"{name}_W", f"{name}_R"] + [""] * 5
    for e in extra:
        if e in slots:
            inputs[slots[e]] = f"{name}_{e}"
    while inputs[-1] == "":
        inputs.pop()
    outputs = [f"{name}_Y", f"{name}_Yh"] + ([f"{name}_Yc"] if op == "LSTM" else [])
    node = h.make_node(op, inputs, outputs, hidden_size=H, direction=direction, layout=layout, **attrs)
    return node, [(k, v) for k, v in w.items() if k in inputs], outputs


def _model(layers):
    return model([n for n, _, _ in layers], [("x0", TP.FLOAT, [S, B, I]), ("x1", TP.FLOAT, [B, S, I]),
                                             ("xs0", TP.FLOAT, [1, B, I]), ("xs1", TP.FLOAT, [B, 1, I])],
                 [o for _, _, outs in layers for o in outs], [i for _, inits, _ in layers for i in inits], opset=17)


def _outputs_of(oracle, layers, feeds) -> dict:
    m = _model(layers)
    return dict(zip([o.name for o in m.graph.output], oracle(m, feeds)))


@pytest.fixture(scope="module")
def results():
    """(ours, onnx.reference, ONNX Runtime) output dicts; one compiled model holds every case.  ORT refuses
    layout 1, onnx.reference an RNN's Relu: each oracle runs the cases it takes."""
    layers = [_layer(*c) for c in CASES]
    x = RNG.standard_normal((S, B, I)).astype(np.float32)
    feeds = {"x0": x, "x1": np.ascontiguousarray(x.transpose(1, 0, 2)), "xs0": x[:1], "xs1": x[:1].transpose(1, 0, 2)}
    return (_outputs_of(rl.onnx.run, layers, feeds),
            _outputs_of(reference_run, [lay for lay, c in zip(layers, CASES) if "activations" not in c[5]], feeds),
            _outputs_of(ort_run, [lay for lay, c in zip(layers, CASES) if c[3] == 0], feeds))


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_matches_reference_and_onnxruntime(results, case):
    ours, ref, ort = results
    names = [n for n in ours if n.startswith(case + "_")]
    assert len(names) >= 2 and all(n in ref or n in ort for n in names)
    for n in names:
        for oracle in (ref, ort):
            if n in oracle:
                assert_scaled_close(ours[n], oracle[n], n)


def test_unsupported_forms_are_each_named():
    w = RNG.standard_normal((1, 3 * H, I)).astype(np.float32)
    r = RNG.standard_normal((1, 3 * H, H)).astype(np.float32)
    w4 = RNG.standard_normal((1, 4 * H, I)).astype(np.float32)
    r4 = RNG.standard_normal((1, 4 * H, H)).astype(np.float32)
    nodes = [h.make_node("LSTM", ["x", "W4", "R4"], ["a"], hidden_size=H, input_forget=1, name="forget"),
             h.make_node("GRU", ["x", "W", "R"], ["b"], hidden_size=H, linear_before_reset=1, clip=1.0, name="clip"),
             h.make_node("GRU", ["x", "W", "R"], ["c"], hidden_size=H, linear_before_reset=1, name="acts",
                         activations=["HardSigmoid", "Tanh"]),
             h.make_node("GRU", ["x", "W", "R", "", "lens"], ["d"], hidden_size=H, linear_before_reset=1, name="lens")]
    m = model(nodes, [("x", TP.FLOAT, [S, B, I])], ["a", "b", "c", "d"],
              [("W", w), ("R", r), ("W4", w4), ("R4", r4), ("lens", np.array([S, S - 1, S], np.int32))])
    with pytest.raises(rl.onnx.OnnxImportError) as err:
        rl.onnx.load(m)
    text = str(err.value)
    for name, why in [("LSTM 'forget'", "input_forget"), ("GRU 'clip'", "clip"), ("GRU 'acts'", "HardSigmoid"),
                      ("GRU 'lens'", "sequence_lens")]:
        assert name in text and why in text
    assert len(err.value.problems) == 4
