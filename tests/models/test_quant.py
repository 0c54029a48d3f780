"""The GGUF-quantized BERT encoder (`quant` "q8_0" / "q4_0", docs/models.md "Quantized weights"):
the tiny checkpoint against the float64 NumPy BERT run on `gguf`'s dequantized weights (plain and
AWQ-scaled), the schedule and packing, AWQ on one linear layer, refused formats, and
all-MiniLM-L6-v2's quantized embeddings against the f32 ones on the golden sentences, through the
API and `rlx-llvm embed --quant`."""
from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from rlx_llvm.cli import main
from rlx_llvm.models import SentenceEncoder
from rlx_llvm.models.awq import CALIBRATION_TEXTS, InputStats, output_error, roundtrip, scale_linear
from rlx_llvm.models.bert import awq_layers, encoder_schedule, pack_weights, quant_scheme, weight_layout

from .test_bert import TINY, Tiny, inputs, numpy_bert, random_checkpoint
from .test_sentence import GOLDEN, cosine, model_or_skip

QUANTS = ("q8_0", "q4_0")
TINY_Q = dataclasses.replace(TINY, intermediate_size=64)  # every linear input width a multiple of 32
LINEAR_WEIGHTS = ("query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense")


def dequantized(weights: dict[str, np.ndarray], quant: str) -> dict[str, np.ndarray]:
    """The checkpoint with every encoder Linear weight replaced by gguf's quantize → dequantize."""
    qtype = GGMLQuantizationType[quant.upper()]
    roundtrip = lambda w: quants.dequantize(quants.quantize(w, qtype), qtype)  # noqa: E731
    return {name: roundtrip(w) if name.startswith("encoder.") and name.endswith(
        tuple(f"{n}.weight" for n in LINEAR_WEIGHTS)) else w for name, w in weights.items()}


@pytest.fixture(scope="module", params=QUANTS)
def tiny_q(request) -> Tiny:
    return Tiny(TINY_Q, random_checkpoint(TINY_Q), quant=request.param)


CALIBRATION = [list(np.random.default_rng(n).integers(0, TINY_Q.vocab_size, n)) for n in (3, 9, 17, 24)]


@pytest.fixture(scope="module", params=QUANTS)
def tiny_awq(request) -> Tiny:
    return Tiny(TINY_Q, random_checkpoint(TINY_Q), quant=request.param, calibration=CALIBRATION)


def represented(c, packed: dict, quant: str) -> dict[str, np.ndarray]:
    """The f32 checkpoint that AWQ-packed weights compute: gguf's dequantized blocks with the input's
    1/s folded into their columns; V (and attention-out) as packed, since 1/s passes through attention."""
    qtype = GGMLQuantizationType[quant.upper()]
    w, hs = {}, c.hidden_size
    for i in range(c.num_hidden_layers):
        p = f"encoder.layer.{i}."
        lin = lambda name, k: quants.dequantize(packed[f"l{i}.{name}_w"], qtype).reshape(-1, k) \
            * packed.get(f"l{i}.{name}_in", 1)  # noqa: E731
        qkv, bqkv = lin("qkv", hs), packed[f"l{i}.qkv_b"]
        for j, n in enumerate(("query", "key", "value")):
            w[f"{p}attention.self.{n}.weight"], w[f"{p}attention.self.{n}.bias"] = qkv[j * hs:(j + 1) * hs], \
                bqkv[j * hs:(j + 1) * hs]
        for name, torch_name, k in (("out", "attention.output.dense", hs), ("fc1", "intermediate.dense", hs),
                                    ("fc2", "output.dense", c.intermediate_size)):
            w[f"{p}{torch_name}.weight"], w[f"{p}{torch_name}.bias"] = lin(name, k), packed[f"l{i}.{name}_b"]
    return w


def test_quantized_encoder_is_numpy_bert_on_dequantized_weights(tiny_q):
    ids, types, mask = inputs(3, 7)
    got = tiny_q.run(ids, types, mask)
    np.testing.assert_allclose(got, numpy_bert(TINY_Q, dequantized(tiny_q.weights, tiny_q.quant), ids, types, mask),
                               atol=2e-5)
    exact = numpy_bert(TINY_Q, tiny_q.weights, ids, types, mask)
    assert np.abs(got - exact).max() > 1e-3  # the weights really are quantized
    assert cosine(got, exact).min() > 0.9


