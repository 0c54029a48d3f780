"""The per-thunk `EmitContext`: the builder, the arena and scratch pointers, and addressing.

An emitter gets an `EmitContext` positioned in the entry block of
`i32 @t<N>_<kind>(ptr %arena, ptr %scratch)` and writes the thunk's body; returning from the
emitter returns status 0 (`ctx.fail(code)` returns a non-zero status that `Program.run` raises as
ExecutionError).  `%scratch` is the calling thread's scratch buffer (shared by every Program that
thread runs, grown to the largest; `Program.run`), each Program's need sized at
compile time from every thunk's `ctx.scratch_alloc` requests (thunks run one after another, so
each thunk's scratch starts at offset 0).  Offsets are
compile-time constants, so every address is `gep i8, ptr %arena, i64 <const + index·size>`
(never ptrtoint/inttoptr: LLVM 22 can miscompile that pattern while unrolling).
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Callable, Union

from llvmlite import ir

from ..dtypes import LaneKind
from .toolkit import (I32, I64, I8, PTR, STORAGE, Index, for_range, narrow_from_f32, sizeof, vec, vector_loop,
                      widen_to_f32, width_of)

# Outputs at least this large are written with non-temporal stores (they cannot stay in the
# 32 MiB L3 anyway, and streaming skips the read-for-ownership of every line: ~1/3 less traffic).
STREAM_BYTES = 8 << 20


def snake(name: str) -> str:
    """`LayerNorm` → `layer_norm`, `CastF32ToBf16` → `cast_f32_to_bf16`."""
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name)
    s = re.sub(r"(?<=[A-Z])([A-Z][a-z])", r"_\1", s)
    return s.lower()


FIELD_STRIDE = 1 << 40  # virtual arena offsets of a shared body: buffer k starts at k·FIELD_STRIDE


def _alignment(offset: int, itemsize: int) -> int:
    if offset == 0:
        return itemsize
    return min(itemsize, offset & -offset)


@contextlib.contextmanager
def _at_entry(b: ir.IRBuilder):
    """Emit into the entry block (before its terminator), then return to exactly where the builder
    was.  Unlike llvmlite's `goto_entry_block`, which returns to the *end* of the old block, this
    nests inside an emitter's own `goto_entry_block` (region's scalar loads)."""
    block, anchor = b.block, b._anchor
    if block is b.function.entry_basic_block:  # already there: here dominates the rest
        yield
        return
    entry = b.function.entry_basic_block
    if entry.terminator is None:
        b.position_at_end(entry)
    else:
        b.position_before(entry.terminator)
    try:
        yield
    finally:
        b.position_at_end(block)
        if anchor < len(block.instructions):
            b.position_before(block.instructions[anchor])


class EmitContext:
    """What an emitter needs: the builder, the arena pointer, loop and lane helpers."""

    def __init__(self, module: ir.Module, fn: ir.Function, index: int, thunk, schedule, lanes: int,
                 declare: Callable[[str, ir.FunctionType], ir.Function],
                 arena: ir.Value | None = None, scratch: ir.Value | None = None,
                 builder: ir.IRBuilder | None = None, shared: ir.Value | None = None,
                 fields: bool = False, nest: Callable | None = None) -> None:
        self.module, self.fn, self.index, self.thunk, self.schedule = module, fn, index, thunk, schedule
        self.lanes = lanes  # f32 lanes per vector register (16 on AVX-512)
        self.b = builder or ir.IRBuilder(fn.append_basic_block("entry"))
        self.arena = fn.args[0] if arena is None else arena
        self.scratch = fn.args[1] if scratch is None else scratch
        # The scratch of the thread that owns this thunk's intermediates: `scratch` itself at top
        # level, the parent's `shared` inside a parallel body (where `scratch` is per-thread).
        self.shared = self.scratch if shared is None else shared
        # `fields`: a shared body (`ir_emit.shared_bodies`): `arena` points at a table of buffer pointers
        # and arena offsets are virtual, `k·FIELD_STRIDE + byte` = byte `byte` past table[k].
        self.fields = fields
        self._field_ptrs: dict[int, ir.Value] = {}
        self._declare = declare
        self._nest = nest
        self._outlined = 0
        self.paths: set[str] = set()  # "llvm"/"blas" as the emitted code actually turned out
        self._streamed = False
        self.scratch_bytes = 0  # how much scratch this thunk asked for

    # ── scratch ──
    def scratch_alloc(self, nbytes: int, align: int = 64) -> int:
        """Reserve `nbytes` of per-thread scratch for this thunk; returns its offset in scratch."""
        off = (self.scratch_bytes + align - 1) // align * align
        self.scratch_bytes = off + nbytes
        return off

    # ── addressing ──
    def addr(self, offset: int, index: "ir.Value | int" = 0, itemsize: int = 1, base: ir.Value | None = None
             ) -> ir.Value:
        """Pointer to byte `offset + index·itemsize` of the arena (or of `base`, e.g. `ctx.scratch`)."""
        b = self.b
        if base is None and self.fields:
            base, offset = self._field(offset)
        base = self.arena if base is None else base
        if isinstance(index, int):
            return b.gep(base, [I64(offset + index * itemsize)], source_etype=I8, inbounds=True)
        byte = index if itemsize == 1 else b.mul(index, I64(itemsize), flags=("nuw", "nsw"))
        if offset:
            byte = b.add(byte, I64(offset), flags=("nuw", "nsw"))
        return b.gep(base, [byte], source_etype=I8, inbounds=True)

    def _field(self, offset: int) -> tuple[ir.Value, int]:
        """(buffer pointer, byte offset in it) of a virtual arena offset; the table entry is
        loaded once, in the entry block (invariant: the table never changes)."""
        k, byte = divmod(offset, FIELD_STRIDE)
        if k not in self._field_ptrs:
            with _at_entry(self.b):
                slot = self.b.gep(self.arena, [I64(8 * k)], source_etype=I8, inbounds=True)
                ptr = self.b.load(slot, typ=PTR, align=8)
                ptr.set_metadata("invariant.load", self.module.add_metadata([]))
            self._field_ptrs[k] = ptr
        return self._field_ptrs[k], byte

    def load(self, offset: int, ty: ir.Type, index: "ir.Value | int", width: int = 1,
             base: ir.Value | None = None) -> ir.Value:
        """Load `width` consecutive elements of storage type `ty` (scalar when width is 1)."""
        size = sizeof(ty)
        return self.b.load(self.addr(offset, index, size, base), typ=vec(ty, width),
                           align=_alignment(offset, size))

    def store(self, offset: int, value: ir.Value, index: "ir.Value | int", streaming: bool = False,
              base: ir.Value | None = None) -> None:
        """Store a scalar or vector of elements at element `index` of the slot at `offset`.

        `streaming=True` marks a full-register vector store non-temporal (it bypasses the cache and
        skips the read-for-ownership of the line): only valid when the caller knows the store is
        aligned to its size — see `streams`.
        """
        ty = value.type.element if isinstance(value.type, ir.VectorType) else value.type
        size = sizeof(ty)
        width = width_of(value)
        if streaming and width > 1:
            st = self.b.store(value, self.addr(offset, index, size, base), align=min(size * width, 64))
            st.set_metadata("nontemporal", self.module.add_metadata([I32(1)]))
            self._streamed = True
            return
        self.b.store(value, self.addr(offset, index, size, base), align=_alignment(offset, size))

    def fail(self, status: "ir.Value | int") -> None:
        """Return a non-zero status now (e.g. LAPACK's info); Program.run raises ExecutionError."""
        self.b.ret(I32(int(status)) if isinstance(status, int) else status)

    def streams(self, offset: int, itemsize: int, count: int, width: int | None = None) -> bool:
        """Whether stores of `count` elements at `offset` should stream: the output is far larger
        than the cache (≥ STREAM_BYTES) and every W-wide store is aligned to its own size."""
        vbytes = min(itemsize * (width or self.lanes), 64)  # a zmm register at most
        return count * itemsize >= STREAM_BYTES and offset % vbytes == 0 and vbytes & (vbytes - 1) == 0

    def finish(self) -> None:
        """Close the function: order streaming stores with a fence and return status 0."""
        if not self.b.block.is_terminated:
            if self._streamed:
                self.b.fence("seq_cst")  # orders the weakly-ordered streaming stores (mfence on x86)
            self.b.ret(I32(0))

    # ── f32 lanes (ElementwiseRegion's LaneKind) ──
    def load_lane(self, lane: LaneKind, offset: int, index: "ir.Value | int", width: int = 1) -> ir.Value:
        """Load lanes and widen them to f32."""
        raw = self.load(offset, STORAGE[lane.dtype], index, width)
        return widen_to_f32(self.b, lane.dtype, raw)

    def store_lane(self, lane: LaneKind, offset: int, value: ir.Value, index: "ir.Value | int",
                   streaming: bool = False) -> None:
        """Narrow f32 values to the lane's storage (halves RNE) and store them."""
        self.store(offset, narrow_from_f32(self.b, lane.dtype, value), index, streaming)

    # ── control flow ──
    def for_range(self, start: Index, stop: Index, step: int = 1, name: str = "i"
                  ) -> "contextlib.AbstractContextManager[ir.Value]":
        """`with ctx.for_range(start, stop, step) as i:` — `toolkit.for_range` in this context."""
        return for_range(self, start, stop, step, name)

    def vector_loop(self, n: int, body: Callable[[ir.Value, int], None], width: int | None = None,
                    name: str = "i") -> None:
        """`body(i, W)` over whole vectors, then `body(i, 1)` over the tail — `toolkit.vector_loop`."""
        vector_loop(self, n, body, width, name)

    def note_path(self, path: str) -> None:
        """Record how this thunk's code actually runs (e.g. a GEMM chose IR tiles over a BLAS call);
        `Program.report()` shows "blas" if any BLAS call was emitted, else "llvm"."""
        self.paths.add(path)

    # ── threads ──
    def parallel_for(self, n: int, body: Callable[["EmitContext", ir.Value, ir.Value], None],
                     grain: int = 1, min_work: int = 1) -> None:
        """Split `[0, n)` across rlx_llvm's threads: each runs `body(ctx, start, stop)`.

        The body is emitted once into an outlined function `<thunk>.par<K>(ptr data, i64 chunk, i64
        slot)`; `rlx_parallel` (rlx_llvm's pool, docs/runtime.md) forks and joins (< 1 µs).  Each
        thread gets its own scratch (the body's `ctx.scratch_alloc` is per thread); the caller's
        intermediates stay reachable through `ctx.shared`.  Threads claim chunks
        (about 4 per thread) from a shared counter, so a descheduled thread holds up little; chunks are
        multiples of `grain` (e.g. 64 elements, so chunks start on cache lines); fewer than
        `2·min_work` items, or `set_num_threads(1)`, run on the calling thread with no fork.
        """
        from . import parallel
        parallel.emit_parallel_for(self, n, body, grain, min_work)

    # ── nested schedules ──
    def nested_schedule(self, schedule, name: str) -> tuple[ir.Function, int]:
        """Compile `schedule` (a Scan/CustomFn body) into this module as `i32 @<thunk>.<name>(ptr arena,
        ptr scratch)`, which runs its thunks and returns the first non-zero status; also returns the
        scratch bytes it needs."""
        if self._nest is None:
            raise RuntimeError("nested schedules are compiled from a thunk's own function only")
        return self._nest(schedule, name)

    # ── externals ──
    def declare(self, name: str, fnty: ir.FunctionType) -> ir.Function:
        """Declare an external function once per module."""
        return self._declare(name, fnty)

    def intrinsic(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        """Declare an LLVM intrinsic such as `llvm.fma.v16f32`."""
        return self._declare(name, ir.FunctionType(ret, args))


# ── operands that a parallel body can re-address ─────────────────────────────

@dataclass(frozen=True)
class ArenaRef:
    """An operand at a constant arena offset: it can be re-addressed inside a parallel body."""

    offset: int


@dataclass(frozen=True)
class ScratchRef:
    """An operand at a constant offset of the *shared* scratch (`EmitContext.shared`, where a thunk
    keeps its intermediates): like `ArenaRef`, it can be re-addressed inside a parallel body.
    The offset must come from `scratch_alloc` on a context whose `scratch` is its `shared`
    (the thunk's own context, not a parallel body's per-thread one)."""

    offset: int


Operand = Union[ArenaRef, ScratchRef, ir.Value]  # a GEMM/BLAS operand: a ref or a raw pointer
MovableRef = (ArenaRef, ScratchRef)  # operands a parallel body can re-derive


def pointer(ctx: EmitContext, operand: Operand) -> ir.Value:
    """The operand's address in `ctx` (refs are re-derived from `ctx.arena` / `ctx.shared`)."""
    if isinstance(operand, ArenaRef):
        return ctx.addr(operand.offset)
    if isinstance(operand, ScratchRef):
        return ctx.addr(operand.offset, base=ctx.shared)
    return operand
