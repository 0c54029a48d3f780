"""compile(schedule) → Program: validate, lower (`codegen`), JIT (`jit`), cache (`cache`), run, inspect."""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import gc
import os
import queue
import threading
import time
import weakref

import numpy as np

from . import cache as object_cache
from . import custom_ops, jit, limits, registry
from .arena import ALIGNMENT, Arena
from .cache import ObjectCache
from .codegen import FallbackStep, ModuleBuilder, NativeStep, RunMap, plan
from .errors import ExecutionError, RlxError, ValidationError
from .inspection import Report, ThunkReport, function_asm, function_ir
from .partition import Parts, Streamed, split, split_functions
from .progress import Progress, ProgressCallback
from .validate import validate_schedule

# `i64 segment(ptr arena, ptr scratch)`; a CFUNCTYPE call releases the GIL while native code runs.
_DRIVER = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)


def _register_runtime() -> None:
    from .ir_emit import parallel
    parallel.register_runtime()


def _register_blas() -> None:
    from .kernels import blas  # noqa: F401  (registers every rlx_<routine> it resolves)


# A warm start imports no emitter, so the runtime symbols emitters register at import or emit time
# may not be registered yet: cheapest first — libgomp and the thread count (µs), then BLAS (imports
# scipy.linalg), then every lowering family.
jit.SYMBOL_PROVIDERS[:] = [_register_runtime, _register_blas, registry.load_all]


def compile(schedule, *, opt_level: int = 3, cache: "bool | str | os.PathLike | ObjectCache | None" = None,
            tiered: "bool | None" = None, progress: "ProgressCallback | None" = None) -> "Program":
    """Validate `schedule`, lower every thunk, JIT the native segments and return a Program.

    With the object cache on (the default), a schedule compiled before by the same rlx_llvm code
    on the same host starts warm: no validation, no IR emission, no LLVM passes — the object and
    its plan are loaded from disk (`rlx_llvm.cache`).

    `tiered=True` (default: with RLX_LLVM_TIERED=1, for modules of TIER_UP_IR_CHARS or more): a
    cold compile at opt_level ≥ 2 returns once a quick object is built; the full object is built on
    a background thread, stored in the cache and swapped in between runs.  The two tiers may differ
    in the last bits where O3 reassociates reductions, so it is off by default (docs/compile.md).

    A module of PARALLEL_IR_CHARS or more compiles in parts, one per configured thread
    (`rl.set_num_threads`), at once (docs/compile.md, same bits as one part).  `progress`, if
    given, is called on this thread with a `rlx_llvm.progress.Progress(phase, done, total)` as the
    thunks are emitted, the parts compiled and the object loaded.
    """
    if opt_level not in (0, 1, 2, 3):
        raise ValidationError(f"opt_level must be 0..3, got {opt_level!r}")
    store = object_cache.resolve_cache(cache)
    warm = object_cache.warm_lookup(store, schedule, opt_level) if store is not None else None
    if warm is None:
        registry.load_all()
        validate_schedule(schedule, registry.LOWERINGS)
    limits.check_schedule(schedule)   # the arena and thunk count it asks for, before anything is allocated
    return Program(schedule, opt_level, store, warm, tiered, progress)


TIER_UP_IR_CHARS = 40_000
"""RLX_LLVM_TIERED=1 tiers modules this large (IR text); below, O3 costs under ~75 ms anyway."""


def tiering_by_env() -> bool:
    """Whether RLX_LLVM_TIERED asks for tiering: first calls may then differ from later ones in the last bits."""
    return os.environ.get("RLX_LLVM_TIERED", "0").strip().lower() not in ("", "0", "false", "no", "off")


def _tiering(requested: "bool | None", opt_level: int, ir_chars: int) -> bool:
    """Whether a cold compile runs quick code first: `requested`, else (RLX_LLVM_TIERED=1) for
    modules of TIER_UP_IR_CHARS or more; only at opt_level ≥ 2."""
    if requested is None:
        requested = tiering_by_env() and ir_chars >= TIER_UP_IR_CHARS
    return requested and opt_level >= 2


