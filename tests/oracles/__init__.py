"""Independent oracles: thunks checked against `onnx.reference.ReferenceEvaluator` (see docs/oracles.md)."""
