"""ONNX's node tests, through the Backend API, for the passing cases of the operators issue 15 §1 lists.

The case list (`node_suite_cases.txt`: `module case` per line) is what `python -m rlx_llvm.onnx.conformance
--passing tests/onnx/node_suite_cases.txt` wrote from its last full run; only the ONNX case modules named
there are imported, so the suite generates and runs just these cases.  A case here that stops passing
is a regression; `docs/onnx-node-tests.md` has the whole table.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")

from rlx_llvm.onnx.backend import RlxBackend  # noqa: E402
from rlx_llvm.onnx.conformance import compare, load_cases  # noqa: E402

LISTED = [line.split() for line in Path(__file__).with_name("node_suite_cases.txt").read_text().splitlines() if line]
WANTED = {name for _, name in LISTED}
CASES = [c for c in load_cases(modules=sorted({m for m, _ in LISTED})) if c.name in WANTED]


def test_every_listed_case_exists():
    assert len(CASES) == len(WANTED) > 300


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case(case):
    rep = RlxBackend.prepare(case.model, "CPU")
    for inputs, expected in case.data_sets:
        compare(expected, rep.run(list(inputs)), case.rtol, case.atol)


def test_backend_api():
    assert RlxBackend.supports_device("CPU") and not RlxBackend.supports_device("CUDA")
    relu = next(c for c in CASES if c.name == "test_relu")
    (x,), (want,) = relu.data_sets[0]
    got, = RlxBackend.run_model(relu.model, {"x": x})
    np.testing.assert_array_equal(got, want)


def test_compare_catches_a_wrong_answer():
    with pytest.raises(AssertionError, match="differ"):
        compare([np.ones(3, np.float32)], [np.array([1, 1, 1.1], np.float32)], 1e-3, 1e-7)
    with pytest.raises(AssertionError, match="dtype"):
        compare([np.ones(3, np.int64)], [np.ones(3, np.int32)], 1e-3, 1e-7)
