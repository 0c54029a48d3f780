"""Old home of the thread count native code reads; it now lives in `kernels.pool` (rlx_llvm's own
thread pool, docs/runtime.md).  These names stay importable from here.  libgomp is loaded only for
A/B runs under `RLX_LLVM_RUNTIME=gomp` (`ir_emit.parallel.register_runtime`)."""
from __future__ import annotations

from .pool import MAX_THREADS, NUM_THREADS, get_threads, register_runtime, set_threads  # noqa: F401
