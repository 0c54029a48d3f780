"""Random fills and token sampling (semantics.md §2.14, §2.15); the policy comes from the schedule's `rng`."""
from __future__ import annotations

from typing import Iterable

from .base import F32, Extent, Thunk, f32, u32, u64, usize


class RngNormal(Thunk):
    """Fill `len` f32 with `mean + scale·N(0, 1)` (ONNX RandomNormalLike)."""

    family = "rng"

    dst: usize
    len: u32
    mean: f32
    scale: f32
    key: u64
    op_seed: f32 | None

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.len)


class RngUniform(Thunk):
    """Fill `len` f32 with `low + (high − low)·U[0, 1)` (ONNX RandomUniformLike)."""

    family = "rng"

    dst: usize
    len: u32
    low: f32
    high: f32
    key: u64
    op_seed: f32 | None

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.len)


class Sample(Thunk):
    """Sample one token id per row of `logits[batch, vocab]` (temperature, top-k, top-p), written as f32."""

    family = "rng"

    logits: usize
    dst: usize
    batch: u32
    vocab: u32
    top_k: u32
    top_p: f32
    temperature: f32
    seed: u64

    def _reads(self) -> Iterable[Extent]:
        yield self.span("logits", F32 * self.batch * self.vocab)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.batch)
