"""SelectiveScan at one thread against a memory-bandwidth bound (issue 12): batch 1, seq 2048, hidden 1536, n 16.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_ssm.py [--rounds 7] [--seq 2048] [--hidden 1536] [--n 16]

The bound: the scan must read x, Δ, A, B, C and write y once — `4·(3·b·s·d + d·n + 2·b·s·n)` bytes — so it
cannot beat moving those bytes at the machine's memory bandwidth.  The bandwidth is measured in the same
rounds: `np.copyto` between two 64 MiB buffers (above any L3), (bytes read + bytes written) ÷ its time;
bound = the scan's bytes ÷ that bandwidth.  (A copy pays the same write-allocate read of its destination
as the scan's y.)  Also shown: the state updates per ns (each an `exp`, two fmas and a multiply-add into
y) — the scan on one AVX2 core is bound by those, not by memory.  The kernel is checked against the NumPy
reference before it is timed.
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
from bench_qgemm import cpu_timed  # noqa: E402  (per-call CPU time of the calling thread)


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

    moved = 4 * (3 * s * d + d * n + 2 * s * n)          # bytes the scan reads and writes
    copy_bytes = 64 << 20
    src, dst = np.ones(copy_bytes // 4, np.float32), np.empty(copy_bytes // 4, np.float32)
    cpu = {name: common.Timing() for name in ("scan", "copy")}
    fns = {"scan": lambda: program.run(arena), "copy": lambda: np.copyto(dst, src)}
    times = common.interleaved({name: cpu_timed(fn, cpu[name].samples) for name, fn in fns.items()},
                               rounds=args.rounds)
    print(f"SelectiveScan b=1 seq={s} hidden={d} n={n}, one thread, {common.cpu_name()}, load {common.load_average()}")
    for clock, timing in (("wall", times), ("cpu", cpu)):
        scan, copy = timing["scan"].median, timing["copy"].median
        bandwidth = 2 * copy_bytes / (copy * 1e6)               # GB/s: read + written per second
        bound = moved / (bandwidth * 1e6)                       # ms
        ratio = common.paired_ratio(timing["scan"], timing["copy"]) * copy / bound
        print(f"  {clock:4}: scan {scan:.2f} ms ({s * d * n / (scan * 1e6):.2f} state updates/ns)   bandwidth bound "
              f"{bound:.2f} ms = {moved / 1e6:.1f} MB read+written ÷ {bandwidth:.1f} GB/s (np.copyto of "
              f"{copy_bytes >> 20} MiB in {copy:.2f} ms, same rounds)   scan / bound {ratio:.2f}x")
    print(f"  max rel err vs the float64 reference {err:.1e}")

if __name__ == "__main__":
    main()
