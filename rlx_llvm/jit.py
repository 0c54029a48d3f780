"""The JIT engine: target machine, O3 pipeline, object code and MCJIT loading (the on-disk cache
is `rlx_llvm.cache`).

Every LLVM trap we know of is handled here, where it lives (see docs/architecture.md):

* llvmlite 0.50 raises from `llvm.initialize()`; only the native target/asm printer are set up.
* Invalid IR must never reach the optimizer: the wheel has LLVM assertions on, and a bad
  intrinsic signature aborts the whole process.  `optimize` always verifies first.
* MCJIT links an unresolved external to NULL without a word and the call segfaults (and can break
  other functions of the module), so every declaration is checked against the symbol table
  before any object is loaded.
* An MCJIT engine owns the TargetMachine it is given; reusing it after the engine dies
  segfaults.  Each `Engine` creates its own, and keeps it (and itself) alive as long as the
  Program holding its function pointers.
* Half-precision libcalls (`__extendhfsf2`/`__truncsfhf2`) live in libgcc_s, which is mapped
  RTLD_LOCAL: it is loaded permanently so generic targets resolve them.
* llvmlite 0.50's `ModulePassManager` never frees itself (its MRO picks `ObjectRef._dispose`, a
  no-op, over the pass manager's): ~60 KB per compile.  `_run_pipeline` disposes it by hand, and
  keeps one PassBuilder per thread and level (freeing one leaks ~1.5 KB).
* LLVM contexts are not thread-safe and intern every type and constant for life: each compile
  parses into its own context (`_parsed`), disposed with the module, so compiles on different
  threads (the tiered O3 build, docs/compile.md) never share one and nothing piles up.  Target
  machines are per thread too; engines are created and loaded under one lock.
* llvmlite runs every C call under one process-wide lock, so two compiles would take turns.  The
  calls that do a compile's work (parse, verify, passes, codegen) touch only the module's own
  context and this thread's TargetMachine and PassBuilder, which LLVM allows on several threads at
  once: `_unlocked` calls them without the lock.  That is what lets the parts of a big module
  (`rlx_llvm.partition`) compile in parallel (`compile_parts`).  Printing a module stays under
  the lock: llvmlite's printer sets the process-wide locale to "C" and restores it, and two at
  once can leave the process in "C" (Python then reads files as ASCII).
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import heapq
import itertools
import os
import re
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import llvmlite
import llvmlite.binding as llvm
from llvmlite.binding import ffi
from llvmlite.binding.newpassmanagers import NewPassManager

from .errors import RlxError

if TYPE_CHECKING:
    from .cache import ObjectCache
    from .partition import Parts

_init_lock = threading.Lock()
_initialized = False


def initialize() -> None:
    """Initialize LLVM's native target once per process."""
    global _initialized
    with _init_lock:
        if _initialized:
            return
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        llvm.initialize_native_asmparser()
        with contextlib.suppress(RuntimeError):  # the soname directly: find_library forks ldconfig
            llvm.load_library_permanently("libgcc_s.so.1")
        _initialized = True


@dataclass(frozen=True)
class Host:
    """What we compile for: triple, CPU name, feature string and vector width."""

    triple: str
    cpu: str
    features: str

    @property
    def vector_bits(self) -> int:
        """Widest vector register the host features allow (512, 256 or 128)."""
        feats = set(self.features.split(","))
        if "+avx512f" in feats:
            return 512
        if "+avx2" in feats or "+avx" in feats:
            return 256
        return 128

    def lanes(self, elem_bits: int = 32) -> int:
        """Vector width W in lanes for elements of `elem_bits` bits."""
        return self.vector_bits // elem_bits


_host: Host | None = None


