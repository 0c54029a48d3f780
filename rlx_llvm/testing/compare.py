"""Comparing an example's outputs between two runs (native against `rlx_llvm.reference`, or thread counts)."""
from __future__ import annotations

import numpy as np

from .layout import Example

DEFAULT_RTOL = {2: 1e-3, 4: 1e-5, 8: 1e-12}   # by float width (complex: the width of its parts)


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float, what: str = "") -> None:
    """Integers bit-exact; floats NaN where `want` is NaN, else within `rtol·(|want| + max|want|)` (0: bit-exact)."""
    if want.dtype.kind == "c":
        got, want = (a.view(f"f{a.dtype.itemsize // 2}") for a in (got, want))
    if want.dtype.kind != "f" or rtol == 0:
        nan = np.isnan(want) & np.isnan(got) if want.dtype.kind == "f" else np.zeros(want.shape, bool)
        bad = np.flatnonzero((got.view(f"u{got.itemsize}") != want.view(f"u{want.itemsize}")) & ~nan)
    else:
        g, w = got.astype(np.float64), want.astype(np.float64)
        scale = np.max(np.abs(w[np.isfinite(w)]), initial=0.0)
        with np.errstate(invalid="ignore"):
            ok = (g == w) | (np.isnan(g) & np.isnan(w)) | (np.abs(g - w) <= rtol * (np.abs(w) + scale))
        bad = np.flatnonzero(~ok)
    assert bad.size == 0, f"{what}: {bad.size} of {want.size} differ, first at {bad[:5]}: " \
                          f"got {got[bad[:5]]}, want {want[bad[:5]]}"


def assert_outputs_match(example: Example, got: np.ndarray, want: np.ndarray) -> None:
    """Every output of `example` in arena bytes `got` matches the same bytes of `want` (`example.rtol`, else by dtype)."""
    for offset, dtype, count in example.outputs():
        g, w = (a[offset:offset + count * dtype.itemsize].view(dtype) for a in (got, want))
        width = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
        rtol = example.rtol if example.rtol is not None else DEFAULT_RTOL.get(width, 0.0)
        assert_close(g, w, rtol, f"{example.name}: output at byte {offset}")
