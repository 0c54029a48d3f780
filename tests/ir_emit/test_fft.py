"""The FFT family: Fft1d in one compiled program.

* Every n in 1…64 and 100, 127, 256, 360, 1000, 1024, 2187, 3125, 4096 (Stockham passes of radix 8, 4, 2,
  3, 5, 7, 11, 13, and Bluestein for the other primes), each in both directions — an f32-real row type one
  way, an f64 one the other — the norms and row layouts rotating, W + 1 rows (a block of vector lanes and
  a row on its own); every (row type, direction, norm) at n = 100.  Against `numpy.fft` with the
  norm mapped from §2.16 written out here (not the reference's), f32 rows within 1e-5·log2(n)·max|X|,
  f64 rows within 1e-12·max|X|; and against the reference like every family.
* Hand examples of the sign convention (an impulse at 1) and of the norms (ifft(fft(x)) = N·x for Backward).
* Rows split across threads (1 and 2 threads give the same bytes); a row gives the same bytes as a vector
  lane and on its own.
* The plan: the radices multiply to n, and only n with a prime factor above 13 go to Bluestein.
* Bad input: n = 0, an unknown norm tag, an integer row type, each buffer one byte past the arena.

LogMel / LogMelBackward in the same program: Whisper's shape (n_fft 400, 201 bins, 80 mels) split across
threads, odd bin and mel counts around W, zero rows, rows where the per-row floor is active (mel
filters 1e−9 of the others), filters with zero rows (mel ≤ 1e−10), a NaN point; the backward also against
central differences of a float64 LogMel written here from §3.11, and both against the spec's per-row floor
(a row scaled by 10^−12 does not move the other rows' outputs).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from rlx_llvm import thunks as T
from rlx_llvm.dtypes import DType
from rlx_llvm.reference.fft import REAL
from tests.harness import W, Suite, assert_close, expect_invalid, suite_tests

NS = [*range(1, 65), 100, 127, 256, 360, 1000, 1024, 2187, 3125, 4096]
OUTER = W + 1   # rows per sweep case: a whole block of f32 (and two of f64) vector lanes, then a row alone
F32_ROWS, F64_ROWS = (DType.F32, DType.C64), (DType.F64, DType.C128)
COMBOS = list(itertools.product((*F32_ROWS, *F64_ROWS), (False, True), (0, 1, 2)))

NUMPY_NORM = {   # (norm_tag, inverse) → NumPy's function and norm giving §2.16's scale
    (0, False): (np.fft.fft, "backward"), (0, True): (np.fft.ifft, "forward"),      # no scaling either way
    (1, False): (np.fft.fft, "backward"), (1, True): (np.fft.ifft, "backward"),     # the inverse by 1/N
    (2, False): (np.fft.fft, "ortho"), (2, True): (np.fft.ifft, "ortho"),           # both by 1/√N
}


def as_complex(rows: np.ndarray, dtype: DType, n: int) -> np.ndarray:
    """`[outer, n]` complex128 of rows in real-block (F32/F64) or interleaved (C64/C128) layout."""
    x = rows.astype(np.float64).reshape(-1, 2 * n)
    return x[:, 0::2] + 1j * x[:, 1::2] if dtype.is_complex else x[:, :n] + 1j * x[:, n:]


def tolerance(dtype: DType, n: int) -> float:
    """The allowed error relative to max|X|."""
    return 1e-5 * max(1.0, math.log2(n)) if dtype in F32_ROWS else 1e-12


def spectrum_close(t: T.Fft1d):
    """Compare within `tolerance · max|want|` (the harness's `compare` hook)."""
    def compare(got: np.ndarray, want: np.ndarray) -> None:
        scale = float(np.max(np.abs(want.astype(np.float64)), initial=0.0))
        err = np.abs(got.astype(np.float64) - want)
        assert np.all(err <= tolerance(t.dtype, t.n_complex) * scale), (
            f"{t!r}: error {err.max() / max(scale, 1e-300):.3g} of max|X|")
    return compare


INPUTS: dict[str, np.ndarray] = {}


def add_fft(s: Suite, n: int, dtype: DType, inverse: bool, norm: int, outer: int = 2, name: str = "",
            same_rows: bool = False) -> str:
    real = REAL[dtype]
    x = np.tile(s.normal(2 * n, dtype=real), outer) if same_rows else s.normal(2 * outer * n, dtype=real)
    dst, o = s.out(real, 2 * outer * n)
    t = T.Fft1d(src=s.put(x), dst=dst, outer=outer, n_complex=n, inverse=inverse, norm_tag=norm, dtype=dtype)
    name = name or f"n{n}-{dtype.value}-{'inv' if inverse else 'fwd'}-norm{norm}-x{outer}"
    s.add(name, t, [o], compare=spectrum_close(t))
    INPUTS[name] = x
    return name


def build() -> Suite:
    s = Suite(13)
    for i, n in enumerate(NS):
        inverse = bool(i % 2)
        add_fft(s, n, F32_ROWS[i % 2], inverse, i % 3, outer=OUTER)
        add_fft(s, n, F64_ROWS[(i // 2) % 2], not inverse, (i + 1) % 3, outer=OUTER)
    for n, dtype in ((1000, DType.C64), (127, DType.F64)):
        add_fft(s, n, dtype, False, 0, outer=OUTER, name=f"same-rows-n{n}-{dtype.value}", same_rows=True)
    for n in (100,):
        for dtype, inverse, norm in COMBOS:
            add_fft(s, n, dtype, inverse, norm, outer=1, name=f"grid-n{n}-{dtype.value}-{inverse}-{norm}")
    add_fft(s, 256, DType.C64, False, 0, outer=67, name="threads-radix8")
    add_fft(s, 100, DType.F32, True, 2, outer=41, name="threads-mixed-radix")
    add_fft(s, 127, DType.C128, True, 1, outer=37, name="threads-bluestein")
    add_fft(s, 12, DType.F64, False, 1, outer=700, name="threads-small")
    impulse = np.zeros(8, np.float32)
    impulse[1] = 1.0                                          # x = δ_1 of n = 4, real block
    dst, o = s.out(np.float32, 8)
    s.add("hand-impulse", T.Fft1d(src=s.put(impulse), dst=dst, outer=1, n_complex=4, inverse=False, norm_tag=0,
                                  dtype=DType.F32), [o], exact=True, zero_sign=False,
          expect=(dst, np.array([1, 0, -1, 0, 0, -1, 0, 1], np.float32)))   # X_k = e^{−2πik/4} = 1, −i, −1, i
    for shape in MEL_SHAPES:
        add_log_mel(s, *shape)
    for shape in WELCH_SHAPES:
        add_welch(s, *shape)
    add_welch(s, 2, 2 * W + 2, 3, W + 1, ties=True)
    for n_fft in (2, 8, 64):
        for stage in range(n_fft.bit_length() - 1):
            add_butterfly(s, n_fft, stage)
    add_butterfly_chain(s, 32)
    return s


MEL_SHAPES = [(4, 400, 201, 80), (3, 16, 9, W + 1), (2, 2 * W + 3, W + 2, W - 1), (1, 8, 5, 1), (0, 8, 5, 3),
              (5, 12, 7, 6)]
"""(rows, n_fft, n_bins, n_mels)."""
MEL_INPUTS: dict[str, tuple[np.ndarray, ...]] = {}


def mel_filters(s: Suite, n_mels: int, n_bins: int) -> np.ndarray:
    """Non-negative filters; mel 0 tiny (1e−9 of the others: its log-mel falls under the row's floor), the
    last mel row all zero (mel ≤ 1e−10) when there are three or more."""
    f = s.rng.uniform(0.0, 1.0, (n_mels, n_bins)).astype(np.float32)
    if n_mels > 1:
        f[0] *= np.float32(1e-9)
    if n_mels > 2:
        f[-1] = 0.0
    return f


def add_log_mel(s: Suite, rows: int, n_fft: int, n_bins: int, n_mels: int) -> None:
    spec = s.normal(rows, 2 * n_fft, scale=3.0)
    if rows > 1:
        spec[1] *= 10.0           # a louder frame: its floor lies 2 decades above the others'
    if rows > 2:
        spec[2, 1] = np.nan       # a NaN point: that row's mels through bin 1 are NaN → clamped to 1e−10
    filters, dy = mel_filters(s, n_mels, n_bins), s.normal(rows, n_mels)
    at = dict(spec=s.put(spec), filters=s.put(filters))
    shape = dict(outer=rows, n_fft=n_fft, n_bins=n_bins, n_mels=n_mels)
    name = f"{rows}x{n_fft}-{n_bins}b-{n_mels}m"
    dst, o = s.out(np.float32, rows * n_mels)
    s.add(f"logmel-{name}", T.LogMel(**at, dst=dst, **shape), [o], rtol=1e-5, atol=1e-5)
    dst, o = s.out(np.float32, rows * 2 * n_fft)
    s.add(f"logmel-bwd-{name}", T.LogMelBackward(**at, dy=s.put(dy), dst=dst, **shape), [o],
          compare=lambda got, want: assert_close(got, want, 0, 1e-4 * np.nanmax(np.abs(want), initial=0.0)))
    MEL_INPUTS[name] = spec.astype(np.float64), filters.astype(np.float64), dy.astype(np.float64)


WELCH_SHAPES = [(3, 16, 4, 3), (2, 2 * W + 3, 2, W), (1, 8, 1, 10), (70, 400, 5, 10), (0, 8, 2, 3), (2, 1, 3, 2)]
"""(batch, n_fft, n_segments, k): k past n_bins (pairs of zeros), n_fft = 1 (one bin), rows split across threads."""
WELCH_INPUTS: dict[str, np.ndarray] = {}


def add_welch(s: Suite, batch: int, n_fft: int, segments: int, k: int, ties: bool = False) -> None:
    """A WelchPeaks case, compared bit for bit; `ties`: small integer spectra, so many bins tie."""
    if ties:
        spec = s.rng.integers(-2, 3, (batch * segments, 2 * n_fft)).astype(np.float32)
        spec[:, 1:n_fft // 2] = spec[0, 1]   # interior bins of equal power in every row
    else:
        spec = s.normal(batch * segments, 2 * n_fft)
        if batch * segments > 2:
            spec[2, n_fft // 2 - 1] = np.nan     # a NaN bin ranks last
    dst, o = s.out(np.float32, batch * 2 * k)
    name = f"welch-{batch}x{n_fft}-{segments}s-k{k}" + ("-ties" if ties else "")
    s.add(name, T.WelchPeaks(spec=s.put(spec), dst=dst, welch_batch=batch, n_fft=n_fft, n_segments=segments, k=k),
          [o], exact=True)
    WELCH_INPUTS[name] = spec.astype(np.float64)


def butterfly_stage(s: Suite, state: int, dst: int, n_fft: int, stage: int, gate: np.ndarray, rev: np.ndarray,
                    tw: np.ndarray, batch: int) -> T.FftButterflyStage:
    return T.FftButterflyStage(state_src=state, state_dst=dst, gate_src=s.put(gate), rev_src=s.put(rev),
                               tw_re_src=s.put(tw.real.astype(np.float32)), tw_im_src=s.put(tw.imag.astype(np.float32)),
                               batch=batch, n_fft=n_fft, stage=stage)


def add_butterfly(s: Suite, n_fft: int, stage: int, batch: int = 3) -> None:
    """Random gates and swaps (one gate NaN: applied), random twiddles; bit for bit."""
    half = n_fft // 2
    gate, rev = (s.rng.integers(0, 2, half).astype(np.float32) for _ in range(2))
    gate[-1] = np.nan
    tw = s.rng.standard_normal(half) + 1j * s.rng.standard_normal(half)
    dst, o = s.out(np.float32, batch * n_fft * 2)
    t = butterfly_stage(s, s.put(s.normal(batch * n_fft * 2)), dst, n_fft, stage, gate, rev, tw, batch)
    s.add(f"butterfly-{n_fft}-s{stage}", t, [o], exact=True)


CHAIN: dict[str, object] = {}


def add_butterfly_chain(s: Suite, n_fft: int) -> None:
    """Every stage of an `n_fft`-point FFT, gates 1, no swaps, the DIT twiddles e^{−πi (p mod h)/h}, ping-pong
    between two buffers from a bit-reversed input: the last buffer is the FFT (the pairing is the classic one)."""
    from rlx_llvm.ir_emit.fft import bit_reversed
    x = s.normal(2, n_fft) + 1j * s.normal(2, n_fft)
    rev = bit_reversed(n_fft)
    state = np.stack([x[:, rev].real, x[:, rev].imag], axis=-1).astype(np.float32)
    bufs = [s.put(state), s.slot(state.nbytes)]
    half = n_fft // 2
    stages = n_fft.bit_length() - 1
    for stage in range(stages):
        h = 1 << stage
        tw = np.exp(-1j * np.pi * (np.arange(half) % h) / h)
        t = butterfly_stage(s, bufs[stage % 2], bufs[(stage + 1) % 2], n_fft, stage, np.ones(half, np.float32),
                            np.zeros(half, np.float32), tw, 2)
        s.add(f"chain-{n_fft}-s{stage}", t, [(bufs[(stage + 1) % 2], np.dtype(np.float32), state.size)], exact=True)
    CHAIN.update(name=f"chain-{n_fft}-s{stages - 1}", x=x)


SUITE = build()
(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_matches_numpy_fft(outcome, name: str) -> None:
    """The output equals `numpy.fft` of the input with §2.16's normalization, within the tolerance."""
    t = outcome.case(name).thunk
    fn, norm = NUMPY_NORM[(t.norm_tag, t.inverse)]
    want = fn(as_complex(INPUTS[name], t.dtype, t.n_complex), axis=1, norm=norm)
    got = as_complex(outcome.output(name), t.dtype, t.n_complex)
    err = np.abs(got - want).max()
    assert err <= tolerance(t.dtype, t.n_complex) * np.abs(want).max(), f"{name}: error {err:.3g}"


def test_every_length_runs_both_directions_in_both_precisions() -> None:
    """The coverage the module docstring promises (a check of the suite's layout)."""
    for n in NS:
        runs = {(c.thunk.inverse, c.thunk.dtype in F32_ROWS) for c in SUITE.cases
                if isinstance(c.thunk, T.Fft1d) and c.thunk.n_complex == n}
        assert {inv for inv, _ in runs} == {False, True} and {f32 for _, f32 in runs} == {False, True}, n


def test_impulse_hand_example(outcome) -> None:
    outcome.check_spec("hand-impulse")


def test_backward_norm_round_trip(outcome) -> None:
    """With Backward on both sides, ifft(fft(x)) = N·x: the inverse of the forward grid case."""
    fwd = outcome.output("grid-n100-c128-False-0")
    inv = np.fft.ifft(as_complex(fwd, DType.C128, 100), norm="forward")
    x = as_complex(INPUTS["grid-n100-c128-False-0"], DType.C128, 100)
    np.testing.assert_allclose(inv, 100 * x, rtol=0, atol=1e-11 * np.abs(100 * x).max())


def test_a_row_gives_the_same_bytes_as_a_lane_and_alone(outcome) -> None:
    """W + 1 copies of one row: the block's vector lanes and the last row, run on its own, agree bit for bit."""
    for name in ("same-rows-n1000-c64", "same-rows-n127-f64"):
        rows = outcome.output(name).reshape(OUTER, -1)
        assert all(row.tobytes() == rows[0].tobytes() for row in rows), name


def largest_prime_factor(n: int) -> int:
    p, largest = 2, 1
    while n > 1:
        while n % p == 0:
            n, largest = n // p, p
        p += 1
    return largest


@pytest.mark.parametrize("n", [*range(1, 65), 101, 127, 360, 1000, 1024, 2187, 3125, 4096, 4099])
def test_plan_is_mixed_radix_unless_a_prime_factor_is_large(n: int) -> None:
    """Stockham passes multiplying to n (a power of two ≥ 4 in ⌈log2(n)/3⌉ passes of radix 8 and 4);
    Bluestein exactly when a prime
    factor exceeds 13, its convolution length ≥ 2n − 1 and itself mixed radix."""
    from rlx_llvm.ir_emit.fft import bluestein_size, radices
    rs = radices(n)
    if largest_prime_factor(n) > 13:
        m = bluestein_size(n)
        assert rs is None and m >= 2 * n - 1 and radices(m) is not None
        return
    assert math.prod(rs) == n
    if n & (n - 1) == 0 and n >= 4:
        assert set(rs) <= {4, 8} and len(rs) == -(-(n.bit_length() - 1) // 3)


# ── bad input ────────────────────────────────────────────────────────────────

def fft_thunk(**changes) -> T.Fft1d:
    """Two rows of 10 f32 points (160 bytes each way): src at 0, dst at 256."""
    return T.Fft1d(**(dict(src=0, dst=256, outer=2, n_complex=10, inverse=False, norm_tag=0, dtype=DType.F32)
                      | changes))


def test_zero_length_is_refused() -> None:
    expect_invalid(fft_thunk(n_complex=0), 512, "n_complex", "at least 1")


def test_unknown_norm_tag_is_refused() -> None:
    expect_invalid(fft_thunk(norm_tag=3), 512, "norm_tag", "unknown")


def test_integer_rows_are_refused() -> None:
    expect_invalid(fft_thunk(dtype=DType.I32), 512, "dtype", "i32")


@pytest.mark.parametrize("field", ["src", "dst"])
def test_buffer_longer_than_the_arena_is_refused(field: str) -> None:
    """A row buffer that does not fit: the buffer placed at 1024, the arena one byte short of its 160 bytes."""
    expect_invalid(fft_thunk(**{field: 1024}), 1024 + 160 - 1, field)


# ── LogMel, LogMelBackward ───────────────────────────────────────────────────

def spec_log_mels(spec: np.ndarray, filters: np.ndarray, n_fft: int) -> np.ndarray:
    """§3.11 in float64 before the floor: `log10(max(filters · (re² + im²), 1e−10))` per row."""
    n_bins = filters.shape[1]
    power = spec[:, :n_bins] ** 2 + spec[:, n_fft:n_fft + n_bins] ** 2
    return np.log10(np.maximum(power @ filters.T, 1e-10))


def spec_log_mel(spec: np.ndarray, filters: np.ndarray, n_fft: int) -> np.ndarray:
    """§3.11 in float64: `(max(L, rowmax − 8) + 4) / 4` per row (frame)."""
    log_mel = spec_log_mels(spec, filters, n_fft)
    return (np.maximum(log_mel, log_mel.max(axis=1, keepdims=True) - 8.0) + 4.0) / 4.0


@pytest.mark.parametrize("name", [n for n in MEL_INPUTS if not n.startswith("0x")])
def test_log_mel_matches_spec_text(outcome, name: str) -> None:
    """LogMel against the spec's formula written out here (the NaN row left out)."""
    spec, filters, _ = MEL_INPUTS[name]
    keep = ~np.isnan(spec).any(axis=1)
    n_fft = spec.shape[1] // 2
    got = outcome.output(f"logmel-{name}").reshape(spec.shape[0], -1)
    assert_close(got[keep], spec_log_mel(spec[keep], filters, n_fft), rtol=1e-5, atol=1e-5, what=name)


def test_floor_is_per_row(outcome) -> None:
    """The floor is each row's max − 8 (not the spectrogram's): the tiny-filter mel sits exactly at its
    row's floor in every row, whatever the other rows hold (row 2, all NaN mels, left out)."""
    got = outcome.output("logmel-4x400-201b-80m").reshape(4, 80)[[0, 1, 3]]
    row_max = got.max(axis=1)
    np.testing.assert_allclose(got[:, 0], row_max - 2.0, atol=1e-5)   # (L_max − 8 + 4)/4 = out_max − 2
    assert np.ptp(row_max) > 0.4   # the rows' floors differ by 2 decades, so a global floor would show


@pytest.mark.parametrize("name", ["3x16-9b-" + str(W + 1) + "m", "5x12-7b-6m"])
def test_log_mel_backward_matches_finite_differences(outcome, name: str) -> None:
    """§3.11's rule — the gradient through every mel above its row's floor, none through the floor or a
    clamped mel — against central differences of the float64 LogMel above with `dy` zeroed at the floored
    mels (rows without NaN; the tiny-filter and zero-filter mels are floored)."""
    spec, filters, dy = MEL_INPUTS[name]
    rows, n_fft = spec.shape[0], spec.shape[1] // 2
    got = outcome.output(f"logmel-bwd-{name}").reshape(rows, -1)
    for r in range(rows):
        if np.isnan(spec[r]).any():
            continue
        x = spec[r:r + 1].copy()
        log_mel = spec_log_mels(x, filters, n_fft)[0]
        live = dy[r] * (log_mel > log_mel.max() - 8.0 + 1e-6)
        assert 0 < np.count_nonzero(live) < len(live), "the case should have both live and floored mels"
        want = np.zeros(2 * n_fft)
        for j in range(2 * n_fft):
            h = 1e-6 * max(1.0, abs(x[0, j]))
            up, down = x.copy(), x.copy()
            up[0, j] += h
            down[0, j] -= h
            want[j] = (live @ (spec_log_mel(up, filters, n_fft) - spec_log_mel(down, filters, n_fft))[0]) / (2 * h)
        assert_close(got[r], want, 0, 1e-4 * np.abs(want).max(), what=f"{name} row {r}")


def test_log_mel_bins_past_the_row_are_refused() -> None:
    t = T.LogMel(spec=0, filters=1024, dst=2048, outer=1, n_fft=8, n_bins=9, n_mels=2)
    expect_invalid(t, 4096, "n_bins", "exceeds n_fft")


# ── WelchPeaks ───────────────────────────────────────────────────────────────

@pytest.mark.parametrize("name", sorted(WELCH_INPUTS))
def test_welch_peaks_match_spec_text(outcome, name: str) -> None:
    """Against §3.11 in float64: the PSD is the mean over segments of w·(re² + im²) (w 1 at both ends, 2
    inside); the pairs are the top min(k, n_bins) bins, descending, ties in bin order, NaN last; zeros after."""
    t = outcome.case(name).thunk
    n_bins = t.n_fft // 2 + 1
    spec = WELCH_INPUTS[name].reshape(t.welch_batch, t.n_segments, 2 * t.n_fft)
    w = np.where((np.arange(n_bins) == 0) | (np.arange(n_bins) == n_bins - 1), 1.0, 2.0)
    psd = (w * (spec[:, :, :n_bins] ** 2 + spec[:, :, t.n_fft:t.n_fft + n_bins] ** 2)).mean(axis=1)
    got = outcome.output(name).reshape(t.welch_batch, t.k, 2)
    k = min(t.k, n_bins)
    for r in range(t.welch_batch):
        bins = got[r, :k, 0].astype(np.int64)
        assert sorted(set(bins.tolist())) == sorted(bins.tolist()), "a bin picked twice"
        assert_close(got[r, :k, 1], psd[r, bins], rtol=1e-6, what=f"{name} row {r}")
        key = [(-v if v == v else np.inf, b) for v, b in zip(psd[r], range(n_bins))]   # NaN last, then bin order
        want = [b for _, b in sorted(key, key=lambda p: (p[0], p[1]))][:k]
        if "ties" not in name:   # float64 order = f32 order away from ties
            assert bins.tolist() == want, f"{name} row {r}"
        assert np.all(got[r, k:] == 0)


def test_welch_ties_keep_bin_order(outcome) -> None:
    """The tie case holds equal interior powers: they come out in increasing bin order."""
    name = next(n for n in WELCH_INPUTS if n.endswith("-ties"))
    got = outcome.output(name).reshape(2, -1, 2)
    for row in got:
        for (b0, v0), (b1, v1) in zip(row[:-1], row[1:]):
            assert v0 > v1 or (v0 == v1 and b0 < b1)
    powers = got[:, :, 1]
    assert any(len(set(p.tolist())) < len(p) for p in powers), "the case should hold ties in the top k"


def test_welch_without_segments_is_refused() -> None:
    t = T.WelchPeaks(spec=0, dst=1024, welch_batch=1, n_fft=8, n_segments=0, k=2)
    expect_invalid(t, 4096, "n_segments", "at least 1")


# ── FftButterflyStage ────────────────────────────────────────────────────────

def test_butterfly_chain_is_the_fft(outcome) -> None:
    """log2(n) gated stages with the classic DIT pairing and twiddles turn a bit-reversed row into its DFT."""
    got = outcome.output(CHAIN["name"]).reshape(2, -1, 2)
    want = np.fft.fft(CHAIN["x"], axis=1)
    assert_close(got, np.stack([want.real, want.imag], axis=-1), 0, 1e-5 * np.abs(want).max())


def test_butterfly_pairing_hand_example() -> None:
    """n = 8, stage 1 (h = 2): pairs (0, 2), (1, 3), (4, 6), (5, 7)."""
    from rlx_llvm.reference.fft import butterfly_pairs
    top, bottom = butterfly_pairs(8, 1)
    assert list(zip(top.tolist(), bottom.tolist())) == [(0, 2), (1, 3), (4, 6), (5, 7)]


@pytest.mark.parametrize("changes, field", [(dict(n_fft=12), "n_fft"), (dict(n_fft=1), "n_fft"), (dict(stage=3), "stage")])
def test_butterfly_bad_shapes_are_refused(changes: dict, field: str) -> None:
    t = T.FftButterflyStage(**(dict(state_src=0, state_dst=1024, gate_src=2048, rev_src=2112, tw_re_src=2176,
                                    tw_im_src=2240, batch=1, n_fft=8, stage=0) | changes))
    expect_invalid(t, 4096, field)
