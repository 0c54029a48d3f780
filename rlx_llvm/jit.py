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
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import llvmlite
import llvmlite.binding as llvm

from .errors import RlxError

if TYPE_CHECKING:
    from .cache import ObjectCache

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


def l1d_bytes(default: int = 32 << 10) -> int:
    """The host's L1 data cache per core (Linux sysfs), or `default` where it cannot be read."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(base)):
            with open(f"{base}/{index}/level") as lv, open(f"{base}/{index}/type") as ty:
                if lv.read().strip() == "1" and ty.read().strip() == "Data":
                    with open(f"{base}/{index}/size") as sz:
                        size = sz.read().strip().upper()
                    return int(size[:-1]) << (10 if size.endswith("K") else 20 if size.endswith("M") else 0) \
                        if size[-1] in "KM" else int(size)
    except (OSError, ValueError):
        pass
    return default


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


_compile_tm = None
_compile_tm_lock = threading.Lock()


def compile_target_machine():
    """The TargetMachine used for optimizing and emitting objects (never given to an engine)."""
    global _compile_tm
    with _compile_tm_lock:
        if _compile_tm is None:
            _compile_tm = _target_machine(3)
            _compile_tm.set_asm_verbosity(True)
        return _compile_tm


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


def parse_and_verify(ir_text: str):
    """Parse textual IR and verify it (raises RlxError; never lets bad IR reach the optimizer)."""
    initialize()
    try:
        mod = llvm.parse_assembly(ir_text)
        mod.verify()
    except RuntimeError as exc:
        raise RlxError(f"generated LLVM IR is invalid (a bug in an emitter): {exc}") from exc
    return mod


# Callables that register runtime symbols with LLVM (libgomp, BLAS/LAPACK capsules, …), cheapest
# first; `missing_symbols` runs them only while something is still unresolved.
SYMBOL_PROVIDERS: list[Callable[[], None]] = []


def missing_symbols(names: "list[str] | tuple[str, ...]") -> list[str]:
    """The names the process cannot provide, after every symbol provider has had its chance.

    The one externals check: MCJIT links an unresolved external to NULL without a word, so no
    object is loaded until this returns an empty list.
    """
    initialize()

    def missing() -> list[str]:
        return [name for name in names if not llvm.address_of_symbol(name)]

    left = missing()
    for provide in SYMBOL_PROVIDERS:
        if not left:
            break
        provide()
        left = missing()
    return left


def _refuse_unresolved(names: list[str]) -> None:
    missing = missing_symbols(names)
    if missing:
        raise RlxError(f"unresolved external symbols {missing}: refusing to load code that would call NULL")


def _declared_externals(mod) -> list[str]:
    """Every external symbol the module uses: function declarations and external globals."""
    names = [fn.name for fn in mod.functions if fn.is_declaration and not fn.name.startswith("llvm.")]
    names += [g.name for g in mod.global_variables if g.is_declaration]
    return sorted(names)


def optimize(mod, opt: int = 3) -> None:
    """Run the new-pass-manager O`opt` pipeline for the host CPU on a verified module."""
    if _remarks_enabled():
        _enable_remarks()
    tm = compile_target_machine()
    pto = llvm.create_pipeline_tuning_options(speed_level=opt)
    pto.loop_vectorization = opt >= 2
    pto.slp_vectorization = opt >= 2
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


def cache_key(ir_text: str, opt: int) -> str:
    """sha256 of everything that decides the object code."""
    h = host()
    parts = [ir_text, llvmlite.__version__, llvm.llvm_version_info.__repr__(), h.triple, h.cpu,
             h.features, f"O{opt}", "rlx-llvm-object-v1"]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def compile_ir(ir_text: str, *, opt: int = 3, cache: "ObjectCache | None" = None) -> ObjectCode:
    """IR text → verified, optimized object code (from `cache` when it has it)."""
    key = cache_key(ir_text, opt)
    if cache is not None:
        hit = cache.load(key)
        if hit is not None and not missing_symbols(hit.externals):
            return hit
    t0 = time.perf_counter()
    mod = parse_and_verify(ir_text)
    t1 = time.perf_counter()
    _refuse_unresolved(_declared_externals(mod))
    optimize(mod, opt)
    t2 = time.perf_counter()
    tm = compile_target_machine()
    obj = tm.emit_object(mod)
    t3 = time.perf_counter()
    code = ObjectCode(key, obj, str(mod), _declared_externals(mod),
                      {"parse_verify": (t1 - t0) * 1e3, "optimize": (t2 - t1) * 1e3,
                       "codegen": (t3 - t2) * 1e3})
    if cache is not None:
        cache.store(code)
    return code


def assembly(optimized_ir: str) -> str:
    """Host assembly (AT&T syntax, with loop comments) of optimized IR text."""
    mod = parse_and_verify(optimized_ir)
    return compile_target_machine().emit_assembly(mod)


# ── loading ──────────────────────────────────────────────────────────────────

class Engine:
    """One MCJIT engine with its own TargetMachine; holds the loaded code alive."""

    def __init__(self) -> None:
        initialize()
        self._tm = _target_machine(3)  # owned by the engine from here on: never reuse it
        self._ee = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self._tm)

    def load(self, code: ObjectCode) -> None:
        """Add an object file and finalize it (refusing one whose externals would link to NULL)."""
        _refuse_unresolved(code.externals)
        self._ee.add_object_file(llvm.ObjectFileRef.from_data(code.object))
        self._ee.finalize_object()

    def address(self, name: str) -> int:
        """Address of a loaded function (raises instead of returning NULL)."""
        addr = self._ee.get_function_address(name)
        if not addr:
            raise RlxError(f"symbol {name!r} is not in the loaded object")
        return addr
