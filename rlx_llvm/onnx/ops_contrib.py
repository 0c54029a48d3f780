"""ONNX Runtime contrib ops (domain com.microsoft) that exported transformers use: Gelu, BiasGelu, FastGelu,
SkipLayerNormalization, SkipSimplifiedLayerNormalization, Attention, MatMulNBits, EmbedLayerNormalization.

MatMulNBits' weights are import-time constants: 4-bit ones are repacked into the `DequantMatMulInt4` layout
(`[K, N]` nibbles row-major, f32 scale and zero point per `[block, column]`), 8-bit ones dequantized once,
exactly, into an f32 `[K, N]` constant for `matmul`.  Either is the product ORT computes at `accuracy_level` 0
(higher levels let ORT quantize A to int8: ours stays f32).  Attention's fused QKV
projection is one matmul whose result is narrowed into q, k, v (the `bert_layer` fusion's pattern).
"""
from __future__ import annotations

import numpy as np

from ..graph import Value
from .importer import Convert, Unsupported, converts
from .ops_math import _float, _vector

MS = "com.microsoft"
GELUS = {"Gelu": "gelu", "BiasGelu": "gelu", "FastGelu": "gelu_approx"}


def _refuse_outputs(node, slots: dict[int, str]) -> None:
    """Unsupported when an optional output this converter does not produce is requested."""
    for i, what in slots.items():
        if i < len(node.output) and node.output[i]:
            raise Unsupported(f"output {i} ({what}) is not produced")


@converts(*GELUS, domain=MS)
def _gelu(cx: Convert, node) -> list:
    x = _float(cx, node)
    if cx.has(node, 1):
        x = x + cx.tensor(node.input[1])
    return [cx.g.activation(GELUS[node.op_type], x)]


@converts("SkipLayerNormalization", "SkipSimplifiedLayerNormalization", domain=MS)
def _skip_layer_norm(cx: Convert, node) -> list:
    """`s = input + skip (+ bias)`; outputs LayerNorm(s) (RMS norm for the simplified one) and s."""
    _refuse_outputs(node, {1: "mean", 2: "inv_std_var"})
    simplified = node.op_type == "SkipSimplifiedLayerNormalization"
    x, g = _float(cx, node), cx.g
    h = x.shape[-1]
    s = x + cx.tensor(node.input[1])
    bias_slot = 3 if simplified else 4
    if cx.has(node, bias_slot):
        s = s + cx.tensor(node.input[bias_slot])
    gamma = _vector(cx, cx.tensor(node.input[2]), h)
    beta = _vector(cx, cx.tensor(node.input[3]), h) if not simplified and cx.has(node, 3) else \
        g.constant(np.zeros(h, np.float32))
    eps = float(cx.attr(node, "epsilon", 1e-12))
    norm = g.rms_norm(s, gamma, beta, eps) if simplified else g.layer_norm(s, gamma, beta, eps=eps)
    return [norm, None, None, s]


