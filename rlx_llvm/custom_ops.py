"""The registry of `CustomOp` kernels: user code that a schedule names by a string (docs/custom-ops.md).

Every kernel, whatever it is written in, has one C ABI:

    int32_t kernel(const float *const *inputs, const int64_t *lens, int32_t n_inputs,
                   float *out, int64_t out_len, const uint8_t *attrs, int64_t n_attrs);

returning 0, or a non-zero status that `Program.run` raises as an `ExecutionError` naming the op.
A kernel is one of

* **LLVM IR text** defining `@<name>` with that signature: linked into the program module as a
  private function (`rlx.custom.llvm.<sha>.<name>`), where the optimizer may inline it;
* a **C function pointer** (a ctypes function, a numba `@cfunc`, or a raw address): called through
  the external symbol `rlx.custom.c.<name>`;
* a **Python callable** `fn(inputs: list[np.ndarray], out: np.ndarray, attrs: bytes) -> int | None`
  on flat f32 views: wrapped in a ctypes callback (`rlx.custom.python.<name>`) that takes the GIL —
  the slow path that always works; `Program.report()` shows its path as "python".

Warm starts (`rlx_llvm.cache`) never call a stale kernel: every symbol a compiled object needs is
resolvable only while its kernel is registered in this process (`llvm.add_symbol`, reset to NULL
when the kernel is replaced or unregistered), and an IR kernel's object reads a marker symbol named
after its text's hash, so a warm start with other IR under the same name misses the cache.
"""
from __future__ import annotations

import ctypes
import hashlib
import re
import threading
from dataclasses import dataclass
from typing import Callable

import llvmlite.binding as llvm
import numpy as np

from . import jit
from .errors import ExecutionError, RlxError, UnsupportedThunkError, ValidationError

KERNEL = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64),
                          ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_uint8),
                          ctypes.c_int64)
"""The kernel ABI as a ctypes prototype (use it to build C kernels from Python)."""
SIGNATURE = "i32 (ptr, ptr, i32, ptr, i64, ptr, i64)"
"""The kernel ABI as an LLVM function type."""
PREFIX = "rlx.custom."
FAILED = 0x43
"""Low byte of a CustomOp thunk's status when its kernel failed; the kernel's own status is above it."""
PYTHON_EXCEPTION = -0x7FFF
"""The kernel status of a Python kernel that raised (the exception is kept for the ExecutionError)."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")


@dataclass(frozen=True)
class CustomKernel:
    """One registered kernel: its name, kind ("llvm", "c" or "python") and the symbols code links to."""

    name: str
    kind: str
    symbol: str                      # what the thunk calls: an external symbol, or the IR function's name
    check: Callable | None = None    # `check(thunk)` → raise ValidationError for operands it cannot take
    ir: str | None = None            # the IR text of an "llvm" kernel
    address: int = 0                 # the entry point of a "c"/"python" kernel
    keep: object = None              # what keeps `address` alive (ctypes callback, numba cfunc)

    @property
    def marker(self) -> str:
        """The external symbol an IR kernel's object reads: resolvable only while this text is registered."""
        return f"{self.symbol}.registered"


_lock = threading.Lock()
_kernels: dict[str, CustomKernel] = {}
_by_symbol: dict[str, CustomKernel] = {}
_retired: list[CustomKernel] = []     # replaced kernels stay alive: programs compiled before still call them
_marker_byte = ctypes.c_uint8(1)
_failure = threading.local()
_compiled_ir: dict[str, tuple[object, int]] = {}  # symbol → (engine, address): IR kernels run by the reference


