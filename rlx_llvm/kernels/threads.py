"""One knob for every native thread pool rlx_llvm's code runs on.

Two OpenBLAS pools live in the process: SciPy's (LP64, the one JIT code calls through
`kernels.blas`) and NumPy's (ILP64, used by NumPy/reference code).  `set_num_threads(n)` sets both
— through threadpoolctl when it is importable, otherwise through the libraries' own
`*openblas_set_num_threads*` symbols — and rlx_llvm's own parallel loops (`ir_emit.parallel` on
the pool of `kernels.pool`), so the three never ask for more than `n` cores between them.

BLAS never runs inside one of our parallel regions: `ir_emit.parallel` emits a region whose body
calls BLAS to run on the calling thread alone (OpenBLAS's pool cannot be sized per call), so
either our `n` threads or OpenBLAS's `n` threads are busy, never both (docs/runtime.md).  `blas_threads_at_most` narrows the pools for a
block of Python code that calls BLAS many times (AWQ calibration).

Default: rlx_llvm changes nothing until `set_num_threads` is called, so each OpenBLAS pool runs
with OpenBLAS's default — `OPENBLAS_NUM_THREADS` (or `OMP_NUM_THREADS`) when set, else one thread
per core (2 on the reference machine) — and rlx_llvm's own loops use every core.  The setting is
process-wide and lasts until the next call.
"""
from __future__ import annotations

import ctypes
import os
import threading
from contextlib import contextmanager
from typing import Iterator

from ..errors import RlxError

# Symbol spellings of the thread setters in the OpenBLAS builds we meet (scipy-openblas wheels
# prefix their exports; the ILP64 build adds a `64_` suffix).
_SETTERS = ("scipy_openblas_set_num_threads", "scipy_openblas_set_num_threads64_",
            "openblas_set_num_threads", "openblas_set_num_threads64_")
_GETTERS = ("scipy_openblas_get_num_threads", "scipy_openblas_get_num_threads64_",
            "openblas_get_num_threads", "openblas_get_num_threads64_")

_lock = threading.Lock()
_requested: int | None = None
_limiter = None  # threadpoolctl's limit object, kept so the limit stays applied


def _load_pools() -> None:
    """Make sure both OpenBLAS libraries are loaded (a pool that is not loaded cannot be set)."""
    import numpy  # noqa: F401  (NumPy's OpenBLAS is linked into its core)
    from . import blas  # noqa: F401  (SciPy's OpenBLAS, the one JIT code calls)


def _openblas_paths() -> list[str]:
    """Paths of every OpenBLAS shared library mapped into this process."""
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "openblas" in line and "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.exists(p))


def _symbol(lib: ctypes.CDLL, names: tuple[str, ...]):
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    return None


def _set_via_symbols(n: int) -> int:
    """Set every loaded OpenBLAS pool to `n` threads through its exported setter; returns how many."""
    count = 0
    for path in _openblas_paths():
        setter = _symbol(ctypes.CDLL(path), _SETTERS)
        if setter is not None:
            setter.argtypes, setter.restype = [ctypes.c_int], None
            setter(n)
            count += 1
    return count


def _get_via_symbols() -> dict[str, tuple[str, int]]:
    """`{library path: (getter symbol, threads)}` for every loaded OpenBLAS that exports a getter."""
    out = {}
    for path in _openblas_paths():
        lib = ctypes.CDLL(path)
        for name in _GETTERS:
            getter = getattr(lib, name, None)
            if getter is not None:
                getter.argtypes, getter.restype = [], ctypes.c_int
                out[path] = (name, int(getter()))
                break
    return out


def _set_via_threadpoolctl(n: int) -> bool:
    global _limiter
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return False
    _limiter = ThreadpoolController().limit(limits=n, user_api="blas")
    return True


def _set_own_threads(n: int) -> None:
    """rlx_llvm's own parallel loops (`kernels.pool`, read by the code `ir_emit.parallel` emits)."""
    from . import pool
    pool.set_threads(n)


def set_num_threads(n: int) -> None:
    """Use `n` threads in both OpenBLAS pools and in rlx_llvm's own parallel loops."""
    global _requested
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"set_num_threads needs a positive int, got {n!r}")
    with _lock:
        _load_pools()
        if not _set_via_threadpoolctl(n) and not _set_via_symbols(n):
            raise RlxError("found no OpenBLAS library to set the thread count of")
        _set_own_threads(n)
        _requested = n


def get_num_threads() -> int:
    """Threads of the LP64 OpenBLAS pool that JIT code calls (SciPy's)."""
    _load_pools()
    pools = _get_via_symbols()
    lp64 = [threads for name, threads in pools.values() if not name.endswith("64_")]
    if lp64:
        return lp64[0]
    if _requested is not None:
        return _requested
    return min((threads for _, threads in pools.values()), default=1)


def pool_threads() -> dict[str, int]:
    """`{library path: threads}` of every loaded OpenBLAS pool (for docs and tests)."""
    _load_pools()
    return {path: threads for path, (_, threads) in _get_via_symbols().items()}


@contextmanager
def blas_threads_at_most(n: int) -> Iterator[None]:
    """Within the block, every loaded OpenBLAS pool runs on at most `n` threads; after it, each pool
    gets its own count back (rlx_llvm's own loops are not touched)."""
    _load_pools()
    with _lock:
        before = _get_via_symbols()
        for path, (_, threads) in before.items():
            _set_one(path, min(n, threads))
    try:
        yield
    finally:
        with _lock:
            for path, (_, threads) in before.items():
                _set_one(path, threads)


def _set_one(path: str, n: int) -> None:
    setter = _symbol(ctypes.CDLL(path), _SETTERS)
    if setter is not None:
        setter.argtypes, setter.restype = [ctypes.c_int], None
        setter(n)
