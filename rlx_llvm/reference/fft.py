"""NumPy references of the FFT family (semantics.md §2.16, §3.11; docs/lowering-fft.md): `Fft1d` as
`numpy.fft` in complex128 with RLX's `norm_tag` scale, and the spectrum features `LogMel`,
`LogMelBackward` and `WelchPeaks` on real-block rows `[re_0 … re_{N−1}, im_0 … im_{N−1}]`."""
from __future__ import annotations

import math

import numpy as np

from .. import thunks as T
from ..dtypes import DType
from . import reference, view

REAL = {DType.F32: np.float32, DType.F64: np.float64, DType.C64: np.float32, DType.C128: np.float64}
"""The real type of each Fft1d dtype (the complex ones are interleaved pairs of it)."""
MEL_FLOOR = 1e-10
"""LogMel clamps each mel energy below at this before the log10."""


def norm_scale(norm_tag: int, inverse: bool, n: int) -> float:
    """The factor of an unnormalized DFT of `n` points: §2.16's Backward (none), Forward (the inverse
    by 1/n, NumPy's default) or Ortho (both by 1/√n)."""
    if norm_tag == 0:
        return 1.0
    if norm_tag == 1:
        return 1.0 / n if inverse else 1.0
    if norm_tag == 2:
        return 1.0 / math.sqrt(n)
    raise ValueError(f"unknown FFT norm_tag {norm_tag}")


def interleaved(dtype: DType) -> bool:
    """C64/C128 rows are interleaved (re, im) pairs; F32/F64 rows are real blocks."""
    return dtype.is_complex


def rows_as_complex(flat: np.ndarray, outer: int, n: int, dtype: DType) -> np.ndarray:
    """`[outer, n]` complex128 from rows in the dtype's layout."""
    x = flat.astype(np.float64).reshape(outer, 2 * n)
    if interleaved(dtype):
        return x[:, 0::2] + 1j * x[:, 1::2]
    return x[:, :n] + 1j * x[:, n:]


def complex_as_rows(z: np.ndarray, dtype: DType) -> np.ndarray:
    """Rows of `z` in the dtype's layout, flat."""
    parts = (z.real, z.imag)
    rows = np.stack(parts, axis=2).reshape(z.shape[0], -1) if interleaved(dtype) else np.concatenate(parts, axis=1)
    return rows.reshape(-1)


@reference(T.Fft1d)
def fft1d(arena: np.ndarray, t: T.Fft1d) -> None:
    n, real = t.n_complex, REAL[t.dtype]
    x = rows_as_complex(view(arena, t.src, real, 2 * t.outer * n), t.outer, n, t.dtype)
    with np.errstate(all="ignore"):
        y = np.fft.ifft(x, axis=1, norm="forward") if t.inverse else np.fft.fft(x, axis=1)
        y = y * norm_scale(t.norm_tag, t.inverse, n)
    view(arena, t.dst, real, 2 * t.outer * n)[:] = complex_as_rows(y, t.dtype).astype(real)


def one_sided_power(arena: np.ndarray, spec: int, rows: int, n_fft: int, n_bins: int) -> tuple[np.ndarray, ...]:
    """(re, im, re² + im²) of the first `n_bins` points of each real-block row, float64 `[rows, n_bins]`."""
    s = view(arena, spec, np.float32, rows * 2 * n_fft).astype(np.float64).reshape(rows, 2 * n_fft)
    re, im = s[:, :n_bins], s[:, n_fft:n_fft + n_bins]
    return re, im, re * re + im * im


def log_mel_parts(arena: np.ndarray, t: "T.LogMel | T.LogMelBackward") -> tuple[np.ndarray, ...]:
    """(re, im, filters, mel, L before the floor, L after it), float64."""
    re, im, power = one_sided_power(arena, t.spec, t.outer, t.n_fft, t.n_bins)
    filters = view(arena, t.filters, np.float32, t.n_mels * t.n_bins).astype(np.float64).reshape(t.n_mels, t.n_bins)
    mel = power @ filters.T
    with np.errstate(all="ignore"):
        raw = np.log10(np.fmax(mel, MEL_FLOOR))   # Rust's f32::max: a NaN mel is clamped to the floor
    top = np.fmax.reduce(raw, axis=1, keepdims=True, initial=-np.inf)
    return re, im, filters, mel, raw, np.fmax(raw, top - 8.0)


