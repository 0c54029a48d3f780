"""The graph front-end: build a model with `Graph`, compile it with `Session`, run it.

    import numpy as np, rlx_llvm as rl
    g = rl.Graph("mlp")
    x = g.input("x", [-1, 4])
    h = g.relu(x @ g.param("w1", [4, 8]) + g.param("b1", [8]))
    g.set_outputs([h @ g.param("w2", [8, 2])])
    cg = rl.Session().compile(g)
    for name, shape in [("w1", (4, 8)), ("b1", (8,)), ("w2", (8, 2))]:
        cg.set_param(name, np.ones(shape, np.float32))
    y, = cg.run({"x": np.ones((3, 4), np.float32)})

Passes, each its own module: `specialize` (dynamic dims → concrete), `fuse`, `lower` (one rule per op,
registered in `opset`), `plan` (arena by liveness), then `rl.compile` of the resulting schedule.
"""
from __future__ import annotations

from .attention import AttentionOps
from .autodiff import grad
from .conv import ConvOps
from .core import DYNAMIC, GraphCore, GraphError, Node, Value
from .elementwise import ElementwiseOps
from .extra import ExtraOps
from .fft import FftOps
from .linalg import LinalgOps
from .losses import LossOps
from .nn import NNOps
from .onnx_extra import OnnxExtraOps
from .quant import QuantOps
from .reductions import ReductionOps
from .recurrent import RecurrentOps
from .shape import ShapeOps
from .session import CompiledGraph, Session


class Graph(ConvOps, AttentionOps, ExtraOps, FftOps, ElementwiseOps, LinalgOps, ShapeOps, ReductionOps, NNOps, LossOps,
            RecurrentOps, QuantOps, OnnxExtraOps, GraphCore):
    """A model under construction: sources (`input`, `param`, `constant`), ops, `set_outputs`."""


__all__ = ["Graph", "Value", "Node", "Session", "CompiledGraph", "GraphError", "DYNAMIC", "grad"]