def register_custom_op(name: str, kernel: "str | Callable | int", *, check: Callable | None = None,
                       replace: bool = False) -> CustomKernel:
    """Register `kernel` (IR text, a C function pointer, or a Python callable) as `CustomOp` `name`."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"custom op name must match {_NAME.pattern}, got {name!r}")
    if check is not None and not callable(check):
        raise TypeError(f"check must be callable, got {check!r}")
    entry = _make(name, kernel, check)
    with _lock:
        if name in _kernels and not replace:
            raise ValueError(f"custom op {name!r} is already registered (pass replace=True to replace it)")
        if name in _kernels:
            _retire(_kernels.pop(name))
        _kernels[name], _by_symbol[entry.symbol] = entry, entry
        llvm.add_symbol(entry.marker if entry.kind == "llvm" else entry.symbol,
                        ctypes.addressof(_marker_byte) if entry.kind == "llvm" else entry.address)
    return entry


def unregister_custom_op(name: str) -> None:
    """Remove `name` from the registry (KeyError if absent); compiled programs keep their kernel."""
    with _lock:
        _retire(_kernels.pop(name))


def registered_custom_ops() -> list[str]:
    """The registered names, sorted."""
    return sorted(_kernels)


def lookup(name: str) -> CustomKernel:
    """The kernel registered as `name`, or an UnsupportedThunkError listing the registered names."""
    kernel = _kernels.get(name)
    if kernel is None:
        raise UnregisteredCustomOp(name, registered_custom_ops())
    return kernel


class UnregisteredCustomOp(UnsupportedThunkError):
    """A CustomOp names a kernel that is not registered."""

    def __init__(self, name: str, registered: list[str]) -> None:
        self.missing, self.name, self.registered = [], name, registered
        RlxError.__init__(self, f"CustomOp kernel {name!r} is not registered (registered: "
                                f"{', '.join(map(repr, registered)) or 'none'}); see rlx_llvm.register_custom_op")


def _retire(entry: CustomKernel) -> None:
    """Make `entry`'s symbols unresolvable (warm starts miss) while keeping its code alive."""
    name = entry.marker if entry.kind == "llvm" else entry.symbol
    llvm.add_symbol(name, 0)
    jit.forget_symbol(name)
    _retired.append(entry)


def _make(name: str, kernel, check) -> CustomKernel:
    """The registry entry of one kernel, by what `kernel` is."""
    if isinstance(kernel, str):
        return _ir_kernel(name, kernel, check)
    if isinstance(kernel, ctypes._CFuncPtr):
        return CustomKernel(name, "c", f"{PREFIX}c.{name}", check,
                            address=_nonzero(ctypes.cast(kernel, ctypes.c_void_p).value, name), keep=kernel)
    if isinstance(getattr(kernel, "address", None), int):   # a numba @cfunc
        return CustomKernel(name, "c", f"{PREFIX}c.{name}", check, address=_nonzero(kernel.address, name), keep=kernel)
    if isinstance(kernel, int) and not isinstance(kernel, bool):
        return CustomKernel(name, "c", f"{PREFIX}c.{name}", check, address=_nonzero(kernel, name))
    if callable(kernel):
        callback = KERNEL(_python_entry(name, kernel))
        return CustomKernel(name, "python", f"{PREFIX}python.{name}", check,
                            address=ctypes.cast(callback, ctypes.c_void_p).value, keep=(kernel, callback))
    raise TypeError(f"custom op {name!r}: a kernel is IR text, a C function pointer or a callable, "
                    f"not {type(kernel).__name__}")


def _nonzero(address: int | None, name: str) -> int:
    if not address:
        raise ValueError(f"custom op {name!r}: NULL function pointer")
    return address


def _ir_kernel(name: str, text: str, check) -> CustomKernel:
    """Parse and verify IR text at registration: it must define `@name` with the kernel signature."""
    jit.initialize()
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as exc:
        raise ValueError(f"custom op {name!r}: invalid LLVM IR: {exc}") from None
    fn = next((f for f in mod.functions if f.name == name and not f.is_declaration), None)
    if fn is None:
        raise ValueError(f"custom op {name!r}: the IR defines no function @{name}")
    if str(fn.global_value_type) != SIGNATURE:
        raise ValueError(f"custom op {name!r}: @{name} has type {fn.global_value_type}, expected {SIGNATURE}")
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return CustomKernel(name, "llvm", f"{PREFIX}llvm.{digest}.{name}", check, ir=text)


# ── Python kernels ───────────────────────────────────────────────────────────

def _f32_view(address: int, count: int) -> np.ndarray:
    if count == 0:
        return np.empty(0, np.float32)
    return np.ctypeslib.as_array(ctypes.cast(address, ctypes.POINTER(ctypes.c_float)), (count,))


