"""Schedule → LLVM module: plan native segments and fallbacks, emit one function per thunk
(`i32 @t<i>_<kind>(ptr %arena, ptr %scratch)`) and a driver per native segment.

A nested schedule (a Scan or CustomFn body) is compiled into the same module by `nested`: its
thunks become `@t3_scan.body.t<j>_<kind>` and one `i32 @t3_scan.body(ptr arena, ptr scratch)` runs
them in order, so the outer thunk calls its body natively, with no Python per step."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from llvmlite import ir

from . import jit, registry
from .ir_emit import peephole, shared_bodies
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
        self.fused = peephole.fusions(schedule.thunks)  # index → the adjacent pair it runs in

    def declare(self, name: str, fnty: ir.FunctionType) -> ir.Function:
        existing = self.module.globals.get(name)
        if existing is not None:
            return existing
        return ir.Function(self.module, fnty, name=name)

    def thunk_function(self, index: int, thunk) -> "ir.Function | TableRow":
        """`@t<index>_<kind>`: the function of top-level thunk `index`; for a shared-body lowering, the
        row of buffer bases its segment driver passes to the shared body (no function of its own)."""
        self._top = index
        t0 = time.perf_counter()
        name = f"t{index}_{snake(type(thunk).__name__)}"
        fusion = self.fused.get(index)
        if fusion is not None:
            fn, ctx = self._fused(name, index, thunk, fusion)
        elif registry.LOWERINGS[type(thunk)].shared_body:
            fn, ctx = self._table_row(name, index, thunk)
        else:
            fn, ctx = self._thunk(name, index, thunk, self.schedule)
        self.scratch_bytes = max(self.scratch_bytes, ctx.scratch_bytes)
        self.paths[index] = (fusion.path(index) if fusion else
                             _path_taken(ctx.paths, registry.LOWERINGS[type(thunk)].path))
        self.emit_ms[index] = (time.perf_counter() - t0) * 1e3
        self.symbols[index] = fn.body.name if isinstance(fn, TableRow) else fn.name
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

    def _fused(self, name: str, index: int, thunk, fusion: "peephole.Fusion") -> tuple[ir.Function, EmitContext]:
        """Thunk `index` of a fused adjacent pair (`ir_emit.peephole`): the first runs the pair's kernel."""
        fn = self._function(name)
        ctx = EmitContext(self.module, fn, index, thunk, self.schedule, self.lanes, self.declare)
        fusion.emit_at(ctx, index)
        ctx.finish()
        note = f"{name}: {thunk!r} — {fusion.path(index)}"
        self.module.add_named_metadata("rlx.thunks", [ir.MetaDataString(self.module, note)])
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

    def _shared_body(self, name: str, index: int, thunk, schedule) -> tuple[ir.Function, EmitContext, list[int]]:
        """The body shared by every thunk with `thunk`'s canonical form (`ir_emit.shared_bodies`),
        emitted as `<name>.body` on first use, its context, and `thunk`'s buffer bases."""
        form, bases = shared_bodies.canonical(thunk)
        key = repr((form, schedule.mask_threshold, schedule.mask_neg_inf, schedule.score_skip))
        if key not in self.bodies:
            body = self._function(f"{name}.body")
            body.args[0].name = "fields"
            self.bodies[key] = (body, self._emit(body, index, form, schedule, fields=True))
        body, ctx = self.bodies[key]
        if schedule is self.schedule:
            self.body_of[index] = body.name
        return body, ctx, bases

    def _table_row(self, name: str, index: int, thunk) -> tuple[TableRow, EmitContext]:
        """A top-level shared-body thunk: its body and its row of buffer bases (the driver notes
        the run of rows in `rlx.thunks`; `Program.llvm_ir(thunk=i)` shows the thunk itself)."""
        body, ctx, bases = self._shared_body(name, index, thunk, self.schedule)
        return TableRow(body, tuple(bases)), ctx

    def _call_shared_body(self, fn: ir.Function, index: int, thunk, schedule) -> EmitContext:
        """Fill the buffer table and call the body shared by every thunk with the same canonical
        form, emitting that body on first use (thunks of nested schedules)."""
        body, ctx, bases = self._shared_body(fn.name, index, thunk, schedule)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        table = b.alloca(ir.ArrayType(PTR, 1 + len(bases)), name="fields")
        for k, base in enumerate([0] + bases):
            at = b.gep(fn.args[0], [I64(base)], source_etype=ir.IntType(8), inbounds=True)
            b.store(at, b.gep(table, [I32(0), I32(k)], inbounds=True))
        b.ret(b.call(body, [table, fn.args[1]]))
        return ctx

    def driver(self, step: NativeStep, fns: "list[ir.Function | TableRow]") -> None:
        """`i64 @segmentN(ptr, ptr)`: call each thunk — a run of table rows of one body in one loop
        over a constant table of their bases; return 0, or (index + 1) << 32 | status."""
        drv = ir.Function(self.module, ir.FunctionType(I64, [PTR, PTR]), name=step.symbol)
        drv.attributes.add("nounwind")
        b = ir.IRBuilder(drv.append_basic_block("entry"))
        for first, fn, rows in _runs(step.indices, fns):
            if rows:
                self._row_loop(b, drv, first, fn, rows)
                continue
            status = b.call(fn, list(drv.args))
            failed = drv.append_basic_block(f"failed.t{first}")
            ok = drv.append_basic_block(f"after.t{first}")
            b.cbranch(b.icmp_unsigned("!=", status, I32(0)), failed, ok)
            b.position_at_end(failed)
            b.ret(b.or_(I64((first + 1) << 32), b.zext(status, I64)))
            b.position_at_end(ok)
        b.ret(I64(0))

    def _row_loop(self, b: ir.IRBuilder, drv: ir.Function, first: int, body: ir.Function,
                  rows: list[tuple[int, ...]]) -> None:
        """For each row r of `@<segment>.rows<first>` (thunk first + r): fill the field table
        (`fields[0]` = the arena, `fields[k]` = arena + base k) and call `body`."""
        width = len(rows[0])
        data = np.asarray(rows, dtype=np.int64).reshape(len(rows), width)
        row_type = ir.ArrayType(I64, width)
        table = ir.GlobalVariable(self.module, ir.ArrayType(row_type, len(rows)), name=f"{drv.name}.rows{first}")
        table.global_constant, table.linkage, table.unnamed_addr = True, "private", True
        table.initializer = ir.Constant(table.value_type, [ir.Constant(row_type, row) for row in data.tolist()])
        note = f"{table.name}: thunks {first}..{first + len(rows) - 1}, row r = thunk {first} + r, body {body.name}"
        self.module.add_named_metadata("rlx.thunks", [ir.MetaDataString(self.module, note)])
        arena, scratch = drv.args
        with b.goto_entry_block():
            fields = b.alloca(ir.ArrayType(PTR, 1 + width), name=f"fields.t{first}")
        b.store(arena, b.gep(fields, [I32(0), I32(0)], inbounds=True))
        before = b.block
        loop = drv.append_basic_block(f"rows.t{first}")
        failed = drv.append_basic_block(f"failed.t{first}")
        done = drv.append_basic_block(f"after.t{first}")
        b.branch(loop)
        b.position_at_end(loop)
        r = b.phi(I64, name=f"row.t{first}")
        r.add_incoming(I64(0), before)
        for k in range(width):
            base = b.load(b.gep(table, [I64(0), r, I32(k)], inbounds=True), typ=I64)
            at = b.gep(arena, [base], source_etype=ir.IntType(8), inbounds=True)
            b.store(at, b.gep(fields, [I32(0), I32(1 + k)], inbounds=True))
        status = b.call(body, [fields, scratch])
        nxt = b.add(r, I64(1))
        more = drv.append_basic_block(f"next.t{first}")
        r.add_incoming(nxt, more)
        b.cbranch(b.icmp_unsigned("!=", status, I32(0)), failed, more)
        b.position_at_end(more)
        b.cbranch(b.icmp_unsigned("<", nxt, I64(len(rows))), loop, done)
        b.position_at_end(failed)
        b.ret(b.or_(b.shl(b.add(r, I64(first + 1)), I64(32)), b.zext(status, I64)))
        b.position_at_end(done)


@dataclass(frozen=True)
class TableRow:
    """A top-level shared-body thunk: its segment driver calls `body` with `bases` in a table row."""

    body: ir.Function
    bases: tuple[int, ...]


def _runs(indices: list[int], fns: list) -> list[tuple[int, object, list]]:
    """Group consecutive table rows of one body: (first index, function or body, rows or [])."""
    runs: list[tuple[int, object, list]] = []
    for index, fn in zip(indices, fns):
        if isinstance(fn, TableRow):
            last = runs[-1] if runs else None
            if last and last[2] and last[1] is fn.body and len(last[2][0]) == len(fn.bases):
                last[2].append(fn.bases)
            else:
                runs.append((index, fn.body, [fn.bases]))
        else:
            runs.append((index, fn, []))
    return runs


def _path_taken(noted: set[str], registered: str) -> str:
    """What a compiled thunk became: `blas` if it calls BLAS, else `llvm` if it noted IR code (or
    chose IR tiles over BLAS), else the registered path."""
    for outside in ("blas", "c", "python"):  # code from outside the module (CustomOp kernels: docs/custom-ops.md)
        if outside in noted:
            return outside
    return "llvm" if noted or registered == "llvm|blas" else registered
