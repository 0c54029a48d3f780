"""The package's layering, read from the source with `ast`: the model layers (kernels, registry,
thunks) never import the IR emitters, and the module-level import graph of rlx_llvm has no cycle."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "rlx_llvm"
EMITTERS = "rlx_llvm.ir_emit"
BELOW_EMITTERS = ("rlx_llvm.kernels", "rlx_llvm.registry", "rlx_llvm.thunks")


def module_name(path: Path) -> str:
    """`rlx_llvm/ir_emit/gemm.py` → `rlx_llvm.ir_emit.gemm` (a package is its `__init__`)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(importer: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of `from <level dots><target> import …` written in `importer`."""
    if level == 0:
        return target or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _known(name: str) -> str | None:
    """`name` or its nearest enclosing module that is part of rlx_llvm (None for other packages)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _executed_at_import(body: list[ast.stmt]):
    """The statements of `body` that run when the module is imported: nested blocks, not function
    bodies, and not `if TYPE_CHECKING:` blocks."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _executed_at_import(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            yield from _executed_at_import(getattr(node, field, []))


def imports(module: str, *, module_level_only: bool) -> set[str]:
    """The rlx_llvm modules `module` imports (`from pkg import sub` counts `pkg.sub` when it is a module)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    nodes = list(_executed_at_import(tree.body)) if module_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node.level, node.module)
            names = [f"{target}.{alias.name}" for alias in node.names]
            names = [n if n in MODULES else target for n in names]
        else:
            continue
        found.update(k for k in map(_known, names) if k is not None and k != module)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as `[a, b, …, a]`, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


@pytest.mark.parametrize("layer", BELOW_EMITTERS)
def test_model_layers_do_not_import_the_emitters(layer: str) -> None:
    """Nothing in kernels, registry or thunks imports rlx_llvm.ir_emit, not even inside a function."""
    offenders = {m: sorted(i for i in imports(m, module_level_only=False) if i.startswith(EMITTERS))
                 for m in MODULES if m == layer or m.startswith(layer + ".")}
    assert {m: i for m, i in offenders.items() if i} == {}


def test_no_module_level_import_cycle() -> None:
    """The module-level import graph of rlx_llvm is acyclic."""
    graph = {m: imports(m, module_level_only=True) for m in MODULES}
    assert find_cycle(graph) is None, " → ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_cycles() -> None:
    """`find_cycle` reports a cycle and accepts a DAG (so the test above can fail)."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_sees_function_level_imports() -> None:
    """Function-level imports count for the layer check (kernels.threads imports lazily)."""
    assert imports("rlx_llvm.kernels.threads", module_level_only=False) >= {"rlx_llvm.kernels.blas"}


def test_the_package_is_marked_typed() -> None:
    """PEP 561: `py.typed` ships beside the package, so type checkers read its hints."""
    import rlx_llvm
    assert (Path(rlx_llvm.__file__).parent / "py.typed").is_file()
