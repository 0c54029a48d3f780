"""NumPy GGUF block decoders and the reference of `DequantMatMulGguf` (semantics.md §2.11, §3.8;
docs/lowering-gguf.md).

Written from llama.cpp's block layouts (ggml-common.h), element by element: each decoder maps the
element index `e` of a block to the byte and shift of its code and to its scale group, and applies
llama.cpp's arithmetic in f32 (`d·q + m` rounded twice).  `gguf.quants.dequantize` is the
independent oracle the tests compare these with, bit for bit.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .. import thunks as T
from ..ops import QuantScheme
from ..thunks.quant import GGUF_BLOCKS
from . import reference, view
from .gemm import checked_expert_ids

IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


# ── reading blocks (rows of a uint8 array, one block each) ──────────────────

def half(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte `at` of each block, as an f32 column."""
    return blocks[:, at:at + 2].copy().view(np.float16).astype(np.float32)


def small(codes: np.ndarray) -> np.ndarray:
    """Integer codes as f32."""
    return codes.astype(np.float32)


def nibbles(blocks: np.ndarray, base: int, count: int, run: int = 16) -> np.ndarray:
    """4-bit codes of elements `0…count`, low nibbles first: `run` bytes hold `2·run` elements."""
    group, lane = np.divmod(np.arange(count), 2 * run)
    upper, at = np.divmod(lane, run)
    return (blocks[:, base + group * run + at] >> (4 * upper)) & 15


def crumbs(blocks: np.ndarray, base: int) -> np.ndarray:
    """2-bit codes of a K-quant's 256 elements: 32 bytes hold 128 elements, shifts 0, 2, 4, 6."""
    upper, lane = np.divmod(np.arange(256), 128)
    shift, at = np.divmod(lane, 32)
    return (blocks[:, base + 32 * upper + at] >> (2 * shift)) & 3


def high_bits(blocks: np.ndarray, base: int) -> np.ndarray:
    """The bit of each of 256 elements in a 32-byte mask: element e is bit e // 32 of byte e % 32."""
    bit, at = np.divmod(np.arange(256), 32)
    return (blocks[:, base + at] >> bit) & 1


