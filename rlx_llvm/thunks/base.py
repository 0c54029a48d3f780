"""The `Thunk` base class: Rust field types, byte extents, field checks and serde JSON.

Every thunk is a frozen, keyword-only dataclass whose fields are the seed's fields, in the seed's
order.  Subclassing `Thunk` is enough: `__init_subclass__` applies the dataclass decorator.

Field annotations name the Rust type (`a: usize`, `m: u32`, `eps: f32`); they are `Annotated`
aliases of `int` / `float`, so `typing.get_type_hints` sees plain `int` and `float` while
`check_fields` reads the Rust range from the annotation.  The annotations were generated once from
the seed's `types.rs`; nothing reads the seed at run time.

A thunk describes the arena bytes it touches with `reads()` and `writes()`; family modules
implement `_reads()` / `_writes()` as generators of `Extent`s (usually via `self.span`), and the
base drops absent buffers (offset `usize::MAX`) and empty ranges.
"""
from __future__ import annotations

import base64
import dataclasses
import enum
import functools
import math
import struct
import types
import typing
from typing import Annotated, Any, Callable, ClassVar, Iterable, NamedTuple

from .._sumtype import SumType, from_jsonable, to_jsonable
from .._sumtype import _type_hints as _sumtype_hints
from ..errors import ValidationError
from ..limits import LimitError

USIZE_MAX = 2**64 - 1
"""`usize::MAX`: an offset with this value means "no buffer" (semantics.md §1)."""


@dataclasses.dataclass(frozen=True)
class RustInt:
    """`Annotated` metadata: a Rust integer type and its inclusive range."""

    name: str
    lo: int
    hi: int


@dataclasses.dataclass(frozen=True)
class FixedLen:
    """`Annotated` metadata: a Rust fixed-size array `[T; n]`."""

    n: int


F32_KIND = "f32"

usize = Annotated[int, RustInt("usize", 0, 2**64 - 1)]
u64 = Annotated[int, RustInt("u64", 0, 2**64 - 1)]
u32 = Annotated[int, RustInt("u32", 0, 2**32 - 1)]
u8 = Annotated[int, RustInt("u8", 0, 2**8 - 1)]
i32 = Annotated[int, RustInt("i32", -2**31, 2**31 - 1)]
f32 = Annotated[float, F32_KIND]
Shape = tuple[usize, ...]
U32x16 = Annotated[tuple[u32, ...], FixedLen(16)]

# Bytes per element of the usual storage types.
F32, F64, C64, I32, I64, I8, BOOL, HALF = 4, 8, 8, 4, 8, 1, 1, 2

_PAYLOAD_INT = RustInt("usize", 0, 2**64 - 1)  # plain `int` payloads of ops.py sum types (indices, sizes)


class Extent(NamedTuple):
    """One byte range of the arena: `[offset, offset + nbytes)`, named by the thunk field it comes from."""

    field: str
    offset: int
    nbytes: int
    layout: str = ""
    """How `nbytes` follows from the thunk's dims (block geometry of packed formats), for error messages."""

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.offset + self.nbytes


class _KindName:
    """The class name; a non-data descriptor, so a Rust field named `kind` (ActivationF64 …) wins."""

    def __get__(self, obj: Any, owner: type) -> str:
        return owner.__name__


