"""Bit-exact f16/bf16 conversions with Rust `half` semantics (RNE; bf16 NaN keeps payload + quiet bit)."""
from __future__ import annotations

import numpy as np


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """f32 → bf16 bit patterns, round to nearest even; NaN → (bits >> 16) | 0x40."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns → f32 (exact); a NaN gets its quiet bit set, as Rust `half` does."""
    wide = np.asarray(bits, dtype=np.uint16).astype(np.uint32)
    wide = np.where((wide & 0x7FFF) > 0x7F80, wide | 0x40, wide)
    return (wide << 16).view(np.float32)


def f32_to_f16_bits(x: np.ndarray) -> np.ndarray:
    """f32 → f16 bit patterns, RNE; NaN → sign | 0x7E00 | (mantissa >> 13) as Rust `half` does."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    with np.errstate(all="ignore"):
        bits = x.astype(np.float16).view(np.uint16)
    u = x.view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    nan_bits = ((u >> 16) & 0x8000) | 0x7E00 | ((u & 0x7FFFFF) >> 13)
    return np.where(nan, nan_bits.astype(np.uint16), bits)