def cache_bytes(level: int, default: int) -> int:
    """The host's per-core data (or unified) cache of `level` (Linux sysfs), or `default` where it cannot be read."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(base)):
            with open(f"{base}/{index}/level") as lv, open(f"{base}/{index}/type") as ty:
                if lv.read().strip() == str(level) and ty.read().strip() in ("Data", "Unified"):
                    with open(f"{base}/{index}/size") as sz:
                        size = sz.read().strip().upper()
                    return int(size[:-1]) << (10 if size.endswith("K") else 20 if size.endswith("M") else 0) \
                        if size[-1] in "KM" else int(size)
    except (OSError, ValueError):
        pass
    return default


def l1d_bytes(default: int = 32 << 10) -> int:
    """The host's L1 data cache per core (Linux sysfs), or `default` where it cannot be read."""
    return cache_bytes(1, default)


def l2_bytes(default: int = 512 << 10) -> int:
    """The host's L2 cache per core (Linux sysfs), or `default` where it cannot be read."""
    return cache_bytes(2, default)


def host() -> Host:
    """The host CPU description (cached)."""
    global _host
    if _host is None:
        initialize()
        _host = Host(llvm.get_process_triple(), llvm.get_host_cpu_name(),
                     llvm.get_host_cpu_features().flatten())
    return _host


def _target_machine(opt: int):
    h = host()
    target = llvm.Target.from_triple(h.triple)
    return target.create_target_machine(cpu=h.cpu, features=h.features, opt=opt,
                                        codemodel="jitdefault", jit=True)


_per_thread = threading.local()


def compile_target_machine(opt: int = 3):
    """This thread's TargetMachine for optimizing and emitting objects at codegen level `opt`
    (never given to an engine, never shared between threads)."""
    machines = getattr(_per_thread, "machines", None)
    if machines is None:
        machines = _per_thread.machines = {}
    if opt not in machines:
        machines[opt] = _target_machine(opt)
        machines[opt].set_asm_verbosity(True)
    return machines[opt]


# ── compiling ────────────────────────────────────────────────────────────────

@dataclass
class ObjectCode:
    """The result of compiling one module: object bytes plus what inspection needs."""

    key: str
    object: bytes
    optimized_ir: str
    externals: list[str]
    timings_ms: dict[str, float] = field(default_factory=dict)
    from_cache: bool = False
    quick: bool = False
    """Compiled by the quick tier (`compile_quick`): never stored in the cache."""

    @property
    def parts(self) -> "list[ObjectCode]":
        """The objects to load: this one."""
        return [self]

    @property
    def nbytes(self) -> int:
        """Bytes of object code."""
        return len(self.object)


@dataclass
class ObjectSet:
    """The objects of one module compiled in parts (`compile_parts`), loaded into one engine; it
    reads like one ObjectCode."""

    parts: list[ObjectCode]
    timings_ms: dict[str, float] = field(default_factory=dict)

    @property
    def key(self) -> list[str]:
        """The parts' cache keys (`ObjectCache.load_all` loads them back)."""
        return [part.key for part in self.parts]

    @property
    def optimized_ir(self) -> str:
        return "\n".join(part.optimized_ir for part in self.parts)

    @property
    def externals(self) -> list[str]:
        return sorted({name for part in self.parts for name in part.externals})

    @property
    def from_cache(self) -> bool:
        return all(part.from_cache for part in self.parts)

    @property
    def quick(self) -> bool:
        return any(part.quick for part in self.parts)

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.parts)


def _remarks_enabled() -> bool:
    return os.environ.get("RLX_LLVM_REMARKS", "") not in ("", "0")


_remarks_set = False


def _enable_remarks() -> None:
    # LLVM prints these to stderr at C level; set once, before any pass runs.
    global _remarks_set
    if not _remarks_set:
        llvm.set_option("", "-pass-remarks=loop-vectorize|slp-vectorizer")
        llvm.set_option("", "-pass-remarks-missed=loop-vectorize|slp-vectorizer")
        llvm.set_option("", "-pass-remarks-analysis=loop-vectorize")
        _remarks_set = True


# ── LLVM calls without llvmlite's lock (see the top) ──

