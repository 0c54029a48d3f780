"""Lstm / Gru thunks next to torch eager, ONNX Runtime and the NumPy reference, one thread.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_recurrent.py [--rounds 9] [--seq 128] [--all]

Shapes (issue 12): seq 128, input 256, hidden 256, 2 layers, bidirectional, batch 1 and 16 (with `--all`
also the one-layer, one-direction batch-1 cases and the NumPy reference).  The weights are torch's random init; the rlx thunk gets them
packed per (layer, direction) (same gate order as torch), ONNX Runtime gets one LSTM/GRU node per layer
(gates reordered to ONNX's i,o,f,c / z,r,h; GRU with linear_before_reset=1), time-major input.
Every implementation's output is checked against torch's before timing.  Optional: torch,
onnxruntime (rows skipped when missing).  Times are medians of interleaved rounds, wall and the
calling thread's CPU time (`time.thread_time`), with each implementation's ratio to rlx (> 1: slower
than rlx); a last table says, per case, whether rlx beats torch eager and ONNX Runtime (issue 12's bar).
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
from rlx_llvm import reference  # noqa: E402
from rlx_llvm import thunks as T  # noqa: E402
from rlx_llvm.kernels.threads import set_num_threads  # noqa: E402
from bench_gemm import _slots as slots  # noqa: E402
from bench_qgemm import cpu_timed  # noqa: E402  (per-call CPU time of the calling thread)

ONNX_ORDER = {"lstm": (0, 3, 1, 2), "gru": (1, 0, 2)}  # our (torch's) gate blocks in ONNX's order


def torch_net(cell: str, n_in: int, hidden: int, layers: int, bidir: bool):
    """A float32 torch module with its default random init."""
    import torch
    torch.manual_seed(0)
    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell]
    return cls(n_in, hidden, layers, batch_first=True, bidirectional=bidir).eval()


def packed_weights(net, cell: str, layers: int, dirs: int) -> dict[str, np.ndarray]:
    """torch's parameters in the thunk's packing: layer-major, then direction."""
    p = {k: v.detach().numpy() for k, v in net.named_parameters()}
    keys = [f"l{layer}" + ("_reverse" if d else "") for layer in range(layers) for d in range(dirs)]
    cat = lambda name: np.concatenate([p[f"{name}_{k}"].reshape(-1) for k in keys])  # noqa: E731
    out = dict(w_ih=cat("weight_ih"), w_hh=cat("weight_hh"))
    if cell == "gru":
        out |= dict(b_ih=cat("bias_ih"), b_hh=cat("bias_hh"))
    else:
        out["bias"] = cat("bias_ih") + cat("bias_hh")
    return out


def rlx_run(cell: str, x: np.ndarray, hidden: int, layers: int, bidir: bool, weights: dict[str, np.ndarray]):
    """(run, output, reference run) of one compiled thunk."""
    b, s, n_in = x.shape
    dirs = 2 if bidir else 1
    names = ["x", *weights, "dst"]
    sizes = [x.nbytes, *(w.nbytes for w in weights.values()), 4 * b * s * dirs * hidden]
    offs, size = slots(*sizes)
    at = dict(zip(names, offs))
    kind = {"lstm": T.Lstm, "gru": T.Gru}[cell]
    extra = dict(c0=0) if cell == "lstm" else {}
    t = kind(**at, h0=0, **extra, batch=b, seq=s, input_size=n_in, hidden=hidden, num_layers=layers,
             bidirectional=bidir, carry=False)
    schedule = rl.ThunkSchedule([t], arena_bytes=size)
    arena = rl.Arena(size)
    arena.write(at["x"], x)
    for name, w in weights.items():
        arena.write(at[name], w)
    prog = rl.compile(schedule)
    prog.run(arena)
    want = rl.Arena.from_bytes(arena.bytes)
    return (lambda: prog.run(arena), arena.read(at["dst"], np.float32, (b, s, dirs * hidden)),
            lambda: reference.run(schedule, want))


def ort_run(cell: str, net, x: np.ndarray, hidden: int, layers: int, bidir: bool):
    """(run, output) of an ONNX Runtime session: one LSTM/GRU node per layer, time-major."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    dirs = 2 if bidir else 1
    p = {k: v.detach().numpy() for k, v in net.named_parameters()}
    reorder = lambda m: np.concatenate([np.split(m, len(ONNX_ORDER[cell]))[i] for i in ONNX_ORDER[cell]])  # noqa: E731
    nodes, inits, prev = [], [], "X"
    for layer in range(layers):
        keys = [f"l{layer}" + ("_reverse" if d else "") for d in range(dirs)]
        stack = lambda name: np.stack([reorder(p[f"{name}_{k}"]) for k in keys])  # noqa: E731
        w, r = f"W{layer}", f"R{layer}"
        bias = np.concatenate([stack("bias_ih"), stack("bias_hh")], axis=1)
        inits += [numpy_helper.from_array(a, n) for a, n in ((stack("weight_ih"), w), (stack("weight_hh"), r),
                                                             (bias, f"B{layer}"))]
        attrs = dict(hidden_size=hidden, direction="bidirectional" if bidir else "forward")
        if cell == "gru":
            attrs["linear_before_reset"] = 1
        nodes.append(helper.make_node(cell.upper(), [prev, w, r, f"B{layer}"], [f"Y{layer}"], **attrs))
        nodes.append(helper.make_node("Transpose", [f"Y{layer}"], [f"T{layer}"], perm=[0, 2, 1, 3]))
        inits.append(numpy_helper.from_array(np.array([0, 0, dirs * hidden], np.int64), f"S{layer}"))
        nodes.append(helper.make_node("Reshape", [f"T{layer}", f"S{layer}"], [f"L{layer}"]))
        prev = f"L{layer}"
    graph = helper.make_graph(nodes, "rnn", [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)], inits)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                                .SerializeToString(), opts, providers=["CPUExecutionProvider"])
    xt = np.ascontiguousarray(x.transpose(1, 0, 2))
    run = lambda: sess.run(None, {"X": xt})  # noqa: E731
    return run, run()[0].transpose(1, 0, 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--all", action="store_true", help="also 1 layer × 1 direction and the NumPy reference")
    args = ap.parse_args()
    set_num_threads(1)
    import torch
    torch.set_num_threads(1)
    table = common.Table(["cell", "batch", "layers×dirs", "impl", "ms", "× rlx", "cpu ms", "cpu × rlx",
                          "max |Δ| vs torch"], left=["impl"],
                         title=f"seq {args.seq}, input 256, hidden 256, one thread — {common.cpu_name()}")
    configs = [(cell, b, 2, True) for cell in ("lstm", "gru") for b in (1, 16)] + \
              ([(cell, 1, 1, False) for cell in ("lstm", "gru")] if args.all else [])
    bar = common.Table(["cell", "batch", "layers×dirs", "cpu × rlx: torch", "onnxruntime", "wall × rlx: torch",
                        "onnxruntime", "rlx fastest"], title="issue 12's bar: rlx faster than both (CPU and wall)")
    for cell, batch, layers, bidir in configs:
        net = torch_net(cell, 256, 256, layers, bidir)
        x = np.random.default_rng(1).standard_normal((batch, args.seq, 256)).astype(np.float32)
        with torch.no_grad():
            want = net(torch.from_numpy(x))[0].numpy()
        rlx, got, ref = rlx_run(cell, x, 256, layers, bidir, packed_weights(net, cell, layers, 2 if bidir else 1))
        xt = torch.from_numpy(x)
        fns = {"rlx": rlx, "torch eager": lambda: net(xt)}
        diffs = {"rlx": np.abs(got - want).max(), "torch eager": 0.0}
        try:
            fns["onnxruntime"], out = ort_run(cell, net, x, 256, layers, bidir)
            diffs["onnxruntime"] = np.abs(out - want).max()
        except ImportError:
            table.note("onnxruntime not installed: its rows are skipped")
        if batch == 1 and args.all:
            fns["numpy reference (f64)"] = ref
        cpu = {name: common.Timing() for name in fns}
        with torch.no_grad():
            times = common.interleaved({name: cpu_timed(fn, cpu[name].samples) for name, fn in fns.items()},
                                       rounds=args.rounds if batch == 1 else max(3, args.rounds // 2), warmup=1)
        cpu_ratio, wall_ratio = {}, {}
        for name, timing in times.items():
            del cpu[name].samples[:1]
            wall_ratio[name] = common.paired_ratio(timing, times["rlx"])
            cpu_ratio[name] = cpu[name].median / cpu["rlx"].median
            table.add(cell, batch, f"{layers}×{2 if bidir else 1}", name, common.fmt_ms(timing.median),
                      f"{wall_ratio[name]:.2f}", common.fmt_ms(cpu[name].median), f"{cpu_ratio[name]:.2f}",
                      f"{diffs[name]:.1e}" if name in diffs else "")
        table.rule()
        others = [n for n in ("torch eager", "onnxruntime") if n in times]
        bar.add(cell, batch, f"{layers}×{2 if bidir else 1}",
                *(f"{cpu_ratio[n]:.2f}" if n in cpu_ratio else "–" for n in ("torch eager", "onnxruntime")),
                *(f"{wall_ratio[n]:.2f}" if n in wall_ratio else "–" for n in ("torch eager", "onnxruntime")),
                "yes" if all(min(cpu_ratio[n], wall_ratio[n]) > 1 for n in others) else "no")
    table.note(f"load average {common.load_average()}; × rlx = median of per-round wall-time ratios; "
               "cpu = the calling thread's CPU time per call (steadier on a loaded machine)")
    print(table)
    print()
    print(bar)


if __name__ == "__main__":
    main()
