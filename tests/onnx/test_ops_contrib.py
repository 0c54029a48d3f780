"""ONNX Runtime contrib ops (com.microsoft) against ONNX Runtime itself: one model holds every case."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto as TP, helper as h  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from tests.onnx.onnx_models import assert_scaled_close, model, ort_run  # noqa: E402

MS = "com.microsoft"
RNG = np.random.default_rng(16)
B, S, D, HEADS, K, N = 2, 5, 16, 4, 40, 24


def _rand(*shape, scale=0.5):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _nbits(bits: int, block: int, zero_points: str):
    """MatMulNBits initializers: codes, scales and zero points of the given form."""
    blocks = -(-K // block)
    codes = RNG.integers(0, 1 << bits, (N, blocks, block), dtype=np.uint8)
    packed = codes if bits == 8 else (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    inits = {"B": packed, "scales": _rand(N * blocks, scale=0.1)}
    if zero_points == "packed":
        z = RNG.integers(0, 1 << bits, (N, blocks + (blocks % 2 if bits == 4 else 0)), dtype=np.uint8)
        inits["zp"] = z if bits == 8 else (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8)
    elif zero_points == "float":
        inits["zp"] = RNG.integers(0, 1 << bits, N * blocks).astype(np.float32)
    return inits


def _cases():
    """(node, initializers, outputs) per case; every case reads x [B, S, D] or a [B, S, K]."""
    yield h.make_node("Gelu", ["x"], ["gelu"], domain=MS), {}, ["gelu"]
    yield h.make_node("BiasGelu", ["x", "bg_b"], ["bias_gelu"], domain=MS), {"bg_b": _rand(D)}, ["bias_gelu"]
    yield h.make_node("FastGelu", ["x", "fg_b"], ["fast_gelu"], domain=MS), {"fg_b": _rand(D)}, ["fast_gelu"]
    yield h.make_node("FastGelu", ["x"], ["fast_gelu_nobias"], domain=MS), {}, ["fast_gelu_nobias"]
    yield (h.make_node("SkipLayerNormalization", ["x", "skip", "sl_g", "sl_b", "sl_bias"],
                       ["skip_ln", "", "", "skip_sum"], domain=MS, epsilon=1e-5),
           {"sl_g": _rand(D), "sl_b": _rand(D), "sl_bias": _rand(D)}, ["skip_ln", "skip_sum"])
    yield (h.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "ss_g"], ["skip_rms"], domain=MS,
                       epsilon=1e-6), {"ss_g": _rand(D)}, ["skip_rms"])
    attention = {"at_w": _rand(D, 3 * D), "at_b": _rand(3 * D)}
    yield (h.make_node("Attention", ["x", "at_w", "at_b"], ["attn"], domain=MS, num_heads=HEADS), attention, ["attn"])
    yield (h.make_node("Attention", ["x", "at_w", "at_b"], ["attn_causal"], domain=MS, num_heads=HEADS,
                       unidirectional=1), {}, ["attn_causal"])
    yield (h.make_node("Attention", ["x", "at_w", "at_b", "mask2d"], ["attn_mask2d"], domain=MS, num_heads=HEADS),
           {}, ["attn_mask2d"])
    yield (h.make_node("Attention", ["x", "at_w", "at_b", "mask1d"], ["attn_mask1d"], domain=MS, num_heads=HEADS,
                       scale=0.3), {}, ["attn_mask1d"])
    emb = {"we": _rand(30, D), "pe": _rand(S + 2, D), "se": _rand(2, D), "eg": _rand(D), "eb": _rand(D)}
    yield (h.make_node("EmbedLayerNormalization", ["ids", "seg", "we", "pe", "se", "eg", "eb", "mask2d"],
                       ["embed_ln", "embed_mask_index", "embed_sum"], domain=MS, epsilon=1e-5),
           emb, ["embed_ln", "embed_mask_index", "embed_sum"])
    yield (h.make_node("EmbedLayerNormalization", ["ids", "", "we", "pe", "", "eg", "eb"],
                       ["embed_plain", "embed_plain_mask_index"], domain=MS, epsilon=1e-5), {},
           ["embed_plain", "embed_plain_mask_index"])
    for bits, block, zp in [(4, 16, "none"), (4, 32, "packed"), (4, 16, "float"), (8, 16, "packed")]:
        name = f"nbits{bits}_{block}_{zp}"
        inits = {f"{name}_{k}": v for k, v in _nbits(bits, block, zp).items()}
        ins = ["a", f"{name}_B", f"{name}_scales"] + ([f"{name}_zp"] if zp != "none" else [])
        if zp == "none":
            ins += ["", "", f"{name}_bias"]
            inits[f"{name}_bias"] = _rand(N)
        yield (h.make_node("MatMulNBits", ins, [name], domain=MS, K=K, N=N, bits=bits, block_size=block),
               inits, [name])


@pytest.fixture(scope="module")
def contrib_model():
    cases = list(_cases())
    outputs = [o for _, _, outs in cases for o in outs]
    inits = {k: v for _, i, _ in cases for k, v in i.items()}
    m = model([n for n, _, _ in cases], [("x", TP.FLOAT, [B, S, D]), ("skip", TP.FLOAT, [B, S, D]),
                                         ("a", TP.FLOAT, [B, S, K]), ("mask2d", TP.INT32, [B, S]),
                                         ("mask1d", TP.INT32, [B]), ("ids", TP.INT32, [B, S]),
                                         ("seg", TP.INT32, [B, S])],
              [(o, TP.INT32) if o.endswith("mask_index") else o for o in outputs], list(inits.items()), contrib=True)
    return m, outputs


@pytest.fixture(scope="module")
def results(contrib_model):
    m, outputs = contrib_model
    feeds = {"x": _rand(B, S, D, scale=1.0), "skip": _rand(B, S, D, scale=1.0), "a": _rand(B, S, K, scale=1.0),
             "mask2d": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32), "mask1d": np.array([2, 5], np.int32),
             "ids": RNG.integers(0, 30, (B, S)).astype(np.int32), "seg": RNG.integers(0, 2, (B, S)).astype(np.int32)}
    return dict(zip(outputs, rl.onnx.run(m, feeds))), dict(zip(outputs, ort_run(m, feeds)))


@pytest.mark.parametrize("name", [o for _, _, outs in _cases() for o in outs])
def test_matches_onnxruntime(results, name):
    ours, ort = results
    assert_scaled_close(ours[name], ort[name], name)


def test_four_bit_weights_run_as_dequant_matmul_int4(contrib_model):
    ops = [n.op for n in rl.onnx.load(contrib_model[0]).nodes]
    assert ops.count("dequant_matmul_int4") == 3 and ops.count("matmul") >= 1


def test_unsupported_forms_are_each_named():
    w = _rand(D, 3 * D)
    nodes = [h.make_node("Attention", ["x", "w", "", "", "past"], ["a"], domain=MS, num_heads=HEADS, name="past"),
             h.make_node("Attention", ["x", "w", "", "m3"], ["b"], domain=MS, num_heads=HEADS, name="mask3d"),
             h.make_node("SkipLayerNormalization", ["x", "x", "g"], ["c", "mean"], domain=MS, name="mean"),
             h.make_node("MatMulNBits", ["x", "q", "s"], ["d"], domain=MS, K=D, N=4, bits=2, block_size=16,
                         name="bits2")]
    m = model(nodes, [("x", TP.FLOAT, [B, S, D]), ("past", TP.FLOAT, [2, B, HEADS, 1, D // HEADS]),
                      ("m3", TP.INT32, [B, S, S])], ["a", "b", "c", "d"],
              [("w", w), ("g", _rand(D)), ("q", np.zeros((4, 1, 4), np.uint8)), ("s", _rand(4))], contrib=True)
    with pytest.raises(rl.onnx.OnnxImportError) as err:
        rl.onnx.load(m)
    text = str(err.value)
    for name, why in [("past", "past"), ("mask3d", "mask_index of shape"), ("mean", "mean"), ("bits2", "bits=2")]:
        assert f"'{name}'" in text and why in text, (name, text)
    assert len(err.value.problems) == 4