PARALLEL_IR_CHARS = 200_000
"""Modules with this much function text (IR) compile in parts on the configured threads; below, a
part costs less than ~0.3 s and splitting would not pay."""


def _split(ir_text: str) -> "Parts":
    """The module in parts for `jit.compile_parts`: one per configured thread once it is big enough."""
    from .kernels import pool
    return split(ir_text, pool.get_threads() if len(ir_text) >= PARALLEL_IR_CHARS else 1, PARALLEL_IR_CHARS)


QUICK_PARALLEL_IR_CHARS = 100_000
"""Quick-tier modules with this much function text compile in parts on the configured threads."""


def _split_quick(ir_text: str) -> "Parts":
    """The module in parts for the quick tier: the kernel library's helpers declared (`kernel_library`),
    then split function by function (`partition.split_functions`: no interprocedural pass runs there,
    so no tie needs keeping) — the largest thunk's parallel bodies compile on different threads."""
    from . import kernel_library
    from .kernels import pool
    text = kernel_library.borrow(ir_text, jit.compile_quick)
    parts = pool.get_threads() if len(text) >= QUICK_PARALLEL_IR_CHARS else 1
    return split_functions(text, parts, QUICK_PARALLEL_IR_CHARS)


STREAM_PART_CHARS = 400_000
"""On several threads, every this many characters of newly emitted functions become a part that
compiles while emission goes on (`_Pipeline`)."""
STREAM_CHECK_EVERY = 64
"""Thunks emitted between two looks at how much is ready for a part."""


