"""Sentence embeddings in Ray Data: a class UDF whose actors each load the encoder once.

    import ray
    from rlx_llvm.models.ray import EncoderUDF
    ds = ray.data.from_items([{"text": t} for t in texts])
    out = ds.map_batches(EncoderUDF, fn_constructor_kwargs={"column": "text"},
                         concurrency=2, num_cpus=1, batch_size=256)
    vectors = np.stack(out.to_pandas()["embedding"])     # or `embed(ds, column="text", concurrency=2)`

Needs the `ray` extra (`pip install 'rlx-llvm[ray]'`).  Ray workers are fresh processes (no fork: safe
with every thread runtime); each actor runs with as many native threads as the CPUs Ray
assigned it (`num_cpus`), so threads × actors never exceed the cluster's cores.
docs/embedding.md, "Scale-out: Dask and Ray", has the multi-machine setup.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .sentence import SentenceEncoder
from .workers import encoder_args, use_threads, worker_encoder


class EncoderUDF:
    """`ds.map_batches(EncoderUDF, concurrency=N, ...)`: adds `output_column` (float32 vectors) to each
    batch, embedding the texts of `column`.  The encoder is loaded once per actor; `model` as in
    `models.dask.embed`; `threads` native threads (default: the CPUs Ray assigned the actor)."""

    def __init__(self, model: "SentenceEncoder | str | Path | None" = None, column: str = "text",
                 output_column: str = "embedding", threads: int | None = None, batch_size: int = 32) -> None:
        self.column, self.output_column, self.batch_size = column, output_column, batch_size
        threads = threads or _assigned_cpus()
        if isinstance(model, SentenceEncoder):   # unpickled in this actor: already loaded
            use_threads(threads)
            self.encoder = model
        else:
            self.encoder = worker_encoder(encoder_args(model), threads)

    def __call__(self, batch: Any) -> Any:
        """A batch (dict of NumPy arrays, or a pandas DataFrame) with the vectors added."""
        if self.column not in batch:
            raise KeyError(f"column {self.column!r} is not in the batch (columns: {', '.join(map(str, batch))})")
        vectors = self.encoder.embed([str(t) for t in batch[self.column]], batch_size=self.batch_size)
        if isinstance(batch, dict):
            return {**batch, self.output_column: vectors}
        return batch.assign(**{self.output_column: list(vectors)})


def embed(ds: Any, column: str = "text", model: "SentenceEncoder | str | Path | None" = None, *,
          concurrency: int = 2, threads_per_actor: int = 1, batch_size: int = 256) -> Any:
    """`ds` with an "embedding" column: `map_batches(EncoderUDF)` on a pool of `concurrency` actors of
    `threads_per_actor` CPUs each (`batch_size` rows per Ray batch), one batch in flight per actor."""
    import ray.data
    # Ray Data queues up to 4 batches on an actor by default: the first actor ready took both batches of a
    # 2-batch job while the other sat idle (3 000 texts on 2 actors ran at 0.81x one process).
    pool = ray.data.ActorPoolStrategy(size=concurrency, max_tasks_in_flight_per_actor=1)
    return ds.map_batches(EncoderUDF, fn_constructor_kwargs={"model": model, "column": column,
                                                              "threads": threads_per_actor},
                          compute=pool, num_cpus=threads_per_actor, batch_size=batch_size,
                          batch_format="numpy")


def _assigned_cpus() -> int | None:
    """CPUs Ray assigned this actor (None outside Ray)."""
    try:
        import ray
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:  # not in a Ray worker
        return None
    return max(1, int(cpus)) if cpus else None
