"""Rust-style enums whose variants may carry data, and their serde-style JSON form.

A plain Rust enum is a Python `enum.Enum`.  An enum with data variants is a `SumType`: unit
variants are singleton instances (`MaskKind.Causal`), data variants are frozen dataclasses
reached as attributes (`MaskKind.SlidingWindow(128)`).  JSON follows serde's externally tagged
form, so a schedule written by Rust reads the same: `"Causal"`, `{"SlidingWindow": 128}`,
`{"Int8Block": {"block_size": 32}}`, `{"Binary": ["Add", {"Input": 0}, {"Step": 1}]}`.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from typing import Any, ClassVar

# Rust variant names that are Python keywords get a trailing underscore in Python.
_PY_NAME = {"None": "None_"}
_RUST_NAME = {v: k for k, v in _PY_NAME.items()}


class SumType:
    """Base of a Rust enum with data-carrying variants."""

    _variants: ClassVar[dict[str, Any]]
    _rust_name: ClassVar[str] = ""
    _tuple: ClassVar[bool] = False  # data variant is a Rust tuple variant (positional JSON)

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "_variants" not in cls.__dict__ and not any("_variants" in b.__dict__ for b in cls.__mro__[1:-1]):
            cls._variants = {}

    @classmethod
    def unit(cls, rust_name: str) -> "SumType":
        """Declare a unit variant: a singleton instance."""
        sub = dataclasses.dataclass(frozen=True, repr=False)(
            type(rust_name, (cls,), {"_rust_name": rust_name,
                                     "__qualname__": f"{cls.__name__}.{_PY_NAME.get(rust_name, rust_name)}"}))
        inst = sub()
        cls._variants[rust_name] = inst
        setattr(cls, _PY_NAME.get(rust_name, rust_name), inst)
        return inst

    @classmethod
    def variant(cls, sub: type, *, tuple_like: bool = False) -> type:
        """Register a frozen dataclass subclass as a data variant."""
        sub._rust_name = sub.__name__
        sub._tuple = tuple_like
        sub.__qualname__ = f"{cls.__name__}.{sub.__name__}"
        cls._variants[sub.__name__] = sub
        setattr(cls, sub.__name__, sub)
        return sub

    def __repr__(self) -> str:
        base = type(self).__mro__[1].__name__ if not dataclasses.fields(self) else type(self).__qualname__
        if not dataclasses.fields(self):
            return f"{base}.{_PY_NAME.get(self._rust_name, self._rust_name)}"
        args = ", ".join((repr(getattr(self, f.name)) if self._tuple else f"{f.name}={getattr(self, f.name)!r}")
                         for f in dataclasses.fields(self))
        return f"{type(self).__qualname__}({args})"

    @property
    def name(self) -> str:
        """The Rust variant name."""
        return self._rust_name


_PLAIN = frozenset({int, float, str, bool, type(None)})


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names, looked up once per class."""
    return tuple(f.name for f in dataclasses.fields(cls))


def to_jsonable(value: Any) -> Any:
    """Encode enums, sum types, dataclasses, tuples and bytes as JSON-ready values."""
    kind = type(value)
    if kind in _PLAIN:       # the common leaves first: a warm start encodes every thunk of a schedule
        return value
    if kind is tuple or kind is list:
        return [to_jsonable(v) for v in value]
    if isinstance(value, SumType):
        names = _field_names(kind)
        if not names:
            return value._rust_name
        vals = [to_jsonable(getattr(value, n)) for n in names]
        if value._tuple:
            return {value._rust_name: vals[0] if len(vals) == 1 else vals}
        return {value._rust_name: dict(zip(names, vals))}
    if isinstance(value, enum.Enum):
        return _RUST_NAME.get(value.name, value.name)
    if isinstance(value, (bytes, bytearray)):
        import base64
        return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if dataclasses.is_dataclass(value) and hasattr(value, "to_jsonable"):
        return value.to_jsonable()
    if dataclasses.is_dataclass(value):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def from_jsonable(tp: Any, data: Any) -> Any:
    """Decode `data` as type `tp` (the inverse of `to_jsonable`), following type hints."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if data is None:
            return None
        return from_jsonable(args[0], data)
    if origin in (tuple, list):
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            return tuple(from_jsonable(a, d) for a, d in zip(args, data))
        inner = args[0] if args else Any
        return tuple(from_jsonable(inner, d) for d in data)
    if tp is bytes:
        import base64
        return base64.b64decode(data["base64"], validate=True) if isinstance(data, dict) else bytes(data)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp[_PY_NAME.get(data, data)]
    if isinstance(tp, type) and issubclass(tp, SumType):
        return _decode_sum(tp, data)
    if isinstance(tp, type) and hasattr(tp, "from_jsonable"):
        return tp.from_jsonable(data)
    if dataclasses.is_dataclass(tp):
        hints = _type_hints(tp)
        return tp(**{f.name: from_jsonable(hints[f.name], data[f.name])
                     for f in dataclasses.fields(tp) if f.name in data})
    if tp is float:
        return float(data)
    return data


@functools.cache
def _type_hints(tp: type) -> dict[str, Any]:
    """`typing.get_type_hints(tp)`, evaluated once per class (a schedule decodes many values of each)."""
    return typing.get_type_hints(tp)


def _decode_sum(tp: type, data: Any) -> Any:
    if isinstance(data, str):
        v = tp._variants.get(data)
        if v is None or isinstance(v, type):
            raise ValueError(f"{data!r} is not a unit variant of {tp.__name__}")
        return v
    (name, payload), = data.items()
    sub = tp._variants.get(name)
    if sub is None or not isinstance(sub, type):
        raise ValueError(f"{name!r} is not a data variant of {tp.__name__}")
    hints = _type_hints(sub)
    fields = dataclasses.fields(sub)
    if sub._tuple:
        items = [payload] if len(fields) == 1 else payload
        return sub(*(from_jsonable(hints[f.name], d) for f, d in zip(fields, items)))
    return sub(**{f.name: from_jsonable(hints[f.name], payload[f.name]) for f in fields})
