"""Schedule → LLVM module: plan native segments and fallbacks, emit one function per thunk
(`i32 @t<i>_<kind>(ptr %arena, ptr %scratch)`) and a driver per native segment.  Thunks of a
shared-body lowering get no function: each is a row of buffer bases in a constant table that its
segment driver loops over, calling the one body their canonical form compiled to (`TableRows`).

A nested schedule (a Scan or CustomFn body) is compiled into the same module by `nested`: its
thunks become `@t3_scan.body.t<j>_<kind>` and one `i32 @t3_scan.body(ptr arena, ptr scratch)` runs
them in order, so the outer thunk calls its body natively, with no Python per step."""
from __future__ import annotations

import functools
import time
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from llvmlite import ir

from . import jit, registry
from .ir_emit import peephole, shared_bodies
from .ir_emit.context import EmitContext, snake
from .ir_emit.toolkit import I32, I64, PTR


@dataclass
class NativeStep:
    """Consecutive native thunks run by one driver function `symbol`."""

    symbol: str
    indices: Sequence[int]
    """A range: a segment is always consecutive thunks."""
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
    """Split the schedule into native segments (ranges of thunks) and fallback steps, in order."""
    steps: list = []
    segments = 0
    start = None  # first thunk of the open segment
    for i, t in enumerate(schedule.thunks):
        low = registry.LOWERINGS[type(t)]
        if low.emit is not None:
            start = i if start is None else start
            continue
        if start is not None:
            steps.append(NativeStep(f"segment{segments}", range(start, i)))
            segments, start = segments + 1, None
        steps.append(FallbackStep(i, t, low.run))
    if start is not None:
        steps.append(NativeStep(f"segment{segments}", range(start, len(schedule.thunks))))
    return steps


class RunMap:
    """thunk index → value, set in increasing index order and stored as runs of one value: a table
    over 200 000 thunks that share a body costs one run, not 200 000 dict entries.  Reads like a
    dict (`get`, `[i]`, `in`, `items`, `len`); `runs()` / `from_runs` are its JSON form."""

    def __init__(self, runs: "Sequence[Sequence] | None" = None) -> None:
        self._starts: list[int] = []
        self._stops: list[int] = []
        self._values: list = []
        for start, stop, value in runs or ():
            self._starts.append(start)
            self._stops.append(stop)
            self._values.append(value)

    def __setitem__(self, index: int, value: Any) -> None:
        if self._stops and index < self._stops[-1]:
            raise ValueError(f"RunMap: index {index} set after {self._stops[-1] - 1} (indices must increase)")
        if self._stops and index == self._stops[-1] and self._values[-1] == value:
            self._stops[-1] += 1
        else:
            self._starts.append(index)
            self._stops.append(index + 1)
            self._values.append(value)

    def get(self, index: int, default: Any = None) -> Any:
        """The value at `index`, else `default`."""
        k = bisect_right(self._starts, index) - 1
        return self._values[k] if k >= 0 and index < self._stops[k] else default

    def __getitem__(self, index: int) -> Any:
        k = bisect_right(self._starts, index) - 1
        if k < 0 or index >= self._stops[k]:
            raise KeyError(index)
        return self._values[k]

    def __contains__(self, index: object) -> bool:
        return isinstance(index, int) and self.get(index, _ABSENT) is not _ABSENT

    def items(self) -> Iterator[tuple[int, Any]]:
        """(index, value) for every index set, in order."""
        for start, stop, value in self.runs():
            for index in range(start, stop):
                yield index, value

    def __len__(self) -> int:
        return sum(stop - start for start, stop in zip(self._starts, self._stops))

    def runs(self) -> list[list]:
        """`[[start, stop, value], …]`: indices start … stop − 1 hold value."""
        return [[start, stop, value] for start, stop, value in zip(self._starts, self._stops, self._values)]

    @classmethod
    def from_runs(cls, runs: "Sequence[Sequence]") -> "RunMap":
        """The map `runs()` describes."""
        return cls(runs)

    @classmethod
    def of(cls, values: "Sequence") -> "RunMap":
        """Index i → values[i]."""
        runs = cls()
        for index, value in enumerate(values):
            runs[index] = value
        return runs


_ABSENT = object()


