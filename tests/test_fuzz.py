"""Malformed schedules get a clean error and never crash — fuzzed from every example, in a subprocess.

The child process walks `rlx_llvm.testing`'s examples round-robin and mutates each a few times (evil
integers, wrong types and enums, shifted offsets, wrong arena sizes).  A mutant must be refused with a
ValidationError / UnsupportedThunkError, or compile and run (an ExecutionError is a clean refusal too)
without writing a byte outside its declared outputs.  A segfault kills only the child, and fails the test.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import rlx_llvm as rl
from rlx_llvm import testing

SEED, MUTANTS_PER_EXAMPLE = 20261203, 20

FUZZ = textwrap.dedent('''
    import dataclasses, json, random, sys
    import numpy as np
    import rlx_llvm as rl
    from rlx_llvm import testing
    from rlx_llvm.ops import Activation, BinaryOp, CmpOp, ReduceOp

    rng = random.Random(int(sys.argv[1]))
    EVIL_INTS = [0, 1, 3, 7, 8, 63, 64, 1023, 1024, 4095, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1,
                 2**64, -1, -2**31]
    EVIL_OTHER = [None, "F32", 1.5, float("nan"), True, BinaryOp.Add, Activation.Gelu, CmpOp.Lt, ReduceOp.Max, (),
                  (1, 2, 3), (2**32,), [0] * 17, object()]


    def mutant(base, nbytes):
        """`base` with one to three fields replaced by hostile values."""
        fields = [f.name for f in dataclasses.fields(base)]
        changes = {}
        for name in rng.sample(fields, k=min(len(fields), rng.choice([1, 1, 2, 3]))):
            cur = getattr(base, name)
            if isinstance(cur, bool) or not isinstance(cur, int) or rng.random() < 0.15:
                changes[name] = rng.choice(EVIL_OTHER + EVIL_INTS)
            else:
                near = [cur + d for d in (-8, -4, -1, 1, 4, 8, 64)] + [nbytes - 1, nbytes, nbytes + 1]
                changes[name] = rng.choice(EVIL_INTS + near)
        return dataclasses.replace(base, **changes)


    counts = dict(accepted=0, rejected=0, refused_at_run=0, construct_errors=0)
    kinds = set()
    for rnd in range(int(sys.argv[2])):
        for ex in testing.examples():
            if not any(dataclasses.fields(t) for t in ex.schedule.thunks):
                kinds |= ex.kinds   # nothing to mutate (Nop)
                continue
            nbytes = ex.schedule.arena_bytes
            base = rng.choice([t for t in ex.schedule.thunks if dataclasses.fields(t)])
            kinds.add(type(base).__name__)
            try:
                t = mutant(base, nbytes)
            except Exception:
                counts["construct_errors"] += 1
                continue
            sched = rl.ThunkSchedule([t], arena_bytes=rng.choice([nbytes, nbytes, 0, 64, nbytes // 2, nbytes * 4]))
            try:
                prog = rl.compile(sched, cache=False)
            except (rl.ValidationError, rl.UnsupportedThunkError):
                counts["rejected"] += 1
                continue
            arena = rl.Arena(sched.arena_bytes)
            arena.bytes[:] = np.random.default_rng(rng.getrandbits(32)).integers(0, 256, arena.nbytes, dtype=np.uint8)
            if arena.nbytes >= nbytes:
                ex.init(arena, np.random.default_rng(0))
            before = arena.bytes.copy()
            try:
                prog.run(arena)
            except rl.ExecutionError:
                counts["refused_at_run"] += 1
                continue
            keep = np.ones(arena.nbytes, dtype=bool)
            for ext in t.writes():
                keep[ext.offset:ext.end] = False
            assert not ((arena.bytes != before) & keep).any(), f"wrote outside its outputs: {t!r}"
            counts["accepted"] += 1
    print(json.dumps(dict(counts, kinds=sorted(kinds))))
''')


def run_fuzzer(seed: int, rounds: int) -> dict:
    """Run the fuzzer in a child process; its summary (counts and the kinds it mutated)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, RLX_LLVM_CACHE="0", PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", FUZZ, str(seed), str(rounds)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"fuzz subprocess died (rc={proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_fuzzed_thunks_never_crash_and_every_example_kind_is_fuzzed() -> None:
    summary = run_fuzzer(SEED, MUTANTS_PER_EXAMPLE)
    print({k: v for k, v in summary.items() if k != "kinds"})
    assert set(summary["kinds"]) == set().union(*(ex.kinds for ex in testing.examples()))
    assert summary["accepted"] > 0 and summary["rejected"] > 0