@reference(T.LogMel)
def log_mel(arena: np.ndarray, t: T.LogMel) -> None:
    *_, floored = log_mel_parts(arena, t)
    view(arena, t.dst, np.float32, t.outer * t.n_mels)[:] = ((floored + 4.0) / 4.0).astype(np.float32).reshape(-1)


@reference(T.LogMelBackward)
def log_mel_backward(arena: np.ndarray, t: T.LogMelBackward) -> None:
    re, im, filters, mel, raw, floored = log_mel_parts(arena, t)
    dy = view(arena, t.dy, np.float32, t.outer * t.n_mels).astype(np.float64).reshape(t.outer, t.n_mels)
    top = np.fmax.reduce(raw, axis=1, keepdims=True, initial=-np.inf)
    live = (np.abs(floored - (top - 8.0)) > 1e-6) & (mel > MEL_FLOOR)
    with np.errstate(all="ignore"):
        dmel = np.where(live, dy * 0.25 / (mel * math.log(10.0)), 0.0)
    dp = dmel @ filters
    out = np.zeros((t.outer, 2 * t.n_fft))
    out[:, :t.n_bins], out[:, t.n_fft:t.n_fft + t.n_bins] = 2 * re * dp, 2 * im * dp
    view(arena, t.dst, np.float32, out.size)[:] = out.astype(np.float32).reshape(-1)


def welch_psd(arena: np.ndarray, t: T.WelchPeaks) -> np.ndarray:
    """`[batch, n_bins]` f32: `(w_k · Σ_s (re² + im²)) / n_segments`, the sum over segments in order, w = 1 at
    both ends and 2 inside — the kernel's f32 roundings, so ties and the top-k order match it exactly."""
    n_bins = t.n_fft // 2 + 1
    s = view(arena, t.spec, np.float32, t.welch_batch * t.n_segments * 2 * t.n_fft)
    s = s.reshape(t.welch_batch, t.n_segments, 2 * t.n_fft)
    re, im = s[:, :, :n_bins], s[:, :, t.n_fft:t.n_fft + n_bins]
    with np.errstate(all="ignore"):
        power = re * re + im * im
        total = np.zeros((t.welch_batch, n_bins), np.float32)
        for seg in range(t.n_segments):
            total = total + power[:, seg]
        w = np.full(n_bins, 2.0, np.float32)
        w[0] = w[-1] = 1.0
        return (total * w) / np.float32(t.n_segments)


@reference(T.WelchPeaks)
def welch_peaks(arena: np.ndarray, t: T.WelchPeaks) -> None:
    """Per batch row the top `min(k, n_bins)` bins by power, descending, ties (and NaNs, which rank below
    −inf) in bin order, as `(bin as f32, power)` pairs; pairs past `n_bins` are zeros."""
    psd = welch_psd(arena, t)
    k = min(t.k, psd.shape[1])
    out = np.zeros((t.welch_batch, 2 * t.k), np.float32)
    for r, row in enumerate(psd):
        order = np.argsort(-row, kind="stable")[:k]
        out[r, 0:2 * k:2], out[r, 1:2 * k:2] = order, row[order]
    view(arena, t.dst, np.float32, out.size)[:] = out.reshape(-1)