def _unlocked(name: str):
    """The C function behind llvmlite's locked wrapper of `name` (the wrapper, should that change)."""
    fn = getattr(ffi.lib, name)
    return getattr(fn, "_cfn", fn)


def _parse_private(ir_text: str, context):
    """`ir_text` parsed into `context`, which no other thread uses, and verified (raises RlxError)."""
    with ffi.OutputString() as err:
        mod = llvm.ModuleRef(_unlocked("LLVMPY_ParseAssembly")(context, ctypes.c_char_p(ir_text.encode()), err),
                             context)
        problem = f"LLVM IR parsing error\n{err}" if err else None
    if problem is None:
        with ffi.OutputString() as err:
            if _unlocked("LLVMPY_VerifyModule")(mod, err):
                problem = str(err)
    if problem is not None:
        mod.close()
        raise RlxError(f"generated LLVM IR is invalid (a bug in an emitter): {problem}")
    return mod


def _emit_object(machine, mod) -> bytes:
    """Object code of `mod` from this thread's `machine`."""
    with ffi.OutputString() as err:
        buf = _unlocked("LLVMPY_TargetMachineEmitToMemory")(machine, mod, 1, err)
        if not buf:
            raise RlxError(f"LLVM could not emit object code: {err}")
    try:
        return ctypes.string_at(ffi.lib.LLVMPY_GetBufferStart(buf), ffi.lib.LLVMPY_GetBufferSize(buf))
    finally:
        ffi.lib.LLVMPY_DisposeMemoryBuffer(buf)


def parse_and_verify(ir_text: str, context=None):
    """Parse textual IR (into `context`, default the global one) and verify it (raises RlxError;
    never lets bad IR reach the optimizer)."""
    initialize()
    mod = None
    try:
        mod = llvm.parse_assembly(ir_text, context)
        mod.verify()
    except RuntimeError as exc:
        if mod is not None:
            mod.close()  # before its context goes: a module outliving its context crashes on collection
        raise RlxError(f"generated LLVM IR is invalid (a bug in an emitter): {exc}") from exc
    return mod


@contextlib.contextmanager
def _parsed(ir_text: str):
    """The verified module of `ir_text` in a context of its own; both disposed on exit."""
    initialize()
    context = llvm.create_context()
    try:
        mod = _parse_private(ir_text, context)
        try:
            yield mod
        finally:
            mod.close()
    finally:
        context.close()


# Callables that register runtime symbols with LLVM (libgomp, BLAS/LAPACK capsules, …), cheapest
# first; `missing_symbols` runs them only while something is still unresolved.
SYMBOL_PROVIDERS: list[Callable[[], None]] = []


def forget_symbol(name: str) -> None:
    """`name` was re-bound to NULL (a retired CustomOp kernel): look it up afresh next time, so a
    warm start that would call it misses the cache instead of loading a call to NULL."""
    _resolved.discard(name)


def missing_symbols(names: "list[str] | tuple[str, ...]") -> list[str]:
    """The names the process cannot provide, after every symbol provider has had its chance.

    The one externals check: MCJIT links an unresolved external to NULL without a word, so no
    object is loaded until this returns an empty list.
    """
    initialize()

    def missing() -> list[str]:
        left = []
        for name in names:
            if name not in _resolved:
                if llvm.address_of_symbol(name):
                    _resolved.add(name)
                else:
                    left.append(name)
        return left

    left = missing()
    if left and not SYMBOL_PROVIDERS:
        from . import program  # noqa: F401  (it installs the providers; `import rlx_llvm` no longer does)
    for provide in SYMBOL_PROVIDERS:
        if not left:
            break
        provide()
        left = missing()
    return left


_resolved: set[str] = set()
"""Symbols found once (libraries stay loaded; a retired CustomOp kernel is `forget_symbol`-ed): not looked up again, so a
compile thread does not wait for the GIL once per external."""