def word_bits(blocks: np.ndarray, at: int) -> np.ndarray:
    """Bit e of the little-endian u32 at byte `at`, for e < 32 (Q5_0/Q5_1's fifth bits)."""
    word = blocks[:, at:at + 4].copy().view("<u4")
    return ((word >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def per_group(scales: np.ndarray, size: int) -> np.ndarray:
    """Per-group values `[blocks, groups]` repeated over each group's `size` elements."""
    return np.repeat(scales, size, axis=1)


# ── one decoder per scheme: [blocks, bytes] uint8 → [blocks, elements] f32 ──

def q8_0(b: np.ndarray) -> np.ndarray:
    return half(b, 0) * small(b[:, 2:34].view(np.int8))


def q4_0(b: np.ndarray) -> np.ndarray:
    return half(b, 0) * small(nibbles(b, 2, 32).astype(np.int8) - 8)


def q4_1(b: np.ndarray) -> np.ndarray:
    return half(b, 0) * small(nibbles(b, 4, 32)) + half(b, 2)


def q5_0(b: np.ndarray) -> np.ndarray:
    q = nibbles(b, 6, 32) | (word_bits(b, 2) << 4)
    return half(b, 0) * small(q.astype(np.int8) - 16)


def q5_1(b: np.ndarray) -> np.ndarray:
    q = nibbles(b, 8, 32) | (word_bits(b, 4) << 4)
    return half(b, 0) * small(q) + half(b, 2)


def iq4_nl(b: np.ndarray) -> np.ndarray:
    return half(b, 0) * IQ4_VALUES[nibbles(b, 2, 32)]


def q8_k(b: np.ndarray) -> np.ndarray:
    return b[:, 0:4].copy().view(np.float32) * small(b[:, 4:260].view(np.int8))


def q2_k(b: np.ndarray) -> np.ndarray:
    """Scale (low nibble) and min (high nibble) per 16 elements first; d and dmin at the end."""
    scales = b[:, 0:16]
    dl = per_group(half(b, 80) * small(scales & 15), 16)
    ml = per_group(half(b, 82) * small(scales >> 4), 16)
    return dl * small(crumbs(b, 16)) - ml


def q3_k(b: np.ndarray) -> np.ndarray:
    """hmask, 2-bit codes, 6-bit scales in twelve bytes, d at the end; `q − 4` where the mask bit is clear."""
    g = np.arange(16)
    low = (b[:, 96 + g % 8] >> (4 * (g // 8))) & 15
    high = (b[:, 104 + g % 4] >> (2 * (g // 4))) & 3
    dl = per_group(half(b, 108) * small((low | (high << 4)).astype(np.int8) - 32), 16)
    q = crumbs(b, 32).astype(np.int8) - 4 * (1 - high_bits(b, 0).astype(np.int8))
    return dl * small(q)


def k_scale_min(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's eight 6-bit scales and mins from the twelve bytes at 4."""
    d, m, md = b[:, 4:8], b[:, 8:12], b[:, 12:16]
    scale = np.concatenate([d & 63, (md & 15) | ((d >> 6) << 4)], axis=1)
    low = np.concatenate([m & 63, (md >> 4) | ((m >> 6) << 4)], axis=1)
    return scale, low


def k_affine(b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """`(d·scale)·q − dmin·min` per 32 elements."""
    scale, low = k_scale_min(b)
    return per_group(half(b, 0) * small(scale), 32) * small(q) - per_group(half(b, 2) * small(low), 32)


def q4_k(b: np.ndarray) -> np.ndarray:
    return k_affine(b, nibbles(b, 16, 256, run=32))


def q5_k(b: np.ndarray) -> np.ndarray:
    return k_affine(b, nibbles(b, 48, 256, run=32) | (high_bits(b, 16) << 4))


def q6_k(b: np.ndarray) -> np.ndarray:
    """Low nibbles, 2-bit highs, int8 scales per 16, d at the end; the code is `q − 32`."""
    q = (nibbles(b, 0, 256, run=64) | (crumbs(b, 128) << 4)).astype(np.int8) - 32
    return per_group(half(b, 208) * small(b[:, 192:208].view(np.int8)), 16) * small(q)


def iq4_xs(b: np.ndarray) -> np.ndarray:
    """d, 2-bit scale highs (u16), 4-bit scale lows, then IQ4 codes per 32 in runs of 16."""
    s = np.arange(8)
    high = (b[:, 2:4].copy().view("<u2") >> (2 * s).astype(np.uint16)) & 3
    low = (b[:, 4 + s // 2] >> (4 * (s % 2))) & 15
    dl = per_group(half(b, 0) * small((low | (high << 4)).astype(np.int8) - 32), 32)
    return dl * IQ4_VALUES[nibbles(b, 8, 256)]


DECODERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "GgufQ8_0": q8_0, "GgufQ4_0": q4_0, "GgufQ4_1": q4_1, "GgufQ5_0": q5_0, "GgufQ5_1": q5_1,
    "GgufQ2K": q2_k, "GgufQ3K": q3_k, "GgufQ4K": q4_k, "GgufQ5K": q5_k, "GgufQ6K": q6_k, "GgufQ8K": q8_k,
    "GgufIQ4NL": iq4_nl, "GgufIQ4XS": iq4_xs,
}


def dequantize(scheme: str, data: np.ndarray) -> np.ndarray:
    """Packed bytes of whole blocks of `scheme` (a QuantScheme variant name) → f32 values, flat."""
    elems, nbytes = GGUF_BLOCKS[scheme]
    with np.errstate(invalid="ignore", over="ignore"):
        return DECODERS[scheme](np.asarray(data, np.uint8).reshape(-1, nbytes)).astype(np.float32).reshape(-1)


def slabs(arena: np.ndarray, t, count: int, k: int) -> np.ndarray:
    """`count` packed `[n, k]` GGUF matrices at `t.w_q`, decoded to f32 `[count, n, k]`."""
    assert isinstance(t.scheme, QuantScheme)
    name = type(t.scheme).__name__
    elems, nbytes = GGUF_BLOCKS[name]
    data = view(arena, t.w_q, np.uint8, count * t.n * k // elems * nbytes)
    return dequantize(name, data).reshape(count, t.n, k)


@reference(T.DequantMatMulGguf)
def dequant_matmul_gguf(arena: np.ndarray, t: T.DequantMatMulGguf) -> None:
    """`dst = x @ Wᵀ`, W `[n, k]` decoded to f32, the products summed in f64 and rounded once."""
    w = slabs(arena, t, 1, t.k)[0]
    x = view(arena, t.x, np.float32, t.m * t.k).reshape(t.m, t.k)
    with np.errstate(invalid="ignore", over="ignore"):
        out = x.astype(np.float64) @ w.astype(np.float64).T
    view(arena, t.dst, np.float32, t.m * t.n)[:] = out.astype(np.float32).reshape(-1)


@reference(T.DequantGroupedMatMulGguf)
def dequant_grouped_matmul_gguf(arena: np.ndarray, t: T.DequantGroupedMatMulGguf) -> None:
    """`dst[i] = input[i] @ W[idx[i]]ᵀ` over `num_experts` decoded `[n, k_dim]` slabs."""
    ids = checked_expert_ids(arena, t)
    w = slabs(arena, t, t.num_experts, t.k_dim)
    x = view(arena, t.input, np.float32, t.m * t.k_dim).reshape(t.m, t.k_dim)
    with np.errstate(invalid="ignore", over="ignore"):
        out = np.einsum("ik,ink->in", x.astype(np.float64), w[ids.astype(np.intp)].astype(np.float64))
    view(arena, t.dst, np.float32, t.m * t.n)[:] = out.astype(np.float32).reshape(-1)


@reference(T.DequantMoEWeightsGguf)
def dequant_moe_weights_gguf(arena: np.ndarray, t: T.DequantMoEWeightsGguf) -> None:
    """f32 `[E, k_dim, n]`: each decoded `[n, k_dim]` slab transposed."""
    w = slabs(arena, t, t.num_experts, t.k_dim)
    view(arena, t.dst, np.float32, w.size)[:] = w.transpose(0, 2, 1).reshape(-1)