def butterfly_pairs(n_fft: int, stage: int) -> tuple[np.ndarray, np.ndarray]:
    """The classic iterative radix-2 DIT pairing of stage `stage`: pair p joins points
    `i0 = (p // h)·2h + p % h` and `i1 = i0 + h`, with `h = 2^stage`."""
    h = 1 << stage
    p = np.arange(n_fft // 2)
    top = (p // h) * 2 * h + p % h
    return top, top + h


@reference(T.FftButterflyStage)
def fft_butterfly_stage(arena: np.ndarray, t: T.FftButterflyStage) -> None:
    """Per pair: gate 0 copies both points; otherwise `(a + w·b, a − w·b)` in f32 (w·b as
    `(wr·br − wi·bi, wr·bi + wi·br)`), the two outputs swapped where `rev` is non-zero."""
    half = t.n_fft // 2
    state = view(arena, t.state_src, np.float32, t.batch * t.n_fft * 2).reshape(t.batch, t.n_fft, 2)
    gate, rev, wr, wi = (view(arena, off, np.float32, half) for off in (t.gate_src, t.rev_src, t.tw_re_src, t.tw_im_src))
    top, bottom = butterfly_pairs(t.n_fft, t.stage)
    a, b = state[:, top], state[:, bottom]
    with np.errstate(all="ignore"):
        tr = wr * b[..., 0] - wi * b[..., 1]
        ti = wr * b[..., 1] + wi * b[..., 0]
        plus = np.stack([a[..., 0] + tr, a[..., 1] + ti], axis=-1)
        minus = np.stack([a[..., 0] - tr, a[..., 1] - ti], axis=-1)
    gated, swapped = (gate != 0)[None, :, None], (rev != 0)[None, :, None]
    first = np.where(gated, np.where(swapped, minus, plus), a)
    second = np.where(gated, np.where(swapped, plus, minus), b)
    out = np.empty_like(state)
    out[:, top], out[:, bottom] = first, second
    view(arena, t.state_dst, np.float32, out.size)[:] = out.reshape(-1)


# ── Fft1dQ: fixed point ─────────────────────────────────────────────────────

Q = 30
"""Twiddles are Q30 integers: `round(cos·2^30)`, `round(sin·2^30)`."""
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
FFTQ_SCALES = {0: "None", 1: "PerStage"}
"""`scale_tag`: 0 None (sums saturate to i32), 1 PerStage (each stage's outputs halved, round half up: 1/N in all)."""


def q30_twiddles(n: int, inverse: bool) -> tuple[np.ndarray, np.ndarray]:
    """`W^k = e^{∓2πi k/n}`, k < n/2, as Q30 int64 (re, im), exact at quarter turns."""
    k = np.arange(max(n // 2, 1))
    sign = 1 if inverse else -1
    w = np.exp(sign * 2j * np.pi * k / n)
    quarter, rest = np.divmod(4 * k, n)
    w = np.where(rest == 0, np.array([1, sign * 1j, -1, -sign * 1j])[quarter % 4], w)
    return (np.rint(w.real * 2.0 ** Q).astype(np.int64), np.rint(w.imag * 2.0 ** Q).astype(np.int64))


def fft1d_q_rows(x: np.ndarray, inverse: bool, norm_tag: int, scale_tag: int) -> np.ndarray:
    """The fixed-point transform of int64 complex rows `(re, im)` `[outer, 2, n]`, n a power of two."""
    re, im = x[:, 0].copy(), x[:, 1].copy()
    n = re.shape[1]
    rev = np.array([int(format(i, f"0{n.bit_length() - 1}b")[::-1], 2) if n > 1 else 0 for i in range(n)])
    re, im = re[:, rev], im[:, rev]
    w_re, w_im = q30_twiddles(n, inverse)
    half = 1
    while half < n:
        k = np.arange(half)
        wr, wi = w_re[k * (n // (2 * half))], w_im[k * (n // (2 * half))]
        for g in range(0, n, 2 * half):
            a, b = g + k, g + k + half
            t_re = (wr * re[:, b] - wi * im[:, b] + (1 << (Q - 1))) >> Q
            t_im = (wr * im[:, b] + wi * re[:, b] + (1 << (Q - 1))) >> Q
            outs = [re[:, a] + t_re, im[:, a] + t_im, re[:, a] - t_re, im[:, a] - t_im]
            if scale_tag == 1:
                outs = [(v + 1) >> 1 for v in outs]
            re[:, a], im[:, a], re[:, b], im[:, b] = (np.clip(v, I32_MIN, I32_MAX) for v in outs)
        half *= 2
    factor = norm_scale(norm_tag, inverse, n)
    if factor != 1.0:
        re, im = (np.clip(np.rint(v * factor), I32_MIN, I32_MAX).astype(np.int64) for v in (re, im))
    return np.stack([re, im], axis=1)


@reference(T.Fft1dQ)
def fft1d_q(arena: np.ndarray, t: T.Fft1dQ) -> None:
    """i32 real-block rows through the radix-2 fixed-point transform (docs/semantics-choices.md "fft")."""
    x = view(arena, t.src, np.int32, 2 * t.outer * t.n_complex).astype(np.int64).reshape(t.outer, 2, t.n_complex)
    out = fft1d_q_rows(x, t.inverse, t.norm_tag, t.scale_tag)
    view(arena, t.dst, np.int32, out.size)[:] = out.reshape(-1).astype(np.int32)
