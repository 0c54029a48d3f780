"""rlx_llvm — run RLX CPU thunk schedules as native code, JIT-compiled with LLVM at run time.

    import rlx_llvm as rl
    from rlx_llvm import thunks as T
    arena = rl.Arena(1 << 20)
    prog = rl.compile(rl.ThunkSchedule([T.Copy(src=0, dst=4096, len=1024)], arena_bytes=arena.nbytes))
    prog.run(arena)
"""
from __future__ import annotations

from . import onnx, ops, thunks
from .arena import Arena
from .coverage import coverage
from .custom_ops import register_custom_op, registered_custom_ops, unregister_custom_op
from .dtypes import DType, HalfKind, LaneKind
from .errors import ExecutionError, RlxError, UnsupportedThunkError, ValidationError
from .ops import (Activation, AttentionBwdWrt, BinaryOp, ChainOperand, ChainStep, CmpOp, MaskKind,
                  QuantScheme, ReduceOp, RngBackend, RngOptions, ScaledFormat, ScaleLayout, ScaleMode,
                  ScatterNdReduction, SteKind)
from .kernels.threads import get_num_threads, set_num_threads
from .limits import LimitError, set_max_memory
from .graph import CompiledGraph, Graph, GraphError, Session, Value, grad
from .program import Program, compile
from .schedule import ThunkSchedule

__version__ = "0.1.0"

__all__ = ["Arena", "Program", "ThunkSchedule", "compile", "coverage", "thunks", "ops",
           "Graph", "Session", "CompiledGraph", "Value", "GraphError", "grad",
           "set_num_threads", "get_num_threads", "register_custom_op", "unregister_custom_op", "registered_custom_ops",
           "RlxError", "ValidationError", "UnsupportedThunkError", "ExecutionError", "LimitError", "set_max_memory",
           "DType", "LaneKind", "HalfKind", "Activation", "AttentionBwdWrt", "BinaryOp", "ChainOperand",
           "ChainStep", "CmpOp", "MaskKind", "QuantScheme", "ReduceOp", "RngBackend", "RngOptions",
           "ScaledFormat", "ScaleLayout", "ScaleMode", "ScatterNdReduction", "SteKind", "__version__"]
