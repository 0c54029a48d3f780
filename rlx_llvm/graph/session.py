"""Session.compile(graph) → CompiledGraph: specialize, fuse, lower, plan, JIT — once per input shape.

    cg = rl.Session().compile(g)
    cg.set_param("w", w)
    y, = cg.run({"x": x})        # the first run at a new input shape compiles; later ones reuse it
    print(cg.plan())             # each buffer's offset, size and live range
    print(cg.report())           # which fusions fired, and the thunks' lowering paths
"""
from __future__ import annotations

import copy
import dataclasses
import threading
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import numpy as np

from ..arena import Arena
from ..dtypes import DType
from ..program import Program, compile as compile_schedule
from ..schedule import ThunkSchedule
from .core import DYNAMIC, GraphCore, GraphError, Shape
from .fuse import FusionLog, fuse
from .lower import Lowered, lower
from .plan import Plan, plan
from .specialize import specialize

_PRECISIONS = ("f32",)


class Session:
    """Compiles graphs for the CPU; `precision` is f32 (the only precision lowered)."""

    def __init__(self, device: str = "cpu", precision: str = "f32", *, fusion: bool = True) -> None:
        if device != "cpu":
            raise GraphError(f"device {device!r} is not available: rlx_llvm runs on the CPU only")
        if precision not in _PRECISIONS:
            raise GraphError(f"precision {precision!r} is not supported (choose one of {', '.join(_PRECISIONS)})")
        self.device = device
        self.precision = precision
        self.fusion = fusion

    def compile(self, graph: GraphCore) -> "CompiledGraph":
        """A runnable graph; a graph with only static inputs is compiled now, dynamic ones per shape."""
        return CompiledGraph(graph, fusion=self.fusion)

    def __repr__(self) -> str:
        return f"Session(device={self.device!r}, precision={self.precision!r})"


@dataclasses.dataclass
class Specialization:
    """One concrete-shape compile: the fused graph, its steps, plan, schedule, program and arena."""

    graph: GraphCore
    fusions: FusionLog
    lowered: Lowered
    plan: Plan
    schedule: ThunkSchedule
    program: Program
    storage: "Storage"
    _io: tuple = dataclasses.field(default=(None, [], []), repr=False)

    @property
    def arena(self) -> Arena:
        """The arena this specialization runs on (shared with the others of the same pinned layout)."""
        return self.storage.arena

    def io(self) -> tuple[list[tuple[str, np.ndarray]], list[np.ndarray]]:
        """Typed arena views of the inputs (name, view) and of the outputs, made once per arena (it may grow)."""
        arena = self.storage.arena
        if self._io[0] is not arena:
            def typed(view, node_id: int) -> np.ndarray:
                node = self.graph.nodes[node_id]
                return arena.view(self.plan.at(view), node.dtype.numpy, node.shape)
            inputs = [(name, typed(view, self.graph.inputs[name])) for name, view in self.lowered.inputs.items()]
            outputs = [typed(view, node_id) for view, node_id in zip(self.lowered.outputs, self.graph.outputs)]
            self._io = (arena, inputs, outputs)
        return self._io[1], self._io[2]


@dataclasses.dataclass
class Storage:
    """One arena for every specialization whose params and constants sit at the same offsets: the
    weights are written once, not once per input shape; the arena grows (pinned bytes kept) when a
    larger shape arrives."""

    layout: tuple
    pinned_bytes: int
    arena: Arena
    params_written: set[str]

    def fit(self, nbytes: int) -> None:
        """Grow the arena to at least `nbytes`, keeping the pinned bytes."""
        if self.arena.nbytes < nbytes:
            grown = Arena(nbytes)
            grown.bytes[:self.pinned_bytes] = self.arena.bytes[:self.pinned_bytes]
            self.arena = grown


