"""The distinct-kernel compile (bench_compile_scale.py `distinct`) replayed on dedicated cores.  On a
shared host the wall time of 2 compile threads says more about the neighbours' load than about the
pipeline, so this records CPU time and schedules it:

    cd /work/main && PYTHONPATH=. python benchmarks/bench_compile_replay.py --rounds 3

Each round compiles the schedule in fresh processes at 1 and at 2 threads (cache off) and records
CPU seconds of the thread doing the work: the main thread's (validation, emission, printing) and,
in its CPU time, when each part was cut; each part's compile.  The 2-thread trace is replayed on 2
cores that nothing else uses: the main thread runs to its end, a part may start once it is cut,
runnable threads share the cores equally, and a free compile thread takes
  `fifo`    the oldest part, with every thread from the start (the pipeline before 2026-12-07);
  `largest` the largest part, with one thread fewer while the main thread emits (the pipeline now).
The speed-up is the 1-thread trace's CPU (all of it serial) over the replayed wall time.  The
replay leaves out what dedicated cores would not give either way (memory bandwidth, the GIL).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from bench_compile_scale import LEN, ROOT, SCHEDULE, layout

TRACE = SCHEDULE + r"""
from rlx_llvm import jit, partition, program as P
cut_at, parts = {}, []
compile_part, streamed_cut, emit_module = jit._compile_part, partition.Streamed.cut, P.Program._emit_module

def traced_compile_part(text, *args):
    c = time.thread_time()
    code = compile_part(text, *args)
    parts.append((cut_at.get(id(text)), len(text), time.thread_time() - c))
    return code

def traced_cut(self, *args, **kw):
    part = streamed_cut(self, *args, **kw)
    if part is not None:
        cut_at[id(part[0])] = time.thread_time() - c0
    return part

def traced_emit_module(self, *args):
    global emitted
    text = emit_module(self, *args)
    emitted = time.thread_time() - c0
    return text

jit._compile_part, partition.Streamed.cut, P.Program._emit_module = \
    traced_compile_part, traced_cut, traced_emit_module
c0 = time.thread_time()
rl.compile(schedule, cache=False)
main = time.thread_time() - c0
print(json.dumps({"main": main, "emitted": emitted, "parts": [(main if at is None else at, size, cpu)
                                                             for at, size, cpu in parts]}))
"""


POLICIES = ("fifo", "largest")
"""How a free compile thread picks its next part in `replay` (see the module docstring)."""


def trace(n: int, threads: int) -> dict:
    """CPU trace of one cold compile of `n` distinct kernels on `threads` compile threads."""
    block, blocks = layout("distinct", n)
    out = subprocess.run([sys.executable, "-c", TRACE, "distinct", str(n), str(block), str(blocks), str(LEN),
                          "0", "0", str(threads)], env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def serial_cpu(t: dict) -> float:
    """All the CPU seconds of a trace, one after another."""
    return t["main"] + sum(cpu for _, _, cpu in t["parts"])


def replay(t: dict, policy: str, cores: int = 2, threads: int = 2, dt: float = 1e-3) -> float:
    """Wall seconds of trace `t` on `cores` dedicated cores with `threads` compile threads (`policy`
    as in the module docstring)."""
    pending = sorted(t["parts"])              # (cut at main CPU s, IR chars, CPU s)
    waiting: list = []
    running: list[float] = []                 # CPU seconds each running part still needs
    main_done = clock = 0.0
    while pending or waiting or running or main_done < t["main"]:
        while pending and pending[0][0] <= main_done:
            waiting.append(pending.pop(0))
        emitting = main_done < t["emitted"]
        free = max(1, threads - 1) if policy == "largest" and emitting else threads
        if policy == "largest":
            waiting.sort(key=lambda part: -part[1])
        while waiting and len(running) < free:
            running.append(waiting.pop(0)[2])
        on_cpu = len(running) + (main_done < t["main"])
        share = min(1.0, cores / on_cpu) * dt
        main_done += share if main_done < t["main"] else 0.0
        running = [left - share for left in running if left > share]
        clock += dt
    return clock


def main() -> None:
    """Per round: the 1-thread CPU, then each policy's replayed 2-thread wall time and its speed-up
    over the 1-thread CPU and over the 2-thread trace's own CPU (the schedule's efficiency, which
    load inflating one process's CPU more than the other's does not move)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--distinct", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    ones, twos = [], []
    for r in range(args.rounds):
        one, two = trace(args.distinct, 1), trace(args.distinct, 2)
        ones.append(serial_cpu(one))
        twos.append(two)
        line = [f"round {r}: 1 thread {ones[-1]:.2f} s CPU; 2 threads {serial_cpu(two):.2f} s CPU in"
                f" {len(two['parts'])} parts (main {two['main']:.2f}, emission done at {two['emitted']:.2f})"]
        for policy in POLICIES:
            wall = replay(two, policy)
            line.append(f"{policy} {wall:.2f} s = {ones[-1] / wall:.2f}× ({serial_cpu(two) / wall:.2f}× own)")
        print(";  ".join(line), f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    for policy in POLICIES:
        walls = [replay(two, policy) for two in twos]
        print(f"{policy}: median 1-thread CPU / median replayed wall {statistics.median(ones) / statistics.median(walls):.2f}×,"
              f" median own {statistics.median(serial_cpu(t) / w for t, w in zip(twos, walls)):.2f}×")


if __name__ == "__main__":
    main()
