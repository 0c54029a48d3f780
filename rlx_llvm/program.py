"""compile(schedule) → Program: validate, plan native segments and fallbacks, emit, JIT, run."""
from __future__ import annotations

import ctypes
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from llvmlite import ir

from . import jit
from .arena import ALIGNMENT, Arena
from .errors import ExecutionError, ValidationError
from . import registry
from .ir_emit import shared_bodies
from .ir_emit.core import I32, I64, PTR, EmitContext, snake
from .validate import validate_schedule

# `i64 segment(ptr arena, ptr scratch)`; a CFUNCTYPE call releases the GIL while native code runs.
_DRIVER = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)


@dataclass
class ThunkReport:
    """One row of `Program.report()`."""

    index: int
    kind: str
    path: str
    symbol: str
    emit_ms: float
    body: str = ""
    """The shared body this thunk's function calls ("" when it has its own code)."""


@dataclass
class Report:
    """Per-thunk lowering paths plus module-level compile timings."""

    rows: list[ThunkReport]
    timings_ms: dict[str, float]
    from_cache: bool

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> ThunkReport:
        return self.rows[i]

    def __str__(self) -> str:
        lines = [f"{'#':>4}  {'kind':<28} {'path':<6} {'symbol':<40} emit ms"]
        lines += [f"{r.index:>4}  {r.kind:<28} {r.path:<6} {r.symbol:<40} {r.emit_ms:7.2f}"
                  + (f"  → {r.body}" if r.body else "") for r in self.rows]
        t = ", ".join(f"{k} {v:.1f} ms" for k, v in self.timings_ms.items())
        lines.append(f"module: {t}" + (" (object loaded from cache)" if self.from_cache else ""))
        return "\n".join(lines)


@dataclass
class _NativeStep:
    symbol: str
    indices: list[int]
    fn: Callable | None = None


@dataclass
class _FallbackStep:
    index: int
    thunk: object
    run: Callable


def _plan(schedule) -> list:
    steps: list = []
    for i, t in enumerate(schedule.thunks):
        low = registry.LOWERINGS[type(t)]
        if low.emit is not None:
            if not steps or not isinstance(steps[-1], _NativeStep):
                steps.append(_NativeStep(f"segment{sum(isinstance(s, _NativeStep) for s in steps)}", []))
            steps[-1].indices.append(i)
        else:
            steps.append(_FallbackStep(i, t, low.run))
    return steps


