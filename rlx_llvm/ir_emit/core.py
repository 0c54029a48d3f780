"""Shared emitter machinery: LLVM types, the per-thunk EmitContext, loops and lane access.

An emitter gets an `EmitContext` positioned in the entry block of
`i32 @t<N>_<kind>(ptr %arena, ptr %scratch)` and writes the thunk's body; returning from the
emitter returns status 0 (`ctx.fail(code)` returns a non-zero status that `Program.run` raises as
ExecutionError).  `%scratch` is Program-owned memory, one buffer per calling thread, sized at
compile time from every thunk's `ctx.scratch_alloc` requests (thunks run one after another, so
each thunk's scratch starts at offset 0).  Offsets are
compile-time constants, so every address is `gep i8, ptr %arena, i64 <const + index·size>`
(never ptrtoint/inttoptr: LLVM 22 can miscompile that pattern while unrolling).
"""
from __future__ import annotations

import contextlib
import re
from typing import Callable, Iterator

from llvmlite import ir

from ..dtypes import DType, LaneKind

F16 = ir.HalfType()
F32 = ir.FloatType()
F64 = ir.DoubleType()
I1 = ir.IntType(1)
I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()

# Storage type of each DType in the arena (bf16 is carried as its i16 bit pattern; C64 as f32 pairs).
STORAGE: dict[DType, ir.Type] = {
    DType.F32: F32, DType.F16: F16, DType.BF16: I16, DType.F64: F64, DType.I8: I8, DType.I16: I16,
    DType.I32: I32, DType.I64: I64, DType.U8: I8, DType.U32: I32, DType.Bool: I8,
}

# Outputs at least this large are written with non-temporal stores (they cannot stay in the
# 32 MiB L3 anyway, and streaming skips the read-for-ownership of every line: ~1/3 less traffic).
STREAM_BYTES = 8 << 20

# Fast-math flags that keep IEEE special values intact (never nnan/ninf: inputs may hold them).
FASTMATH = ("nsz", "contract", "afn", "arcp")


def snake(name: str) -> str:
    """`LayerNorm` → `layer_norm`, `CastF32ToBf16` → `cast_f32_to_bf16`."""
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name)
    s = re.sub(r"(?<=[A-Z])([A-Z][a-z])", r"_\1", s)
    return s.lower()


def vec(ty: ir.Type, width: int) -> ir.Type:
    """`<width x ty>`, or `ty` itself for width 1."""
    return ty if width == 1 else ir.VectorType(ty, width)


def const(ty: ir.Type, value, width: int = 1) -> ir.Constant:
    """A scalar constant, or a splat vector of it."""
    if width == 1:
        return ir.Constant(ty, value)
    return ir.Constant(ir.VectorType(ty, width), [ir.Constant(ty, value)] * width)


def splat_like(value: ir.Value, ty: ir.Type, c) -> ir.Constant:
    """A constant of element type `ty` shaped like `value` (scalar or vector)."""
    t = value.type
    return const(ty, c, t.count if isinstance(t, ir.VectorType) else 1)


def width_of(value: ir.Value) -> int:
    """Lanes in a value (1 for a scalar)."""
    return value.type.count if isinstance(value.type, ir.VectorType) else 1


FIELD_STRIDE = 1 << 40  # virtual arena offsets of a shared body: buffer k starts at k·FIELD_STRIDE


def _alignment(offset: int, itemsize: int) -> int:
    if offset == 0:
        return itemsize
    return min(itemsize, offset & -offset)


