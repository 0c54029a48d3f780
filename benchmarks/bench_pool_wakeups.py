"""Where the pool's worker is when a region starts: the imported MiniLM-L3 at one and two threads, each
timed call after a 50 ms sleep ("idle": the worker asleep) or after the sleep and one untimed call
("b2b": the worker still spinning), with the pool's counters (`rlx_llvm.kernels.pool.stats()`) per
two-thread call — regions, the caller's share of the chunks, the regions the worker took part in,
how late its first claim came, how many of its arrivals ran on the caller's own CPU, and how often
it moved off that CPU.  Rounds alternate the thread counts (docs/runtime.md, "Where the worker is").

    cd /work/main && PYTHONPATH=. python benchmarks/bench_pool_wakeups.py [--batch 1] [--rounds 10]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from rlx_llvm import jit  # noqa: E402
from rlx_llvm.kernels import pool  # noqa: E402
from rlx_llvm.onnx.ops_models import packaged_model  # noqa: E402
from bench_onnx_minilm import feeds_for  # noqa: E402

MODES = ("b2b", "idle")
GAP_S = 0.05


def tsc_per_us(window_s: float = 0.05) -> float:
    """The cycle counter's rate (the pool's counters are in its cycles), measured against perf_counter."""
    code = jit.compile_ir(f'target triple = "{jit.host().triple}"\n'
                          "declare i64 @llvm.readcyclecounter()\n"
                          "define i64 @cycles() {\n  %c = call i64 @llvm.readcyclecounter()\n  ret i64 %c\n}\n")
    engine = jit.Engine()
    engine.load(code)
    cycles = ctypes.CFUNCTYPE(ctypes.c_int64)(engine.address("cycles"))
    c0, t0 = cycles(), time.perf_counter()
    time.sleep(window_s)
    return (cycles() - c0) / ((time.perf_counter() - t0) * 1e6)


def measure(batch: int, rounds: int) -> tuple[dict, dict]:
    """{(threads, mode): [seconds]} and {mode: summed counter deltas of the two-thread calls}."""
    model = rl.onnx.OnnxModel(packaged_model("paraphrase-minilm-l3"))
    feeds = feeds_for(batch, 128)
    for threads in (1, 2):
        rl.set_num_threads(threads)
        model.run(feeds)
    times, counters = {}, {mode: dict.fromkeys(pool.stats(), 0) for mode in MODES}
    for r in range(rounds):
        for threads in ((1, 2) if r % 2 else (2, 1)):
            rl.set_num_threads(threads)
            for mode in MODES:
                time.sleep(GAP_S)
                if mode == "b2b":
                    model.run(feeds)
                before, t0 = pool.stats(), time.perf_counter()
                model.run(feeds)
                times.setdefault((threads, mode), []).append(time.perf_counter() - t0)
                after = pool.stats()
                if threads == 2:
                    for k in after:
                        counters[mode][k] += after[k] - before[k]
    return times, counters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    print(f"# {common.cpu_model()} ({common.cpu_name()}), cores {common.cores()}, load {common.load_average()}")
    rate = tsc_per_us()
    times, counters = measure(args.batch, args.rounds)
    table = common.Table(["mode", "1t ms", "2t ms", "speed×", "regions", "caller share", "worker in",
                          "first claim µs", "on caller's CPU", "moves"], left=["mode"])
    for mode in MODES:
        one, two = (1e3 * float(np.median(times[(t, mode)])) for t in (1, 2))
        c, n = counters[mode], args.rounds
        table.add(mode, f"{one:.2f}", f"{two:.2f}", f"{one / two:.2f}", f"{c['regions'] / n:.0f}",
                  f"{c['caller_chunks'] / max(1, c['chunks']):.2f}", f"{c['arrivals'] / n:.1f}",
                  f"{c['arrival_cycles'] / max(1, c['arrivals']) / rate:.0f}",
                  f"{c['arrivals_on_callers_cpu'] / n:.1f}", f"{c['moves'] / n:.1f}")
    print(table.render())
    print(f"  MiniLM-L3 {args.batch}×128, medians of {args.rounds} rounds; counters per two-thread call; "
          f"load now {common.load_average()}")


if __name__ == "__main__":
    main()
