"""Sentence embeddings in Ray Data: `embed(ds)`, or a class UDF whose actors each load the encoder once.

    import ray
    from rlx_llvm.models.ray import EncoderUDF, embed
    ds = ray.data.from_items([{"text": t} for t in texts])
    out = embed(ds, column="text", concurrency=2)              # adds an "embedding" column
    vectors = np.concatenate([b["embedding"] for b in out.iter_batches(batch_size=None, batch_format="numpy")])
    out = ds.map_batches(EncoderUDF, fn_constructor_kwargs={"column": "text"},
                         concurrency=2, num_cpus=1, batch_size=256)          # the same on an actor pool

Needs the `ray` extra (`pip install 'rlx-llvm[ray]'`).  `embed` runs Ray Data tasks: each of Ray's
pooled worker processes loads the encoder on its first batch and keeps it for every later batch and
every later run (`models.workers`, as the Dask integration does), so a run after the first starts no
process and loads nothing while Ray keeps those workers (it retires idle workers beyond its pool size).
`EncoderUDF` (or `embed(..., actors=True)`) gives each run an actor pool of its own: processes
dedicated to the encoder and freed when the run ends, at the price of starting them (~2.5 s per run
on a 2-core machine, most of it Ray Data's imports).  Ray's workers are fresh processes (no fork: safe
with every thread runtime); each runs as many native threads as the CPUs Ray assigned its task or
actor (`num_cpus`), so threads × workers never exceed the cluster's cores.
docs/embedding.md, "Scale-out: Dask and Ray", has the multi-machine setup.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

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
        return with_vectors(batch, self.encoder, self.column, self.output_column, self.batch_size)


def embed(ds: Any, column: str = "text", model: "SentenceEncoder | str | Path | None" = None, *,
          concurrency: int = 2, threads_per_worker: int = 1, batch_size: int = 256, actors: bool = False,
          output_column: str = "embedding", threads_per_actor: int | None = None) -> Any:
    """`ds` with an `output_column` of vectors: `map_batches` on at most `concurrency` workers of
    `threads_per_worker` CPUs each (`batch_size` rows per Ray batch) — Ray Data tasks whose processes
    keep their encoder across batches and runs, or with `actors=True` a pool of `EncoderUDF` actors
    started for this run, one batch in flight per actor.  `threads_per_actor`: the old name of
    `threads_per_worker`."""
    import ray.data
    threads = threads_per_worker if threads_per_actor is None else threads_per_actor
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads_per_worker must be a positive int, got {threads!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be a positive int, got {concurrency!r}")
    if not actors:
        return ds.map_batches(_embed_batch, fn_args=(encoder_args(model), column, output_column, threads),
                              compute=ray.data.TaskPoolStrategy(size=concurrency), num_cpus=threads,
                              batch_size=batch_size, batch_format="numpy")
    # Ray Data queues up to 4 batches on an actor by default: the first actor ready took both batches of a
    # 2-batch job while the other sat idle (3 000 texts on 2 actors ran at 0.81x one process).
    pool = ray.data.ActorPoolStrategy(size=concurrency, max_tasks_in_flight_per_actor=1)
    return ds.map_batches(EncoderUDF, fn_constructor_kwargs={"model": model, "column": column,
                                                              "output_column": output_column, "threads": threads},
                          compute=pool, num_cpus=threads, batch_size=batch_size, batch_format="numpy")


def with_vectors(batch: Any, encoder: SentenceEncoder, column: str, output_column: str, batch_size: int = 32) -> Any:
    """`batch` (a dict of NumPy arrays, or a pandas DataFrame) with `output_column` added: the vectors of
    its `column`'s texts."""
    if column not in batch:
        raise KeyError(f"column {column!r} is not in the batch (columns: {', '.join(map(str, batch))})")
    vectors = encoder.embed([str(t) for t in batch[column]], batch_size=batch_size)
    if isinstance(batch, dict):
        return {**batch, output_column: vectors}
    return batch.assign(**{output_column: list(vectors)})


def _embed_batch(batch: dict, args: dict, column: str, output_column: str, threads: int) -> dict:
    """One Ray Data task's batch, on this worker process's encoder (loaded on its first batch)."""
    return with_vectors(batch, worker_encoder(args, threads), column, output_column)


def _assigned_cpus() -> int | None:
    """CPUs Ray assigned this actor (None outside Ray)."""
    try:
        import ray
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:  # not in a Ray worker
        return None
    return max(1, int(cpus)) if cpus else None
