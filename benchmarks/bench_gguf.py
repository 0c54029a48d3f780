"""Quantized GEMV/GEMM at one thread, one run, one table: `DequantMatMulGguf` (Q4_0, Q8_0, Q4_K) and
`DequantMatMulInt4` against copy bandwidth, ONNX Runtime's `MatMulNBits`, NumPy, and our f32 Sgemm.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_gguf.py [--rounds 7] [--schemes GgufQ4_0,GgufQ8_0]

Weights k = n = 4096, x `[m, k]` f32, m ∈ {1, 16, 64} by default (16–128 are MiniLM's batch-1 token counts).  The 4-bit weights are one set: the Q4_0 blocks
(`d·(q − 8)`, block 32) are re-packed as `DequantMatMulInt4` (`[k, n]` nibbles, f32 scale, zero point 8)
and as ORT's `MatMulNBits` (`[n, k/32, 16]` bytes, element 2i low nibble, f32 scales, default zero point
8; built with `onnx.helper` in the `com.microsoft` domain, one intra-op thread), so all three compute the
same product.  Columns (medians of per-call CPU time of the calling thread, `time.thread_time`, which a loaded host
disturbs less than the wall time, shown beside it; every rate and ratio is taken from the CPU medians):

* `GB/s`, `of copy` — packed weight bytes (codes and scales) per second, against `np.copyto` of as many
  bytes timed in the same rounds (the m = 1 bar: ≥ 60 %);
* `vs sgemm` — our own f32 Sgemm's time (the `Sgemm` thunk, IR tiles, on the same shape with the weights
  dequantized to f32) over ours: the GFLOP/s ratio (the m = 64 bar: ≥ 0.8×);
* `vs ort`, `vs numpy` — their median time over ours (> 1: we are faster); NumPy is gguf dequantize
  (or the nibble unpack for Int4) + matmul.

Every implementation is checked against a float64 product of the dequantized weights before it is
timed; timings are interleaved (rounds rotate the order) and medians reported.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.pin_threads(1)

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
from gguf import GGMLQuantizationType as G  # noqa: E402
from gguf.quants import dequantize  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from rlx_llvm import thunks as T  # noqa: E402
from rlx_llvm.kernels.threads import set_num_threads  # noqa: E402
from rlx_llvm.ops import QuantScheme  # noqa: E402
from rlx_llvm.testing.gguf import random_blocks  # noqa: E402
from rlx_llvm.thunks.quant import GGUF_BLOCKS  # noqa: E402

K = N = 4096
BLOCK = 32
ORACLE = {"GgufQ4_0": G.Q4_0, "GgufQ8_0": G.Q8_0, "GgufQ4K": G.Q4_K, "GgufQ6K": G.Q6_K, "GgufQ4_1": G.Q4_1,
          "GgufQ5_0": G.Q5_0, "GgufQ5K": G.Q5_K}
Run = Callable[[], object]


@dataclass
class Row:
    """One implementation under test at one m: how to run it, its packed bytes, its NumPy peer."""

    label: str
    m: int
    wbytes: int
    run: Run
    numpy: Run


def slots(*nbytes: int) -> tuple[list[int], int]:
    """64-byte-aligned offsets of consecutive buffers, and the arena size."""
    offs, top = [], 0
    for n in nbytes:
        offs.append(top)
        top += -(-n // 64) * 64
    return offs, top


def compiled(thunk: T.Thunk, size: int, data: dict[int, np.ndarray]) -> tuple[Run, rl.Arena]:
    """The thunk compiled alone over an arena holding `data` (offset → array)."""
    program, arena = rl.compile(rl.ThunkSchedule([thunk], arena_bytes=size)), rl.Arena(size)
    for at, values in data.items():
        arena.write(at, values)
    return (lambda: program.run(arena)), arena


def check(label: str, got: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    """`got` ≈ x @ wᵀ (float64) within 1e-5 of Σ|x·w| per output, else exit."""
    want = x.astype(np.float64) @ w.astype(np.float64).T
    scale = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T
    if not np.all(np.abs(got.reshape(want.shape) - want) <= 1e-5 * scale + 1e-6):
        sys.exit(f"{label}: disagrees with the float64 reference")


# ── the implementations ──────────────────────────────────────────────────────

def gguf_row(scheme: str, packed: np.ndarray, x: np.ndarray) -> Row:
    """DequantMatMulGguf over `packed` [n, k] blocks."""
    m = x.shape[0]
    (x_at, w_at, dst_at), size = slots(x.nbytes, packed.nbytes, 4 * m * N)
    run, arena = compiled(T.DequantMatMulGguf(x=x_at, w_q=w_at, dst=dst_at, m=m, k=K, n=N,
                                              scheme=getattr(QuantScheme, scheme)), size, {x_at: x, w_at: packed})
    run()
    w = dequantize(packed, ORACLE[scheme]).reshape(N, K)
    check(f"{scheme} m={m}", arena.read(dst_at, np.float32, m * N), x, w)
    return Row(scheme, m, packed.nbytes, run, lambda: x @ dequantize(packed, ORACLE[scheme]).reshape(N, K).T)


def q4_0_codes(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 blocks as (codes q [n, k] in 0…15, scales d [n, k/32] f32): w = d·(q − 8)."""
    blocks = packed.reshape(N * K // BLOCK, 18)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32).reshape(N, K // BLOCK)
    qs = blocks[:, 2:]
    return np.concatenate([qs & 15, qs >> 4], axis=1).reshape(N, K), d


def pairs(codes: np.ndarray) -> np.ndarray:
    """Consecutive nibbles two per byte, the even one low."""
    flat = codes.reshape(-1)
    return (flat[0::2] | flat[1::2] << 4).astype(np.uint8)


def int4_row(q: np.ndarray, d: np.ndarray, x: np.ndarray) -> Row:
    """DequantMatMulInt4: codes `[k, n]`, scale `[k/32, n]`, zero point 8 — the Q4_0 weights."""
    m = x.shape[0]
    codes, scale, zp = pairs(q.T), np.ascontiguousarray(d.T), np.full((K // BLOCK, N), 8.0, np.float32)
    (x_at, w_at, s_at, z_at, dst_at), size = slots(x.nbytes, codes.nbytes, scale.nbytes, zp.nbytes, 4 * m * N)
    thunk = T.DequantMatMulInt4(x=x_at, w_q=w_at, scale=s_at, zp=z_at, dst=dst_at, m=m, k=K, n=N,
                                block_size=BLOCK, is_asymmetric=True)
    run, arena = compiled(thunk, size, {x_at: x, w_at: codes, s_at: scale, z_at: zp})
    run()
    check(f"Int4 m={m}", arena.read(dst_at, np.float32, m * N), x, weights_of(q, d))

    def numpy_path() -> np.ndarray:
        unpacked = np.stack([codes & 15, codes >> 4], axis=1).reshape(K, N).astype(np.float32)
        return x @ ((unpacked - zp.repeat(BLOCK, axis=0)) * scale.repeat(BLOCK, axis=0))

    return Row("Int4", m, codes.nbytes + scale.nbytes + zp.nbytes, run, numpy_path)


def weights_of(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The f32 weights [n, k] of Q4_0 codes and scales."""
    return (q.astype(np.float32) - 8) * d.repeat(BLOCK, axis=1)


def ort_matmul_nbits(q: np.ndarray, d: np.ndarray, x: np.ndarray) -> Run:
    """ONNX Runtime's MatMulNBits (4-bit, block 32, default zero point 8) on the Q4_0 weights, one thread."""
    m = x.shape[0]
    blob = pairs(q).reshape(N, K // BLOCK, BLOCK // 2)
    node = helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], domain="com.microsoft",
                            K=K, N=N, bits=4, block_size=BLOCK)
    graph = helper.make_graph(
        [node], "matmul_nbits", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, N])],
        initializer=[numpy_helper.from_array(blob, "B"), numpy_helper.from_array(d.reshape(-1), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feed = {"A": x}
    check(f"ORT MatMulNBits m={m}", session.run(None, feed)[0], x, weights_of(q, d))
    return lambda: session.run(None, feed)


def our_sgemm(w: np.ndarray, x: np.ndarray) -> Run:
    """Our f32 Sgemm (IR tiles) of x @ wᵀ with wᵀ stored [k, n]."""
    m = x.shape[0]
    b = np.ascontiguousarray(w.T)
    (a_at, b_at, c_at), size = slots(x.nbytes, b.nbytes, 4 * m * N)
    run, arena = compiled(T.Sgemm(a=a_at, b=b_at, c=c_at, m=m, k=K, n=N), size, {a_at: x, b_at: b})
    run()
    check(f"Sgemm m={m}", arena.read(c_at, np.float32, m * N), x, w)
    return run


# ── the table ────────────────────────────────────────────────────────────────

def timed(row: Row, peers: dict[str, Run], rounds: int) -> dict[str, tuple[float, float]]:
    """(CPU, wall) medians in ms of the row, its NumPy path, a copy of its packed bytes and the peers,
    interleaved (each round calls every one once, the order rotating); CPU is this thread's time."""
    src, dst = np.ones(row.wbytes, np.uint8), np.empty(row.wbytes, np.uint8)
    fns = {"rlx": row.run, "numpy": row.numpy, "copy": lambda: np.copyto(dst, src), **peers}
    for fn in fns.values():
        fn()
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            wall, cpu = time.perf_counter(), time.thread_time()
            fns[name]()
            samples[name].append((time.thread_time() - cpu, time.perf_counter() - wall))
    return {name: (1e3 * float(np.median([c for c, _ in v])), 1e3 * float(np.median([w for _, w in v])))
            for name, v in samples.items()}


def cells(row: Row, ms: dict[str, tuple[float, float]]) -> list[str]:
    """One line of the table: rates and ratios from the CPU-time medians."""
    cpu = {name: c for name, (c, _) in ms.items()}
    rlx, flops = cpu["rlx"], 2 * row.m * N * K
    gflops = flops / rlx / 1e6
    sgemm = f"{cpu['sgemm'] / rlx:.2f}×" if "sgemm" in cpu else "-"
    return [row.label, str(row.m), f"{rlx:.3f}", f"{ms['rlx'][1]:.3f}", f"{common.gbps(row.wbytes, rlx):.2f}",
            f"{100 * cpu['copy'] / rlx:.0f}%", f"{gflops:.1f}", sgemm, f"{cpu['ort']:.3f}", f"{cpu['ort'] / rlx:.2f}×",
            f"{cpu['numpy']:.1f}", f"{cpu['numpy'] / rlx:.1f}×"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--schemes", default="GgufQ4_0,GgufQ8_0,GgufQ4K")
    ap.add_argument("--ms", default="1,16,64", help="rows of x, e.g. 1,16,32,64,128")
    ap.add_argument("--no-int4", action="store_true", help="skip DequantMatMulInt4")
    args = ap.parse_args()
    set_num_threads(1)
    common.limit_loaded_pools(1)
    rng = np.random.default_rng(0)
    packed = {s: random_blocks(s, N * K // GGUF_BLOCKS[s][0], rng) for s in args.schemes.split(",")}
    q, d = q4_0_codes(packed["GgufQ4_0"] if "GgufQ4_0" in packed else random_blocks("GgufQ4_0", N * K // BLOCK, rng))
    print(f"# k = n = {K}, 1 thread — {common.cpu_model()} ({common.host_features()}), load {common.load_average()}")
    table = common.Table(["kind", "m", "cpu ms", "wall ms", "GB/s", "of copy", "GFLOP/s", "vs sgemm", "ort ms",
                          "vs ort", "numpy ms", "vs numpy"], left=["kind"])
    for m in map(int, args.ms.split(",")):
        x = rng.standard_normal((m, K)).astype(np.float32)
        peers = {"ort": ort_matmul_nbits(q, d, x)}
        if m > 1:
            peers["sgemm"] = our_sgemm(weights_of(q, d), x)
        rows = [gguf_row(s, p, x) for s, p in packed.items()] + ([] if args.no_int4 else [int4_row(q, d, x)])
        for row in rows:
            table.add(*cells(row, timed(row, peers, args.rounds)))
            print("  ".join(table.rows[-1]), file=sys.stderr)
    print(table)


if __name__ == "__main__":
    main()