@typing.dataclass_transform(kw_only_default=True, frozen_default=True)
class Thunk:
    """A pre-compiled RLX kernel call with every argument resolved to arena offsets."""

    family: ClassVar[str] = ""
    kind = _KindName()
    _registry: ClassVar[dict[str, type["Thunk"]]] = {}

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "kind" in cls.__dict__.get("__annotations__", {}):
            cls.kind = dataclasses.field()  # a Rust field named `kind`: no default, shadows the name
        dataclasses.dataclass(frozen=True, kw_only=True)(cls)
        if not cls.__name__.startswith("_"):
            Thunk._registry.setdefault(cls.__name__, cls)  # the first class of a name keeps it

    def __post_init__(self) -> None:
        for name, hint in _coercible(type(self)):
            value = getattr(self, name)
            fixed = _coerce(value, hint)
            if fixed is not value:
                object.__setattr__(self, name, fixed)

    # ── extents ─────────────────────────────────────────────────────────────

    def reads(self) -> tuple[Extent, ...]:
        """The arena byte ranges this thunk reads (absent buffers and empty ranges omitted)."""
        return _present(self._reads())

    def writes(self) -> tuple[Extent, ...]:
        """The arena byte ranges this thunk writes (absent buffers and empty ranges omitted)."""
        return _present(self._writes())

    def _reads(self) -> Iterable[Extent]:
        return ()

    def _writes(self) -> Iterable[Extent]:
        return ()

    def span(self, field: str, nbytes: int, skip: int = 0, layout: str = "") -> Extent:
        """`nbytes` bytes of the buffer at offset field `field`, starting `skip` bytes in (`layout` says why)."""
        offset = getattr(self, field)
        return Extent(field, offset if offset == USIZE_MAX else offset + skip, nbytes, layout)

    # ── field checks ────────────────────────────────────────────────────────

    def check_fields(self) -> None:
        """Raise ValidationError if a field has the wrong Python type or leaves its Rust type's range."""
        for name, fits, hint in _field_fits(type(self)):
            value = getattr(self, name)  # not `self.__dict__`: reading it makes CPython build a dict per thunk
            if not fits(value):  # rare: `_check` decides, and words the error
                _check(value, hint, name, name, self.kind_name)

    @property
    def kind_name(self) -> str:
        """The Rust variant name (the class name), even where a field is called `kind`."""
        return type(self).__name__

    @classmethod
    def rust_types(cls) -> dict[str, str]:
        """`{field: Rust type}` for the integer and f32 fields (the table `check_fields` enforces)."""
        return {name: _rust_name(hint) for name, hint in _hints(cls, extras=True).items()
                if _rust_name(hint)}

    # ── serde JSON ──────────────────────────────────────────────────────────

    def to_jsonable(self) -> Any:
        """serde's externally tagged form: `{"Sgemm": {"a": 0, …}}`, or `"Nop"` for a field-less thunk."""
        names = _field_names(type(self))
        if not names:
            return self.kind_name
        values = [getattr(self, n) for n in names]
        return {self.kind_name: {n: v if type(v) in _PLAIN else to_jsonable(v) for n, v in zip(names, values)}}

    @classmethod
    def from_jsonable(cls, data: Any) -> "Thunk":
        """Decode the externally tagged form, dispatching on the tag; ValidationError names the field."""
        if isinstance(data, str):
            tag, payload = data, {}
        elif isinstance(data, dict) and len(data) == 1:
            (tag, payload), = data.items()
            payload = {} if payload is None else payload
        else:
            raise ValidationError(f"a thunk is a kind name or a one-key object, got {_short(data)}")
        sub = Thunk._registry.get(tag) if isinstance(tag, str) else None
        if sub is None:
            raise ValidationError(f"unknown thunk kind {_short(tag)}")
        if cls is not Thunk and not issubclass(sub, cls):
            raise ValidationError(f"expected a {cls.__name__}, got {tag}", kind=tag)
        if not isinstance(payload, dict):
            raise ValidationError(f"fields must be an object, got {_short(payload)}", kind=tag)
        hints = _hints(sub)
        unknown = sorted(payload.keys() - hints.keys())
        if unknown:
            raise ValidationError(f"unknown field(s) {', '.join(map(repr, unknown))}", kind=tag, field=unknown[0])
        values = {}
        for name, hint in hints.items():
            if name not in payload:
                raise ValidationError("missing field", kind=tag, field=name)
            values[name] = _decode(payload[name], hint, tag, name)
        try:
            thunk = sub(**values)
        except (TypeError, ValueError) as exc:
            raise ValidationError(f"cannot build the thunk: {exc}", kind=tag) from None
        thunk.check_fields()
        return thunk


class _Unary(Thunk):
    """Shared shape of the `src → dst` element-wise kernels: `len` elements of fixed widths."""

    src: usize
    dst: usize
    len: u32
    src_bytes: ClassVar[int] = F32
    dst_bytes: ClassVar[int] = F32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", self.src_bytes * self.len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", self.dst_bytes * self.len)


# ── helpers ──────────────────────────────────────────────────────────────────

def _present(extents: Iterable[Extent]) -> tuple[Extent, ...]:
    return tuple([e for e in extents if e.nbytes > 0 and e.offset != USIZE_MAX])


def strided(count: int, stride: int, width: int) -> int:
    """Elements spanned by `count` rows of `width` elements placed `stride` apart (0 if empty)."""
    return (count - 1) * stride + width if count > 0 and width > 0 else 0


