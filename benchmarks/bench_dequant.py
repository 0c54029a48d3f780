"""The `[k, n]` dequantizing GEMMs at one thread, one run, one table: DequantMatMul (Int8Block),
DequantMatMulInt4, DequantMatMulFp8 (E4M3, E5M2), DequantMatMulNvfp4 and DequantMatMulMxFp4x2.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_dequant.py [--rounds 7] [--ms 1,64]

Weights k = n = 4096 (int blocks and MxFp4x2 groups of 32), x `[m, k]` f32.  Columns: median ms; `GB/s`
and `of copy` — packed weight bytes (codes and scales) per second, against `np.copyto` of as many bytes
timed in the same rounds; GFLOP/s and `of sgemm` — against our own f32 Sgemm (IR tiles) on the same
shape; `vs numpy` — NumPy (the reference's f32 decode + matmul) over ours.  Every kernel is checked
against the NumPy reference before it is timed; timings are interleaved and medians reported.
"""
from __future__ import annotations

import argparse
import os
import sys
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

K = N = 4096
BLOCK = 32
Run = Callable[[], object]


def weights(kind: str, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict]:
    """Random packed weight buffers of `kind` (field → array) and the thunk's other fields."""
    nib = lambda planes: rng.integers(0, 256, planes * K * N // 2, dtype=np.uint8)
    f32 = lambda *shape: rng.uniform(0.01, 0.1, shape).astype(np.float32)
    if kind in ("Int8", "Int4"):
        codes = rng.integers(-128, 128, K * N).astype(np.int8) if kind == "Int8" else nib(1)
        zp = rng.normal(8.0, 2.0, (K // BLOCK, N)).astype(np.float32)
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


def dequant_row(kind: str, x: np.ndarray, rng: np.random.Generator) -> tuple[Run, Run, int]:
    """(ours, NumPy's, packed weight bytes) for `kind` at `x`, ours checked against the reference."""
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
    if not np.all(np.abs(got - exp) <= 1e-5 * (np.abs(x).astype(np.float64) @ w).reshape(-1) + 1e-6):
        sys.exit(f"{kind} m={m}: disagrees with the reference")
    numpy_path = lambda: x @ REF_WEIGHTS[kind](want, thunk)
    return run, numpy_path, sum(b.nbytes for b in bufs.values())


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ms", default="1,64")
    ap.add_argument("--kinds", default=",".join(KINDS))
    args = ap.parse_args()
    set_num_threads(1)
    common.limit_loaded_pools(1)
    rng = np.random.default_rng(0)
    print(f"# k = n = {K}, 1 thread — {common.cpu_model()} ({common.host_features()}), load {common.load_average()}")
    head = ["kind", "m", "ms", "GB/s", "of copy", "GFLOP/s", "of sgemm", "numpy ms", "vs numpy"]
    lines = []
    for m in map(int, args.ms.split(",")):
        x = rng.standard_normal((m, K)).astype(np.float32)
        sgemm = our_sgemm(x, rng)
        for kind in args.kinds.split(","):
            run, numpy_path, wbytes = dequant_row(kind, x, rng)
            src, dst = np.ones(wbytes, np.uint8), np.empty(wbytes, np.uint8)
            fns = {"rlx": run, "numpy": numpy_path, "copy": lambda: np.copyto(dst, src), "sgemm": sgemm}
            ms = {name: t.median for name, t in common.interleaved(fns, rounds=args.rounds).items()}
            rlx, flops = ms["rlx"], 2 * m * N * K
            lines.append([kind, str(m), f"{rlx:.3f}", f"{common.gbps(wbytes, rlx):.2f}",
                          f"{100 * ms['copy'] / rlx:.0f}%", f"{flops / rlx / 1e6:.1f}",
                          f"{100 * ms['sgemm'] / rlx:.0f}%", f"{ms['numpy']:.1f}", f"{ms['numpy'] / rlx:.1f}×"])
            print("  ".join(lines[-1]), file=sys.stderr)
    widths = [max(len(r[i]) for r in [head, *lines]) for i in range(len(head))]
    for r in [head, *lines]:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths)))


if __name__ == "__main__":
    main()
