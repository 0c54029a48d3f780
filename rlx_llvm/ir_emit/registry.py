"""The lowering registry: thunk kind → how it runs (an LLVM emitter or a Python fallback)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

PATHS = ("llvm", "blas", "scipy")


@dataclass(frozen=True)
class Lowering:
    """How one thunk kind runs.

    `emit(ctx, thunk)` writes native code (paths `llvm`, `blas`); `run(arena_bytes, thunk)` is a
    Python fallback on NumPy views of the arena (path `scipy`).  `check(thunk)` adds validation
    beyond field ranges and extents.  `inplace` lets a write extent coincide exactly with a read
    extent (element-wise kernels read each element before writing it).  `shared_body` lets
    thunks that differ only in buffer offsets share one compiled body (`ir_emit.shared`): the
    emitter must reach the arena only through `ctx.addr`/`load`/`store` and `ArenaRef`s.
    """

    kind: str
    path: str
    emit: Callable | None = None
    run: Callable | None = None
    check: Callable | None = None
    inplace: bool = False
    shared_body: bool = False


LOWERINGS: dict[str, Lowering] = {}


def lowering(*classes, path: str = "llvm", check: Callable | None = None, inplace: bool = False,
             shared_body: bool = False) -> Callable:
    """Decorator: register `emit(ctx, thunk)` as the native lowering of `classes`."""
    assert path in ("llvm", "blas")
    return _deco(classes, path, check, inplace, native=True, shared_body=shared_body)


def fallback(*classes, path: str = "scipy", check: Callable | None = None) -> Callable:
    """Decorator: register `run(arena_bytes, thunk)` as the Python fallback of `classes`."""
    return _deco(classes, path, check, False, native=False)


def _deco(classes, path, check, inplace, native, shared_body=False):
    def deco(fn: Callable) -> Callable:
        for cls in classes:
            name = cls if isinstance(cls, str) else cls.__name__
            if name in LOWERINGS:
                raise RuntimeError(f"{name} registered twice")
            LOWERINGS[name] = Lowering(name, path, emit=fn if native else None,
                                       run=None if native else fn, check=check, inplace=inplace,
                                       shared_body=shared_body)
        return fn
    return deco
