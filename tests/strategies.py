"""Hypothesis strategies for thunks and schedules, drawn from the thunk classes' type hints."""
from __future__ import annotations

import dataclasses
import enum
import typing
from functools import cache
from typing import Annotated, Any

from hypothesis import strategies as st

from rlx_llvm import thunks as T
from rlx_llvm._sumtype import SumType
from rlx_llvm.dtypes import LaneKind
from rlx_llvm.ops import RngBackend, RngOptions
from rlx_llvm.schedule import ThunkSchedule
from rlx_llvm.thunks.base import FixedLen, RustInt

MAX = T.USIZE_MAX


def hints(cls: type) -> dict[str, Any]:
    """Each field's type hint (with its Annotated metadata), in field order."""
    h = typing.get_type_hints(cls, localns={"ThunkSchedule": ThunkSchedule}, include_extras=True)
    return {f.name: h[f.name] for f in dataclasses.fields(cls)}


def holds_schedule(hint: Any) -> bool:
    """Whether a field of type `hint` holds a nested ThunkSchedule."""
    return hint is ThunkSchedule or any(holds_schedule(a) for a in typing.get_args(hint))


def _ints(rust: RustInt) -> st.SearchStrategy[int]:
    return st.integers(rust.lo, rust.hi)  # Hypothesis already favours 0, small values and the bounds


F32_VALUES = st.one_of(st.floats(width=32, allow_nan=False), st.floats(-1e30, 1e30),
                       st.sampled_from([0.0, -0.0, 0.1, 1e-45, float("inf"), float("-inf")]))


@cache
def sum_type_strategy(tp: type) -> st.SearchStrategy:
    """Every unit variant, and every data variant built from its own field hints."""
    options = []
    for variant in tp._variants.values():
        if not isinstance(variant, type):
            options.append(st.just(variant))
            continue
        field_hints = typing.get_type_hints(variant)
        parts = [value_strategy(field_hints[f.name]) for f in dataclasses.fields(variant)]
        options.append(st.tuples(*parts).map(lambda vals, v=variant: v(*vals)))
    return st.one_of(*options)


def value_strategy(hint: Any) -> st.SearchStrategy:
    """Values a field of type `hint` may hold (valid for `check_fields`)."""
    meta = hint.__metadata__ if typing.get_origin(hint) is Annotated else ()
    base = hint.__origin__ if meta else hint
    for m in meta:
        if isinstance(m, RustInt):
            return _ints(m)
        if m == "f32":
            return F32_VALUES
    args = typing.get_args(base)
    if type(None) in args:
        return st.one_of(st.none(), value_strategy(next(a for a in args if a is not type(None))))
    if typing.get_origin(base) is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            n = next((m.n for m in meta if isinstance(m, FixedLen)), None)
            return st.lists(value_strategy(args[0]), min_size=n or 0, max_size=n or 3).map(tuple)
        return st.tuples(*(value_strategy(a) for a in args))
    if base is int:
        return st.integers(0, 2**32)
    if base is float:
        return st.floats(allow_nan=False)
    if base is bool:
        return st.booleans()
    if base is str:
        return st.text(max_size=8)
    if base is bytes:
        return st.binary(max_size=16)
    if base is ThunkSchedule:
        return schedule_strategy(nested=False)
    if issubclass(base, enum.Enum):
        return st.sampled_from(list(base))
    if issubclass(base, SumType):
        return sum_type_strategy(base)
    raise TypeError(f"no strategy for {hint!r}")


NESTING = {name for name, cls in T.ALL_THUNKS.items() if any(map(holds_schedule, hints(cls).values()))}


@cache
def thunk_strategy(kind: str) -> st.SearchStrategy[T.Thunk]:
    """Valid instances of one thunk kind (nested schedules hold only non-nesting thunks)."""
    cls = T.ALL_THUNKS[kind]
    fields = {name: value_strategy(h) for name, h in hints(cls).items()}
    if kind == "ElementwiseRegion":  # in_lanes is parallel to input_offs
        def region(n: int) -> st.SearchStrategy:
            offs = st.lists(_ints(RustInt("usize", 0, MAX)), min_size=n, max_size=n).map(tuple)
            lanes = st.lists(st.sampled_from(list(LaneKind)), min_size=n, max_size=n).map(tuple)
            return st.builds(cls, **{**fields, "input_offs": offs, "in_lanes": st.just(()) | lanes})
        return st.integers(0, 4).flatmap(region)
    return st.builds(cls, **fields)


ANY_SIMPLE_THUNK = st.sampled_from(sorted(set(T.ALL_THUNKS) - NESTING)).flatmap(thunk_strategy)


def schedule_strategy(nested: bool = True, max_thunks: int = 3) -> st.SearchStrategy[ThunkSchedule]:
    """Schedules of random thunks (one level of nesting at most)."""
    thunks = (st.sampled_from(list(T.ALL_THUNKS)).flatmap(thunk_strategy) if nested else ANY_SIMPLE_THUNK)
    return st.builds(ThunkSchedule, st.lists(thunks, max_size=max_thunks), arena_bytes=st.integers(0, 2**40),
                     mask_threshold=F32_VALUES, mask_neg_inf=F32_VALUES, score_skip=F32_VALUES,
                     rng=st.builds(RngOptions, st.integers(0, 2**64 - 1), st.sampled_from(list(RngBackend))))
