"""Lowering: a specialized graph (every shape concrete) → steps over symbolic buffers.

Each node's result lives in a `Buffer` (or a view of one: reshape is free).  A lowering rule emits
steps; a step is a function from placed offsets to one thunk, plus the buffers it reads and writes —
enough for the planner to compute live ranges before any offset exists.

    def lower_relu(ctx, node):
        x, = node.inputs
        ctx.emit(lambda at: T.ElementwiseRegion(dst=at(node.id), ...), reads=[x], writes=[node.id])
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Union

import numpy as np

from ..thunks import Thunk
from .core import GraphCore, GraphError, Node, numel
from .opset import lowering_of

ALIGN = 64


@dataclasses.dataclass(eq=False)
class Buffer:
    """A block of arena bytes: `kind` is param, const, input, temp or scratch."""

    id: int
    nbytes: int
    kind: str
    label: str
    first: int = -1
    last: int = -1
    data: np.ndarray | None = None      # constants: the bytes written once at arena creation

    @property
    def pinned(self) -> bool:
        """Params and constants keep their bytes across runs, so they never share."""
        return self.kind in ("param", "const")


@dataclasses.dataclass(frozen=True)
class View:
    """`nbytes` bytes of `buffer` from `offset`."""

    buffer: Buffer
    offset: int
    nbytes: int


Operand = Union[int, View, Buffer]
At = Callable[[Operand], int]


@dataclasses.dataclass
class Step:
    """One thunk to be: `build(at)` makes it once offsets are placed; `op` names the node it came from."""

    build: Callable[[At], Thunk]
    reads: tuple[View, ...]
    writes: tuple[View, ...]
    op: str
    node: int
    """The user-graph id of the node it came from (`Node.source_id`)."""


class LowerContext:
    """What a lowering rule sees: the graph, each node's storage, and `emit`."""

    def __init__(self, graph: GraphCore) -> None:
        self.graph = graph
        self.buffers: list[Buffer] = []
        self.views: dict[int, View] = {}
        self.steps: list[Step] = []
        self._current: Node | None = None
        self.readers: dict[int, int] = {}
        for n in graph.nodes:
            for i in n.inputs:
                self.readers[i] = self.readers.get(i, 0) + 1

    def node(self, id: int) -> Node:
        """Node `id` of the graph being lowered."""
        return self.graph.nodes[id]

    def buffer(self, nbytes: int, kind: str, label: str) -> Buffer:
        """A new buffer of `nbytes`."""
        buf = Buffer(len(self.buffers), int(nbytes), kind, label)
        self.buffers.append(buf)
        return buf

    def view(self, x: Operand) -> View:
        """The storage of a node id, a buffer or a view (a node without storage yet gets a temp buffer)."""
        if isinstance(x, View):
            return x
        if isinstance(x, Buffer):
            return View(x, 0, x.nbytes)
        if x not in self.views:
            n = self.node(x)
            buf = self.buffer(numel(n.shape) * n.dtype.itemsize, "temp", f"%{n.id} {n.op}")
            self.views[x] = View(buf, 0, buf.nbytes)
        return self.views[x]

    def alias(self, node: int, src: Operand, byte_offset: int = 0) -> None:
        """Make `node` a view of `src`'s bytes from `byte_offset` (reshape, leading narrow): no thunk."""
        base = self.view(src)
        n = self.node(node)
        self.views[node] = View(base.buffer, base.offset + byte_offset, numel(n.shape) * n.dtype.itemsize)

    def scratch(self, nbytes: int, label: str = "scratch") -> Buffer:
        """A temporary live only around the current node's steps."""
        where = f"%{self._current.id} {label}" if self._current else label
        return self.buffer(nbytes, "scratch", where)

    def emit(self, build: Callable[[At], Thunk], reads: Iterable[Operand] = (), writes: Iterable[Operand] = ()) -> None:
        """Append a step; `build(at)` receives `at(operand) → arena offset`."""
        node = self._current
        self.steps.append(Step(build, tuple(self.view(r) for r in reads), tuple(self.view(w) for w in writes),
                               node.op if node else "?", node.source_id if node else -1))

    def reuse_input(self, node: Node, src: int) -> bool:
        """Let `node` write over input `src`'s bytes when nothing else can see them: `src` is a temporary
        read only by `node`, not an output, and no other node views its buffer.  True if it did."""
        view = self.views.get(src)
        if view is None or view.buffer.kind != "temp" or self.readers.get(src, 0) != 1 or \
                src in self.graph.outputs or view.nbytes != view.buffer.nbytes or \
                sum(v.buffer is view.buffer for v in self.views.values()) != 1:
            return False
        self.views[node.id] = view
        return True


@dataclasses.dataclass
class Lowered:
    """The steps of a graph and the buffers they use; `sources`/`outputs` map names and ids to storage."""

    graph: GraphCore
    steps: list[Step]
    buffers: list[Buffer]
    inputs: dict[str, View]
    params: dict[str, View]
    outputs: list[View]
    views: dict[int, View]


def lower(graph: GraphCore) -> Lowered:
    """Lower every node reachable from the outputs, in build order."""
    ctx = LowerContext(graph)
    live = reachable(graph)
    for node in graph.nodes:
        if node.id not in live:
            continue
        ctx._current = node
        if node.op in ("input", "param", "constant"):
            kind = {"input": "input", "param": "param", "constant": "const"}[node.op]
            buf = ctx.buffer(numel(node.shape) * node.dtype.itemsize, kind, node.name or f"%{node.id} constant")
            if kind == "const":
                buf.data = node.attrs["data"]
            ctx.views[node.id] = View(buf, 0, buf.nbytes)
            continue
        try:
            lowering_of(node)(ctx, node)
        except GraphError:
            raise
        except Exception as exc:  # a rule's own error: keep the node in the message
            raise GraphError(f"%{node.id} {node.op}: cannot lower ({exc})") from exc
    ctx._current = None
    inputs = {name: ctx.view(i) for name, i in graph.inputs.items() if i in live}
    params = {name: ctx.view(i) for name, i in graph.params.items() if i in live}
    return Lowered(graph, ctx.steps, ctx.buffers, inputs, params, [ctx.view(o) for o in graph.outputs], ctx.views)


def reachable(graph: GraphCore) -> set[int]:
    """Ids of nodes the outputs depend on."""
    seen: set[int] = set()
    stack = list(graph.outputs)
    while stack:
        i = stack.pop()
        if i not in seen:
            seen.add(i)
            stack.extend(graph.nodes[i].inputs)
    return seen
