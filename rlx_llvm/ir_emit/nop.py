"""Nop: a native no-op (ThunkSchedule.strip_nops removes them before compiling)."""
from __future__ import annotations

from .. import thunks as T
from ..registry import lowering


@lowering(T.Nop)
def nop(ctx, t) -> None:
    """Emit nothing: the function just returns status 0."""
