"""GEMMs through rlx-llvm (JIT code calling SciPy's OpenBLAS) next to NumPy, SciPy and PyTorch.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_gemm.py [--rounds 5] [--block-ms 150]

One run, at 1 and then 2 threads (both OpenBLAS pools through `rlx_llvm.kernels.threads`,
PyTorch through `torch.set_num_threads`):

* `Sgemm` m×k×n ∈ {1024³, 128×768×3072, 1024×3072×768, 4096×64×4096, 333×555×777, 64³, MiniLM's
  128×384×384, 128×384×1536, 128×1536×384 and their batch-8 forms with 1024 rows, 64×4096×4096, 8³}:
  `prog.run(arena)` against `numpy.matmul(out=)`
  and a direct `scipy.linalg.blas.sgemm` on transposed views (Fortran order, so f2py copies
  nothing: `Cᵀ = Bᵀ·Aᵀ` written into the C buffer).
* `FusedMmBiasAct` 128×768 @ 768×3072, erf-Gelu: against NumPy (`matmul(out=)`, then in-place
  bias and erf-GELU passes with `scipy.special.erf`) and PyTorch (`F.gelu(F.linear(x, W, b))`,
  `W` in its native `[out, in]` layout).
* The cost of crossing from native code to a Python fallback and back.
* The host's f32 FMA peak (one thread): independent vector FMA chains in a JIT loop, so 1024³ can be
  quoted as a fraction of it.

`rlx-llvm` is the default lowering (inline IR tiles for these GEMMs, see docs/lowering-blas.md);
`rlx-llvm, BLAS call` is the same schedule compiled with `RLX_LLVM_GEMM=blas`, calling SciPy's
sgemm from JIT code.  Timing is pool by pool: two OpenBLAS pools, PyTorch's OpenMP pool and ours
share 2 cores, and a pool that just ran keeps spinning, so each round runs the implementations of
one pool (interleaved with each other: the BLAS call and the direct SciPy call share SciPy's pool)
after a short pause, then the next pool, rotating the order from round to round.  Medians over all
samples are reported and every ratio compares medians of the same run.  Every
implementation is checked against a float64 NumPy reference before it is timed.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402
import scipy.linalg.blas  # noqa: E402
import scipy.special  # noqa: E402

import rlx_llvm as rl  # noqa: E402
import rlx_llvm.ir_emit.gemm  # noqa: E402,F401  (registers the families; harmless once they are in FAMILIES)
import rlx_llvm.ir_emit.linalg  # noqa: E402,F401
from rlx_llvm import thunks as T  # noqa: E402
from rlx_llvm.kernels.threads import get_num_threads, set_num_threads  # noqa: E402
from rlx_llvm.ops import Activation  # noqa: E402

# issue 19's bar (rlx-llvm ≤ SciPy's time on each), MiniLM's projections (hidden 384, FFN 1536) at one
# sequence of 128 and at batch 8, the 64×4096×4096 weak spot, and 8³
SGEMM_SHAPES = [(1024, 1024, 1024), (128, 768, 3072), (1024, 3072, 768), (4096, 64, 4096), (333, 555, 777),
                (64, 64, 64), (128, 384, 384), (128, 384, 1536), (128, 1536, 384), (1024, 384, 384),
                (1024, 384, 1536), (1024, 1536, 384), (64, 4096, 4096), (8, 8, 8)]
FUSED_SHAPE = (128, 768, 3072)
SQRT_HALF = np.float32(1 / np.sqrt(2))


def _slots(*nbytes: int) -> tuple[list[int], int]:
    """64-byte-aligned offsets for consecutive buffers, and the arena size."""
    offs, top = [], 0
    for n in nbytes:
        offs.append(top)
        top += (n + 63) // 64 * 64
    return offs, top


@contextlib.contextmanager
def gemm_mode(mode: str):
    """Compile with `RLX_LLVM_GEMM=mode` ("blas": every GEMM calls ?gemm; "auto": IR tiles where faster)."""
    from rlx_llvm.ir_emit.gemm import GEMM_MODE_ENV
    old = os.environ.get(GEMM_MODE_ENV)
    os.environ[GEMM_MODE_ENV] = mode
    try:
        yield
    finally:
        if old is None:
            del os.environ[GEMM_MODE_ENV]
        else:
            os.environ[GEMM_MODE_ENV] = old


def compile_both(thunks: list, size: int) -> tuple[rl.Program, rl.Program]:
    """(default program, program whose GEMMs all call BLAS)."""
    sched = rl.ThunkSchedule(thunks, arena_bytes=size)
    with gemm_mode("auto"):
        auto = rl.compile(sched, cache=False)
    with gemm_mode("blas"):
        blas = rl.compile(sched, cache=False)
    return auto, blas


def pool_of(name: str) -> str:
    """Which thread pool an implementation runs on (implementations of one pool are interleaved)."""
    if name in ("rlx-llvm, BLAS call", "scipy sgemm"):
        return "scipy's OpenBLAS"
    if name.startswith("numpy"):
        return "numpy's OpenBLAS"
    if name.startswith("torch"):
        return "torch"
    return "rlx-llvm"


def blocked(fns: dict, rounds: int, samples: int, pause_s: float = 0.15) -> dict[str, "common.Timing"]:
    """Time implementations pool by pool: per round, each pool's implementations (rotating order)
    after a pause — so the other pools' spinning threads have gone to sleep — interleaved with
    each other for `samples` calls each, after 2 warm-up calls."""
    pools: dict[str, dict] = {}
    for name, fn in fns.items():
        pools.setdefault(pool_of(name), {})[name] = fn
    order = list(pools)
    out = {name: common.Timing() for name in fns}
    for r in range(rounds):
        k = r % len(order)
        for pool in order[k:] + order[:k]:
            time.sleep(pause_s)
            for name, t in common.interleaved(pools[pool], rounds=samples, warmup=2).items():
                out[name].samples += t.samples
    return out


def _torch():
    try:
        import torch
        import torch.nn.functional as F
    except Exception:  # noqa: BLE001 - optional peer
        return None, None
    return torch, F


def _check(name: str, got: np.ndarray, want: np.ndarray, tol: float) -> None:
    err = float(np.max(np.abs(got.astype(np.float64) - want) / (1 + np.abs(want))))
    if err > tol:
        print(f"{name}: max scaled error {err:.2e} > {tol:.0e}")
        sys.exit(1)


def sgemm_case(m: int, k: int, n: int, rng: np.random.Generator) -> dict:
    """Implementations of C = A·B on shared memory, checked once."""
    (a_off, b_off, c_off), size = _slots(m * k * 4, k * n * 4, m * n * 4)
    arena, arena_blas = rl.Arena(size), rl.Arena(size)
    a, b = arena.view(a_off, "f32", (m, k)), arena.view(b_off, "f32", (k, n))
    a[:], b[:] = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    arena_blas.bytes[:] = arena.bytes
    auto, blas = compile_both([T.Sgemm(a=a_off, b=b_off, c=c_off, m=m, k=k, n=n)], size)
    out_np, out_sp = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
    sgemm = scipy.linalg.blas.sgemm
    fns = {"rlx-llvm": lambda: auto.run(arena),
           "rlx-llvm, BLAS call": lambda: blas.run(arena_blas),
           "numpy.matmul": lambda: np.matmul(a, b, out=out_np),
           "scipy sgemm": lambda: sgemm(1.0, b.T, a.T, c=out_sp.T, overwrite_c=True)}
    want = a.astype(np.float64) @ b.astype(np.float64)
    for fn in fns.values():
        fn()
    for name, got in (("rlx-llvm", arena.view(c_off, "f32", (m, n))),
                      ("rlx-llvm, BLAS call", arena_blas.view(c_off, "f32", (m, n))),
                      ("numpy.matmul", out_np), ("scipy sgemm", out_sp)):
        _check(f"sgemm {m}x{k}x{n} {name}", got, want, 1e-4 * max(1.0, k / 1024))  # f32 sums grow with k
    return fns


def fused_case(rng: np.random.Generator) -> dict:
    """Implementations of C = gelu(A·W + bias) (erf form), checked once."""
    torch, F = _torch()
    m, k, n = FUSED_SHAPE
    (a_off, w_off, bias_off, c_off), size = _slots(m * k * 4, k * n * 4, n * 4, m * n * 4)
    arena, arena_blas = rl.Arena(size), rl.Arena(size)
    a, w = arena.view(a_off, "f32", (m, k)), arena.view(w_off, "f32", (k, n))
    bias = arena.view(bias_off, "f32", n)
    a[:], w[:], bias[:] = (rng.standard_normal((m, k)) * 0.05, rng.standard_normal((k, n)) * 0.05,
                           rng.standard_normal(n))
    arena_blas.bytes[:] = arena.bytes
    thunk = T.FusedMmBiasAct(a=a_off, w=w_off, bias=bias_off, c=c_off, m=m, k=k, n=n, act=Activation.Gelu)
    auto, blas = compile_both([thunk], size)
    out_np, tmp = np.empty((m, n), np.float32), np.empty((m, n), np.float32)

    def numpy_fused() -> None:
        np.matmul(a, w, out=out_np)
        np.add(out_np, bias, out=out_np)
        np.multiply(out_np, SQRT_HALF, out=tmp)
        scipy.special.erf(tmp, out=tmp)
        np.add(tmp, 1, out=tmp)
        np.multiply(out_np, tmp, out=out_np)
        np.multiply(out_np, 0.5, out=out_np)

    fns = {"rlx-llvm": lambda: auto.run(arena), "rlx-llvm, BLAS call": lambda: blas.run(arena_blas),
           "numpy matmul+bias+gelu": numpy_fused}
    results = {"rlx-llvm": arena.view(c_off, "f32", (m, n)), "rlx-llvm, BLAS call": arena_blas.view(c_off, "f32", (m, n)),
               "numpy matmul+bias+gelu": out_np}
    if torch is not None:
        ta, tw, tb = torch.from_numpy(a), torch.from_numpy(np.ascontiguousarray(w.T)), torch.from_numpy(bias)
        holder = {}

        def torch_fused() -> None:
            holder["y"] = F.gelu(F.linear(ta, tw, tb))

        fns["torch linear+gelu"] = torch_fused
    z = a.astype(np.float64) @ w.astype(np.float64) + bias
    want = 0.5 * z * (1 + scipy.special.erf(z / np.sqrt(2)))
    for fn in fns.values():
        fn()
    if torch is not None:
        results["torch linear+gelu"] = holder["y"].numpy()
    for name, got in results.items():
        _check(f"fused {name}", got, want, 1e-4)
    return fns


def crossing_case() -> dict:
    """Schedules that differ only by a trivial Python fallback between two tiny native GEMMs."""
    (a, b, c1, c2, s, d), size = _slots(256, 256, 256, 256, 64, 64)
    g1, g2 = T.Sgemm(a=a, b=b, c=c1, m=8, k=8, n=8), T.Sgemm(a=a, b=b, c=c2, m=8, k=8, n=8)
    sort = T.SortF32(src=s, dst=d, outer=1, axis_dim=1, inner=1, descending=False, arg=False)
    arena = rl.Arena(size)
    native = rl.compile(rl.ThunkSchedule([g1, g2], arena_bytes=size), cache=False)
    mixed = rl.compile(rl.ThunkSchedule([g1, sort, g2], arena_bytes=size), cache=False)
    one = rl.compile(rl.ThunkSchedule([g1], arena_bytes=size), cache=False)
    return {"[gemm, gemm] one segment": lambda: native.run(arena),
            "[gemm, sort, gemm] two segments + fallback": lambda: mixed.run(arena),
            "[gemm]": lambda: one.run(arena)}


def _samples(flops: float, budget_ms: float) -> int:
    """Timed calls per block: about `budget_ms` of work at ~100 GFLOP/s, between 5 and 2000."""
    return int(min(2000, max(5, budget_ms / max(flops / 1e8, 1e-4))))


def cpu_medians(fns: dict, names: tuple[str, ...], reps: int, flops: float) -> dict[str, float]:
    """Median calling-thread CPU ms per call (`time.thread_time`) of one-thread implementations,
    alternated block by block: a loaded host's other processes barely move it."""
    inner = max(1, int(3e8 / flops))
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(reps):
        for name in names[r % 2:] + names[:r % 2]:
            fns[name]()
            t0 = time.thread_time()
            for _ in range(inner):
                fns[name]()
            out[name].append((time.thread_time() - t0) / inner * 1e3)
    return {name: float(np.median(v)) for name, v in out.items()}


