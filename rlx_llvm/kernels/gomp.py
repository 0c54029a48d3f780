"""libgomp and the thread count rlx_llvm's own parallel loops read at run time (no IR here).

The thread count is a process-wide `int32` that native code reads at run time
(`@rlx_num_threads`, set by `rlx_llvm.set_num_threads`), so changing it needs no recompile.
It is capped at compile time by `MAX_THREADS` (the machine's cores), which sizes per-thread scratch.
GNU OpenMP is not fork-safe: do not fork after the first parallel run (docs/architecture.md).
`ir_emit.parallel` emits the loops that use it.
"""
from __future__ import annotations

import ctypes
import os

import llvmlite.binding as llvm

MAX_THREADS = max(1, os.cpu_count() or 1)
NUM_THREADS = ctypes.c_int32(MAX_THREADS)  # what @rlx_num_threads points at
_registered = False


def register_runtime() -> None:
    """Load libgomp and publish `rlx_num_threads` to the JIT's symbol table (idempotent)."""
    global _registered
    if _registered:
        return
    try:  # the soname first: find_library forks ldconfig (~10 ms)
        llvm.load_library_permanently("libgomp.so.1")
    except RuntimeError:
        from ctypes.util import find_library  # imports subprocess: only on this fallback
        llvm.load_library_permanently(find_library("gomp") or "libgomp.so.1")
    llvm.add_symbol("rlx_num_threads", ctypes.addressof(NUM_THREADS))
    _registered = True


def set_threads(n: int) -> None:
    """Threads rlx_llvm's own parallel loops use from now on (capped at MAX_THREADS)."""
    NUM_THREADS.value = max(1, min(int(n), MAX_THREADS))


def get_threads() -> int:
    """Threads rlx_llvm's own parallel loops use."""
    return int(NUM_THREADS.value)
