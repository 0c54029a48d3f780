"""The NumPy reference registry: keyed by thunk class like the lowerings, names refused, run by `type(thunk)`."""
from __future__ import annotations

import numpy as np
import pytest

import rlx_llvm.reference as ref
from rlx_llvm import thunks as T


@pytest.mark.parametrize("bad", ["Sgemm", "Sgem", int, T.Thunk])
def test_a_reference_for_anything_but_a_thunk_class_is_refused(bad) -> None:
    with pytest.raises(TypeError, match="thunk classes"):
        ref.reference(bad)


def test_run_thunk_looks_up_the_thunks_class() -> None:
    ref.load_all()
    arena = np.zeros(64, np.uint8)
    arena[:16] = np.arange(4, dtype=np.float32).view(np.uint8)
    ref.run_thunk(arena, T.Copy(src=0, dst=32, len=4))
    np.testing.assert_array_equal(arena[32:48].view(np.float32), np.arange(4, dtype=np.float32))


def test_load_all_does_not_swallow_a_missing_family(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ref, "FAMILIES", ref.FAMILIES + ("rlx_llvm.reference.no_such_family",))
    with pytest.raises(ModuleNotFoundError):
        ref.load_all()