CPU_TIMED: dict[str, dict[str, float]] = {}  # Sgemm case → one-thread CPU medians (filled at 1 thread)


def run_threads(threads: int, rounds: int, block_ms: float) -> list[tuple]:
    """Every measurement at `threads` threads; rows (case, impl, median ms, p10, p90, GFLOP/s, ratio)."""
    set_num_threads(threads)
    torch, _ = _torch()
    if torch is not None:
        torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n in SGEMM_SHAPES:
        flops = 2 * m * n * k
        fns = sgemm_case(m, k, n, rng)
        t = blocked(fns, rounds, _samples(flops, block_ms))
        rows += _rows(f"Sgemm {m}x{k}x{n}", t, flops)
        if threads == 1:
            CPU_TIMED[f"{m}x{k}x{n}"] = cpu_medians(fns, ("rlx-llvm", "scipy sgemm"), 2 * rounds + 1, flops)
    m, k, n = FUSED_SHAPE
    flops = 2 * m * n * k
    t = blocked(fused_case(rng), rounds, _samples(flops, block_ms))
    rows += _rows(f"FusedMmBiasAct {m}x{k}x{n} Gelu", t, flops)
    t = blocked(crossing_case(), rounds, 2000)
    rows += _rows("native->Python crossing", t, 0)
    return rows


