"""The lowering registry: thunk class → how it runs (an LLVM emitter or a Python fallback).

Family modules register with `@lowering(T.LayerNorm, ...)` (native code) or `@fallback(T.SvdF32)`
(NumPy/SciPy on arena views).  `FAMILIES` is the one list of those modules; `load_all()` imports
them.  This module imports nothing of `ir_emit` or `kernels`, so both can depend on it.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from .thunks import ALL_THUNKS, Thunk

PATHS = ("llvm", "blas", "scipy", "c", "python")  # "c"/"python": a CustomOp's registered kernel
NATIVE_PATHS = ("llvm", "blas", "llvm|blas", "llvm|c|python")  # "llvm|blas": IR tiles or a BLAS call, chosen by size

# Every module that registers lowerings, in import order: the IR emitter families, then the fallbacks.
FAMILIES = tuple(f"rlx_llvm.ir_emit.{name}" for name in (
    "nop", "region", "elementwise", "casts", "movement", "indexing", "norms", "reductions", "losses",
    "gemm", "linalg", "attention", "fused_layers", "activation_backward", "conv", "norms_backward",
    "qgemm",
    "gguf",
    "scaled",
    "quantize",
    "dequant",
    "ssm",
    "control",
    "mlx",
    "recurrent",
    "fft",
    "custom_op",
    "rng",
    "splat",
    "attention_backward",
)) + ("rlx_llvm.kernels.fallbacks",)


@dataclass(frozen=True)
class Lowering:
    """How one thunk kind runs.

    `emit(ctx, thunk)` writes native code (paths `llvm`, `blas`); `run(arena_bytes, thunk)` is a
    Python fallback on NumPy views of the arena (path `scipy`).  `check(thunk)` adds validation
    beyond field ranges and extents.  `inplace` lets a write extent coincide exactly with a read
    extent (element-wise kernels read each element before writing it).  `shared_body` lets
    thunks that differ only in buffer offsets share one compiled body (`ir_emit.shared_bodies`):
    the emitter must reach the arena only through `ctx.addr`/`load`/`store` and `ArenaRef`s.
    `path` is `llvm`, `blas`, `llvm|blas` (IR tiles or a BLAS call, chosen by size) or `scipy`;
    `Program.report()` shows which one each compiled thunk actually became.
    """

    cls: type[Thunk]
    path: str
    emit: Callable | None = None
    run: Callable | None = None
    check: Callable | None = None
    inplace: bool = False
    shared_body: bool = False

    @property
    def kind(self) -> str:
        """The thunk kind's name, e.g. `"LayerNorm"`."""
        return self.cls.__name__


LOWERINGS: dict[type[Thunk], Lowering] = {}

SHARED_BODY_KINDS = frozenset({
    "Copy", "CopyF64", "CopyI64", "ElementwiseRegion",
    # elementwise walks, activation backward
    "BinaryFull", "BinaryFullF64", "BinaryFullC64", "BiasAdd", "ActivationInPlace", "ActivationF64", "ActivationC64",
    "Compare", "Where", "Fma", "SgdMomentum", "ComplexNormSqF32", "ComplexNormSqBackwardF32", "ConjugateC64",
    "SplineActivation", "ReluBackward", "ReluBackwardF64", "ActivationBackward", "ActivationBackwardF64",
    # casts
    "CastF32ToI64", "CastF32ToF64", "CastF64ToF32", "CastF64ToI64", "CastF64ToI32", "CastF64ToBool", "CastI64ToI32",
    "CastI64ToF64", "CastI32ToF64", "CastF32ToF16", "CastF16ToF32", "CastF32ToBf16", "CastBf16ToF32", "CastF32ToI32",
    "CastI64ToF32", "CastBoolToI32", "CastBoolToF32", "CastF32ToBool", "CastI32ToF32", "CastI32ToI64", "CastI32ToBool",
    "CastI64ToBool", "CastBoolToI64", "CastGeneric", "RoundHalf",
    # movement, indexing, rotary
    "Narrow", "KvAppend", "Transpose", "TransposeF64", "Reverse", "Concat", "ConcatF64", "ResizeNearest2x",
    "Interpolate3d", "Im2Col", "Gather", "GatherAxis", "GatherNd", "GatherElements", "ScatterAdd", "ScatterNd",
    "ScatterElements", "GatherBackward", "Rope", "RopeBackward", "AxialRope2d", "FusedSwiGLU",
    # matrix products
    "Sgemm", "SgemmT", "Dgemm", "CgemmC64", "BatchedSgemm", "BatchedDgemmF64", "SgemmBf16", "SgemmF16", "SgemmHalf",
    "FusedMmBiasAct", "LoraMatMul", "Conv2D1x1", "GroupedMatMul", "SynthMatMul",
})
"""Kinds audited for shared bodies (their lowerings share bodies whatever their decorator says): they
reach the arena only through `ctx.addr`/`load`/`store`/`ArenaRef`, look at an offset's value only to
compare it for equality or overlap with another, or modulo a divisor of 64, and emit no `contract`/
`reassoc` float math, whose rounding LLVM may choose by what it proves about aliasing (so norms,
softmax, reductions, losses and quantization are not here; `ir_emit.shared_bodies`).  Repeated, they
cost a table row each (`codegen.TableRows`), not a function."""


def lowering(*classes: type[Thunk], path: str = "llvm", check: Callable | None = None, inplace: bool = False,
             shared_body: bool = False) -> Callable:
    """Decorator: register `emit(ctx, thunk)` as the native lowering of `classes`."""
    if path not in NATIVE_PATHS:
        raise ValueError(f"native path must be one of {NATIVE_PATHS}, not {path!r}")
    return _register(classes, path, check, inplace, native=True, shared_body=shared_body)


def fallback(*classes: type[Thunk], path: str = "scipy", check: Callable | None = None) -> Callable:
    """Decorator: register `run(arena_bytes, thunk)` as the Python fallback of `classes`."""
    return _register(classes, path, check, False, native=False)


def thunk_class(cls: object, what: str = "lowerings") -> type[Thunk]:
    """`cls` if it is one of the 196 thunk classes; anything else (a name, a stray class) is refused."""
    if isinstance(cls, type) and ALL_THUNKS.get(cls.__name__) is cls:
        return cls
    raise TypeError(f"{what} are registered for thunk classes (rlx_llvm.thunks), not {cls!r}")


def family_names() -> list[str]:
    """The emitter families of `FAMILIES` by short name (`"norms"`, …): `reference/` mirrors them."""
    prefix = "rlx_llvm.ir_emit."
    return [name[len(prefix):] for name in FAMILIES if name.startswith(prefix)]


def _register(classes, path, check, inplace, native, shared_body=False) -> Callable:
    if not classes:
        raise TypeError("name at least one thunk class")
    classes = [thunk_class(c) for c in classes]

    def deco(fn: Callable) -> Callable:
        for cls in classes:
            if cls in LOWERINGS:
                raise RuntimeError(f"{cls.__name__} registered twice")
            LOWERINGS[cls] = Lowering(cls, path, emit=fn if native else None, run=None if native else fn,
                                      check=check, inplace=inplace,
                                      shared_body=shared_body or cls.__name__ in SHARED_BODY_KINDS)
        return fn
    return deco


def load_all() -> None:
    """Import every family module, so that each registers its lowerings."""
    for name in FAMILIES:
        importlib.import_module(name)


def lowering_of(thunk: Thunk) -> Lowering | None:
    """The lowering of a thunk instance (`None` when its kind has none)."""
    load_all()
    return LOWERINGS.get(type(thunk))