@converts("Attention", domain=MS)
def _attention(cx: Convert, node) -> list:
    """Self-attention with a fused QKV projection; mask_index as 2-D keep flags or 1-D end positions."""
    for i, what in ((4, "past"), (5, "attention_bias"), (6, "past_sequence_length")):
        if cx.has(node, i):
            raise Unsupported(f"input {i} ({what}) is not supported")
    _refuse_outputs(node, {1: "present"})
    if cx.attr(node, "do_rotary", 0):
        raise Unsupported("do_rotary is not supported")
    g = cx.g
    x = _float(cx, node)
    heads = int(cx.attr(node, "num_heads"))
    w = cx.tensor(node.input[1])
    sizes = list(cx.attr(node, "qkv_hidden_sizes", [w.shape[1] // 3] * 3))
    if sizes[0] != sizes[1] or any(s % heads for s in sizes):
        raise Unsupported(f"qkv_hidden_sizes {sizes}: q and k must have one size, each a multiple of num_heads")
    qkv = g.matmul(x, w)
    if cx.has(node, 2):
        qkv = qkv + cx.tensor(node.input[2])
    starts = np.cumsum([0, *sizes])
    q, k, v = (g.narrow(qkv, -1, int(a), int(n)) for a, n in zip(starts, sizes))
    head_dim = sizes[0] // heads
    scale = cx.attr(node, "scale")
    scale = None if not scale else float(scale)
    causal = bool(cx.attr(node, "unidirectional", 0))
    if not cx.has(node, 3):
        return [g.attention_kind(q, k, v, heads, head_dim, "causal" if causal else "none", scale)]
    if causal:
        raise Unsupported("unidirectional together with mask_index is not supported")
    return [g.attention(q, k, v, _keep_mask(cx, node, x), heads, head_dim, scale)]


def _keep_mask(cx: Convert, node, x: Value) -> Value:
    """mask_index as an f32 `[batch, seq]` keep-mask: 2-D flags as they are, 1-D as `position < end[b]`."""
    g, (batch, seq, _) = cx.g, x.shape
    mask = cx.tensor(node.input[3])
    if mask.shape == (batch, seq):
        return g.cast(mask, "f32")
    if mask.shape == (batch,):
        ends = g.reshape(g.cast(mask, "f32"), [batch, 1])
        positions = g.constant(np.arange(seq, dtype=np.float32).reshape(1, seq))
        return g.cast(g.compare("lt", g.broadcast_to(positions, (batch, seq)), g.broadcast_to(ends, (batch, seq))),
                      "f32")
    raise Unsupported(f"mask_index of shape {list(mask.shape)} (only [batch, seq] flags or [batch] end positions)")


# ── MatMulNBits ─────────────────────────────────────────────────────────────

def unpack_codes(packed: np.ndarray, bits: int) -> np.ndarray:
    """Little-end-first codes of `bits` (4 or 8) from uint8 bytes along the last axis."""
    if bits == 8:
        return packed.astype(np.int32)
    if bits != 4:
        raise Unsupported(f"bits={bits} (4 and 8 are supported)")
    return np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1).astype(np.int32)


def nbits_blocks(cx: Convert, node) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MatMulNBits' B as (codes `[K, N]` int32, scale and zero f32 `[⌈K/block⌉, N]`)."""
    k, n, bits, block = (int(cx.attr(node, a)) for a in ("K", "N", "bits", "block_size"))
    if cx.has(node, 4):
        raise Unsupported("g_idx (act-order groups) is not supported")
    blocks = -(-k // block)
    codes = unpack_codes(cx.need_const(node, 1, "B"), bits).reshape(n, blocks * block)[:, :k]
    scales = cx.need_const(node, 2, "scales").astype(np.float32).reshape(n, blocks)
    if not cx.has(node, 3):
        zero = np.full((n, blocks), 1 << (bits - 1), np.float32)
    else:
        z = cx.need_const(node, 3, "zero_points")
        zero = (unpack_codes(z.reshape(n, -1), bits)[:, :blocks] if z.dtype == np.uint8
                else z.reshape(n, blocks)).astype(np.float32)
    return np.ascontiguousarray(codes.T), np.ascontiguousarray(scales.T), np.ascontiguousarray(zero.T)


def packed_nibbles(codes: np.ndarray) -> np.ndarray:
    """4-bit codes, row-major, two per byte (even index in the low nibble)."""
    flat = np.append(codes.ravel(), 0) if codes.size % 2 else codes.ravel()
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


@converts("MatMulNBits", domain=MS)
def _matmul_nbits(cx: Convert, node) -> list:
    """4-bit: one DequantMatMulInt4 on the repacked nibbles; 8-bit: dequantized at import, then matmul."""
    g, a = cx.g, _float(cx, node)
    codes, scale, zero = nbits_blocks(cx, node)
    block = int(cx.attr(node, "block_size"))
    if int(cx.attr(node, "bits")) == 4:
        y = g.dequant_matmul_int4(a, g.constant(packed_nibbles(codes), "u8"), g.constant(scale), g.constant(zero),
                                  block)
    else:
        rows = np.arange(codes.shape[0]) // block
        y = g.matmul(a, g.constant((codes.astype(np.float32) - zero[rows]) * scale[rows]))
    return [y + cx.tensor(node.input[5]) if cx.has(node, 5) else y]


@converts("EmbedLayerNormalization", domain=MS)
def _embed_layer_norm(cx: Convert, node) -> list:
    """`layer_norm(word[ids] + position[positions] + segment[segment_ids])`, and per row the count of mask ones."""
    if cx.attr(node, "mask_index_type", 1) != 1:
        raise Unsupported("mask_index_type other than 1 (the count of ones per row)")
    g = cx.g
    ids = cx.tensor(node.input[0])
    batch, seq = ids.shape
    hidden = cx.shape(node.input[2])[1]
    positions = cx.tensor(node.input[8]) if cx.has(node, 8) else g.constant(np.arange(seq, dtype=np.int64))
    total = g.gather(cx.tensor(node.input[2]), ids) + g.gather(cx.tensor(node.input[3]), positions)
    if cx.has(node, 1) and cx.has(node, 4):
        total = total + g.gather(cx.tensor(node.input[4]), cx.tensor(node.input[1]))
    gamma, beta = (_vector(cx, cx.tensor(node.input[i]), hidden) for i in (5, 6))
    norm = g.layer_norm(total, gamma, beta, eps=float(cx.attr(node, "epsilon", 1e-12)))
    if cx.has(node, 7):
        counts = g.cast(g.sum(g.cast(cx.tensor(node.input[7]), "f32"), 1), "i32")
    else:
        counts = g.constant(np.zeros(batch, np.int32), "i32")
    return [norm, counts, total]
