"""Which lowering path every one of the 196 thunk kinds takes."""
from __future__ import annotations


def coverage() -> dict[str, str]:
    """`{kind: "llvm" | "blas" | "scipy" | "missing"}` over every thunk kind, in seed order.

    `blas` means "IR tiles or a BLAS call, chosen by size": a GEMM-family kind registered as `blas`
    runs its small sizes as IR register tiles; `Program.report()` shows which one a compiled thunk
    became.
    """
    from . import registry
    from .thunks import ALL_THUNKS
    registry.load_all()
    return {kind: (registry.LOWERINGS[cls].path if cls in registry.LOWERINGS else "missing")
            for kind, cls in ALL_THUNKS.items()}
