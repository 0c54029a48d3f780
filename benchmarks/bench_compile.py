"""Where cold compile time goes, and the first-run figures of issue 19 (docs/compile.md).

    cd /work/main && PYTHONPATH=. python benchmarks/bench_compile.py            # everything
    cd /work/main && PYTHONPATH=. python benchmarks/bench_compile.py --only breakdown

Sections (each run in fresh subprocesses where a new process is the point):
* import     — `python -c "import rlx_llvm"` against bare `python -c pass` and `import numpy`;
* breakdown  — per thunk kind of MiniLM 1×128 (each kind compiled alone, cache off): IR size, emit,
               parse+verify, IR passes, codegen for O3 and for the quick tier; then the whole module;
* first run  — cache off, a new MiniLM shape after another shape ran: first embedding (compile
               included; split into the encoder's plan, compile and arena phases) and the time until
               calls run at steady speed, untiered and RLX_LLVM_TIERED=1;
* cached     — a new process whose object cache (and the encoder's plan store) already holds MiniLM
               1×128: the encoder's construction, then that shape's first embedding (program ready,
               then its first call), and `rl.compile` of its schedule alone;
* memory     — RSS growth per compile-and-drop of a small schedule, after 100 warm-up cycles.

Times are wall medians with CPU (thread/process) time beside them: the host may be shared.  Bytecode
is cached under a temporary PYTHONPYCACHEPREFIX so import times are those of an installed package.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYCACHE = os.path.join(tempfile.gettempdir(), "rlx_bench_pycache")


def _env(**extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONPYCACHEPREFIX=PYCACHE, **extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _child(code: str, args: tuple = (), **env: str) -> dict:
    """Run `code` (with `args`) in a fresh interpreter; it prints one JSON line last."""
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=_env(**env),
                          timeout=1800)
    if proc.returncode:
        raise SystemExit(f"child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _process_ms(statement: str, rounds: int = 7) -> tuple[float, float]:
    """Median wall and CPU (user + system) ms of `python -c statement`, after one warm-up."""
    walls, cpus = [], []
    for i in range(rounds + 1):
        before = os.times()
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", statement], check=True, env=_env())
        wall = (time.perf_counter() - t0) * 1e3
        after = os.times()
        if i:
            walls.append(wall)
            cpus.append((after.children_user + after.children_system
                         - before.children_user - before.children_system) * 1e3)
    return statistics.median(walls), statistics.median(cpus)


def section_import() -> None:
    print("\n== import (new process, wall / CPU ms, median of 7) ==")
    base = _process_ms("pass")
    for stmt in ("pass", "import numpy", "import rlx_llvm", "import rlx_llvm; rlx_llvm.thunks",
                 "import rlx_llvm; rlx_llvm.compile"):
        wall, cpu = _process_ms(stmt)
        print(f"  {stmt:<38} {wall:7.1f} / {cpu:6.1f}   (over bare python: {wall - base[0]:6.1f} / {cpu - base[1]:6.1f})")


BREAKDOWN = r"""
import json, time
import numpy as np
import rlx_llvm as rl
from rlx_llvm import jit
from rlx_llvm.models import load_minilm
enc = load_minilm()
program = enc.compiled(1, 128).program
schedule = program.schedule
rows = []

def phases(ir):
    out = {}
    for tier, fn in (("o3", lambda: jit.compile_ir(ir)), ("quick", lambda: jit.compile_quick(ir))):
        best = None
        for _ in range(3):
            c0 = time.thread_time(); code = fn(); cpu = (time.thread_time() - c0) * 1e3
            if best is None or cpu < best[0]:
                best = (cpu, code.timings_ms)
        out[tier] = {"cpu": best[0], **best[1]}
    return out

seen = {}
for i, t in enumerate(schedule.thunks):
    kind = type(t).__name__
    if kind in seen:
        seen[kind]["count"] += 1
        continue
    single = rl.ThunkSchedule([t], arena_bytes=schedule.arena_bytes)
    p = rl.compile(single, cache=False, tiered=False)
    ir = p.llvm_ir()
    seen[kind] = {"kind": kind, "count": 1, "ir_chars": len(ir), "emit": p.report().timings_ms["emit"], **phases(ir)}
whole = {"kind": "MiniLM 1x128 module", "count": len(schedule.thunks), "ir_chars": len(program.llvm_ir()),
         "emit": program.report().timings_ms["emit"], **phases(program.llvm_ir())}