class _Pipeline:
    """A module's parts compiled while the module is still being emitted (`partition.Streamed`): the
    LLVM work of the first parts overlaps the Python work of the rest.  Used only if the cuts keep
    every tie `split` keeps; otherwise the parts are dropped and the whole module split anew."""

    def __init__(self, module, opt_level: int, cache) -> None:
        self.module, self.opt_level, self.cache = module, opt_level, cache
        self.streamed = Streamed(module)
        self.held: list = []    # parts cut but not yet handed to the compile threads
        self.jobs: list = []
        self.t0 = 0.0

    def cut(self, last: bool = False, min_chars: "int | None" = None) -> None:
        """Cut the newly emitted functions into a part once there are `min_chars` (default
        STREAM_PART_CHARS) of them, and hand parts to the compile threads while fewer than
        `_emitting_threads()` compile."""
        self.streamed.broken |= self._links()   # IR kernels are linked into the whole text only
        part = self.streamed.cut(STREAM_PART_CHARS if min_chars is None else min_chars, last)
        if part is not None:
            self.held.append(part)
        elif self.streamed.broken:
            self._drop()
        self._submit(_emitting_threads())

    def before_driver(self) -> None:
        """Once the module is being cut into parts, the functions emitted since the last part (a
        quarter part or more) become a part before a segment's driver is emitted: the driver, a
        call per thunk, is large and left for the last part."""
        if self.jobs or self.held:
            self.cut(min_chars=STREAM_PART_CHARS // 4)

    def _submit(self, at_most: int) -> None:
        """Hand held parts to the compile threads while fewer than `at_most` of ours compile."""
        while self.held and sum(not job.done() for job in self.jobs) < at_most:
            self.t0 = self.t0 or time.perf_counter()
            self.jobs.append(jit.submit_part(*self.held.pop(0), opt=self.opt_level, cache=self.cache))

    def text(self) -> str:
        """The module's text, with its IR kernels linked in."""
        return custom_ops.link_ir_kernels(self.module) if self._links() else self.streamed.text()

    def end(self) -> None:
        """Once everything is emitted: the rest of the module becomes the last part and every part
        goes to the compile threads — or, if nothing was cut or the cuts do not hold, none does."""
        if (self.jobs or self.held) and self.streamed.holds():
            self.cut(last=True)   # may find the cuts broken (an IR kernel to link): then nothing is kept
            if not self.streamed.broken:
                self._submit(len(self.jobs) + len(self.held))
                return
        self._drop()

    def _drop(self) -> None:
        """Forget every part (the module will be split anew): free the compile threads."""
        self.held.clear()
        for job in self.jobs:
            job.cancel()
        self.jobs = []

    def finish(self, on_part) -> "jit.ObjectCode | jit.ObjectSet | None":
        """The compiled parts (`end`), or None if the module was not compiled in parts."""
        return jit.gather(self.jobs, self.t0, on_part) if self.jobs else None

    def _links(self) -> bool:
        """Whether the module declares IR kernels that `custom_ops.link_ir_kernels` links in."""
        prefix = f"{custom_ops.PREFIX}llvm."
        return any(f.is_declaration and f.name.startswith(prefix) for f in self.module.functions)


def _emitting_threads() -> int:
    """Compile threads that take parts while the module is still being emitted: one fewer than
    configured, leaving a core to the emitting thread (Python, holding the GIL)."""
    from .kernels import pool
    return max(1, pool.get_threads() - 1)


def _streaming(tiered: "bool | None", opt_level: int) -> bool:
    """Whether to compile parts while emitting: on several threads, untiered."""
    from .kernels import pool
    return pool.get_threads() >= 2 and not _tiering(tiered, opt_level, TIER_UP_IR_CHARS)


@contextlib.contextmanager
def _gc_paused():
    """The cyclic garbage collector held off while a module is emitted and printed (Python work only,
    not while LLVM compiles): emission allocates ~10⁵ llvmlite objects that live until the module is
    printed, and a full collection on the way walks them and the rest of the process (50–110 ms
    when one falls in a MiniLM shape's emission).  The collector runs as usual afterwards; if it was
    off already, it stays off."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


class _ThreadScratch(threading.local):
    """The scratch buffer every Program runs on in this thread (one per thread, grown to the largest
    program run): a thunk leaves nothing in scratch for the next thunk or run, so programs can share it.

    Sharing saves memory (an encoder's 15 cached shapes asked for 30–45 MB each) and the first-touch
    page faults of each new program's buffer — ~2.7 ms per MB in the VMs measured, +30–40 % on the
    first run of each new MiniLM shape.  A run nested in another on the same thread (a Python step
    that runs a Program) gets a buffer of its own for that run."""

    def __init__(self) -> None:
        self.raw: "np.ndarray | None" = None
        self.address = 0
        self.nbytes = 0
        self.busy = False

    def acquire(self, nbytes: int) -> int:
        """Address of this thread's buffer, grown to ≥ `nbytes`, now busy until `busy = False`."""
        if nbytes > self.nbytes:
            self.raw = None   # free the smaller buffer first
            self.raw, self.address = _aligned_bytes(nbytes)
            self.nbytes = nbytes
        self.busy = True
        return self.address

    def release(self) -> None:
        """Free this thread's buffer (the next run allocates one again)."""
        if not self.busy:
            self.raw, self.address, self.nbytes = None, 0, 0


_scratch = _ThreadScratch()


def _aligned_bytes(nbytes: int) -> tuple[np.ndarray, int]:
    """A new buffer of ≥ `nbytes` and the address of its first 64-byte-aligned byte."""
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    return raw, raw.ctypes.data + (-raw.ctypes.data) % ALIGNMENT


def release_scratch() -> None:
    """Free the calling thread's scratch buffer, which every Program run on this thread shares."""
    _scratch.release()


class Program:
    """A compiled schedule: `run(arena)` executes it; `report/llvm_ir/asm` inspect it."""

    def __init__(self, schedule, opt_level: int, cache, warm: dict | None = None,
                 tiered: "bool | None" = None, progress: "ProgressCallback | None" = None) -> None:
        t0 = time.perf_counter()
        self._progress = progress
        self.schedule = schedule
        self.opt_level = opt_level
        self._code = None
        self._tier_up: "_TierUp | None" = None
        self._asm: str | None = None
        self._ir_text: str | None = None
        self._cache = cache
        if warm is not None:
            self._start_warm(warm, cache)
        else:
            self._build(cache, tiered)
        if self._code is not None:
            t1 = time.perf_counter()
            self._report("load", 0, 1)
            self._steps = self._bound_steps(self._code)
            self._timings["load"] = (time.perf_counter() - t1) * 1e3
            self._report("load", 1, 1)
        self._progress = None
        self.compile_ms: float = (time.perf_counter() - t0) * 1e3
        """Wall time of the whole compile (emit + optimize + codegen, or the warm start); with
        tiering, up to the quick object being loaded."""
        if self._tier_up is not None:
            _optimizer.submit(self._tier_up)

    def _report(self, phase: str, done: int, total: int) -> None:
        """Tell the `progress` callback, if any."""
        if self._progress is not None:
            self._progress(Progress(phase, done, total))

    def _bound_steps(self, code: "jit.ObjectCode | jit.ObjectSet") -> list:
        """The steps with every native segment bound to `code`, loaded into a new engine that the
        steps keep alive (a run still in the old steps keeps the old engine)."""
        engine = jit.Engine()
        engine.load(code)
        return [dataclasses.replace(s, fn=_DRIVER(engine.address(s.symbol)), engine=engine)
                if isinstance(s, NativeStep) else s for s in self._steps]

    def _build(self, cache, tiered: "bool | None") -> None:
        """Cold path: plan, emit one function per thunk, compile (or load the object by IR hash);
        tiered, compile quickly now and leave the O3 object to the background optimizer."""
        self._steps = plan(self.schedule)
        self._paths = [registry.LOWERINGS[type(t)].path for t in self.schedule.thunks]
        t0 = time.perf_counter()
        mb = ModuleBuilder(self.schedule, jit.host().lanes(32))
        native = sum(len(s.indices) for s in self._steps if isinstance(s, NativeStep))
        pipeline = _Pipeline(mb.module, self.opt_level, cache) if _streaming(tiered, self.opt_level) else None
        with _gc_paused():
            self._ir_text = self._emit_module(mb, native, pipeline)
        self._symbols = mb.symbols
        self._bodies = mb.body_of
        self._nested = {i: [dataclasses.asdict(r) for r in rows] for i, rows in mb.nested_rows.items()}
        self._paths = [mb.paths.get(i, p) for i, p in enumerate(self._paths)]
        self.scratch_bytes: int = mb.scratch_bytes
        """Bytes of per-thread scratch the native code needs (allocated lazily per calling thread)."""
        limits.check_bytes("the program's per-thread scratch", self.scratch_bytes)
        self._emit_ms = mb.emit_ms
        self._timings = {"emit": (time.perf_counter() - t0) * 1e3}
        if any(isinstance(s, NativeStep) for s in self._steps):
            on_part = lambda done, total: self._report("compile", done, total)  # noqa: E731
            self._code = pipeline.finish(on_part) if pipeline is not None else None
            self._code = self._code or jit.cached_object(self._ir_text, self.opt_level, cache)
            if self._code is None:
                parts, quick = _split(self._ir_text), _tiering(tiered, self.opt_level, len(self._ir_text))
                self._code = jit.compile_parts(_split_quick(self._ir_text) if quick else parts, opt=self.opt_level,
                                               cache=cache, quick=quick, on_part=on_part)
                if quick:
                    self._tier_up = _TierUp(weakref.ref(self), parts, self.opt_level, cache)
            self._timings.update({f"quick {k}" if self._code.quick else k: v
                                  for k, v in self._code.timings_ms.items()})
        if cache is not None:
            object_cache.store_plan(cache, self.schedule, self.opt_level, {
                "n_thunks": len(self.schedule.thunks), "paths": RunMap.of(self._paths).runs(),
                "object_key": self._code.key if self._code else "",
                "symbols": self._symbols.runs(), "bodies": self._bodies.runs(),
                "nested": {str(i): rows for i, rows in self._nested.items()},
                "segments": [[s.symbol, s.indices.start, s.indices.stop] for s in self._steps
                             if isinstance(s, NativeStep)],
                "scratch_bytes": self.scratch_bytes}, self._ir_text)
        self._warm = False

    def _emit_module(self, mb: ModuleBuilder, native: int, pipeline: "_Pipeline | None") -> str:
        """Emit every native thunk and segment driver into `mb`; returns the module's IR text."""
        emitted = 0
        for step in self._steps:
            if isinstance(step, NativeStep):
                fns = []
                for i in step.indices:
                    self._report("emit", emitted, native)
                    fns.append(mb.thunk_function(i, self.schedule.thunks[i]))
                    emitted += 1
                    if pipeline is not None and emitted % STREAM_CHECK_EVERY == 0:
                        pipeline.cut()
                if pipeline is not None:
                    pipeline.before_driver()
                mb.driver(step, fns)
        self._report("emit", emitted, native)
        if pipeline is None:
            return custom_ops.link_ir_kernels(mb.module)
        pipeline.end()   # the last parts compile while the collector, back on (`_gc_paused`), catches up
        return pipeline.text()

    def _start_warm(self, meta: dict, cache) -> None:
        """Warm path: the plan and the object come from the cache; emitters are not even imported."""
        self._paths = RunMap.from_runs(meta["paths"])  # per-thunk tables as runs (cache.PLAN_VERSION)
        self._symbols = RunMap.from_runs(meta["symbols"])
        self._bodies = RunMap.from_runs(meta["bodies"])
        self._nested = {int(i): rows for i, rows in meta.get("nested", {}).items()}
        self.scratch_bytes = meta["scratch_bytes"]
        self._emit_ms = {}
        self._code = meta["code"]
        self._source_ir_key = meta["key"]
        self._cache = cache
        segments = {start: NativeStep(sym, range(start, stop)) for sym, start, stop in meta["segments"]}
        steps: list = []
        i = 0
        while i < len(self.schedule.thunks):
            if i in segments:
                steps.append(segments[i])
                i = segments[i].indices.stop
            else:
                t = self.schedule.thunks[i]
                registry.load_all()
                steps.append(FallbackStep(i, t, registry.LOWERINGS[type(t)].run))
                i += 1
        self._steps = steps
        self._timings = {"warm start": 0.0}
        self._warm = True

    @property
    def _ir(self) -> str:
        if self._ir_text is None:
            self._ir_text = self._cache.load_source_ir(self._source_ir_key) or ""
        return self._ir_text

    # ── tiers ──
    @property
    def tier(self) -> int:
        """1 while the quick object runs (its O3 object still being built), else 2."""
        return 1 if self._code is not None and self._code.quick else 2

    def wait_optimized(self, timeout: "float | None" = None) -> bool:
        """Block until the O3 object has replaced the quick one (True), or `timeout` seconds pass
        (False); raises RlxError if building it failed (the quick code keeps running)."""
        job = self._tier_up
        if job is None:
            return True
        job.ran.set()
        if not job.done.wait(timeout):
            return False
        if job.error is not None:
            raise RlxError(f"the background O{self.opt_level} compile failed: {job.error}") from job.error
        return True

    def _swap_in(self, code: "jit.ObjectCode | jit.ObjectSet", ms: float) -> None:
        """Load the O3 object and publish its steps in one assignment: a run reads `_steps` once,
        so it runs wholly on one tier, and its steps keep their engine alive until it returns."""
        steps = self._bound_steps(code)
        self._timings = {**self._timings, **code.timings_ms, "tier-up": ms}
        self._code, self._steps, self._asm = code, steps, None

    # ── running ──
    def run(self, arena: "Arena | np.ndarray") -> None:
        """Execute the schedule on `arena` (an Arena, or a 64-byte-aligned writable uint8 array)."""
        buf, address = _arena_bytes(arena, self.schedule.arena_bytes)
        if not self.scratch_bytes:
            self._run_steps(buf, address, 0)
        elif not _scratch.busy:
            try:
                self._run_steps(buf, address, _scratch.acquire(self.scratch_bytes))
            finally:
                _scratch.busy = False
        else:   # nested in another run on this thread
            own, scratch = _aligned_bytes(self.scratch_bytes)
            self._run_steps(buf, address, scratch)
            del own
        job = self._tier_up
        if job is not None and not job.ran.is_set():
            job.ran.set()   # the O3 build may start now (_Optimizer)

    __call__ = run

    def _run_steps(self, buf: np.ndarray, address: int, scratch: int) -> None:
        for step in self._steps:  # read once: a tier-up swap during the run takes effect at the next
            if isinstance(step, NativeStep):
                status = step.fn(address, scratch)
                if status:
                    index, code = (status >> 32) - 1, status & 0xFFFFFFFF
                    kind = type(self.schedule.thunks[index]).__name__
                    custom = custom_ops.describe_failure(self.schedule.thunks[index], code)
                    if custom:
                        raise ExecutionError(custom[0], index=index, kind=kind, status=code) from custom[1]
                    from .kernels.blas import describe_status   # lazily: it loads SciPy's BLAS
                    raise ExecutionError(f"native kernel failed: {describe_status(code)} (status {code})",
                                         index=index, kind=kind, status=code)
            else:
                try:
                    step.run(buf, step.thunk)
                except ExecutionError:
                    raise
                except Exception as exc:  # a fallback's own failure, located
                    raise ExecutionError(f"{type(exc).__name__}: {exc}", index=step.index,
                                         kind=type(step.thunk).__name__) from exc

    # ── inspection ──
    def report(self) -> Report:
        """Per thunk: index, kind, lowering path, symbol and emit time; plus module timings."""
        rows = []
        for i, t in enumerate(self.schedule.thunks):
            symbol = self._symbols.get(i) or f"<python {type(t).__name__}>"
            rows.append(ThunkReport(i, type(t).__name__, self._paths[i], symbol, round(self._emit_ms.get(i, 0.0), 3),
                                    self._bodies.get(i, "")))

        nested = {i: [ThunkReport(r["index"], r["kind"], r["path"], r["symbol"], 0.0, within=r["within"])
                      for r in rows] for i, rows in self._nested.items()}
        return Report(rows, {k: round(v, 2) for k, v in self._timings.items()},
                      bool(self._warm or (self._code and self._code.from_cache)), nested)

    def llvm_ir(self, optimized: bool = False, thunk: int | None = None) -> str:
        """LLVM IR as emitted (or after O3 with `optimized=True`), whole or for thunk index `thunk`."""
        text = self._code.optimized_ir if optimized and self._code else self._ir
        if thunk is None:
            return text
        return function_ir(text, self._symbol_of(thunk), header=f"; thunk {thunk}: "
                                 f"{self.schedule.thunks[thunk]!r}")

    def asm(self, thunk: int | None = None) -> str:
        """Host assembly of the optimized module, whole or for thunk index `thunk`."""
        if self._code is None:
            return ""
        if self._asm is None:
            self._asm = "\n".join(jit.assembly(part.optimized_ir) for part in self._code.parts)
        if thunk is None:
            return self._asm
        return function_asm(self._asm, self._symbol_of(thunk))

    def _symbol_of(self, thunk: int) -> str:
        n = len(self.schedule.thunks)
        if not isinstance(thunk, int) or isinstance(thunk, bool) or not 0 <= thunk < n:
            raise ValidationError(f"thunk {thunk!r} is out of range: the schedule has {n} thunks"
                                  + (f" (0–{n - 1})" if n else ""))
        if thunk not in self._symbols:
            kind = type(self.schedule.thunks[thunk]).__name__
            raise ValidationError(f"thunk {thunk} ({kind}) has no native function: it runs as a "
                                  f"{self._paths[thunk]} fallback")
        return self._symbols[thunk]

    def __reduce__(self):
        """Pickled as its schedule's JSON, opt level and cache (off, the default one, or a directory):
        unpickling compiles again, which the object cache turns into a warm start (milliseconds) on a
        host that ran it before."""
        try:
            text = self.schedule.to_json()
        except Exception as exc:
            raise TypeError(f"cannot pickle this Program: its schedule has no JSON form ({exc})") from exc
        cache = False if self._cache is None else (
            None if self._cache.directory == object_cache.default_cache_dir() else str(self._cache.directory))
        return _unpickle_program, (text, self.opt_level, cache)

    @property
    def code_bytes(self) -> int:
        """Size of the native object code this program loaded (0 when every thunk is a fallback)."""
        return self._code.nbytes if self._code is not None else 0

    def __repr__(self) -> str:
        n = sum(len(s.indices) for s in self._steps if isinstance(s, NativeStep))
        return f"<Program: {len(self.schedule.thunks)} thunks, {n} native, {self.compile_ms:.0f} ms compile>"


def _unpickle_program(schedule_json: str, opt_level: int, cache) -> Program:
    """`Program.__reduce__`'s inverse: the schedule compiled again (a warm start when cached)."""
    from .schedule import ThunkSchedule
    return compile(ThunkSchedule.from_json(schedule_json), opt_level=opt_level, cache=cache)


@dataclasses.dataclass
class _TierUp:
    """A program's pending O3 build: its IR (in parts), where to store the object, and the outcome."""

    program: "weakref.ref[Program]"
    parts: "Parts | None"
    opt_level: int
    cache: "ObjectCache | None"
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    ran: threading.Event = dataclasses.field(default_factory=threading.Event)   # first run over, or O3 awaited
    error: "Exception | None" = None

    def build(self) -> None:
        """Compile at O`opt_level` (storing the object in the cache) and swap it into the program;
        skipped when the program is gone and there is no cache to fill."""
        try:
            if self.program() is None and self.cache is None:
                return
            t0 = time.perf_counter()
            from .kernels.pool import reserve_core
            with reserve_core():   # the running program's regions leave it a core meanwhile
                code = jit.compile_parts(self.parts, opt=self.opt_level, cache=self.cache)
            program = self.program()
            if program is not None:
                program._swap_in(code, (time.perf_counter() - t0) * 1e3)
        except Exception as exc:  # keep running the quick code; wait_optimized reports it
            self.error = exc
        finally:
            self.parts = None
            self.done.set()


TIER_UP_WAIT_S = 1.0
"""A tier-2 build starts when its program's first run has returned (that run, which a caller waits
for, then has the cores to itself), when `wait_optimized` asks for it, or after this many seconds."""


class _Optimizer:
    """One daemon thread building tier-2 objects in submission order, each once its program's first
    run is over (`TIER_UP_WAIT_S`).  At exit it finishes the builds that fill a cache (so the next
    process starts warm) and drops the rest."""

    def __init__(self) -> None:
        self._jobs: "queue.SimpleQueue[_TierUp]" = queue.SimpleQueue()
        self._thread: "threading.Thread | None" = None
        self._lock = threading.Lock()
        self._exiting = False

    def submit(self, job: _TierUp) -> None:
        """Queue `job`, starting the thread on first use."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="rlx-llvm-tier-up", daemon=True)
                self._thread.start()
                atexit.register(self._finish)
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if self._exiting and job.cache is None:
                job.done.set()
                continue
            self._await_first_run(job)
            job.build()

    def _await_first_run(self, job: _TierUp) -> None:
        """Wait for the job's first run (or TIER_UP_WAIT_S): it would share the cores with the build.
        At exit, do not wait."""
        deadline = time.monotonic() + TIER_UP_WAIT_S
        while not self._exiting and not job.ran.wait(0.05) and time.monotonic() < deadline:
            pass

    def _finish(self) -> None:
        """At exit: no LLVM work may still run when LLVM's static destructors do."""
        self._exiting = True
        self._jobs.put(None)
        self._thread.join()


_optimizer = _Optimizer()


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
