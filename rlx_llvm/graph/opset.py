"""The op registry: each graph op has a shape/dtype inference rule and a lowering rule to thunks.

Family modules register with decorators, one rule per op, the way `rlx_llvm.registry` maps thunk
kinds to emitters:

    @infers("softmax")
    def _(node_inputs, attrs) -> (shape, dtype): ...

    @lowers("softmax")
    def _(ctx: LowerContext, node: Node) -> None: ...
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ..dtypes import DType
from .core import GraphError, Node, Shape

InferRule = Callable[[list[Node], dict[str, Any]], "tuple[Shape, DType]"]
LowerRule = Callable[..., None]


@dataclasses.dataclass
class OpDef:
    """What the compiler knows of one op."""

    name: str
    infer: InferRule | None = None
    lower: LowerRule | None = None


OPS: dict[str, OpDef] = {}


def _def(name: str) -> OpDef:
    return OPS.setdefault(name, OpDef(name))


def infers(*names: str) -> Callable[[InferRule], InferRule]:
    """Register a shape/dtype inference rule for ops `names`."""
    def register(fn: InferRule) -> InferRule:
        for n in names:
            _def(n).infer = fn
        return fn
    return register


def lowers(*names: str) -> Callable[[LowerRule], LowerRule]:
    """Register the lowering rule (node → thunks) for ops `names`."""
    def register(fn: LowerRule) -> LowerRule:
        for n in names:
            _def(n).lower = fn
        return fn
    return register


def infer(op: str, inputs: list[Node], attrs: dict[str, Any]) -> "tuple[Shape, DType]":
    """Run `op`'s inference rule; an op nobody defined is a GraphError."""
    d = OPS.get(op)
    if d is None or d.infer is None:
        raise GraphError(f"unknown graph op {op!r}")
    return d.infer(inputs, attrs)


def lowering_of(node: Node) -> LowerRule:
    """The lowering rule of `node.op`; GraphError naming the node when there is none."""
    d = OPS.get(node.op)
    if d is None or d.lower is None:
        raise GraphError(f"%{node.id} {node.op}: no lowering to thunks for this op")
    return d.lower
