"""SelectiveScan and Mamba2 at one thread against a memory-bandwidth bound and a compute bound (issue 12).

    cd /work/main && PYTHONPATH=. python benchmarks/bench_ssm.py [--rounds 9] [--seq 2048] [--hidden 1536] [--n 16]
        [--heads 24 --head-dim 64 --mamba-n 64] [--against <git rev>]

* **Bandwidth bound**: a scan must read its inputs and write y once — SelectiveScan
  `4·(3·b·s·d + d·n + 2·b·s·n)` bytes, Mamba2 `4·(2·b·s·h·p + b·s·h + h + 2·b·s·h·n)` — so it cannot beat
  moving those bytes at the machine's memory bandwidth, measured in the same rounds as `np.copyto` between two
  64 MiB buffers (above any L3): (bytes read + written) ÷ its time.  (A copy pays the same write-allocate
  read of its destination as the scan's y.)
* **Compute bound** (SelectiveScan): one exp per state update, `b·s·d·n` of them, at the best rate this host's
  vector exp reaches — `exp2_decay`'s fast path (what the scan uses) in a loop that only computes exps of
  register-resident arguments, timed in the same run (`vecmath.exp` is shown beside it).  The scan also
  needs the update's multiply and two fmas, so this bound is not reachable either; it shows what limits.
* Both kernels are checked against the float64 NumPy reference before they are timed.  Medians of the calling
  thread's CPU time (`time.thread_time`) and of wall time, interleaved rounds.  At 2 threads the wall time and
  the calling thread's CPU time (its share of the work: about half when the split is even) are shown.
* `--against REV` loads the ssm emitter of git revision REV beside the current one (same process, same rounds)
  and reports both — the before/after of an emitter change.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.pin_threads(1)

import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from rlx_llvm import jit, reference, registry  # noqa: E402
from rlx_llvm import thunks as T  # noqa: E402
from rlx_llvm.ir_emit import ssm, vecmath  # noqa: E402
from rlx_llvm.ir_emit.toolkit import F32, I64, const  # noqa: E402
from rlx_llvm.kernels.threads import set_num_threads  # noqa: E402
from bench_qgemm import cpu_timed  # noqa: E402  (per-call CPU time of the calling thread)

COPY_BYTES = 64 << 20
KINDS = (T.SelectiveScan, T.Mamba2)
SSM_KINDS = KINDS + (T.GatedDeltaNet, T.GatedDeltaNetBackward)   # everything ssm.py registers


class Case:
    """One thunk in its own arena with random inputs, its reference output, and the bytes it must move."""

    def __init__(self, name: str, make: Callable[[list[int]], T.Thunk], arrays: list[np.ndarray], out: int,
                 moved: int) -> None:
        offs, top = [], 0
        for size in [a.size for a in arrays] + [out]:
            offs.append(top)
            top += -(-4 * size // 64) * 64
        self.name, self.moved, self.thunk = name, moved, make(offs)
        self.schedule = rl.ThunkSchedule([self.thunk], arena_bytes=top)
        self.arena = rl.Arena(top)
        for off, a in zip(offs, arrays):
            self.arena.write(off, a.astype(np.float32))
        want = rl.Arena.from_bytes(self.arena.bytes.copy())
        reference.run(self.schedule, want)
        self.out = slice(offs[-1], offs[-1] + 4 * out)
        self.want = want.bytes[self.out].view(np.float32).copy()

    def check(self, program: rl.Program) -> float:
        """Run once; the max error relative to max|reference| (asserted below 1e-4)."""
        program.run(self.arena)
        got = self.arena.bytes[self.out].view(np.float32)
        err = float(np.abs(got - self.want).max() / np.abs(self.want).max())
        assert err < 1e-4, (self.name, err)
        return err


def selective_scan(s: int, d: int, n: int) -> Case:
    """Batch 1: Δ ∈ [0.01, 0.5), A ∈ [−2, −0.2), normal x, B, C."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s * d), rng.uniform(0.01, 0.5, s * d), rng.uniform(-2, -0.2, d * n),
              rng.standard_normal(s * n), rng.standard_normal(s * n)]
    make = lambda o: T.SelectiveScan(x=o[0], delta=o[1], a=o[2], b=o[3], c=o[4], dst=o[5], batch=1, seq=s, hidden=d,
                                     state_size=n)
    return Case(f"SelectiveScan b=1 seq={s} hidden={d} n={n}", make, arrays, s * d, 4 * (3 * s * d + d * n + 2 * s * n))


