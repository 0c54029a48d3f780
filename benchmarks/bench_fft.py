"""Fft1d and LogMel at one thread (issue 13): rows 4096 × 1024 and 4096 × 1000 — C64 (interleaved), F32
(real-block) and C128 — against `scipy.fft` (workers=1) and `numpy.fft` of the same complex rows, wall and
CPU-time (`time.thread_time`) medians; and LogMel over a 30 s 16 kHz signal's spectrogram (3000 frames,
n_fft 400, 201 bins, 80 mels) against NumPy (`power @ filters.T`, log10, per-row floor, in float32).

    cd /work/main && PYTHONPATH=. python benchmarks/bench_fft.py [--rounds 7]

Each kernel is checked against the NumPy reference before it is timed; medians of interleaved rounds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.pin_threads(1)

import numpy as np  # noqa: E402
import scipy.fft  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from rlx_llvm import reference  # noqa: E402
from rlx_llvm import thunks as T  # noqa: E402
from rlx_llvm.dtypes import DType  # noqa: E402
from rlx_llvm.reference.fft import REAL  # noqa: E402
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


def timed(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, tuple[float, float, list[float]]]:
    """Interleaved rounds (the order rotating): per implementation (wall median ms, CPU-time median ms,
    per-round wall samples), CPU time being this thread's `time.thread_time`."""
    names = list(fns)
    for fn in fns.values():
        fn()
    wall: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            w0, c0 = time.perf_counter(), time.thread_time()
            fns[name]()
            cpu[name].append((time.thread_time() - c0) * 1e3)
            wall[name].append((time.perf_counter() - w0) * 1e3)
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k]), wall[k]) for k in names}


def bench_fft(table: common.Table, rows: int, n: int, dtype: DType, rounds: int) -> None:
    """One Fft1d thunk of `rows × n` against scipy.fft (workers=1) and numpy.fft of the same complex rows."""
    real = REAL[dtype]
    cplx = np.complex64 if real is np.float32 else np.complex128
    rng = np.random.default_rng(0)
    z = (rng.standard_normal((rows, n)) + 1j * rng.standard_normal((rows, n))).astype(cplx)
    flat = z.view(real).reshape(-1) if dtype.is_complex else np.concatenate([z.real, z.imag], axis=1).reshape(-1)
    nbytes = flat.nbytes
    t = T.Fft1d(src=0, dst=nbytes, outer=rows, n_complex=n, inverse=False, norm_tag=0, dtype=dtype)
    program, arena, want = compiled(t, 2 * nbytes, {0: flat})
    got, ref = (a.bytes[nbytes:2 * nbytes].view(real).astype(np.float64) for a in (arena, want))
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert err < (1e-5 * np.log2(n) if real is np.float32 else 1e-12), err
    times = timed({"ours": lambda: program.run(arena),
                   "scipy": lambda: scipy.fft.fft(z, axis=1, workers=1, overwrite_x=False),
                   "numpy": lambda: np.fft.fft(z, axis=1)}, rounds)
    (ow, oc, os_), (sw, sc, ss), (nw, nc, _) = times["ours"], times["scipy"], times["numpy"]
    ratio = statistics.median(a / b for a, b in zip(os_, ss))
    layout = "interleaved" if dtype.is_complex else "real-block"
    table.add(f"{dtype.value} {layout}", f"{rows} x {n}", f"{ow:.1f} / {oc:.1f}", f"{sw:.1f} / {sc:.1f}",
              f"{nw:.1f} / {nc:.1f}", f"{ratio:.2f}x", f"{err:.1e}")


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
    ap.add_argument("--n", type=int, nargs="+", default=[1024, 1000])
    ap.add_argument("--dtypes", nargs="+", default=["c64", "f32", "c128"])
    ap.add_argument("--no-log-mel", action="store_true")
    args = ap.parse_args()
    set_num_threads(1)
    print(f"one thread, {common.cpu_name()}, load {common.load_average()}")
    if not args.no_log_mel:
        bench_log_mel(args.rounds)
    table = common.Table(["rows", "shape", "ours wall / cpu ms", "scipy wall / cpu", "numpy wall / cpu",
                          "ours / scipy", "max rel err"], left=["rows"], title="Fft1d, forward, one thread")
    for dtype in args.dtypes:
        for n in args.n:
            bench_fft(table, 4096, n, DType(dtype), args.rounds)
    table.note("medians of interleaved rounds; ratio = median of per-round wall ratios")
    print(table)


if __name__ == "__main__":
    main()
