"""Texts for the scale-out tests (Dask, Ray, pickling): a few hundred of mixed length (1 to ~30
tokens: two sequence buckets, so the worker processes compile few shapes), and the single-process
vectors they must equal."""
from __future__ import annotations

from .test_sentence import GOLDEN

N_TEXTS = 256  # 4 partitions of 64 = 2 batches of 32 each


def texts(n: int = N_TEXTS) -> list[str]:
    """`n` texts: the golden sentences, each numbered and cut to 1–110 characters."""
    base = [s for s in GOLDEN["sentences"] if s]
    return [f"{i}: {base[i % len(base)][: 1 + 37 * i % 110]}" for i in range(n)]
