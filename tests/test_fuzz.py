"""Malformed schedules get a ValidationError and never crash — run in a subprocess."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

FUZZ = textwrap.dedent('''
    import dataclasses, random, sys
    import numpy as np
    import rlx_llvm as rl
    from rlx_llvm.ops import Activation, BinaryOp
    from tests.examples import examples

    rng = random.Random(int(sys.argv[1]))
    EVIL_INTS = [0, 1, 3, 7, 8, 63, 64, 1023, 1024, 4095, 6143, 6144, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
                 2**63, 2**64 - 1, 2**64, -1, -2**31]
    EVIL_OTHER = [None, "F32", 1.5, True, BinaryOp.Add, Activation.Gelu, (), (1, 2, 3), [0] * 17, object()]
    accepted = rejected = construct_errors = 0
    seeds = examples()
    for trial in range(int(sys.argv[2])):
        base, nbytes = rng.choice(seeds)
        fields = [f.name for f in dataclasses.fields(base)]
        changes = {}
        for name in rng.sample(fields, k=min(len(fields), rng.choice([1, 1, 2, 3]))):
            cur = getattr(base, name)
            if isinstance(cur, bool) or not isinstance(cur, int) or rng.random() < 0.15:
                changes[name] = rng.choice(EVIL_OTHER + EVIL_INTS)
            else:
                changes[name] = rng.choice(EVIL_INTS + [cur + rng.choice([-8, -4, -1, 1, 4, 8, 1024])])
        try:
            t = dataclasses.replace(base, **changes)
        except Exception:
            construct_errors += 1
            continue
        sched = rl.ThunkSchedule([t], arena_bytes=rng.choice([nbytes, nbytes, 0, 64, nbytes * 4]))
        try:
            prog = rl.compile(sched, cache=False)
        except (rl.ValidationError, rl.UnsupportedThunkError):
            rejected += 1
            continue
        # Accepted: it must run, and leave every byte outside its declared outputs untouched.
        arena = rl.Arena(sched.arena_bytes)
        arena.bytes[:] = np.random.default_rng(trial).integers(0, 256, arena.nbytes, dtype=np.uint8)
        before = arena.bytes.copy()
        prog.run(arena)
        keep = np.ones(arena.nbytes, dtype=bool)
        for ext in t.writes():
            keep[ext.offset:ext.offset + ext.nbytes] = False
        assert not ((arena.bytes != before) & keep).any(), f"wrote outside its outputs: {t!r}"
        accepted += 1
    print(f"accepted {accepted}, rejected {rejected}, construction errors {construct_errors}")
''')


def test_fuzzed_thunks_never_crash():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, RLX_LLVM_CACHE="0", PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", FUZZ, "20261202", "1000"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"fuzz subprocess died (rc={proc.returncode}):\\n{proc.stderr[-3000:]}"
    assert "rejected" in proc.stdout
    print(proc.stdout)
