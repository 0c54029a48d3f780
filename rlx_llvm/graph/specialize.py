"""Specialization: the same graph with every dynamic dim made concrete from the fed input shapes."""
from __future__ import annotations

import dataclasses

from .core import DYNAMIC, GraphCore, GraphError, Shape
from .opset import infer


def specialize(graph: GraphCore, shapes: dict[str, Shape]) -> GraphCore:
    """A copy of `graph` whose inputs have `shapes` and every other shape re-inferred from them."""
    out = type(graph).__new__(type(graph))
    GraphCore.__init__(out, graph.name)
    out.inputs, out.params, out.outputs = dict(graph.inputs), dict(graph.params), list(graph.outputs)
    out.param_values = graph.param_values
    for n in graph.nodes:
        if n.op == "input":
            shape, dtype = tuple(shapes[n.name]), n.dtype
        elif n.op in ("param", "constant"):
            shape, dtype = n.shape, n.dtype
        else:
            shape, dtype = infer(n.op, [out.nodes[i] for i in n.inputs], n.attrs)
        if DYNAMIC in shape:
            raise GraphError(f"%{n.id} {n.op}: shape {list(shape)} is still dynamic after specializing the inputs "
                             f"to {', '.join(f'{k}={list(v)}' for k, v in shapes.items())}")
        out.nodes.append(dataclasses.replace(n, shape=tuple(shape), dtype=dtype))
    return out
