"""Fft1d and LogMel at one thread (issue 13): C64 rows 4096 × 1024 and 4096 × 1000 against `scipy.fft`
(workers=1), and LogMel over a 30 s 16 kHz signal's spectrogram (3000 frames, n_fft 400, 201 bins, 80 mels)
against NumPy (`power @ filters.T`, log10, per-row floor, in float32).

    cd /work/main && PYTHONPATH=. python benchmarks/bench_fft.py [--rounds 7]

Each kernel is checked against the NumPy reference before it is timed; medians of interleaved rounds.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.pin_threads(1)

import numpy as np  # noqa: E402
import scipy.fft  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from rlx_llvm import reference  # noqa: E402
from rlx_llvm import thunks as T  # noqa: E402
from rlx_llvm.dtypes import DType  # noqa: E402
from rlx_llvm.kernels.threads import set_num_threads  # noqa: E402


def compiled(t, nbytes: int, inputs: dict[int, np.ndarray]) -> tuple:
    """(program, arena holding `inputs`, the reference's arena after the run)."""
    schedule = rl.ThunkSchedule([t], arena_bytes=nbytes)
    program = rl.compile(schedule)
    arena = rl.Arena(nbytes)
    for off, v in inputs.items():
        arena.write(off, v)
    want = rl.Arena.from_bytes(arena.bytes.copy())
    program.run(arena)
    reference.run(schedule, want)
    return program, arena, want


def max_rel_err(arena, want, off: int, count: int) -> float:
    got, ref = (a.bytes[off:off + 4 * count].view(np.float32).astype(np.float64) for a in (arena, want))
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def bench_fft(rows: int, n: int, rounds: int) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((rows, n)) + 1j * rng.standard_normal((rows, n))).astype(np.complex64)
    nbytes = 8 * rows * n
    t = T.Fft1d(src=0, dst=nbytes, outer=rows, n_complex=n, inverse=False, norm_tag=0, dtype=DType.C64)
    program, arena, want = compiled(t, 2 * nbytes, {0: x.view(np.float32).reshape(-1)})
    err = max_rel_err(arena, want, nbytes, 2 * rows * n)
    assert err < 1e-5 * np.log2(n), err
    times = common.interleaved({"ours": lambda: program.run(arena),
                                "scipy": lambda: scipy.fft.fft(x, axis=1, workers=1, overwrite_x=False)},
                               rounds=rounds)
    print(f"  Fft1d C64 {rows} x {n}: ours {times['ours'].median:.1f} ms   scipy.fft {times['scipy'].median:.1f} ms"
          f"   ratio {common.paired_ratio(times['ours'], times['scipy']):.2f}x   max rel err {err:.1e}")


def bench_log_mel(rounds: int) -> None:
    frames, n_fft, n_bins, n_mels = 3000, 400, 201, 80
    rng = np.random.default_rng(1)
    spec = rng.standard_normal((frames, 2 * n_fft)).astype(np.float32)
    filters = rng.uniform(0, 1, (n_mels, n_bins)).astype(np.float32)
    a, f = spec.nbytes, spec.nbytes + filters.nbytes
    t = T.LogMel(spec=0, filters=a, dst=f, outer=frames, n_fft=n_fft, n_bins=n_bins, n_mels=n_mels)
    program, arena, want = compiled(t, f + 4 * frames * n_mels, {0: spec.reshape(-1), a: filters.reshape(-1)})
    err = max_rel_err(arena, want, f, frames * n_mels)
    assert err < 1e-4, err

    def numpy_log_mel() -> np.ndarray:
        power = spec[:, :n_bins] ** 2 + spec[:, n_fft:n_fft + n_bins] ** 2
        log_mel = np.log10(np.maximum(power @ filters.T, np.float32(1e-10)))
        return (np.maximum(log_mel, log_mel.max(axis=1, keepdims=True) - 8) + 4) / 4

    times = common.interleaved({"ours": lambda: program.run(arena), "numpy": numpy_log_mel}, rounds=rounds)
    print(f"  LogMel {frames} frames, n_fft {n_fft}, {n_mels} mels: ours {times['ours'].median:.2f} ms   "
          f"NumPy {times['numpy'].median:.2f} ms   ratio {common.paired_ratio(times['ours'], times['numpy']):.2f}x"
          f"   max rel err {err:.1e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    set_num_threads(1)
    print(f"one thread, {common.cpu_name()}, load {common.load_average()}")
    bench_log_mel(args.rounds)
    for n in (1024, 1000):
        bench_fft(4096, n, args.rounds)


if __name__ == "__main__":
    main()
