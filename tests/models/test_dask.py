"""rlx_llvm.models.dask on a 2-worker local cluster: the vectors equal the single-process run, rows
aligned with the input, for a DataFrame column and a Bag.  Skips without the `dask` extra."""
from __future__ import annotations

import numpy as np
import pytest

dd = pytest.importorskip("dask.dataframe")
db = pytest.importorskip("dask.bag")
distributed = pytest.importorskip("distributed")
pd = pytest.importorskip("pandas")

from rlx_llvm.models import dask as rlx_dask  # noqa: E402

from .scaleout_texts import texts  # noqa: E402
from .test_sentence import model_or_skip  # noqa: E402


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        yield client


@pytest.fixture(scope="module")
def minilm():
    return model_or_skip()


def test_dataframe_column_gives_the_single_process_vectors_in_row_order(client, minilm):
    items = texts()
    frame = dd.from_pandas(pd.DataFrame({"id": range(len(items)), "text": items}), npartitions=4)
    vectors = rlx_dask.embed(frame, column="text", model=minilm)
    got = vectors.compute()
    np.testing.assert_allclose(got, minilm.embed(items), atol=2e-6)
    workers = client.run(lambda: __import__("rlx_llvm.models.workers", fromlist=["_encoders"])._encoders.__len__())
    assert sorted(workers.values()) == [1, 1]   # one encoder per worker process, kept for every partition


def test_bag_gives_one_vector_per_text(client, minilm):
    items = texts(64)
    got = np.stack(rlx_dask.embed(db.from_sequence(items, npartitions=2)).compute())
    np.testing.assert_allclose(got, minilm.embed(items), atol=2e-6)


def test_workers_run_one_native_thread_each(client, minilm):
    rlx_dask.embed(db.from_sequence(texts(4), npartitions=2)).compute()
    threads = client.run(lambda: __import__("rlx_llvm").get_num_threads())
    assert sorted(threads.values()) == [1, 1]


def test_bad_arguments_are_refused(minilm):
    frame = dd.from_pandas(pd.DataFrame({"text": ["a", "b"]}), npartitions=1)
    with pytest.raises(KeyError, match="'body' is not in the DataFrame"):
        rlx_dask.embed(frame, column="body")
    with pytest.raises(TypeError, match="Dask DataFrame, Series or Bag"):
        rlx_dask.embed(["a list"])
    with pytest.raises(TypeError, match="model must be"):
        rlx_dask.embed(frame, column="text", model=3)
    with pytest.raises(ValueError, match="threads_per_worker"):
        rlx_dask.embed(frame, column="text", threads_per_worker=0)
