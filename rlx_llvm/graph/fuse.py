"""Fusion passes over a specialized graph; each rewrites nodes and logs what fired.

Passes run in `PASSES` order.  A pass is `fn(graph, log) -> graph`; it builds a new graph with
`Rewriter` (which renumbers ids and keeps inputs, params and outputs pointing at the right nodes).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from ..ops import Input, Step
from .core import GraphCore, Node
from .elementwise import ELEMENTWISE, REGION_DTYPES, chain_of
from ..dtypes import DType
from ..ops import Activation

MAX_REGION_INPUTS = 16
MAX_REGION_STEPS = 32


@dataclasses.dataclass
class FusionLog:
    """What each pass did: `(pass name, description)` in order."""

    entries: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def add(self, name: str, text: str) -> None:
        """Record one rewrite."""
        self.entries.append((name, text))

    def count(self, name: str) -> int:
        """How many times pass `name` fired."""
        return sum(1 for n, _ in self.entries if n == name)

    def __str__(self) -> str:
        if not self.entries:
            return "fusions: none"
        return "fusions:\n" + "\n".join(f"  {n}: {t}" for n, t in self.entries)


def users(graph: GraphCore) -> dict[int, int]:
    """How many times each node is read (an output counts as a reader)."""
    count = {n.id: 0 for n in graph.nodes}
    for n in graph.nodes:
        for i in n.inputs:
            count[i] += 1
    for o in graph.outputs:
        count[o] += 1
    return count


class Rewriter:
    """Builds the rewritten graph: `keep(node)` copies a node (remapping inputs), `drop(id, into)` forwards."""

    def __init__(self, graph: GraphCore) -> None:
        self.old = graph
        self.new = type(graph).__new__(type(graph))
        GraphCore.__init__(self.new, graph.name)
        self.map: dict[int, int] = {}

    def keep(self, node: Node, **changes) -> int:
        """Append `node` (with `changes`) to the new graph; its inputs are remapped."""
        inputs = tuple(self.map[i] for i in changes.pop("inputs", node.inputs))
        new = dataclasses.replace(node, id=len(self.new.nodes), inputs=inputs, **changes)
        self.new.nodes.append(new)
        self.map[node.id] = new.id
        return new.id

    def finish(self) -> GraphCore:
        """The new graph, its inputs/params/outputs remapped."""
        g = self.new
        g.inputs = {k: self.map[v] for k, v in self.old.inputs.items() if v in self.map}
        g.params = {k: self.map[v] for k, v in self.old.params.items() if v in self.map}
        g.outputs = [self.map[o] for o in self.old.outputs]
        return g


def _fusible(node: Node) -> bool:
    if node.op not in ELEMENTWISE and node.op != "region":
        return False
    if node.op == "activation" and node.attrs["act"] is Activation.Gelu:
        return False
    return node.dtype in REGION_DTYPES or node.dtype == DType.Bool


def fuse_regions(graph: GraphCore, log: FusionLog) -> GraphCore:
    """Chains of element-wise ops → one `region` node per chain (≤ 16 inputs, ≤ 32 steps).

    A producer joins its consumer's region when it is element-wise, read only by that consumer, not an
    output, and of the consumer's shape (so it is computed once per output element)."""
    count = users(graph)
    regions: dict[int, tuple[list[int], list]] = {}    # node → (external inputs, chain)
    absorbed: set[int] = set()
    for node in graph.nodes:
        if not _fusible(node):
            continue
        ext: list[int] = []
        chain: list = []
        operands = []
        one = chain_of(node)[0] if node.op != "region" else None
        for j, src in enumerate(node.inputs):
            p = graph.nodes[src]
            sub = regions.get(src)
            if (sub and count[src] == 1 and p.shape == node.shape and node.op != "region"
                    and len(set(ext) | set(sub[0])) <= MAX_REGION_INPUTS
                    and len(chain) + len(sub[1]) + 1 <= MAX_REGION_STEPS):
                operands.append(_splice(sub, ext, chain))
                absorbed.add(src)
            else:
                operands.append(Input(_index(ext, src)))
        if node.op == "region":
            regions[node.id] = (list(node.inputs), list(node.attrs["chain"]))
            continue
        chain.append(_with_operands(one, operands))
        regions[node.id] = (ext, chain)
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.id in absorbed:
            continue
        ext, chain = regions.get(node.id, (None, None))
        if chain is not None and len(chain) > 1:
            rw.keep(node, op="region", inputs=tuple(ext),
                    attrs={"chain": tuple(chain), "dtype": node.dtype, "shape": node.shape})
            log.add("region", f"%{node.id}: {len(chain)} element-wise ops → one ElementwiseRegion over "
                              f"{len(ext)} input(s)")
        else:
            rw.keep(node)
    return rw.finish()


def _index(ext: list[int], src: int) -> int:
    if src not in ext:
        ext.append(src)
    return ext.index(src)


def _splice(sub: tuple[list[int], list], ext: list[int], chain: list):
    """Append a producer's chain to `chain` (its inputs re-indexed into `ext`); the operand of its result."""
    sub_ext, sub_chain = sub
    base = len(chain)

    def remap(op):
        return Input(_index(ext, sub_ext[op.index])) if isinstance(op, Input) else Step(op.index + base)

    for step in sub_chain:
        chain.append(_with_operands(step, [remap(o) for o in _operands(step)]))
    return Step(len(chain) - 1)


_OPERAND_FIELDS = ("x", "lhs", "rhs", "cond", "on_true", "on_false")


def _operands(step) -> list:
    return [getattr(step, f) for f in _OPERAND_FIELDS if hasattr(step, f)]


def _with_operands(step, operands: list):
    names = [f for f in _OPERAND_FIELDS if hasattr(step, f)]
    return dataclasses.replace(step, **dict(zip(names, operands)))


Pass = Callable[[GraphCore, FusionLog], GraphCore]
PASSES: list[Pass] = [fuse_regions]


def fuse(graph: GraphCore) -> tuple[GraphCore, FusionLog]:
    """Run every pass in order."""
    log = FusionLog()
    for p in PASSES:
        graph = p(graph, log)
    return graph, log