def test_the_awq_encoder_is_numpy_bert_on_the_weights_it_represents(tiny_awq):
    ids, types, mask = inputs(3, 7)
    got = tiny_awq.run(ids, types, mask)
    packed = pack_weights(TINY_Q, tiny_awq.weights, tiny_awq.quant, CALIBRATION)
    assert {f"l0.{n}_in" for n in ("qkv", "fc1", "fc2")} <= packed.keys()
    weights = {**tiny_awq.weights, **represented(TINY_Q, packed, tiny_awq.quant)}
    np.testing.assert_allclose(got, numpy_bert(TINY_Q, weights, ids, types, mask), atol=2e-5)
    exact = numpy_bert(TINY_Q, tiny_awq.weights, ids, types, mask)
    assert cosine(got, exact).min() > 0.9 and np.abs(got - exact).max() > 1e-4


def test_awq_packs_gguf_blocks_of_the_scaled_weights(tiny_awq):
    packed = pack_weights(TINY_Q, tiny_awq.weights, tiny_awq.quant, CALIBRATION)
    plain = pack_weights(TINY_Q, tiny_awq.weights, tiny_awq.quant)
    qtype = GGMLQuantizationType[tiny_awq.quant.upper()]
    scaled = awq_layers(TINY_Q, tiny_awq.weights, CALIBRATION, tiny_awq.quant)[1]
    for name, linear in scaled.items():
        np.testing.assert_array_equal(packed[f"l1.{name}_w"], quants.quantize(linear.weight, qtype))
        assert packed[f"l1.{name}_w"].shape == plain[f"l1.{name}_w"].shape
        assert not np.array_equal(packed[f"l1.{name}_w"], plain[f"l1.{name}_w"])
        np.testing.assert_array_equal(packed[f"l1.{name}_b"], linear.bias)
    np.testing.assert_array_equal(packed["l1.fc2_in"], np.float32(1) / scaled["fc2"].scale)
    with pytest.raises(ValueError, match="calibration .AWQ. applies to quantized weights"):
        pack_weights(TINY_Q, tiny_awq.weights, "f32", CALIBRATION)


def test_awq_lowers_the_output_error_of_a_layer_with_outlier_channels():
    rng = np.random.default_rng(1)
    k, n = 128, 64
    loud = np.where(rng.random(k) < 0.05, 20.0, 1.0)  # a few input channels 20x larger, as after LayerNorm
    x_cal, x_new = (rng.standard_normal((t, k)) * loud + 0.3 for t in (512, 256))
    w, b = rng.standard_normal((n, k)).astype(np.float32) * 0.1, np.zeros(n, np.float32)
    scaled = scale_linear(w, b, InputStats.of(x_cal), "q4_0")
    assert scaled.alpha > 0 and scaled.scale.max() / scaled.scale.min() > 2
    err = lambda y: float(np.square(y - x_new @ w.T).mean())  # noqa: E731
    plain = err(x_new @ roundtrip(w, "q4_0").T + b)
    awq = err((x_new / scaled.scale) @ roundtrip(scaled.weight, "q4_0").T + scaled.bias)  # held-out inputs
    assert awq < 0.6 * plain
    assert output_error(roundtrip(w, "q4_0") - w, InputStats.of(x_cal)) == pytest.approx(
        float(np.square(x_cal @ (roundtrip(w, "q4_0") - w).T).mean(0).sum()), rel=1e-4)


def test_calibration_runs_blas_on_one_thread_and_gives_the_pools_back():
    from rlx_llvm.kernels.threads import blas_threads_at_most, pool_threads
    before = pool_threads()
    with blas_threads_at_most(1):
        assert set(pool_threads().values()) == {1}
    assert pool_threads() == before


def test_the_calibration_set_is_not_the_golden_sentences():
    assert not set(CALIBRATION_TEXTS) & set(GOLDEN["sentences"])


def test_the_quantized_layer_is_ten_thunks_around_four_gguf_matmuls(tiny_q):
    layout = weight_layout(pack_weights(TINY_Q, tiny_q.weights, tiny_q.quant))
    sched, slots = encoder_schedule(TINY_Q, layout, 2, 5, quant=tiny_q.quant)
    kinds = [type(t).__name__ for t in sched.thunks]
    layer = ["DequantMatMulGguf", "BiasAdd", "Attention", "DequantMatMulGguf", "FusedResidualLN",
             "DequantMatMulGguf", "BiasAdd", "ActivationInPlace", "DequantMatMulGguf", "FusedResidualLN"]
    assert kinds == ["Gather", "Gather", "ElementwiseRegion", "LayerNorm"] + layer * 2 + \
        ["BatchedSgemm", "Reduce", "ElementwiseRegion", "BinaryFull", "RmsNorm"]
    gemms = [t for t in sched.thunks if type(t).__name__ == "DequantMatMulGguf"]
    assert {t.scheme for t in gemms} == {quant_scheme(tiny_q.quant)}
    assert [(t.m, t.k, t.n) for t in gemms[:4]] == [(10, 32, 96), (10, 32, 32), (10, 32, 64), (10, 64, 32)]
    assert min(slots.values()) >= layout.top