def _python_entry(name: str, fn: Callable) -> Callable:
    """The C-ABI entry point of a Python kernel: flat views in, exceptions kept for `describe_failure`."""
    def entry(inputs, lens, n_inputs, out, out_len, attrs, n_attrs) -> int:
        try:
            views = []
            for i in range(n_inputs):
                view = _f32_view(inputs[i], lens[i])
                view.flags.writeable = False
                views.append(view)
            status = fn(views, _f32_view(out, out_len), bytes(attrs[:n_attrs]))
            return 0 if status is None else int(status)
        except BaseException as exc:  # noqa: BLE001 — never let an exception unwind through native code
            _failure.last = (name, exc)
            return PYTHON_EXCEPTION
    return entry


# ── failures ─────────────────────────────────────────────────────────────────

def thunk_status(kernel_status: int) -> int:
    """The thunk status of a failed kernel: `FAILED | kernel_status << 8` as a u32."""
    return (FAILED | (kernel_status << 8)) & 0xFFFFFFFF


def describe_failure(thunk, status: int) -> "tuple[str, BaseException | None] | None":
    """(message, cause) of a CustomOp failure status, or None when `status` is not one."""
    if status & 0xFF != FAILED:
        return None
    kernel_status = (status >> 8) - (1 << 24) if status >> 31 else status >> 8
    name = getattr(thunk, "kernel", None)
    what = f"custom op {name!r}" if isinstance(name, str) else "a custom op"
    if kernel_status == PYTHON_EXCEPTION:
        failed, exc = getattr(_failure, "last", (name, None))
        _failure.last = (None, None)
        if exc is not None:
            return f"custom op {failed!r} raised {type(exc).__name__}: {exc}", exc
    return f"{what} returned status {kernel_status}", None


# ── running and linking ──────────────────────────────────────────────────────

def entry_address(kernel: CustomKernel) -> int:
    """The callable entry point of `kernel` (an IR kernel is compiled on its own on first use)."""
    if kernel.kind != "llvm":
        return kernel.address
    with _lock:
        if kernel.symbol not in _compiled_ir:
            engine = jit.Engine()
            engine.load(jit.compile_ir(kernel.ir, cache=None))
            _compiled_ir[kernel.symbol] = (engine, engine.address(kernel.name))
        return _compiled_ir[kernel.symbol][1]


def call(kernel: CustomKernel, inputs: list[np.ndarray], out: np.ndarray, attrs: bytes) -> int:
    """Run `kernel` on f32 arrays through its C ABI; returns its status."""
    ptrs = (ctypes.c_void_p * max(len(inputs), 1))(*[a.ctypes.data for a in inputs])
    lens = (ctypes.c_int64 * max(len(inputs), 1))(*[a.size for a in inputs])
    raw = (ctypes.c_uint8 * max(len(attrs), 1))(*attrs)
    fn = KERNEL(entry_address(kernel))
    return fn(ptrs, lens, len(inputs), out.ctypes.data, out.size, raw, len(attrs))


def link_ir_kernels(module) -> str:
    """The text of program `module` (an `llvmlite.ir.Module`) with the IR kernels it declares linked
    in as internal functions, where the optimizer may inline them."""
    program_text = str(module)
    symbols = [f.name for f in module.functions if f.is_declaration and f.name.startswith(f"{PREFIX}llvm.")]
    if not symbols:
        return program_text
    dst = llvm.parse_assembly(program_text)
    for symbol in symbols:
        src = llvm.parse_assembly(_by_symbol[symbol].ir)
        src.triple, src.data_layout = dst.triple, dst.data_layout
        for fn in src.functions:
            if not fn.is_declaration:
                fn.linkage = "internal"
        for g in src.global_variables:
            if not g.is_declaration:
                g.linkage = "internal"
        kernel = src.get_function(_by_symbol[symbol].name)
        kernel.name, kernel.linkage = symbol, "external"
        dst.link_in(src)
        dst.get_function(symbol).linkage = "internal"
    return str(dst)
