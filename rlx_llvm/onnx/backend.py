"""ONNX's backend API (`onnx.backend.base.Backend`) over `OnnxModel`, so `onnx.backend.test` runs against RLX.

    from rlx_llvm.onnx.backend import RlxBackend
    rep = RlxBackend.prepare(model)          # imports nothing yet: one import + compile per input shape
    outputs = rep.run([x])                   # or rep.run({"x": x})
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from onnx import ModelProto, TensorProto, numpy_helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from . import OnnxImportError, OnnxModel


class RlxBackendRep(BackendRep):
    """A prepared model: `run(inputs)` imports and compiles it for the fed shapes, then runs it.

    An input that the model reads as a shape argument (Reshape's shape, reduce axes, Resize scales…)
    must be known at import time: when the import names such inputs (`OnnxImportError.wanted`), the
    model is specialized on their fed values (they become initializers; one compile per value set).
    """

    def __init__(self, model: OnnxModel) -> None:
        self.model = model
        self._by_value: dict[tuple, OnnxModel] = {}
        self._frozen: list[str] = []

    def run(self, inputs: "Sequence[Any] | Mapping[str, Any] | np.ndarray", **kwargs: Any) -> tuple[np.ndarray, ...]:
        """The model's outputs for `inputs` (a list in input order, a name → array mapping, or one array)."""
        if isinstance(inputs, (np.ndarray, TensorProto)):
            inputs = [inputs]
        pairs = inputs.items() if isinstance(inputs, Mapping) else zip(self.model.input_names, inputs)
        feeds = {k: numpy_helper.to_array(v) if isinstance(v, TensorProto) else np.asarray(v) for k, v in pairs}
        while True:
            try:
                return tuple(self._specialized(feeds).run({k: v for k, v in feeds.items() if k not in self._frozen}))
            except OnnxImportError as exc:
                new = [n for n in exc.wanted if n in feeds and n not in self._frozen]
                if not new:
                    raise
                self._frozen += new

    def _specialized(self, feeds: Mapping[str, np.ndarray]) -> OnnxModel:
        """The model with the frozen inputs replaced by their fed values."""
        if not self._frozen:
            return self.model
        frozen = {k: feeds[k] for k in self._frozen}
        key = tuple((k, v.dtype.str, v.shape, v.tobytes()) for k, v in frozen.items())
        if key not in self._by_value:
            self._by_value[key] = OnnxModel(_with_initializers(self.model.proto, frozen))
        return self._by_value[key]


def _with_initializers(proto: ModelProto, values: Mapping[str, np.ndarray]) -> ModelProto:
    """A copy of `proto` whose inputs named in `values` are initializers holding those values."""
    m = ModelProto()
    m.CopyFrom(proto)
    m.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in values.items())
    return m


class RlxBackend(Backend):
    """RLX as an ONNX backend: CPU only, every model imported per concrete input shape."""

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs: Any) -> RlxBackendRep:
        """Check the model and wrap it; compilation happens on the first `run`."""
        super().prepare(model, device, **kwargs)
        return RlxBackendRep(OnnxModel(model))

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Prepare and run `model` once."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Only the CPU."""
        return Device(device).type == DeviceType.CPU


prepare = RlxBackend.prepare
run_model = RlxBackend.run_model
supports_device = RlxBackend.supports_device
