"""The IR toolkit every emitter builds with (numba's `cgutils` in spirit): each primitive once.

* **types** — `F16 … PTR`, the arena storage type of each DType, the fast-math flag sets;
* **values** — `vec`, `const`, `splat_like` (constants shaped like a value), `splat` (broadcast a
  run-time scalar), `width_of`, `scalar_of`, `lane_ids`, `transpose_vectors` (a W×W register transpose);
* **index arithmetic** on `Index = ir.Value | int`, folding Python ints (`iadd`, `imul`, `as_value`);
* **memory** — `entry_alloca`, `scratch_ptr`, `copy_bytes`/`zero_bytes` (`llvm.memcpy`/`memset`),
  `prefetch`, masked `load_lanes`/`store_lanes`;
* **control flow** — one counted loop (`counted_loop`; `for_range` without and `carried_loop` with
  values carried between iterations), `vector_loop` (scalar tail), `span_loop` (masked tail),
  `fail_unless` (checked failure), `call_intrinsic`;
* **float lanes** — bf16/f16/f64 ↔ f32 conversions shared by every family.

Functions take the `EmitContext` (`ctx`) when they need the function, the arena or declarations,
and a bare `IRBuilder` (`b`) when they only build instructions.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Sequence, Union

from llvmlite import ir

from ..dtypes import DType

if TYPE_CHECKING:
    from .context import EmitContext

# ── types ───────────────────────────────────────────────────────────────────

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

# Fast-math flags that keep IEEE special values intact (never nnan/ninf: inputs may hold them).
FASTMATH = ("nsz", "contract", "afn", "arcp")
REASSOC = FASTMATH + ("reassoc",)  # also reassociate: independent accumulators, horizontal sums

Index = Union[ir.Value, int]     # an i64 index: a run-time value or a compile-time Python int
Lanes = Union[ir.Value, None]    # a `<W x i1>` lane mask, or None for a full vector


# ── values ──────────────────────────────────────────────────────────────────

def vec(ty: ir.Type, width: int) -> ir.Type:
    """`<width x ty>`, or `ty` itself for width 1."""
    return ty if width == 1 else ir.VectorType(ty, width)


def const(ty: ir.Type, value: float | int, width: int = 1) -> ir.Constant:
    """A scalar constant, or a splat vector of it."""
    if isinstance(ty, (ir.HalfType, ir.FloatType, ir.DoubleType)):
        value = float(value)
    if width == 1:
        return ir.Constant(ty, value)
    return ir.Constant(ir.VectorType(ty, width), [ir.Constant(ty, value)] * width)


def vec_like(like: ir.Value, ty: ir.Type) -> ir.Type:
    """`ty` with as many lanes as `like` (`ty` itself for a scalar)."""
    return vec(ty, width_of(like))


def width_of(value: ir.Value) -> int:
    """Lanes in a value (1 for a scalar)."""
    return value.type.count if isinstance(value.type, ir.VectorType) else 1


def scalar_of(ty: ir.Type) -> ir.Type:
    """Element type of a vector type (the type itself for a scalar)."""
    return ty.element if isinstance(ty, ir.VectorType) else ty


def splat_like(like: ir.Value, value: float | int, ty: ir.Type | None = None) -> ir.Constant:
    """The constant `value` of element type `ty` (default: like's) shaped like `like`."""
    return const(ty or scalar_of(like.type), value, width_of(like))


def fconst(like: ir.Value | ir.Type, value: float) -> ir.Constant:
    """A float constant (splat) of the type of `like` (a value or a type)."""
    ty = like if isinstance(like, ir.Type) else like.type
    return const(scalar_of(ty), value, ty.count if isinstance(ty, ir.VectorType) else 1)


def splat(b: ir.IRBuilder, x: ir.Value, width: int) -> ir.Value:
    """Broadcast a run-time scalar to `width` lanes (the scalar itself for width 1)."""
    if width == 1:
        return x
    vty = ir.VectorType(x.type, width)
    one = b.insert_element(ir.Constant(vty, None), x, I32(0))
    return b.shuffle_vector(one, ir.Constant(vty, None), ir.Constant(ir.VectorType(I32, width), [0] * width))


def transpose_masks(w: int) -> tuple[list[int], list[int]]:
    """The two shuffle masks of one `transpose_vectors` round over W-lane vectors: row i with row
    i + W/2 interleaved, low halves (→ row 2i) and high halves (→ row 2i + 1)."""
    return ([x for j in range(w // 2) for x in (j, w + j)], [x for j in range(w // 2, w) for x in (j, w + j)])


def transpose_vectors(b: ir.IRBuilder, rows: Sequence[ir.Value]) -> list[ir.Value]:
    """The columns of a W×W matrix given as W row vectors of W lanes (W a power of two, any element
    type): log₂W rounds of interleaving row i with row i + W/2 (Eklundh), exact."""
    w, rows = len(rows), list(rows)
    if w == 1:
        return rows
    lo, hi = (ir.Constant(ir.VectorType(I32, w), mask) for mask in transpose_masks(w))
    for _ in range(w.bit_length() - 1):
        rows = [b.shuffle_vector(rows[i], rows[i + w // 2], mask) for i in range(w // 2) for mask in (lo, hi)]
    return rows


def lane_ids(width: int, ty: ir.Type = I64) -> ir.Constant:
    """`<0, 1, …, width-1>` (scalar 0 for width 1)."""
    if width == 1:
        return ir.Constant(ty, 0)
    return ir.Constant(ir.VectorType(ty, width), [ir.Constant(ty, j) for j in range(width)])


def lane_index(b: ir.IRBuilder, first: Index, width: int) -> Index:
    """`<first, first+1, …, first+width-1>` as i64 lanes (`first` itself for width 1)."""
    if width == 1:
        return first
    return b.add(splat(b, as_value(first), width), lane_ids(width))


def is_nan(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """`x != x` lane by lane."""
    return b.fcmp_unordered("uno", x, x)


def vector_registers(lanes: int) -> int:
    """Vector registers of the host whose f32 vectors have `lanes` lanes: 32 with AVX-512 (16 lanes), else 16."""
    return 32 if lanes >= 16 else 16


def sizeof(ty: ir.Type) -> int:
    """Bytes of one element of storage type `ty`."""
    if isinstance(ty, ir.IntType):
        return max(1, ty.width // 8)
    if ty in (F16, F32, F64):
        return {F16: 2, F32: 4, F64: 8}[ty]
    raise TypeError(f"no storage size for {ty}")


# ── index arithmetic ────────────────────────────────────────────────────────

def as_value(x: Index) -> ir.Value:
    """A Python int as an i64 constant; a value unchanged."""
    return I64(x) if isinstance(x, int) else x


def iadd(b: ir.IRBuilder, x: Index, y: Index, flags: tuple[str, ...] = ("nsw",)) -> Index:
    """`x + y` on i64 indices, folding Python ints and zeros."""
    if isinstance(x, int) and isinstance(y, int):
        return x + y
    if isinstance(y, int) and y == 0:
        return x
    if isinstance(x, int) and x == 0:
        return y
    return b.add(as_value(x), as_value(y), flags=flags)


def imul(b: ir.IRBuilder, x: Index, k: int, flags: tuple[str, ...] = ("nsw",)) -> Index:
    """`x · k` on an i64 index and a constant `k`, folding Python ints and k = 1."""
    if isinstance(x, int):
        return x * k
    return x if k == 1 else b.mul(x, I64(k), flags=flags)


def linear(b: ir.IRBuilder, coords: Sequence[Index], strides: Sequence[int]) -> Index:
    """`Σ coords[d] · strides[d]`, folding Python ints."""
    total: Index = 0
    for c, s in zip(coords, strides):
        total = iadd(b, total, imul(b, c, s))
    return total


# ── memory ──────────────────────────────────────────────────────────────────

def entry_alloca(ctx: EmitContext, ty: ir.Type, name: str = "") -> ir.Value:
    """A stack slot in the function's entry block (promoted to registers by SROA)."""
    with ctx.b.goto_entry_block():
        return ctx.b.alloca(ty, name=name)


def scratch_ptr(ctx: EmitContext, offset: int, index: Index = 0, itemsize: int = 1) -> ir.Value:
    """Pointer to element `index` at byte `offset` of this thread's scratch."""
    return ctx.addr(offset, index, itemsize, base=ctx.scratch)


def copy_bytes(ctx: EmitContext, dst: ir.Value, src: ir.Value, nbytes: Index) -> None:
    """`memcpy(dst, src, nbytes)` of non-overlapping bytes (`llvm.memcpy`)."""
    fn = ctx.intrinsic("llvm.memcpy.p0.p0.i64", ir.VoidType(), [PTR, PTR, I64, I1])
    ctx.b.call(fn, [dst, src, as_value(nbytes), I1(0)])


def zero_bytes(ctx: EmitContext, dst: ir.Value, nbytes: int) -> None:
    """`memset(dst, 0, nbytes)` (`llvm.memset`; nothing for 0 bytes)."""
    if nbytes > 0:
        fn = ctx.intrinsic("llvm.memset.p0.i64", ir.VoidType(), [PTR, I8, I64, I1])
        ctx.b.call(fn, [dst, I8(0), I64(nbytes), I1(0)])


def prefetch(ctx: EmitContext, offset: int, index: Index, itemsize: int = 1) -> None:
    """Hint the cache line of element `index` of the slot at `offset` into L1 (`llvm.prefetch`:
    read, keep); the index must lie inside the slot (the address is an inbounds gep)."""
    fn = ctx.intrinsic("llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
    ctx.b.call(fn, [ctx.addr(offset, index, itemsize), I32(0), I32(3), I32(1)])


def load_lanes(ctx: EmitContext, offset: int, ty: ir.Type, index: Index, w: int, mask: Lanes = None,
               base: ir.Value | None = None) -> ir.Value:
    """`ctx.load` of `w` elements, or only the lanes in `mask` (`llvm.masked.load`, others 0)."""
    if mask is None:
        return ctx.load(offset, ty, index, w, base=base)
    vty = vec(ty, w)
    size = sizeof(ty)
    fn = ctx.intrinsic(f"llvm.masked.load.{suffix(vty)}.p0", vty, [PTR, I32, mask.type, vty])
    return ctx.b.call(fn, [ctx.addr(offset, index, size, base), I32(size), mask, ir.Constant(vty, None)])


def store_lanes(ctx: EmitContext, offset: int, value: ir.Value, index: Index, mask: Lanes = None,
                base: ir.Value | None = None) -> None:
    """`ctx.store` of a vector, or only the lanes in `mask` (`llvm.masked.store`)."""
    if mask is None:
        ctx.store(offset, value, index, base=base)
        return
    size = sizeof(scalar_of(value.type))
    fn = ctx.intrinsic(f"llvm.masked.store.{suffix(value.type)}.p0", ir.VoidType(),
                       [value.type, PTR, I32, mask.type])
    ctx.b.call(fn, [value, ctx.addr(offset, index, size, base), I32(size), mask])


# ── intrinsics and checked failure ──────────────────────────────────────────

def suffix(ty: ir.Type) -> str:
    """Intrinsic name suffix: `f32`, `v16f32`, `v8f64`, `i64`."""
    s = scalar_of(ty)
    base = {F16: "f16", F32: "f32", F64: "f64"}[s] if s in (F16, F32, F64) else f"i{s.width}"
    return f"v{ty.count}{base}" if isinstance(ty, ir.VectorType) else base


def call_intrinsic(ctx: EmitContext, name: str, args: Sequence[ir.Value], ret: ir.Type | None = None,
                   fastmath: tuple[str, ...] = ()) -> ir.Value:
    """Call `llvm.<name>.<suffix of the last operand>` (`name` used as is when already suffixed)."""
    full = name if name.count(".") > 1 else f"{name}.{suffix(args[-1].type)}"
    fn = ctx.intrinsic(full, ret or args[-1].type, [a.type for a in args])
    return ctx.b.call(fn, list(args), fastmath=fastmath)


def nan_max(ctx: EmitContext, x: ir.Value, y: ir.Value) -> ir.Value:
    """Rust `f32::max`: the larger operand, ignoring a NaN (`llvm.maxnum`)."""
    return call_intrinsic(ctx, "llvm.maxnum", [x, y])


def nan_min(ctx: EmitContext, x: ir.Value, y: ir.Value) -> ir.Value:
    """Rust `f32::min`: the smaller operand, ignoring a NaN (`llvm.minnum`)."""
    return call_intrinsic(ctx, "llvm.minnum", [x, y])


def sqrt(ctx: EmitContext, x: ir.Value) -> ir.Value:
    """IEEE square root (`llvm.sqrt`, one instruction — not a libm call)."""
    return call_intrinsic(ctx, "llvm.sqrt", [x])


def fail_unless(ctx: EmitContext, ok: ir.Value, status: Index) -> None:
    """Return `status` from the thunk unless `ok` (i1) holds; code continues on the ok path."""
    b = ctx.b
    good = ctx.fn.append_basic_block("ok")
    bad = ctx.fn.append_basic_block("fail")
    b.cbranch(ok, good, bad)
    b.position_at_end(bad)
    ctx.fail(status)
    b.position_at_end(good)


# ── loops ───────────────────────────────────────────────────────────────────

@dataclass
class Loop:
    """An open counted loop: its induction variable and the values carried into this iteration;
    `carry(next)` sets the values the next iteration gets (and, after the loop, `values` are the
    final ones)."""

    index: ir.Value
    values: list[ir.Value]
    next: list[ir.Value] = field(default_factory=list)

    def carry(self, values: Sequence[ir.Value]) -> None:
        """The values the next iteration starts with, one per carried value."""
        if len(values) != len(self.values):
            raise ValueError(f"a loop carrying {len(self.values)} values got {len(values)}")
        self.next = list(values)


@contextlib.contextmanager
def counted_loop(ctx: EmitContext, start: Index, stop: Index, step: int = 1, carried: Sequence[ir.Value] = (),
                 name: str = "i", vectorize: bool = True) -> Iterator[Loop]:
    """The one loop primitive: `for i in range(start, stop, step)` over i64 (signed compare),
    threading `carried` values through phis; the body is emitted inside the `with` block.  With
    `vectorize=False` LLVM's loop vectorizer leaves the loop alone (`no_vectorize`)."""
    b = ctx.b
    pre = b.block
    header = ctx.fn.append_basic_block(f"{name}.header")
    body = ctx.fn.append_basic_block(f"{name}.body")
    done = ctx.fn.append_basic_block(f"{name}.done")
    b.branch(header)
    b.position_at_end(header)
    i = b.phi(I64, name=name)
    i.add_incoming(as_value(start), pre)
    phis = []
    for v in carried:
        p = b.phi(v.type)
        p.add_incoming(v, pre)
        phis.append(p)
    b.cbranch(b.icmp_signed("<", i, as_value(stop)), body, done)
    b.position_at_end(body)
    loop = Loop(i, list(phis))
    yield loop
    if phis and not loop.next:
        raise ValueError("a loop with carried values needs loop.carry(next values)")
    i.add_incoming(b.add(i, I64(step), name=f"{name}.next", flags=("nsw",)), b.block)
    for p, v in zip(phis, loop.next):
        p.add_incoming(v, b.block)
    latch = b.branch(header)
    if not vectorize:
        latch.set_metadata("llvm.loop", no_vectorize(ctx.module))
    b.position_at_end(done)
    loop.values = phis


def no_vectorize(module: ir.Module) -> ir.MDValue:
    """The module's loop ID `!{self, !{"llvm.loop.vectorize.enable", i1 false}}` (one per module).

    For sequential scans whose vectorized form buys nothing: LLVM 22's loop vectorizer, as built
    into llvmlite (assertions on), aborts the process on some of them — a carried index/sum scan of
    76–78 iterations on znver5 fails `computeBestVF`'s "VPlan cost model and legacy cost model
    disagreed" (docs/architecture.md)."""
    cached = getattr(module, "_rlx_no_vectorize", None)
    if cached is None:
        option = module.add_metadata([ir.MetaDataString(module, "llvm.loop.vectorize.enable"), ir.Constant(I1, 0)])
        cached = ir.MDValue(module, [], name=str(len(module.metadata)))
        cached.operands = (cached, option)   # a loop ID names itself
        module._rlx_no_vectorize = cached
    return cached


@contextlib.contextmanager
def for_range(ctx: EmitContext, start: Index, stop: Index, step: int = 1, name: str = "i") -> Iterator[ir.Value]:
    """`for i in range(start, stop, step)` over i64; yields the induction variable."""
    with counted_loop(ctx, start, stop, step, (), name) as loop:
        yield loop.index


def carried_loop(ctx: EmitContext, start: Index, stop: Index, step: int, init: Sequence[ir.Value],
                 body: Callable[[ir.Value, list[ir.Value]], Sequence[ir.Value]], name: str = "r",
                 vectorize: bool = True) -> list[ir.Value]:
    """`for i in range(start, stop, step): vals = body(i, vals)`; returns the final `vals`."""
    with counted_loop(ctx, start, stop, step, init, name, vectorize) as loop:
        loop.carry(body(loop.index, list(loop.values)))
    return loop.values


def vector_loop(ctx: EmitContext, n: int, body: Callable[[ir.Value, int], None], width: int | None = None,
                name: str = "i") -> None:
    """Run `body(i, W)` over [0, n - n % W) in steps of W, then `body(i, 1)` over the scalar tail."""
    w = width or ctx.lanes
    main = n - n % w if w > 1 else 0
    if main:
        with for_range(ctx, 0, main, w, name=f"{name}.vec") as i:
            body(i, w)
    if n - main:
        with for_range(ctx, main, n, 1, name=f"{name}.tail") as i:
            body(i, 1)


def span_loop(ctx: EmitContext, start: Index, stop: Index, body: Callable[[ir.Value, int, Lanes], None],
              width: int | None = None, name: str = "s") -> None:
    """W-wide steps over the run-time range `[start, stop)`: `body(i, W, None)` for whole
    vectors, then once `body(i, W, mask)` for the remaining < W elements (masked loads/stores,
    so even a 3-wide range runs as one vector and nothing past `stop` is touched)."""
    b = ctx.b
    w = width or ctx.lanes
    start, stop = as_value(start), as_value(stop)
    vec_stop = b.add(start, b.and_(b.sub(stop, start), I64(~(w - 1))))  # w is a power of two
    with for_range(ctx, start, vec_stop, w, name=f"{name}.vec") as i:
        body(i, w, None)
    with b.if_then(b.icmp_signed("<", vec_stop, stop)):
        count = b.sub(stop, vec_stop)
        body(vec_stop, w, b.icmp_signed("<", lane_ids(w), splat(b, count, w)))


# ── float lanes: bf16 / f16 / f64 ↔ f32 ────────────────────────────────────

def bf16_bits_to_f32(b: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """bf16 bit pattern (i16) → f32: the bits are the top half of the f32 (exact).

    A NaN also gets its quiet bit set, as Rust `half::bf16::to_f32` does.
    """
    wide = b.zext(bits, vec_like(bits, I32))
    nan = b.icmp_unsigned(">", b.and_(wide, splat_like(wide, 0x7FFF)), splat_like(wide, 0x7F80))
    wide = b.select(nan, b.or_(wide, splat_like(wide, 0x40)), wide)
    return b.bitcast(b.shl(wide, splat_like(wide, 16)), vec_like(bits, F32))


def f32_to_bf16_bits(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """f32 → bf16 bits, round to nearest even; NaN keeps its top bits and gets the quiet bit.

    Integer trick `(u + 0x7FFF + ((u >> 16) & 1)) >> 16`, exact for all 2^32 inputs (denormals
    included — `fptrunc → bfloat` would flush them on AVX512-BF16 hardware).
    """
    u = b.bitcast(x, vec_like(x, I32))
    lsb = b.and_(b.lshr(u, splat_like(u, 16)), splat_like(u, 1))
    rounded = b.lshr(b.add(b.add(u, splat_like(u, 0x7FFF)), lsb), splat_like(u, 16))
    quiet = b.or_(b.lshr(u, splat_like(u, 16)), splat_like(u, 0x40))
    nan = b.icmp_unsigned(">", b.and_(u, splat_like(u, 0x7FFFFFFF)), splat_like(u, 0x7F800000))
    return b.trunc(b.select(nan, quiet, rounded), vec_like(x, I16))


# How each float lane converts to and from f32: (widen, narrow).  f16 narrows by F16C (RNE, exact),
# bf16 by the RNE bit trick, f64 widens exactly.
_LANE_CASTS: dict[DType, tuple[Callable, Callable]] = {
    DType.F32: (lambda b, x: x, lambda b, x: x),
    DType.F16: (lambda b, x: b.fpext(x, vec_like(x, F32)), lambda b, x: b.fptrunc(x, vec_like(x, F16))),
    DType.BF16: (bf16_bits_to_f32, f32_to_bf16_bits),
    DType.F64: (lambda b, x: b.fptrunc(x, vec_like(x, F32)), lambda b, x: b.fpext(x, vec_like(x, F64))),
}


def _lane_casts(dtype: DType) -> tuple[Callable, Callable]:
    if dtype not in _LANE_CASTS:
        raise TypeError(f"{dtype} is not a float lane")
    return _LANE_CASTS[dtype]


def widen_to_f32(b: ir.IRBuilder, dtype: DType, raw: ir.Value) -> ir.Value:
    """A stored float lane (f32/f16/bf16/f64) as f32."""
    return _lane_casts(dtype)[0](b, raw)


def narrow_from_f32(b: ir.IRBuilder, dtype: DType, x: ir.Value) -> ir.Value:
    """f32 → stored float lane: f16 by F16C (RNE, exact), bf16 by the RNE bit trick, f64 exact."""
    return _lane_casts(dtype)[1](b, x)
