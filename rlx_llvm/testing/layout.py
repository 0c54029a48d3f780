"""Examples and their layout: a thunk's buffers placed in guarded arena slots, with drawn input values.

`example(name, thunk, **values)` takes a thunk whose offset fields are placeholders (0), finds its
buffers from its own `reads()` / `writes()` extents, gives each a fresh 64-byte-aligned slot with
`GUARD` bytes after it, and records how each read buffer is filled (`Values`: an element type and a
draw).  So an example states only what matters: the shape fields and the inputs that need special
values (indices in range, SPD matrices, …); every other buffer is `normal(dtype)`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..arena import Arena
from ..reference.halves import f32_to_bf16_bits
from ..schedule import ThunkSchedule
from ..thunks.base import Extent, Thunk

ALIGN = 64   # every buffer starts on a cache line
GUARD = 64   # bytes left between buffers: a write past a buffer lands on bytes nobody owns

Draw = Callable[[np.random.Generator, int], np.ndarray]


# ── values ──────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Values:
    """How a buffer's elements are typed and, when the thunk reads it, drawn: `draw(rng, count)`."""

    dtype: np.dtype
    draw: Draw


def normal(dtype: str = "f4", scale: float = 1.0, shift: float = 0.0) -> Values:
    """Normal floats (complex: both parts), mean `shift`, deviation `scale`."""
    dt = np.dtype(dtype)
    if dt.kind == "c":
        real = np.dtype(f"f{dt.itemsize // 2}")
        return Values(dt, lambda rng, n: (rng.standard_normal(2 * n) * scale + shift).astype(real).view(dt))
    return Values(dt, lambda rng, n: (rng.standard_normal(n) * scale + shift).astype(dt))


def uniform(lo: float, hi: float, dtype: str = "f4") -> Values:
    """Floats uniform in [lo, hi)."""
    return Values(np.dtype(dtype), lambda rng, n: rng.uniform(lo, hi, n).astype(dtype))


def ints(lo: int, hi: int, dtype: str = "i4") -> Values:
    """Integers uniform in [lo, hi), stored as `dtype` (an index type, or a float type holding integers)."""
    return Values(np.dtype(dtype), lambda rng, n: rng.integers(lo, hi, n).astype(dtype))


def bf16(scale: float = 1.0) -> Values:
    """Normal values stored as bfloat16 bits (uint16)."""
    return Values(np.dtype("<u2"), lambda rng, n: f32_to_bf16_bits((rng.standard_normal(n) * scale).astype("f4")))


