"""ONNX's backend API (`onnx.backend.base.Backend`) over `OnnxModel`, so `onnx.backend.test` runs against RLX.

    from rlx_llvm.onnx.backend import RlxBackend
    rep = RlxBackend.prepare(model)          # imports nothing yet: one import + compile per input shape
    outputs = rep.run([x])                   # or rep.run({"x": x})
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from . import OnnxModel


class RlxBackendRep(BackendRep):
    """A prepared model: `run(inputs)` imports and compiles it for the fed shapes, then runs it."""

    def __init__(self, model: OnnxModel) -> None:
        self.model = model

    def run(self, inputs: "Sequence[Any] | Mapping[str, Any] | np.ndarray", **kwargs: Any) -> tuple[np.ndarray, ...]:
        """The model's outputs for `inputs` (a list in input order, a name → array mapping, or one array)."""
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        feeds = dict(inputs) if isinstance(inputs, Mapping) else dict(zip(self.model.input_names, inputs))
        return tuple(self.model.run(feeds))


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
