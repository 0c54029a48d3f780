"""SelectiveScan at one thread against a memory-bandwidth bound (issue 12): batch 1, seq 2048, hidden 1536, n 16.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_ssm.py [--rounds 7] [--seq 2048] [--hidden 1536] [--n 16]

The bound: the scan must read x and Δ and write y (`3·seq·hidden·4` bytes; A, B, C are ≤ 1% more and
stay in cache), so it cannot beat streaming those bytes.  `np.copyto` of `1.5×` that many bytes (a copy
reads one and writes one: as many bytes through memory as reading two and writing one) is timed in the
same rounds and is the bound.  Also shown: the state updates per ns (each one an `exp`, two fmas and a
multiply-add into y).  The kernel is checked against the NumPy reference before it is timed.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.pin_threads(1)

import numpy as np  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from rlx_llvm import reference  # noqa: E402
from rlx_llvm import thunks as T  # noqa: E402
from rlx_llvm.kernels.threads import set_num_threads  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--n", type=int, default=16)
    args = ap.parse_args()
    set_num_threads(1)
    s, d, n = args.seq, args.hidden, args.n
    sizes = [4 * s * d, 4 * s * d, 4 * d * n, 4 * s * n, 4 * s * n, 4 * s * d]
    offs, top = [], 0
    for size in sizes:
        offs.append(top)
        top += -(-size // 64) * 64
    t = T.SelectiveScan(x=offs[0], delta=offs[1], a=offs[2], b=offs[3], c=offs[4], dst=offs[5], batch=1, seq=s,
                        hidden=d, state_size=n)
    rng = np.random.default_rng(0)
    arena = rl.Arena(top)
    values = [rng.standard_normal(s * d), rng.uniform(0.01, 0.5, s * d), rng.uniform(-2, -0.2, d * n),
              rng.standard_normal(s * n), rng.standard_normal(s * n)]
    for off, v in zip(offs, values):
        arena.write(off, v.astype(np.float32))
    schedule = rl.ThunkSchedule([t], arena_bytes=top)
    program = rl.compile(schedule)
    want = rl.Arena.from_bytes(arena.bytes.copy())
    program.run(arena)
    reference.run(schedule, want)
    got, ref = (a.bytes[offs[5]:offs[5] + sizes[5]].view(np.float32) for a in (arena, want))
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < 1e-4, err

    moved = 3 * 4 * s * d
    src, dst = np.ones(moved * 3 // 8, np.float32), np.empty(moved * 3 // 8, np.float32)
    times = common.interleaved({"scan": lambda: program.run(arena), "copy": lambda: np.copyto(dst, src)},
                               rounds=args.rounds)
    scan, copy = times["scan"].median, times["copy"].median
    print(f"SelectiveScan b=1 seq={s} hidden={d} n={n}, one thread, {common.cpu_name()}, load {common.load_average()}")
    print(f"  scan {scan:.2f} ms   bandwidth bound (copy of {moved * 1.5 / 1e6:.1f} MB) {copy:.2f} ms   "
          f"ratio {common.paired_ratio(times['scan'], times['copy']):.2f}x   "
          f"{s * d * n / (scan * 1e6):.2f} state updates/ns   max rel err {err:.1e}")


if __name__ == "__main__":
    main()
