"""Small ONNX models built with onnx.helper, and the two oracles (ONNX Runtime, onnx.reference) the op tests use."""
from __future__ import annotations

from typing import Sequence

import numpy as np
from onnx import TensorProto as TP, helper as h, numpy_helper as nh


def model(nodes, inputs, outputs: Sequence, inits=(), opset: int = 17, contrib: bool = False):
    """A ModelProto; `inputs` are (name, elem type, shape), `outputs` names (float) or (name, elem type)."""
    outs = [o if isinstance(o, tuple) else (o, TP.FLOAT) for o in outputs]
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                     [h.make_tensor_value_info(n, t, None) for n, t in outs],
                     [nh.from_array(np.asarray(a), n) for n, a in inits])
    opsets = [h.make_opsetid("", opset)] + ([h.make_opsetid("com.microsoft", 1)] if contrib else [])
    return h.make_model(g, opset_imports=opsets)


def ort_run(m, feeds) -> list[np.ndarray]:
    """ONNX Runtime's outputs (CPU, one thread)."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feeds)


def reference_run(m, feeds) -> list[np.ndarray]:
    """onnx.reference's outputs."""
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(m).run(None, feeds)


def assert_scaled_close(ours: np.ndarray, theirs: np.ndarray, what: str, rel: float = 1e-4) -> None:
    """Same shape, and |Δ| ≤ rel · max(1, max |theirs|)."""
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=rel * max(1.0, float(np.abs(theirs).max(initial=0))),
                               err_msg=what)
