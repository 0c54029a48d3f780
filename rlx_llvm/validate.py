"""Schedule validation: everything is checked before any native code exists."""
from __future__ import annotations

from .errors import UnsupportedThunkError, ValidationError
from .thunks.base import USIZE_MAX, _present


def _overlap(a, b) -> bool:
    return a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes


def _check_absent_buffers(raw) -> None:
    """`usize::MAX` means "no buffer": fine where the thunk would not touch it, an error otherwise."""
    for ext in raw:
        if ext.offset == USIZE_MAX and ext.nbytes > 0:
            raise ValidationError(f"is usize::MAX (no buffer) but the thunk needs {ext.nbytes} bytes there",
                                  field=ext.field)


def validate_thunk(index: int, thunk, arena_bytes: int, lowering) -> None:
    """Field ranges, extents inside the arena, no hazardous overlaps, the lowering's own checks."""
    kind = type(thunk).__name__
    try:
        thunk.check_fields()
        raw_reads, raw_writes = tuple(thunk._reads()), tuple(thunk._writes())  # walked once
        _check_absent_buffers(raw_reads + raw_writes)
        reads, writes = _present(raw_reads), _present(raw_writes)  # = thunk.reads(), thunk.writes()
        for ext in (*reads, *writes):
            if ext.offset < 0 or ext.offset + ext.nbytes > arena_bytes:
                why = f" ({ext.field} holds {ext.layout})" if ext.layout else ""
                raise ValidationError(f"bytes [{ext.offset}, {ext.offset + ext.nbytes}) lie outside the "
                                      f"arena of {arena_bytes} bytes{why}", field=ext.field)
        for i, w in enumerate(writes):
            for other in writes[i + 1:]:
                if _overlap(w, other):
                    raise ValidationError(f"output bytes [{w.offset}, {w.offset + w.nbytes}) overlap output "
                                          f"{other.field!r} [{other.offset}, {other.offset + other.nbytes})",
                                          field=w.field)
            for r in reads:
                same = (r.offset, r.nbytes) == (w.offset, w.nbytes)
                # An exact alias is fine for a buffer the thunk updates in place by definition (the
                # same field read and written, e.g. Softmax.data) or where the lowering allows it.
                in_place = same and (r.field == w.field or (lowering is not None and lowering.inplace))
                if _overlap(w, r) and not in_place:
                    raise ValidationError(f"output bytes [{w.offset}, {w.offset + w.nbytes}) overlap input "
                                          f"{r.field!r} [{r.offset}, {r.offset + r.nbytes})"
                                          + ("" if lowering is None or not lowering.inplace else
                                             " (only an exact in-place alias is allowed)"), field=w.field)
        if lowering is not None and lowering.check is not None:
            lowering.check(thunk)
    except ValidationError as exc:
        raise exc.at(index, kind) from None
    except (TypeError, AttributeError, OverflowError) as exc:
        raise ValidationError(f"malformed thunk: {exc}", index=index, kind=kind) from None


def validate_schedule(schedule, lowerings: dict) -> None:
    """Validate every thunk, then list every thunk that has no lowering."""
    from .schedule import ThunkSchedule
    from .thunks import Thunk
    if not isinstance(schedule, ThunkSchedule):
        raise ValidationError(f"expected a ThunkSchedule, got {type(schedule).__name__}")
    arena_bytes = schedule.arena_bytes
    if not isinstance(arena_bytes, int) or isinstance(arena_bytes, bool) or arena_bytes < 0:
        raise ValidationError(f"arena_bytes must be a non-negative int, got {arena_bytes!r}")
    missing = []
    for i, t in enumerate(schedule.thunks):
        if not isinstance(t, Thunk):
            raise ValidationError(f"not a thunk: {t!r}", index=i)
        low = lowerings.get(type(t))
        validate_thunk(i, t, arena_bytes, low)
        if low is None:
            missing.append((i, type(t).__name__))
    if missing:
        raise UnsupportedThunkError(missing)
