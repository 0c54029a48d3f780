"""MiniLM-L6 at the small shapes interactive use sees (1×8 … 8×64 tokens): rlx-llvm against ONNX
Runtime running the same model (HF BertModel + mean pooling + L2 normalize, exported with dynamic
batch and sequence axes), at one thread count per run.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_minilm_shapes.py --threads 1
    cd /work/main && PYTHONPATH=. python benchmarks/bench_minilm_shapes.py --threads 2

Each shape: both implementations checked against each other (cosine), then timed as the median
of 30 calls, each preceded by one untimed call (so the other pool has gone idle).  Needs torch,
transformers and onnxruntime besides the models extra.

`--first-runs` prints instead issue 19's first-run figures against their bars, each in fresh
processes, with CPU times beside the wall times (the host may be shared; one thread):

    cd /work/main && PYTHONPATH=. python benchmarks/bench_minilm_shapes.py --first-runs [--repeat 3] [--threads 2]

* a new shape, object cache off (RLX_LLVM_CACHE=0), tiered: 1×128 after 1×16 ran — first embedding
  (compile included; ≤ 200 ms) and when calls reach steady speed (≤ 2 s); with RLX_LLVM_TIERED=1 the
  encoder's first call of a new shape runs in NumPy (tier 0) while it compiles; beside it the same
  without tier 0 (quick native code first) and untiered;
* a cached shape in a new process (encoder built, 1×128 in the object cache): program ready (≤ 10 ms);
* `python -c "import rlx_llvm"` (≤ 150 ms).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from bench_bert import export_minilm  # noqa: E402

SHAPES = [(1, 8), (1, 16), (4, 32), (1, 64), (8, 64)]


def median_ms(fn, rounds: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(rounds):
        fn()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def first_runs(repeat: int, threads: int) -> None:
    """Issue 19's first-run figures (bench_compile's children), medians of `repeat` fresh processes."""
    import statistics
    import bench_compile as bc

    def med(values) -> float:
        return statistics.median(values)
    print(f"machine: {common.cpu_model()} ({common.cpu_name()}), {common.cores()}, load {common.load_average()}; "
          f"{threads} thread(s) for the new shape; medians of {repeat} fresh processes; CPU = the calling thread's, "
          f"process = every thread's")
    wall, cpu = bc._process_ms("import rlx_llvm")
    base = bc._process_ms("pass")
    print(f"  import rlx_llvm: {wall:.1f} ms wall / {cpu:.1f} ms CPU (bare python {base[0]:.1f} / {base[1]:.1f})"
          f"   bar ≤ 150 ms wall")
    for label in ("tiered", "tiered, no tier 0", "untiered (O3)"):
        runs = [bc.first_run(label, threads) for _ in range(repeat)]
        quick = [r["timings"].get("quick codegen", r["timings"].get("codegen", 0.0)) for r in runs]
        print(f"  new shape 1×128 after 1×16, cache off, {label}: first embedding {med(r['first_ms'] for r in runs):.1f} "
              f"ms wall / {med(r['first_cpu'] for r in runs):.1f} CPU / {med(r['first_process_cpu'] for r in runs):.1f} "
              f"process (plan {med(r['phases'].get('plan', 0) for r in runs):.1f}, emit "
              f"{med(r['timings']['emit'] for r in runs):.1f}, codegen {med(quick):.1f} wall)   bar ≤ 200 ms")
        print(f"      steady {med(r['steady_ms'] for r in runs):.1f} ms/call from "
              f"{med(r['steady_at_s'] for r in runs):.2f} s   bar ≤ 2 s")
    cached = bc.cached_runs(max(repeat, 3))
    print(f"  cached 1×128 in a new process, encoder built: program ready {med(r['ready'][0] for r in cached):.1f} ms "
          f"wall / {med(r['ready'][1] for r in cached):.1f} CPU; first embedding "
          f"{med(r['first'][0] for r in cached):.1f} / {med(r['first'][1] for r in cached):.1f}   bar ≤ 10 ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--first-runs", action="store_true", help="issue 19's first-run figures instead (fresh processes)")
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per --first-runs figure")
    args = ap.parse_args()
    if args.first_runs:
        first_runs(args.repeat, args.threads)
        return 0
    common.pin_threads(args.threads)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import numpy as np
    import onnxruntime as ort
    import torch
    import rlx_llvm as rl
    from rlx_llvm.models import load_minilm
    rl.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    enc = load_minilm()
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    example = {"input_ids": torch.ones((2, 8), dtype=torch.int64), "attention_mask": torch.ones((2, 8), dtype=torch.int64)}
    model = export_minilm(torch, str(enc.path), example, dynamic_seq=True)
    sess = ort.InferenceSession(model["plain"], so, providers=["CPUExecutionProvider"])
    print(f"machine: {common.cpu_model()} ({common.cpu_name()}), {common.cores()}, load {common.load_average()}; "
          f"{args.threads} thread(s); onnxruntime {ort.__version__}")
    print(f"{'shape':>8}  {'rlx-llvm ms':>11}  {'ORT ms':>7}  {'rlx/ORT':>7}  {'min cos':>8}")
    rng = np.random.default_rng(0)
    for b, s in SHAPES:
        ids = rng.integers(1000, 20000, (b, s))
        mask = np.ones((b, s), np.float32)
        feed = {"input_ids": ids, "attention_mask": mask.astype(np.int64), "token_type_ids": np.zeros_like(ids)}
        ours, theirs = enc.embed_tokens(ids, mask), sess.run(None, feed)[0]
        cos = float(np.min((ours * theirs).sum(1)))
        if cos < 0.9999:
            raise SystemExit(f"{b}x{s}: rlx-llvm and ORT disagree (cosine {cos})")
        t_ours = median_ms(lambda: enc.embed_tokens(ids, mask))
        t_ort = median_ms(lambda: sess.run(None, feed))
        print(f"{b:>3}×{s:<4}  {t_ours:11.2f}  {t_ort:7.2f}  {t_ours / t_ort:7.2f}  {cos:8.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
