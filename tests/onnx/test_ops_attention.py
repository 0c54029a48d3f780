"""ONNX Attention (opset 23) and RotaryEmbedding against onnx.reference: one model holds every case."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP, helper as h  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from tests.onnx.onnx_models import assert_scaled_close, model, reference_run  # noqa: E402

RNG = np.random.default_rng(19)
B, S, H, KVH, D, P, KV = 2, 5, 4, 2, 8, 3, 7       # P: past length; KV: a cross-attention key length


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


INPUTS = {"q3": [B, S, H * D], "k3": [B, S, KVH * D], "v3": [B, S, KVH * D], "q4": [B, H, S, D],
          "k4": [B, KVH, S, D], "v4": [B, KVH, S, D], "kx": [B, H, KV, D], "vx": [B, H, KV, D],
          "pk": [B, KVH, P, D], "pv": [B, KVH, P, D], "x4": [B, H, S, D]}
CASES = [
    (h.make_node("Attention", ["q3", "k3", "v3"], ["gqa_3d"], q_num_heads=H, kv_num_heads=KVH), {}),
    (h.make_node("Attention", ["q4", "k4", "v4"], ["causal_4d"], is_causal=1, scale=0.2), {}),
    (h.make_node("Attention", ["q4", "k4", "v4", "", "pk", "pv"], ["past_y", "past_k", "past_v"], is_causal=1), {}),
    (h.make_node("Attention", ["q4", "kx", "vx", "bool_mask"], ["bool_mask_y"]),
     {"bool_mask": (np.arange(KV)[None, :] < np.array([[4], [7]])).reshape(B, 1, 1, KV)}),
    (h.make_node("Attention", ["q4", "kx", "vx", "row_mask"], ["fully_masked_rows_y"]),
     {"row_mask": np.arange(S)[:, None] % 2 == np.zeros((1, KV), bool)}),
    (h.make_node("Attention", ["q4", "kx", "vx", "add_mask"], ["add_mask_y"], is_causal=1),
     {"add_mask": _f(1, H, S, KV)}),
    (h.make_node("Attention", ["q4", "kx", "vx"], ["cross_causal_y"], is_causal=1), {}),
    (h.make_node("Attention", ["q4", "k4", "v4", "short_mask", "pk", "pv"], ["short_mask_y", "", ""]),
     {"short_mask": _f(S, S + P - 2)}),
    # written out in graph ops: softcap, the qk_matmul_output output (modes 0, 2 with the mask as −inf, 3)
    (h.make_node("Attention", ["q4", "k4", "v4"], ["softcap_y"], softcap=2.0, is_causal=1), {}),
    (h.make_node("Attention", ["q4", "kx", "vx", "bool_mask"], ["qk0_y", "", "", "qk0"], softcap=3.0), {}),
    (h.make_node("Attention", ["q4", "kx", "vx", "add_mask"], ["qk2_y", "", "", "qk2"], qk_matmul_output_mode=2,
                 is_causal=1), {}),
    (h.make_node("Attention", ["q3", "k3", "v3"], ["qk3_y", "", "", "qk3"], q_num_heads=H, kv_num_heads=KVH,
                 qk_matmul_output_mode=3, is_causal=1), {}),
    (h.make_node("RotaryEmbedding", ["q3", "cos", "sin", "pos"], ["rope_3d"], num_heads=H), {}),
    (h.make_node("RotaryEmbedding", ["x4", "cos_part", "sin_part", "pos"], ["rope_4d_part_interleaved"], interleaved=1,
                 rotary_embedding_dim=D // 2), {}),
    (h.make_node("RotaryEmbedding", ["q3", "cos_bs", "sin_bs"], ["rope_no_positions"], num_heads=H), {}),
]


def _tables():
    angles = np.arange(16)[:, None] * (10000.0 ** (-np.arange(D // 2) / (D // 2)))[None, :]
    per_token = angles[RNG.integers(0, 16, (B, S))]
    return {"cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32),
            "cos_bs": np.cos(per_token).astype(np.float32), "sin_bs": np.sin(per_token).astype(np.float32),
            "cos_part": np.cos(angles[:, :D // 4]).astype(np.float32),
            "sin_part": np.sin(angles[:, :D // 4]).astype(np.float32),
            "pos": np.array([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]], np.int64)}


def _outputs(cases):
    return [o for n, _ in cases for o in n.output if o]


def _model(cases, inits):
    return model([n for n, _ in cases], [(k, TP.FLOAT, s) for k, s in INPUTS.items()], _outputs(cases),
                 list(inits.items()), opset=23)


@pytest.fixture(scope="module")
def results():
    inits = {k: v for _, i in CASES for k, v in i.items()} | _tables()
    feeds = {k: _f(*s) for k, s in INPUTS.items()}
    out = {"ours": dict(zip(_outputs(CASES), rl.onnx.run(_model(CASES, inits), feeds))),
           "reference": dict(zip(_outputs(CASES), reference_run(_model(CASES, inits), feeds)))}
    return out


@pytest.mark.parametrize("name", _outputs(CASES))
def test_matches_reference(results, name):
    assert_scaled_close(results["ours"][name], np.asarray(results["reference"][name]), name)


def test_unsupported_forms_are_each_named():
    nodes = [h.make_node("Attention", ["q3", "k3", "v3"], ["c"], name="no_heads")]
    m = model(nodes, [(k, TP.FLOAT, s) for k, s in INPUTS.items()], ["c"], opset=23)
    with pytest.raises(rl.onnx.OnnxImportError) as err:
        rl.onnx.load(m)
    assert "Attention 'no_heads'" in str(err.value) and "q_num_heads" in str(err.value)
