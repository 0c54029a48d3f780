"""ONNX ModelProto → `Graph`, for concrete input shapes.

Importing happens per input shape (like the graph's own specialization): every shape computation in
the model — `Shape`, `Gather` on shapes, `Concat`, `Range`, `ConstantOfShape`… — then has constant
inputs and is folded at import time by running ONNX's own reference implementation of that node
(`onnx.reference`), so only tensor math reaches the graph.  Initializers become params (carrying
their values) when the math reads them, or stay constants when only folding does.

Each op is one converter, registered with `@converts("OpType", …)` in a family module (`ops_*.py`):

    @converts("Relu")
    def _(cx: Convert, node) -> list[Value]:
        return [cx.g.relu(cx.tensor(node.input[0]))]

An op type nobody converts, or an attribute a converter cannot honour, is collected; the import then
fails with one `OnnxImportError` listing every such node.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterable, Mapping, Sequence

import ml_dtypes
import numpy as np

from ..dtypes import DType
from ..errors import RlxError
from ..graph import Graph, Value
from ..graph.core import GraphError

Converter = Callable[["Convert", Any], "Sequence[Value | np.ndarray | None]"]
CONVERTERS: dict[tuple[str, str], Converter] = {}
FOLD_LIMIT = 1 << 16          # constant results up to this many elements are folded at import time
PARAM_MIN = 64                # initializers read as tensors: params from this many elements, else constants


class OnnxImportError(RlxError, NotImplementedError):
    """One or more nodes cannot be imported; `problems` holds one line per node.

    `wanted` names the tensors that converters needed as import-time constants but that are only
    known at run time (a caller may specialize the model on their values and import again)."""

    def __init__(self, problems: list[str], wanted: Iterable[str] = ()) -> None:
        self.problems = problems
        self.wanted = sorted(wanted)
        super().__init__(f"{len(problems)} ONNX node(s) cannot be imported:\n  " + "\n  ".join(problems))


class Unsupported(Exception):
    """Raised by a converter for an attribute or input form it cannot honour (message: what is missing)."""


def converts(*op_types: str, domain: str = "") -> Callable[[Converter], Converter]:
    """Register a converter for `op_types` of `domain` ("" = ai.onnx, "com.microsoft" = ORT contrib)."""
    def register(fn: Converter) -> Converter:
        for t in op_types:
            CONVERTERS[(domain, t)] = fn
        return fn
    return register


ONNX_DTYPES = {1: DType.F32, 2: DType.U8, 3: DType.I8, 5: DType.I16, 6: DType.I32, 7: DType.I64, 9: DType.Bool,
               10: DType.F16, 11: DType.F64, 12: DType.U32, 14: DType.C64, 15: DType.C128, 16: DType.BF16}


def dtype_of(elem_type: int, where: str) -> DType:
    """The DType of an ONNX TensorProto element type."""
    if elem_type not in ONNX_DTYPES:
        import onnx
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() else elem_type
        raise Unsupported(f"{where}: element type {name} is not supported")
    return ONNX_DTYPES[elem_type]


def node_label(node) -> str:
    """`Conv "conv1"` — how errors name a node."""
    domain = f"{node.domain}." if node.domain not in ("", "ai.onnx") else ""
    return f"{domain}{node.op_type} {node.name!r}" if node.name else f"{domain}{node.op_type} (outputs {list(node.output)})"


class Convert:
    """What a converter sees: the graph being built, the node's attributes, tensors and constants."""

    def __init__(self, model, shapes: Mapping[str, Sequence[int]] | None, name: str | None = None) -> None:
        import onnx
        from onnx import numpy_helper
        self.model = model
        self.opset = {op.domain or "": op.version for op in model.opset_import}
        graph = model.graph
        self.g = Graph(name or graph.name or "onnx")
        self.env: dict[str, "Value | np.ndarray"] = {}
        self.initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self._as_tensor: dict[str, Value] = {}
        self.wanted: set[str] = set()
        self.roots: dict[str, set[str]] = {}     # value → the graph inputs it is computed from
        self.onnx = onnx
        shapes = dict(shapes or {})
        for inp in graph.input:
            if inp.name in self.initializers:
                continue
            t = inp.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
            if inp.name in shapes:
                given = tuple(int(d) for d in shapes[inp.name])
                if len(given) != len(dims) or any(d not in (-1, x) for d, x in zip(dims, given)):
                    raise GraphError(f"onnx input {inp.name!r}: shape {list(given)} does not fit the model's {dims}")
                dims = list(given)
            if -1 in dims:
                raise GraphError(f"onnx input {inp.name!r} has symbolic dims {dims}: pass its concrete shape "
                                 f"(rl.onnx.load(model, shapes={{{inp.name!r}: (...)}}) or use rl.onnx.run / OnnxModel)")
            self.env[inp.name] = self.g.input(inp.name, dims, dtype_of(t.elem_type, f"input {inp.name!r}"))
        for name, arr in self.initializers.items():
            self.env[name] = arr

    # ── reading operands ────────────────────────────────────────────────────

    def has(self, node, i: int) -> bool:
        """True when the node's input `i` exists and is not the empty name (an omitted optional input)."""
        return i < len(node.input) and node.input[i] != ""

    def const(self, name: str) -> np.ndarray | None:
        """The import-time value of `name`, or None when it is only known at run time."""
        v = self.env[name]
        return v if isinstance(v, np.ndarray) else None

    def need_const(self, node, i: int, what: str) -> np.ndarray:
        """Input `i` as an import-time constant (shape arguments, axes…), else Unsupported."""
        v = self.const(node.input[i]) if self.has(node, i) else None
        if v is None:
            if self.has(node, i):
                self.want(node.input[i])
            raise Unsupported(f"input {i} ({what}) must be a constant or computable from shapes")
        return v

    def want(self, name: str) -> None:
        """Record that `name` is needed at import time: it and the graph inputs it is computed from."""
        self.wanted.add(name)
        self.wanted.update(self.roots.get(name, ()))

    def tensor(self, name: str) -> Value:
        """`name` as a graph value: constants become params (large initializers) or baked constants."""
        v = self.env[name]
        if isinstance(v, Value):
            return v
        if name not in self._as_tensor:
            arr = np.asarray(v)
            dt = dtype_of_numpy(arr.dtype, name)
            arr = bf16_bits(arr)
            if name in self.initializers and arr.size >= PARAM_MIN:
                self._as_tensor[name] = self.g.param(_param_name(self.g, name), arr.shape, dt, value=arr)
            else:
                self._as_tensor[name] = self.g.constant(arr, dt)
        return self._as_tensor[name]

    def shape(self, name: str) -> tuple[int, ...]:
        """Concrete shape of `name`."""
        v = self.env[name]
        return tuple(v.shape)

    def dtype(self, name: str) -> DType:
        """Element type of `name`."""
        v = self.env[name]
        return v.dtype if isinstance(v, Value) else dtype_of_numpy(np.asarray(v).dtype, name)

    def attr(self, node, name: str, default: Any = None) -> Any:
        """Attribute `name` of `node` as a Python value (ints, floats, strings, lists, tensors as arrays)."""
        for a in node.attribute:
            if a.name == name:
                value = self.onnx.helper.get_attribute_value(a)
                if isinstance(value, bytes):
                    return value.decode()
                if isinstance(value, self.onnx.TensorProto):
                    return self.onnx.numpy_helper.to_array(value)
                if isinstance(value, list) and value and isinstance(value[0], bytes):
                    return [v.decode() for v in value]
                return value
        return default

    # ── the import ──────────────────────────────────────────────────────────

    def run(self) -> Graph:
        """Convert every node; raise one OnnxImportError listing every node that could not be."""
        nodes = list(self.model.graph.node)
        problems = [f"{node_label(n)}: op {n.op_type!r} (domain {n.domain or 'ai.onnx'!r}) is not supported"
                    for n in nodes if _key(n) not in CONVERTERS and n.op_type not in FOLD_ONLY]
        failed: set[str] = set()
        for node in nodes:
            roots = set().union(*(self.roots.get(i, {i}) for i in node.input
                                  if i and not isinstance(self.env.get(i), np.ndarray)))
            self.roots.update((o, roots) for o in node.output if o)
            if any(i in failed for i in node.input) or (_key(node) not in CONVERTERS and node.op_type not in FOLD_ONLY):
                failed.update(node.output)
                continue
            try:
                self._convert(node)
            except (Unsupported, GraphError) as exc:
                problems.append(f"{node_label(node)}: {exc}")
                failed.update(node.output)
        if problems:
            raise OnnxImportError(problems, self.wanted)
        outs = []
        for o in self.model.graph.output:
            outs.append(self.tensor(o.name))
        self.g.set_outputs(outs)
        return self.g

    def _convert(self, node) -> None:
        if all(self.const(i) is not None for i in node.input if i) and node.op_type not in NEVER_FOLD:
            folded = self._fold(node)
            if folded is not None:
                self.env.update(zip(node.output, folded))
                return
        if _key(node) not in CONVERTERS:
            for i in node.input:
                if i and self.const(i) is None:
                    self.want(i)
            raise Unsupported(f"op {node.op_type!r} is only supported on import-time constants")
        results = CONVERTERS[_key(node)](self, node)
        for name, value in zip(node.output, results):
            if name and value is not None:
                self.env[name] = value

    def _fold(self, node) -> list[np.ndarray] | None:
        """Evaluate a node whose inputs are all constants with onnx.reference (None if too big or it fails)."""
        from onnx.reference import ReferenceEvaluator
        inputs = [self.env[i] for i in node.input if i]
        if sum(np.asarray(a).size for a in inputs) > FOLD_LIMIT * 4:
            return None
        try:
            opsets = [self.onnx.helper.make_opsetid(d, v) for d, v in self.opset.items()]
            g = self.onnx.helper.make_graph(
                [node], "fold", [self.onnx.helper.make_tensor_value_info(i, self.onnx.TensorProto.UNDEFINED, None)
                                 for i in node.input if i],
                [self.onnx.helper.make_tensor_value_info(o, self.onnx.TensorProto.UNDEFINED, None)
                 for o in node.output if o])
            m = self.onnx.helper.make_model(g, opset_imports=opsets)
            feeds = {i: self.env[i] for i in node.input if i}
            out = ReferenceEvaluator(m).run(None, feeds)
        except Exception:  # noqa: BLE001 - an op the reference cannot fold is converted instead
            return None
        if any(np.asarray(o).size > FOLD_LIMIT for o in out):
            return None
        return [np.asarray(o) for o in out]


