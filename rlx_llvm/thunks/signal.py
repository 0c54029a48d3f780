"""Signal processing: FFTs, butterfly stages, log-mel spectra, Welch peaks (semantics.md §2.16, §3.11).

Spectra use the real-block layout: a row of `2N` values `[re_0 … re_{N−1}, im_0 … im_{N−1}]`.
"""
from __future__ import annotations

from typing import Iterable

from ..dtypes import DType
from .base import F32, I32, Extent, Thunk, u32, usize


class Fft1d(Thunk):
    """1-D FFT (or inverse) of `outer` rows of `n_complex` points, f32/f64 real-block or interleaved C64/C128."""

    family = "signal"

    src: usize
    dst: usize
    outer: u32
    n_complex: u32
    inverse: bool
    norm_tag: u32
    dtype: DType

    @property
    def nbytes(self) -> int:
        """Bytes of the input (= output): two reals per point, 8-byte reals for F64 / C128."""
        real = 8 if self.dtype in (DType.F64, DType.C128) else 4
        return 2 * real * self.outer * self.n_complex

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", self.nbytes)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", self.nbytes)


class Fft1dQ(Thunk):
    """Fixed-point 1-D FFT on i32 real-block rows (Q30 twiddles; `scale_tag` picks the overflow policy)."""

    family = "signal"

    src: usize
    dst: usize
    outer: u32
    n_complex: u32
    inverse: bool
    norm_tag: u32
    scale_tag: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", I32 * 2 * self.outer * self.n_complex)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", I32 * 2 * self.outer * self.n_complex)


class FftButterflyStage(Thunk):
    """One gated radix-2 stage over a `[batch, n_fft, 2]` state, with per-pair gate/rev/twiddle tables `[n_fft/2]`."""

    family = "signal"

    state_src: usize
    state_dst: usize
    gate_src: usize
    rev_src: usize
    tw_re_src: usize
    tw_im_src: usize
    batch: u32
    n_fft: u32
    stage: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("state_src", F32 * self.batch * self.n_fft * 2)
        for name in ("gate_src", "rev_src", "tw_re_src", "tw_im_src"):
            yield self.span(name, F32 * (self.n_fft // 2))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("state_dst", F32 * self.batch * self.n_fft * 2)


class LogMel(Thunk):
    """Whisper-style log-mel of each block spectrum row: `(max(log10(mel), rowmax − 8) + 4) / 4`."""

    family = "signal"

    spec: usize
    filters: usize
    dst: usize
    outer: u32
    n_fft: u32
    n_bins: u32
    n_mels: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("spec", F32 * self.outer * 2 * self.n_fft)
        yield self.span("filters", F32 * self.n_mels * self.n_bins)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.outer * self.n_mels)


class LogMelBackward(Thunk):
    """Gradient of LogMel with respect to the block spectrum `spec`."""

    family = "signal"

    spec: usize
    filters: usize
    dy: usize
    dst: usize
    outer: u32
    n_fft: u32
    n_bins: u32
    n_mels: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("spec", F32 * self.outer * 2 * self.n_fft)
        yield self.span("filters", F32 * self.n_mels * self.n_bins)
        yield self.span("dy", F32 * self.outer * self.n_mels)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.outer * 2 * self.n_fft)


class WelchPeaks(Thunk):
    """Welch PSD over `n_segments` spectra per batch row, then the top-`k` bins as `(bin, power)` pairs."""

    family = "signal"

    spec: usize
    dst: usize
    welch_batch: u32
    n_fft: u32
    n_segments: u32
    k: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("spec", F32 * self.welch_batch * self.n_segments * 2 * self.n_fft)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.welch_batch * 2 * self.k)
