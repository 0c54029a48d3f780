"""rlx_llvm's thread runtime under load: the pool (`kernels.pool`) against libgomp (`RLX_LLVM_RUNTIME=gomp`),
at 1 and 2 threads, on a quiet machine and beside a spinning neighbour process — one run, one table.

    cd /work/main && RLX_LLVM_CACHE=0 PYTHONPATH=. python benchmarks/bench_runtime.py [--rounds N] [--only bert1,bert8,minilm,empty]

Cases: the BERT-base layer (one `FusedBertLayer`, b1 and b8 × s128, built as in bench_bert.py), MiniLM-L6
`embed_tokens` 1×128 (`rlx_llvm.models.load_minilm`), and the fork/join overhead of an empty region
(a kernel forking 200 regions of 2 trivial items, time per region).  Both runtimes' programs live in
one process and every round times each (runtime, threads) variant once, in rotating order, so load
from other processes hits them alike.  The neighbour is `python -c "while True: pass"`, started and
stopped by this script.  Bars (issue 19): under the neighbour, p90 at 2 threads ≤ 1.10 × p90 at 1
thread; quiet, BERT b8 at 2 threads ≥ 1.8× the speed of 1 thread.  "Quiet" means no neighbour of
ours — on a shared host other processes still run.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_bert  # noqa: E402
import common  # noqa: E402

import numpy as np  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from rlx_llvm.ir_emit import parallel  # noqa: E402

RUNTIMES = ("pool", "gomp")
THREADS = (1, 2)
EMPTY_REGIONS = 200


@contextlib.contextmanager
def runtime(name: str):
    """Emit (compile) under runtime `name`."""
    saved = os.environ.get(parallel.RUNTIME_ENV)
    os.environ[parallel.RUNTIME_ENV] = name
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(parallel.RUNTIME_ENV)
        else:
            os.environ[parallel.RUNTIME_ENV] = saved


def bert_case(batch: int):
    """{runtime: run()} for the BERT layer at `batch` (checked against NumPy float64)."""
    from scipy.special import erf
    w = bench_bert.bert_weights(np)
    h, mask = bench_bert.bert_inputs(np, batch)
    ref = bench_bert.bert_numpy(np, erf, {k: v.astype(np.float64) for k, v in w.items()}, h.astype(np.float64), mask)
    runs = {}
    for name in RUNTIMES:
        with runtime(name):
            run, out, _ = bench_bert.bert_rlx(np, batch, w, h, mask)
        run()
        err = float(np.max(np.abs(out() - ref) / (1 + np.abs(ref))))
        assert err <= bench_bert.TOL, (name, err)
        runs[name] = run
    return runs


def minilm_case():
    """{runtime: run()} for MiniLM embed_tokens 1×128 (the two runtimes' embeddings must agree)."""
    from rlx_llvm.models import load_minilm
    texts = bench_bert.make_texts(1)
    runs, outs = {}, {}
    for name in RUNTIMES:
        with runtime(name):
            enc = load_minilm()
            ids, mask = enc.tokenize(texts, max_length=bench_bert.SEQ, pad_to=bench_bert.SEQ)
            outs[name] = enc.embed_tokens(ids, mask)  # compiles this shape under `name`
        runs[name] = lambda enc=enc, ids=ids, mask=mask: enc.embed_tokens(ids, mask)
    assert np.allclose(outs["pool"], outs["gomp"], atol=1e-5)
    return runs


def empty_case():
    """{runtime: run()}: a kernel forking EMPTY_REGIONS regions of 2 one-store items."""
    from llvmlite import ir

    from rlx_llvm import jit
    from rlx_llvm.ir_emit.context import EmitContext
    from rlx_llvm.ir_emit.toolkit import I32, PTR

    def body(sub, start, stop):
        sub.b.store(sub.b.trunc(start, I32), sub.addr(0, start, 4))

    runs = {}
    for name in RUNTIMES:
        with runtime(name):
            module = ir.Module("empty")
            module.triple = jit.host().triple
            fn = ir.Function(module, ir.FunctionType(I32, [PTR, PTR]), name="kernel")
            ctx = EmitContext(module, fn, 0, None, None, 8,
                              lambda n, t, m=module: m.globals.get(n) or ir.Function(m, t, name=n))
            for _ in range(EMPTY_REGIONS):
                ctx.parallel_for(2, body, grain=1, min_work=1)
            ctx.finish()
            engine = jit.Engine()
            engine.load(jit.compile_ir(str(module)))
        kernel = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p)(engine.address("kernel"))
        arena, scratch = np.zeros(16, np.int32), np.zeros(max(64, ctx.scratch_bytes), np.uint8)
        runs[name] = lambda k=kernel, a=arena, s=scratch, e=engine: k(a.ctypes.data, s.ctypes.data)
    return runs