def _refuse_unresolved(names: list[str]) -> None:
    missing = missing_symbols(names)
    if missing:
        raise RlxError(f"unresolved external symbols {missing}: refusing to load code that would call NULL")


_DECLARED_FUNCTION = re.compile(r'^declare [^@\n]*@("[^"]*"|[-\w$.]+)\(', re.M)
_DECLARED_GLOBAL = re.compile(r'^@("[^"]*"|[-\w$.]+) = (?:external|extern_weak) ', re.M)


def _declared_externals(ir_text: str) -> list[str]:
    """Every external symbol the module of `ir_text` uses: function declarations and external
    globals (read from the text: walking a module's functions costs a GIL hand-over per call on a
    compile thread while Python code runs)."""
    names = [n.strip('"') for n in _DECLARED_FUNCTION.findall(ir_text)]
    names = [n for n in names if not n.startswith("llvm.")] + \
        [n.strip('"') for n in _DECLARED_GLOBAL.findall(ir_text)]
    return sorted(names)


def optimize(mod, opt: int = 3) -> None:
    """Run the new-pass-manager O`opt` pipeline for the host CPU on a verified module."""
    if _remarks_enabled():
        _enable_remarks()
    _run_pipeline(mod, opt, lambda pb: pb.getModulePassManager())


def _quick_passes(mod) -> None:
    """The quick tier's only IR pass: SROA (allocas → registers), which codegen would otherwise
    spill; no reassociation, so contraction is left to codegen exactly as at O3."""
    def passes(_pb):
        mpm = llvm.create_new_module_pass_manager()
        mpm.add_sroa_pass()
        return mpm
    _run_pipeline(mod, 0, passes)


def _pass_builder(opt: int):
    """This thread's PassBuilder for O`opt`, made once: llvmlite's leaks ~1.5 KB when freed."""
    builders = getattr(_per_thread, "pass_builders", None)
    if builders is None:
        builders = _per_thread.pass_builders = {}
    if opt not in builders:
        pto = llvm.create_pipeline_tuning_options(speed_level=opt)
        pto.loop_vectorization = opt >= 2
        pto.slp_vectorization = opt >= 2
        builders[opt] = llvm.create_pass_builder(compile_target_machine(), pto)
    return builders[opt]


def _run_pipeline(mod, opt: int, make_passes: Callable) -> None:
    """Run the module pass manager `make_passes(pass_builder)` on `mod`, then free it (see top)."""
    pb = _pass_builder(opt)
    mpm = make_passes(pb)
    try:
        _unlocked("LLVMPY_RunNewModulePassManager")(mpm, mod, pb)
    finally:
        NewPassManager._dispose(mpm)
        mpm.detach()


def cache_key(ir_text: str, opt: int) -> str:
    """sha256 of everything that decides the object code."""
    h = host()
    parts = [ir_text, llvmlite.__version__, llvm.llvm_version_info.__repr__(), h.triple, h.cpu,
             h.features, f"O{opt}", "rlx-llvm-object-v1"]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def compile_ir(ir_text: str, *, opt: int = 3, cache: "ObjectCache | None" = None,
               provided: "frozenset[str]" = frozenset()) -> ObjectCode:
    """IR text → verified, optimized object code (from `cache` when it has it).  `provided`: the
    functions other parts of the same module define (`compile_parts`), not externals to resolve."""
    hit = cached_object(ir_text, opt, cache)
    if hit is not None:
        return hit
    code = _compile(ir_text, cache_key(ir_text, opt), lambda mod: optimize(mod, opt), 3, provided)
    if cache is not None:
        cache.store(code)
    return code


def cached_object(ir_text: str, opt: int, cache: "ObjectCache | None") -> ObjectCode | None:
    """The O`opt` object of `ir_text` from `cache`, if it is there and its externals resolve."""
    if cache is None:
        return None
    hit = cache.load(cache_key(ir_text, opt))
    return hit if hit is not None and not missing_symbols(hit.externals) else None