class _ModuleBuilder:
    """One LLVM module: a function per native thunk and a driver per segment."""

    def __init__(self, schedule, lanes: int) -> None:
        self.schedule, self.lanes = schedule, lanes
        self.module = ir.Module(name="rlx_schedule")
        self.module.triple = jit.host().triple
        self.symbols: dict[int, str] = {}
        self.emit_ms: dict[int, float] = {}
        self.scratch_bytes = 0
        self.paths: dict[int, str] = {}
        self.bodies: dict[str, tuple[ir.Function, EmitContext]] = {}  # canonical thunk → shared body
        self.body_of: dict[int, str] = {}  # thunk index → the shared body its function calls

    def declare(self, name: str, fnty: ir.FunctionType) -> ir.Function:
        existing = self.module.globals.get(name)
        if existing is not None:
            return existing
        return ir.Function(self.module, fnty, name=name)

    def thunk_function(self, index: int, thunk) -> ir.Function:
        name = f"t{index}_{snake(type(thunk).__name__)}"
        fn = self._function(name)
        low = registry.LOWERINGS[type(thunk)]
        t0 = time.perf_counter()
        if low.shared_body:
            ctx = self._call_shared_body(fn, index, thunk)
        else:
            ctx = self._emit(fn, index, thunk, fields=False)
        self.scratch_bytes = max(self.scratch_bytes, ctx.scratch_bytes)
        self.paths[index] = "blas" if "blas" in ctx.paths else ("llvm" if ctx.paths else low.path)
        self.emit_ms[index] = (time.perf_counter() - t0) * 1e3
        self.symbols[index] = name
        self.module.add_named_metadata("rlx.thunks", [ir.MetaDataString(self.module, f"{name}: {thunk!r}")])
        return fn

    def _function(self, name: str) -> ir.Function:
        """`i32 @name(ptr noalias %arena, ptr noalias %scratch)`, kept out of line."""
        fn = ir.Function(self.module, ir.FunctionType(I32, [PTR, PTR]), name=name)
        fn.args[0].name, fn.args[1].name = "arena", "scratch"
        for arg in fn.args:
            arg.add_attribute("noalias")
        fn.attributes.add("nounwind")
        fn.attributes.add("noinline")  # keeps each thunk a separate, inspectable symbol
        return fn

    def _emit(self, fn: ir.Function, index: int, thunk, fields: bool) -> EmitContext:
        ctx = EmitContext(self.module, fn, index, thunk, self.schedule, self.lanes, self.declare, fields=fields)
        registry.LOWERINGS[type(thunk)].emit(ctx, thunk)
        ctx.finish()
        return ctx

    def _call_shared_body(self, fn: ir.Function, index: int, thunk) -> EmitContext:
        """Fill the buffer table and call the body shared by every thunk with the same canonical
        form (`ir_emit.shared_bodies`), emitting that body on first use."""
        form, bases = shared_bodies.canonical(thunk)
        key = repr(form)
        if key not in self.bodies:
            body = self._function(f"{fn.name}.body")
            body.args[0].name = "fields"
            self.bodies[key] = (body, self._emit(body, index, form, fields=True))
        body, ctx = self.bodies[key]
        self.body_of[index] = body.name
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        table = b.alloca(ir.ArrayType(PTR, 1 + len(bases)), name="fields")
        for k, base in enumerate([0] + bases):
            at = b.gep(fn.args[0], [I64(base)], source_etype=ir.IntType(8), inbounds=True)
            b.store(at, b.gep(table, [I32(0), I32(k)], inbounds=True))
        b.ret(b.call(body, [table, fn.args[1]]))
        return ctx

    def driver(self, step: _NativeStep, fns: list[ir.Function]) -> None:
        """`i64 @segmentN(ptr, ptr)`: call each thunk; return 0, or (index + 1) << 32 | status."""
        drv = ir.Function(self.module, ir.FunctionType(I64, [PTR, PTR]), name=step.symbol)
        drv.attributes.add("nounwind")
        b = ir.IRBuilder(drv.append_basic_block("entry"))
        for index, fn in zip(step.indices, fns):
            status = b.call(fn, list(drv.args))
            failed = drv.append_basic_block(f"failed.t{index}")
            ok = drv.append_basic_block(f"after.t{index}")
            b.cbranch(b.icmp_unsigned("!=", status, I32(0)), failed, ok)
            b.position_at_end(failed)
            b.ret(b.or_(I64((index + 1) << 32), b.zext(status, I64)))
            b.position_at_end(ok)
        b.ret(I64(0))


def _resolve_cache(cache) -> "jit.ObjectCache | None":
    if cache is False or (cache is None and not jit.cache_enabled_by_env()):
        return None
    if isinstance(cache, jit.ObjectCache):
        return cache
    if isinstance(cache, (str, os.PathLike)):
        return jit.ObjectCache(cache)
    return jit.ObjectCache()


def compile(schedule, *, opt_level: int = 3, cache: "bool | str | os.PathLike | jit.ObjectCache | None" = None
            ) -> "Program":
    """Validate `schedule`, lower every thunk, JIT the native segments and return a Program.

    With the object cache on (the default), a schedule compiled before by the same rlx_llvm code
    on the same host starts warm: no validation, no IR emission, no LLVM passes — the object and
    its plan are loaded from disk (see `_warm_key`).
    """
    if opt_level not in (0, 1, 2, 3):
        raise ValidationError(f"opt_level must be 0..3, got {opt_level!r}")
    store = _resolve_cache(cache)
    warm = _warm_lookup(store, schedule, opt_level) if store is not None else None
    if warm is None:
        registry.load_all()
        validate_schedule(schedule, registry.LOWERINGS)
    return Program(schedule, opt_level, store, warm)


_fingerprint: str | None = None


def code_fingerprint() -> str:
    """sha256 over rlx_llvm's source files (name, size, mtime): editing any emitter invalidates warm
    starts.  (The object cache itself is keyed by the IR text, so a stale plan can never load
    wrong code — at worst it misses.)"""
    global _fingerprint
    if _fingerprint is None:
        import hashlib
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


