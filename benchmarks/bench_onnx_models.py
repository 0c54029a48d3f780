"""Real ONNX models shipped in PyPI packages, ours (rl.onnx.OnnxModel) against ONNX Runtime, at 1 and 2 threads.

silero-vad streams 512-sample 16 kHz chunks carrying its state (batch 1, and 8 streams at once);
paraphrase-MiniLM-L3-v2 encodes batch 1 × 16 and × 128 tokens and batch 8 × 128. ORT runs sequential
execution with intra_op_num_threads = ours' thread count. Interleaved rounds; medians of wall time and of
process CPU time, and the median per-round ratio ours ÷ ORT (below 1: we are faster). One untimed call precedes
each timed one, so the other runtime's spinning workers have gone idle.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_onnx_models.py [--threads 1,2] [--rounds 30] [--profile]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from rlx_llvm.onnx.ops_models import packaged_model, specialize  # noqa: E402


def ort_session(proto, threads: int):
    """ONNX Runtime, CPU, sequential execution, `threads` intra-op threads."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def vad_cases():
    """(label, proto, feeds-maker) for silero-vad: one stream and eight streams of 512-sample chunks."""
    path = packaged_model("silero-vad")
    if path is None:
        return []
    proto = specialize(path, {"sr": np.array(16000, np.int64)})
    rng = np.random.default_rng(0)
    return [(f"silero-vad stream ×{b}", proto,
             {"input": (0.1 * rng.standard_normal((b, 512))).astype(np.float32),
              "state": np.zeros((2, b, 128), np.float32)}) for b in (1, 8)]


def encoder_cases():
    """(label, proto, feeds) for paraphrase-MiniLM-L3-v2 at batch × tokens."""
    import onnx
    path = packaged_model("paraphrase-minilm-l3")
    if path is None:
        return []
    proto = onnx.load(path)
    rng = np.random.default_rng(0)
    out = []
    for b, s in ((1, 16), (1, 128), (8, 128)):
        ids = rng.integers(1000, 20000, (b, s)).astype(np.int64)
        out.append((f"MiniLM-L3 {b}×{s}", proto, {"input_ids": ids, "attention_mask": np.ones_like(ids)}))
    return out


def streamer(run, feeds: dict, state_out: int):
    """A call that runs one chunk and carries the state output into the next call's feed (VAD streaming)."""
    feeds = dict(feeds)

    def call():
        feeds["state"] = run(feeds)[state_out]
    return call


def timed(fn, cpu: list):
    """`fn`, also recording each call's process CPU time (ms) in `cpu`."""
    def call():
        t = time.process_time()
        fn()
        cpu.append((time.process_time() - t) * 1e3)
    return call


def bench(label: str, proto, feeds: dict, threads: int, rounds: int, table) -> None:
    rl.set_num_threads(threads)
    ours = rl.onnx.OnnxModel(proto)
    theirs = ort_session(proto, threads)
    ours.run(feeds)                                  # compile outside the timing
    if "state" in feeds:
        ours_fn = streamer(ours.run, feeds, 1)
        ort_fn = streamer(lambda f: theirs.run(None, f), feeds, 1)
    else:
        ours_fn, ort_fn = (lambda: ours.run(feeds)), (lambda: theirs.run(None, feeds))
    cpu = {"ours": [], "ort": []}
    t = common.interleaved({"ours": timed(ours_fn, cpu["ours"]), "ort": timed(ort_fn, cpu["ort"])},
                           rounds=rounds, warmup=3, settle=1)
    med = lambda xs: float(np.median(xs[-t["ours"].n:]))  # noqa: E731 - the timed rounds only
    table.add(label, threads, common.fmt_ms(t["ours"].median), common.fmt_ms(t["ort"].median),
              f"{common.paired_ratio(t['ours'], t['ort']):.2f}",
              common.fmt_ms(med(cpu["ours"])), common.fmt_ms(med(cpu["ort"])))


def profile(label: str, proto, feeds: dict) -> None:
    """Where our time goes: the compiled program's report (per-thunk figures where the program keeps them)."""
    cg = rl.onnx.OnnxModel(proto).compiled({k: v.shape for k, v in feeds.items()})
    print(f"\n## {label}")
    print(cg.report() if hasattr(cg, "report") else "(no report)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    import onnxruntime as ort
    print(f"# {common.cpu_model()} ({common.cpu_name()}), cores {common.cores()}, load {common.load_average()}")
    print(f"# onnxruntime {ort.__version__}; {common.python_facts()}")
    cases = vad_cases() + encoder_cases()
    if not cases:
        sys.exit("install the models: pip install '.[models]' && pip install --no-deps silero-vad==6.2.3")
    table = common.Table(["model", "threads", "ours ms", "ORT ms", "ours ÷ ORT", "ours CPU ms", "ORT CPU ms"],
                         left=["model"])
    for threads in map(int, args.threads.split(",")):
        for label, proto, feeds in cases:
            bench(label, proto, feeds, threads, args.rounds, table)
        table.rule()
    table.note("wall medians of interleaved rounds; ÷ is the median per-round ratio; CPU = process CPU time")
    print(table)
    if args.profile:
        for label, proto, feeds in cases:
            profile(label, proto, feeds)


if __name__ == "__main__":
    main()
