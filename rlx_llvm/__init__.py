"""rlx_llvm — run RLX CPU thunk schedules as native code, JIT-compiled with LLVM at run time.

    import rlx_llvm as rl
    from rlx_llvm import thunks as T
    arena = rl.Arena(1 << 20)
    prog = rl.compile(rl.ThunkSchedule([T.Copy(src=0, dst=4096, len=1024)], arena_bytes=arena.nbytes))
    prog.run(arena)
"""
from __future__ import annotations

import importlib

from .coverage import coverage  # eager (it is cheap): the function must shadow its module's name
from .errors import ExecutionError, RlxError, UnsupportedThunkError, ValidationError

# Everything else loads on first use (PEP 562): `import rlx_llvm` stays cheap, and LLVM, the
# thunk classes, the graph API and the ONNX importer load when a name from them is first touched.
_LAZY = {
    **{name: "ops" for name in (
        "Activation", "AttentionBwdWrt", "BinaryOp", "ChainOperand", "ChainStep", "CmpOp", "MaskKind",
        "QuantScheme", "ReduceOp", "RngBackend", "RngOptions", "ScaledFormat", "ScaleLayout", "ScaleMode",
        "ScatterNdReduction", "SteKind")},
    **{name: "dtypes" for name in ("DType", "HalfKind", "LaneKind")},
    **{name: "custom_ops" for name in ("register_custom_op", "registered_custom_ops", "unregister_custom_op")},
    **{name: "graph" for name in ("CompiledGraph", "Graph", "GraphError", "Session", "Value", "grad")},
    **{name: "kernels.threads" for name in ("get_num_threads", "set_num_threads")},
    **{name: "limits" for name in ("LimitError", "set_max_memory")},
    "Arena": "arena", "Program": "program", "compile": "program",
    "ThunkSchedule": "schedule",
}
_SUBMODULES = {"onnx", "ops", "thunks"}


def __getattr__(name: str):
    """Import what `name` lives in (or the submodule `name`) on first use; keep it as an attribute."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    else:
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)


__version__ = "0.1.0"

__all__ = ["Arena", "Program", "ThunkSchedule", "compile", "coverage", "thunks", "ops",
           "Graph", "Session", "CompiledGraph", "Value", "GraphError", "grad",
           "set_num_threads", "get_num_threads", "register_custom_op", "unregister_custom_op", "registered_custom_ops",
           "RlxError", "ValidationError", "UnsupportedThunkError", "ExecutionError", "LimitError", "set_max_memory",
           "DType", "LaneKind", "HalfKind", "Activation", "AttentionBwdWrt", "BinaryOp", "ChainOperand",
           "ChainStep", "CmpOp", "MaskKind", "QuantScheme", "ReduceOp", "RngBackend", "RngOptions",
           "ScaledFormat", "ScaleLayout", "ScaleMode", "ScatterNdReduction", "SteKind", "__version__"]
