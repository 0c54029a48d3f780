"""Schedule → LLVM module: plan native segments and fallbacks, emit one function per thunk
(`i32 @t<i>_<kind>(ptr %arena, ptr %scratch)`) and a driver per native segment.

A nested schedule (a Scan or CustomFn body) is compiled into the same module by `nested`: its
thunks become `@t3_scan.body.t<j>_<kind>` and one `i32 @t3_scan.body(ptr arena, ptr scratch)` runs
them in order, so the outer thunk calls its body natively, with no Python per step."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from llvmlite import ir

from . import jit, registry
from .ir_emit import shared_bodies
from .ir_emit.context import EmitContext, snake
from .ir_emit.toolkit import I32, I64, PTR


@dataclass
class NativeStep:
    """Consecutive native thunks run by one driver function `symbol`."""

    symbol: str
    indices: list[int]
    fn: Callable | None = None
    engine: object = None
    """The engine holding `fn`'s code: kept alive by the step (a run in progress keeps its tier)."""


@dataclass(frozen=True)
class NestedRow:
    """One thunk of a nested schedule (a Scan/CustomFn body): where it sits and what it became."""

    within: str   # the body's function, e.g. "t3_scan.body"
    index: int    # its index in the body schedule
    kind: str
    path: str
    symbol: str


@dataclass
class FallbackStep:
    """One thunk run in Python (SciPy/NumPy on arena views)."""

    index: int
    thunk: object
    run: Callable


def plan(schedule) -> list["NativeStep | FallbackStep"]:
    """Split the schedule into native segments and fallback steps, in order."""
    steps: list = []
    for i, t in enumerate(schedule.thunks):
        low = registry.LOWERINGS[type(t)]
        if low.emit is not None:
            if not steps or not isinstance(steps[-1], NativeStep):
                steps.append(NativeStep(f"segment{sum(isinstance(s, NativeStep) for s in steps)}", []))
            steps[-1].indices.append(i)
        else:
            steps.append(FallbackStep(i, t, low.run))
    return steps


class ModuleBuilder:
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
        self.nested_rows: dict[int, list[NestedRow]] = {}  # top-level index → its nested thunks
        self._top = 0  # the top-level thunk being emitted

    def declare(self, name: str, fnty: ir.FunctionType) -> ir.Function:
        existing = self.module.globals.get(name)
        if existing is not None:
            return existing
        return ir.Function(self.module, fnty, name=name)

    def thunk_function(self, index: int, thunk) -> ir.Function:
        """`@t<index>_<kind>`: the function of top-level thunk `index`."""
        self._top = index
        t0 = time.perf_counter()
        fn, ctx = self._thunk(f"t{index}_{snake(type(thunk).__name__)}", index, thunk, self.schedule)
        self.scratch_bytes = max(self.scratch_bytes, ctx.scratch_bytes)
        self.paths[index] = _path_taken(ctx.paths, registry.LOWERINGS[type(thunk)].path)
        self.emit_ms[index] = (time.perf_counter() - t0) * 1e3
        self.symbols[index] = fn.name
        return fn

    def _thunk(self, name: str, index: int, thunk, schedule) -> tuple[ir.Function, EmitContext]:
        """Emit one thunk of `schedule` (the top level or a nested body) as function `name`."""
        fn = self._function(name)
        if registry.LOWERINGS[type(thunk)].shared_body:
            ctx = self._call_shared_body(fn, index, thunk, schedule)
        else:
            ctx = self._emit(fn, index, thunk, schedule, fields=False)
        self.module.add_named_metadata("rlx.thunks", [ir.MetaDataString(self.module, f"{name}: {thunk!r}")])
        return fn, ctx

    def nested(self, schedule, prefix: str) -> tuple[ir.Function, int]:
        """Compile a nested schedule into this module: `i32 @<prefix>(ptr arena, ptr scratch)` runs its
        thunks in order and returns the first non-zero status; also returns the scratch it needs."""
        fns, scratch = [], 0
        for j, t in enumerate(schedule.thunks):
            fn, ctx = self._thunk(f"{prefix}.t{j}_{snake(type(t).__name__)}", j, t, schedule)
            scratch = max(scratch, ctx.scratch_bytes)
            path = _path_taken(ctx.paths, registry.LOWERINGS[type(t)].path)
            row = NestedRow(prefix, j, type(t).__name__, path, fn.name)
            self.nested_rows.setdefault(self._top, []).append(row)
            fns.append(fn)
        run = self._function(prefix)
        b = ir.IRBuilder(run.append_basic_block("entry"))
        for j, fn in enumerate(fns):
            status = b.call(fn, list(run.args))
            failed, ok = run.append_basic_block(f"failed.t{j}"), run.append_basic_block(f"after.t{j}")
            b.cbranch(b.icmp_unsigned("!=", status, I32(0)), failed, ok)
            b.position_at_end(failed)
            b.ret(status)
            b.position_at_end(ok)
        b.ret(I32(0))
        return run, scratch

    def _function(self, name: str) -> ir.Function:
        """`i32 @name(ptr noalias %arena, ptr noalias %scratch)`, kept out of line."""
        fn = ir.Function(self.module, ir.FunctionType(I32, [PTR, PTR]), name=name)
        fn.args[0].name, fn.args[1].name = "arena", "scratch"
        for arg in fn.args:
            arg.add_attribute("noalias")
        fn.attributes.add("nounwind")
        fn.attributes.add("noinline")  # keeps each thunk a separate, inspectable symbol
        return fn

    def _emit(self, fn: ir.Function, index: int, thunk, schedule, fields: bool) -> EmitContext:
        ctx = EmitContext(self.module, fn, index, thunk, schedule, self.lanes, self.declare, fields=fields,
                          nest=lambda body, name: self.nested(body, f"{fn.name}.{name}"))
        registry.LOWERINGS[type(thunk)].emit(ctx, thunk)
        ctx.finish()
        return ctx

    def _call_shared_body(self, fn: ir.Function, index: int, thunk, schedule) -> EmitContext:
        """Fill the buffer table and call the body shared by every thunk with the same canonical
        form (`ir_emit.shared_bodies`), emitting that body on first use."""
        form, bases = shared_bodies.canonical(thunk)
        key = repr((form, schedule.mask_threshold, schedule.mask_neg_inf, schedule.score_skip))
        if key not in self.bodies:
            body = self._function(f"{fn.name}.body")
            body.args[0].name = "fields"
            self.bodies[key] = (body, self._emit(body, index, form, schedule, fields=True))
        body, ctx = self.bodies[key]
        if schedule is self.schedule:
            self.body_of[index] = body.name
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        table = b.alloca(ir.ArrayType(PTR, 1 + len(bases)), name="fields")
        for k, base in enumerate([0] + bases):
            at = b.gep(fn.args[0], [I64(base)], source_etype=ir.IntType(8), inbounds=True)
            b.store(at, b.gep(table, [I32(0), I32(k)], inbounds=True))
        b.ret(b.call(body, [table, fn.args[1]]))
        return ctx

    def driver(self, step: NativeStep, fns: list[ir.Function]) -> None:
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


def _path_taken(noted: set[str], registered: str) -> str:
    """What a compiled thunk became: `blas` if it calls BLAS, else `llvm` if it noted IR code (or
    chose IR tiles over BLAS), else the registered path."""
    for outside in ("blas", "c", "python"):  # code from outside the module (CustomOp kernels: docs/custom-ops.md)
        if outside in noted:
            return outside
    return "llvm" if noted or registered == "llvm|blas" else registered
