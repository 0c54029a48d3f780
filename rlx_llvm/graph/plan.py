"""Arena planning by liveness: buffers whose live ranges do not overlap share bytes.

A buffer lives from the step that first touches it to the step that last does; inputs from before
the first step, outputs to after the last.  Params and constants are pinned (their bytes persist
across runs) at the front.  The rest are placed greedily by decreasing size, each at the best-fitting
gap among the buffers live at the same time — TFLite's "greedy by size" arena planner — every offset
64-byte aligned.  `Plan.lower_bound` is the peak of simultaneously live bytes: no plan can be smaller.
"""
from __future__ import annotations

import dataclasses

from .lower import ALIGN, Buffer, Lowered, View


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclasses.dataclass
class Plan:
    """Where each buffer sits; `arena_bytes`, `lower_bound` and `intermediate_bytes` (the sum of every
    non-pinned buffer — inputs, temporaries, scratch, outputs — i.e. the arena with no sharing) are the figures."""

    buffers: list[Buffer]
    offsets: dict[int, int]
    arena_bytes: int
    lower_bound: int
    intermediate_bytes: int
    pinned_bytes: int

    @property
    def activation_bytes(self) -> int:
        """Arena bytes past the pinned params and constants: what planning decides."""
        return self.arena_bytes - self.pinned_bytes

    @property
    def activation_lower_bound(self) -> int:
        """The peak of simultaneously live non-pinned bytes."""
        return self.lower_bound - self.pinned_bytes

    def at(self, v: View) -> int:
        """Arena offset of a view."""
        return self.offsets[v.buffer.id] + v.offset

    def table(self) -> str:
        """One line per buffer: offset, bytes, kind, live range, label."""
        lines = [f"arena {self.arena_bytes} B = {self.pinned_bytes} B pinned (params, constants) + "
                 f"{self.activation_bytes} B planned; planned/peak-live = {self.activation_bytes} / "
                 f"{self.activation_lower_bound} B ({self.activation_bytes / max(self.activation_lower_bound, 1):.3f}×), "
                 f"lower bound {self.lower_bound} B; intermediates unshared {self.intermediate_bytes} B"]
        for b in sorted(self.buffers, key=lambda b: (self.offsets[b.id], b.id)):
            live = "all runs" if b.pinned else f"[{b.first}, {b.last}]"
            lines.append(f"  {self.offsets[b.id]:>10}  {b.nbytes:>10} B  {b.kind:<7} {live:<12} {b.label}")
        return "\n".join(lines)


def live_ranges(lowered: Lowered) -> None:
    """Set each buffer's `first`/`last` step from the steps' reads and writes."""
    end = len(lowered.steps)
    for t, step in enumerate(lowered.steps):
        for v in step.reads + step.writes:
            b = v.buffer
            b.first = t if b.first < 0 else min(b.first, t)
            b.last = max(b.last, t)
    for v in lowered.inputs.values():
        v.buffer.first = 0
        v.buffer.last = max(v.buffer.last, 0)
    for v in lowered.outputs:
        v.buffer.first = max(v.buffer.first, 0)
        v.buffer.last = end


def plan(lowered: Lowered) -> Plan:
    """Place every buffer; see the module docstring."""
    live_ranges(lowered)
    used = [b for b in lowered.buffers if b.pinned or b.first >= 0]
    offsets: dict[int, int] = {}
    top = 0
    for b in (b for b in used if b.pinned):
        offsets[b.id] = top
        top += _aligned(b.nbytes)
    base = top
    placed: list[Buffer] = []
    for b in sorted((b for b in used if not b.pinned), key=lambda b: (-b.nbytes, b.first, b.id)):
        offsets[b.id] = base + _best_fit(b, placed, offsets, base)
        placed.append(b)
    arena = max([top] + [offsets[b.id] + _aligned(b.nbytes) for b in placed])
    inter = sum(_aligned(b.nbytes) for b in used if not b.pinned)
    return Plan(used, offsets, max(arena, ALIGN), _peak(used), inter, base)


def _overlaps(a: Buffer, b: Buffer) -> bool:
    return a.first <= b.last and b.first <= a.last


def _best_fit(b: Buffer, placed: list[Buffer], offsets: dict[int, int], base: int) -> int:
    """The smallest gap (relative to `base`) among time-overlapping placed buffers that holds `b`."""
    size = _aligned(b.nbytes)
    busy = sorted((offsets[p.id] - base, offsets[p.id] - base + _aligned(p.nbytes)) for p in placed if _overlaps(b, p))
    best, best_gap, cursor = None, None, 0
    for lo, hi in busy:
        gap = lo - cursor
        if gap >= size and (best_gap is None or gap < best_gap):
            best, best_gap = cursor, gap
        cursor = max(cursor, hi)
    return cursor if best is None else best


def _peak(buffers: list[Buffer]) -> int:
    """The most bytes live at any one step (pinned buffers always)."""
    pinned = sum(_aligned(b.nbytes) for b in buffers if b.pinned)
    events: dict[int, int] = {}
    for b in buffers:
        if not b.pinned:
            events[b.first] = events.get(b.first, 0) + _aligned(b.nbytes)
            events[b.last + 1] = events.get(b.last + 1, 0) - _aligned(b.nbytes)
    peak = live = 0
    for t in sorted(events):
        live += events[t]
        peak = max(peak, live)
    return pinned + peak