def _rows(case: str, timings: dict, flops: float) -> list[tuple]:
    base = timings["rlx-llvm"].median if "rlx-llvm" in timings else None
    out = []
    for name, t in timings.items():
        gflops = flops / (t.median * 1e-3) / 1e9 if flops else float("nan")
        ratio = t.median / base if base else float("nan")
        out.append((case, name, t.median, t.p10, t.p90, gflops, ratio))
    return out


def _table(threads: int, rows: list[tuple]) -> common.Table:
    table = common.Table(["case", "implementation", "median ms", "p10-p90 ms", "GFLOP/s", "x rlx time"],
                         left=["case", "implementation"], title=f"--- {threads} thread(s) ---")
    last = None
    for case, name, med, p10, p90, gf, ratio in rows:
        if last is not None and case != last:
            table.rule()
        table.add(case if case != last else "", name, _ms(med), f"{_ms(p10)}-{_ms(p90)}",
                  "-" if gf != gf else f"{gf:.1f}", "-" if ratio != ratio else f"{ratio:.3f}")
        last = case
    return table


def _ms(ms: float) -> str:
    """Milliseconds, with µs resolution for short calls."""
    return f"{ms:.4f}" if ms < 0.1 else common.fmt_ms(ms)


def _checks_note(rows: list[tuple]) -> str:
    """The issue's targets, as same-run median ratios (time / time; below 1 means rlx-llvm is faster)."""
    med = {(case.split()[1] if case.startswith("Sgemm") else case.split()[0], name): m
           for case, name, m, *_ in rows}
    fused = "FusedMmBiasAct"
    parts = [f"1024³ BLAS call / scipy {med[('1024x1024x1024', 'rlx-llvm, BLAS call')] / med[('1024x1024x1024', 'scipy sgemm')]:.3f} (≤ 1.03)",
             f"1024³ rlx-llvm / scipy {med[('1024x1024x1024', 'rlx-llvm')] / med[('1024x1024x1024', 'scipy sgemm')]:.3f}",
             f"64³ rlx-llvm / numpy {med[('64x64x64', 'rlx-llvm')] / med[('64x64x64', 'numpy.matmul')]:.3f} (≤ 1)",
             f"fused rlx-llvm / numpy {med[(fused, 'rlx-llvm')] / med[(fused, 'numpy matmul+bias+gelu')]:.3f} (< 1)"]
    if (fused, "torch linear+gelu") in med:
        parts.append(f"fused rlx-llvm / torch {med[(fused, 'rlx-llvm')] / med[(fused, 'torch linear+gelu')]:.3f} (≤ 1)")
    return "  targets: " + "; ".join(parts)


