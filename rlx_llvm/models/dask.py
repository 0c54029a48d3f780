"""Sentence embeddings of a Dask DataFrame column or Bag of texts, one encoder per worker process.

    from dask.distributed import Client, LocalCluster
    from rlx_llvm.models import dask as rlx_dask
    client = Client(LocalCluster(n_workers=2, threads_per_worker=1))
    vectors = rlx_dask.embed(ddf, column="text").compute()       # float32 [len(ddf), 384], rows aligned

Needs the `dask` extra (`pip install 'rlx-llvm[dask]'`).  Each task carries the model's load arguments;
each worker process loads the model once (`models.workers`) and runs its partitions with as many
native threads as the Dask worker has threads (the cores it was given), so threads × workers never
exceed the cluster's cores.  Dask's nanny starts workers with `spawn` (its default; keep
`distributed.worker.multiprocessing-method` at spawn: libgomp, RLX_LLVM_RUNTIME=gomp, is not fork-safe).
docs/embedding.md, "Scale-out: Dask and Ray", has the multi-machine setup.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .sentence import SentenceEncoder
from .workers import encoder_args, worker_encoder


def embed(data: Any, column: str | None = None, model: "SentenceEncoder | str | Path | None" = None, *,
          threads_per_worker: int | None = None, batch_size: int = 32) -> Any:
    """Embeddings of `data`'s texts, computed in the workers: a Dask DataFrame's `column` (or a Dask
    Series) gives a Dask Array [n, dim] (one chunk per partition, rows aligned with the input); a
    Dask Bag of strings gives a Bag of vectors, one per text.

    `model`: a SentenceEncoder (its load arguments are sent, not the encoder), a model directory, or
    None for the installed all-MiniLM-L6-v2.  `threads_per_worker`: native threads per worker
    process (default: the Dask worker's own thread count)."""
    import dask.bag as db
    import dask.dataframe as dd
    if threads_per_worker is not None and (isinstance(threads_per_worker, bool) or threads_per_worker < 1):
        raise ValueError(f"threads_per_worker must be a positive int, got {threads_per_worker!r}")
    args = encoder_args(model)
    if isinstance(data, db.Bag):
        return data.map_partitions(_embed_list, args, threads_per_worker, batch_size)
    if isinstance(data, dd.DataFrame):
        if column is None or column not in data.columns:
            raise KeyError(f"column {column!r} is not in the DataFrame (columns: {', '.join(map(str, data.columns))})")
        data = data[column]
    if not isinstance(data, dd.Series):
        raise TypeError(f"embed needs a Dask DataFrame, Series or Bag, got {type(data).__name__}")
    return data.map_partitions(_embed_partition, args, threads_per_worker, batch_size,
                               meta=np.empty((0, 0), np.float32))


def _embed_partition(texts: Sequence[str], args: dict, threads: int | None, batch_size: int) -> np.ndarray:
    """One partition's vectors [len(texts), dim], on this worker's encoder."""
    encoder = worker_encoder(args, threads or _worker_threads())
    return encoder.embed([str(t) for t in texts], batch_size=batch_size)


def _embed_list(texts: Sequence[str], args: dict, threads: int | None, batch_size: int) -> list[np.ndarray]:
    return list(_embed_partition(list(texts), args, threads, batch_size))


def _worker_threads() -> int | None:
    """The Dask worker's thread count (the cores it was given); None outside a distributed worker."""
    try:
        from distributed import get_worker
        return get_worker().state.nthreads
    except (ImportError, ValueError, AttributeError):
        return None