print(json.dumps({"kinds": list(seen.values()), "whole": whole}))
"""


def section_breakdown() -> None:
    print("\n== cold compile breakdown, MiniLM 1x128 (cache off; ms; CPU = thread time, best of 3) ==")
    got = _child(BREAKDOWN, RLX_LLVM_CACHE="0")
    head = (f"  {'kind':<22} {'n':>3} {'IR KB':>6} {'emit':>6} │ {'O3: parse':>9} {'passes':>7} {'codegen':>7} "
            f"{'CPU':>6} │ {'quick: passes':>13} {'codegen':>7} {'CPU':>6}")
    print(head)
    for r in got["kinds"] + [got["whole"]]:
        o3, q = r["o3"], r["quick"]
        print(f"  {r['kind'][:22]:<22} {r['count']:>3} {r['ir_chars'] / 1e3:6.1f} {r['emit']:6.1f} │ "
              f"{o3['parse_verify']:9.1f} {o3['optimize']:7.1f} {o3['codegen']:7.1f} {o3['cpu']:6.1f} │ "
              f"{q['optimize']:13.1f} {q['codegen']:7.1f} {q['cpu']:6.1f}")
    print("  (the six FusedBertLayers share one body: emitted and compiled once; 'emit' includes the IR text)")


FIRST_RUN = r"""
import json, statistics, sys, time
import numpy as np
import rlx_llvm as rl
from rlx_llvm.models import SentenceEncoder
threads, before, new, mode = int(sys.argv[1]), eval(sys.argv[2]), eval(sys.argv[3]), sys.argv[4]
cover = mode == "cover"
rl.set_num_threads(threads)
enc = SentenceEncoder(cover=cover, tier0=False if mode == "no-tier0" else None)
rng = np.random.default_rng(0)
def embed(b, s):
    ids = rng.integers(1000, 20000, (b, s)); mask = np.ones((b, s), np.float32)
    return lambda: enc.embed_tokens(ids, mask)
