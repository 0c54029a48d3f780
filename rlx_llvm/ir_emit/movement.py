"""Data movement: Narrow, Reverse, Transpose/TransposeF64, Concat/ConcatF64, KvAppend,
ResizeNearest2x, Interpolate3d, Im2Col (semantics.md §3.5; docs/lowering-movement.md).

Every kernel is planned at compile time from the thunk's shape fields: axes are simplified
(size-1 axes dropped, axes that stay contiguous on both sides merged), then the innermost axis
decides the code — contiguous runs become `llvm.memcpy` with a constant size (or a loop of
64-byte vector loads and non-temporal stores when the output is ≥ `STREAM_BYTES` and every run
starts on a cache line), a stride-0 run becomes a splat store, and a strided run becomes a tiled
in-register transpose.  Elements are moved as integers of their width (byte-generic), so NaN
payloads and non-float dtypes go through untouched.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from .context import STREAM_BYTES, EmitContext
from .toolkit import (F32, I32, I64, Index, as_value, copy_bytes, iadd, imul, linear, prefetch, splat, transpose_vectors,
                      zero_bytes)
from ..registry import lowering

ELEM_BYTES = (1, 2, 4, 8, 16)  # element widths the byte-generic kernels move
LINE = 64                      # cache line = one full AVX-512 register
LINE_VEC = ir.VectorType(I64, LINE // 8)
TILE_BAND = 4                  # register tiles per band of the tiled transpose (measured: 4 is best)
PREFETCH_BYTES = 12 << 10      # streamed row copies prefetch this far ahead (measured: 8–12 KiB)


# ── shapes ──────────────────────────────────────────────────────────────────

def row_major(dims: Sequence[int]) -> list[int]:
    """Row-major element strides of `dims`."""
    strides, acc = [], 1
    for d in reversed(dims):
        strides.append(acc)
        acc *= d
    return strides[::-1]


def prod(xs: Sequence[int]) -> int:
    """Product of a sequence (1 when empty)."""
    return math.prod(xs)


# ── element access and copies ───────────────────────────────────────────────

def lane_type(nbytes: int) -> ir.IntType:
    """The integer type that moves one `nbytes`-wide element."""
    return ir.IntType(8 * nbytes)


def byte_ptr(ctx: EmitContext, offset: int, byte: Index = 0) -> ir.Value:
    """Pointer to arena byte `offset + byte`."""
    return ctx.addr(offset, byte, 1)


def load_elem(ctx: EmitContext, offset: int, index: Index, nbytes: int, width: int = 1) -> ir.Value:
    """Load `width` elements of `nbytes` each at element `index` of the slot at `offset`."""
    return ctx.load(offset, lane_type(nbytes), index, width)


def store_elem(ctx: EmitContext, offset: int, value: ir.Value, index: Index, streaming: bool = False) -> None:
    """Store element(s) at element `index` of the slot at `offset`."""
    ctx.store(offset, value, index, streaming=streaming)


def rows_ahead(row_bytes: int) -> int:
    """How many rows of `row_bytes` ahead a streamed copy prefetches (≈ PREFETCH_BYTES)."""
    return max(1, -(-PREFETCH_BYTES // max(1, row_bytes)))


def clamped_ahead(b: ir.IRBuilder, i: ir.Value, distance: int, count: int) -> ir.Value:
    """`min(i + distance, count − 1)`: a future loop index that stays inside the slot."""
    nxt = b.add(i, I64(distance))
    return b.select(b.icmp_signed("<", nxt, I64(count)), nxt, I64(count - 1))


def copy_run(ctx: EmitContext, dst: int, dst_byte: Index, src: int, src_byte: Index, nbytes: int,
             streaming: bool = False, ahead: "tuple[int, Index] | None" = None) -> None:
    """Copy `nbytes` (a constant) from arena byte `src + src_byte` to `dst + dst_byte`.

    `streaming=True` moves whole cache lines with 64-byte loads and non-temporal stores; the
    caller guarantees that `dst + dst_byte` is 64-byte aligned.  Otherwise one `llvm.memcpy`
    (inlined for small sizes, libc's memcpy for large ones).
    """
    if nbytes <= 0:
        return
    b = ctx.b
    lines = nbytes - nbytes % LINE
    if not streaming or lines == 0:
        copy_bytes(ctx, byte_ptr(ctx, dst, dst_byte), byte_ptr(ctx, src, src_byte), nbytes)
        return
    with ctx.for_range(0, lines, LINE, name="line") as k:
        if ahead is not None:
            prefetch(ctx, ahead[0], iadd(b, ahead[1], k))
        v = b.load(byte_ptr(ctx, src, iadd(b, src_byte, k)), typ=LINE_VEC, align=1)
        ctx.store(0, v, 0, streaming=True, base=byte_ptr(ctx, dst, iadd(b, dst_byte, k)))
    if nbytes > lines:
        copy_bytes(ctx, byte_ptr(ctx, dst, iadd(b, dst_byte, lines)), byte_ptr(ctx, src, iadd(b, src_byte, lines)),
               nbytes - lines)


def shuffle(b: ir.IRBuilder, x: ir.Value, y: ir.Value, mask: Sequence[int]) -> ir.Value:
    """`shufflevector x, y, mask`."""
    return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, len(mask)), list(mask)))


def vector_lanes(nbytes: int) -> int:
    """Elements of `nbytes` per 64-byte register."""
    return max(1, LINE // nbytes)


def fill_run(ctx: EmitContext, dst: int, dst_elem: Index, value: ir.Value, count: int, nbytes: int,
             streaming: bool = False) -> None:
    """Store `value` (one element) `count` times from element `dst_elem` of `dst` on."""
    if count <= 0:
        return
    b = ctx.b
    w = vector_lanes(nbytes)
    wide = splat(b, value, w)

    def body(i: ir.Value, width: int) -> None:
        store_elem(ctx, dst, wide if width > 1 else value, iadd(b, dst_elem, i), streaming and width * nbytes == LINE)

    ctx.vector_loop(count, body, width=w, name="fill")


def loop_nest(ctx: EmitContext, dims: Sequence[int], body: Callable[[list[ir.Value]], None],
              name: str = "d") -> None:
    """`for` loops over `dims` (row-major order); `body(coords)` runs innermost.

    The outer axes run as one flat loop whose index is split into coordinates (udiv/urem by
    constants, once per innermost run) and the last axis as its own loop: a deep nest of small
    constant trip counts would otherwise be unrolled completely and blow up compile time.
    """
    b = ctx.b
    if not dims:
        body([])
        return
    outer, inner = list(dims[:-1]), dims[-1]

    def innermost(coords: list[ir.Value]) -> None:
        with ctx.for_range(0, inner, name=f"{name}.in") as c:
            body(coords + [c])

    if not outer:
        innermost([])
        return
    if len(outer) == 1:
        with ctx.for_range(0, outer[0], name=f"{name}.out") as c:
            innermost([c])
        return
    with ctx.for_range(0, prod(outer), name=f"{name}.flat") as flat:
        innermost(split_index(b, flat, outer))


def split_index(b: ir.IRBuilder, flat: ir.Value, dims: Sequence[int]) -> list[ir.Value]:
    """Row-major coordinates of flat index `flat` over `dims`."""
    coords = []
    for d, stride in zip(dims, row_major(dims)):
        q = b.udiv(flat, I64(stride)) if stride > 1 else flat
        coords.append(b.urem(q, I64(d)) if d != prod(dims) // stride else q)
    return coords


def aligned_to_line(*byte_offsets: int) -> bool:
    """Whether every constant byte offset/stride is a multiple of 64."""
    return all(o % LINE == 0 for o in byte_offsets)


def check_elem_bytes(value: int, field: str = "elem_bytes") -> None:
    """Byte-generic kernels move 1-, 2-, 4-, 8- or 16-byte elements."""
    if value not in ELEM_BYTES:
        raise ValidationError(f"{field} = {value}; the kernel moves elements of {ELEM_BYTES} bytes", field=field)


# ── Narrow, KvAppend ────────────────────────────────────────────────────────

def check_narrow(t) -> None:
    """Element width 1/2/4/8/16; rows may not overlap each other in the output."""
    check_elem_bytes(t.elem_bytes)
    if t.outer > 1 and t.inner > t.dst_stride:
        raise ValidationError(f"inner = {t.inner} > dst_stride = {t.dst_stride}: output rows overlap",
                              field="dst_stride")


@lowering(T.Narrow, check=check_narrow, inplace=True)
def narrow(ctx: EmitContext, t) -> None:
    """`outer` rows of `inner` elements from stride `src_stride` to stride `dst_stride`."""
    eb = t.elem_bytes
    if t.outer == 0 or t.inner == 0 or t.src == t.dst and t.src_stride == t.dst_stride:
        return
    row = t.inner * eb
    if t.outer == 1 or t.src_stride == t.inner == t.dst_stride:
        copy_run(ctx, t.dst, 0, t.src, 0, row + (t.outer - 1) * t.inner * eb)
        return
    streaming = t.outer * row >= STREAM_BYTES and aligned_to_line(t.dst, t.dst_stride * eb)
    b = ctx.b
    with ctx.for_range(0, t.outer, name="row") as o:
        ahead = ((t.src, imul(b, clamped_ahead(b, o, rows_ahead(row), t.outer), t.src_stride * eb))
                 if streaming else None)
        copy_run(ctx, t.dst, imul(b, o, t.dst_stride * eb), t.src, imul(b, o, t.src_stride * eb), row, streaming,
                 ahead)


def check_kv_append(t) -> None:
    """The appended position lies inside the cache."""
    if t.outer and t.inner_bytes and t.pos >= t.seq_cap:
        raise ValidationError(f"pos = {t.pos} is not below seq_cap = {t.seq_cap}", field="pos")


@lowering(T.KvAppend, check=check_kv_append)
def kv_append(ctx: EmitContext, t) -> None:
    """Row `o` of `src` (`inner_bytes`) lands at byte `(o·seq_cap + pos)·inner_bytes` of `dst`."""
    if t.outer == 0 or t.inner_bytes == 0:
        return
    n = t.inner_bytes
    if t.outer == 1:
        copy_run(ctx, t.dst, t.pos * n, t.src, 0, n)
        return
    with ctx.for_range(0, t.outer, name="head") as o:
        copy_run(ctx, t.dst, iadd(ctx.b, imul(ctx.b, o, t.seq_cap * n), t.pos * n), t.src, imul(ctx.b, o, n), n)


# ── Transpose / TransposeF64 (and Expand: stride-0 axes) ────────────────────

@dataclass(frozen=True)
class Walk:
    """A simplified output walk: `dims[d]` output extent, `strides[d]` input element stride."""

    dims: tuple[int, ...]
    strides: tuple[int, ...]

    @property
    def max_source(self) -> int:
        """Largest input element index the walk reads."""
        return sum((d - 1) * s for d, s in zip(self.dims, self.strides))


def simplify_walk(dims: Sequence[int], strides: Sequence[int]) -> Walk | None:
    """Drop size-1 axes and merge axes that stay contiguous in the input; None when empty."""
    if any(d == 0 for d in dims):
        return None
    merged: list[tuple[int, int]] = []
    for d, s in zip(dims, strides):
        if d == 1:
            continue
        if merged and merged[-1][1] == s * d:
            merged[-1] = (merged[-1][0] * d, s)
        else:
            merged.append((d, s))
    return Walk(tuple(d for d, _ in merged), tuple(s for _, s in merged))


def check_transpose(t) -> None:
    """One stride per output axis; the walk reads inside `in_total` (or wraps modulo it)."""
    eb = transpose_elem_bytes(t)
    check_elem_bytes(eb)
    if len(t.out_dims) != len(t.in_strides):
        raise ValidationError(f"{len(t.out_dims)} out_dims but {len(t.in_strides)} in_strides", field="in_strides")
    if prod(t.out_dims) and t.in_total == 0:
        raise ValidationError("in_total = 0 but the output is not empty", field="in_total")


def transpose_elem_bytes(t) -> int:
    """4/8/… for Transpose (`elem_bytes`), 8 for TransposeF64."""
    return getattr(t, "elem_bytes", 8)


@lowering(T.Transpose, T.TransposeF64, check=check_transpose)
def transpose(ctx: EmitContext, t) -> None:
    """`dst[flat(out coords)] = src[Σ coord_d · in_strides[d]]` (mod `in_total` if it would overflow)."""
    emit_walk(ctx, t.src, t.dst, t.in_total, tuple(t.out_dims), tuple(t.in_strides), transpose_elem_bytes(t))


def emit_walk(ctx: EmitContext, src: int, dst: int, in_total: int, dims: Sequence[int], strides: Sequence[int],
              eb: int) -> None:
    """Pick the kernel for an N-D index walk: row copies, splats, tiled transpose or element gather."""
    if eb == 16:  # a 16-byte element is two 8-byte words: one more contiguous axis
        dims, strides, in_total, eb = (*dims, 2), (*(2 * s for s in strides), 1), 2 * in_total, 8
    walk = simplify_walk(dims, strides)
    if walk is None:
        return
    if walk.max_source >= in_total:
        return gather_walk(ctx, src, dst, walk, eb, modulo=in_total)
    if not walk.dims:
        copy_run(ctx, dst, 0, src, 0, eb)
        return
    total_bytes = prod(walk.dims) * eb
    stream = total_bytes >= STREAM_BYTES
    last = walk.strides[-1]
    if last == 1:
        return row_copy_walk(ctx, src, dst, walk, eb, stream)
    if last == 0:
        return splat_walk(ctx, src, dst, walk, eb, stream)
    k = tile_axis(walk, eb)
    if k is None:
        return gather_walk(ctx, src, dst, walk, eb)
    tiled_walk(ctx, src, dst, walk, k, eb, stream)


def row_copy_walk(ctx: EmitContext, src: int, dst: int, walk: Walk, eb: int, stream: bool) -> None:
    """Innermost axis contiguous on both sides: one copy of `dims[-1]` elements per outer index."""
    b = ctx.b
    row = walk.dims[-1] * eb
    outer = walk.dims[:-1]
    streaming = stream and aligned_to_line(dst, row)

    def body(coords: list[ir.Value]) -> None:
        out_row = linear(b, coords, row_major(outer))
        ahead = None
        if streaming and coords:  # a later row along the innermost outer axis
            later = coords[:-1] + [clamped_ahead(b, coords[-1], rows_ahead(row), outer[-1])]
            ahead = (src, imul(b, linear(b, later, walk.strides[:-1]), eb))
        copy_run(ctx, dst, imul(b, out_row, row), src, imul(b, linear(b, coords, walk.strides[:-1]), eb), row,
                 streaming, ahead)

    loop_nest(ctx, outer, body, name="row")


def splat_walk(ctx: EmitContext, src: int, dst: int, walk: Walk, eb: int, stream: bool) -> None:
    """Innermost axis broadcast (stride 0): each outer index splats one element over the run."""
    b = ctx.b
    n = walk.dims[-1]
    outer = walk.dims[:-1]
    streaming = stream and aligned_to_line(dst, n * eb)

    def body(coords: list[ir.Value]) -> None:
        value = load_elem(ctx, src, linear(b, coords, walk.strides[:-1]), eb)
        fill_run(ctx, dst, imul(b, linear(b, coords, row_major(outer)), n), value, n, eb, streaming)

    loop_nest(ctx, outer, body, name="bc")


def gather_walk(ctx: EmitContext, src: int, dst: int, walk: Walk, eb: int, modulo: int = 0) -> None:
    """Element-by-element walk (no unit-stride axis to tile on), reduced mod `modulo` if non-zero."""
    b = ctx.b
    dims = walk.dims or (1,)
    strides = walk.strides or (0,)
    out_strides = row_major(dims)

    def body(coords: list[ir.Value]) -> None:
        source = as_value(linear(b, coords, strides))
        if modulo:
            source = b.urem(source, I64(modulo))
        store_elem(ctx, dst, load_elem(ctx, src, source, eb), linear(b, coords, out_strides))

    loop_nest(ctx, dims, body, name="el")


def tile_size(eb: int) -> int:
    """Edge of the square register tile: one 64-byte register per row (16 for ≤ 4-byte elements)."""
    return min(16, vector_lanes(eb))


def tile_axis(walk: Walk, eb: int) -> int | None:
    """The output axis that is contiguous in the input, if tiling with it pays off."""
    t = tile_size(eb)
    if len(walk.dims) < 2 or walk.dims[-1] < t:
        return None
    for k in range(len(walk.dims) - 2, -1, -1):
        if walk.strides[k] == 1 and walk.dims[k] >= t:
            return k
    return None


def tiled_walk(ctx: EmitContext, src: int, dst: int, walk: Walk, k: int, eb: int, stream: bool) -> None:
    """Strided innermost axis: T×T register tiles between output axis `k` (input-contiguous) and
    the last axis (output-contiguous), so both sides move whole 64-byte rows.  Extents that are
    not multiples of T end with a tile shifted back to overlap its neighbour (both axes are ≥ T):
    it writes some values twice, and no scalar edge loops are needed."""
    b = ctx.b
    t = tile_size(eb)
    last = len(walk.dims) - 1
    a_len, b_len, s = walk.dims[k], walk.dims[last], walk.strides[last]
    out_strides = row_major(walk.dims)
    ok = out_strides[k]
    others = [d for d in range(last) if d != k]
    a_tiles, b_tiles = -(-a_len // t), -(-b_len // t)
    streaming = stream and t * eb == LINE and b_len % t == 0 and \
        aligned_to_line(dst, *(out_strides[d] * eb for d in others + [k]))

    def tile_start(i: ir.Value, length: int) -> ir.Value:
        """`min(i·T, length − T)`: the last tile overlaps instead of running past the end."""
        start = b.mul(i, I64(t))
        return start if length % t == 0 else b.select(b.icmp_signed("<", start, I64(length - t)), start,
                                                       I64(length - t))

    def body(coords: list[ir.Value]) -> None:
        base_in = linear(b, coords, [walk.strides[d] for d in others])
        base_out = linear(b, coords, [out_strides[d] for d in others])

        def band(first_tile: Index, count: int) -> None:
            with ctx.for_range(0, b_tiles, name="tb") as j:
                b0 = tile_start(j, b_len)
                with ctx.for_range(0, count, name="ta") as i:
                    a0 = tile_start(as_value(iadd(b, first_tile, i)), a_len)
                    origin = iadd(b, base_in, iadd(b, a0, imul(b, b0, s)))
                    rows = [load_elem(ctx, src, iadd(b, origin, r * s), eb, t) for r in range(t)]
                    target = iadd(b, base_out, iadd(b, imul(b, a0, ok), b0))
                    for r, vec in enumerate(transpose_vectors(b, rows)):
                        store_elem(ctx, dst, vec, iadd(b, target, r * ok), streaming)

        # A band of TILE_BAND tiles along `a` sweeps all of `b`: each input row is read in
        # 256-byte runs and the band's output rows are written side by side, line by line.
        full = a_tiles - a_tiles % TILE_BAND
        if full:
            with ctx.for_range(0, full, TILE_BAND, name="band") as first:
                band(first, TILE_BAND)
        if a_tiles > full:
            band(full, a_tiles - full)

    loop_nest(ctx, [walk.dims[d] for d in others], body, name="tile")


# ── Reverse ─────────────────────────────────────────────────────────────────

def check_reverse(t) -> None:
    """One flag per axis; element width 1/2/4/8/16."""
    check_elem_bytes(t.elem_bytes)
    if len(t.dims) != len(t.rev_mask):
        raise ValidationError(f"{len(t.dims)} dims but {len(t.rev_mask)} rev_mask flags", field="rev_mask")


def simplify_flips(dims: Sequence[int], flips: Sequence[bool]) -> tuple[list[int], list[bool]]:
    """Drop size-1 axes; merge neighbours with the same flag (flipping both = flipping the product)."""
    out_d: list[int] = []
    out_f: list[bool] = []
    for d, f in zip(dims, flips):
        if d == 1:
            continue
        if out_f and out_f[-1] == bool(f):
            out_d[-1] *= d
        else:
            out_d.append(d)
            out_f.append(bool(f))
    return out_d, out_f


@lowering(T.Reverse, check=check_reverse)
def reverse(ctx: EmitContext, t) -> None:
    """Flip the axes flagged in `rev_mask`: row copies, or reversed vector rows when the last axis flips."""
    eb = t.elem_bytes
    if prod(t.dims) == 0:
        return
    dims, flips = tuple(t.dims), tuple(t.rev_mask)
    if eb == 16:  # a 16-byte element is two 8-byte words that keep their order
        dims, flips, eb = (*dims, 2), (*flips, False), 8
    dims, flips = simplify_flips(dims, flips)
    if not dims or dims == [dims[0]] and not flips[0]:
        copy_run(ctx, t.dst, 0, t.src, 0, prod(dims) * eb)
        return
    b = ctx.b
    strides = row_major(dims)
    n = dims[-1]
    outer = dims[:-1]
    streaming = prod(dims) * eb >= STREAM_BYTES and aligned_to_line(t.dst, n * eb)

    def body(coords: list[ir.Value]) -> None:
        src_row: Index = 0
        for c, d, s, f in zip(coords, outer, strides, flips):
            src_row = iadd(b, src_row, imul(b, b.sub(I64(d - 1), c) if f else c, s))
        dst_row = linear(b, coords, strides[:-1])
        if not flips[-1]:
            copy_run(ctx, t.dst, imul(b, dst_row, eb), t.src, imul(b, src_row, eb), n * eb,
                     streaming and n * eb >= LINE)
        else:
            reversed_row(ctx, t.src, src_row, t.dst, dst_row, n, eb, streaming)

    loop_nest(ctx, outer, body, name="rev")


def reversed_row(ctx: EmitContext, src: int, src_row: Index, dst: int, dst_row: Index, n: int, eb: int,
                 streaming: bool) -> None:
    """`dst[dst_row + j] = src[src_row + n - 1 - j]` with reversed full-register loads."""
    b = ctx.b
    w = vector_lanes(eb)

    def body(j: ir.Value, width: int) -> None:
        first = iadd(b, src_row, b.sub(I64(n - width), j))
        v = load_elem(ctx, src, first, eb, width)
        if width > 1:
            v = shuffle(b, v, ir.Constant(v.type, None), list(range(width - 1, -1, -1)))
        store_elem(ctx, dst, v, iadd(b, dst_row, j), streaming and width * eb == LINE)

    ctx.vector_loop(n, body, width=w, name="flip")


# ── Concat / ConcatF64 ──────────────────────────────────────────────────────

def concat_elem_bytes(t) -> int:
    """4 for Concat, 8 for ConcatF64."""
    return 8 if type(t).__name__ == "ConcatF64" else 4


def check_concat(t) -> None:
    """The inputs' axis extents sum to `total_axis`."""
    extents = sum(e for _, e, _ in t.inputs)
    if extents != t.total_axis:
        raise ValidationError(f"input extents sum to {extents}, not total_axis = {t.total_axis}", field="inputs")


@lowering(T.Concat, T.ConcatF64, check=check_concat)
def concat(ctx: EmitContext, t) -> None:
    """Output row `o` = the inputs' segments side by side (rank-deficient inputs broadcast over `outer`)."""
    eb = concat_elem_bytes(t)
    row = t.total_axis * t.inner
    if t.outer == 0 or row == 0:
        return
    stream = t.outer * row * eb >= STREAM_BYTES
    segments = []
    cum = 0
    for src, extent, numel in t.inputs:
        seg = extent * t.inner
        if seg:
            segments.append((src, cum * t.inner, seg, numel))
        cum += extent

    def one_row(o: Index) -> None:
        for src, col, seg, numel in segments:
            concat_segment(ctx, t.dst, iadd(ctx.b, imul(ctx.b, o, row), col), src, o, seg, numel, t.outer, eb,
                           stream and aligned_to_line(t.dst, row * eb, col * eb))

    if t.outer == 1:
        one_row(0)
        return
    with ctx.for_range(0, t.outer, name="outer") as o:
        one_row(o)


def concat_segment(ctx: EmitContext, dst: int, dst_elem: Index, src: int, o: Index, seg: int, numel: int,
                   outer: int, eb: int, streaming: bool) -> None:
    """One input's `seg` elements of output row `o`: its own row `o`, a splat of its only element
    (`numel == 1`), or — rank-deficient — its first `seg` elements, the same for every row."""
    b = ctx.b
    if numel == 1 < outer * seg:
        fill_run(ctx, dst, dst_elem, load_elem(ctx, src, 0, eb), seg, eb, streaming)
        return
    own_row = numel >= outer * seg
    ahead = None
    if own_row and streaming and not isinstance(o, int):  # hardware prefetchers stop at page ends
        ahead = (src, b.mul(clamped_ahead(b, o, rows_ahead(seg * eb), outer), I64(seg * eb)))
    copy_run(ctx, dst, imul(b, dst_elem, eb), src, imul(b, o, seg * eb) if own_row else 0, seg * eb, streaming, ahead)


# ── ResizeNearest2x, Interpolate3d ──────────────────────────────────────────

@lowering(T.ResizeNearest2x)
def resize_nearest_2x(ctx: EmitContext, t) -> None:
    """`y[p, 2i+a, 2j+b] = x[p, i, j]` over `n·c` planes of f32 (each input row written twice)."""
    planes_rows, w = t.n * t.c * t.h, t.w
    if planes_rows == 0 or w == 0:
        return
    b = ctx.b
    lanes = 16
    out_w = 2 * w
    streaming = planes_rows * 2 * out_w * 4 >= STREAM_BYTES and aligned_to_line(t.dst, out_w * 4)

    with ctx.for_range(0, planes_rows, name="row") as r:
        src_row = imul(b, r, w)
        top = imul(b, r, 2 * out_w)
        bottom = iadd(b, top, out_w)

        def body(j: ir.Value, width: int) -> None:
            v = ctx.load(t.src, I32, iadd(b, src_row, j), width)
            col = imul(b, j, 2)
            if width == 1:
                for base in (top, bottom):
                    for k in (0, 1):
                        ctx.store(t.dst, v, iadd(b, base, iadd(b, col, k)))
                return
            halves = [shuffle(b, v, v, [i // 2 + h * width // 2 for i in range(width)]) for h in (0, 1)]
            for base in (top, bottom):
                for h, half in enumerate(halves):
                    ctx.store(t.dst, half, iadd(b, base, iadd(b, col, h * width)), streaming=streaming)

        ctx.vector_loop(w, body, width=lanes, name="col")


def nearest_source(b: ir.IRBuilder, out_coord: ir.Value, size_in: int, size_out: int) -> Index:
    """`min(floor(out·in/out_size), in−1)` in exact integer arithmetic."""
    if size_in == size_out:
        return out_coord
    q = b.udiv(b.mul(out_coord, I64(size_in)), I64(size_out))
    return b.select(b.icmp_unsigned("<", q, I64(size_in - 1)), q, I64(size_in - 1))


@lowering(T.Interpolate3d)
def interpolate_3d(ctx: EmitContext, t) -> None:
    """Nearest NCDHW resample: every output voxel reads `src = min(floor(dst·in/out), in−1)` per axis."""
    planes = t.n * t.c
    if not planes or not t.d_out or not t.h_out or not t.w_out:
        return
    if not t.d_in or not t.h_in or not t.w_in:
        return
    b = ctx.b
    with ctx.for_range(0, planes, name="p") as p:
        with ctx.for_range(0, t.d_out, name="od") as od:
            sd = nearest_source(b, od, t.d_in, t.d_out)
            with ctx.for_range(0, t.h_out, name="oh") as oh:
                sh = nearest_source(b, oh, t.h_in, t.h_out)
                src_row = linear(b, [p, sd, sh], [t.d_in * t.h_in * t.w_in, t.h_in * t.w_in, t.w_in])
                dst_row = linear(b, [p, od, oh], [t.d_out * t.h_out * t.w_out, t.h_out * t.w_out, t.w_out])
                resample_row(ctx, t.src, src_row, t.dst, dst_row, t.w_in, t.w_out)


def resample_row(ctx: EmitContext, src: int, src_row: Index, dst: int, dst_row: Index, w_in: int, w_out: int
                 ) -> None:
    """One output row of nearest samples along w (a plain copy when the width is unchanged)."""
    b = ctx.b
    if w_in == w_out:
        copy_run(ctx, dst, imul(b, dst_row, 4), src, imul(b, src_row, 4), w_out * 4)
        return
    with ctx.for_range(0, w_out, name="ow") as ow:
        sw = nearest_source(b, ow, w_in, w_out)
        ctx.store(dst, ctx.load(src, I32, iadd(b, src_row, sw)), iadd(b, dst_row, ow))


# ── Im2Col ──────────────────────────────────────────────────────────────────

def im2col_batch(t) -> int:
    """The batch: `n`, or 1 when `n == 0` ("infer from x": the slot holds one image here)."""
    return t.n or 1


@lowering(T.Im2Col)
def im2col(ctx: EmitContext, t) -> None:
    """`col[m, (c·kh + i)·kw + j] = x[nb, c, oh·sh − ph + i·dh, ow·sw − pw + j·dw]` (0 outside the image)."""
    n = im2col_batch(t)
    rows = n * t.h_out * t.w_out
    k_len = t.c_in * t.kh * t.kw
    if rows == 0 or k_len == 0:
        return
    if t.h == 0 or t.w == 0:  # no pixels: every column entry is padding
        zero_bytes(ctx, ctx.addr(t.col), rows * k_len * 4)
        return
    b = ctx.b
    zero = ir.Constant(F32, 0.0)

    def row(coords: list[ir.Value]) -> None:
        nb, oh, ow = coords
        m = linear(b, coords, [t.h_out * t.w_out, t.w_out, 1])
        with ctx.for_range(0, t.c_in, name="c") as c:
            plane = linear(b, [nb, c], [t.c_in * t.h * t.w, t.h * t.w])
            with ctx.for_range(0, t.kh, name="ki") as i:
                ih = b.sub(iadd(b, imul(b, oh, t.sh), imul(b, i, t.dh)), I64(t.ph))
                h_ok = b.icmp_unsigned("<", ih, I64(t.h))  # negative ih is a huge unsigned
                with ctx.for_range(0, t.kw, name="kj") as j:
                    iw = b.sub(iadd(b, imul(b, ow, t.sw), imul(b, j, t.dw_dil)), I64(t.pw))
                    ok = b.and_(h_ok, b.icmp_unsigned("<", iw, I64(t.w)))
                    safe = b.select(ok, as_value(iadd(b, plane, iadd(b, imul(b, ih, t.w), iw))), I64(0))
                    value = b.select(ok, ctx.load(t.x, F32, safe), zero)
                    ctx.store(t.col, value, iadd(b, imul(b, m, k_len), linear(b, [c, i, j], [t.kh * t.kw, t.kw, 1])))

    loop_nest(ctx, [n, t.h_out, t.w_out], row, name="m")