def fma_peak_gflops(iterations: int = 20_000_000) -> float:
    """One thread's f32 FMA peak: as many independent vector FMA chains as a register tile holds."""
    import ctypes
    import llvmlite.binding as llvm
    from rlx_llvm.ir_emit.gemm import register_tile
    w = rl.jit.host().lanes(32)
    rows, vectors = register_tile(w)
    chains, vty = rows * vectors, f"<{w} x float>"
    x, y = ", ".join(["float 0x3FF0000020000000"] * w), ", ".join(["float 0x3E80000000000000"] * w)
    phis = "\n".join(f"  %a{i} = phi {vty} [zeroinitializer, %entry], [%b{i}, %loop]" for i in range(chains))
    fmas = "\n".join(f"  %b{i} = call {vty} @llvm.fma.v{w}f32({vty} %a{i}, {vty} <{x}>, {vty} <{y}>)"
                      for i in range(chains))
    sums = "\n".join(f"  %s{i + 1} = fadd {vty} %s{i}, %b{i}" for i in range(chains))
    text = f"""declare {vty} @llvm.fma.v{w}f32({vty}, {vty}, {vty})
define float @peak(i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%j, %loop]
{phis}
{fmas}
  %j = add i64 %i, 1
  %more = icmp ult i64 %j, %n
  br i1 %more, label %loop, label %done
done:
  %s0 = fadd {vty} zeroinitializer, zeroinitializer
{sums}
  %r = extractelement {vty} %s{chains}, i32 0
  ret float %r
}}
"""
    rl.jit.initialize()
    h = rl.jit.host()
    tm = llvm.Target.from_triple(h.triple).create_target_machine(cpu=h.cpu, features=h.features, opt=3)
    mod = llvm.parse_assembly(text)
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    peak = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64)(engine.get_function_address("peak"))
    best = float("inf")
    for _ in range(5):
        t0 = time.thread_time()
        peak(iterations)
        best = min(best, time.thread_time() - t0)
    return 2 * w * chains * iterations / best / 1e9


