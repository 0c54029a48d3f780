"""Compile cost against schedule length (issue 20, item 2): thunks of one kind and shape, repeated;
and many distinct kernels compiled on 1 and 2 threads.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_compile_scale.py                  # 2 000, 20 000
    cd /work/main && PYTHONPATH=. python benchmarks/bench_compile_scale.py --counts 2000 20000 200000
    cd /work/main && PYTHONPATH=. python benchmarks/bench_compile_scale.py --kinds distinct --repeat 3
    cd /work/main && PYTHONPATH=. python benchmarks/bench_compile_scale.py --profile 2000   # where it goes

Each case compiles in a fresh process with the object cache off (cold compile wall and CPU time, the
process's peak RSS, the compile's own phase timings), then runs the program to give the run time per
thunk; a second pair of processes compiles with a temporary cache and loads it warm (the warm figure).
Schedules: `copy` — N Copy thunks of 256 f32 (1 KiB), each from one 1 KiB block to the next, cycling
over 4 096 blocks; `region` — N small ElementwiseRegion thunks (x·y + x over 256 f32) the same way;
`distinct` — `--distinct` (2 000) ElementwiseRegions of as many lengths (256 + i f32), so as many
distinct kernels, compiled with `--threads` (1 and 2) compile threads (`rl.set_num_threads`): the
module is compiled in that many parts at once (docs/compile.md).
Goals: cold ≤ 1 s / 2 s / 15 s at 2 000 / 20 000 / 200 000, ≤ 200 MB at 20 000, warm load ≤ 0.5 s;
`distinct` ≥ 1.7× faster (wall) at 2 threads than at 1.  CPU is the whole process's (all threads).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK, BLOCKS, LEN = 1024, 4096, 256

SCHEDULE = r"""
import json, resource, sys, time
t_import = time.perf_counter()
import numpy as np
import rlx_llvm as rl
from rlx_llvm import thunks as T
from rlx_llvm.schedule import ThunkSchedule
from rlx_llvm.ops import BinaryOp, ChainOperand as In, ChainStep as S
kind, n, block, blocks, length, cache, profile, threads = sys.argv[1:9]
n, block, blocks, length = int(n), int(block), int(blocks), int(length)

def offset(i):
    return (i % blocks) * block

def thunk(i):
    src, dst = offset(i), offset(i + 1)
    if kind == "copy":
        return T.Copy(src=src, dst=dst, len=length)
    return T.ElementwiseRegion(dst=dst, len=length + i if kind == "distinct" else length, input_offs=(src, src),
                               chain=(S.Binary(BinaryOp.Mul, In.Input(0), In.Input(1)),
                                      S.Binary(BinaryOp.Add, In.Step(0), In.Input(0))))

schedule = ThunkSchedule([thunk(i) for i in range(n)], arena_bytes=blocks * block)
rl.set_num_threads(int(threads))
"""
"""A child's preamble: `schedule` built from its arguments, the compile threads set (also used by
bench_compile_replay.py)."""

CHILD = SCHEDULE + r"""
t0, c0 = time.perf_counter(), time.process_time()
if profile == "1":
    import cProfile, pstats
    prof = cProfile.Profile()
    prof.enable()
program = rl.compile(schedule, cache=(cache if cache != "0" else False))
if profile == "1":
    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
arena = rl.Arena.from_bytes((np.arange(blocks * block // 4) % 7 * 0.25).astype(np.float32))
program.run(arena)
runs = []
for _ in range(5):
    r0 = time.perf_counter()
    program.run(arena)
    runs.append(time.perf_counter() - r0)
runs.sort()
print(json.dumps({"wall": wall, "cpu": cpu, "rss_mb": rss, "run_us_per_thunk": runs[2] / n * 1e6,
                  "phases": program.report().timings_ms, "digest": int(arena.bytes.view(np.uint32).sum(dtype=np.uint64))}))
"""


def layout(kind: str, n: int) -> tuple[int, int]:
    """(block bytes, blocks) of the arena: 1 KiB × 4 096, or for `distinct` 64 blocks that fit the longest."""
    return (-(-4 * (LEN + n) // 64) * 64, 64) if kind == "distinct" else (BLOCK, BLOCKS)


def child(kind: str, n: int, cache: str, profile: bool = False, threads: int = 1) -> dict:
    """One compile in a fresh process: its figures as a dict."""
    block, blocks = layout(kind, n)
    out = subprocess.run([sys.executable, "-c", CHILD, kind, str(n), str(block), str(blocks), str(LEN), cache,
                          "1" if profile else "0", str(threads)],
                         env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr)
    if profile:
        print(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def row(kind: str, n: int, threads: int, repeat: int, no_warm: bool) -> dict:
    """Print one row: the median of `repeat` cold compiles (wall, CPU, peak RSS, phases), run time
    per thunk, and the warm load from a second process; returns the median cold figures."""
    colds = sorted((child(kind, n, "0", threads=threads) for _ in range(repeat)), key=lambda c: c["wall"])
    cold = colds[len(colds) // 2]
    assert len({c["digest"] for c in colds}) == 1, "compiles of one schedule computed different things"
    warm = ""
    if not no_warm:
        with tempfile.TemporaryDirectory() as d:
            child(kind, n, d, threads=threads)
            again = child(kind, n, d, threads=threads)
            assert again["digest"] == cold["digest"], "warm program computed something else"
            warm = f"{again['wall']:.3f}"
    phases = " ".join(f"{k}={v:.0f}" for k, v in cold["phases"].items())
    print(f"{kind:>8} {n:>8} {threads:>7} {cold['wall']:>8.2f} {cold['cpu']:>7.2f} {cold['rss_mb']:>7.0f}"
          f" {cold['run_us_per_thunk']:>13.3f} {warm:>7}  {phases}  (load average {os.getloadavg()[0]:.1f})",
          flush=True)
    return cold


def main() -> None:
    """Print one row per (schedule, count, threads): cold wall/CPU, peak RSS, run time per thunk, warm
    load; for `distinct`, the wall-time speed-up of each thread count over the first."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", type=int, nargs="+", default=[2000, 20000])
    ap.add_argument("--kinds", nargs="+", default=["copy", "region", "distinct"])
    ap.add_argument("--distinct", type=int, default=2000, help="kernels (thunks) of the `distinct` schedule")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="compile threads for `distinct`")
    ap.add_argument("--repeat", type=int, default=1, help="cold compiles per row (the median is shown)")
    ap.add_argument("--profile", type=int, default=0, help="cProfile one cold compile of this many Copy thunks")
    ap.add_argument("--no-warm", action="store_true")
    args = ap.parse_args()
    if args.profile:
        child("copy", args.profile, "0", profile=True)
        return
    print(f"{'schedule':>8} {'thunks':>8} {'threads':>7} {'cold s':>8} {'cpu s':>7} {'RSS MB':>7}"
          f" {'run µs/thunk':>13} {'warm s':>7}  phases (ms)")
    for kind in args.kinds:
        if kind != "distinct":
            for n in args.counts:
                row(kind, n, 1, args.repeat, args.no_warm)
            continue
        rows = [row(kind, args.distinct, t, args.repeat, args.no_warm) for t in args.threads]
        assert len({r["digest"] for r in rows}) == 1, "thread counts computed different things"
        for t, r in zip(args.threads[1:], rows[1:]):
            print(f"distinct: {t} threads vs {args.threads[0]}: {rows[0]['wall'] / r['wall']:.2f}× faster (wall),"
                  f" CPU {r['cpu'] / rows[0]['cpu']:.2f}×", flush=True)


if __name__ == "__main__":
    main()