def mamba2(s: int, h: int, p: int, n: int) -> Case:
    """Batch 1: dt ∈ [0.01, 0.5), a ∈ [−2, −0.2), normal x, b, c."""
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s * h * p), rng.uniform(0.01, 0.5, s * h), rng.uniform(-2, -0.2, h),
              rng.standard_normal(s * h * n), rng.standard_normal(s * h * n)]
    make = lambda o: T.Mamba2(x=o[0], dt=o[1], a=o[2], b=o[3], c=o[4], dst=o[5], batch=1, seq=s, heads=h, head_dim=p,
                              state_size=n)
    return Case(f"Mamba2 b=1 seq={s} heads={h} head_dim={p} n={n}", make, arrays, s * h * p,
                4 * (2 * s * h * p + s * h + h + 2 * s * h * n))


# ── the compute bound: exps per ns of a register-only loop ──────────────────

def exp_rate(decay: Callable[[ir.IRBuilder, ir.Value, ir.Value], ir.Value], rounds: int) -> float:
    """Exps per ns (median CPU time) of `decay(Δ, A)` on 16 loop-invariant vectors A and a Δ that changes
    every iteration, the results summed into 4 accumulators — no memory traffic, every exp independent."""
    lanes, iters = jit.host().lanes(), 20000
    vty = ir.VectorType(F32, lanes)
    module = ir.Module(name="exp_rate")
    module.triple = jit.host().triple
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64, ir.PointerType(F32), ir.PointerType(F32)]), "rate")
    count, params, out = fn.args
    entry, loop, done = (fn.append_basic_block(name) for name in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    vp = b.bitcast(params, ir.PointerType(vty))
    a = [b.load(b.gep(vp, [I64(k)]), align=4) for k in range(17)]
    b.branch(loop)
    b.position_at_end(loop)
    i, delta = b.phi(I64), b.phi(vty)
    accs = [b.phi(vty) for _ in range(4)]
    i.add_incoming(I64(0), entry)
    delta.add_incoming(a[16], entry)
    for acc in accs:
        acc.add_incoming(const(F32, 0.0, lanes), entry)
    step = b.fadd(delta, const(F32, 1e-7, lanes))
    new = list(accs)
    for k in range(16):
        new[k % 4] = b.fadd(new[k % 4], decay(b, step, a[k]))
    following = b.add(i, I64(1))
    for phi, value in zip([i, delta, *accs], [following, step, *new]):
        phi.add_incoming(value, b.block)
    b.cbranch(b.icmp_signed("<", following, count), loop, done)
    b.position_at_end(done)
    b.store(b.fadd(b.fadd(new[0], new[1]), b.fadd(new[2], new[3])), b.bitcast(out, ir.PointerType(vty)), align=4)
    b.ret_void()
    engine = jit.Engine()
    engine.load(jit.compile_ir(str(module)))
    run = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)(engine.address("rate"))
    args = np.concatenate([-np.linspace(0.3, 2.8, 16 * lanes), np.full(lanes, 0.1)]).astype(np.float32)
    sink = np.zeros(lanes, np.float32)
    times = []
    for _ in range(rounds):
        start = time.thread_time()
        run(iters, args.ctypes.data, sink.ctypes.data)
        times.append(time.thread_time() - start)
    return iters * 16 * lanes / statistics.median(times) / 1e9


# ── an older emitter beside the current one ──────────────────────────────────

