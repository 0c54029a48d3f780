"""Convolution and pooling (NCHW / NCDHW) as native code (semantics.md §3.7; docs/lowering-conv.md).

Every kind is seen through one geometry: three spatial `Axis`es (depth, height, width), the 2-D
kinds with a trivial depth axis (size 1, kernel 1, stride 1, no padding), so Pool2D/Pool3D share
one emitter and Conv2D/Conv3d another.

* **Pooling** runs one output row `(plane, od, oh)` at a time: the depth/height taps inside the
  input are a run-time range, the output width splits into border columns (scalar, each with its
  own in-range tap range) and interior columns whose whole window is inside the input, computed
  `W` outputs per vector (contiguous loads at stride 1, one wide load and a shuffle at stride > 1).
  Max is PyTorch's `x > acc || isnan(x)` (NaN propagates; an all-padding window is −∞); Mean sums
  the in-range taps in window order and divides by the full kernel volume.
* **Convolution** is im2col + GEMM per (image, group): `col[(ci, kd, ki, kj), (od, oh, ow)]` in
  scratch (zeros for padded taps), then `out[co_g, P] = W_g[co_g, K]·col[K, P]` by `gemm.gemm`
  straight into the output.  A 1×1 stride-1 unpadded kernel multiplies the input directly.
  Few (image, group) pairs are unrolled with constant offsets (so the GEMM splits its column
  panels across threads); many are split across threads themselves (`independent_gemms`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from ..errors import ValidationError
from ..kernels.blas import BLAS_INT_MAX, FortranArgs
from ..ops import ReduceOp
from .core import F32, I32, I64, EmitContext, const
from .gemm import ArenaRef, ScratchRef, gemm, independent_gemms, scratch_ptr
from .registry import lowering
from .rows import iadd, imul, parallel_rows

# (image, group) GEMMs up to this many are unrolled with constant offsets (each GEMM then splits
# its own column panels across threads); more are split across threads as whole GEMMs.
UNROLL_GEMMS = 4


# ── geometry ─────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Axis:
    """One spatial axis: input size, output size, kernel, stride, padding, dilation."""

    size: int
    out: int
    k: int
    s: int
    p: int
    dil: int = 1

    def expected_out(self) -> int:
        """`(size + 2p − dil·(k − 1) − 1) // s + 1`, at least 0 (PyTorch's output size)."""
        return max(0, (self.size + 2 * self.p - self.dil * (self.k - 1) - 1) // self.s + 1)

    def interior(self, taps: "range | None" = None) -> tuple[int, int]:
        """Outputs `[lo, hi)` for which every tap in `taps` (default: the whole kernel) reads inside the input."""
        taps = range(self.k) if taps is None else taps
        first, last = taps[0] * self.dil - self.p, taps[-1] * self.dil - self.p  # input index at output 0
        lo = min(self.out, max(0, -(first // self.s)))                            # ceil(−first / s)
        hi = min(self.out, max(lo, (self.size - 1 - last) // self.s + 1))
        return lo, hi


FLAT = Axis(1, 1, 1, 1, 0)  # the depth axis of a 2-D kind


def pool_axes(t) -> tuple[Axis, Axis, Axis]:
    """(depth, height, width) of a Pool2D / Pool3D."""
    depth = Axis(t.d, t.d_out, t.kd, t.sd, t.pd) if hasattr(t, "kd") else FLAT
    return depth, Axis(t.h, t.h_out, t.kh, t.sh, t.ph), Axis(t.w, t.w_out, t.kw, t.sw, t.pw)


def conv_axes(t) -> tuple[Axis, Axis, Axis]:
    """(depth, height, width) of a Conv2D / Conv3d."""
    depth = Axis(t.d, t.d_out, t.kd, t.sd, t.pd, t.dd) if hasattr(t, "kd") else FLAT
    return depth, Axis(t.h, t.h_out, t.kh, t.sh, t.ph, t.dh), Axis(t.w, t.w_out, t.kw, t.sw, t.pw, t.dw)


# ── validation ───────────────────────────────────────────────────────────────

AXIS_FIELDS = ("d", "h", "w")


def _check_axes(axes: tuple[Axis, ...], t) -> None:
    """Positive kernels, strides and dilations; output sizes equal to the formula."""
    for name, ax in zip(AXIS_FIELDS, axes):
        if not hasattr(t, f"k{name}"):
            continue  # the flat depth of a 2-D kind
        for field, value in ((f"k{name}", ax.k), (f"s{name}", ax.s), (f"d{name}", ax.dil)):
            if value < 1 and hasattr(t, field):
                raise ValidationError(f"{field} = {value} must be ≥ 1", field=field)
        want = ax.expected_out()
        if ax.out != want:
            raise ValidationError(f"{name}_out = {ax.out}, but {name} = {ax.size}, k{name} = {ax.k}, s{name} = {ax.s}, "
                                  f"p{name} = {ax.p}, dilation {ax.dil} give {want}", field=f"{name}_out")


def check_pool(t) -> None:
    """Max or Mean; positive kernel and stride; output dims that match the input."""
    if t.kind not in (ReduceOp.Max, ReduceOp.Mean):
        raise ValidationError(f"pooling kind {t.kind.value} is not Max or Mean", field="kind")
    _check_axes(pool_axes(t), t)


def check_conv(t) -> None:
    """Groups that divide both channel counts; positive kernel, stride, dilation; output dims that
    match the input; GEMM dims within 32-bit BLAS integers."""
    if t.groups < 1:
        raise ValidationError(f"groups = {t.groups} must be ≥ 1", field="groups")
    for field in ("c_in", "c_out"):
        if getattr(t, field) % t.groups:
            raise ValidationError(f"{field} = {getattr(t, field)} is not divisible by groups = {t.groups}",
                                  field="groups")
    axes = conv_axes(t)
    _check_axes(axes, t)
    k = t.c_in // t.groups * math.prod(ax.k for ax in axes)
    p = math.prod(ax.out for ax in axes)
    for field, what, value in (("c_in", "c_in/groups·kernel volume", k), ("h_out", "output pixels", p),
                               ("c_out", "c_out/groups", t.c_out // t.groups)):
        if value > BLAS_INT_MAX:
            raise ValidationError(f"{what} = {value} exceeds the 32-bit BLAS integer bound {BLAS_INT_MAX}",
                                  field=field)


# ── shared pieces ────────────────────────────────────────────────────────────

def load_strided(ctx: EmitContext, base: ir.Value, index: ir.Value, width: int, stride: int) -> ir.Value:
    """f32 elements `index + j·stride` for j < width from `base` (one wide load and a shuffle)."""
    if width == 1 or stride == 1:
        return ctx.load(0, F32, index, width, base=base)
    span = ctx.load(0, F32, index, (width - 1) * stride + 1, base=base)
    pick = ir.Constant(ir.VectorType(I32, width), [I32(j * stride) for j in range(width)])
    return ctx.b.shuffle_vector(span, ir.Constant(span.type, None), pick)


def spans(ctx: EmitContext, n: int, body, name: str = "i") -> None:
    """`body(i, W)` over the W-wide part of `[0, n)`, then the rest (n is a compile-time count) in
    one step each of W/2, W/4, …, 1 lanes: short rows (7×7 feature maps) still run as vectors."""
    w = ctx.lanes
    main = n - n % w
    if main:
        with ctx.for_range(0, main, w, name=f"{name}.vec") as i:
            body(i, w)
    while w > 1 and main < n:
        w //= 2
        if n - main >= w:
            body(I64(main), w)
            main += w


def clamp_taps(b: ir.IRBuilder, pos: ir.Value, ax: Axis) -> tuple[ir.Value, ir.Value]:
    """Taps `[lo, hi)` of output `pos` whose input index `pos·s + k − p` is inside the axis (no dilation)."""
    first = b.sub(I64(ax.p), imul(b, pos, ax.s))          # p − pos·s: the first tap inside
    lo = b.select(b.icmp_signed(">", first, I64(0)), first, I64(0))
    end = b.add(first, I64(ax.size))
    hi = b.select(b.icmp_signed("<", end, I64(ax.k)), end, I64(ax.k))
    return lo, hi


def split_index(b: ir.IRBuilder, r: ir.Value, *sizes: int) -> list[ir.Value]:
    """Mixed-radix digits of `r` (most significant first) for the trailing `sizes`; the first digit is unbounded."""
    digits = []
    for size in reversed(sizes):
        digits.append(b.urem(r, I64(size)) if size > 1 else I64(0))
        r = b.udiv(r, I64(size)) if size > 1 else r
    return [r, *reversed(digits)]


# ── pooling ──────────────────────────────────────────────────────────────────

def max_step(b: ir.IRBuilder, acc: ir.Value, x: ir.Value) -> ir.Value:
    """PyTorch's max-pool step `x > acc || isnan(x) ? x : acc`: a NaN, once taken, stays."""
    take = b.or_(b.fcmp_ordered(">", x, acc), b.fcmp_unordered("uno", x, x))
    return b.select(take, x, acc)


@dataclass
class PoolRow:
    """One output row `(plane, od, oh)`: where its input plane starts and its in-range d/h taps."""

    src: ir.Value          # element index of the input plane
    dst: ir.Value          # element index of the output row
    od: ir.Value
    oh: ir.Value
    d_taps: tuple[ir.Value, ir.Value]
    h_taps: tuple[ir.Value, ir.Value]


def pool_window(ctx: EmitContext, t, axes: tuple[Axis, Axis, Axis], row: PoolRow, ow: ir.Value, width: int,
                w_taps: tuple) -> ir.Value:
    """Max or Mean over the in-range taps of `width` outputs from column `ow` (window order kd, ki, kj)."""
    b = ctx.b
    dz, hz, wz = axes
    is_max = t.kind is ReduceOp.Max
    vty = F32 if width == 1 else ir.VectorType(F32, width)
    with b.goto_entry_block():
        acc = b.alloca(vty)
    b.store(const(F32, -math.inf if is_max else 0.0, width), acc)
    base = ctx.addr(t.src, row.src, 4)
    col0 = b.sub(imul(b, ow, wz.s), I64(wz.p))
    with ctx.for_range(*row.d_taps, name="kd") as kd:
        plane = imul(b, b.add(b.sub(imul(b, row.od, dz.s), I64(dz.p)), kd), hz.size * wz.size)
        with ctx.for_range(*row.h_taps, name="ki") as ki:
            line = b.add(plane, imul(b, b.add(b.sub(imul(b, row.oh, hz.s), I64(hz.p)), ki), wz.size))
            with ctx.for_range(*w_taps, name="kj") as kj:
                x = load_strided(ctx, base, b.add(line, b.add(col0, kj)), width, wz.s)
                old = b.load(acc)
                b.store(max_step(b, old, x) if is_max else b.fadd(old, x), acc)
    out = b.load(acc)
    if not is_max:
        out = b.fdiv(out, const(F32, float(dz.k * hz.k * wz.k), width))
    return out


def pool(ctx: EmitContext, t, axes: tuple[Axis, Axis, Axis]) -> None:
    """Every output row of every plane: border columns scalar, interior columns W per vector."""
    dz, hz, wz = axes
    rows = t.n * t.c * dz.out * hz.out
    if rows == 0 or wz.out == 0:
        return
    lo, hi = wz.interior()
    in_plane = dz.size * hz.size * wz.size

    def emit_row(sub: EmitContext, r: ir.Value) -> None:
        b = sub.b
        plane, od, oh = split_index(b, r, dz.out, hz.out)
        row = PoolRow(imul(b, plane, in_plane), imul(b, r, wz.out), od, oh, clamp_taps(b, od, dz),
                      clamp_taps(b, oh, hz))

        def column(ow: ir.Value, width: int, taps: tuple) -> None:
            sub.store(t.dst, pool_window(sub, t, axes, row, ow, width, taps), b.add(row.dst, ow))

        for start, stop in ((0, lo), (hi, wz.out)):           # border columns, per-column taps
            if stop > start:
                with sub.for_range(start, stop, name="edge") as ow:
                    column(ow, 1, clamp_taps(b, ow, wz))
        spans(sub, hi - lo, lambda i, width: column(b.add(i, I64(lo)), width, (I64(0), I64(wz.k))), name="ow")

    def chunk(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="row") as r:
            emit_row(sub, r)

    parallel_rows(ctx, rows, 4 * wz.out * dz.k * hz.k * wz.k, chunk)


@lowering("Pool2D", check=check_pool, shared_body=True)
def pool2d(ctx: EmitContext, t) -> None:
    """2-D Max / Mean pooling (NCHW)."""
    pool(ctx, t, pool_axes(t))


@lowering("Pool3D", check=check_pool, shared_body=True)
def pool3d(ctx: EmitContext, t) -> None:
    """3-D Max / Mean pooling (NCDHW)."""
    pool(ctx, t, pool_axes(t))


# ── convolution: im2col + GEMM ───────────────────────────────────────────────

def fill(ctx: EmitContext, base: ir.Value, at: ir.Value, count: int, value: float = 0.0) -> None:
    """`count` f32 `value`s from element `at` of `base`."""
    b = ctx.b
    if count:
        spans(ctx, count, lambda i, w: ctx.store(0, const(F32, value, w), b.add(at, i), base=base), name="fill")


def im2col(ctx: EmitContext, axes: tuple[Axis, Axis, Axis], channels: int, src: ir.Value, col: ir.Value) -> None:
    """`col[(ci, kd, ki, kj), (od, oh, ow)] = x[ci, od·sd + kd·dd − pd, …]`, 0 for padded taps.

    `src` points at the group's first input channel, `col` at a `[K, P]` f32 buffer.  The width
    taps are unrolled: each `kj` has a constant range of in-range output columns."""
    b = ctx.b
    dz, hz, wz = axes
    p = dz.out * hz.out * wz.out
    with ctx.for_range(0, channels * dz.k * hz.k, name="tap") as tap:
        ci, kd, ki = split_index(b, tap, dz.k, hz.k)
        plane = imul(b, ci, dz.size * hz.size * wz.size)
        with ctx.for_range(0, dz.out * hz.out, name="orow") as orow:
            od, oh = split_index(b, orow, hz.out)
            idd = b.sub(b.add(imul(b, od, dz.s), imul(b, kd, dz.dil)), I64(dz.p))
            ih = b.sub(b.add(imul(b, oh, hz.s), imul(b, ki, hz.dil)), I64(hz.p))
            inside = b.and_(b.icmp_unsigned("<", idd, I64(dz.size)), b.icmp_unsigned("<", ih, I64(hz.size)))
            line = b.add(plane, b.add(imul(b, idd, hz.size * wz.size), imul(b, ih, wz.size)))
            for kj in range(wz.k):
                out = b.add(imul(b, b.add(imul(b, tap, wz.k), I64(kj)), p), imul(b, orow, wz.out))
                lo, hi = wz.interior(range(kj, kj + 1))
                with b.if_else(inside) as (then, otherwise):
                    with then:
                        fill(ctx, col, out, lo)
                        first = b.add(line, I64(lo * wz.s + kj * wz.dil - wz.p))

                        def copy(i: ir.Value, w: int) -> None:
                            x = load_strided(ctx, src, b.add(first, imul(b, i, wz.s)), w, wz.s)
                            ctx.store(0, x, b.add(out, b.add(i, I64(lo))), base=col)
                        spans(ctx, hi - lo, copy, name="copy")
                        fill(ctx, col, b.add(out, I64(hi)), wz.out - hi)
                    with otherwise:
                        fill(ctx, col, out, wz.out)


def conv(ctx: EmitContext, t, axes: tuple[Axis, Axis, Axis]) -> None:
    """Per (image, group): im2col into scratch (unless 1×1 stride 1 unpadded), then one GEMM."""
    dz, hz, wz = axes
    groups = t.groups
    cin_g, cout_g = t.c_in // groups, t.c_out // groups
    kvol = dz.k * hz.k * wz.k
    k, p = cin_g * kvol, dz.out * hz.out * wz.out
    in_image = dz.size * hz.size * wz.size
    items = t.n * groups
    if items == 0 or cout_g == 0 or p == 0:
        ctx.note_path("llvm")  # nothing to compute: no GEMM is emitted
        return
    direct = kvol == 1 and all(ax.s == 1 and ax.p == 0 for ax in axes)  # col is the input itself

    def offsets(i: "int | ir.Value", g: "int | ir.Value", b: ir.IRBuilder) -> tuple:
        """Element indices of (input group, weight group, output block) of image i, group g."""
        src = iadd(b, imul(b, i, t.c_in * in_image), imul(b, g, cin_g * in_image))
        w = imul(b, g, cout_g * k)
        dst = iadd(b, imul(b, i, t.c_out * p), imul(b, g, cout_g * p))
        return src, w, dst

    if items <= UNROLL_GEMMS:
        col = None if direct or k == 0 else ctx.scratch_alloc(4 * k * p)
        for item in range(items):
            src, w, dst = offsets(item // groups, item % groups, ctx.b)
            if col is None:
                x_op = ArenaRef(t.src + 4 * src)
            else:
                im2col(ctx, axes, cin_g, ctx.addr(t.src + 4 * src), scratch_ptr(ctx, col))
                x_op = ScratchRef(col)
            gemm(ctx, FortranArgs(ctx), "s", cout_g, p, k, ArenaRef(t.weight + 4 * w), x_op, ArenaRef(t.dst + 4 * dst))
        return

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        col = None if direct or k == 0 else scratch_ptr(sub, sub.scratch_alloc(4 * k * p))
        fa = FortranArgs(sub)
        with sub.for_range(start, stop, name="item") as item:
            i, g = split_index(b, item, groups)
            src, w, dst = offsets(i, g, b)
            x = sub.addr(t.src, src, 4)
            if col is not None:
                im2col(sub, axes, cin_g, x, col)
            gemm(sub, fa, "s", cout_g, p, k, sub.addr(t.weight, w, 4), x if col is None else col,
                 sub.addr(t.dst, dst, 4))

    independent_gemms(ctx, "s", items, cout_g, p, k, body)


@lowering("Conv2D", path="blas", check=check_conv, shared_body=True)
def conv2d(ctx: EmitContext, t) -> None:
    """2-D convolution (NCHW) with stride, padding, dilation and groups."""
    conv(ctx, t, conv_axes(t))


@lowering("Conv3d", path="blas", check=check_conv, shared_body=True)
def conv3d(ctx: EmitContext, t) -> None:
    """3-D convolution (NCDHW) with stride, padding, dilation and groups."""
    conv(ctx, t, conv_axes(t))