class CompiledGraph:
    """A graph ready to run: `set_param`, `run`; `schedule`, `plan()`, `report()` inspect it."""

    def __init__(self, graph: GraphCore, *, fusion: bool = True) -> None:
        if not graph.outputs:
            raise GraphError(f"graph {graph.name!r} has no outputs: call set_outputs first")
        self.graph = copy.copy(graph)
        self.graph.nodes = list(graph.nodes)
        self.graph.outputs = list(graph.outputs)
        self.fusion = fusion
        self._params: dict[str, np.ndarray] = dict(graph.param_values)
        self._specs: dict[tuple[Shape, ...], Specialization] = {}
        self._storages: list[Storage] = []
        self._last: Specialization | None = None
        self._lock = threading.Lock()
        if all(DYNAMIC not in self.graph.nodes[i].shape for i in self.graph.inputs.values()):
            self._specialization(self._static_shapes())

    # ── parameters and runs ─────────────────────────────────────────────────

    def set_param(self, name: str, value: "np.ndarray | Sequence") -> None:
        """Set parameter `name` (converted to its declared dtype; the shape must match exactly)."""
        if name not in self.graph.params:
            known = ", ".join(sorted(self.graph.params)) or "none"
            raise GraphError(f"set_param: graph {self.graph.name!r} has no param {name!r} (params: {known})")
        node = self.graph.nodes[self.graph.params[name]]
        arr = np.asarray(value)
        if tuple(arr.shape) != node.shape:
            raise GraphError(f"set_param {name!r}: shape {list(arr.shape)} does not match the declared "
                             f"{list(node.shape)}")
        self._params[name] = np.array(arr, dtype=node.dtype.numpy, order="C")
        for storage in self._storages:
            storage.params_written.discard(name)

    def run(self, feeds: Mapping[str, "np.ndarray"]) -> list[np.ndarray]:
        """Run on `feeds` (name → array); returns the outputs as new arrays, in `set_outputs` order."""
        arrays = self._check_feeds(feeds)
        shapes = tuple(arrays[name].shape for name in self.graph.inputs)
        with self._lock:
            spec = self._specialization(shapes)
            self._write_params(spec)
            inputs, outputs = spec.io()
            for name, typed in inputs:
                typed[...] = arrays[name]
            spec.program.run(spec.arena)
            return [typed.copy() for typed in outputs]

    @property
    def params(self) -> Mapping[str, np.ndarray]:
        """The parameter values set so far (read-only view; `set_param` to change one)."""
        return MappingProxyType(self._params)

    def prepare(self, shapes: Mapping[str, Sequence[int]]) -> Program:
        """Compile (or fetch) the program for these input shapes without running it."""
        missing = [n for n in self.graph.inputs if n not in shapes]
        if missing:
            raise GraphError(f"prepare: no shape for input(s) {', '.join(map(repr, missing))}")
        with self._lock:
            return self._specialization(tuple(tuple(int(d) for d in shapes[n]) for n in self.graph.inputs)).program

    def release(self, shapes: Mapping[str, Sequence[int]]) -> None:
        """Drop the program compiled for these input shapes (a later run at them compiles again)."""
        key = tuple(tuple(int(d) for d in shapes[n]) for n in self.graph.inputs)
        with self._lock:
            spec = self._specs.pop(key, None)
            if spec is not None and spec is self._last:
                self._last = None

    @property
    def arena_bytes(self) -> int:
        """Bytes of the arenas the compiled shapes run on (params, constants, the largest activations)."""
        return sum(storage.arena.nbytes for storage in self._storages)

    def _check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        missing = [n for n in self.graph.inputs if n not in feeds]
        if missing:
            raise GraphError(f"run: missing input(s) {', '.join(map(repr, missing))} of graph {self.graph.name!r}")
        extra = [n for n in feeds if n not in self.graph.inputs]
        if extra:
            raise GraphError(f"run: {', '.join(map(repr, extra))} is not an input of graph {self.graph.name!r} "
                             f"(inputs: {', '.join(self.graph.inputs)})")
        out = {}
        for name, i in self.graph.inputs.items():
            node = self.graph.nodes[i]
            arr = np.asarray(feeds[name])
            if node.dtype == DType.BF16 and arr.dtype.name == "bfloat16":   # ml_dtypes.bfloat16: its bits
                arr = arr.view(np.uint16)
            if arr.dtype != node.dtype.numpy and not (arr.dtype.kind == node.dtype.numpy.kind == "f"
                                                      and np.can_cast(arr.dtype, node.dtype.numpy)):
                raise GraphError(f"run: input {name!r} has dtype {arr.dtype}, the graph declares "
                                 f"{node.dtype.value}")
            if arr.ndim != len(node.shape) or any(d != DYNAMIC and d != a for d, a in zip(node.shape, arr.shape)):
                raise GraphError(f"run: input {name!r} has shape {list(arr.shape)}, the graph declares "
                                 f"{list(node.shape)} (−1 = any)")
            out[name] = np.asarray(arr, dtype=node.dtype.numpy, order="C")   # keeps 0-d arrays 0-d
        return out

    def _write_params(self, spec: Specialization) -> None:
        written = spec.storage.params_written
        for name, view in spec.lowered.params.items():
            if name in written:
                continue
            if name not in self._params:
                raise GraphError(f"run: param {name!r} of graph {self.graph.name!r} was never set (set_param)")
            spec.arena.write(spec.plan.at(view), self._params[name])
            written.add(name)

    # ── specialization ──────────────────────────────────────────────────────

    def _static_shapes(self) -> tuple[Shape, ...]:
        return tuple(self.graph.nodes[i].shape for i in self.graph.inputs.values())

    def _specialization(self, shapes: tuple[Shape, ...]) -> Specialization:
        spec = self._specs.get(shapes)
        if spec is None:
            spec = self._specs[shapes] = self._build(shapes)
        self._last = spec
        return spec

    def _build(self, shapes: tuple[Shape, ...]) -> Specialization:
        built = build_schedule(self.graph, dict(zip(self.graph.inputs, shapes)), fusion=self.fusion)
        program = compile_schedule(built.schedule)
        return Specialization(built.graph, built.fusions, built.lowered, built.plan, built.schedule, program,
                              self._storage_for(built))

    def _storage_for(self, built: "Built") -> Storage:
        """The shared arena of this pinned layout (grown to fit), or a new one."""
        p = built.plan
        layout = tuple(sorted((p.offsets[b.id], b.nbytes, b.kind, b.label) for b in p.buffers if b.pinned))
        for storage in self._storages:
            if storage.layout == layout:
                storage.fit(p.arena_bytes)
                return storage
        storage = Storage(layout, p.pinned_bytes, Arena.from_bytes(built.arena_image()), set())
        self._storages.append(storage)
        return storage

    # ── inspection ──────────────────────────────────────────────────────────

    def _current(self) -> Specialization:
        if self._last is None:
            raise GraphError(f"graph {self.graph.name!r} has dynamic inputs and has not run yet: nothing compiled")
        return self._last

    @property
    def schedule(self) -> ThunkSchedule:
        """The thunk schedule of the last specialization compiled or run."""
        return self._current().schedule

    @property
    def program(self) -> Program:
        """The JIT-compiled program of the last specialization."""
        return self._current().program

    @property
    def fused_graph(self) -> GraphCore:
        """The graph after specialization and fusion (what was lowered)."""
        return self._current().graph

    def plan(self) -> Plan:
        """The arena plan: each buffer's offset, size and live range (`print(cg.plan().table())`)."""
        return self._current().plan

    def report(self) -> str:
        """Fusions that fired, then one line per thunk: the node it came from and its lowering path."""
        spec = self._current()
        rows = spec.program.report().rows
        lines = [f"graph @{self.graph.name}: {len(spec.graph.nodes)} nodes after fusion → "
                 f"{len(spec.schedule.thunks)} thunks, arena {spec.plan.arena_bytes} B", str(spec.fusions)]
        for step, row in zip(spec.lowered.steps, rows):
            lines.append(f"  t{row.index:<4} {row.kind:<22} {row.path:<8} ← %{step.node} {step.op}")
        lines.append("(%N: node ids of the graph as built; `print(graph)` lists them)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"CompiledGraph(@{self.graph.name}, inputs={list(self.graph.inputs)}, "
                f"params={list(self.graph.params)}, specializations={len(self._specs)})")


@dataclasses.dataclass
class Built:
    """A graph taken through specialize → fuse → lower → plan, as a ThunkSchedule (not yet compiled)."""

    graph: GraphCore
    fusions: FusionLog
    lowered: Lowered
    plan: Plan
    schedule: ThunkSchedule

    def arena_image(self) -> bytes:
        """The arena's starting bytes: zeros, with every constant in place."""
        image = bytearray(self.plan.arena_bytes)
        for b in self.plan.buffers:
            if b.data is not None:
                at = self.plan.offsets[b.id]
                image[at:at + b.nbytes] = b.data.tobytes()
        return bytes(image)

    def offset(self, operand) -> int:
        """Arena offset of a node id (its storage), a View or a Buffer."""
        from .lower import Buffer, View
        if isinstance(operand, int) and operand in self.lowered.views:
            return self.plan.at(self.lowered.views[operand])
        if isinstance(operand, View):
            return self.plan.at(operand)
        if isinstance(operand, Buffer):
            return self.plan.offsets[operand.id]
        raise GraphError(f"internal: a step asked for the offset of {operand!r}, not a view")


def build_schedule(graph: GraphCore, shapes: Mapping[str, Shape], *, fusion: bool = True) -> Built:
    """The schedule of `graph` with its inputs at `shapes`: specialize, fuse (unless `fusion` is False),
    lower, plan."""
    concrete = specialize(graph, dict(shapes))
    fused, log = fuse(concrete) if fusion else (concrete, FusionLog())
    lowered = lower(fused)
    placed = plan(lowered)
    built = Built(fused, log, lowered, placed, ThunkSchedule((), arena_bytes=placed.arena_bytes))
    built.schedule = ThunkSchedule([s.build(built.offset) for s in lowered.steps], arena_bytes=placed.arena_bytes)
    return built