def emitter_at(rev: str) -> dict:
    """The SelectiveScan / Mamba2 lowerings of `rlx_llvm/ir_emit/ssm.py` at git revision `rev`."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    source = subprocess.run(["git", "show", f"{rev}:rlx_llvm/ir_emit/ssm.py"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
    registry.load_all()
    current = {k: registry.LOWERINGS.pop(k) for k in SSM_KINDS}
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(source)
        name = "rlx_llvm.ir_emit._ssm_at_" + "".join(c for c in rev if c.isalnum())
        spec = importlib.util.spec_from_file_location(name, f.name)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return {k: registry.LOWERINGS[k] for k in KINDS}
    finally:
        registry.LOWERINGS.update(current)


def compiled(case: Case, lowerings: dict | None = None) -> rl.Program:
    """`case` compiled with the current lowerings, or with `lowerings` swapped in for the call."""
    if lowerings is None:
        return rl.compile(case.schedule)
    current = {k: registry.LOWERINGS[k] for k in KINDS}
    registry.LOWERINGS.update(lowerings)
    try:
        return rl.compile(case.schedule)
    finally:
        registry.LOWERINGS.update(current)


def at_threads(program: rl.Program, arena: rl.Arena, threads: int) -> Callable[[], None]:
    def run() -> None:
        set_num_threads(threads)
        program.run(arena)
        set_num_threads(1)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--mamba-n", type=int, default=64)
    ap.add_argument("--against", help="git revision whose ssm emitter is timed beside the current one")
    args = ap.parse_args()
    set_num_threads(1)
    cases = [selective_scan(args.seq, args.hidden, args.n), mamba2(args.seq, args.heads, args.head_dim, args.mamba_n)]
    older = emitter_at(args.against) if args.against else None
    fns, errors = {}, {}
    for case in cases:
        program = compiled(case)
        errors[case.name] = case.check(program)
        fns[case.name] = at_threads(program, case.arena, 1)
        fns[case.name + " @2"] = at_threads(program, case.arena, 2)
        if older:
            before = compiled(case, older)
            case.check(before)
            fns[case.name + " @" + args.against] = at_threads(before, case.arena, 1)
    src, dst = np.ones(COPY_BYTES // 4, np.float32), np.empty(COPY_BYTES // 4, np.float32)
    fns["copy"] = lambda: np.copyto(dst, src)
    cpu = {name: common.Timing() for name in fns}
    wall = common.interleaved({name: cpu_timed(fn, cpu[name].samples) for name, fn in fns.items()}, rounds=args.rounds)
    exps = {name: exp_rate(fn, args.rounds) for name, fn in
            (("exp2_decay", lambda b, d, a: ssm.exp2_decay(b, d, a, False)),
             ("vecmath.exp", lambda b, d, a: vecmath.exp(b, b.fmul(d, a))))}

    print(f"one thread unless marked, {common.cpu_name()}, load {common.load_average()}, {args.rounds} interleaved rounds")
    for clock, timing in (("cpu", cpu), ("wall", wall)):
        bandwidth = 2 * COPY_BYTES / (timing["copy"].median * 1e6)          # GB/s: read + written per second
        print(f"[{clock}] copy bandwidth {bandwidth:.1f} GB/s (np.copyto of {COPY_BYTES >> 20} MiB: "
              f"{timing['copy'].median:.2f} ms)")
        for case in cases:
            ours = timing[case.name].median
            bound = case.moved / (bandwidth * 1e6)                             # ms
            ratio = common.paired_ratio(timing[case.name], timing["copy"]) * timing["copy"].median / bound
            line = (f"  {case.name}: {ours:.2f} ms   bandwidth bound {bound:.2f} ms ({case.moved / 1e6:.1f} MB) "
                    f"-> {ratio:.2f}x the bound")
            two = timing[case.name + " @2"]
            if clock == "wall":
                line += (f"   2 threads {two.median:.2f} ms "
                         f"(1->2 speedup {1 / common.paired_ratio(two, timing[case.name]):.2f}x)")
            else:
                line += f"   2 threads: the calling thread's share {two.median:.2f} ms"
            if older:
                was = timing[case.name + " @" + args.against]
                line += (f"   {args.against}: {was.median:.2f} ms "
                         f"(now/then {common.paired_ratio(timing[case.name], was):.2f})")
            print(line)
    scan = cases[0]
    updates = scan.thunk.seq * scan.thunk.hidden * scan.thunk.state_size
    best = max(exps.values())
    floor = updates / best / 1e6
    print(f"compute bound of {scan.name}: {updates / 1e6:.1f} M exps / {best:.2f} exps/ns (exp2_decay alone, in "
          f"registers, CPU time) = {floor:.2f} ms; vecmath.exp {exps['vecmath.exp']:.2f} exps/ns")
    bandwidth = 2 * COPY_BYTES / (cpu["copy"].median * 1e6)
    twice = 2 * scan.moved / (bandwidth * 1e6)
    print(f"  2x the bandwidth bound = {twice:.2f} ms (CPU time) {'<' if twice < floor else '>='} the exps alone "
          f"{floor:.2f} ms: {'out of reach' if twice < floor else 'reachable'} at one thread with one exp per update; "
          f"ours / compute bound {cpu[scan.name].median / floor:.2f}x")
    print("max rel err vs the float64 reference: " + ", ".join(f"{name} {err:.1e}" for name, err in errors.items()))


if __name__ == "__main__":
    main()