FOLD_ONLY = {"Shape", "Size", "ConstantOfShape", "Range", "Constant", "NonZero", "EyeLike", "OneHot",
             "HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix"}
NEVER_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


HALVES = (DType.F16, DType.BF16)


def in_f32(fn: Converter) -> Converter:
    """Converter `fn` for f16/bf16 operands: they are widened to f32, the op is computed in f32 and each
    f32 result is rounded back to the operands' half type once (RLX's half-precision math)."""
    @functools.wraps(fn)
    def convert(cx: Convert, node) -> "Sequence[Value | np.ndarray | None]":
        halves = {i: cx.env[i] for i in node.input if i and _half_dtype(cx.env[i]) is not None}
        if not halves:
            return fn(cx, node)
        half = _half_dtype(next(iter(halves.values())))
        for name in halves:
            cx.env[name] = cx.g.cast(cx.tensor(name), DType.F32)
        try:
            outs = fn(cx, node)
        finally:
            cx.env.update(halves)
        return [cx.g.cast(o, half) if isinstance(o, Value) and o.dtype == DType.F32 else o for o in outs]
    return convert


def _half_dtype(v: "Value | np.ndarray") -> DType | None:
    """F16 / BF16 for a half-precision value or constant, else None."""
    dt = v.dtype if isinstance(v, Value) else _NUMPY_TO_DTYPE.get(np.asarray(v).dtype)
    return dt if dt in HALVES else None


