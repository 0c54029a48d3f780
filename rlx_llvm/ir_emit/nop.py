"""Nop: a native no-op (ThunkSchedule.strip_nops removes them before compiling)."""
from __future__ import annotations

from .registry import lowering


@lowering("Nop")
def nop(ctx, t) -> None:
    """Emit nothing: the function just returns status 0."""