def walked(dims: Iterable[int], strides: Iterable[int]) -> int:
    """Elements spanned by a row-major walk over `dims` with per-axis `strides`: 1 + Σ (dim−1)·stride."""
    dims, strides = tuple(dims), tuple(strides)
    if any(d <= 0 for d in dims):
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(dims, strides))


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉, 0 when b is 0."""
    return -(-a // b) if b else 0


def prod(values: Iterable[int]) -> int:
    """Product of the values (1 for none)."""
    return math.prod(values)


_PLAIN = (int, float, str, bool, type(None))  # field values that are their own JSON form


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def _field_fits(cls: type) -> tuple[tuple[str, "Callable[[Any], bool]", Any], ...]:
    """Per field, in field order (so the first bad field is the one reported): its name, the
    predicate `_fits` built for its hint once per class, and the hint for `_check`."""
    return tuple((name, _fits(hint), hint) for name, hint in _hints(cls, extras=True).items())


@functools.cache
def _coercible(cls: type) -> tuple[tuple[str, Any], ...]:
    """The fields `_coerce` may rewrite (tuples, bytes and their optionals): plain fields need nothing."""
    def may_change(hint: Any) -> bool:
        bare = _split(hint)[0]
        inner = _optional(bare)
        return may_change(inner) if inner is not None else bare is bytes or typing.get_origin(bare) is tuple
    return tuple((name, hint) for name, hint in _hints(cls).items() if may_change(hint))


@functools.cache
def _hints(cls: type, extras: bool = False) -> dict[str, Any]:
    """Field name → type hint, in field order (`extras` keeps the Rust `Annotated` metadata)."""
    from ..schedule import ThunkSchedule
    hints = typing.get_type_hints(cls, localns={"ThunkSchedule": ThunkSchedule}, include_extras=extras)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _split(hint: Any) -> tuple[Any, tuple]:
    """(bare type, Annotated metadata)."""
    try:
        return _split_cached(hint)
    except TypeError:  # an unhashable hint: work it out each time
        return _split_uncached(hint)


def _split_uncached(hint: Any) -> tuple[Any, tuple]:
    if typing.get_origin(hint) is Annotated:
        return hint.__origin__, hint.__metadata__
    return hint, ()


_split_cached = functools.cache(_split_uncached)


def _optional(hint: Any) -> Any:
    """The inner type of `T | None`, or None if `hint` is not optional."""
    try:
        return _optional_cached(hint)
    except TypeError:
        return _optional_uncached(hint)


def _optional_uncached(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return None


_optional_cached = functools.cache(_optional_uncached)


@functools.cache
def _tuple_args(hint: Any) -> "tuple | None":
    """`typing.get_args` of a `tuple[...]` hint, or None for any other hint (hints are looked at
    once per class of value, not once per value: a region's chain has dozens)."""
    return typing.get_args(hint) if typing.get_origin(hint) is tuple else None


def _tuple_of(hint: Any) -> "tuple | None":
    try:
        return _tuple_args(hint)
    except TypeError:
        return typing.get_args(hint) if typing.get_origin(hint) is tuple else None


def _coerce(value: Any, hint: Any) -> Any:
    """Lists (and bytes, for byte tuples) → tuples, recursively; bytearray → bytes; else unchanged."""
    hint, _ = _split(hint)
    inner = _optional(hint)
    if inner is not None:
        return value if value is None else _coerce(value, inner)
    if hint is bytes:
        return bytes(value) if isinstance(value, (bytearray, memoryview)) else value
    args = _tuple_of(hint)
    if args is not None:
        if isinstance(value, (list, bytes, bytearray)):
            value = tuple(value)
        if not isinstance(value, tuple):
            return value
        elems = ([args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else args)
        fixed = tuple(_coerce(v, a) for v, a in zip(value, elems)) + value[len(elems):]
        return value if all(a is b for a, b in zip(fixed, value)) else fixed
    return value


def _rust_name(hint: Any) -> str:
    bare, meta = _split(hint)
    for m in meta:
        if isinstance(m, RustInt):
            return m.name
        if m == F32_KIND:
            return F32_KIND
    return ""


def _describe(hint: Any) -> str:
    """A short human description of a type hint."""
    bare, meta = _split(hint)
    for m in meta:
        if isinstance(m, RustInt):
            return f"{m.name} ({m.lo}..={m.hi})"
        if m == F32_KIND:
            return "f32 (a float)"
        if isinstance(m, FixedLen):
            return f"tuple of {m.n} × {_describe(typing.get_args(bare)[0])}"
    inner = _optional(bare)
    if inner is not None:
        return f"{_describe(inner)} or None"
    if typing.get_origin(bare) is tuple:
        args = typing.get_args(bare)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"tuple of {_describe(args[0])}"
        return "tuple (" + ", ".join(_describe(a) for a in args) + ")"
    return getattr(bare, "__name__", str(bare))


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


@functools.cache
def _payload_fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """A sum-type variant's payload fields and their hints, evaluated once per class (a region's
    chain checks several payloads per thunk)."""
    if not dataclasses.is_dataclass(cls):
        return ()
    hints = _sumtype_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))


