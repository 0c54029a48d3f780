"""Streaming kernels at one and two threads: rlx-llvm against ONNX Runtime, in the same run.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_elementwise_threads.py [--rounds 15] [kernel ...]

Kernels over 16M elements: gelu_tanh(x + bias) (an ElementwiseRegion, bias [4096] tiled), an f32
add (BinaryFull), the casts f32 → f16, f16 → f32, f32 → bf16, and a Copy; and softmax(x) → y over
[8192, 1024] into another buffer (x kept): our schedule is RLX's `Copy` then the in-place `Softmax`,
which `ir_emit.peephole` runs as one out-of-place pass.  The last lines give gelu's 1-thread time as
a fraction of the copy bandwidth (copy ms / gelu ms: both move 2 × 64 MiB).  Both libraries run
interleaved, round by round, at 1 and 2 threads (ORT without spinning workers); printed per column
are the wall medians and the calling thread's CPU time per call (`time.thread_time`): on a loaded
host the wall times mostly measure the neighbours, the caller's CPU time shows how the work split.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402

N, COLS = 1 << 24, 4096
SOFTMAX = (8192, 1024)
KERNELS = ("gelu", "add", "f16", "f16to32", "bf16", "copy", "softmax")


def build(kernels):
    """The arena, one rlx program per kernel and one ONNX model (with its bound buffers) per kernel."""
    import rlx_llvm as rl
    from onnx import TensorProto as TP, helper
    from rlx_llvm import thunks as T
    from rlx_llvm.ops import Activation, BinaryOp, ChainOperand as In, ChainStep as S

    top = [0]

    def slot(nbytes: int) -> int:
        off = top[0]
        top[0] += -(-nbytes // 4096) * 4096
        return off

    X, Y, B, O, H = slot(4 * N), slot(4 * N), slot(4 * COLS), slot(4 * N), slot(2 * N)
    arena = rl.Arena(top[0])
    x = np.random.default_rng(0).standard_normal(N, dtype=np.float32)
    arena.write(X, x)
    arena.write(Y, x[::-1].copy())
    arena.write(B, x[:COLS].copy())
    arena.write(H, x.astype(np.float16))
    xv, yv = arena.view(X, "f32", N), arena.view(Y, "f32", N)
    bv, hv = arena.view(B, "f32", COLS), arena.view(H, "f16", N)
    thunks = {
        "gelu": T.ElementwiseRegion(dst=O, len=N, input_offs=(X, B), input_modulus=(0, COLS),
                                    chain=(S.Binary(BinaryOp.Add, In.Input(0), In.Input(1)),
                                           S.Activation(Activation.Gelu, In.Step(0)))),
        "add": T.BinaryFull(dst=O, lhs=X, rhs=Y, len=N, lhs_len=N, rhs_len=N, op=BinaryOp.Add, out_dims_bcast=(),
                            bcast_lhs_strides=(), bcast_rhs_strides=(), elem_bytes=4),
        "f16": T.CastF32ToF16(src=X, dst=H, len=N),
        "f16to32": T.CastF16ToF32(src=H, dst=O, len=N),
        "bf16": T.CastF32ToBf16(src=X, dst=H, len=N),
        "copy": T.Copy(src=X, dst=O, len=N),
        "softmax": [T.Copy(src=X, dst=O, len=SOFTMAX[0] * SOFTMAX[1]),
                    T.Softmax(data=O, rows=SOFTMAX[0], cols=SOFTMAX[1], inner=1)],
    }
    V = helper.make_tensor_value_info
    rows = [N // COLS, COLS]
    one = lambda op, src_t, dst_t, **kw: ([helper.make_node(op, ["X"], ["Y"], **kw)],  # noqa: E731
                                          [V("X", src_t, [N])], [V("Y", dst_t, [N])])
    onnx = {
        "gelu": ([helper.make_node("Add", ["X", "B"], ["h"]), helper.make_node("Gelu", ["h"], ["Y"], approximate="tanh")],
                 [V("X", TP.FLOAT, rows), V("B", TP.FLOAT, [COLS])], [V("Y", TP.FLOAT, rows)],
                 {"X": xv.reshape(rows), "B": bv}, (np.empty(rows, np.float32), None)),
        "add": ([helper.make_node("Add", ["X", "Z"], ["Y"])], [V("X", TP.FLOAT, [N]), V("Z", TP.FLOAT, [N])],
                [V("Y", TP.FLOAT, [N])], {"X": xv, "Z": yv}, (np.empty(N, np.float32), None)),
        "f16": (*one("Cast", TP.FLOAT, TP.FLOAT16, to=TP.FLOAT16), {"X": xv}, (np.empty(N, np.float16), None)),
        "f16to32": (*one("Cast", TP.FLOAT16, TP.FLOAT, to=TP.FLOAT), {"X": hv}, (np.empty(N, np.float32), None)),
        "bf16": (*one("Cast", TP.FLOAT, TP.BFLOAT16, to=TP.BFLOAT16), {"X": xv},
                 (np.empty(N, np.uint16), TP.BFLOAT16)),
        "copy": (*one("Identity", TP.FLOAT, TP.FLOAT), {"X": xv}, (np.empty(N, np.float32), None)),
        "softmax": ([helper.make_node("Softmax", ["X"], ["Y"], axis=-1)], [V("X", TP.FLOAT, list(SOFTMAX))],
                    [V("Y", TP.FLOAT, list(SOFTMAX))], {"X": xv[:SOFTMAX[0] * SOFTMAX[1]].reshape(SOFTMAX)},
                    (np.empty(SOFTMAX, np.float32), None)),
    }
    progs = {k: rl.compile(rl.ThunkSchedule(thunks[k] if isinstance(thunks[k], list) else [thunks[k]],
                                            arena_bytes=arena.nbytes)) for k in kernels}
    models = {k: (helper.make_model(helper.make_graph(onnx[k][0], k, *onnx[k][1:3]),
                                    opset_imports=[helper.make_opsetid("", 20)]), *onnx[k][3:]) for k in kernels}
    return arena, progs, models


def ort_runner(model, inputs: dict, output, threads: int):
    """A zero-copy IOBinding run of `model` with `threads` intra-op threads (no spinning)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    io, keep = sess.io_binding(), []
    for name, arr in inputs.items():
        keep.append(ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr)))
        io.bind_ortvalue_input(name, keep[-1])
    arr, onnx_type = output
    keep.append(ort.OrtValue.ortvalue_from_numpy(arr) if onnx_type is None
                else ort.OrtValue.ortvalue_from_numpy_with_onnx_type(arr, onnx_type))
    io.bind_ortvalue_output("Y", keep[-1])

    def run():
        sess.run_with_iobinding(io)
    run.keep = keep
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernels", nargs="*", choices=[*KERNELS, []], help="default: all")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    args.kernels = args.kernels or list(KERNELS)
    import rlx_llvm as rl
    arena, progs, models = build(args.kernels)
    print(f"CPU {common.cpu_model()} ({common.cpu_name()}), {common.cores()}, load {common.load_average()}")
    print("ms per call, medians of interleaved rounds; cpu = the calling thread's CPU time")
    head = f"{'kernel':9s} {'rlx 1T':>8s} {'rlx 2T':>8s} {'1T/2T':>6s} {'ORT 1T':>8s} {'ORT 2T':>8s} " \
           f"{'cpu 1T':>7s} {'cpu 2T':>7s} {'ORTcpu1':>7s} {'ORTcpu2':>7s}"
    print(head)
    one_thread = {}
    for k in args.kernels:
        model, inputs, output = models[k]
        runs = {("rlx", t): (t, lambda p=progs[k]: p.run(arena)) for t in (1, 2)}
        runs.update({("ort", t): (t, ort_runner(model, inputs, output, t)) for t in (1, 2)})
        wall = {key: [] for key in runs}
        cpu = {key: [] for key in runs}
        for r in range(args.rounds + 1):
            for key, (threads, fn) in runs.items():
                rl.set_num_threads(threads)
                c0, t0 = time.thread_time(), time.perf_counter()
                fn()
                t1, c1 = time.perf_counter(), time.thread_time()
                if r:  # round 0 warms up
                    wall[key].append((t1 - t0) * 1e3)
                    cpu[key].append((c1 - c0) * 1e3)
                time.sleep(0.02)  # no worker of one library still spinning while the other runs
        w = {key: statistics.median(v) for key, v in wall.items()}
        c = {key: statistics.median(v) for key, v in cpu.items()}
        one_thread[k] = (w["rlx", 1], c["rlx", 1])
        print(f"{k:9s} {w['rlx', 1]:8.2f} {w['rlx', 2]:8.2f} {w['rlx', 1] / w['rlx', 2]:6.2f} {w['ort', 1]:8.2f} "
              f"{w['ort', 2]:8.2f} {c['rlx', 1]:7.2f} {c['rlx', 2]:7.2f} {c['ort', 1]:7.2f} {c['ort', 2]:7.2f}",
              flush=True)
    if "gelu" in one_thread and "copy" in one_thread:
        (gw, gc), (cw, cc) = one_thread["gelu"], one_thread["copy"]
        print(f"gelu at 1 thread: {100 * cw / gw:.0f} % of the copy bandwidth (wall), {100 * cc / gc:.0f} % (cpu)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
