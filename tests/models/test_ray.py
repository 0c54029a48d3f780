"""rlx_llvm.models.ray on a local 2-CPU Ray: `embed` on two task workers and on two EncoderUDF actors gives
the single-process vectors, rows aligned with the input; a task worker loads the encoder once across
runs.  Skips without the `ray` extra."""
from __future__ import annotations

import os

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

from rlx_llvm.models import workers  # noqa: E402
from rlx_llvm.models.ray import EncoderUDF, _embed_batch, embed  # noqa: E402

from .scaleout_texts import texts  # noqa: E402
from .test_sentence import model_or_skip  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def minilm():
    return model_or_skip()


def vectors_by_id(ds) -> np.ndarray:
    rows = ds.sort("id").take_all()
    return np.stack([r["embedding"] for r in rows])


@pytest.mark.parametrize("actors", [False, True], ids=["tasks", "actors"])
def test_two_workers_give_the_single_process_vectors(local_ray, minilm, actors):
    items = texts()
    ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(items)], override_num_blocks=4)
    out = embed(ds, column="text", model=minilm, concurrency=2, threads_per_worker=1, batch_size=64, actors=actors)
    np.testing.assert_allclose(vectors_by_id(out), minilm.embed(items), atol=2e-6)


def embed_and_count(batch: dict, args: dict) -> dict:
    """`embed`'s task body (`models.ray._embed_batch`), then this process's id and how many encoders it
    has loaded (`models.workers.loads`) — in the same process, whatever Ray fuses."""
    out = _embed_batch(batch, args, "text", "v", 1)
    n = len(batch["id"])
    return {**out, "pid": np.full(n, os.getpid()), "loads": np.full(n, workers.loads())}


def test_task_workers_keep_their_encoder_across_runs(local_ray, minilm):
    items = texts(64)
    ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(items)], override_num_blocks=4)
    seen: set = set()
    for run in range(4):   # Ray may retire a worker between runs; a later run must reuse one
        batches = list(ds.map_batches(embed_and_count, fn_args=(minilm.load_args,), batch_size=16, num_cpus=1,
                                      compute=ray.data.TaskPoolStrategy(size=2), batch_format="numpy")
                       .iter_batches(batch_size=None, batch_format="numpy"))
        got = {k: np.concatenate([b[k] for b in batches]) for k in ("id", "v", "pid", "loads")}
        np.testing.assert_allclose(got["v"][np.argsort(got["id"])], minilm.embed(items), atol=2e-6)
        assert set(got["loads"]) == {1}, got["loads"]   # every process loaded the encoder once
        if run and seen & set(got["pid"]):
            break   # a process of an earlier run embedded again without loading
        seen |= set(got["pid"])
    else:
        pytest.fail(f"no run reused a worker process of an earlier run: {seen}")


@pytest.mark.parametrize("bad", [{"threads_per_worker": 0}, {"threads_per_worker": True}, {"concurrency": 0}])
def test_bad_worker_counts_are_refused(bad):
    with pytest.raises(ValueError, match="must be a positive int"):
        embed(ray.data.from_items([{"text": "a"}]), **bad)


def test_udf_with_pandas_batches_and_its_own_output_column(local_ray, minilm):
    items = texts(64)
    ds = ray.data.from_items([{"id": i, "body": t} for i, t in enumerate(items)], override_num_blocks=2)
    out = ds.map_batches(EncoderUDF, fn_constructor_kwargs={"column": "body", "output_column": "v"},
                         concurrency=1, num_cpus=1, batch_size=32, batch_format="pandas")
    rows = out.sort("id").take_all()
    np.testing.assert_allclose(np.stack([r["v"] for r in rows]), minilm.embed(items), atol=2e-6)
    assert rows[0]["body"] == items[0]


def test_missing_column_is_named(minilm):
    udf = EncoderUDF(minilm, column="body")
    with pytest.raises(KeyError, match="'body' is not in the batch"):
        udf({"text": np.array(["a"])})
    assert udf({"body": np.array(["a", "b"])})["embedding"].shape == (2, minilm.dim)
