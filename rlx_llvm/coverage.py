"""Which lowering path every one of the 196 thunk kinds takes."""
from __future__ import annotations


def coverage() -> dict[str, str]:
    """`{kind: "llvm" | "blas" | "scipy" | "missing"}` over every thunk kind, in seed order."""
    from .ir_emit import load_all, registry
    from .thunks import ALL_THUNKS
    load_all()
    return {kind: (registry.LOWERINGS[kind].path if kind in registry.LOWERINGS else "missing")
            for kind in ALL_THUNKS}