class ModuleBuilder:
    """One LLVM module: a function per native thunk and a driver per segment."""

    def __init__(self, schedule, lanes: int) -> None:
        self.schedule, self.lanes = schedule, lanes
        self.module = ir.Module(name="rlx_schedule")
        self.module.triple = jit.host().triple
        self.symbols = RunMap()  # thunk index → its function (for a table row: the shared body)
        self.emit_ms: dict[int, float] = {}  # thunks that emitted code (a table row reusing a body emits none)
        self.scratch_bytes = 0
        self.paths = RunMap()
        self.bodies: dict[tuple, tuple[ir.Function, EmitContext]] = {}  # canonical thunk → shared body
        self.body_of = RunMap()  # thunk index → the shared body its function calls
        self._rows: TableRows | None = None  # the run of table rows the next shared-body thunk may extend
        self._consts = _constants(schedule)
        self.nested_rows: dict[int, list[NestedRow]] = {}  # top-level index → its nested thunks
        self._top = 0  # the top-level thunk being emitted
        self.fused = peephole.fusions(schedule.thunks)  # index → the adjacent pair it runs in

    def declare(self, name: str, fnty: ir.FunctionType) -> ir.Function:
        existing = self.module.globals.get(name)
        if existing is not None:
            return existing
        return ir.Function(self.module, fnty, name=name)

    def thunk_function(self, index: int, thunk) -> "ir.Function | TableRows":
        """`@t<index>_<kind>`: the function of top-level thunk `index`; for a shared-body lowering, the
        table its segment driver loops over, with the thunk's row of buffer bases appended (no
        function of its own).  Called for thunks in increasing index order."""
        self._top = index
        fusion = self.fused.get(index)
        if fusion is None and registry.LOWERINGS[type(thunk)].shared_body:
            return self._table_row(index, thunk)
        t0 = time.perf_counter()
        name = _function_name(index, type(thunk))
        if fusion is not None:
            fn, ctx = self._fused(name, index, thunk, fusion)
        else:
            fn, ctx = self._thunk(name, index, thunk, self.schedule)
        self.scratch_bytes = max(self.scratch_bytes, ctx.scratch_bytes)
        self.paths[index] = (fusion.path(index) if fusion else
                             _path_taken(ctx.paths, registry.LOWERINGS[type(thunk)].path))
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
        key = (shared_bodies.body_key(form), self._consts if schedule is self.schedule else _constants(schedule))
        if key not in self.bodies:
            body = self._function(f"{name}.body")
            body.args[0].name = "fields"
            self.bodies[key] = (body, self._emit(body, index, form, schedule, fields=True))
        body, ctx = self.bodies[key]
        return body, ctx, bases

    def _table_row(self, index: int, thunk) -> "TableRows":
        """A top-level shared-body thunk: its row of buffer bases, appended to the run of rows of
        its body that ends just before it (or a new run).  Python work per thunk is its canonical
        form and a few appends: no function, no IR value, no dict entry of its own."""
        t0 = time.perf_counter()
        n_bodies = len(self.bodies)
        body, ctx, bases = self._shared_body(_function_name(index, type(thunk)), index, thunk, self.schedule)
        rows = self._rows
        if rows is None or rows.body is not body or rows.stop != index:
            rows = self._rows = TableRows(body, index, len(bases))
        rows.append(bases)
        if len(self.bodies) > n_bodies:  # this thunk emitted the body
            self.scratch_bytes = max(self.scratch_bytes, ctx.scratch_bytes)
            self.emit_ms[index] = (time.perf_counter() - t0) * 1e3
        self.symbols[index] = self.body_of[index] = body.name
        self.paths[index] = _path_taken(ctx.paths, registry.LOWERINGS[type(thunk)].path)
        return rows

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

    def driver(self, step: NativeStep, fns: "list[ir.Function | TableRows]") -> None:
        """`i64 @segmentN(ptr, ptr)`: call each thunk — a run of table rows of one body in one loop
        over a constant table of their bases; return 0, or (index + 1) << 32 | status."""
        drv = ir.Function(self.module, ir.FunctionType(I64, [PTR, PTR]), name=step.symbol)
        drv.attributes.add("nounwind")
        b = ir.IRBuilder(drv.append_basic_block("entry"))
        last = None
        for index, fn in zip(step.indices, fns):
            if isinstance(fn, TableRows):
                if fn is not last:  # the thunks after a run's first are its further rows
                    self._row_loop(b, drv, fn)
                last = fn
                continue
            _call_or_return(b, drv, fn, list(drv.args), index)
        b.ret(I64(0))

    def _one_row(self, b: ir.IRBuilder, drv: ir.Function, rows: "TableRows") -> None:
        """A run of one row (a thunk whose shape no neighbour shares): fill its field table with
        constant addresses and call the body — no table, no loop (2 000 distinct shapes would
        otherwise make the driver the module's largest function)."""
        arena, scratch = drv.args
        first = rows.first
        note = f"{drv.name}: thunk {first} calls body {rows.body.name}"
        self.module.add_named_metadata("rlx.thunks", [ir.MetaDataString(self.module, note)])
        with b.goto_entry_block():
            fields = b.alloca(ir.ArrayType(PTR, 1 + rows.width), name=f"fields.t{first}")
        for k, base in enumerate([0, *rows.bases[:rows.width]]):
            at = b.gep(arena, [I64(base)], source_etype=ir.IntType(8), inbounds=True)
            b.store(at, b.gep(fields, [I32(0), I32(k)], inbounds=True))
        _call_or_return(b, drv, rows.body, [fields, scratch], first)

    def _row_loop(self, b: ir.IRBuilder, drv: ir.Function, rows: "TableRows") -> None:
        """For each row r of `@<segment>.rows<first>` (thunk first + r; the table is flat, row r at
        r·width): fill the field table (`fields[0]` = the arena, `fields[k]` = arena + base k) and
        call the body."""
        first, width, body = rows.first, rows.width, rows.body
        if rows.count == 1:
            return self._one_row(b, drv, rows)
        name = f"{drv.name}.rows{first}"
        if width:
            table = ir.GlobalVariable(self.module, ir.ArrayType(I64, len(rows.bases)), name=name)
            table.global_constant, table.linkage, table.unnamed_addr = True, "private", True
            table.initializer = ir.FormattedConstant(table.value_type, _i64_array(rows.bases))
        note = f"{name}: thunks {first}..{rows.stop - 1}, row r = thunk {first} + r, body {body.name}"
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
        row = b.mul(r, I64(width), flags=["nuw", "nsw"])
        for k in range(width):
            entry = b.add(row, I64(k), flags=["nuw", "nsw"])
            base = b.load(b.gep(table, [I64(0), entry], inbounds=True), typ=I64)
            at = b.gep(arena, [base], source_etype=ir.IntType(8), inbounds=True)
            b.store(at, b.gep(fields, [I32(0), I32(1 + k)], inbounds=True))
        status = b.call(body, [fields, scratch])
        nxt = b.add(r, I64(1))
        more = drv.append_basic_block(f"next.t{first}")
        r.add_incoming(nxt, more)
        b.cbranch(b.icmp_unsigned("!=", status, I32(0)), failed, more)
        b.position_at_end(more)
        b.cbranch(b.icmp_unsigned("<", nxt, I64(rows.count)), loop, done)
        b.position_at_end(failed)
        b.ret(b.or_(b.shl(b.add(r, I64(first + 1)), I64(32)), b.zext(status, I64)))
        b.position_at_end(done)


