"""The BERT encoder schedule (rlx_llvm.models.bert) on a tiny random checkpoint in Hugging Face
naming, against a float64 NumPy BERT written here from the model's definition (not from our
thunks): embeddings + LayerNorm, post-LN layers with erf GELU, masked mean pooling, L2 normalize."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import reference
from rlx_llvm.models.bert import BertConfig, Pooling, encoder_schedule, pack_weights, weight_layout

TINY = BertConfig(vocab_size=41, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=48, max_position_embeddings=24, type_vocab_size=2, layer_norm_eps=1e-12)


def random_checkpoint(c: BertConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random tensors with BertModel's names and shapes (torch Linear weights are [out, in])."""
    rng = np.random.default_rng(seed)
    r = lambda *shape, s=0.3: (rng.standard_normal(shape) * s).astype(np.float32)
    h, i = c.hidden_size, c.intermediate_size
    w = {"embeddings.word_embeddings.weight": r(c.vocab_size, h),
         "embeddings.position_embeddings.weight": r(c.max_position_embeddings, h),
         "embeddings.token_type_embeddings.weight": r(c.type_vocab_size, h),
         "embeddings.LayerNorm.weight": 1 + r(h, s=0.1), "embeddings.LayerNorm.bias": r(h, s=0.1),
         "embeddings.position_ids": np.arange(c.max_position_embeddings)[None]}
    for layer in range(c.num_hidden_layers):
        p = f"encoder.layer.{layer}."
        for name, (o, n) in {"attention.self.query": (h, h), "attention.self.key": (h, h),
                             "attention.self.value": (h, h), "attention.output.dense": (h, h),
                             "intermediate.dense": (i, h), "output.dense": (h, i)}.items():
            w[f"{p}{name}.weight"], w[f"{p}{name}.bias"] = r(o, n, s=n ** -0.5), r(o, s=0.1)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[f"{p}{ln}.weight"], w[f"{p}{ln}.bias"] = 1 + r(h, s=0.1), r(h, s=0.1)
    return w


def _ln(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * g + b


def numpy_bert(c: BertConfig, w: dict, ids, type_ids, mask, pooling: Pooling = Pooling()) -> np.ndarray:
    """float64 BertModel → mean (over mask) or CLS pooling → F.normalize or not (sentence-transformers'
    Pooling and Normalize modules)."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    lin = lambda x, name: x @ w[f"{name}.weight"].T + w[f"{name}.bias"]
    b, s = ids.shape
    nh, dh = c.num_attention_heads, c.head_dim
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][type_ids] \
        + w["embeddings.position_embeddings.weight"][:s]
    x = _ln(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], c.layer_norm_eps)
    bias = np.where(mask[:, None, None, :] < 0.5, -1e9, 0.0)
    heads = lambda t: t.reshape(b, s, nh, dh).transpose(0, 2, 1, 3)
    for layer in range(c.num_hidden_layers):
        p = f"encoder.layer.{layer}."
        q, k, v = (heads(lin(x, f"{p}attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh) + bias
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        ctx = (scores / scores.sum(-1, keepdims=True)) @ v
        a = lin(ctx.transpose(0, 2, 1, 3).reshape(b, s, -1), f"{p}attention.output.dense")
        x = _ln(a + x, w[f"{p}attention.output.LayerNorm.weight"], w[f"{p}attention.output.LayerNorm.bias"],
                c.layer_norm_eps)
        f = lin(x, f"{p}intermediate.dense")
        f = 0.5 * f * (1 + np.vectorize(math.erf)(f / math.sqrt(2)))
        x = _ln(lin(f, f"{p}output.dense") + x, w[f"{p}output.LayerNorm.weight"], w[f"{p}output.LayerNorm.bias"],
                c.layer_norm_eps)
    if pooling.mode == "cls":
        pooled = x[:, 0]
    else:
        pooled = (x * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
    if not pooling.normalize:
        return pooled
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


@dataclasses.dataclass
class Tiny:
    """The tiny checkpoint packed (f32 or `quant`) into an arena, with a cache of compiled shapes."""

    config: BertConfig
    weights: dict
    quant: str = "f32"
    calibration: list | None = None  # token rows: AWQ-scaled quantized weights
    programs: dict = dataclasses.field(default_factory=dict)

    def run(self, ids, type_ids, mask, oracle: bool = False, pooling: Pooling = Pooling()) -> np.ndarray:
        packed = pack_weights(self.config, self.weights, self.quant, self.calibration)
        layout = weight_layout(packed)
        sched, slots = encoder_schedule(self.config, layout, *ids.shape, pooling, self.quant)
        arena = rl.Arena(sched.arena_bytes)
        for name, array in packed.items():
            arena.write(layout.slots[name], array)
        arena.write(slots["ids"], ids.astype(np.int64))
        arena.write(slots["type_ids"], type_ids.astype(np.int64))
        arena.write(slots["mask"], mask.astype(np.float32))
        if oracle:
            reference.run(sched, arena)
        else:
            key = (ids.shape, pooling)
            if key not in self.programs:
                self.programs[key] = rl.compile(sched)
            self.programs[key].run(arena)
        return arena.read(slots["embeddings"], "f32", (ids.shape[0], self.config.hidden_size))


@pytest.fixture(scope="module")
def tiny() -> Tiny:
    return Tiny(TINY, random_checkpoint(TINY))


def inputs(batch: int, seq: int, seed: int = 1):
    """Random ids and token types; sequence i keeps its first seq - 2i tokens (at least 1)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, TINY.vocab_size, (batch, seq))
    types = rng.integers(0, TINY.type_vocab_size, (batch, seq))
    mask = np.zeros((batch, seq), np.float32)
    for i in range(batch):
        mask[i, :max(1, seq - 2 * i)] = 1
    return ids, types, mask


