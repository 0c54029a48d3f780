"""Shared bodies: thunks that differ only in where their buffers sit compile to one function.

A transformer stacks N identical layers; emitting, optimizing and code-generating N copies of the
same FusedBertLayer costs N times the compile time for nothing.  For a lowering registered with
`shared_body=True`, the thunk is first rewritten to a *canonical* thunk whose buffer fields hold
virtual offsets — buffer k (numbered by first appearance, equal offsets sharing a number, so
aliasing is kept) at `k·FIELD_STRIDE + offset % 64`; 0 and `usize::MAX` (absent buffers) stay —
and the emitter runs once per distinct canonical thunk, into `t<i>_<kind>.body(ptr fields,
ptr scratch)`.  `EmitContext.addr` maps a virtual offset to `fields[k] + byte`.  Each thunk's own
function `t<i>_<kind>(arena, scratch)` just fills the table (`fields[0]` = the arena, `fields[k]`
= `arena + offset_k − offset_k % 64`) and calls the body.  Keeping `offset % 64` keeps every
alignment fact an emitter may derive from an offset (element alignment, 64-byte lines).
"""
from __future__ import annotations

import dataclasses
import enum
import functools
from itertools import chain
from typing import Any, Hashable

from .._sumtype import SumType
from ..thunks.base import USIZE_MAX, Thunk, _hints, _optional, _payload_fields, _split, _tuple_of
from .context import FIELD_STRIDE

LINE = 64


def buffer_fields(thunk: Thunk) -> list[str]:
    """The thunk's offset fields, in declaration order (those its read/write extents name; an extent
    `input_offs[2]` names entry 2 of the tuple-valued field `input_offs`)."""
    return list(_offset_fields(thunk))


def _offset_fields(thunk: Thunk) -> dict[str, bool]:
    """Offset field → whether its extents index it (`input_offs[2]`), in declaration order."""
    named: dict[str, bool] = {}
    for e in chain(thunk._reads(), thunk._writes()):
        name, bracket, _ = e.field.partition("[")
        named[name] = bool(bracket)
    return {name: named[name] for name in _field_names(type(thunk)) if name in named}


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def canonical(thunk: Thunk) -> tuple[Thunk, list[int]]:
    """The canonical thunk and the real offset of each virtual buffer (index k - 1 for buffer k).

    An indexed offset field holds an offset per entry (`ElementwiseRegion.input_offs`) or entries
    that carry one (`Concat.inputs`: `(offset, axis_extent, numel)`); the offset in such a tuple is
    first unless the class's `outer_offset_at` says otherwise (as `testing.layout` reads it)."""
    numbers: dict[int, int] = {}
    bases: list[int] = []

    def virtual(offset: int) -> int:
        if offset in (0, USIZE_MAX):
            return offset
        if offset not in numbers:
            bases.append(offset - offset % LINE)
            numbers[offset] = len(bases)
        return numbers[offset] * FIELD_STRIDE + offset % LINE

    def entry(value: "int | tuple", at: int) -> "int | tuple":
        if isinstance(value, int):
            return virtual(value)
        return (*value[:at], virtual(value[at]), *value[at + 1:])

    changes = {}
    for name, indexed in _offset_fields(thunk).items():
        value, at = getattr(thunk, name), getattr(type(thunk), "outer_offset_at", {}).get(name, 0)
        changes[name] = tuple(entry(v, at) for v in value) if indexed else entry(value, at)
    return _with(thunk, changes), bases


def _with(thunk: Thunk, changes: dict[str, object]) -> Thunk:
    """`dataclasses.replace` for offset fields, without re-running field coercion (the new values
    are plain ints): a quarter of the cost, which matters at one call per thunk."""
    form = object.__new__(type(thunk))
    form.__dict__.update(thunk.__dict__)
    form.__dict__.update(changes)
    return form


def body_key(form: Thunk) -> Hashable:
    """What tells two canonical thunks' bodies apart: the thunk itself (dataclass equality and hash)
    where its fields hold only ints, bools, strings, bytes, enums and sum types of those — there two
    checked thunks are equal exactly when their reprs are — else its repr, which keeps apart what
    compares equal but emits different code (0.0 and -0.0, 1 and 1.0).  A repr costs ~35 µs for a
    region (20 000 thunks: 0.7 s); the equality, a few."""
    return form if _compares_exactly(type(form)) else repr(form)


@functools.cache
def _compares_exactly(cls: type) -> bool:
    return all(_exact_hint(hint, set()) for hint in _hints(cls).values())


def _exact_hint(hint: Any, seen: set) -> bool:
    """Whether values of `hint` that pass the field checks are equal exactly when their reprs are
    (no floats anywhere inside, no types whose equality is their own)."""
    bare = _split(hint)[0]
    inner = _optional(bare)
    if inner is not None:
        return _exact_hint(inner, seen)
    args = _tuple_of(bare)
    if args is not None:
        return all(_exact_hint(a, seen) for a in args if a is not Ellipsis)
    if bare in (int, bool, str, bytes) or isinstance(bare, type) and issubclass(bare, enum.Enum):
        return True
    if isinstance(bare, type) and issubclass(bare, SumType):
        if bare in seen:
            return True  # a recursive sum type: decided where it first appears
        seen.add(bare)
        variants = [v for v in bare._variants.values() if isinstance(v, type)]
        return all(_exact_hint(h, seen) for v in variants for _, h in _payload_fields(v))
    return False
