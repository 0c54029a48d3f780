"""The graph model: `Node`s in build order, `Value` handles with operator overloading, shape inference.

    g = Graph("mlp")
    x = g.input("x", [-1, 4])          # −1: a dynamic dim, specialized per concrete shape at run time
    w = g.param("w", [4, 3])
    y = g.relu(x @ w + g.param("b", [3]))
    g.set_outputs([y])

Every builder infers its output shape and dtype at once, so a mismatch is an error at the line that
made it, naming the op and both shapes.  Op definitions (inference + lowering) live one module per
family (`elementwise`, `linalg`, `shape`, `reductions`, `nn`) and register in `opset.OPS`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

import numpy as np

from ..dtypes import DType
from ..errors import ValidationError

Shape = tuple[int, ...]
DYNAMIC = -1


class GraphError(ValidationError):
    """A graph that cannot be built, specialized or fed: names the op (or input) and the shapes."""


@dataclasses.dataclass(frozen=True)
class Node:
    """One op: `inputs` are node ids; `attrs` its static arguments; `shape`/`dtype` inferred."""

    id: int
    op: str
    inputs: tuple[int, ...]
    attrs: dict[str, Any]
    shape: Shape
    dtype: DType
    name: str | None = None
    origin: int | None = None
    """The id of the node this one was made from in the user's graph (fusion passes renumber)."""

    @property
    def source_id(self) -> int:
        """The id the user's graph gave this node (or its fused root)."""
        return self.id if self.origin is None else self.origin

    def describe(self) -> str:
        """`%3 = matmul(%1, %2) {…} : [2, 4] f32` — one line of the graph's listing."""
        args = ", ".join(f"%{i}" for i in self.inputs)
        shown = {k: v for k, v in self.attrs.items() if not isinstance(v, np.ndarray)}
        attrs = " {" + ", ".join(f"{k}={_short(v)}" for k, v in shown.items()) + "}" if shown else ""
        label = f' "{self.name}"' if self.name else ""
        return f"%{self.id}{label} = {self.op}({args}){attrs} : {list(self.shape)} {self.dtype.value}"


def _short(v: Any) -> str:
    text = v.name if hasattr(v, "name") and not isinstance(v, (str, Node)) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def numel(shape: Sequence[int]) -> int:
    """Elements of a concrete shape (1 for a scalar)."""
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1


def parse_dtype(dtype: "DType | str | np.dtype | type", where: str) -> DType:
    """A DType from its name (`"f32"`, `"float32"`, `"bf16"`…) or a NumPy dtype; GraphError otherwise."""
    try:
        return DType.parse(dtype)
    except ValueError:
        raise GraphError(f"{where}: unknown dtype {dtype!r} (use f32, f16, bf16, f64, i8, u8, i16, i32, "
                         f"u32, i64, bool, c64)") from None


def parse_shape(shape: Iterable[int], where: str) -> Shape:
    """A tuple of dims, each ≥ 0 or −1 (dynamic)."""
    dims = tuple(int(d) for d in shape)
    if any(d < DYNAMIC for d in dims):
        raise GraphError(f"{where}: dims must be ≥ 0 or −1 (dynamic), got {list(dims)}")
    return dims


def is_static(shape: Shape) -> bool:
    """True when no dim is dynamic."""
    return DYNAMIC not in shape


