"""QMatMul 512³ (int8, i32 accumulation, requantized) next to our f32 Sgemm and ONNX Runtime's int8 ops.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_qgemm.py [--size 512] [--rounds 21]

One thread everywhere (thread variables pinned before NumPy loads; `set_num_threads(1)`; ONNX
Runtime sessions with one intra-/inter-op thread). Implementations, timed interleaved in rounds:

* `rlx QMatMul` — one `QMatMul` thunk (`prog.run(arena)`), checked byte-exact against the NumPy reference;
* `rlx Sgemm f32` — one `Sgemm` thunk on the same shape (our f32 GEMM: IR tiles or BLAS, as compiled);
* `ORT QLinearMatMul` / `ORT MatMulInteger` — one-node models built with `onnx.helper` (int8 × int8;
  MatMulInteger stops at the int32 sums, QLinearMatMul requantizes like QMatMul).

Rates are 2·m·k·n operations per second (GOP/s for the integer kernels, GFLOP/s for Sgemm), from
the wall-clock median. On a shared machine a run is often descheduled mid-call, so each call's
CPU time (`time.thread_time`: everything runs on the calling thread at one thread) is recorded too
and its median shown beside: the ratios by CPU time are the steadier figure under load.
ONNX Runtime is optional (`pip install onnxruntime`); when missing, its rows are skipped with a note.
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
from bench_gemm import _slots as slots  # noqa: E402  (64-byte-aligned buffer offsets)

SCALES = (0.02, 0.013, 0.37)   # x, w, y scales
ZPS = (3, -2, 1)               # x, w, y zero points


def rlx_qmatmul(x: np.ndarray, w: np.ndarray, mult: float):
    """(run, output) of a compiled QMatMul over x, w (zero bias)."""
    m, k = x.shape
    n = w.shape[1]
    (ox, ow, ob, oo), size = slots(m * k, k * n, 4 * n, m * n)
    t = T.QMatMul(x=ox, w=ow, bias=ob, out=oo, m=m, k=k, n=n, x_zp=ZPS[0], w_zp=ZPS[1], out_zp=ZPS[2], mult=mult)
    schedule = rl.ThunkSchedule([t], arena_bytes=size)
    arena = rl.Arena(size)
    arena.write(ox, x)
    arena.write(ow, w)
    arena.write(ob, np.zeros(n, np.int32))
    want = rl.Arena.from_bytes(arena.bytes)
    reference.run(schedule, want)
    prog = rl.compile(schedule)
    prog.run(arena)
    got, expect = arena.read(oo, np.int8, (m, n)), want.read(oo, np.int8, (m, n))
    assert np.array_equal(got, expect), "QMatMul differs from the reference"
    return lambda: prog.run(arena), got


def rlx_sgemm(m: int, k: int, n: int, rng: np.random.Generator):
    """A compiled f32 Sgemm of the same shape."""
    (oa, ob, oc), size = slots(4 * m * k, 4 * k * n, 4 * m * n)
    prog = rl.compile(rl.ThunkSchedule([T.Sgemm(a=oa, b=ob, c=oc, m=m, k=k, n=n)], arena_bytes=size))
    arena = rl.Arena(size)
    arena.write(oa, rng.standard_normal((m, k)).astype(np.float32))
    arena.write(ob, rng.standard_normal((k, n)).astype(np.float32))
    return lambda: prog.run(arena)


def ort_sessions(x: np.ndarray, w: np.ndarray) -> "tuple[dict, list[str]]":
    """{name: run} of ONNX Runtime's QLinearMatMul and MatMulInteger on x, w, and notes."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError as exc:
        return {}, [f"ONNX Runtime skipped: {exc}"]
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    scalars = {"xs": np.float32(SCALES[0]), "xz": np.int8(ZPS[0]), "ws": np.float32(SCALES[1]),
               "wz": np.int8(ZPS[1]), "ys": np.float32(SCALES[2]), "yz": np.int8(ZPS[2])}

    def session(op: str, inputs: list[str], out_type: int):
        feeds = {"x": x, "w": w, **{k: v for k, v in scalars.items() if k in inputs}}
        graph = helper.make_graph(
            [helper.make_node(op, inputs, ["y"])], op,
            [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.asarray(feeds[name]).dtype),
                                           np.shape(feeds[name])) for name in inputs],
            [helper.make_tensor_value_info("y", out_type, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        feeds = {k: np.asarray(v) for k, v in feeds.items()}
        return lambda: sess.run(None, feeds)

    runs = {"ORT QLinearMatMul": session("QLinearMatMul", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"],
                                         TensorProto.INT8),
            "ORT MatMulInteger": session("MatMulInteger", ["x", "w", "xz", "wz"], TensorProto.INT32)}
    return runs, [f"onnxruntime {ort.__version__}"]


def cpu_timed(fn: Callable[[], object], samples: list[float]) -> Callable[[], None]:
    """`fn`, appending each call's CPU time of this thread (ms) to `samples`."""
    def run() -> None:
        start = time.thread_time()
        fn()
        samples.append((time.thread_time() - start) * 1e3)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=21)
    args = ap.parse_args()
    set_num_threads(1)
    common.limit_loaded_pools(1)
    m = k = n = args.size
    rng = np.random.default_rng(0)
    x, w = (rng.integers(-128, 128, shape).astype(np.int8) for shape in ((m, k), (k, n)))
    mult = float(np.float32(SCALES[0]) * np.float32(SCALES[1]) / np.float32(SCALES[2]))
    run_q, _ = rlx_qmatmul(x, w, mult)
    fns = {"rlx QMatMul": run_q, "rlx Sgemm f32": rlx_sgemm(m, k, n, rng)}
    ort_runs, notes = ort_sessions(x, w)
    fns |= ort_runs
    cpu = {name: common.Timing() for name in fns}
    warmup = 2
    timings = common.interleaved({name: cpu_timed(fn, cpu[name].samples) for name, fn in fns.items()},
                                 rounds=args.rounds, warmup=warmup)
    for t in cpu.values():
        del t.samples[:warmup]
    ops = 2 * m * k * n
    table = common.Table(["implementation", "median", "p10", "G op/s", "vs rlx Sgemm", "cpu median", "cpu vs Sgemm"],
                         left=["implementation"], title=f"{m}×{k}×{n}, one thread — {common.cpu_name()}")
    base, cpu_base = timings["rlx Sgemm f32"].median, cpu["rlx Sgemm f32"].median
    for name, t in timings.items():
        table.add(name, common.fmt_ms(t.median), common.fmt_ms(t.p10), f"{ops / t.median / 1e6:.1f}",
                  f"{base / t.median:.2f}×", common.fmt_ms(cpu[name].median), f"{cpu_base / cpu[name].median:.2f}×")
    for note in notes + [f"load average {common.load_average()}"]:
        table.note(note)
    print(table)


if __name__ == "__main__":
    main()
