"""The on-disk cache: compiled objects keyed by their IR, and warm-start plans keyed by the schedule.

* **Objects** (`ObjectCache.load/store`) are keyed by `jit.cache_key`: the IR text, llvmlite and
  LLVM versions, host CPU and features, opt level.  A stale entry can never load wrong code.
* **Plans** (`warm_lookup`/`store_plan`) are keyed by `warm_key`: the schedule's JSON, a
  fingerprint of rlx_llvm's own sources, the host and the emitter switches read from the
  environment.  A hit skips validation, IR emission and LLVM altogether: the plan (segments,
  symbols, paths, scratch size) and the object come from disk.  Its per-thunk tables are runs
  (`codegen.RunMap.runs`: `[start, stop, value]`) and its segments ranges (`[symbol, start, stop]`),
  so a plan of 200 000 thunks sharing one body is a few lines; `PLAN_VERSION` names that format.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import llvmlite

from . import jit
from .jit import ObjectCode, ObjectSet

PLAN_VERSION = 2
"""The warm-start plan's format: 2 = per-thunk tables as runs, segments as ranges (1: per-thunk dicts)."""


class ObjectCache:
    """On-disk store of compiled objects keyed by `cache_key` (atomic writes, safe to share)."""

    def __init__(self, directory: "str | os.PathLike | None" = None) -> None:
        self.directory = Path(directory or default_cache_dir())

    def load(self, key: str) -> ObjectCode | None:
        """The cached object for `key`, or None."""
        base = self.directory / key[:2] / key
        try:
            meta = json.loads((base.with_suffix(".json")).read_text())
            obj = base.with_suffix(".o").read_bytes()
            ir_text = base.with_suffix(".ll").read_text()
        except (OSError, ValueError):
            return None
        if hashlib.sha256(obj).hexdigest() != meta.get("object_sha256"):
            return None
        return ObjectCode(key, obj, ir_text, meta.get("externals", []), from_cache=True)

    def load_all(self, key: "str | list[str]") -> "ObjectCode | ObjectSet | None":
        """The object under `key`, or the objects of a module compiled in parts (a list of keys);
        None unless every one is there."""
        if isinstance(key, str):
            return self.load(key)
        parts = [self.load(k) for k in key]
        return None if None in parts else ObjectSet(parts)

    def _write(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)

    def store_meta(self, key: str, meta: dict, source_ir: str) -> None:
        """Remember a compiled schedule's plan (and its unoptimized IR) under its warm-start key."""
        base = self.directory / key[:2] / key
        try:
            self._write(base.with_suffix(".src.ll"), source_ir.encode())
            self._write(base.with_suffix(".plan.json"), json.dumps(meta).encode())
        except OSError:
            pass

    def load_meta(self, key: str) -> dict | None:
        """The plan stored by `store_meta`, or None."""
        try:
            return json.loads((self.directory / key[:2] / key).with_suffix(".plan.json").read_text())
        except (OSError, ValueError):
            return None

    def load_source_ir(self, key: str) -> str | None:
        """The unoptimized IR stored beside a plan."""
        try:
            return (self.directory / key[:2] / key).with_suffix(".src.ll").read_text()
        except OSError:
            return None

    def store(self, code: ObjectCode) -> None:
        """Write an object atomically; failures to write are ignored (the cache is optional)."""
        base = self.directory / code.key[:2] / code.key
        meta = {"object_sha256": hashlib.sha256(code.object).hexdigest(), "externals": code.externals,
                "llvmlite": llvmlite.__version__}
        try:
            for suffix, data in ((".o", code.object), (".ll", code.optimized_ir.encode()),
                                 (".json", json.dumps(meta).encode())):
                self._write(base.with_suffix(suffix), data)
        except OSError:
            pass


def default_cache_dir() -> Path:
    """$RLX_LLVM_CACHE_DIR, else $XDG_CACHE_HOME/rlx_llvm, else ~/.cache/rlx_llvm."""
    env = os.environ.get("RLX_LLVM_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rlx_llvm"


def cache_enabled_by_env() -> bool:
    """False when RLX_LLVM_CACHE=0 disables the object cache."""
    return os.environ.get("RLX_LLVM_CACHE", "1") not in ("0", "false", "no", "off")


def resolve_cache(cache: "bool | str | os.PathLike | ObjectCache | None") -> "ObjectCache | None":
    """The cache a `compile(cache=...)` argument names: None (off), a directory, or the default."""
    if cache is False or (cache is None and not cache_enabled_by_env()):
        return None
    if isinstance(cache, ObjectCache):
        return cache
    if isinstance(cache, (str, os.PathLike)):
        return ObjectCache(cache)
    return ObjectCache()


# ── warm starts ─────────────────────────────────────────────────────────────

_fingerprint: str | None = None


def code_fingerprint() -> str:
    """sha256 over rlx_llvm's source files (name, size, mtime): editing any emitter invalidates warm
    starts.  (The object cache itself is keyed by the IR text, so a stale plan can never load
    wrong code — at worst it misses.)"""
    global _fingerprint
    if _fingerprint is None:
        h = hashlib.sha256()
        root = os.path.dirname(os.path.abspath(__file__))
        for folder, dirs, files in sorted(os.walk(root)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in sorted(files):
                if name.endswith(".py"):
                    st = os.stat(os.path.join(folder, name))
                    h.update(f"{folder[len(root):]}/{name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        _fingerprint = h.hexdigest()
    return _fingerprint


def warm_key(schedule, opt_level: int) -> str | None:
    """The plan key of a schedule (None when it cannot be serialized: no warm start)."""
    try:
        text = schedule.to_json()
    except Exception:  # not serializable: validation will explain
        return None
    # Emitter switches read from the environment at compile time (e.g. RLX_LLVM_GEMM) change the
    # code, so they are part of the key; the cache's own settings and tiering (which only decides
    # when the same O3 object arrives) are not.
    switches = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("RLX_LLVM_")
                      and not k.startswith(("RLX_LLVM_CACHE", "RLX_LLVM_TIERED")))
    parts = [text, code_fingerprint(), jit.cache_key("", opt_level), *switches]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def warm_lookup(store: ObjectCache, schedule, opt_level: int) -> dict | None:
    """A stored plan whose object is present and loadable, with `code` and `key` added; else None."""
    key = warm_key(schedule, opt_level)
    meta = store.load_meta(key) if key else None
    if meta is None or meta.get("plan_version") != PLAN_VERSION or meta.get("n_thunks") != len(schedule.thunks):
        return None
    code = store.load_all(meta["object_key"]) if meta["object_key"] else None
    if meta["object_key"] and code is None:
        return None
    if code is not None and jit.missing_symbols(code.externals):
        return None  # cannot resolve what the object calls: compile cold (which will explain)
    meta["code"], meta["key"] = code, key
    return meta


def store_plan(store: ObjectCache, schedule, opt_level: int, plan: dict, source_ir: str) -> None:
    """Remember a cold compile's plan under the schedule's warm key."""
    key = warm_key(schedule, opt_level)
    if key:
        store.store_meta(key, {"plan_version": PLAN_VERSION, **plan}, source_ir=source_ir)