F32_MAX = 3.4028234663852886e38
"""The largest finite f32: every number within ±F32_MAX packs as an f32."""

_INT_ONLY = frozenset({int})


def _fits(hint: Any) -> "Callable[[Any], bool]":
    """A predicate for `hint`, built once per class and hint (as `dataclasses` builds `__init__` once
    per class), so checking a thunk does not interpret its type hints again.  It returns True only
    for values `_check` accepts; False means "look closer" (a rare type, an out-of-range value, a
    nested schedule) and `_check` then decides and words the error — so the errors are `_check`'s."""
    bare, meta = _split(hint)
    inner = _optional(bare)
    if inner is not None:
        fits_inner = _fits(inner)
        return lambda v: v is None or fits_inner(v)
    if bare is bool:
        return lambda v: v is True or v is False
    if bare is int:
        lo, hi = _int_range(meta)
        return lambda v: type(v) is int and lo <= v <= hi
    if bare is float:
        bound = F32_MAX if F32_KIND in meta else math.inf  # ±inf and NaN go to `_check` (rare)
        return lambda v: (type(v) is float or type(v) is int) and -bound <= v <= bound
    if bare in (str, bytes):
        return lambda v: type(v) is bare
    args = _tuple_of(bare)
    if args is not None:
        return _fits_tuple(args, next((m.n for m in meta if isinstance(m, FixedLen)), None))
    if isinstance(bare, type) and issubclass(bare, SumType):
        return lambda v: isinstance(v, bare) and _payload_fits(type(v))(v)
    from ..schedule import ThunkSchedule
    if bare is ThunkSchedule:
        return lambda v: False  # `_check` walks the nested thunks
    if isinstance(bare, type):
        return lambda v: isinstance(v, bare)
    return lambda v: True


def _int_range(meta: tuple) -> tuple[int, int]:
    """The inclusive range of an int hint: its Rust type's, or a plain payload int's (a usize)."""
    rust = next((m for m in meta if isinstance(m, RustInt)), _PAYLOAD_INT)
    return rust.lo, rust.hi


def _fits_tuple(args: tuple, fixed_len: "int | None") -> "Callable[[Any], bool]":
    """`_fits` of `tuple[T, ...]` (of `fixed_len` entries if given) or `tuple[A, B, …]`."""
    if not (len(args) == 2 and args[1] is Ellipsis):
        parts = tuple(_fits(a) for a in args)
        return lambda v: type(v) is tuple and len(v) == len(parts) and all(p(x) for p, x in zip(parts, v))
    def right_length(v: Any) -> bool:
        return type(v) is tuple and (fixed_len is None or len(v) == fixed_len)
    bare, meta = _split(args[0])
    if bare is int:  # offsets, dims, strides: the whole tuple at C speed
        lo, hi = _int_range(meta)
        return lambda v: right_length(v) and (not v or set(map(type, v)) == _INT_ONLY and lo <= min(v)
                                              and max(v) <= hi)
    each = _fits(args[0])
    return lambda v: right_length(v) and all(map(each, v))


@functools.cache
def _payload_fits(variant: type) -> "Callable[[Any], bool]":
    """`_fits` of a sum-type variant's payload fields, generated once per variant class as one
    expression (`fits_op(v.op) and fits_lhs(v.lhs) and …`: a region's chain has several per thunk)."""
    fields = _payload_fields(variant)
    scope = {f"fits_{name}": _fits(hint) for name, hint in fields}
    test = " and ".join(f"fits_{name}(v.{name})" for name, _ in fields) or "True"
    exec(f"def payload_fits(v):\n    return {test}\n", scope)  # field names are identifiers
    return scope["payload_fits"]


