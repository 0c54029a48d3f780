"""Fused softmax cross-entropy losses and their backward (semantics.md §3.6), over `[n, c]` logits."""
from __future__ import annotations

from typing import Iterable

from .base import F32, Extent, Thunk, u32, usize


class SoftmaxCrossEntropyDense(Thunk):
    """Per-row loss `lse(logits[r]) − Σ_c targets[r, c]·logits[r, c]` against dense targets `[n, c]`."""

    family = "losses"

    logits: usize
    targets: usize
    dst: usize
    n: u32
    c: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("logits", F32 * self.n * self.c)
        yield self.span("targets", F32 * self.n * self.c)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.n)


class SoftmaxCrossEntropy(Thunk):
    """Per-row loss `lse(logits[r]) − logits[r, label[r]]` with f32-encoded integer labels `[n]`."""

    family = "losses"

    logits: usize
    labels: usize
    dst: usize
    n: u32
    c: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("logits", F32 * self.n * self.c)
        yield self.span("labels", F32 * self.n)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.n)


class SoftmaxCrossEntropyBackward(Thunk):
    """`dlogits[r, k] = (softmax(logits[r])[k] − [k = label[r]])·d_loss[r]`."""

    family = "losses"

    logits: usize
    labels: usize
    d_loss: usize
    dlogits: usize
    n: u32
    c: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("logits", F32 * self.n * self.c)
        yield self.span("labels", F32 * self.n)
        yield self.span("d_loss", F32 * self.n)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dlogits", F32 * self.n * self.c)