def _warm_key(schedule, opt_level: int) -> str | None:
    import hashlib
    try:
        text = schedule.to_json()
    except Exception:  # not serializable: no warm start (validation will explain)
        return None
    # Emitter switches read from the environment at compile time (e.g. RLX_LLVM_GEMM) change the
    # code, so they are part of the key; the cache's own settings are not.
    switches = sorted(f"{k}={v}" for k, v in os.environ.items()
                      if k.startswith("RLX_LLVM_") and not k.startswith("RLX_LLVM_CACHE"))
    parts = [text, code_fingerprint(), jit.cache_key("", opt_level), *switches]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _warm_lookup(store: "jit.ObjectCache", schedule, opt_level: int) -> dict | None:
    key = _warm_key(schedule, opt_level)
    meta = store.load_meta(key) if key else None
    if meta is None or meta.get("n_thunks") != len(schedule.thunks):
        return None
    code = store.load(meta["object_key"]) if meta["object_key"] else None
    if meta["object_key"] and code is None:
        return None
    if code is not None and _unresolved(code.externals):
        return None  # cannot resolve what the object calls: compile cold (which will explain)
    meta["code"], meta["key"] = code, key
    return meta


def _unresolved(externals: list[str]) -> list[str]:
    """External symbols of a cached object that the process cannot provide.

    A warm start imports no emitter, so the runtime symbols emitters register at import or emit
    time (BLAS/LAPACK capsules, libgomp, `rlx_num_threads`) may not be registered yet: register
    them all, then check.  An unresolved external would be linked to NULL by MCJIT and crash.
    """
    import llvmlite.binding as llvm
    def missing() -> list[str]:
        return [name for name in externals if not llvm.address_of_symbol(name)]

    if missing():  # cheapest first: libgomp and the thread count (µs), then BLAS (imports scipy.linalg)
        from .ir_emit import parallel
        parallel.register_runtime()
    if missing():
        from .kernels import blas  # noqa: F401  (registers every rlx_<routine> it resolves)
    if missing():
        registry.load_all()
    return missing()