class EmitContext:
    """What an emitter needs: the builder, the arena pointer, loop and lane helpers."""

    def __init__(self, module: ir.Module, fn: ir.Function, index: int, thunk, schedule, lanes: int,
                 declare: Callable[[str, ir.FunctionType], ir.Function],
                 arena: ir.Value | None = None, scratch: ir.Value | None = None,
                 builder: ir.IRBuilder | None = None, shared: ir.Value | None = None,
                 fields: bool = False) -> None:
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
            with self.b.goto_entry_block():
                slot = self.b.gep(self.arena, [I64(8 * k)], source_etype=I8, inbounds=True)
                ptr = self.b.load(slot, typ=PTR, align=8)
                ptr.set_metadata("invariant.load", self.module.add_metadata([]))
            self._field_ptrs[k] = ptr
        return self._field_ptrs[k], byte

    def load(self, offset: int, ty: ir.Type, index: "ir.Value | int", width: int = 1,
             base: ir.Value | None = None) -> ir.Value:
        """Load `width` consecutive elements of storage type `ty` (scalar when width is 1)."""
        size = _sizeof(ty)
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
        size = _sizeof(ty)
        width = width_of(value)
        if streaming and width > 1:
            st = self.b.store(value, self.addr(offset, index, size, base), align=min(size * width, 64))
            st.set_metadata("nontemporal", self.module.add_metadata([I32(1)]))
            self._streamed = True
            return
        self.b.store(value, self.addr(offset, index, size, base), align=_alignment(offset, size))

    def fail(self, status: "ir.Value | int") -> None:
        """Return a non-zero status now (e.g. LAPACK's info); Program.run raises ExecutionError."""
        self.b.ret(I32(status) if isinstance(status, int) else status)

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
    @contextlib.contextmanager
    def for_range(self, start: "int | ir.Value", stop: "int | ir.Value", step: int = 1,
                  name: str = "i") -> Iterator[ir.Value]:
        """`for i in range(start, stop, step)` over i64; yields the induction variable."""
        b = self.b
        start = I64(start) if isinstance(start, int) else start
        stop = I64(stop) if isinstance(stop, int) else stop
        pre = b.block
        header = self.fn.append_basic_block(f"{name}.header")
        body = self.fn.append_basic_block(f"{name}.body")
        done = self.fn.append_basic_block(f"{name}.done")
        b.branch(header)
        b.position_at_end(header)
        i = b.phi(I64, name=name)
        i.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", i, stop), body, done)
        b.position_at_end(body)
        yield i
        nxt = b.add(i, I64(step), name=f"{name}.next", flags=("nsw",))
        i.add_incoming(nxt, b.block)
        b.branch(header)
        b.position_at_end(done)

    def vector_loop(self, n: int, body: Callable[[ir.Value, int], None], width: int | None = None,
                    name: str = "i") -> None:
        """Run `body(i, W)` over [0, n - n % W) in steps of W, then `body(i, 1)` over the tail."""
        w = width or self.lanes
        main = n - n % w if w > 1 else 0
        if main:
            with self.for_range(0, main, w, name=f"{name}.vec") as i:
                body(i, w)
        if n - main:
            with self.for_range(main, n, 1, name=f"{name}.tail") as i:
                body(i, 1)

    def note_path(self, path: str) -> None:
        """Record how this thunk's code actually runs (e.g. a GEMM chose IR tiles over a BLAS call);
        `Program.report()` shows "blas" if any BLAS call was emitted, else "llvm"."""
        self.paths.add(path)

    # ── threads ──
    def parallel_for(self, n: int, body: Callable[["EmitContext", ir.Value, ir.Value], None],
                     grain: int = 1, min_work: int = 1) -> None:
        """Split `[0, n)` across rlx_llvm's threads: each runs `body(ctx, start, stop)`.

        The body is emitted once into an outlined function `<thunk>.par<K>(ptr data)` that takes
        its share from `omp_get_thread_num()`; `GOMP_parallel` forks and joins (a few µs).  Each
        thread gets its own scratch (the body's `ctx.scratch_alloc` is per thread); the caller's
        intermediates stay reachable through `ctx.shared`.  Threads claim chunks
        (about 4 per thread) from a shared counter, so a descheduled thread holds up little; chunks are
        multiples of `grain` (e.g. 64 elements, so chunks start on cache lines); fewer than
        `2·min_work` items, or `set_num_threads(1)`, run on the calling thread with no fork.
        """
        from . import parallel
        parallel.emit_parallel_for(self, n, body, grain, min_work)

    # ── externals ──
    def declare(self, name: str, fnty: ir.FunctionType) -> ir.Function:
        """Declare an external function once per module."""
        return self._declare(name, fnty)

    def intrinsic(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        """Declare an LLVM intrinsic such as `llvm.fma.v16f32`."""
        return self._declare(name, ir.FunctionType(ret, args))


def _sizeof(ty: ir.Type) -> int:
    if isinstance(ty, ir.IntType):
        return max(1, ty.width // 8)
    return {F16: 2, F32: 4, F64: 8}[ty] if ty in (F16, F32, F64) else _bad(ty)


def _bad(ty):
    raise TypeError(f"no storage size for {ty}")


# ── float conversions shared by every family ────────────────────────────────

def _retype(value: ir.Value, ty: ir.Type) -> ir.Type:
    return vec(ty, width_of(value))


def bf16_bits_to_f32(b: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """bf16 bit pattern (i16) → f32: the bits are the top half of the f32 (exact).

    A NaN also gets its quiet bit set, as Rust `half::bf16::to_f32` does.
    """
    wide = b.zext(bits, _retype(bits, I32))
    nan = b.icmp_unsigned(">", b.and_(wide, splat_like(wide, I32, 0x7FFF)), splat_like(wide, I32, 0x7F80))
    wide = b.select(nan, b.or_(wide, splat_like(wide, I32, 0x40)), wide)
    return b.bitcast(b.shl(wide, splat_like(wide, I32, 16)), _retype(bits, F32))


def f32_to_bf16_bits(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """f32 → bf16 bits, round to nearest even; NaN keeps its top bits and gets the quiet bit.

    Integer trick `(u + 0x7FFF + ((u >> 16) & 1)) >> 16`, exact for all 2^32 inputs (denormals
    included — `fptrunc → bfloat` would flush them on AVX512-BF16 hardware).
    """
    u = b.bitcast(x, _retype(x, I32))
    lsb = b.and_(b.lshr(u, splat_like(u, I32, 16)), splat_like(u, I32, 1))
    rounded = b.lshr(b.add(b.add(u, splat_like(u, I32, 0x7FFF)), lsb), splat_like(u, I32, 16))
    quiet = b.or_(b.lshr(u, splat_like(u, I32, 16)), splat_like(u, I32, 0x40))
    is_nan = b.icmp_unsigned(">", b.and_(u, splat_like(u, I32, 0x7FFFFFFF)), splat_like(u, I32, 0x7F800000))
    return b.trunc(b.select(is_nan, quiet, rounded), _retype(x, I16))


def widen_to_f32(b: ir.IRBuilder, dtype: DType, raw: ir.Value) -> ir.Value:
    """A stored float lane (f32/f16/bf16/f64) as f32."""
    if dtype is DType.F32:
        return raw
    if dtype is DType.F16:
        return b.fpext(raw, _retype(raw, F32))
    if dtype is DType.BF16:
        return bf16_bits_to_f32(b, raw)
    if dtype is DType.F64:
        return b.fptrunc(raw, _retype(raw, F32))
    raise TypeError(f"{dtype} is not a float lane")


def narrow_from_f32(b: ir.IRBuilder, dtype: DType, x: ir.Value) -> ir.Value:
    """f32 → stored float lane: f16 by F16C (RNE, exact), bf16 by the RNE bit trick, f64 exact."""
    if dtype is DType.F32:
        return x
    if dtype is DType.F16:
        return b.fptrunc(x, _retype(x, F16))
    if dtype is DType.BF16:
        return f32_to_bf16_bits(b, x)
    if dtype is DType.F64:
        return b.fpext(x, _retype(x, F64))
    raise TypeError(f"{dtype} is not a float lane")
