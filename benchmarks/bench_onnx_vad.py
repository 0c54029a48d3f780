"""silero-vad (the silero-vad 6.2.3 wheel's silero_vad/data/silero_vad.onnx), ours (rl.onnx.OnnxModel) against ONNX
Runtime at 1 and 2 threads: streaming 512-sample 16 kHz chunks with the LSTM state carried from chunk to chunk —
one stream (the real use) and several streams batched in one call.

Each timed sample streams `--chunks` consecutive chunks (32 ms of audio each) through one runtime; rounds
interleave the runtimes (alternating order; before each timed block an untimed one and a 50 ms pause, so ORT's
spinning workers have gone idle and are not billed to us).  Reported per chunk: the median wall time, the median
process CPU time (every thread), and the medians of the per-round ratios ours ÷ ORT (below 1: we are faster).  ORT runs sequential execution with
intra_op_num_threads = ours' thread count.  `--profile` prints where our time goes, per thunk (each thunk compiled
alone and run on the model's arena: the figures include ~2 µs of call overhead each).

    cd /work/main && PYTHONPATH=. python benchmarks/bench_onnx_vad.py [--threads 1,2] [--streams 1,8] [--rounds 30]
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from bench_onnx_models import ort_session  # noqa: E402

import numpy as np  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from rlx_llvm.onnx.ops_models import packaged_model, specialize  # noqa: E402


def audio(streams: int, chunks: int) -> np.ndarray:
    """`[chunks, streams, 512]` float32 chunks: noise with a voiced stretch (so the state carries information)."""
    rng = np.random.default_rng(0)
    t = np.arange(chunks * 512) / 16000
    voiced = np.sin(2 * np.pi * 200 * t) * (np.abs(t - t[-1] / 2) < t[-1] / 4)
    x = 0.3 * voiced + 0.02 * rng.standard_normal((streams, t.size))
    return np.ascontiguousarray(x.reshape(streams, chunks, 512).transpose(1, 0, 2), np.float32)


def streamer(run, chunks: np.ndarray):
    """A block that streams every chunk through `run(feeds) → (prob, state)`, carrying the state."""
    zero = np.zeros((2, chunks.shape[1], 128), np.float32)

    def block():
        state = zero
        for chunk in chunks:
            _, state = run({"input": chunk, "state": state})
    return block


def per_chunk(block, chunks: int) -> tuple[float, float]:
    """(wall ms, process CPU ms) per chunk of one timed block, after an untimed one and a pause of PAUSE_S — so
    the other runtime's spinning workers have gone idle and are not counted as this runtime's CPU time."""
    block()
    time.sleep(PAUSE_S)
    w, c = time.perf_counter(), time.process_time()
    block()
    return (time.perf_counter() - w) * 1e3 / chunks, (time.process_time() - c) * 1e3 / chunks


PAUSE_S = 0.05


def bench(proto, streams: int, threads: int, chunks: int, rounds: int, table) -> None:
    rl.set_num_threads(threads)
    ours, theirs = rl.onnx.OnnxModel(proto), ort_session(proto, threads)
    x = audio(streams, chunks)
    feeds = {"input": x[0], "state": np.zeros((2, streams, 128), np.float32)}
    diff = max(float(np.abs(g - w).max()) for g, w in zip(ours.run(feeds), theirs.run(None, feeds)))
    blocks = {"ours": streamer(ours.run, x), "ort": streamer(lambda f: theirs.run(None, f), x)}
    samples = {name: [] for name in blocks}
    gc_was = gc.isenabled()
    gc.disable()
    for r in range(rounds):                                    # interleaved, the order rotating per round
        for name in (list(blocks) if r % 2 == 0 else list(blocks)[::-1]):
            samples[name].append(per_chunk(blocks[name], chunks))
    if gc_was:
        gc.enable()
    ours_s, ort_s = np.array(samples["ours"]), np.array(samples["ort"])
    med = lambda a, k: common.fmt_ms(float(np.median(a[:, k])))  # noqa: E731
    table.add(f"×{streams}", threads, med(ours_s, 0), med(ort_s, 0), f"{np.median(ours_s[:, 0] / ort_s[:, 0]):.2f}",
              med(ours_s, 1), med(ort_s, 1), f"{np.median(ours_s[:, 1] / ort_s[:, 1]):.2f}", f"{diff:.1e}")


def profile(proto, streams: int) -> None:
    """Per-thunk time of our schedule (each thunk compiled alone, run on the model's arena after a full run)."""
    from rlx_llvm.program import compile as compile_schedule
    from rlx_llvm.schedule import ThunkSchedule
    model = rl.onnx.OnnxModel(proto)
    feeds = {"input": audio(streams, 1)[0], "state": np.zeros((2, streams, 128), np.float32)}
    cg = model.compiled({k: v.shape for k, v in feeds.items()})
    model.run(feeds)
    spec = cg._current()
    print(f"\n## silero-vad ×{streams}, {rl.get_num_threads()} thread(s): per thunk (µs, median of 300)\n")
    print(cg.report().split("\n", 1)[1].split("  t0")[0])
    for i, thunk in enumerate(spec.schedule.thunks):
        program = compile_schedule(ThunkSchedule([thunk], arena_bytes=spec.schedule.arena_bytes))
        samples = []
        for _ in range(300):
            t = time.perf_counter_ns()
            program.run(spec.arena)
            samples.append((time.perf_counter_ns() - t) / 1e3)
        print(f"  t{i:<3} {type(thunk).__name__:<18} {np.median(samples):7.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    import onnxruntime as ort
    path = packaged_model("silero-vad")
    if path is None:
        sys.exit("install the model: pip install --no-deps silero-vad==6.2.3")
    proto = specialize(path, {"sr": np.array(16000, np.int64)})
    print(f"# {common.cpu_model()} ({common.cpu_name()}), cores {common.cores()}, load {common.load_average()}")
    print(f"# onnxruntime {ort.__version__}; {common.python_facts()}")
    table = common.Table(["streams", "threads", "ours ms", "ORT ms", "ours ÷ ORT", "ours CPU ms", "ORT CPU ms",
                          "CPU ÷", "max |Δ|"], left=["streams"])
    for threads in map(int, args.threads.split(",")):
        for streams in map(int, args.streams.split(",")):
            bench(proto, streams, threads, args.chunks, args.rounds, table)
        table.rule()
    table.note(f"per 512-sample chunk, {args.chunks} chunks streamed per sample with the state carried; medians of "
               "interleaved rounds; ÷ are medians of per-round ratios; CPU = process CPU time (all threads)")
    print(table)
    if args.profile:
        for streams in map(int, args.streams.split(",")):
            profile(proto, streams)


if __name__ == "__main__":
    main()