def compile_quick(ir_text: str, *, opt: int = 3, provided: "frozenset[str]" = frozenset(),
                  borrow: bool = True) -> ObjectCode:
    """IR text → object code in a fraction of `compile_ir`'s time (SROA, then SelectionDAG codegen
    at -O1, which still fuses `contract` multiply-adds as -O3 does); the first tier of tiered
    compilation.  Its `key` is the O`opt` key of the same IR; it is never cached.  With `borrow`,
    the GEMM tiles and packers come from the process's kernel library (`kernel_library`), compiled
    once for every module."""
    key = cache_key(ir_text, opt)
    if borrow:
        from . import kernel_library
        ir_text = kernel_library.borrow(ir_text, compile_quick)
    code = _compile(ir_text, key, _quick_passes, 1, provided)
    code.quick = True
    return code


def _compile(ir_text: str, key: str, passes: Callable, codegen_opt: int,
             provided: "frozenset[str]" = frozenset()) -> ObjectCode:
    """Parse and verify, refuse unresolved externals (but those in `provided`), run `passes`, emit
    an object."""
    t0 = time.perf_counter()
    with _parsed(ir_text) as mod:
        t1 = time.perf_counter()
        externals = [name for name in _declared_externals(ir_text) if name not in provided]
        _refuse_unresolved(externals)
        passes(mod)
        t2 = time.perf_counter()
        obj = _emit_object(compile_target_machine(codegen_opt), mod)
        t3 = time.perf_counter()
        optimized_ir = str(mod)   # under llvmlite's lock: its printer switches the process locale to "C" and back
    return ObjectCode(key, obj, optimized_ir, externals,
                      {"parse_verify": (t1 - t0) * 1e3, "optimize": (t2 - t1) * 1e3,
                       "codegen": (t3 - t2) * 1e3})


PROGRESS_TICK_S = 0.5
"""`compile_parts` reports progress at least this often while parts compile."""


def compile_parts(parts: "Parts", *, opt: int = 3, cache: "ObjectCache | None" = None, quick: bool = False,
                  on_part: "Callable[[int, int], None] | None" = None) -> "ObjectCode | ObjectSet":
    """Compile the parts of a split module (`rlx_llvm.partition.split`) at once on the compile
    threads — `compile_ir` each (from `cache` when it has it), or `compile_quick` — and return one
    loadable result.  `on_part(done, total)` runs on this thread as parts finish and at least every
    PROGRESS_TICK_S seconds."""
    if len(parts.texts) == 1 and on_part is None:
        return _compile_part(parts.texts[0], parts.defined, opt, cache, quick)
    t0 = time.perf_counter()
    jobs = [submit_part(text, parts.defined, opt=opt, cache=cache, quick=quick) for text in parts.texts]
    return gather(jobs, t0, on_part)


def _compile_part(text: str, provided: "frozenset[str]", opt: int, cache: "ObjectCache | None",
                  quick: bool) -> ObjectCode:
    if quick:
        return compile_quick(text, opt=opt, provided=provided)
    return compile_ir(text, opt=opt, cache=cache, provided=provided)


def submit_part(text: str, provided: "frozenset[str]", *, opt: int = 3, cache: "ObjectCache | None" = None,
                quick: bool = False) -> "futures.Future[ObjectCode]":
    """Queue one part of a module for the compile threads (as `compile_parts` does), which take the
    largest waiting part first; `provided`: the functions other parts define for it."""
    from .kernels import pool
    job: "futures.Future[ObjectCode]" = futures.Future()
    with _waiting_lock:
        heapq.heappush(_waiting, (-len(text), next(_submitted), job, (text, provided, opt, cache, quick)))
    _compile_threads(pool.get_threads()).submit(_compile_largest_waiting)
    return job


_waiting_lock = threading.Lock()
_waiting: list = []   # heap of (−IR characters, submission number, job, `_compile_part`'s arguments)
_submitted = itertools.count()


