"""Resource limits, checked before anything is allocated: one knob, the memory a schedule may ask for.

A schedule is data that often comes from elsewhere (an exporter, a file, a service), so every size it or
its input files can name is checked against one budget before a byte is allocated or read:

- `max_bytes` — the largest arena, scratch, `--arena` file, schedule file or model file.  Set it with
  `rl.set_max_memory(n)` or the environment variable `RLX_LLVM_MAX_MEMORY` (bytes, or with a suffix:
  `512M`, `8G`, `1T`, or a share of physical memory: `50%`); the default is 75 % of physical memory.
- `max_thunks` — a schedule's thunk count, derived from the same budget: compiling costs at most
  `COMPILE_BYTES_PER_THUNK` per thunk, so `max_thunks = max_bytes // COMPILE_BYTES_PER_THUNK`.
- nesting — nested schedules (Scan / CustomFn bodies) nest at most `MAX_NESTING` levels, and JSON
  containers no deeper than Python's JSON reader recurses (≈ 1000); the format needs far fewer.

Going over is a `LimitError` (a `ValidationError`) naming the field, the size asked and the limit; the
CLI prints it as one line and exits with status 2.
"""
from __future__ import annotations

import os
import re

from .errors import ValidationError

ENV = "RLX_LLVM_MAX_MEMORY"
DEFAULT_SHARE = 0.75                 # of physical memory
COMPILE_BYTES_PER_THUNK = 48 << 10   # the compile path's resident cost per thunk, measured (issue 20)
MAX_NESTING = 64                     # schedule documents: thunk → Scan body → … ; JSON containers

_override: int | None = None
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class LimitError(ValidationError):
    """A size a schedule, file or argument asks for is over the configured limit."""


def physical_memory() -> int:
    """Bytes of physical memory on this machine (a generous guess when the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 1 << 40


def parse_size(text: str) -> int:
    """`"1073741824"`, `"512M"`, `"8G"`, `"50%"` (of physical memory) → bytes; anything else is a ValueError."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT%]?)i?B?\s*", text, flags=re.I)
    if m is None:
        raise ValueError(f"{text!r} is not a size (bytes, or a number with K/M/G/T or %)")
    number, unit = float(m[1]), m[2].upper()
    if unit == "%":
        return int(physical_memory() * number / 100)
    return int(number * _UNITS[unit])


def max_bytes() -> int:
    """The largest single allocation or input a schedule may ask for (see the module doc)."""
    if _override is not None:
        return _override
    env = os.environ.get(ENV)
    if env:
        try:
            return parse_size(env)
        except ValueError as exc:
            raise ValidationError(f"{ENV}: {exc}") from None
    return int(physical_memory() * DEFAULT_SHARE)


def max_thunks() -> int:
    """The most thunks one schedule may hold: the memory budget over the compile cost per thunk."""
    return max(1, max_bytes() // COMPILE_BYTES_PER_THUNK)


def set_max_memory(nbytes: "int | str | None") -> None:
    """Set the memory budget for this process (bytes or a size string like "8G"); None restores the default."""
    global _override
    if nbytes is None:
        _override = None
        return
    value = parse_size(nbytes) if isinstance(nbytes, str) else int(nbytes)
    if value <= 0:
        raise ValidationError(f"set_max_memory: the budget must be > 0 bytes, got {nbytes!r}")
    _override = value


def _size(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def check_bytes(what: str, nbytes: int, field: str | None = None) -> None:
    """Raise a LimitError when `what` asks for more than `max_bytes()`."""
    limit = max_bytes()
    if nbytes > limit:
        raise LimitError(f"{what} asks for {nbytes} bytes ({_size(nbytes)}), over the limit of {limit} bytes "
                         f"({_size(limit)}; set {ENV} or rl.set_max_memory to change it)", field=field)


def check_thunks(count: int) -> None:
    """Raise a LimitError when a schedule holds more thunks than `max_thunks()`."""
    limit = max_thunks()
    if count > limit:
        raise LimitError(f"the schedule holds {count} thunks, over the limit of {limit} (the memory budget "
                         f"{_size(max_bytes())} / {COMPILE_BYTES_PER_THUNK // 1024} KiB per thunk; set {ENV} "
                         f"or rl.set_max_memory to change it)", field="thunks")


def check_file(what: str, path: "str | os.PathLike") -> None:
    """Raise a LimitError when the file at `path` is larger than `max_bytes()` (before reading it)."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return  # the reader reports a missing or unreadable file itself
    check_bytes(f"{what} {os.fspath(path)}", size)


def too_deep(what: str, levels: "int | None" = MAX_NESTING) -> LimitError:
    """The error for a document nested past what the format can use (`levels=None`: the JSON reader's limit)."""
    bound = f"{levels} levels" if levels else "the JSON reader's recursion limit"
    return LimitError(f"{what} is nested deeper than the format can use ({bound})")


def check_schedule(schedule) -> None:
    """The arena and thunk count a schedule asks for, checked before anything is compiled or allocated."""
    arena_bytes, thunks = getattr(schedule, "arena_bytes", None), getattr(schedule, "thunks", None)
    if isinstance(arena_bytes, int) and not isinstance(arena_bytes, bool):
        check_bytes("the schedule's arena", arena_bytes, field="arena_bytes")
    if isinstance(thunks, (tuple, list)):
        check_thunks(len(thunks))
