"""Scan's per-step overhead: a Scan of 1000 steps over a small body, against the same body thunks laid
out 1000 times in a flat schedule (no copies, no loop) — the difference per step is what the Scan adds
(slice copies, the carry copy, one call into the body).  One thread, one run, medians.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_scan.py [--steps 1000] [--hidden 5,64,1024]
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
from rlx_llvm import thunks as T  # noqa: E402
from rlx_llvm.kernels.threads import set_num_threads  # noqa: E402
from rlx_llvm.ops import Activation  # noqa: E402


def body(h: int) -> list[T.Thunk]:
    """`out = tanh(carry·w + x)` over `h` f32 at body offsets 0 (carry), B (w), 2B (x), 3B (out)."""
    B = 4 * h
    return [T.Fma(a=0, b=B, c=2 * B, dst=3 * B, len=h, elem_bytes=4),
            T.ActivationInPlace(data=3 * B, len=h, act=Activation.Tanh)]


def case(h: int, steps: int, rounds: int) -> list[str]:
    B = 4 * h
    inner = rl.ThunkSchedule(body(h), arena_bytes=4 * B)
    xs_at, final_at = B, B + steps * B
    scan = T.Scan(body=inner, body_init=b"", body_input_off=0, body_output_off=3 * B, outer_init_off=0,
                  outer_final_off=final_at, length=steps, carry_bytes=B, save_trajectory=False,
                  xs_inputs=((2 * B, xs_at, B),), bcast_inputs=(), num_checkpoints=0)
    looped = rl.compile(rl.ThunkSchedule([scan], arena_bytes=final_at + B))
    flat = rl.compile(rl.ThunkSchedule(body(h) * steps, arena_bytes=4 * B))
    a, b = rl.Arena(final_at + B), rl.Arena(4 * B)
    a.write(xs_at, np.random.default_rng(0).standard_normal(steps * h).astype(np.float32) * 0.1)
    t = common.interleaved({"scan": lambda: looped.run(a), "flat": lambda: flat.run(b)}, rounds=rounds)
    over_us = (t["scan"].median - t["flat"].median) * 1e3 / steps
    return [str(h), str(steps), common.fmt_ms(t["scan"].median), common.fmt_ms(t["flat"].median), f"{over_us:.3f}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--hidden", default="5,64,1024")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    set_num_threads(1)
    print(common.python_facts())
    table = common.Table(["hidden", "steps", "Scan ms", "flat body×steps ms", "overhead µs/step"])
    for h in args.hidden.split(","):
        table.add(*case(int(h), args.steps, args.rounds))
    table.note("overhead = (Scan − flat) / steps: the slice and carry copies plus one call into the body per step")
    print(table)


if __name__ == "__main__":
    main()
