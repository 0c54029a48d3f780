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

from .. import thunks as T
from ..registry import family_names, thunk_class
from ..thunks import Thunk

# `fn(arena: np.ndarray[uint8], thunk)` by thunk class, like the lowering registry.
REFERENCES: dict[type[Thunk], Callable] = {}

# Every module that registers references: one per emitter family of `registry.FAMILIES` (Nop's is here).
FAMILIES = tuple(f"{__name__}.{name}" for name in family_names() if name != "nop")


def reference(*classes: type[Thunk]) -> Callable:
    """Decorator: register a NumPy implementation for thunk classes (`@reference(T.Sgemm)`)."""
    if not classes:
        raise TypeError("name at least one thunk class")
    checked = [thunk_class(c, "references") for c in classes]

    def deco(fn: Callable) -> Callable:
        for cls in checked:
            if cls in REFERENCES:
                raise RuntimeError(f"{cls.__name__} has two references")
            REFERENCES[cls] = fn
        return fn
    return deco


def load_all() -> None:
    """Import every reference family module (each registers its references)."""
    for name in FAMILIES:
        importlib.import_module(name)


def run_thunk(arena: np.ndarray, thunk: Thunk, rng=None) -> None:
    """Execute one thunk with its NumPy reference (`rng`: the schedule's RngOptions, for the RNG kinds)."""
    load_all()
    fn = REFERENCES.get(type(thunk))
    if fn is None:
        raise NotImplementedError(f"no NumPy reference for {type(thunk).__name__}")
    if rng is not None and getattr(fn, "reads_rng_policy", False):
        fn(arena, thunk, rng)
    else:
        fn(arena, thunk)


def run(schedule, arena) -> None:
    """Execute a whole schedule with the NumPy references, in order, on `arena`."""
    buf = arena.bytes if hasattr(arena, "bytes") else arena
    for t in schedule.thunks:
        run_thunk(buf, t, getattr(schedule, "rng", None))


def view(arena: np.ndarray, offset: int, dtype, count: int) -> np.ndarray:
    """`count` elements of `dtype` at byte `offset` (a writable view)."""
    dt = np.dtype(dtype)
    return arena[offset:offset + count * dt.itemsize].view(dt)


def read_f64(arena: np.ndarray, offset: int, count: int) -> np.ndarray:
    """`count` f32 elements at byte `offset`, as a float64 copy."""
    return view(arena, offset, np.float32, count).astype(np.float64)


def write_f32(arena: np.ndarray, offset: int, values: np.ndarray) -> None:
    """Round `values` to f32 and store them, flattened, at byte `offset`."""
    view(arena, offset, np.float32, values.size)[:] = values.reshape(-1).astype(np.float32)


@reference(T.Nop)
def nop(arena: np.ndarray, t) -> None:
    """Nothing."""