def spd(n: int) -> Values:
    """Symmetric positive-definite n×n f32 matrices, one after another (`count` a multiple of n²)."""
    def draw(rng: np.random.Generator, count: int) -> np.ndarray:
        a = rng.standard_normal((count // (n * n), n, n))
        return (a @ a.transpose(0, 2, 1) + n * np.eye(n)).astype("f4").reshape(-1)
    return Values(np.dtype("f4"), draw)


def well_conditioned(n: int, dtype: str = "f4", lower: bool | None = None) -> Values:
    """n×n matrices with a dominant diagonal (invertible; triangular when `lower` is given), one after another."""
    def draw(rng: np.random.Generator, count: int) -> np.ndarray:
        a = rng.standard_normal((count // (n * n), n, n)) + 2 * n * np.eye(n)
        if lower is not None:
            a = np.tril(a) if lower else np.triu(a)
        return a.astype(dtype).reshape(-1)
    return Values(np.dtype(dtype), draw)


def of(spec: "Values | str") -> Values:
    """A `Values`, or the default values of a dtype name: normal floats, integers in [-100, 100), bools."""
    if isinstance(spec, Values):
        return spec
    dt = np.dtype(spec)
    if dt.kind in "fc":
        return normal(spec)
    return ints(0, 2, spec) if dt == np.dtype("u1") else ints(-100, 100, spec)


# ── offsets ─────────────────────────────────────────────────────────────────

def _path(field: str) -> tuple[str, int | None]:
    """`"inputs[2]"` → ("inputs", 2); `"src"` → ("src", None)."""
    name, _, rest = field.partition("[")
    return name, int(rest.rstrip("]")) if rest else None


def offset_of(thunk: Thunk, field: str) -> int:
    """The offset an extent's field names (`src`, or `inputs[2]`: an int or a tuple whose head is the offset)."""
    name, i = _path(field)
    value = getattr(thunk, name) if i is None else getattr(thunk, name)[i]
    return value[_position(thunk, name)] if isinstance(value, tuple) else value


def _position(thunk: Thunk, name: str) -> int:
    """Where the arena offset sits in the tuples of field `name`: first, unless the thunk class says
    otherwise (Scan's `(body_off, outer_off, bytes)` slices hold it second)."""
    return getattr(type(thunk), "outer_offset_at", {}).get(name, 0)


def with_offsets(thunk: Thunk, offsets: dict[str, int]) -> Thunk:
    """The thunk with the offset of each named field (as extents name them) replaced."""
    changes: dict[str, object] = {}
    for field, offset in offsets.items():
        name, i = _path(field)
        if i is None:  # an int, or a tuple whose element `_position` is the offset (CustomOp.output)
            value, at = getattr(thunk, name), _position(thunk, name)
            changes[name] = (*value[:at], offset, *value[at + 1:]) if isinstance(value, tuple) else offset
        else:
            items = list(changes.get(name, getattr(thunk, name)))
            at = _position(thunk, name)
            items[i] = (*items[i][:at], offset, *items[i][at + 1:]) if isinstance(items[i], tuple) else offset
            changes[name] = tuple(items)
    return dataclasses.replace(thunk, **changes)


def buffer_fields(thunk: Thunk) -> list[str]:
    """The fields (as extents name them) of every buffer the thunk reads or writes, first appearance first."""
    return list(dict.fromkeys(e.field for e in (*thunk.reads(), *thunk.writes())))


def shift(thunk: Thunk, delta: int) -> Thunk:
    """The same thunk with every arena offset moved by `delta` bytes (absent buffers, which no extent names, stay)."""
    return with_offsets(thunk, {f: offset_of(thunk, f) + delta for f in buffer_fields(thunk)})


def _keyword(field: str) -> str:
    """The `example()` keyword of a buffer: its field, or `inputs_2` for the extent `inputs[2]`."""
    return field.replace("[", "_").rstrip("]")


# ── examples ────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Buffer:
    """One arena slot of an example: its extent (named by the thunk field), typed and (if read) drawn by `values`."""

    extent: Extent
    values: Values
    read: bool


@dataclass(frozen=True)
class Example:
    """A small valid schedule over its own arena, and how to fill its inputs with valid values.

    `init(arena, rng)` writes every buffer the schedule reads; every other byte is the caller's
    (tests fill the arena with random bytes first, so that a stray write or read shows).
    `outputs()` lists the written bytes with their element type; `rtol` is how close a correct
    native run comes to `rlx_llvm.reference` (None: the dtype's default).
    """

    name: str
    schedule: ThunkSchedule
    buffers: tuple[Buffer, ...]
    rtol: float | None = None

    @property
    def kinds(self) -> set[str]:
        """The thunk kinds in the schedule."""
        return {type(t).__name__ for t in self.schedule.thunks}

    def init(self, arena: Arena, rng: np.random.Generator) -> None:
        """Write valid input values into every buffer the schedule reads."""
        for b in self.buffers:
            if b.read:
                count = b.extent.nbytes // b.values.dtype.itemsize
                arena.write(b.extent.offset, np.asarray(b.values.draw(rng, count), dtype=b.values.dtype))

    def outputs(self) -> list[tuple[int, np.dtype, int]]:
        """(offset, dtype, count) of every byte range the schedule writes, typed by the buffer it lies in."""
        out = []
        for t in self.schedule.thunks:
            for ext in t.writes():
                dtype = next(b.values.dtype for b in self.buffers if b.extent.offset <= ext.offset < b.extent.end)
                out.append((ext.offset, dtype, ext.nbytes // dtype.itemsize))
        return out

    def shifted(self, delta: int) -> "Example":
        """The same example with every offset moved by `delta` (its arena grown to match)."""
        return Example(self.name, dataclasses.replace(
            self.schedule, thunks=[shift(t, delta) for t in self.schedule.thunks],
            arena_bytes=self.schedule.arena_bytes + delta),
            tuple(dataclasses.replace(b, extent=b.extent._replace(offset=b.extent.offset + delta)) for b in self.buffers),
            self.rtol)


def example(name: str, thunk: Thunk, dtype: str = "f4", rtol: float | None = None,
            **values: "Values | str") -> Example:
    """Lay out `thunk`'s buffers (placeholder offsets) in fresh guarded slots; `values[field]` types and
    fills a buffer (default `normal(dtype)`; a tuple element is named like its extent, `inputs_1`)."""
    fields = buffer_fields(thunk)
    sizes = dict.fromkeys(fields, 0)
    for ext in (*thunk.reads(), *thunk.writes()):
        sizes[ext.field] = max(sizes[ext.field], ext.end - offset_of(thunk, ext.field))
    read = {e.field for e in thunk.reads()}
    offsets, buffers, top = {}, [], 0
    for field in fields:
        offsets[field] = top
        spec = of(values.get(_keyword(field), dtype))
        buffers.append(Buffer(Extent(field, top, sizes[field]), spec, field in read))
        top = -(-(top + sizes[field]) // ALIGN) * ALIGN + GUARD
    unknown = set(values) - {_keyword(f) for f in fields}
    if unknown:
        raise TypeError(f"{name}: no buffer named {sorted(unknown)}")
    return Example(name, ThunkSchedule([with_offsets(thunk, offsets)], arena_bytes=top), tuple(buffers), rtol)


def side_by_side(examples: Sequence[Example]) -> list[Example]:
    """The examples shifted so that each lies past the previous one's arena (the last one's arena spans all)."""
    moved: list[Example] = []
    for ex in examples:
        moved.append(ex.shifted(moved[-1].schedule.arena_bytes if moved else 0))
    return moved


def pack(examples: Sequence[Example], name: str | None = None) -> Example:
    """Many examples as one: side by side in one arena, their schedules concatenated (one compile)."""
    moved = side_by_side(examples)
    return Example(name or "+".join(ex.name for ex in examples),
                   ThunkSchedule([t for ex in moved for t in ex.schedule.thunks],
                                 arena_bytes=moved[-1].schedule.arena_bytes if moved else 0),
                   tuple(b for ex in moved for b in ex.buffers))
