"""NumPy reference implementations of every lowered thunk — the oracle for tests and for users.

    import rlx_llvm.reference as ref
    ref.run(schedule, arena)          # executes the whole schedule in NumPy, on the same arena

Each family module registers `fn(arena: np.ndarray[uint8], thunk)` under the thunk's kind.  The
references follow RLX's Rust semantics (NaN-ignoring max/min, half-away-from-zero Round,
saturating float→int casts, RNE halves) and favour clarity over speed.
"""
from __future__ import annotations

import importlib
from typing import Callable

import numpy as np

REFERENCES: dict[str, Callable] = {}

FAMILIES = ("region", "casts", "elementwise", "movement", "indexing", "norms", "reductions", "losses", "gemm", "linalg", "attention", "fused_layers", "activation_backward", "conv", "norms_backward")


def reference(*kinds: str) -> Callable:
    """Decorator: register a NumPy implementation for thunk kinds."""
    def deco(fn: Callable) -> Callable:
        for k in kinds:
            REFERENCES[k] = fn
        return fn
    return deco


def load_all() -> None:
    """Import every reference family module."""
    for name in FAMILIES:
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:  # a family not written yet
            if exc.name != f"{__name__}.{name}":
                raise


def run_thunk(arena: np.ndarray, thunk) -> None:
    """Execute one thunk with its NumPy reference."""
    load_all()
    fn = REFERENCES.get(type(thunk).__name__)
    if fn is None:
        raise NotImplementedError(f"no NumPy reference for {type(thunk).__name__}")
    fn(arena, thunk)


def run(schedule, arena) -> None:
    """Execute a whole schedule with the NumPy references, in order, on `arena`."""
    buf = arena.bytes if hasattr(arena, "bytes") else arena
    for t in schedule.thunks:
        if type(t).__name__ != "Nop":
            run_thunk(buf, t)


def view(arena: np.ndarray, offset: int, dtype, count: int) -> np.ndarray:
    """`count` elements of `dtype` at byte `offset` (a writable view)."""
    dt = np.dtype(dtype)
    return arena[offset:offset + count * dt.itemsize].view(dt)


@reference("Nop")
def nop(arena: np.ndarray, t) -> None:
    """Nothing."""
