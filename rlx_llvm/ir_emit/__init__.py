"""LLVM IR emitters: one module per thunk family, registered in `registry`.

Importing this package imports every family module, which fills `registry.LOWERINGS`.
"""

import importlib

FAMILIES = ("nop", "region", "elementwise", "casts", "movement", "indexing", "norms", "reductions", "losses", "gemm", "linalg", "attention", "fused_layers", "backward", "conv", "norms_backward")


def load_all() -> None:
    """Import every family module so that each registers its lowerings."""
    for name in FAMILIES:
        importlib.import_module(f"{__name__}.{name}")
