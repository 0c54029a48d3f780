"""MiniLM written with the graph API (rlx_llvm.models.bert_graph): the compiler finds the six
FusedBertLayers, the embeddings equal the hand-built encoder's, and the plan is near its bound."""
from __future__ import annotations

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import thunks as T
from tests.models.test_sentence import GOLDEN, cosine, model_or_skip


@pytest.fixture(scope="module")
def built():
    from rlx_llvm.models.bert_graph import encoder_graph
    enc = model_or_skip()
    g = encoder_graph(enc.config, pooling=enc.pooling)
    cg = rl.Session().compile(g)
    for name in g.params:
        cg.set_param(name, enc.graph.params[name])
    return enc, cg


def feeds(enc, texts):
    ids, mask = enc.tokenize(texts)
    pos = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()
    return {"ids": ids, "type_ids": np.zeros_like(ids), "pos_ids": pos, "mask": mask}


def test_graph_minilm_equals_the_hand_built_encoder(built):
    enc, cg = built
    f = feeds(enc, GOLDEN["sentences"])
    got, = cg.run(f)
    hand = enc.embed_tokens(f["ids"], f["mask"])
    assert cosine(got, hand).min() >= 0.9999
    assert cosine(got, np.asarray(GOLDEN["embeddings"], np.float32)).min() >= 0.9999
    kinds = [type(t).__name__ for t in cg.schedule.thunks]
    assert kinds.count("FusedBertLayer") == enc.config.num_hidden_layers == 6
    assert "Sgemm" not in kinds and "Attention" not in kinds
    assert cg.report().count("bert_layer:") == 6


def test_dynamic_shapes_reuse_the_graph(built):
    enc, cg = built
    texts = ["a short one", "and another, somewhat longer sentence to pad against"]
    got, = cg.run(feeds(enc, texts))
    np.testing.assert_allclose(got, enc.embed(texts), atol=2e-6)


def test_plan_is_near_the_peak_and_shares_intermediates(built):
    _, cg = built
    cg.run(feeds(cg and built[0], GOLDEN["sentences"]))
    p = cg.plan()
    assert p.activation_bytes <= 1.10 * p.activation_lower_bound, p.table().splitlines()[0]
    assert p.activation_bytes <= 0.5 * p.intermediate_bytes, p.table().splitlines()[0]
