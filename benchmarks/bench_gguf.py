"""DequantMatMulGguf at one thread: GB/s on the packed weight bytes against copy bandwidth, and
against NumPy (gguf dequantize + matmul) — one run, one table.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_gguf.py [--rounds 7] [--schemes GgufQ4_0,GgufQ8_0]

Weights k = n = 4096 (GGUF row-major `[n, k]`), x `[m, k]` f32, m ∈ {1, 64}.  Every implementation
is checked against a float64 product of gguf's dequantized weights before it is timed; timings are
interleaved (rounds rotate the order) and medians reported.  The copy ceiling is `np.copyto` of
as many bytes as the packed weights (read and written: the GB/s counts the bytes copied once).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.pin_threads(1)

import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as G  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from rlx_llvm import thunks as T  # noqa: E402
from rlx_llvm.kernels.threads import set_num_threads  # noqa: E402
from rlx_llvm.ops import QuantScheme  # noqa: E402
from rlx_llvm.testing.gguf import random_blocks  # noqa: E402
from rlx_llvm.thunks.quant import GGUF_BLOCKS  # noqa: E402

K = N = 4096
ORACLE = {"GgufQ4_0": G.Q4_0, "GgufQ8_0": G.Q8_0, "GgufQ4K": G.Q4_K, "GgufQ6K": G.Q6_K}


def case(scheme: str, m: int, rounds: int, rng: np.random.Generator) -> list[str]:
    """Time one (scheme, m); returns the table row."""
    elems, nbytes = GGUF_BLOCKS[scheme]
    wbytes = N * K // elems * nbytes
    x_at, w_at, dst_at = 0, 4 * m * K, 4 * m * K + wbytes
    schedule = rl.ThunkSchedule([T.DequantMatMulGguf(x=x_at, w_q=w_at, dst=dst_at, m=m, k=K, n=N,
                                                     scheme=getattr(QuantScheme, scheme))],
                                arena_bytes=dst_at + 4 * m * N)
    program, arena = rl.compile(schedule), rl.Arena(schedule.arena_bytes)
    packed = random_blocks(scheme, wbytes // nbytes, rng)
    x = rng.standard_normal((m, K)).astype(np.float32)
    arena.write(w_at, packed)
    arena.write(x_at, x)

    def numpy_path() -> np.ndarray:
        return x @ dequantize(packed, ORACLE[scheme]).reshape(N, K).T

    want = x.astype(np.float64) @ dequantize(packed, ORACLE[scheme]).reshape(N, K).astype(np.float64).T
    program.run(arena)
    got = arena.read(dst_at, np.float32, m * N).reshape(m, N)
    scale = np.abs(x).astype(np.float64) @ np.abs(dequantize(packed, ORACLE[scheme]).reshape(N, K)).T
    if not np.all(np.abs(got - want) <= 1e-5 * scale + 1e-6):
        sys.exit(f"{scheme} m={m}: rlx-llvm disagrees with the float64 reference")
    src, dst = np.ones(wbytes, np.uint8), np.empty(wbytes, np.uint8)
    times = common.interleaved({"rlx": lambda: program.run(arena), "numpy": numpy_path,
                                "copy": lambda: np.copyto(dst, src)}, rounds=rounds)
    rlx, npy, copy = (times[k].median for k in ("rlx", "numpy", "copy"))
    flops = 2 * m * N * K
    return [scheme, str(m), f"{rlx:.3f}", f"{common.gbps(wbytes, rlx):.2f}",
            f"{100 * common.gbps(wbytes, rlx) / common.gbps(wbytes, copy):.0f}%", f"{flops / rlx / 1e6:.1f}",
            f"{npy:.2f}", f"{npy / rlx:.1f}×"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--schemes", default="GgufQ4_0,GgufQ8_0,GgufQ4K")
    args = ap.parse_args()
    set_num_threads(1)
    common.limit_loaded_pools(1)
    rng = np.random.default_rng(0)
    print(f"# DequantMatMulGguf k = n = {K}, 1 thread — {common.cpu_model()}, load {common.load_average()}")
    head = ["scheme", "m", "rlx ms", "GB/s packed", "of copy", "GFLOP/s", "numpy ms", "vs numpy"]
    rows = [case(s, m, args.rounds, rng) for s in args.schemes.split(",") for m in (1, 64)]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths)))


if __name__ == "__main__":
    main()
