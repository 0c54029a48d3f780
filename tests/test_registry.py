"""The registry is consistent: lowerings ⊆ thunk kinds ⊆ references, one family list, and
`coverage()` says what `Program.report()` shows."""
from __future__ import annotations

import sys
from collections import defaultdict

import pytest

import rlx_llvm as rl
import rlx_llvm.reference as ref
from rlx_llvm import registry
from rlx_llvm import thunks as T
from rlx_llvm.testing import examples, pack

registry.load_all()
ref.load_all()


def test_every_lowering_names_a_real_kind() -> None:
    for cls, low in registry.LOWERINGS.items():
        assert T.ALL_THUNKS[cls.__name__] is cls and low.cls is cls and low.kind == cls.__name__
        assert low.path in (registry.NATIVE_PATHS if low.emit else ("scipy",))
        assert (low.emit is None) != (low.run is None), f"{low.kind}: exactly one of emit/run"


def test_every_lowered_kind_has_a_reference() -> None:
    missing = sorted(cls.__name__ for cls in registry.LOWERINGS
                     if cls not in ref.REFERENCES and cls is not T.Nop)
    assert not missing, f"lowered kinds without a NumPy reference: {missing}"


def test_every_reference_names_a_real_kind() -> None:
    for cls in ref.REFERENCES:
        assert isinstance(cls, type) and T.ALL_THUNKS.get(cls.__name__) is cls, cls


@pytest.mark.parametrize("bad", ["LayerNorm", "LayerNrom", int, T.Thunk])
def test_a_lowering_for_anything_but_a_thunk_class_is_refused(bad) -> None:
    with pytest.raises(TypeError, match="thunk classes"):
        registry.lowering(bad)


def test_registering_a_kind_twice_is_refused() -> None:
    with pytest.raises(RuntimeError, match="registered twice"):
        registry.lowering(T.Copy)(lambda ctx, t: None)
    assert registry.LOWERINGS[T.Copy].emit.__name__ != "<lambda>"


def test_the_family_list_is_the_set_of_registering_modules() -> None:
    by_module: dict[str, list[str]] = defaultdict(list)
    for low in registry.LOWERINGS.values():
        by_module[(low.emit or low.run).__module__].append(low.kind)
    assert set(by_module) == set(registry.FAMILIES), \
        f"FAMILIES {sorted(registry.FAMILIES)} vs modules that register {sorted(by_module)}"
    for name in registry.FAMILIES:
        assert name in sys.modules


def test_coverage_counts_every_kind_once() -> None:
    cov = rl.coverage()
    assert list(cov) == list(T.ALL_THUNKS)
    lowered = {k for k, v in cov.items() if v != "missing"}
    assert lowered == {cls.__name__ for cls in registry.LOWERINGS}
    for path in cov.values():
        assert set(path.split("|")) <= {*registry.PATHS, "missing"}


@pytest.fixture(scope="module")
def reported_paths() -> dict[str, set[str]]:
    """kind → the paths `report()` showed for its examples (one Program for all of them)."""
    prog = rl.compile(pack(examples()).schedule, cache=False)
    seen: dict[str, set[str]] = defaultdict(set)
    for row in prog.report():
        seen[row.kind].add(row.path)
    return seen


def test_coverage_agrees_with_report(reported_paths) -> None:
    cov = rl.coverage()
    for kind, paths in reported_paths.items():
        allowed = set(cov[kind].split("|"))
        assert paths <= allowed, f"{kind}: report() shows {sorted(paths)}, coverage() says {cov[kind]!r}"