def test_the_awq_layer_scales_three_gemm_inputs(tiny_awq):
    layout = weight_layout(pack_weights(TINY_Q, tiny_awq.weights, tiny_awq.quant, CALIBRATION))
    sched, _ = encoder_schedule(TINY_Q, layout, 2, 5, quant=tiny_awq.quant)
    kinds = [type(t).__name__ for t in sched.thunks[4:4 + 13]]
    assert kinds == ["ElementwiseRegion", "DequantMatMulGguf", "BiasAdd", "Attention", "DequantMatMulGguf",
                     "FusedResidualLN", "ElementwiseRegion", "DequantMatMulGguf", "BiasAdd", "ActivationInPlace",
                     "ElementwiseRegion", "DequantMatMulGguf", "FusedResidualLN"]
    scales = [t for t in sched.thunks[4:4 + 13] if type(t).__name__ == "ElementwiseRegion"]
    assert [t.input_offs[1] for t in scales] == [layout.slots[f"l0.{n}_in"] for n in ("qkv", "fc1", "fc2")]


def test_quantized_packing_is_gguf_blocks_of_the_torch_rows(tiny_q):
    packed = pack_weights(TINY_Q, tiny_q.weights, tiny_q.quant)
    w = tiny_q.weights
    qtype = GGMLQuantizationType[tiny_q.quant.upper()]
    qkv = np.concatenate([w[f"encoder.layer.1.attention.self.{n}.weight"] for n in ("query", "key", "value")])
    np.testing.assert_array_equal(packed["l1.qkv_w"], quants.quantize(qkv, qtype))
    np.testing.assert_array_equal(packed["l0.fc2_w"], quants.quantize(w["encoder.layer.0.output.dense.weight"], qtype))
    assert packed["l0.qkv_b"].dtype == packed["word_emb"].dtype == np.float32
    np.testing.assert_array_equal(packed["word_emb"], w["embeddings.word_embeddings.weight"])  # embeddings stay f32


@pytest.mark.parametrize("bad", ["q4_k", "Q8_0", "int8", ""])
def test_an_unknown_format_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=rf"quant '{bad}' is not supported; choose one of f32, q8_0, q4_0"):
        quant_scheme(bad)
    with pytest.raises(ValueError, match="is not supported"):
        pack_weights(TINY_Q, random_checkpoint(TINY_Q), bad)
    with pytest.raises(ValueError, match="is not supported"):
        SentenceEncoder("/nonexistent", quant=bad)  # before the model is looked for


def test_a_width_that_is_not_a_whole_number_of_blocks_is_refused():
    with pytest.raises(ValueError, match="input width 48 is not a multiple of the 32-element block"):
        pack_weights(TINY, random_checkpoint(TINY), "q8_0")  # intermediate_size 48: fc2's input


# ── all-MiniLM-L6-v2 ─────────────────────────────────────────────────────────

BARS = {"q8_0": (0.999, 0.999), "q4_0": (0.95, 0.97)}  # (min, mean) cosine; measured q4_0 (AWQ): 0.956, 0.976


@functools.cache
def golden_run(quant: str) -> tuple[SentenceEncoder, np.ndarray]:
    """The quantized encoder and its golden-sentence embeddings (one compiled shape per format)."""
    encoder = model_or_skip(quant)
    return encoder, encoder.embed(GOLDEN["sentences"])


@pytest.mark.parametrize("quant", QUANTS)
def test_quantized_embeddings_are_close_to_f32(quant):
    _, got = golden_run(quant)
    want = np.asarray(GOLDEN["embeddings"], np.float32)  # f32 (ours matches these at cosine ≥ 0.9999999)
    cos = cosine(got, want)
    low, mean = BARS[quant]
    assert cos.min() >= low and cos.mean() >= mean, dict(zip(GOLDEN["sentences"], cos))
    assert cos.min() < 0.99999  # and they are not the f32 ones
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_cli_embed_quant(capsys, tmp_path):
    encoder, golden = golden_run("q8_0")
    texts = GOLDEN["sentences"]  # golden_run's shape, so the compiled program comes from the object cache
    schedule = tmp_path / "encoder.json"
    assert main(["embed", *texts, "--quant", "q8_0", "--json", "--schedule", str(schedule)]) == 0
    np.testing.assert_allclose(np.asarray(json.loads(capsys.readouterr().out)), golden, atol=1e-6)
    assert main(["report", str(schedule)]) == 0
    assert capsys.readouterr().out.count("DequantMatMulGguf") == 4 * encoder.config.num_hidden_layers
    assert main(["embed", texts[3], "--quant", "q8_0", "--repeat", "1"]) == 0  # "hello": 3 tokens, cheap
    out = capsys.readouterr().out
    assert "weights: linear layers Q8_0 (GGUF blocks, DequantMatMulGguf); embeddings, norms, pooling f32" in out
