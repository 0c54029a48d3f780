"""ONNX Attention (opset 23+) and RotaryEmbedding (opset 23) on `Graph.attention` / `rope`.

Attention: 3-D `[batch, seq, heads·dim]` or 4-D `[batch, heads, seq, dim]` operands (GQA by kv_num_heads),
past_key/past_value concatenated into present_key/present_value, `is_causal`, boolean or additive
`attn_mask` (broadcast to `[batch, heads, seq, kv]`, padded past its length as ONNX does).  Masks become
one additive bias where a masked score is −1e30 rather than −inf; the output rows of queries that see no
key are then set to zero, as ONNX defines them (the thunk would average every value).  A causal mask
without attn_mask runs as the thunk's own Causal kind when it is ONNX's (queries at the end of the keys:
no cross-attention without past), else as a bias.  softcap and the qk_matmul_output output run written out in
graph ops (QKᵀ, softcap, bias, softmax, ·V); sliding windows (opset 25) are one more constant bias, and
nonpad_kv_seqlen (an external cache) a bias computed at run time from its per-batch frontier.

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


def _window_bias(s: int, kv: int, offset: int, left: int, right: int) -> np.ndarray:
    """`[s, kv]`: 0 where query i (at offset + i) may see key j — `p − left ≤ j ≤ p + right`, −1 unbounded."""
    diff = np.arange(s)[:, None] + offset - np.arange(kv)[None, :]
    allowed = ((left < 0) | (diff <= left)) & ((right < 0) | (-diff <= right))
    return np.where(allowed, 0.0, MASKED).astype(np.float32)


def _frontier_bias(cx: Convert, nonpad: Value, s: int, kv: int, causal: bool, window: tuple[int, int]) -> Value:
    """`[b, 1, s, kv]` from the run-time `nonpad_kv_seqlen [b]`: keys j ≥ nonpad[b] masked, and with `causal` /
    `window` query i sits at nonpad[b] − s + i (ONNX's external cache).  With `d = j − i + s` (a constant):
    causal is `d ≤ n`, the left window `d + left ≥ n`, the right one `d − right ≤ n`."""
    g = cx.g
    n = g.reshape(g.cast(nonpad, DType.I64), [nonpad.shape[0], 1, 1])
    d = np.arange(kv)[None, :] - np.arange(s)[:, None] + s
    tests = [("lt", np.broadcast_to(np.arange(kv), (s, kv)))]           # padding: j < n
    if causal:
        tests.append(("le", d))
    left, right = window
    if left >= 0:
        tests.append(("ge", d + left))
    if right >= 0:
        tests.append(("le", d - right))
    bias = None
    for op, lhs in tests:
        ok = g.wide_compare(op, g.constant(np.ascontiguousarray(lhs, np.int64)[None], DType.I64), n)   # [b, s, kv]
        term = g.where_(ok, g.constant(0.0), g.constant(MASKED))
        bias = term if bias is None else bias + term
    return g.reshape(bias, [nonpad.shape[0], 1, s, kv])


def _mask_bias(cx: Convert, node, kv: int) -> Value:
    """attn_mask as an additive f32 bias of last axis kv (bool: 0 / MASKED; −inf clamped to MASKED)."""
    g = cx.g
    mask = _f32_input(cx, node, 3)
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


HALF = (DType.F16, DType.BF16)


def _f32_input(cx: Convert, node, i: int) -> Value:
    """Input `i`, f16/bf16 widened to f32 (half-precision attention is computed in f32, rounded back once)."""
    x = cx.tensor(node.input[i])
    return cx.g.cast(x, DType.F32) if x.dtype in HALF else x


@converts("Attention")
def _attention(cx: Convert, node) -> list:
    dtype = cx.tensor(node.input[0]).dtype
    outputs = _attention_f32(cx, node)
    return outputs if dtype not in HALF else [cx.g.cast(o, dtype) for o in outputs]


def _attention_f32(cx: Convert, node) -> list:
    """Attention's outputs (Y, present K/V, qk_matmul_output when asked) computed in f32."""
    g = cx.g
    q, k, v = (_f32_input(cx, node, i) for i in range(3))
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
        pk, pv = _f32_input(cx, node, 4), _f32_input(cx, node, 5)
        past = pk.shape[2]
        presents = [g.concat([pk, k4], 2), g.concat([pv, v4], 2)]
        k, v = _to_3d(g, presents[0]), _to_3d(g, presents[1])
    b, s, kv = q.shape[0], q.shape[1], k.shape[1]
    head_dim = q.shape[2] // heads
    scale = cx.attr(node, "scale")
    scale = None if scale is None else float(scale)
    causal = bool(cx.attr(node, "is_causal", 0))
    softcap = float(cx.attr(node, "softcap", 0.0))
    qk_output = len(node.output) > 3 and bool(node.output[3])
    window = int(cx.attr(node, "left_window_size", -1)), int(cx.attr(node, "right_window_size", -1))
    nonpad = cx.tensor(node.input[6]) if cx.has(node, 6) else None
    if not cx.has(node, 3) and (not causal or past == kv - s) and not softcap and not qk_output \
            and window == (-1, -1) and nonpad is None:
        y = g.attention_kind(q, k, v, heads, head_dim, "causal" if causal else "none", scale)
        return [_to_4d(g, y, heads) if four_d else y, *presents]
    bias = _mask_bias(cx, node, kv) if cx.has(node, 3) else g.constant(np.zeros((s, kv), np.float32))
    if nonpad is not None and not past:       # an external cache: each batch's frontier is nonpad[b] − s
        bias = bias + _frontier_bias(cx, nonpad, s, kv, causal, window)
    else:
        if causal:
            bias = bias + g.constant(_causal_bias(s, kv, past))
        if window != (-1, -1):
            bias = bias + g.constant(_window_bias(s, kv, past, *window))
        if nonpad is not None:
            bias = bias + _frontier_bias(cx, nonpad, s, kv, False, (-1, -1))
    bias = g.broadcast_to(bias, (b, heads, s, kv))
    if softcap or qk_output:
        y, qk = _written_out(cx, node, _to_4d(g, q, heads), presents, bias, scale, softcap)
        return [_to_4d(g, y, heads) if four_d else y, *presents, *([qk] if qk_output else [])]
    y = _zero_masked_rows(cx, g.attention(q, k, v, bias, heads, head_dim, scale), bias)
    return [_to_4d(g, y, heads) if four_d else y, *presents]


def _written_out(cx: Convert, node, q4: Value, presents: list, bias: Value, scale: float | None,
                 softcap: float) -> tuple[Value, Value]:
    """`(y [b, s, heads·dv], qk_matmul_output)` in graph ops, ONNX's order: `QKᵀ·scale`, softcap, `+ bias`,
    softmax (rows that see no key zeroed), `@ V`; qk_matmul_output_mode 0/1 the (softcapped) scores, 2 with the
    bias (masked = −inf), 3 the probabilities."""
    g = cx.g
    b, heads, s, d = q4.shape
    k4, v4 = (_repeat_heads(g, t, heads) for t in presents)
    scores = g.matmul(q4, g.transpose(k4, [0, 1, 3, 2])) * (1.0 / float(np.sqrt(d)) if scale is None else scale)
    if softcap:
        scores = g.tanh(scores * (1.0 / softcap)) * softcap
    sees = g.cast(g.reduce(bias, "max", -1, True) > MASKED / 2, "f32")                # [b, heads, s, 1]
    probs = g.softmax(scores + bias, -1) * sees
    mode = int(cx.attr(node, "qk_matmul_output_mode", 0))
    if mode == 2:
        qk = scores + g.where_(bias > MASKED / 2, bias, g.constant(float("-inf")))
    else:
        qk = probs if mode == 3 else scores
    return _to_3d(g, g.matmul(probs, v4)), qk


def _repeat_heads(g, x: Value, heads: int) -> Value:
    """`[b, kv_heads, n, d]` with each kv head repeated for its heads/kv_heads query heads (GQA)."""
    b, kv_heads, n, d = x.shape
    if kv_heads == heads:
        return x
    group = heads // kv_heads
    return g.reshape(g.broadcast_to(g.reshape(x, [b, kv_heads, 1, n, d]), (b, kv_heads, group, n, d)), [b, heads, n, d])


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
