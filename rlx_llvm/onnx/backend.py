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


SHAPE_ARGUMENT_MAX = 64       # integer inputs up to this many elements may be specialized on as shape arguments


class RlxBackendRep(BackendRep):
    """A prepared model: `run(inputs)` imports and compiles it for the fed shapes, then runs it.

    An integer input that the model reads as a shape argument (Reshape's shape, reduce axes, Slice
    starts…) must be known at import time: when the import asks for one, the model is specialized on
    the fed values of its small integer inputs (they become initializers; one compile per value set).
    """

    def __init__(self, model: OnnxModel) -> None:
        self.model = model
        self._by_value: dict[tuple, OnnxModel] = {}
        self._needs_values = False

    def run(self, inputs: "Sequence[Any] | Mapping[str, Any] | np.ndarray", **kwargs: Any) -> tuple[np.ndarray, ...]:
        """The model's outputs for `inputs` (a list in input order, a name → array mapping, or one array)."""
        if isinstance(inputs, (np.ndarray, TensorProto)):
            inputs = [inputs]
        pairs = inputs.items() if isinstance(inputs, Mapping) else zip(self.model.input_names, inputs)
        feeds = {k: numpy_helper.to_array(v) if isinstance(v, TensorProto) else np.asarray(v) for k, v in pairs}
        if not self._needs_values:
            try:
                return tuple(self.model.run(feeds))
            except OnnxImportError as exc:
                if not any("must be a constant" in p for p in exc.problems):
                    raise
                self._needs_values = True
        frozen = {k: v for k, v in feeds.items() if v.dtype.kind in "iu" and v.size <= SHAPE_ARGUMENT_MAX}
        key = tuple((k, v.dtype.str, v.shape, v.tobytes()) for k, v in sorted(frozen.items()))
        if key not in self._by_value:
            self._by_value[key] = OnnxModel(_with_initializers(self.model.proto, frozen))
        return tuple(self._by_value[key].run({k: v for k, v in feeds.items() if k not in frozen}))


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