@pytest.mark.parametrize("batch,seq", [(1, 1), (3, 7), (2, 17), (1, 24)])
def test_encoder_matches_numpy_bert(tiny, batch, seq):
    ids, types, mask = inputs(batch, seq)
    want = numpy_bert(TINY, tiny.weights, ids, types, mask)
    got = tiny.run(ids, types, mask)
    np.testing.assert_allclose(got, want, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


@pytest.mark.parametrize("pooling", [Pooling("cls", True), Pooling("mean", False), Pooling("cls", False)])
def test_other_pipelines_match_numpy_bert(tiny, pooling):
    ids, types, mask = inputs(3, 7)
    want = numpy_bert(TINY, tiny.weights, ids, types, mask, pooling)
    np.testing.assert_allclose(tiny.run(ids, types, mask, pooling=pooling), want, atol=2e-5)
    if not pooling.normalize:
        assert np.abs(np.linalg.norm(want, axis=1) - 1).max() > 0.1  # the test can tell


def test_unknown_pooling_is_refused():
    with pytest.raises(ValueError, match="pooling mode 'max'"):
        Pooling("max")


def test_reference_oracle_agrees(tiny):
    ids, types, mask = inputs(3, 7)
    np.testing.assert_allclose(tiny.run(ids, types, mask, oracle=True), tiny.run(ids, types, mask), atol=1e-5)


def test_padding_does_not_change_an_embedding(tiny):
    """A sequence alone equals the same sequence padded with junk tokens to a longer batch."""
    ids, types, mask = inputs(3, 7)
    alone = tiny.run(ids[1:2, :5], types[1:2, :5], mask[1:2, :5])
    junk = ids.copy()
    junk[1, 5:] = 7
    np.testing.assert_allclose(tiny.run(junk, types, mask)[1:2], alone, atol=2e-6)


def test_schedule_is_the_documented_pipeline(tiny):
    layout = weight_layout(pack_weights(TINY, tiny.weights))
    sched, slots = encoder_schedule(TINY, layout, 2, 5)
    kinds = [type(t).__name__ for t in sched.thunks]
    assert kinds == ["Gather", "Gather", "ElementwiseRegion", "LayerNorm"] + ["FusedBertLayer"] * 2 + \
        ["BatchedSgemm", "Reduce", "ElementwiseRegion", "BinaryFull", "RmsNorm"]
    assert min(slots.values()) >= layout.top  # activations after the weights
    layer = sched.thunks[4]
    assert (layer.hs, layer.nh, layer.dh, layer.int_dim, layer.batch, layer.seq) == (32, 4, 8, 48, 2, 5)


def test_qkv_is_fused_in_query_key_value_order(tiny):
    packed = pack_weights(TINY, tiny.weights)
    h = TINY.hidden_size
    assert packed["l0.qkv_w"].shape == (h, 3 * h)
    np.testing.assert_array_equal(packed["l0.qkv_w"][:, h:2 * h], tiny.weights["encoder.layer.0.attention.self.key.weight"].T)
    np.testing.assert_array_equal(packed["l1.qkv_b"][2 * h:], tiny.weights["encoder.layer.1.attention.self.value.bias"])


def test_sequence_longer_than_the_position_table_is_refused(tiny):
    layout = weight_layout(pack_weights(TINY, tiny.weights))
    with pytest.raises(ValueError, match="position table"):
        encoder_schedule(TINY, layout, 1, TINY.max_position_embeddings + 1)


@pytest.mark.parametrize("change,match", [({"hidden_act": "relu"}, "erf GELU"), ({"model_type": "roberta"}, "bert"),
                                          ({"position_embedding_type": "relative_key"}, "absolute")])
def test_unsupported_configs_are_refused(tmp_path, change, match):
    raw = {**dataclasses.asdict(TINY), "model_type": "bert", "hidden_act": "gelu", **change}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=match):
        BertConfig.from_json(tmp_path / "config.json")


def test_config_reads_hugging_face_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**dataclasses.asdict(TINY), "architectures": ["BertModel"]}))
    assert BertConfig.from_json(tmp_path / "config.json") == TINY