class Program:
    """A compiled schedule: `run(arena)` executes it; `report/llvm_ir/asm` inspect it."""

    def __init__(self, schedule, opt_level: int, cache, warm: dict | None = None) -> None:
        t0 = time.perf_counter()
        self.schedule = schedule
        self.opt_level = opt_level
        self._scratch = threading.local()
        self._engine = None
        self._code = None
        self._asm: str | None = None
        self._ir_text: str | None = None
        if warm is not None:
            self._start_warm(warm, cache)
        else:
            self._build(cache)
        if self._code is not None:
            t1 = time.perf_counter()
            self._engine = jit.Engine()
            self._engine.load(self._code)
            for step in self._steps:
                if isinstance(step, _NativeStep):
                    step.fn = _DRIVER(self._engine.address(step.symbol))
            self._timings["load"] = (time.perf_counter() - t1) * 1e3
        self.compile_ms: float = (time.perf_counter() - t0) * 1e3
        """Wall time of the whole compile (emit + optimize + codegen, or the warm start)."""

    def _build(self, cache) -> None:
        """Cold path: plan, emit one function per thunk, compile (or load the object by IR hash)."""
        self._steps = _plan(self.schedule)
        self._paths = [registry.LOWERINGS[type(t)].path for t in self.schedule.thunks]
        t0 = time.perf_counter()
        mb = _ModuleBuilder(self.schedule, jit.host().lanes(32))
        for step in self._steps:
            if isinstance(step, _NativeStep):
                fns = [mb.thunk_function(i, self.schedule.thunks[i]) for i in step.indices]
                mb.driver(step, fns)
        self._symbols = mb.symbols
        self._bodies = mb.body_of
        self._paths = [mb.paths.get(i, p) for i, p in enumerate(self._paths)]
        self.scratch_bytes: int = mb.scratch_bytes
        """Bytes of per-thread scratch the native code needs (allocated lazily per calling thread)."""
        self._emit_ms = mb.emit_ms
        self._ir_text = str(mb.module)
        self._timings = {"emit": (time.perf_counter() - t0) * 1e3}
        if any(isinstance(s, _NativeStep) for s in self._steps):
            self._code = jit.compile_ir(self._ir_text, opt=self.opt_level, cache=cache)
            self._timings.update(self._code.timings_ms)
        if cache is not None:
            key = _warm_key(self.schedule, self.opt_level)
            if key:
                cache.store_meta(key, {
                    "n_thunks": len(self.schedule.thunks), "paths": self._paths,
                    "object_key": self._code.key if self._code else "",
                    "symbols": {str(i): name for i, name in self._symbols.items()},
                    "bodies": {str(i): name for i, name in self._bodies.items()},
                    "segments": [[s.symbol, s.indices] for s in self._steps if isinstance(s, _NativeStep)],
                    "scratch_bytes": self.scratch_bytes}, source_ir=self._ir_text)
        self._warm = False

    def _start_warm(self, meta: dict, cache) -> None:
        """Warm path: the plan and the object come from the cache; emitters are not even imported."""
        self._paths = meta["paths"]
        self._symbols = {int(i): name for i, name in meta["symbols"].items()}
        self._bodies = {int(i): name for i, name in meta.get("bodies", {}).items()}
        self.scratch_bytes = meta["scratch_bytes"]
        self._emit_ms = {}
        self._code = meta["code"]
        self._source_ir_key = meta["key"]
        self._cache = cache
        native = {i for _, idx in meta["segments"] for i in idx}
        segments = {idx[0]: _NativeStep(sym, list(idx)) for sym, idx in meta["segments"]}
        steps: list = []
        for i, t in enumerate(self.schedule.thunks):
            if i in segments:
                steps.append(segments[i])
            elif i not in native:
                registry.load_all()
                steps.append(_FallbackStep(i, t, registry.LOWERINGS[type(t)].run))
        self._steps = steps
        self._timings = {"warm start": 0.0}
        self._warm = True

    @property
    def _ir(self) -> str:
        if self._ir_text is None:
            self._ir_text = self._cache.load_source_ir(self._source_ir_key) or ""
        return self._ir_text

    # ── running ──
    def run(self, arena: "Arena | np.ndarray") -> None:
        """Execute the schedule on `arena` (an Arena, or a 64-byte-aligned writable uint8 array)."""
        buf, address = _arena_bytes(arena, self.schedule.arena_bytes)
        scratch = self._thread_scratch()
        for step in self._steps:
            if isinstance(step, _NativeStep):
                status = step.fn(address, scratch)
                if status:
                    index, code = (status >> 32) - 1, status & 0xFFFFFFFF
                    kind = type(self.schedule.thunks[index]).__name__
                    raise ExecutionError(f"native kernel failed: {_describe(kind, code)} (status {code})",
                                         index=index, kind=kind, status=code)
            else:
                try:
                    step.run(buf, step.thunk)
                except ExecutionError:
                    raise
                except Exception as exc:  # a fallback's own failure, located
                    raise ExecutionError(f"{type(exc).__name__}: {exc}", index=step.index,
                                         kind=type(step.thunk).__name__) from exc

    __call__ = run

    def _thread_scratch(self) -> int:
        """Address of this thread's scratch buffer (64-byte aligned), allocated on first use."""
        if not self.scratch_bytes:
            return 0
        address = getattr(self._scratch, "address", None)
        if address is None:
            raw = np.empty(self.scratch_bytes + ALIGNMENT, dtype=np.uint8)
            start = (-raw.ctypes.data) % ALIGNMENT
            self._scratch.raw = raw  # keeps the buffer alive as long as the thread-local
            self._scratch.address = address = raw.ctypes.data + start
        return address

    # ── inspection ──
    def report(self) -> Report:
        """Per thunk: index, kind, lowering path, symbol and emit time; plus module timings."""
        rows = []
        for i, t in enumerate(self.schedule.thunks):
            symbol = self._symbols.get(i) or f"<python {type(t).__name__}>"
            rows.append(ThunkReport(i, type(t).__name__, self._paths[i], symbol, round(self._emit_ms.get(i, 0.0), 3),
                                    self._bodies.get(i, "")))
        return Report(rows, {k: round(v, 2) for k, v in self._timings.items()},
                      bool(self._warm or (self._code and self._code.from_cache)))

    def llvm_ir(self, optimized: bool = False, thunk: int | None = None) -> str:
        """LLVM IR as emitted (or after O3 with `optimized=True`), whole or for thunk index `thunk`."""
        text = self._code.optimized_ir if optimized and self._code else self._ir
        if thunk is None:
            return text
        return _extract_function(text, self._symbol_of(thunk), header=f"; thunk {thunk}: "
                                 f"{self.schedule.thunks[thunk]!r}")

    def asm(self, thunk: int | None = None) -> str:
        """Host assembly of the optimized module, whole or for thunk index `thunk`."""
        if self._code is None:
            return ""
        if self._asm is None:
            self._asm = jit.assembly(self._code.optimized_ir)
        if thunk is None:
            return self._asm
        return _extract_asm(self._asm, self._symbol_of(thunk))

    def _symbol_of(self, thunk: int) -> str:
        if thunk not in self._symbols:
            raise ValidationError(f"thunk {thunk} has no native function (path "
                                  f"{self.report()[thunk].path if 0 <= thunk < len(self.schedule.thunks) else '?'})")
        return self._symbols[thunk]

    def __repr__(self) -> str:
        n = sum(len(s.indices) for s in self._steps if isinstance(s, _NativeStep))
        return f"<Program: {len(self.schedule.thunks)} thunks, {n} native, {self.compile_ms:.0f} ms compile>"