def _key(node) -> tuple[str, str]:
    return ("" if node.domain in ("", "ai.onnx") else node.domain, node.op_type)


def _param_name(g: Graph, name: str) -> str:
    base, k = name or "initializer", 1
    while base in g.params or base in g.inputs:
        base, k = f"{name}.{k}", k + 1
    return base


_NUMPY_TO_DTYPE = {np.dtype(np.float32): DType.F32, np.dtype(np.float64): DType.F64,
                   np.dtype(np.float16): DType.F16, np.dtype(np.int8): DType.I8, np.dtype(np.uint8): DType.U8,
                   np.dtype(np.int16): DType.I16, np.dtype(np.int32): DType.I32, np.dtype(np.int64): DType.I64,
                   np.dtype(np.uint32): DType.U32, np.dtype(np.bool_): DType.Bool,
                   np.dtype(np.complex64): DType.C64, np.dtype(ml_dtypes.bfloat16): DType.BF16}


def bf16_bits(arr: np.ndarray) -> np.ndarray:
    """A bfloat16 array as the uint16 bit pattern RLX stores (other arrays unchanged)."""
    return arr.view(np.uint16) if arr.dtype == ml_dtypes.bfloat16 else arr


def as_bf16(arr: np.ndarray, dt: DType) -> np.ndarray:
    """A value RLX computed as `dt`: bf16 bits viewed as ml_dtypes.bfloat16 (what ONNX returns)."""
    return arr.view(ml_dtypes.bfloat16) if dt == DType.BF16 and arr.dtype == np.uint16 else arr


def dtype_of_numpy(dt: np.dtype, where: str) -> DType:
    """The DType of a NumPy dtype."""
    if np.dtype(dt) not in _NUMPY_TO_DTYPE:
        raise Unsupported(f"{where}: dtype {dt} is not supported")
    return _NUMPY_TO_DTYPE[np.dtype(dt)]


@converts("Constant")
def _constant(cx: Convert, node) -> list:
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        v = cx.attr(node, key)
        if v is not None:
            return [np.asarray(v, np.float32 if "float" in key else (np.int64 if "int" in key else None))]
    raise Unsupported("Constant without a value attribute this importer reads")


@converts("Identity")
def _identity(cx: Convert, node) -> list:
    return [cx.env[node.input[0]]]


def load(model: "str | Any", shapes: Mapping[str, Sequence[int]] | None = None, name: str | None = None) -> Graph:
    """An ONNX model (path or ModelProto) as a `Graph` for the given (or the model's static) input shapes."""
    return Convert(_model(model), shapes, name).run()


def _model(model):
    """The ModelProto of a path or proto, read and checked (`ops_models.prepare`: clear errors for corrupt
    files, cycles, initializers whose bytes disagree with their shape)."""
    from .ops_models import prepare
    return prepare(model)
