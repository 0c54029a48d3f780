"""Which lowering path every one of the 196 thunk kinds takes."""
from __future__ import annotations


def coverage() -> dict[str, str]:
    """`{kind: "llvm" | "blas" | "llvm|blas" | "llvm|c|python" | "scipy" | "missing"}` over every kind, in seed order.

    `llvm|blas` means IR register tiles or a BLAS call, chosen by size (GEMM-based kinds); `llvm|c|python`
    is CustomOp, whose registered kernel is IR text, a C function or a Python callable;
    `Program.report()` shows which one each compiled thunk became.
    """
    from . import registry
    from .thunks import ALL_THUNKS
    registry.load_all()
    return {kind: (registry.LOWERINGS[cls].path if cls in registry.LOWERINGS else "missing")
            for kind, cls in ALL_THUNKS.items()}