def broadcast(a: Shape, b: Shape, op: str) -> Shape:
    """NumPy broadcasting of two shapes with dynamic dims; GraphError naming `op` and both shapes."""
    out = []
    for x, y in zip((1,) * (len(b) - len(a)) + a, (1,) * (len(a) - len(b)) + b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        elif DYNAMIC in (x, y):
            out.append(max(x, y))
        else:
            raise GraphError(f"{op}: shapes {list(a)} and {list(b)} do not broadcast")
    return tuple(out)


class Value:
    """A handle on a node's result; arithmetic and `@` build new nodes in the same graph."""

    __slots__ = ("graph", "id")

    def __init__(self, graph: "GraphCore", id: int) -> None:
        self.graph = graph
        self.id = id

    @property
    def node(self) -> Node:
        """The node that produces this value."""
        return self.graph.nodes[self.id]

    @property
    def shape(self) -> Shape:
        """Inferred shape (−1 for a dynamic dim)."""
        return self.node.shape

    @property
    def dtype(self) -> DType:
        """Inferred element type."""
        return self.node.dtype

    @property
    def ndim(self) -> int:
        """Rank."""
        return len(self.node.shape)

    def __repr__(self) -> str:
        return f"<Value {self.node.describe()}>"

    def __index__(self) -> int:
        return self.id

    def _lift(self, other: "Value | float | int") -> "Value":
        return other if isinstance(other, Value) else self.graph.constant(other, self.dtype)

    def __add__(self, o): return self.graph.add(self, self._lift(o))
    def __radd__(self, o): return self.graph.add(self._lift(o), self)
    def __sub__(self, o): return self.graph.sub(self, self._lift(o))
    def __rsub__(self, o): return self.graph.sub(self._lift(o), self)
    def __mul__(self, o): return self.graph.mul(self, self._lift(o))
    def __rmul__(self, o): return self.graph.mul(self._lift(o), self)
    def __truediv__(self, o): return self.graph.div(self, self._lift(o))
    def __rtruediv__(self, o): return self.graph.div(self._lift(o), self)
    def __pow__(self, o): return self.graph.pow(self, self._lift(o))
    def __neg__(self): return self.graph.neg(self)
    def __matmul__(self, o): return self.graph.matmul(self, o)
    def __lt__(self, o): return self.graph.compare("lt", self, self._lift(o))
    def __le__(self, o): return self.graph.compare("le", self, self._lift(o))
    def __gt__(self, o): return self.graph.compare("gt", self, self._lift(o))
    def __ge__(self, o): return self.graph.compare("ge", self, self._lift(o))
    __hash__ = object.__hash__

    @property
    def T(self) -> "Value":
        """The last two axes swapped."""
        perm = list(range(self.ndim))
        perm[-2:] = perm[-1], perm[-2]
        return self.graph.transpose(self, perm)

    def reshape(self, *shape: int) -> "Value":
        """`graph.reshape(self, shape)`."""
        return self.graph.reshape(self, shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape)

    def sum(self, axes=None, keep_dim: bool = False) -> "Value":
        """`graph.sum(self, axes, keep_dim)`."""
        return self.graph.sum(self, axes, keep_dim)

    def mean(self, axes=None, keep_dim: bool = False) -> "Value":
        """`graph.mean(self, axes, keep_dim)`."""
        return self.graph.mean(self, axes, keep_dim)


Ref = "Value | int"


class GraphCore:
    """Nodes, inputs, params and outputs; `add_node` runs the op's shape inference."""

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.nodes: list[Node] = []
        self.inputs: dict[str, int] = {}
        self.params: dict[str, int] = {}
        self.outputs: list[int] = []
        self.param_values: dict[str, np.ndarray] = {}

    # ── sources ─────────────────────────────────────────────────────────────

    def input(self, name: str, shape: Iterable[int], dtype: "DType | str" = "f32") -> Value:
        """A run-time input fed by name; −1 dims are dynamic."""
        self._new_name(name, "input")
        v = self._source("input", name, parse_shape(shape, f"input {name!r}"), parse_dtype(dtype, f"input {name!r}"))
        self.inputs[name] = v.id
        return v

    def param(self, name: str, shape: Iterable[int], dtype: "DType | str" = "f32",
              value: "np.ndarray | None" = None) -> Value:
        """A named parameter (static shape) set with `CompiledGraph.set_param`; `value`, if given, is its
        default (importers carry their weights this way)."""
        self._new_name(name, "param")
        dims = parse_shape(shape, f"param {name!r}")
        if not is_static(dims):
            raise GraphError(f"param {name!r}: a parameter's shape must be static, got {list(dims)}")
        v = self._source("param", name, dims, parse_dtype(dtype, f"param {name!r}"))
        self.params[name] = v.id
        if value is not None:
            arr = np.asarray(value)
            if arr.shape != dims:
                raise GraphError(f"param {name!r}: value of shape {list(arr.shape)} for declared {list(dims)}")
            self.param_values[name] = np.array(arr, dtype=v.dtype.numpy, order="C")
        return v

    def constant(self, value: "np.ndarray | float | int | Sequence", dtype: "DType | str | None" = None) -> Value:
        """A constant tensor baked into the arena at compile time."""
        dt = parse_dtype(dtype, "constant") if dtype is not None else None
        if dt == DType.BF16 and np.asarray(value).dtype != np.uint16:   # numbers, not bf16 bit patterns
            from ..reference.halves import f32_to_bf16_bits
            value = f32_to_bf16_bits(np.asarray(value, np.float32))
        data = np.asarray(value, dtype=dt.numpy if dt else None)
        if dt is None:
            dt = DType.F32 if data.dtype.kind == "f" else parse_dtype(data.dtype, "constant")
            data = data.astype(dt.numpy)
        return self.add_node("constant", (), {"data": np.array(data, order="C")}, shape=data.shape, dtype=dt)

    def set_outputs(self, outputs: "Sequence[Value | int]") -> None:
        """The values `run` returns, in order."""
        ids = [self._id(o, "set_outputs") for o in outputs]
        if not ids:
            raise GraphError("set_outputs: a graph needs at least one output")
        self.outputs = ids

    def shape_of(self, v: "Value | int") -> tuple[list[int], str]:
        """`(dims, dtype name)` of a value, as pyrlx returns them."""
        node = self.nodes[self._id(v, "shape_of")]
        return list(node.shape), node.dtype.value

    def value(self, id: int) -> Value:
        """The handle of node `id`."""
        return Value(self, id)

    # ── building ────────────────────────────────────────────────────────────

    def add_node(self, op: str, inputs: "Sequence[Value | int]", attrs: dict[str, Any] | None = None, *,
                 shape: Shape | None = None, dtype: DType | None = None, name: str | None = None) -> Value:
        """Append `op(inputs)`; shape/dtype come from the op's inference unless given (sources)."""
        from .opset import infer
        ids = tuple(self._id(i, op) for i in inputs)
        attrs = dict(attrs or {})
        if shape is None or dtype is None:
            shape, dtype = infer(op, [self.nodes[i] for i in ids], attrs)
        node = Node(len(self.nodes), op, ids, attrs, tuple(int(d) for d in shape), dtype, name)
        self.nodes.append(node)
        return Value(self, node.id)

    def _source(self, op: str, name: str, shape: Shape, dtype: DType) -> Value:
        return self.add_node(op, (), {"name": name}, shape=shape, dtype=dtype, name=name)

    def _new_name(self, name: str, what: str) -> None:
        if not isinstance(name, str) or not name:
            raise GraphError(f"{what}: a name is a non-empty string, got {name!r}")
        if name in self.inputs or name in self.params:
            raise GraphError(f"{what} {name!r}: the name is already an input or param of graph {self.name!r}")

    def _id(self, v: "Value | int", op: str) -> int:
        if isinstance(v, Value):
            if v.graph is not self:
                raise GraphError(f"{op}: %{v.id} belongs to graph {v.graph.name!r}, not {self.name!r}")
            return v.id
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= int(v) < len(self.nodes):
            return int(v)
        raise GraphError(f"{op}: {v!r} is not a value of graph {self.name!r}")

    # ── inspection ──────────────────────────────────────────────────────────

    def __len__(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        outs = set(self.outputs)
        lines = [f"graph @{self.name} ({len(self.nodes)} nodes, {len(self.outputs)} outputs)"]
        lines += ["  " + n.describe() + ("  ← output" if n.id in outs else "") for n in self.nodes]
        return "\n".join(lines)
