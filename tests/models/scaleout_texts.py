"""Texts for the scale-out tests (Dask, Ray, pickling): a few hundred of mixed length, so partitions
and batches hit several compiled shapes, and the single-process vectors they must equal."""
from __future__ import annotations

import numpy as np

from .test_sentence import GOLDEN

N_TEXTS = 240


def texts(n: int = N_TEXTS) -> list[str]:
    """`n` texts: the golden sentences (empty, one word, 1 949 characters …), each repeated with a
    number and cut to a varying length."""
    base = [s for s in GOLDEN["sentences"] if s]
    return [f"{i}: {base[i % len(base)][: 20 + 37 * i % 400]}" for i in range(n)]


def single_process(encoder, items: list[str]) -> np.ndarray:
    """The reference: the same encoder in this process."""
    return encoder.embed(items)