def _call_or_return(b: ir.IRBuilder, drv: ir.Function, fn: ir.Function, args: list, index: int) -> None:
    """Call thunk `index`'s function; on a non-zero status return (index + 1) << 32 | status from
    the driver, else carry on after the call."""
    status = b.call(fn, args)
    failed = drv.append_basic_block(f"failed.t{index}")
    ok = drv.append_basic_block(f"after.t{index}")
    b.cbranch(b.icmp_unsigned("!=", status, I32(0)), failed, ok)
    b.position_at_end(failed)
    b.ret(b.or_(I64((index + 1) << 32), b.zext(status, I64)))
    b.position_at_end(ok)


@dataclass
class TableRows:
    """Consecutive top-level thunks first, first + 1, … that share `body`: their segment driver
    loops over a table of their buffer bases, `width` per thunk, flat (8 bytes per base)."""

    body: ir.Function
    first: int
    width: int
    bases: array = field(default_factory=lambda: array("q"))
    count: int = 0

    @property
    def stop(self) -> int:
        """One past the last thunk."""
        return self.first + self.count

    def append(self, bases: list[int]) -> None:
        """The next thunk's row."""
        self.bases.extend(bases)
        self.count += 1


def _i64_array(values: array) -> str:
    """`[i64 a, i64 b, …]`: a table's initializer written directly (an `ir.Constant` per entry
    costs microseconds each to build and print; this is one join)."""
    return "[i64 " + ", i64 ".join(map(str, values)) + "]"


@functools.cache
def _function_name_tail(cls: type) -> str:
    return snake(cls.__name__)


def _function_name(index: int, cls: type) -> str:
    """`t<index>_<kind>`, e.g. `t3_layer_norm`."""
    return f"t{index}_{_function_name_tail(cls)}"


def _constants(schedule) -> str:
    """The schedule constants a shared body's code may depend on, exactly (repr keeps -0.0 apart)."""
    return repr((schedule.mask_threshold, schedule.mask_neg_inf, schedule.score_skip))


def _path_taken(noted: set[str], registered: str) -> str:
    """What a compiled thunk became: `blas` if it calls BLAS, else `llvm` if it noted IR code (or
    chose IR tiles over BLAS), else the registered path."""
    for outside in ("blas", "c", "python"):  # code from outside the module (CustomOp kernels: docs/custom-ops.md)
        if outside in noted:
            return outside
    return "llvm" if noted or registered == "llvm|blas" else registered
