"""BLAS/LAPACK symbol table: SciPy's Cython capsules registered with LLVM under our own prefix.

Every routine comes from `scipy.linalg.cython_blas` / `cython_lapack` (`__pyx_capi__[name]`, a
PyCapsule whose name is the C signature); its function pointer is registered with
`llvm.add_symbol("rlx_<name>", ptr)`, so JIT code calls SciPy's bundled OpenBLAS (LP64: `int` is
32-bit) directly — no Python in between, no clash with any other BLAS in the process.

The routines the lowerings use (`REQUIRED`) are resolved when this module is imported: a missing
one raises `RlxError` at import time, never at run time.  Any other routine is resolved when an
emitter first declares it, i.e. at compile time.

Fortran ABI: every argument is a pointer (no hidden string lengths in SciPy's wrappers).  Emitters
call the routines through `ir_emit.blas_calls.FortranArgs` (this module emits no IR).
"""
from __future__ import annotations

import ctypes
import enum
import re
import threading

import llvmlite.binding as llvm
from llvmlite import ir

from ..errors import RlxError

PREFIX = "rlx_"
REQUIRED = ("sgemm", "dgemm", "cgemm", "sgesv", "dgesv", "dpotrf", "dtrsm", "dgetrf")
BLAS_INT_MAX = 2**31 - 1  # SciPy's capsules are LP64: every dim and leading dim is a 32-bit int


class Status(enum.IntEnum):
    """Reasons a BLAS/LAPACK lowering fails at run time: the low byte of the thunk's status.

    Batched thunks put the failing slice in the bits above (`status >> 8`); see `describe_status`.
    """

    SINGULAR = 1               # ?gesv / ?getrf: U(i,i) is exactly zero
    NOT_POSITIVE_DEFINITE = 2  # ?potrf: a leading minor is not positive definite
    LAPACK_ARGUMENT = 3        # LAPACK rejected an argument (info < 0): a bug in a lowering
    INDEX_OUT_OF_RANGE = 4     # a data-dependent index (expert id, codebook code) is out of range


def describe_status(status: int) -> str:
    """Human-readable meaning of a native thunk's failure status (BLAS/LAPACK, or an index check)."""
    reason, where = status & 0xFF, status >> 8
    try:
        text = Status(reason).name.lower().replace("_", " ")
    except ValueError:
        return f"unknown status {status}"
    if reason == Status.INDEX_OUT_OF_RANGE:   # grouped kinds: `(row + 1) << 8` names the first bad row
        return f"{text} (expert id of row {where - 1})" if where else text
    return f"{text} (batch slice {where})" if where else text


_api = ctypes.pythonapi
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class Routine:
    """One resolved BLAS/LAPACK routine: its address, C signature and LLVM symbol."""

    def __init__(self, name: str, capsule: object, library: str) -> None:
        self.name, self.library = name, library
        self.capsule = capsule  # kept alive: the pointer belongs to the module the capsule came from
        self.signature: str = _api.PyCapsule_GetName(capsule).decode()
        self.address: int = _api.PyCapsule_GetPointer(capsule, _api.PyCapsule_GetName(capsule))
        if not self.address:
            raise RlxError(f"SciPy capsule {library}.{name} holds a NULL pointer")
        self.returns, self.nargs = _parse_signature(self.signature)

    @property
    def symbol(self) -> str:
        """The LLVM symbol JIT code calls (`rlx_sgemm`)."""
        return PREFIX + self.name

    def function_type(self) -> ir.FunctionType:
        """`void (ptr × nargs)`: the Fortran ABI passes everything by pointer."""
        if self.returns != "void":
            raise RlxError(f"{self.name} returns {self.returns}; only subroutines are callable from IR")
        return ir.FunctionType(ir.VoidType(), [ir.PointerType()] * self.nargs)


def _parse_signature(signature: str) -> tuple[str, int]:
    """`'void (char *, int *)'` → `('void', 2)`."""
    m = re.fullmatch(r"\s*(.+?)\s*\((.*)\)\s*", signature)
    if not m:
        raise RlxError(f"cannot parse capsule signature {signature!r}")
    args = [a for a in m.group(2).split(",") if a.strip()]
    return m.group(1), len(args)


_lock = threading.Lock()
_routines: dict[str, Routine] = {}


def _capsules() -> dict[str, dict]:
    from scipy.linalg import cython_blas, cython_lapack
    return {"cython_blas": cython_blas.__pyx_capi__, "cython_lapack": cython_lapack.__pyx_capi__}


def routine(name: str) -> Routine:
    """The routine `name` (e.g. `"dgesv"`), resolved and registered with LLVM on first use."""
    with _lock:
        found = _routines.get(name)
        if found is not None:
            return found
        for library, capi in _capsules().items():
            if name in capi:
                found = Routine(name, capi[name], library)
                break
        else:
            raise RlxError(f"BLAS/LAPACK routine {name!r} is not exported by SciPy's cython_blas/cython_lapack")
        llvm.add_symbol(found.symbol, found.address)
        _routines[name] = found
        return found


def registered() -> dict[str, Routine]:
    """Every routine resolved so far, by name."""
    with _lock:
        return dict(_routines)


def _register_required() -> None:
    missing = []
    for name in REQUIRED:
        try:
            routine(name)
        except RlxError:
            missing.append(name)
    if missing:
        raise RlxError(f"SciPy's BLAS/LAPACK capsules lack {missing}: rlx_llvm cannot lower GEMMs/solves")


_register_required()