def _describe(kind: str, status: int) -> str:
    """What a native status means: BLAS/LAPACK lowerings share one table (kernels.blas.Status)."""
    low = registry.LOWERINGS.get(registry.ALL_THUNKS.get(kind))
    if low is not None and low.path == "blas":
        from .kernels.blas import describe_status
        return describe_status(status)
    return "error"


def _arena_bytes(arena, needed: int) -> tuple[np.ndarray, int]:
    """The arena's bytes and address, checked (an Arena's address is cached: no NumPy call)."""
    if isinstance(arena, Arena):
        if arena.nbytes < needed:
            raise ValidationError(f"the arena has {arena.nbytes} bytes; the schedule needs {needed}")
        return arena.bytes, arena.address
    buf = arena
    if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1 \
            or not buf.flags.c_contiguous or not buf.flags.writeable:
        raise ValidationError("the arena must be an Arena or a writable, contiguous 1-D uint8 array")
    if buf.size < needed:
        raise ValidationError(f"the arena has {buf.size} bytes; the schedule needs {needed}")
    address = buf.ctypes.data
    if buf.size and address % ALIGNMENT:
        raise ValidationError(f"the arena must be {ALIGNMENT}-byte aligned (use rlx_llvm.Arena)")
    return buf, address


def _extract_function(text: str, symbol: str, header: str = "") -> str:
    """The definition of `symbol` and of the thunk functions it calls, transitively: its parallel
    bodies (`t3_x.par1`) and a shared body (`t2_x.body`), each once."""
    defs = _definitions(text)
    out, todo, seen = [], [symbol], set()
    while todo:
        name = todo.pop(0)
        if name in seen or name not in defs:
            continue
        seen.add(name)
        out.append(defs[name])
        todo += [m for m in _CALLED.findall(defs[name]) if m not in seen]
    return "\n".join(([header] if header else []) + ["\n\n".join(out)])


_DEFINE = re.compile(r'^define [^@]*@"?([^"(]+)"?\(', re.M)
_CALLED = re.compile(r'@"?(t\d+_[\w.]+)"?')


def _definitions(text: str) -> dict[str, str]:
    """Function name → its `define … { … }` text."""
    defs, lines, name = {}, [], None
    for line in text.splitlines():
        if name is None:
            m = _DEFINE.match(line)
            if m:
                name, lines = m.group(1), [line]
                if line.rstrip().endswith("}"):
                    defs[name], name = line, None
            continue
        lines.append(line)
        if line.startswith("}"):
            defs[name], name = "\n".join(lines), None
    return defs


def _extract_asm(text: str, symbol: str) -> str:
    """The assembly of `symbol` and of the thunk functions it calls (as `_extract_function`)."""
    out, todo, seen = [], [symbol], set()
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        block = _asm_function(text, name)
        if block:
            out.append(block)
            todo += [m for m in re.findall(r"\b(t\d+_[\w.]+)\b", block) if m not in seen]
    return "\n\n".join(out)


def _asm_function(text: str, symbol: str) -> str:
    lines, out, inside = text.splitlines(), [], False
    for line in lines:
        if line.startswith(f"{symbol}:"):
            inside = True
        if inside:
            out.append(line)
            if line.strip().startswith(".Lfunc_end") or line.strip().startswith(f".size\t{symbol}"):
                break
    return "\n".join(out)