def _compile_largest_waiting() -> None:
    """On a compile thread: compile the largest part still waiting (each `submit_part` queues one
    such call).  Largest first, so the last part of a streamed module — with the segment drivers,
    the largest — does not wait behind smaller parts submitted earlier, and the threads finish
    together (longest-processing-time-first scheduling)."""
    with _waiting_lock:
        _, _, job, args = heapq.heappop(_waiting)
    if not job.set_running_or_notify_cancel():
        return
    try:
        job.set_result(_compile_part(*args))
    except BaseException as exc:   # noqa: BLE001  (handed to whoever waits for the job, as an executor does)
        job.set_exception(exc)


def gather(jobs: "list[futures.Future[ObjectCode]]", t0: float,
           on_part: "Callable[[int, int], None] | None" = None) -> "ObjectCode | ObjectSet":
    """The parts compiled by `jobs`, as one loadable result (`on_part` as in `compile_parts`; `t0`:
    when the first was submitted)."""
    total = len(jobs)
    pending = set(jobs)
    while pending:
        if on_part is not None:
            on_part(total - len(pending), total)
        _, pending = futures.wait(pending, PROGRESS_TICK_S, futures.FIRST_COMPLETED)
    if on_part is not None:
        on_part(total, total)
    codes = [job.result() for job in jobs]
    if total == 1:
        return codes[0]
    timings = {phase: sum(code.timings_ms.get(phase, 0.0) for code in codes)
               for phase in ("parse_verify", "optimize", "codegen")}
    return ObjectSet(codes, {**timings, f"compile ({total} parts at once)": (time.perf_counter() - t0) * 1e3})


_threads_lock = threading.Lock()
_threads: "futures.ThreadPoolExecutor | None" = None
_threads_size = 0


def _compile_threads(n: int) -> futures.ThreadPoolExecutor:
    """At least `n` compile threads, kept between compiles (each keeps its TargetMachines and
    PassBuilders); Python joins them at exit, so no LLVM work outlives the interpreter."""
    global _threads, _threads_size
    with _threads_lock:
        if _threads is None or _threads_size < n:
            if _threads is not None:
                _threads.shutdown(wait=False)
            _threads, _threads_size = futures.ThreadPoolExecutor(n, thread_name_prefix="rlx-llvm-compile"), n
        return _threads


def _forget_compile_threads() -> None:
    """In a forked child: the parent's compile threads do not exist there."""
    global _threads, _threads_lock, _waiting, _waiting_lock
    _threads, _threads_lock = None, threading.Lock()
    _waiting, _waiting_lock = [], threading.Lock()


os.register_at_fork(after_in_child=_forget_compile_threads)


def assembly(optimized_ir: str) -> str:
    """Host assembly (AT&T syntax, with loop comments) of optimized IR text."""
    with _parsed(optimized_ir) as mod:
        return compile_target_machine().emit_assembly(mod)


# ── loading ──────────────────────────────────────────────────────────────────

_engine_lock = threading.Lock()  # engines live in the global context: create and load one at a time


class Engine:
    """One MCJIT engine with its own TargetMachine; holds the loaded code alive."""

    def __init__(self) -> None:
        initialize()
        with _engine_lock:
            self._tm = _target_machine(3)  # owned by the engine from here on: never reuse it
            self._ee = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self._tm)

    def load(self, code: "ObjectCode | ObjectSet") -> None:
        """Add the object file(s) and finalize them together, resolving calls between them
        (refusing code whose externals would link to NULL)."""
        _refuse_unresolved(code.externals)
        with _engine_lock:
            for part in code.parts:
                self._ee.add_object_file(llvm.ObjectFileRef.from_data(part.object))
            self._ee.finalize_object()

    def address(self, name: str) -> int:
        """Address of a loaded function (raises instead of returning NULL)."""
        addr = self._ee.get_function_address(name)
        if not addr:
            raise RlxError(f"symbol {name!r} is not in the loaded object")
        return addr