def _check(value: Any, hint: Any, path: str, field: str, kind: str) -> None:
    """Raise ValidationError unless `value` fits `hint` (the Rust type it stands for)."""
    def fail(why: str = "") -> typing.NoReturn:
        where = "" if path == field else f"{path}: "
        raise ValidationError(f"{where}expected {_describe(hint)}, got {_short(value)}{why}",
                              kind=kind, field=field)

    bare, meta = _split(hint)
    inner = _optional(bare)
    if inner is not None:
        if value is not None:
            _check(value, inner, path, field, kind)
        return
    if bare is bool:
        if not isinstance(value, bool):
            fail()
        return
    if bare is int:
        rust = next((m for m in meta if isinstance(m, RustInt)), _PAYLOAD_INT)
        if not isinstance(value, int) or isinstance(value, bool) or not rust.lo <= value <= rust.hi:
            fail()
        return
    if bare is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            fail()
        if F32_KIND in meta:
            try:
                struct.pack("<f", value)
            except OverflowError:
                fail(" (outside the f32 range)")
        return
    if bare in (str, bytes):
        if not isinstance(value, bare):
            fail()
        return
    args = _tuple_of(bare)
    if args is not None:
        if not isinstance(value, tuple):
            fail()
        if len(args) == 2 and args[1] is Ellipsis:
            fixed = next((m.n for m in meta if isinstance(m, FixedLen)), None)
            if fixed is not None and len(value) != fixed:
                fail(f" (length {len(value)})")
            elems = [args[0]] * len(value)
        else:
            if len(value) != len(args):
                fail(f" (length {len(value)})")
            elems = list(args)
        for i, (v, a) in enumerate(zip(value, elems)):
            _check(v, a, f"{path}[{i}]", field, kind)
        return
    if isinstance(bare, type) and issubclass(bare, enum.Enum):
        if not isinstance(value, bare):
            fail()
        return
    if isinstance(bare, type) and issubclass(bare, SumType):
        if not isinstance(value, bare):
            fail()
        for name, payload_hint in _payload_fields(type(value)):
            _check(getattr(value, name), payload_hint, f"{path}.{name}", field, kind)
        return
    from ..schedule import ThunkSchedule
    if bare is ThunkSchedule:
        if not isinstance(value, ThunkSchedule):
            fail()
        for i, t in enumerate(value.thunks):
            if not isinstance(t, Thunk):
                raise ValidationError(f"{path}.thunks[{i}] is not a thunk: {_short(t)}", kind=kind, field=field)
            try:
                t.check_fields()
            except ValidationError as exc:
                raise ValidationError(f"in {path}: {exc}", kind=kind, field=field) from None
        return
    if isinstance(bare, type) and not isinstance(value, bare):
        fail()


def _decode(raw: Any, hint: Any, kind: str, field: str) -> Any:
    """One JSON field value as `hint`; ValidationError names the thunk kind and field."""
    if hint is int and type(raw) is int:
        return raw  # the common case: what `from_jsonable(int, raw)` returns, without its dispatch
    inner = _optional(hint)
    if inner is not None:  # decoded here: `from_jsonable` misses `X | None` (types.UnionType)
        if raw is None:
            return None
        hint = inner
    if hint is float and (isinstance(raw, bool) or not isinstance(raw, (int, float))):
        raise ValidationError(f"expected a number, got {_short(raw)}", kind=kind, field=field)
    try:
        if hint is bytes:  # strict: `from_jsonable` would skip non-alphabet characters
            if not isinstance(raw, dict) or set(raw) != {"base64"}:
                raise TypeError('bytes are written as {"base64": "..."}')
            return base64.b64decode(raw["base64"], validate=True)
        return from_jsonable(hint, raw)
    except LimitError:
        raise  # once, not once per level of nesting
    except ValidationError as exc:
        raise ValidationError(f"in nested schedule: {exc}", kind=kind, field=field) from None
    except (KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise ValidationError(f"cannot decode {_short(raw)} as {_describe(hint)} ({type(exc).__name__}: "
                              f"{exc})", kind=kind, field=field) from None

