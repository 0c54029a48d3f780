"""ThunkSchedule: the thunks, the arena size and RLX's runtime constants, with a lossless JSON form.

    sched = ThunkSchedule([T.Sgemm(a=0, b=4096, c=8192, m=8, k=128, n=8)], arena_bytes=1 << 20)
    text = sched.to_json(indent=2)
    assert ThunkSchedule.from_json(text) == sched

The JSON document is `{"format": "rlx-llvm-schedule", "version": 1, "arena_bytes": …,
"mask_threshold": …, "mask_neg_inf": …, "score_skip": …, "rng": {"seed": 42, "backend": "Philox"},
"thunks": [...]}`; every thunk is in serde's externally tagged form (`{"Sgemm": {...}}`, `"Nop"`),
nested schedules (Scan bodies, CustomFn bodies) use the same document, and `bytes` fields are
`{"base64": "…"}`.  Floats are written with Python's shortest round-trip repr, so they load back
bit-exactly.
"""
from __future__ import annotations

import dataclasses
import json
import os
import threading
from typing import Any, Iterable

from ._sumtype import from_jsonable, to_jsonable
from . import limits
from .errors import ValidationError
from .ops import RngOptions
from .thunks import Nop, Thunk

FORMAT = "rlx-llvm-schedule"
VERSION = 1
_FLOAT_KEYS = ("mask_threshold", "mask_neg_inf", "score_skip")
_nesting = threading.local()  # how deep in nested schedules (Scan / CustomFn bodies) the decoder is


@dataclasses.dataclass(frozen=True)
class ThunkSchedule:
    """A compiled RLX thunk schedule: thunks in execution order over one arena of `arena_bytes`."""

    thunks: tuple[Thunk, ...]
    arena_bytes: int
    mask_threshold: float = 0.5
    mask_neg_inf: float = -1e9
    score_skip: float = 1e-8
    rng: RngOptions = RngOptions()

    def __post_init__(self) -> None:
        if not isinstance(self.thunks, tuple):
            object.__setattr__(self, "thunks", tuple(self.thunks))

    def strip_nops(self) -> "ThunkSchedule":
        """The same schedule without its Nop thunks."""
        return dataclasses.replace(self, thunks=tuple(t for t in self.thunks if not isinstance(t, Nop)))

    # ── JSON ────────────────────────────────────────────────────────────────

    def to_jsonable(self) -> dict[str, Any]:
        """The schedule document as plain JSON-ready values."""
        return {"format": FORMAT, "version": VERSION, "arena_bytes": self.arena_bytes,
                **{k: getattr(self, k) for k in _FLOAT_KEYS},
                "rng": to_jsonable(self.rng), "thunks": [t.to_jsonable() for t in self.thunks]}

    def to_json(self, indent: int | None = None) -> str:
        """The schedule as a JSON document."""
        return json.dumps(self.to_jsonable(), indent=indent)

    @classmethod
    def from_jsonable(cls, data: Any) -> "ThunkSchedule":
        """Decode a schedule document; ValidationError names the thunk index and field at fault."""
        depth = getattr(_nesting, "depth", 0)
        if depth >= limits.MAX_NESTING:
            raise limits.too_deep("a nested body (Scan / CustomFn)")
        _nesting.depth = depth + 1
        try:
            return cls._decode(data)
        except RecursionError:
            raise limits.too_deep("the schedule document", None) from None
        finally:
            _nesting.depth = depth

    @classmethod
    def _decode(cls, data: Any) -> "ThunkSchedule":
        if not isinstance(data, dict):
            raise ValidationError(f"a schedule is a JSON object, got {type(data).__name__}")
        known = {"format", "version", "arena_bytes", "rng", "thunks", *_FLOAT_KEYS}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValidationError(f"unknown schedule key(s) {', '.join(map(repr, unknown))}", field=unknown[0])
        if data.get("format") != FORMAT:
            raise ValidationError(f"format must be {FORMAT!r}, got {data.get('format')!r}", field="format")
        if data.get("version") != VERSION:
            raise ValidationError(f"unsupported version {data.get('version')!r} (this reader knows {VERSION})",
                                  field="version")
        arena_bytes = data.get("arena_bytes")
        if not isinstance(arena_bytes, int) or isinstance(arena_bytes, bool) or arena_bytes < 0:
            raise ValidationError(f"arena_bytes must be a non-negative integer, got {arena_bytes!r}",
                                  field="arena_bytes")
        consts = {}
        for key in _FLOAT_KEYS:
            if key in data:
                value = data[key]
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    raise ValidationError(f"{key} must be a number, got {value!r}", field=key)
                consts[key] = float(value)
        if "rng" in data:
            consts["rng"] = _decode_rng(data["rng"])
        items = data.get("thunks")
        if not isinstance(items, list):
            raise ValidationError(f"thunks must be a list, got {type(items).__name__}", field="thunks")
        limits.check_thunks(len(items))
        return cls(_decode_thunks(items), arena_bytes=arena_bytes, **consts)

    @classmethod
    def from_json(cls, text: str | bytes) -> "ThunkSchedule":
        """Parse a schedule document written by `to_json`."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"not valid JSON: {exc}") from None
        except RecursionError:
            raise limits.too_deep("the JSON document", None) from None
        return cls.from_jsonable(data)

    def save(self, path: str | os.PathLike) -> None:
        """Write the schedule to `path` as JSON."""
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ThunkSchedule":
        """Read a schedule written by `save`."""
        with open(path, encoding="utf-8") as fh:
            return cls.from_json(fh.read())


def _decode_thunks(items: Iterable[Any]) -> tuple[Thunk, ...]:
    thunks = []
    for i, item in enumerate(items):
        try:
            thunks.append(Thunk.from_jsonable(item))
        except ValidationError as exc:
            raise exc.at(i, exc.kind) from None
    return tuple(thunks)


def _decode_rng(raw: Any) -> RngOptions:
    if not isinstance(raw, dict) or set(raw) - {"seed", "backend"}:
        raise ValidationError(f"rng must be {{'seed': int, 'backend': name}}, got {raw!r}", field="rng")
    try:
        rng = from_jsonable(RngOptions, raw)
    except (KeyError, ValueError, TypeError) as exc:
        raise ValidationError(f"bad rng {raw!r}: {exc}", field="rng") from None
    if not isinstance(rng.seed, int) or isinstance(rng.seed, bool) or not 0 <= rng.seed < 2**64:
        raise ValidationError(f"rng seed must be a u64, got {rng.seed!r}", field="rng")
    return rng
