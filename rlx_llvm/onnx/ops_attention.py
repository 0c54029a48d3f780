"""ONNX Attention (opset 23+) and RotaryEmbedding (opset 23) on `Graph.attention` / `rope`.

Attention: 3-D `[batch, seq, heads·dim]` or 4-D `[batch, heads, seq, dim]` operands (GQA by kv_num_heads),
past_key/past_value concatenated into present_key/present_value, `is_causal`, boolean or additive
`attn_mask` (broadcast to `[batch, heads, seq, kv]`, padded past its length as ONNX does).  Masks become
one additive bias where a masked score is −1e30 rather than −inf; the output rows of queries that see no
key are then set to zero, as ONNX defines them (the thunk would average every value).  A causal mask
without attn_mask runs as the thunk's own Causal kind when it is ONNX's (queries at the end of the keys:
no cross-attention without past), else as a bias.  Refused by
name: softcap, the qk_matmul_output output, nonpad_kv_seqlen, sliding windows (opset 25).

RotaryEmbedding: ONNX's non-interleaved halves are the thunk's NeoX halves and interleaved its GPT-J
pairs; the cos/sin caches are gathered by position_ids into one table row per token.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import DType
from ..graph import Value
from .importer import Convert, Unsupported, converts

MASKED = -1e30


def _to_3d(g, x: Value) -> Value:
    """`[b, h, s, d]` → `[b, s, h·d]`."""
    b, h, s, d = x.shape
    return g.reshape(g.transpose(x, [0, 2, 1, 3]), [b, s, h * d])


def _to_4d(g, x: Value, heads: int) -> Value:
    """`[b, s, h·d]` → `[b, h, s, d]`."""
    b, s, hd = x.shape
    return g.transpose(g.reshape(x, [b, s, heads, hd // heads]), [0, 2, 1, 3])


def _causal_bias(s: int, kv: int, offset: int) -> np.ndarray:
    """`[s, kv]`: 0 where key j ≤ query i + offset, else MASKED."""
    allowed = np.arange(kv)[None, :] <= np.arange(s)[:, None] + offset
    return np.where(allowed, 0.0, MASKED).astype(np.float32)


def _mask_bias(cx: Convert, node, kv: int) -> Value:
    """attn_mask as an additive f32 bias of last axis kv (bool: 0 / MASKED; −inf clamped to MASKED)."""
    g = cx.g
    mask = cx.tensor(node.input[3])
    if mask.dtype == DType.Bool:
        mask = g.where_(mask, g.constant(0.0), g.constant(MASKED))
    elif mask.dtype == DType.F32:
        mask = g.maximum(mask, g.constant(MASKED))
    else:
        raise Unsupported(f"attn_mask of type {mask.dtype.value} (bool or float)")
    short = kv - mask.shape[-1]
    if short > 0:
        mask = g.concat([mask, g.constant(np.full((*mask.shape[:-1], short), MASKED, np.float32))], -1)
    return mask


@converts("Attention")
def _attention(cx: Convert, node) -> list:
    g = cx.g
    if cx.has(node, 6):
        raise Unsupported("input 6 (nonpad_kv_seqlen) is not supported")
    if len(node.output) > 3 and node.output[3]:
        raise Unsupported("output 3 (qk_matmul_output) is not produced")
    if cx.attr(node, "softcap", 0.0):
        raise Unsupported("softcap is not supported")
    if cx.attr(node, "left_window_size", -1) != -1 or cx.attr(node, "right_window_size", -1) != -1:
        raise Unsupported("sliding windows (left/right_window_size) are not supported")
    q, k, v = (cx.tensor(node.input[i]) for i in range(3))
    four_d = q.ndim == 4
    if four_d:
        heads, kv_heads = q.shape[1], k.shape[1]
        k4, v4 = k, v
        q, k, v = (_to_3d(g, t) for t in (q, k, v))
    else:
        heads, kv_heads = int(cx.attr(node, "q_num_heads", 0)), int(cx.attr(node, "kv_num_heads", 0))
        if not heads or not kv_heads:
            raise Unsupported("3-D operands need q_num_heads and kv_num_heads")
        k4, v4 = _to_4d(g, k, kv_heads), _to_4d(g, v, kv_heads)
    past, presents = 0, [k4, v4]
    if cx.has(node, 4) or cx.has(node, 5):
        pk, pv = cx.tensor(node.input[4]), cx.tensor(node.input[5])
        past = pk.shape[2]
        presents = [g.concat([pk, k4], 2), g.concat([pv, v4], 2)]
        k, v = _to_3d(g, presents[0]), _to_3d(g, presents[1])
    b, s, kv = q.shape[0], q.shape[1], k.shape[1]
    head_dim = q.shape[2] // heads
    scale = cx.attr(node, "scale")
    scale = None if scale is None else float(scale)
    causal = bool(cx.attr(node, "is_causal", 0))
    if not cx.has(node, 3) and (not causal or past == kv - s):
        y = g.attention_kind(q, k, v, heads, head_dim, "causal" if causal else "none", scale)
    else:
        bias = _mask_bias(cx, node, kv) if cx.has(node, 3) else g.constant(np.zeros((s, kv), np.float32))
        if causal:
            bias = bias + g.constant(_causal_bias(s, kv, past))
        bias = g.broadcast_to(bias, (b, heads, s, kv))
        y = _zero_masked_rows(cx, g.attention(q, k, v, bias, heads, head_dim, scale), bias)
    return [_to_4d(g, y, heads) if four_d else y, *presents]


def _zero_masked_rows(cx: Convert, y: Value, bias: Value) -> Value:
    """`y [b, s, heads·dv]` with the rows of queries that see no key set to 0, as ONNX defines them."""
    g = cx.g
    b, heads, s, _ = bias.shape
    sees = g.cast(g.reduce(bias, "max", -1) > MASKED / 2, "f32")                   # [b, heads, s]
    sees = g.reshape(g.transpose(sees, [0, 2, 1]), [b, s, heads, 1])
    return g.reshape(g.reshape(y, [b, s, heads, y.shape[-1] // heads]) * sees, list(y.shape))


@converts("RotaryEmbedding")
def _rotary(cx: Convert, node) -> list:
    g = cx.g
    x = cx.tensor(node.input[0])
    four_d = x.ndim == 4
    heads = x.shape[1] if four_d else int(cx.attr(node, "num_heads", 0))
    if not heads:
        raise Unsupported("a 3-D input needs num_heads")
    x3 = _to_3d(g, x) if four_d else x
    b, s, hidden = x3.shape
    head_dim = hidden // heads
    rot = int(cx.attr(node, "rotary_embedding_dim", 0)) or head_dim
    tables = []
    for i in (1, 2):
        cache = cx.tensor(node.input[i])
        if cx.has(node, 3):
            cache = g.gather(cache, cx.tensor(node.input[3]), axis=0)        # [b, s, rot/2]
        tables.append(g.reshape(cache, [b * s, cache.shape[-1]]))
    y = g.rope(x3, tables[0], tables[1], head_dim, n_rot=rot, interleaved=bool(cx.attr(node, "interleaved", 0)))
    return [_to_4d(g, y, heads) if four_d else y]
