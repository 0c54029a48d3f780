"""The BERT encoder (MiniLM) written with the graph API — the compiler finds the FusedBertLayers itself.

    g = encoder_graph(config)                       # dynamic batch and sequence
    cg = rl.Session().compile(g)
    for name, array in pack_weights(config, weights).items():
        if name in g.params: cg.set_param(name, array)
    emb, = cg.run({"ids": ids, "type_ids": type_ids, "pos_ids": pos_ids, "mask": mask})

Same math as `bert.encoder_schedule` (post-LN layers, mean pooling over unmasked tokens, L2 normalize);
parameters carry `pack_weights`' slot names.
"""
from __future__ import annotations

from ..graph import Graph, Value
from .bert import NORM_EPS, POOL_EPS, BertConfig, Pooling


def _layer(g: Graph, c: BertConfig, i: int, x: Value, mask: Value) -> Value:
    """One post-LN layer: attention on the fused QKV projection, residual + LN, GELU FFN, residual + LN."""
    hs, inter = c.hidden_size, c.intermediate_size
    p = lambda name, *shape: g.param(f"l{i}.{name}", shape)  # noqa: E731
    qkv = x @ p("qkv_w", hs, 3 * hs) + p("qkv_b", 3 * hs)
    q, k, v = (g.narrow(qkv, 2, j * hs, hs) for j in range(3))
    attn = g.attention(q, k, v, mask, num_heads=c.num_attention_heads, head_dim=c.head_dim)
    n1 = g.layer_norm(attn @ p("out_w", hs, hs) + p("out_b", hs) + x, p("ln1_g", hs), p("ln1_b", hs),
                      eps=c.layer_norm_eps)
    ffn = g.gelu(n1 @ p("fc1_w", hs, inter) + p("fc1_b", inter)) @ p("fc2_w", inter, hs) + p("fc2_b", hs)
    return g.layer_norm(ffn + n1, p("ln2_g", hs), p("ln2_b", hs), eps=c.layer_norm_eps)


def encoder_graph(c: BertConfig, batch: int = -1, seq: int = -1, pooling: Pooling = Pooling()) -> Graph:
    """The sentence encoder: inputs ids/type_ids/pos_ids (i64 `[batch, seq]`) and mask (f32); one output,
    the pooled embeddings `[batch, hidden]`."""
    g = Graph("minilm")
    hs = c.hidden_size
    ids, type_ids, pos_ids = (g.input(n, [batch, seq], "i64") for n in ("ids", "type_ids", "pos_ids"))
    mask = g.input("mask", [batch, seq])
    emb = (g.gather(g.param("word_emb", [c.vocab_size, hs]), ids)
           + g.gather(g.param("type_emb", [c.type_vocab_size, hs]), type_ids)
           + g.gather(g.param("pos_emb", [c.max_position_embeddings, hs]), pos_ids))
    x = g.layer_norm(emb, g.param("emb_ln_g", [hs]), g.param("emb_ln_b", [hs]), eps=c.layer_norm_eps)
    for i in range(c.num_hidden_layers):
        x = _layer(g, c, i, x, mask)
    if pooling.mode == "cls":
        pooled = g.reshape(g.narrow(x, 1, 0, 1), [0, hs])
    else:
        sums = g.reshape(g.matmul(g.reshape(mask, [0, 1, -1]), x), [0, hs])
        pooled = sums / g.maximum(g.sum(mask, 1, keep_dim=True), g.constant(POOL_EPS))
    if pooling.normalize:
        pooled = g.rms_norm(pooled, g.constant([hs ** -0.5] * hs), g.constant([0.0] * hs), eps=NORM_EPS / hs)
    g.set_outputs([pooled])
    return g
