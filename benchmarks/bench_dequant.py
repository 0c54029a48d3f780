"""The `[k, n]` dequantizing GEMMs at one thread, one run, one table: DequantMatMul (Int8Block),
DequantMatMulInt4, DequantMatMulFp8 (E4M3, E5M2), DequantMatMulNvfp4 and DequantMatMulMxFp4x2.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_dequant.py [--rounds 7] [--ms 1,16,64]

Weights k = n = 4096 (int blocks and MxFp4x2 groups of 32), x `[m, k]` f32.  Int4's zero points are
all 8 (as Q4_0's), so ONNX Runtime's `MatMulNBits` (4-bit, block 32, com.microsoft domain, built with
`onnx.helper`, one intra-op thread) computes the same product from the same codes re-laid `[n, k/32, 16]`
and its default zero point (its faster form: given explicit 4-bit zero points it measured slower here);
ours still loads and applies its f32 zero points.  Columns: medians of per-call CPU time of this
thread (`time.thread_time`, the steadier figure on a loaded host) and of wall time; `GB/s` and `of copy` — packed weight bytes
(codes and scales) per CPU second, against `np.copyto` of as many bytes timed in the same rounds;
GFLOP/s and `of sgemm` — against our own f32 Sgemm (IR tiles) on the same shape; `vs ort`, `vs numpy` —
their CPU time over ours (> 1: we are faster; NumPy is the reference's f32 decode + matmul).  Every
kernel (and ORT) is checked against the NumPy reference before it is timed; timings are interleaved
(each round calls every one once, the order rotating).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.pin_threads(1)

import numpy as np  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from rlx_llvm import reference  # noqa: E402
from rlx_llvm import thunks as T  # noqa: E402
from rlx_llvm.kernels.threads import set_num_threads  # noqa: E402
from rlx_llvm.reference import dequant as ref  # noqa: E402
from bench_gguf import compiled, slots  # noqa: E402  (the same arena helpers)
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

K = N = 4096
BLOCK = 32
Run = Callable[[], object]


def weights(kind: str, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict]:
    """Random packed weight buffers of `kind` (field → array) and the thunk's other fields."""
    nib = lambda planes: rng.integers(0, 256, planes * K * N // 2, dtype=np.uint8)
    f32 = lambda *shape: rng.uniform(0.01, 0.1, shape).astype(np.float32)
    if kind in ("Int8", "Int4"):
        codes = rng.integers(-128, 128, K * N).astype(np.int8) if kind == "Int8" else nib(1)
        zp = (rng.normal(8.0, 2.0, (K // BLOCK, N)) if kind == "Int8" else
              np.full((K // BLOCK, N), 8.0)).astype(np.float32)   # Int4: 8, MatMulNBits' default (as Q4_0)
        return {"w_q": codes, "scale": f32(K // BLOCK, N), "zp": zp}, dict(block_size=BLOCK, is_asymmetric=True)
    if kind.startswith("Fp8"):
        e5m2 = kind.endswith("e5m2")
        codes = (rng.integers(0, 0x7C if e5m2 else 0x78, K * N) | rng.integers(0, 2, K * N) << 7).astype(np.uint8)
        return {"w_q": codes, "scale": f32(N)}, dict(e5m2=e5m2)
    if kind == "Nvfp4":
        return {"w_q": nib(1), "scale": rng.integers(0x20, 0x48, (K // 16, N), dtype=np.uint8),
                "global_scale": np.array([0.37], np.float32)}, {}
    return {"w_q": nib(2), "scale": f32(2, K // BLOCK, N)}, dict(group=BLOCK)


KINDS = {"Int8": T.DequantMatMul, "Int4": T.DequantMatMulInt4, "Fp8-e4m3": T.DequantMatMulFp8,
         "Fp8-e5m2": T.DequantMatMulFp8, "Nvfp4": T.DequantMatMulNvfp4, "MxFp4x2": T.DequantMatMulMxFp4x2}


def dequant_row(kind: str, x: np.ndarray, rng: np.random.Generator) -> tuple[Run, Run, int, dict[str, Run]]:
    """(ours, NumPy's, packed weight bytes, peers) for `kind` at `x`, ours (and ORT's for Int4) checked
    against the reference."""
    m = x.shape[0]
    bufs, fields = weights(kind, rng)
    offs, size = slots(x.nbytes, *(b.nbytes for b in bufs.values()), 4 * m * N)
    at = dict(zip(["x", *bufs, "dst"], offs))
    thunk = KINDS[kind](**at, m=m, k=K, n=N, **fields)
    run, arena = compiled(thunk, size, {at["x"]: x, **{at[f]: b for f, b in bufs.items()}})
    want = arena.bytes.copy()
    run()
    reference.run(rl.ThunkSchedule([thunk], arena_bytes=size), want)
    got, exp = (a[at["dst"]:at["dst"] + 4 * m * N].view(np.float32) for a in (arena.bytes, want))
    w = np.abs(REF_WEIGHTS[kind](want, thunk)).astype(np.float64)
    tolerance = 1e-5 * (np.abs(x).astype(np.float64) @ w).reshape(-1) + 1e-6
    if not np.all(np.abs(got - exp) <= tolerance):
        sys.exit(f"{kind} m={m}: disagrees with the reference")
    peers = {"ort": ort_matmul_nbits(bufs, x)} if kind == "Int4" else {}
    for name, peer in peers.items():
        if not np.all(np.abs(peer().reshape(-1) - exp) <= tolerance):
            sys.exit(f"{name} {kind} m={m}: disagrees with the reference")
    numpy_path = lambda: x @ REF_WEIGHTS[kind](want, thunk)
    return run, numpy_path, sum(b.nbytes for b in bufs.values()), peers


def nibble_pairs(codes: np.ndarray) -> np.ndarray:
    """Consecutive codes two per byte, the even one low."""
    return (codes.reshape(-1)[0::2] | codes.reshape(-1)[1::2] << 4).astype(np.uint8)


def ort_matmul_nbits(bufs: dict[str, np.ndarray], x: np.ndarray) -> Run:
    """ONNX Runtime's MatMulNBits on the Int4 weights (codes `[k, n]` → `[n, k/32, 16]`, the default zero
    point 8), one thread; returns a call giving Y `[m, n]`."""
    m = x.shape[0]
    codes = np.stack([bufs["w_q"] & 15, bufs["w_q"] >> 4], axis=1).reshape(K, N)
    blob = nibble_pairs(np.ascontiguousarray(codes.T)).reshape(N, K // BLOCK, BLOCK // 2)
    assert np.all(bufs["zp"] == 8)
    node = helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], domain="com.microsoft",
                            K=K, N=N, bits=4, block_size=BLOCK)
    graph = helper.make_graph(
        [node], "matmul_nbits", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, N])],
        initializer=[numpy_helper.from_array(blob, "B"),
                     numpy_helper.from_array(np.ascontiguousarray(bufs["scale"].T).reshape(-1), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return lambda: session.run(None, {"A": x})[0]


REF_WEIGHTS = {
    "Int8": lambda a, t: ref.int_weights(a, t, ref.int8_codes(a, t)),
    "Int4": lambda a, t: ref.int_weights(a, t, ref.int4_codes(a, t)),
    "Fp8-e4m3": ref.fp8_weights, "Fp8-e5m2": ref.fp8_weights,
    "Nvfp4": ref.nvfp4_weights, "MxFp4x2": ref.mxfp4x2_weights,
}


def our_sgemm(x: np.ndarray, rng: np.random.Generator) -> Run:
    """Our f32 Sgemm (IR tiles) of x @ w, w `[k, n]`."""
    m = x.shape[0]
    b = rng.standard_normal((K, N)).astype(np.float32)
    (a_at, b_at, c_at), size = slots(x.nbytes, b.nbytes, 4 * m * N)
    run, _ = compiled(T.Sgemm(a=a_at, b=b_at, c=c_at, m=m, k=K, n=N), size, {a_at: x, b_at: b})
    return run


def timed(fns: dict[str, Run], rounds: int) -> dict[str, tuple[float, float]]:
    """(CPU, wall) medians in ms of each call, interleaved: each round calls every one once, the order
    rotating; CPU is this thread's time."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    names = list(fns)
    for fn in fns.values():
        fn()
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            wall, cpu = time.perf_counter(), time.thread_time()
            fns[name]()
            samples[name].append((time.thread_time() - cpu, time.perf_counter() - wall))
    return {name: tuple(1e3 * float(np.median(column)) for column in zip(*v)) for name, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ms", default="1,16,64")
    ap.add_argument("--kinds", default=",".join(KINDS))
    args = ap.parse_args()
    set_num_threads(1)
    common.limit_loaded_pools(1)
    rng = np.random.default_rng(0)
    print(f"# k = n = {K}, 1 thread — {common.cpu_model()} ({common.host_features()}), load {common.load_average()}")
    table = common.Table(["kind", "m", "cpu ms", "wall ms", "GB/s", "of copy", "wall of copy", "GFLOP/s",
                          "of sgemm", "vs ort", "vs numpy"], left=["kind"])
    for m in map(int, args.ms.split(",")):
        x = rng.standard_normal((m, K)).astype(np.float32)
        sgemm = our_sgemm(x, rng)
        for kind in args.kinds.split(","):
            run, numpy_path, wbytes, peers = dequant_row(kind, x, rng)
            src, dst = np.ones(wbytes, np.uint8), np.empty(wbytes, np.uint8)
            fns = {"rlx": run, "numpy": numpy_path, "copy": lambda: np.copyto(dst, src), "sgemm": sgemm, **peers}
            ms = timed(fns, args.rounds)
            (cpu, wall), flops = ms["rlx"], 2 * m * N * K
            table.add(kind, m, f"{cpu:.3f}", f"{wall:.3f}", f"{common.gbps(wbytes, cpu):.2f}",
                      f"{100 * ms['copy'][0] / cpu:.0f}%", f"{100 * ms['copy'][1] / wall:.0f}%",
                      f"{flops / cpu / 1e6:.1f}", f"{100 * ms['sgemm'][0] / cpu:.0f}%",
                      f"{ms['ort'][0] / cpu:.2f}×" if "ort" in ms else "-", f"{ms['numpy'][0] / cpu:.1f}×")
            print("  ".join(table.rows[-1]), file=sys.stderr)
    print(table)


if __name__ == "__main__":
    main()