def time_variants(runs: dict, rounds: int, budget_s: float) -> dict:
    """{(runtime, threads): (wall ms samples, CPU ms samples)}: rounds of every variant once, rotating."""
    variants = [(name, t) for name in runs for t in THREADS]
    out = {v: ([], []) for v in variants}
    for name, t in variants:   # warm every variant
        rl.set_num_threads(t)
        runs[name]()
    gc.disable()
    start = time.perf_counter()
    try:
        for r in range(rounds):
            k = r % len(variants)
            for name, t in variants[k:] + variants[:k]:
                rl.set_num_threads(t)
                runs[name]()   # settle: the previous variant's threads go idle
                c0, w0 = time.thread_time(), time.perf_counter()
                runs[name]()
                w1, c1 = time.perf_counter(), time.thread_time()
                out[(name, t)][0].append((w1 - w0) * 1e3)
                out[(name, t)][1].append((c1 - c0) * 1e3)
            if r >= 4 and time.perf_counter() - start > budget_s:
                break
    finally:
        gc.enable()
    return out


def quantile(xs: list, q: float) -> float:
    return common.Timing(list(xs))._q(q)


@contextlib.contextmanager
def neighbour(on: bool):
    """A process spinning on one core while the block runs (when `on`)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if on else None
    try:
        if proc:
            time.sleep(0.3)
        yield
    finally:
        if proc:
            proc.kill()
            proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--budget", type=float, default=40.0, help="seconds per case and condition")
    ap.add_argument("--only", default="bert1,bert8,minilm,empty")
    args = ap.parse_args()
    print(f"CPU: {common.cpu_model()} ({common.cpu_name()}), {os.cpu_count()} logical cores; "
          f"load average {common.load_average()}")
    print("'quiet' = no neighbour of ours; this host is shared with other agents, so it is never truly quiet.\n")
    makers = {"bert1": ("BERT layer b1×128", lambda: bert_case(1)),
              "bert8": ("BERT layer b8×128", lambda: bert_case(8)),
              "minilm": ("MiniLM embed 1×128", minilm_case),
              "empty": ("empty region (µs per region)", empty_case)}
    table = common.Table(["case", "load", "runtime", "thr", "p50", "p90", "CPU p50", "p90 / p90@1t", "speed×"],
                         left=["case", "load", "runtime"])
    verdicts = []
    for key in args.only.split(","):
        title, make = makers[key]
        runs = make()
        scale = 1.0 / EMPTY_REGIONS if key == "empty" else 1.0
        for busy in (False, True):
            with neighbour(busy):
                got = time_variants(runs, args.rounds, args.budget)
            load = "neighbour" if busy else "quiet"
            for name in RUNTIMES:
                one = got[(name, 1)][0]
                for t in THREADS:
                    wall, cpu = got[(name, t)]
                    p50, p90 = quantile(wall, 0.5) * scale, quantile(wall, 0.9) * scale
                    rel = quantile(wall, 0.9) / quantile(one, 0.9)
                    speed = quantile(one, 0.5) / quantile(wall, 0.5)
                    unit = 1e3 if key == "empty" else 1.0
                    cpu50 = quantile(cpu, 0.5) * scale * unit
                    table.add(title, load, name, t, f"{p50 * unit:.3f}", f"{p90 * unit:.3f}", f"{cpu50:.3f}",
                              f"{rel:.2f}", f"{speed:.2f}")
                    if key != "empty" and name == "pool" and t == 2:
                        if busy:
                            verdicts.append((f"{title}, neighbour: p90 2t / p90 1t = {rel:.2f} (bar ≤ 1.10)",
                                             rel <= 1.10))
                        elif key == "bert8":
                            verdicts.append((f"{title}, quiet: 2t speed-up {speed:.2f}× (bar ≥ 1.8)", speed >= 1.8))
            table.rule()
        print(f"  {title}: done", flush=True)
    table.note("times in ms (µs for the empty region); CPU = time.thread_time of the calling thread; "
               "speed× = p50 at 1 thread / p50")
    print(table)
    print()
    for text, ok in verdicts:
        print(("PASS " if ok else "MISS ") + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
