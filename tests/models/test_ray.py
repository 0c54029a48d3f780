"""rlx_llvm.models.ray on a local 2-CPU Ray: EncoderUDF on two actors gives the single-process vectors,
rows aligned with the input.  Skips without the `ray` extra."""
from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

from rlx_llvm.models.ray import EncoderUDF, embed  # noqa: E402

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


def test_two_actors_give_the_single_process_vectors(local_ray, minilm):
    items = texts()
    ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(items)], override_num_blocks=4)
    out = embed(ds, column="text", model=minilm, concurrency=2, threads_per_actor=1, batch_size=64)
    np.testing.assert_allclose(vectors_by_id(out), minilm.embed(items), atol=2e-6)


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
