"""Calls into SciPy's BLAS/LAPACK from JIT code: the Fortran by-pointer arguments of one thunk.

The symbol table (which routines exist, their addresses and signatures, the status codes) is
`kernels.blas`; this module only emits IR: the scalars go in `alloca` slots of the entry block and
`call void @rlx_<name>(ptr, …)` is emitted with constant dims.
"""
from __future__ import annotations

from llvmlite import ir

from ..errors import RlxError
from ..kernels.blas import BLAS_INT_MAX, routine
from .context import EmitContext
from .toolkit import F32, F64, I8, I32, entry_alloca


class FortranArgs:
    """By-pointer scalar arguments of one thunk function, as `alloca` slots in its entry block.

    Constant slots are created once per function and reused (BLAS/LAPACK never write their input
    scalars); `mutable_int()` gives a fresh slot for values stored at run time (row counts, `info`).
    """

    def __init__(self, ctx: EmitContext) -> None:
        self.ctx = ctx
        self._consts: dict[tuple, ir.Value] = {}

    def _alloca(self, ty: ir.Type, init: ir.Constant | None = None) -> ir.Value:
        slot = entry_alloca(self.ctx, ty)
        if init is not None:  # stored in the entry block too: the slot holds it on every path
            with self.ctx.b.goto_entry_block():
                self.ctx.b.store(init, slot)
        return slot

    def _const(self, ty: ir.Type, value) -> ir.Value:
        key = (str(ty), value)
        if key not in self._consts:
            self._consts[key] = self._alloca(ty, ir.Constant(ty, value))
        return self._consts[key]

    def int(self, value: int) -> ir.Value:
        """Pointer to a constant 32-bit Fortran INTEGER."""
        if not -2**31 <= value <= BLAS_INT_MAX:
            raise RlxError(f"{value} does not fit a 32-bit BLAS integer")
        return self._const(I32, value)

    def char(self, flag: str) -> ir.Value:
        """Pointer to a constant CHARACTER flag ('N', 'T', 'U', 'L', 'R')."""
        return self._const(I8, ord(flag))

    def f32(self, value: float) -> ir.Value:
        """Pointer to a constant REAL."""
        return self._const(F32, float(value))

    def f64(self, value: float) -> ir.Value:
        """Pointer to a constant DOUBLE PRECISION."""
        return self._const(F64, float(value))

    def c64(self, re_: float, im: float = 0.0) -> ir.Value:
        """Pointer to a constant COMPLEX (two f32, real first)."""
        ty = ir.ArrayType(F32, 2)
        key = ("c64", re_, im)
        if key not in self._consts:
            self._consts[key] = self._alloca(ty, ir.Constant(ty, [F32(float(re_)), F32(float(im))]))
        return self._consts[key]

    def mutable_int(self) -> ir.Value:
        """A fresh INTEGER slot for a value written at run time (by us or by LAPACK)."""
        return self._alloca(I32)

    def call(self, name: str, *args: ir.Value) -> None:
        """Emit `call void @rlx_<name>(args...)`, declaring the routine once per module."""
        r = routine(name)
        if len(args) != r.nargs:
            raise RlxError(f"{name} takes {r.nargs} arguments ({r.signature}), got {len(args)}")
        fn = self.ctx.declare(r.symbol, r.function_type())
        self.ctx.b.call(fn, list(args))
