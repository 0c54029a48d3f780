"""ONNX import: run ONNX models as native code.

    import rlx_llvm as rl
    g = rl.onnx.load("model.onnx", shapes={"input_ids": (1, 12)})   # a Graph; initializers are its params
    y, = rl.onnx.run("model.onnx", {"input_ids": ids})               # one-off: import, compile, run
    m = rl.onnx.OnnxModel("model.onnx"); m.run(feeds)                # many runs: one compile per input shape

The importer (`importer.py`) folds every shape computation at import time (per concrete input
shape), and converts each op with one converter (`ops_*.py`, `@converts("OpType")`).
"""
from __future__ import annotations

import threading
from typing import Any, Mapping, Sequence

import numpy as np

from ..graph import CompiledGraph, Graph, Session
from . import ops_index, ops_loss, ops_math, ops_nn, ops_shape, ops_rnn, ops_contrib  # noqa: F401  (register converters)
from . import ops_quant, ops_signal, ops_attention  # noqa: F401
from . import ops_models  # noqa: F401  (If on a constant condition, IsNaN, model and feed checks)
from .importer import CONVERTERS, OnnxImportError, Unsupported, as_bf16, converts, load


class OnnxModel:
    """An ONNX model ready to run many times: imported and compiled once per distinct set of input shapes."""

    def __init__(self, model: "str | Any", session: Session | None = None) -> None:
        self.proto = ops_models.prepare(model)
        self.declared = ops_models.declared_inputs(self.proto)
        self.session = session or Session()
        init = {t.name for t in self.proto.graph.initializer}
        self.input_names = [i.name for i in self.proto.graph.input if i.name not in init]
        self.output_names = [o.name for o in self.proto.graph.output]
        self._compiled: dict[tuple, CompiledGraph] = {}
        self._lock = threading.Lock()

    def compiled(self, shapes: Mapping[str, Sequence[int]]) -> CompiledGraph:
        """The CompiledGraph for these input shapes (imported and compiled on first use)."""
        key = tuple(tuple(int(d) for d in shapes[n]) for n in self.input_names)
        with self._lock:
            if key not in self._compiled:
                self._compiled[key] = self.session.compile(load(self.proto, dict(zip(self.input_names, key))))
            return self._compiled[key]

    def run(self, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """Outputs for `feeds` (input name → array), in the model's output order."""
        arrays = {k: np.asarray(v) for k, v in feeds.items()}
        ops_models.check_feeds(self.declared, arrays)
        missing = [n for n in self.input_names if n not in arrays]
        if missing:
            raise OnnxImportError([f"run: missing input {n!r}" for n in missing])
        compiled = self.compiled({n: arrays[n].shape for n in self.input_names})
        outs = compiled.run({n: arrays[n] for n in self.input_names})
        g = compiled.graph
        return [as_bf16(np.asarray(y), g.nodes[i].dtype) for y, i in zip(outs, g.outputs)]


def run(model: "str | Any", feeds: Mapping[str, Any]) -> list[np.ndarray]:
    """Import, compile and run `model` once on `feeds`."""
    return OnnxModel(model).run(feeds)


__all__ = ["load", "run", "OnnxModel", "OnnxImportError", "Unsupported", "converts", "CONVERTERS", "Graph"]
