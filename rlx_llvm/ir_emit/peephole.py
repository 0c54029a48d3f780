"""Peephole fusions: two adjacent thunks whose joint effect one kernel computes in fewer passes.

The only one so far: `Copy(src → dst, len)` immediately followed by a `Softmax` over exactly those
`len` elements of `dst` (RLX and our graph front-end emit that pair whenever a softmax's input
and output live in different slots — semantics.md "In-place kernels").  The Copy's function runs
the out-of-place softmax (`reductions.softmax_from`: the max and exp passes read `src`, so the
copy's own pass over memory goes) and the Softmax's function does nothing; the arena afterwards is
the unfused pair's, bit for bit.  The pair
fuses only when nothing runs between the two thunks and `src` is `dst` or disjoint from it.
`Program.report()` shows it: the Copy's path is "llvm (fused with t<i+1>)", the Softmax's
"llvm (fused into t<i>)".  Nested schedules (Scan/CustomFn bodies) are not rewritten.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .. import thunks as T
from .context import EmitContext


@dataclass(frozen=True)
class Fusion:
    """Thunks `first` and `first + 1` run as one kernel, emitted into `first`'s function."""

    first: int
    emit: Callable[[EmitContext], None]

    def path(self, index: int) -> str:
        """What `Program.report()` shows for thunk `index` of the pair."""
        return f"llvm (fused with t{self.first + 1})" if index == self.first else f"llvm (fused into t{self.first})"

    def emit_at(self, ctx: EmitContext, index: int) -> None:
        """The body of thunk `index`: the fused kernel for the first, nothing for the second."""
        if index == self.first:
            self.emit(ctx)


def fusions(thunks: Sequence[object]) -> dict[int, Fusion]:
    """Every fusable adjacent pair of `thunks`, keyed by both of its indices."""
    found: dict[int, Fusion] = {}
    i = 0
    while i + 1 < len(thunks):
        emit = copy_then_softmax(thunks[i], thunks[i + 1])
        if emit is None:
            i += 1
            continue
        found[i] = found[i + 1] = Fusion(i, emit)
        i += 2
    return found


def copy_then_softmax(copy, soft) -> "Callable[[EmitContext], None] | None":
    """The out-of-place softmax that `copy` then `soft` amount to, or None when they do not pair."""
    if type(copy) is not T.Copy or type(soft) is not T.Softmax:
        return None
    n = soft.rows * soft.cols
    if not n or copy.len != n or soft.data != copy.dst or soft.rows % max(soft.inner, 1) or soft.inner < 1:
        return None
    if copy.src != copy.dst and abs(copy.src - copy.dst) < 4 * n:  # a partial overlap: keep the Copy
        return None
    from .reductions import softmax_from
    return lambda ctx: softmax_from(ctx, soft, copy.src)