embed(*before)()                                 # another shape first: models, arena, emitters loaded
enc.compiled(*before).program.wait_optimized()
run = embed(*new)
t0 = time.perf_counter(); c0 = time.thread_time(); p0 = time.process_time()
first = run()
first_ms, first_cpu = (time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3
first_process_cpu = (time.process_time() - p0) * 1e3
phases = dict(enc.last_compile_phases) if not cover else {}
def final():                                     # the shape's own program, at its last tier
    own = enc._compiled.get(new)
    return own is not None and own.program.tier == 2
calls = []                            # (seconds since the shape was asked for, call ms, final?, call CPU ms)
while time.perf_counter() - t0 < 30 and sum(c[2] for c in calls) < 15:
    a, c = time.perf_counter(), time.thread_time(); run()
    calls.append((a - t0, (time.perf_counter() - a) * 1e3, final(), (time.thread_time() - c) * 1e3))
steady = statistics.median(c[1] for c in calls[-10:])
reached = next(c[0] + c[1] / 1e3 for c in calls if c[1] <= 1.1 * steady)
program = enc._compiled[new].program
print(json.dumps({"first_ms": first_ms, "first_cpu": first_cpu, "first_process_cpu": first_process_cpu,
                  "compile_ms": program.compile_ms,
                  "phases": phases, "steady_ms": steady, "steady_at_s": reached,
                  "timings": program.report().timings_ms,
                  "cpu_before_after": [sorted(c[3] for c in calls if c[2] == f) for f in (False, True)]}))
"""


FIRST_RUN_CASES = {"untiered (O3)": (("(1, 16)", "(1, 128)", "-"), {"RLX_LLVM_TIERED": "0"}),
                   "tiered": (("(1, 16)", "(1, 128)", "-"), {"RLX_LLVM_TIERED": "1"}),
                   "tiered, no tier 0": (("(1, 16)", "(1, 128)", "no-tier0"), {"RLX_LLVM_TIERED": "1"}),
                   "cover": (("(1, 128)", "(1, 64)", "cover"), {"RLX_LLVM_TIERED": "0"})}


def first_run(label: str, threads: int = 1) -> dict:
    """One fresh process of FIRST_RUN_CASES[label] (cache off, `threads` threads): its JSON result."""
    shapes, env = FIRST_RUN_CASES[label]
    return _child(FIRST_RUN, RLX_LLVM_CACHE="0", args=(str(threads), *shapes), **env)


def section_first_run() -> None:
    print("\n== a new MiniLM shape, object cache off, 1 thread ==")
    for label, (shapes, _) in FIRST_RUN_CASES.items():
        r = first_run(label)
        calls = ", ".join(f"{name} {statistics.median(v):.1f}" for name, v in zip(("before", "own O3"),
                                                                                  r["cpu_before_after"]) if v)
        print(f"  {label:<14} {shapes[1]} after {shapes[0]}: first embedding {r['first_ms']:7.1f} ms (its thread's "
              f"CPU {r['first_cpu']:6.1f}); steady {r['steady_ms']:.1f} ms/call from {r['steady_at_s']:.2f} s; "
              f"call CPU medians: {calls}")
        print(f"  {'':<14} encoder phases (wall ms) {json.dumps({k: round(v, 1) for k, v in r['phases'].items()})}; "
              f"compile timings {json.dumps({k: round(v, 1) for k, v in r['timings'].items()})}")


CACHED = r"""
import json, statistics, sys, time
import numpy as np
import rlx_llvm as rl
rl.set_num_threads(1)
import rlx_llvm.program                          # LLVM loaded: the encoder's own imports are what follows
def clock():
    return time.perf_counter(), time.thread_time()
def since(t):
    return (time.perf_counter() - t[0]) * 1e3, (time.thread_time() - t[1]) * 1e3
t = clock()
from rlx_llvm.models import load_minilm
enc = load_minilm()
construct = since(t)
ids = np.random.default_rng(0).integers(1000, 20000, (1, 128)); mask = np.ones((1, 128), np.float32)
t = clock(); program = enc.compiled(1, 128).program; ready = since(t)
t = clock(); enc.embed_tokens(ids, mask); first = since(t)
program.wait_optimized()
def call_ms():
    t = clock(); enc.embed_tokens(ids, mask); return since(t)[0]
steady = statistics.median(call_ms() for _ in range(7))
if sys.argv[1] == "fill":
    print(json.dumps({})); raise SystemExit
t = clock(); again = rl.compile(program.schedule); warm = since(t)
print(json.dumps({"construct": construct, "ready": ready, "first": first, "steady_ms": steady, "warm": warm,
                  "from_cache": program.report().from_cache and again.report().from_cache}))
"""


def cached_runs(processes: int = 5) -> list[dict]:
    """MiniLM 1x128 in `processes` new processes after one filled a fresh object cache: their results."""
    with tempfile.TemporaryDirectory() as cache_dir:
        env = _env(RLX_LLVM_CACHE_DIR=cache_dir, RLX_LLVM_CACHE="1")
        return [json.loads(subprocess.run([sys.executable, "-c", CACHED, mode], capture_output=True, text=True,
                                          env=env, timeout=1800, check=True).stdout.strip().splitlines()[-1])
                for mode in ["fill"] + ["use"] * processes][1:]


def section_cached() -> None:
    print("\n== MiniLM 1x128 in a new process, object cache and plan store warm (median of 5 processes; "
          "wall / CPU ms, 1 thread) ==")
    runs = cached_runs()

    def med(key: str) -> str:
        return " / ".join(f"{statistics.median(r[key][i] for r in runs):.1f}" for i in (0, 1))
    steady = statistics.median(r["steady_ms"] for r in runs)
    print(f"  encoder construction (imports, weights read and packed, laid out in its arena): {med('construct')}")
    print(f"  then the cached shape's program ready (enc.compiled(1, 128)):  {med('ready')}   "
          f"from cache: {all(r['from_cache'] for r in runs)}")
    print(f"  then its first embedding (the first call):                    {med('first')}   "
          f"(steady call {steady:.1f} ms wall)")
    print(f"  rl.compile(schedule) of the same schedule again (warm start alone): {med('warm')}")


MEMORY = r"""
import gc, json, sys
import rlx_llvm as rl
from rlx_llvm import thunks as T
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
def cycle(i):
    rl.compile(rl.ThunkSchedule([T.Copy(src=0, dst=8192, len=1024 + 4 * (i % 7)),
                                 T.Copy(src=8192, dst=12288, len=64 + i % 5)], arena_bytes=16384), cache=False)
for i in range(100):
    cycle(i)
gc.collect(); r0 = rss()
n = int(sys.argv[1])
for i in range(n):
    cycle(i)
gc.collect()
print(json.dumps({"per_cycle": (rss() - r0) / n, "n": n}))
"""


def section_memory(cycles: int) -> None:
    print("\n== compile-and-drop ==")
    proc = subprocess.run([sys.executable, "-c", MEMORY, str(cycles)], capture_output=True, text=True,
                          env=_env(RLX_LLVM_CACHE="0"), timeout=3600, check=True)
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"  {r['n']} cycles after 100: RSS +{r['per_cycle'] / 1024:.2f} KB per compile "
          f"(→ {r['per_cycle'] * 10000 / 2**20:.1f} MB per 10 000)")


SECTIONS = {"import": section_import, "breakdown": section_breakdown, "first": section_first_run,
            "cached": section_cached}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=[*SECTIONS, "memory"], action="append")
    ap.add_argument("--cycles", type=int, default=2000, help="compile-and-drop cycles for the memory section")
    args = ap.parse_args()
    print(f"machine: {common.cpu_model()} ({common.cpu_name()}), {common.cores()}, load {common.load_average()}")
    for name in args.only or [*SECTIONS, "memory"]:
        section_memory(args.cycles) if name == "memory" else SECTIONS[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