def _speed_note(rows: list[tuple], peak: float) -> str:
    """rlx-llvm against the direct SciPy call per Sgemm shape (≤ 1 is the bar), and 1024³ against the FMA peak."""
    med = {(case, name): (m, gf) for case, name, m, _, _, gf, _ in rows}
    parts = [f"{case.split()[1]} {med[(case, 'rlx-llvm')][0] / med[(case, 'scipy sgemm')][0]:.3f}"
             for case in dict.fromkeys(c for c, *_ in rows) if (case, "scipy sgemm") in med]
    top = med[("Sgemm 1024x1024x1024", "rlx-llvm")][1]
    return (f"  rlx-llvm / scipy sgemm (median time, ≤ 1): {', '.join(parts)}\n"
            f"  1024³ rlx-llvm {top:.1f} GFLOP/s = {100 * top / peak:.0f} % of the one-thread FMA peak {peak:.1f} GFLOP/s")


def _cpu_note(peak: float) -> str:
    """The one-thread ratios and 1024³'s share of the peak by calling-thread CPU time (robust to load)."""
    cpu = [f"{shape} {t['rlx-llvm'] / t['scipy sgemm']:.3f}" for shape, t in CPU_TIMED.items()]
    top = 2 * 1024 ** 3 / (CPU_TIMED["1024x1024x1024"]["rlx-llvm"] * 1e-3) / 1e9
    return (f"  one thread, calling-thread CPU time medians, rlx-llvm / scipy sgemm (≤ 1): {', '.join(cpu)}\n"
            f"  1024³ rlx-llvm by CPU time {top:.1f} GFLOP/s = {100 * top / peak:.0f} % of the one-thread FMA peak")


def _blas_note(rows: list[tuple]) -> str:
    """rlx-llvm's BLAS call against the direct SciPy call, per Sgemm shape (same run)."""
    med = {(case, name): m for case, name, m, *_ in rows}
    parts = [f"{case.split()[1]} {med[(case, 'rlx-llvm, BLAS call')] / med[(case, 'scipy sgemm')]:.3f}"
             for case in dict.fromkeys(c for c, *_ in rows) if (case, "scipy sgemm") in med]
    return "  rlx-llvm BLAS call / direct scipy sgemm (median time): " + ", ".join(parts)


def _crossing_note(rows: list[tuple]) -> str:
    med = {name: m for case, name, m, *_ in rows if case == "native->Python crossing"}
    native, mixed, one = (med["[gemm, gemm] one segment"], med["[gemm, sort, gemm] two segments + fallback"],
                          med["[gemm]"])
    return (f"  crossing: a 1-element SortF32 fallback between two native GEMMs adds {1e3 * (mixed - native):.1f} µs "
            f"(native segment call + fallback frame); a second GEMM in the same segment adds "
            f"{1e3 * (native - one):.1f} µs")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="blocks per implementation (rotating order)")
    ap.add_argument("--block-ms", type=float, default=150.0, help="approximate work per timed block")
    ap.add_argument("--threads", default="1,2", help="thread counts to run, comma-separated")
    args = ap.parse_args()
    torch, _ = _torch()
    print(f"{common.cpu_model()} ({common.cpu_name()}), {common.cores()}; {common.python_facts()}")
    print(f"numpy {np.__version__}, scipy {scipy.__version__}, torch {torch.__version__ if torch else 'absent'}; "
          f"OpenBLAS threads before the run: {get_num_threads()}")
    peak = fma_peak_gflops()
    print(f"one-thread f32 FMA peak (register-tile chains, thread CPU time): {peak:.1f} GFLOP/s")
    print("medians of pool-by-pool rounds; 'x rlx time' = implementation median / rlx-llvm median (same run)\n")
    for threads in (int(x) for x in args.threads.split(",")):
        rows = run_threads(threads, args.rounds, args.block_ms)
        print(_table(threads, rows))
        print(_checks_note(rows))
        print(_speed_note(rows, peak))
        if threads == 1:
            print(_cpu_note(peak))
        print(_blas_note(rows))
        print(_crossing_note(rows))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
