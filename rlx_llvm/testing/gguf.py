"""Examples of DequantMatMulGguf, DequantGroupedMatMulGguf and DequantMoEWeightsGguf, and random GGUF blocks (every code value; scales sane or arbitrary)."""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..ops import QuantScheme
from ..thunks.quant import GGUF_BLOCKS
from .layout import Example, Values, example, ints

SCALES: dict[str, tuple[int, ...]] = {
    "GgufQ8_0": (0,), "GgufQ4_0": (0,), "GgufQ4_1": (0, 2), "GgufQ5_0": (0,), "GgufQ5_1": (0, 2),
    "GgufQ2K": (80, 82), "GgufQ3K": (108,), "GgufQ4K": (0, 2), "GgufQ5K": (0, 2), "GgufQ6K": (208,),
    "GgufIQ4NL": (0,), "GgufIQ4XS": (0,),
}
"""Byte offsets of each scheme's f16 block scales (Q8_K's scale is the f32 at byte 0)."""


def random_blocks(scheme: str, count: int, rng: np.random.Generator, sane: bool = True) -> np.ndarray:
    """`count` blocks of uniformly random bytes (every code value); with `sane`, the block scales are
    finite f16 (f32 for Q8_K) of magnitude below 1/16, else whatever the bytes say (NaN, ±inf, denormals)."""
    _, nbytes = GGUF_BLOCKS[scheme]
    blocks = rng.integers(0, 256, (count, nbytes), dtype=np.uint8)
    if sane:
        if scheme == "GgufQ8K":
            blocks[:, 0:4] = rng.uniform(-2 ** -4, 2 ** -4, (count, 1)).astype(np.float32).view(np.uint8)
        for at in SCALES.get(scheme, ()):
            blocks[:, at:at + 2] = rng.uniform(-2 ** -4, 2 ** -4, (count, 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(-1)


def gguf_weights(scheme: str) -> Values:
    """Packed weight bytes of `scheme` with sane scales (a whole number of blocks)."""
    _, nbytes = GGUF_BLOCKS[scheme]
    return Values(np.dtype("u1"), lambda rng, n: random_blocks(scheme, n // nbytes, rng))


def gguf() -> list[Example]:
    """Each GGUF kind over a legacy and a K-quant block type, odd sizes."""
    return [
        example(f"DequantMatMulGguf/{name}", T.DequantMatMulGguf(
            x=0, w_q=0, dst=0, m=3, k=k, n=5, scheme=getattr(QuantScheme, name)), w_q=gguf_weights(name), rtol=1e-5)
        for name, k in (("GgufQ4_0", 64), ("GgufQ4K", 256))
    ] + [
        example(f"DequantGroupedMatMulGguf/{name}", T.DequantGroupedMatMulGguf(
            input=0, w_q=0, expert_idx=0, dst=0, m=5, k_dim=k, n=3, num_experts=3, scheme=getattr(QuantScheme, name)),
            w_q=gguf_weights(name), expert_idx=ints(0, 3, "f4"), rtol=1e-5)
        for name, k in (("GgufQ8_0", 64), ("GgufQ4K", 256))
    ] + [
        example(f"DequantMoEWeightsGguf/{name}", T.DequantMoEWeightsGguf(
            w_q=0, dst=0, k_dim=k, n=3, num_experts=2, scheme=getattr(QuantScheme, name)), w_q=gguf_weights(name))
        for name, k in (("GgufQ5_0", 64), ("GgufQ6K", 256))
    ]
