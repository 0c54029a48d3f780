"""MLX-quantized GEMV at one thread, one run, one table: `DequantMatMulMlx` (affine 4-bit group 64 by
default) against copy bandwidth, our `DequantMatMulGguf` Q4_0 on the same shape, NumPy and MLX itself.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_mlx.py [--rounds 15] [--schemes a4g64,a3g64,mxfp4]

Weights k = n = 4096, x `[m, k]` f32.  Columns: `GB/s` and `of copy` count the packed weight bytes (codes,
scales, biases) against `np.copyto` of as many bytes in the same rounds; `Q4_0` is our GGUF Q4_0 GEMV
(18 bytes per 32 weights) on the same shape; `numpy` is the reference dequantize + matmul; `mlx` is
`mlx.core.quantized_matmul` on its CPU stream (when MLX is installed; its own thread count).  Every
implementation is checked against a float64 product of the dequantized weights before it is timed.
Times are medians of interleaved rounds: wall clock (`ms`) and the process's CPU time (`cpu ms`, the
steadier figure on a shared, loaded machine); the ratios use CPU time.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.pin_threads(1)

import numpy as np  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from rlx_llvm import thunks as T  # noqa: E402
from rlx_llvm.kernels.threads import set_num_threads  # noqa: E402
from rlx_llvm.ops import QuantScheme  # noqa: E402
from rlx_llvm.reference import mlx as ref  # noqa: E402
from rlx_llvm.testing.gguf import random_blocks  # noqa: E402

K = N = 4096
SCHEMES = {"a4g64": QuantScheme.MlxAffine(bits=4, group_size=64), "a3g64": QuantScheme.MlxAffine(bits=3, group_size=64),
           "a8g64": QuantScheme.MlxAffine(bits=8, group_size=64), "a4g32": QuantScheme.MlxAffine(bits=4, group_size=32),
           "mxfp4": QuantScheme.MlxMxfp4(group_size=32), "mxfp8": QuantScheme.MlxMxfp8(group_size=32)}


def compiled(thunk: T.Thunk, data: list[np.ndarray]) -> tuple:
    """`thunk` with its buffer fields set to consecutive 64-byte-aligned slots holding `data` (then dst)."""
    offs, top = [], 0
    for a in data:
        offs.append(top)
        top += -(-a.nbytes // 64) * 64
    program = rl.compile(rl.ThunkSchedule([thunk(*offs, top)], arena_bytes=top + 4 * N * 64))
    arena = rl.Arena(top + 4 * N * 64)
    for at, values in zip(offs, data):
        arena.write(at, values)
    return (lambda: program.run(arena)), (lambda m: arena.read(top, np.float32, m * N))


def check(label: str, got: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    """`got` ≈ x @ wᵀ (float64) within 1e-5 of Σ|x|·|w| per output, else exit."""
    want = x.astype(np.float64) @ w.astype(np.float64).T
    scale = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T
    if not np.all(np.abs(np.asarray(got).reshape(want.shape) - want) <= 1e-5 * scale + 1e-6):
        sys.exit(f"{label}: disagrees with the float64 reference")


def mlx_run(scheme: QuantScheme, x: np.ndarray, words: np.ndarray, scales: np.ndarray, biases):
    """`mlx.core.quantized_matmul` on the CPU stream, or None without MLX."""
    try:
        import mlx.core as mx
    except ImportError:
        return None
    mode = "affine" if biases is not None else type(scheme).__name__[3:].lower()
    args = [mx.array(a) for a in (x, words, scales)] + [None if biases is None else mx.array(biases)]

    def run():
        out = mx.quantized_matmul(*args, transpose=True, group_size=scheme.group_size, bits=ref.code_bits(scheme),
                                  mode=mode, stream=mx.cpu)
        mx.eval(out)
        return out
    return run


def cpu_timed(fns: dict, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall and CPU (process) milliseconds of each function, timed in interleaved rounds."""
    cpu: dict[str, list[float]] = {name: [] for name in fns}

    def with_cpu(name: str, fn):
        def run():
            start = time.process_time()
            fn()
            cpu[name].append(1e3 * (time.process_time() - start))
        return run

    wall = common.interleaved({name: with_cpu(name, fn) for name, fn in fns.items()}, rounds=rounds)
    return ({name: t.median for name, t in wall.items()},
            {name: float(np.median(samples[1:])) for name, samples in cpu.items()})   # [0]: the warm-up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--schemes", default="a4g64")
    ap.add_argument("--ms", default="1")
    args = ap.parse_args()
    set_num_threads(1)
    common.limit_loaded_pools(1)
    rng = np.random.default_rng(0)
    table = common.Table(["scheme", "m", "ms", "cpu ms", "GB/s", "of copy", "Q4_0 cpu", "vs Q4_0", "numpy cpu",
                          "mlx cpu", "vs mlx"], left=["scheme"],
                         title=f"k = n = {K}, one thread; load {common.load_average()}")
    q4_0 = random_blocks("GgufQ4_0", N * K // 32, rng)
    for m in map(int, args.ms.split(",")):
        x = rng.standard_normal((m, K)).astype(np.float32)
        gguf_run, _ = compiled(lambda xo, wo, dst: T.DequantMatMulGguf(x=xo, w_q=wo, dst=dst, m=m, k=K, n=N,
                                                                       scheme=QuantScheme.GgufQ4_0), [x, q4_0])
        for name in args.schemes.split(","):
            scheme = SCHEMES[name]
            groups = K // scheme.group_size
            words = rng.integers(0, 1 << 32, (N, K * ref.code_bits(scheme) // 32), dtype=np.uint64).astype(np.uint32)
            if isinstance(scheme, QuantScheme.MlxMxfp8):   # no NaN codes (S.1111.111): the products stay checkable
                codes = words.view(np.uint8)
                codes[(codes & 0x7F) == 0x7F] ^= 1
            if isinstance(scheme, QuantScheme.MlxAffine):
                scales = rng.uniform(0.01, 0.1, (N, groups)).astype(np.float32)
                biases = (rng.standard_normal((N, groups)) * 0.1).astype(np.float32)
                data = [x, words, scales, biases]
            else:
                scales, biases = rng.integers(120, 130, (N, groups)).astype(np.uint8), None
                data = [x, words, scales]
            w = ref.dequantize(scheme, words, scales, biases, K)

            def thunk(xo, wo, so, *rest, scheme=scheme):
                zo, dst = (rest[0], rest[1]) if len(rest) == 2 else (0, rest[0])
                return T.DequantMatMulMlx(x=xo, w_q=wo, scale=so, zp=zo, dst=dst, m=m, k=K, n=N, scheme=scheme)

            run, result = compiled(thunk, data)
            run()
            check(f"{name} m={m}", result(m), x, w)
            nbytes = sum(a.nbytes for a in data[1:])
            src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
            fns = {"rlx": run, "copy": lambda: np.copyto(dst, src), "q4_0": gguf_run,
                   "numpy": lambda: x @ ref.dequantize(scheme, words, scales, biases, K).T}
            peer = mlx_run(scheme, x, words, scales, biases)
            if peer is not None:
                check(f"mlx {name} m={m}", np.array(peer()), x, w)
                fns["mlx"] = peer
            wall, ms = cpu_timed(fns, args.rounds)
            rlx = ms["rlx"]
            table.add(name, m, f"{wall['rlx']:.3f}", f"{rlx:.3f}", f"{common.gbps(nbytes, rlx):.2f}",
                      f"{100 * ms['copy'] / rlx:.0f}%", f"{ms['q4_0']:.3f}", f"{ms['q4_0'] / rlx:.2f}×",
                      f"{ms['numpy']:.1f}", f"{ms['mlx']:.3f}" if "mlx" in ms else "-",
                      f"{ms['mlx'] / rlx:.2f}×" if "mlx" in ms else "-")
    table.note("medians of interleaved rounds; GB/s and ratios on CPU time; 'vs': their time over ours (> 1: we are faster)")
    print(table)


if __name__ == "__main__":
    main()
