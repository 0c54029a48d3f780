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
* **Transposed convolution** (ConvTranspose2d/3d, and Conv2d/3dBackwardInput, which is one) is
  `col = W_gᵀ·x_g` by `gemm(ta=True)` into scratch, then `col2im_add` into the zeroed output.
* **Weight gradient** (Conv2d/3dBackwardWeight): `dwᵀ += col·dy_gᵀ` per image in scratch, then transposed.
* **Max-pool backward** (MaxPool2d/3dBackward): per plane, zero dx, then each dy goes to the first
  arg-max of its window under the forward NaN rule (interior windows searched W per vector).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..kernels.blas import BLAS_INT_MAX
from ..ops import ReduceOp
from .context import ArenaRef, EmitContext, ScratchRef
from .toolkit import F32, I32, I64, const, entry_alloca, iadd, imul, scratch_ptr, splat, vec
from .gemm import copy_matrix, gemm, independent_gemms
from ..registry import lowering
from .rows import parallel_rows
from .blas_calls import FortranArgs

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


def _check_axes(axes: tuple[Axis, ...], t, dil_fields: "dict | None" = None) -> None:
    """Positive kernels, strides and dilations; output sizes equal to the formula.  `dil_fields`
    renames a dilation field (the weight gradients call the width dilation `dw_dil`)."""
    dil_fields = dil_fields or {}
    for name, ax in zip(AXIS_FIELDS, axes):
        if not hasattr(t, f"k{name}"):
            continue  # the flat depth of a 2-D kind
        dil = dil_fields.get(name, f"d{name}")
        for field, value in ((f"k{name}", ax.k), (f"s{name}", ax.s), (dil, ax.dil)):
            if value < 1 and (hasattr(t, field) or field == dil):
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
    _check_conv_geometry(t, conv_axes(t))


def _check_conv_geometry(t, axes: tuple[Axis, Axis, Axis], dil_fields: "dict | None" = None) -> None:
    """The im2col + GEMM rules shared by Conv2D/Conv3d and their weight gradients."""
    _check_groups(t, "c_in", "c_out")
    _check_axes(axes, t, dil_fields)
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
    acc = entry_alloca(ctx, vec(F32, width))
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


@lowering(T.Pool2D, T.Pool3D, check=check_pool, shared_body=True)
def pool_nd(ctx: EmitContext, t) -> None:
    """2-D / 3-D Max / Mean pooling (NCHW / NCDHW)."""
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


@lowering(T.Conv2D, T.Conv3d, path="llvm|blas", check=check_conv, shared_body=True)
def conv_nd(ctx: EmitContext, t) -> None:
    """2-D / 3-D convolution (NCHW / NCDHW) with stride, padding, dilation and groups."""
    conv(ctx, t, conv_axes(t))


# ── transposed convolution: GEMM + col2im ────────────────────────────────────

@dataclass(frozen=True)
class TAxis:
    """One spatial axis of a transposed convolution: input `i` scatters to `i·s + tap·dil − p`."""

    size: int   # input (scattered) extent
    out: int    # output extent
    k: int
    s: int
    p: int
    dil: int = 1

    def base_out(self) -> int:
        """`(size − 1)·s − 2p + dil·(k − 1) + 1`: PyTorch's output size before output padding."""
        return (self.size - 1) * self.s - 2 * self.p + self.dil * (self.k - 1) + 1

    def inputs_for(self, tap: int) -> tuple[int, int]:
        """Inputs `[lo, hi)` whose tap `tap` lands inside `[0, out)`."""
        first = tap * self.dil - self.p                       # output of input 0
        lo = min(self.size, max(0, -(first // self.s)))       # ceil(−first / s)
        hi = min(self.size, max(lo, (self.out - 1 - first) // self.s + 1)) if self.out else lo
        return lo, hi


TFLAT = TAxis(1, 1, 1, 1, 0)


def convt_axes(t) -> tuple[TAxis, TAxis, TAxis]:
    """(depth, height, width) of a ConvTranspose2d / ConvTranspose3d."""
    depth = TAxis(t.d, t.d_out, t.kd, t.sd, t.pd, t.dd) if hasattr(t, "kd") else TFLAT
    return depth, TAxis(t.h, t.h_out, t.kh, t.sh, t.ph, t.dh), TAxis(t.w_in, t.w_out, t.kw, t.sw, t.pw, t.dw)


def backward_input_axes(t) -> tuple[TAxis, TAxis, TAxis]:
    """A Conv2dBackwardInput / Conv3dBackwardInput as a transposed conv: dy (the forward output) scatters into dx."""
    depth = TAxis(t.d_out, t.d, t.kd, t.sd, t.pd, t.dd) if hasattr(t, "kd") else TFLAT
    return depth, TAxis(t.h_out, t.h, t.kh, t.sh, t.ph, t.dh), TAxis(t.w_out, t.w_in, t.kw, t.sw, t.pw, t.dw)


def _check_groups(t, lead: str, split: str) -> None:
    if t.groups < 1:
        raise ValidationError(f"groups = {t.groups} must be ≥ 1", field="groups")
    for field in (lead, split):
        if getattr(t, field) % t.groups:
            raise ValidationError(f"{field} = {getattr(t, field)} is not divisible by groups = {t.groups}",
                                  field="groups")


def _check_convt_gemm(axes, cin: str, cin_val: int, cout: str, cout_val: int, groups: int, pix: str) -> None:
    """GEMM dims of the col = Wᵀ·x products: `c_out/groups·kvol`, input pixels, `c_in/groups`."""
    kvol = math.prod(ax.k for ax in axes)
    for field, what, value in ((cout, "c_out/groups·kernel volume", cout_val // groups * kvol),
                               (pix, "input pixels", math.prod(ax.size for ax in axes)),
                               (cin, "c_in/groups", cin_val // groups)):
        if value > BLAS_INT_MAX:
            raise ValidationError(f"{what} = {value} exceeds the 32-bit BLAS integer bound {BLAS_INT_MAX}",
                                  field=field)


def check_convt(t) -> None:
    """Groups dividing both channel counts; positive kernel, stride, dilation; each output size is
    PyTorch's `(size − 1)·s − 2p + dil·(k − 1) + 1 + output_padding` with `0 ≤ output_padding <
    max(s, dil)`; GEMM dims within 32-bit BLAS integers."""
    _check_groups(t, "c_in", "c_out")
    axes = convt_axes(t)
    for name, ax in zip(AXIS_FIELDS, axes):
        if not hasattr(t, f"k{name}"):
            continue
        for field, value in ((f"k{name}", ax.k), (f"s{name}", ax.s), (f"d{name}", ax.dil)):
            if value < 1:
                raise ValidationError(f"{field} = {value} must be ≥ 1", field=field)
        base, extra = ax.base_out(), max(ax.s, ax.dil)
        if not base <= ax.out < base + extra or ax.out < 0:
            size = "w_in" if name == "w" else name
            raise ValidationError(f"{name}_out = {ax.out}, but {size} = {ax.size}, k{name} = {ax.k}, s{name} = {ax.s}, "
                                  f"p{name} = {ax.p}, dilation {ax.dil} allow {max(0, base)}…{base + extra - 1} "
                                  f"(output padding < max(stride, dilation))", field=f"{name}_out")
    _check_convt_gemm(axes, "c_in", t.c_in, "c_out", t.c_out, t.groups, "h")


def check_conv_backward_input(t) -> None:
    """The forward geometry of Conv2D / Conv3d (channels, groups, kernel, stride, dilation, output
    sizes equal to the forward formula); GEMM dims within 32-bit BLAS integers."""
    _check_groups(t, "c_in", "c_out")
    depth = Axis(t.d, t.d_out, t.kd, t.sd, t.pd, t.dd) if hasattr(t, "kd") else FLAT
    _check_axes((depth, Axis(t.h, t.h_out, t.kh, t.sh, t.ph, t.dh), Axis(t.w_in, t.w_out, t.kw, t.sw, t.pw, t.dw)), t)
    _check_convt_gemm(backward_input_axes(t), "c_out", t.c_out, "c_in", t.c_in, t.groups, "h_out")


def col2im_add(ctx: EmitContext, axes, rows: "tuple[ir.Value, ir.Value]", col: ir.Value, dst: ir.Value) -> None:
    """`dst[oc, i·s + tap·dil − p, …] += col[(oc, kd, ki, kj), (id, ih, iw)]` for the col rows of
    output channels `[rows)` (dst points at the group's first output channel; taps landing outside
    are dropped).  The width taps are unrolled with constant in-range input columns; `W` inputs per
    vector: contiguous read-modify-write at stride 1, one wide span and a zero-interleaving
    shuffle at stride s (the other lanes get +0, which changes nothing: the output never holds −0)."""
    b = ctx.b
    dz, hz, wz = axes
    p_in, p_out = dz.size * hz.size * wz.size, dz.out * hz.out * wz.out
    with ctx.for_range(imul(b, rows[0], dz.k * hz.k), imul(b, rows[1], dz.k * hz.k), name="crow") as crow:
        oc, kd, ki = split_index(b, crow, dz.k, hz.k)
        plane = imul(b, oc, p_out)
        with ctx.for_range(0, dz.size * hz.size, name="irow") as irow:
            idd, ih = split_index(b, irow, hz.size)
            od = b.sub(b.add(imul(b, idd, dz.s), imul(b, kd, dz.dil)), I64(dz.p))
            oh = b.sub(b.add(imul(b, ih, hz.s), imul(b, ki, hz.dil)), I64(hz.p))
            inside = b.and_(b.icmp_unsigned("<", od, I64(dz.out)), b.icmp_unsigned("<", oh, I64(hz.out)))
            with b.if_then(inside):
                line = b.add(plane, b.add(imul(b, od, hz.out * wz.out), imul(b, oh, wz.out)))
                for kj in range(wz.k):
                    lo, hi = wz.inputs_for(kj)
                    if hi <= lo:
                        continue
                    src = b.add(imul(b, b.add(imul(b, crow, wz.k), I64(kj)), p_in), imul(b, irow, wz.size))
                    first = b.add(line, I64(lo * wz.s + kj * wz.dil - wz.p))

                    def add(i: ir.Value, w: int, src=src, first=first, lo=lo) -> None:
                        x = ctx.load(0, F32, b.add(src, b.add(i, I64(lo))), w, base=col)
                        at = b.add(first, imul(b, i, wz.s))
                        if w == 1 or wz.s == 1:
                            ctx.store(0, b.fadd(ctx.load(0, F32, at, w, base=dst), x), at, base=dst)
                            return
                        n = (w - 1) * wz.s + 1
                        pick = [I32(j // wz.s if j % wz.s == 0 else w) for j in range(n)]
                        wide = b.shuffle_vector(x, const(F32, 0.0, w), ir.Constant(ir.VectorType(I32, n), pick))
                        ctx.store(0, b.fadd(ctx.load(0, F32, at, n, base=dst), wide), at, base=dst)
                    spans(ctx, hi - lo, add, name="scat")


def conv_transpose(ctx: EmitContext, axes, n: int, cin: int, cout: int, groups: int, src: int, weight: int,
                   dst: int) -> None:
    """Transposed convolution, weight `[cin, cout/groups, k…]`: per (image, group)
    `col[(oc, taps), P_in] = W_gᵀ·x_g` by `gemm` into scratch, zero the output block, then `col2im_add`.
    A 1×1 stride-1 unpadded kernel (output = input extent) writes the GEMM straight into the output."""
    dz, hz, wz = axes
    cin_g, cout_g = cin // groups, cout // groups
    kvol = dz.k * hz.k * wz.k
    p_in, p_out = dz.size * hz.size * wz.size, dz.out * hz.out * wz.out
    m = cout_g * kvol
    items = n * groups
    if items == 0 or cout_g == 0 or p_out == 0:
        ctx.note_path("llvm")
        return
    if p_in == 0:  # nothing scatters: the output is all zeros
        ctx.note_path("llvm")
        fill(ctx, ctx.addr(dst), I64(0), n * cout * p_out)
        return
    direct = kvol == 1 and all(ax.s == 1 and ax.p == 0 and ax.out == ax.size for ax in axes)

    def offsets(i, g, b):
        x = iadd(b, imul(b, i, cin * p_in), imul(b, g, cin_g * p_in))
        w = imul(b, g, cin_g * m)
        y = iadd(b, imul(b, i, cout * p_out), imul(b, g, cout_g * p_out))
        return x, w, y

    if items <= UNROLL_GEMMS:
        col = None if direct else ctx.scratch_alloc(4 * m * p_in)
        for item in range(items):
            x, w, y = offsets(item // groups, item % groups, ctx.b)
            if col is None:
                gemm(ctx, FortranArgs(ctx), "s", m, p_in, cin_g, ArenaRef(weight + 4 * w), ArenaRef(src + 4 * x),
                     ArenaRef(dst + 4 * y), ta=True)
                continue
            gemm(ctx, FortranArgs(ctx), "s", m, p_in, cin_g, ArenaRef(weight + 4 * w), ArenaRef(src + 4 * x),
                 ScratchRef(col), ta=True)

            def channels(sub: EmitContext, start: ir.Value, stop: ir.Value, y=y) -> None:
                out = sub.addr(dst + 4 * y)
                b = sub.b
                fill_range(sub, out, imul(b, start, p_out), imul(b, stop, p_out))
                col2im_add(sub, axes, (start, stop), sub.addr(col, base=sub.shared), out)
            parallel_rows(ctx, cout_g, 8 * p_out + 4 * kvol * p_in, channels)
        return

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        col = None if direct else scratch_ptr(sub, sub.scratch_alloc(4 * m * p_in))
        fa = FortranArgs(sub)
        with sub.for_range(start, stop, name="item") as item:
            i, g = split_index(b, item, groups)
            x, w, y = offsets(i, g, b)
            out = sub.addr(dst, y, 4)
            gemm(sub, fa, "s", m, p_in, cin_g, sub.addr(weight, w, 4), sub.addr(src, x, 4),
                 out if col is None else col, ta=True)
            if col is not None:
                fill(sub, out, I64(0), cout_g * p_out)
                col2im_add(sub, axes, (I64(0), I64(cout_g)), col, out)

    independent_gemms(ctx, "s", items, m, p_in, cin_g, body)


def fill_range(ctx: EmitContext, base: ir.Value, start: ir.Value, stop: ir.Value) -> None:
    """Zero f32 elements `[start, stop)` of `base` (run-time bounds: a W-wide loop and a scalar tail)."""
    b = ctx.b
    w = ctx.lanes
    count = b.sub(stop, start)
    main = b.add(start, b.mul(b.udiv(count, I64(w)), I64(w)))
    with ctx.for_range(start, main, w, name="zv") as i:
        ctx.store(0, const(F32, 0.0, w), i, base=base)
    with ctx.for_range(main, stop, name="zs") as i:
        ctx.store(0, const(F32, 0.0, 1), i, base=base)


@lowering(T.ConvTranspose2d, T.ConvTranspose3d, path="llvm|blas", check=check_convt, shared_body=True)
def conv_transpose_nd(ctx: EmitContext, t) -> None:
    """2-D/3-D transposed convolution (NCHW / NCDHW), weight `[c_in, c_out/groups, (kd,) kh, kw]`."""
    conv_transpose(ctx, convt_axes(t), t.n, t.c_in, t.c_out, t.groups, t.src, t.weight, t.dst)


@lowering(T.Conv2dBackwardInput, T.Conv3dBackwardInput, path="llvm|blas", check=check_conv_backward_input,
          shared_body=True)
def conv_backward_input(ctx: EmitContext, t) -> None:
    """`dx = conv_transpose(dy, w)` with the forward geometry (w `[c_out, c_in/groups, (kd,) kh, kw]`)."""
    conv_transpose(ctx, backward_input_axes(t), t.n, t.c_out, t.c_in, t.groups, t.dy, t.w, t.dx)


# ── max-pool backward ────────────────────────────────────────────────────────

def check_max_pool_backward(t) -> None:
    """Positive kernel and stride; output dims that match the input (the forward Pool2D / Pool3D rule)."""
    _check_axes(pool_axes(t), t)


def max_pool_backward(ctx: EmitContext, t) -> None:
    """Per plane: zero `dx`, then for every output (row-major) find the first arg-max of its window
    under the forward rule and add `dy` there.  The search is the forward `max_step` made
    first-wins for NaN too: `take = none yet || x > best || (isnan(x) && !isnan(best))`; so a NaN
    in the window (the forward gives NaN) routes to the first NaN, ties go to the lowest
    (kd, kh, kw), a window of −∞s to its first in-range tap, and an all-padding window nowhere.

    Like the forward, border columns are scalar and interior columns search `W` windows per vector
    (strided loads as in `pool_window`); the `W` gradients are then added lane by lane, in output
    order, so overlapping windows accumulate exactly as in the scalar loop."""
    dz, hz, wz = pool_axes(t)
    planes = t.n * t.c
    in_plane, out_plane = dz.size * hz.size * wz.size, dz.out * hz.out * wz.out
    if planes == 0 or in_plane == 0:
        return
    lo, hi = wz.interior()

    def chunk(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        dx = sub.addr(t.dx)
        x = sub.addr(t.x)
        fill_range(sub, dx, imul(b, start, in_plane), imul(b, stop, in_plane))
        if out_plane == 0 or wz.out == 0:
            return
        slots = {}

        def slot(ty, width):
            key = (str(ty), width)
            if key not in slots:
                slots[key] = entry_alloca(sub, ty if width == 1 else ir.VectorType(ty, width))
            return slots[key]

        with sub.for_range(start, stop, name="plane") as plane:
            base_in = imul(b, plane, in_plane)
            with sub.for_range(0, dz.out * hz.out, name="orow") as orow:
                od, oh = split_index(b, orow, hz.out)
                d_taps, h_taps = clamp_taps(b, od, dz), clamp_taps(b, oh, hz)

                def windows(ow: ir.Value, width: int, w_taps: tuple) -> None:
                    best_slot, idx_slot = slot(F32, width), slot(I64, width)
                    b.store(const(F32, -math.inf, width), best_slot)
                    b.store(const(I64, -1, width), idx_slot)
                    lanes = None if width == 1 else ir.Constant(ir.VectorType(I64, width),
                                                                [I64(j * wz.s) for j in range(width)])
                    col0 = b.sub(imul(b, ow, wz.s), I64(wz.p))
                    with sub.for_range(*d_taps, name="kd") as kd:
                        idd = b.add(b.sub(imul(b, od, dz.s), I64(dz.p)), kd)
                        with sub.for_range(*h_taps, name="ki") as ki:
                            ih = b.add(b.sub(imul(b, oh, hz.s), I64(hz.p)), ki)
                            line = b.add(imul(b, idd, hz.size * wz.size), imul(b, ih, wz.size))
                            with sub.for_range(*w_taps, name="kj") as kj:
                                at = b.add(line, b.add(col0, kj))
                                v = load_strided(sub, x, b.add(base_in, at), width, wz.s)
                                if width > 1:
                                    at = b.add(splat(b, at, width), lanes)
                                best, idx = b.load(best_slot), b.load(idx_slot)
                                take = b.or_(b.icmp_signed("<", idx, const(I64, 0, width)),
                                             b.or_(b.fcmp_ordered(">", v, best),
                                                   b.and_(b.fcmp_unordered("uno", v, v),
                                                          b.fcmp_ordered("ord", best, best))))
                                b.store(b.select(take, v, best), best_slot)
                                b.store(b.select(take, at, idx), idx_slot)
                    idx = b.load(idx_slot)
                    o = b.add(imul(b, orow, wz.out), ow)
                    g = sub.load(t.dy, F32, b.add(imul(b, plane, out_plane), o), width)
                    for j in range(width):
                        ij = idx if width == 1 else b.extract_element(idx, I32(j))
                        gj = g if width == 1 else b.extract_element(g, I32(j))
                        with b.if_then(b.icmp_signed(">=", ij, I64(0))):
                            here = b.add(base_in, ij)
                            sub.store(0, b.fadd(sub.load(0, F32, here, base=dx), gj), here, base=dx)

                if lo > 0:
                    with sub.for_range(0, lo, name="edge") as ow:
                        windows(ow, 1, clamp_taps(b, ow, wz))
                spans(sub, hi - lo, lambda i, width: windows(b.add(i, I64(lo)), width, (I64(0), I64(wz.k))),
                      name="ow")
                if wz.out > hi:
                    with sub.for_range(hi, wz.out, name="edge") as ow:
                        windows(ow, 1, clamp_taps(b, ow, wz))

    parallel_rows(ctx, planes, 8 * in_plane + 4 * out_plane * dz.k * hz.k * wz.k, chunk)


@lowering(T.MaxPool2dBackward, T.MaxPool3dBackward, check=check_max_pool_backward, shared_body=True)
def max_pool_backward_nd(ctx: EmitContext, t) -> None:
    """Route each `dy` to the first arg-max of its 2-D / 3-D window (dx zeroed first)."""
    max_pool_backward(ctx, t)



# ── conv weight gradient: im2col + GEMM with a transposed B ──────────────────

def weight_grad_axes(t) -> tuple[Axis, Axis, Axis]:
    """(depth, height, width) of a Conv2dBackwardWeight / Conv3dBackwardWeight (width dilation `dw_dil`)."""
    depth = Axis(t.d, t.d_out, t.kd, t.sd, t.pd, t.dd) if hasattr(t, "kd") else FLAT
    return depth, Axis(t.h, t.h_out, t.kh, t.sh, t.ph, t.dh), Axis(t.w, t.w_out, t.kw, t.sw, t.pw, t.dw_dil)


def check_conv_backward_weight(t) -> None:
    """The forward Conv2D / Conv3d rules (groups, kernel, stride, dilation, output sizes, GEMM dims)."""
    _check_conv_geometry(t, weight_grad_axes(t), {"w": "dw_dil"})


def conv_backward_weight(ctx: EmitContext, t) -> None:
    """Per group, in scratch: `dwᵀ[K, co] = 0`, then for every image `dwᵀ += col[K, P]·dy_g[co, P]ᵀ`
    (im2col into scratch unless 1×1 stride 1 unpadded; `gemm(tb=True)` with β = 1 — the tiles
    transpose the small `dy_g`, not the big col), then `dw_g = (dwᵀ)ᵀ`.  Groups are split across
    threads (each owns its `dw` block); images run in order inside a group."""
    axes = dz, hz, wz = weight_grad_axes(t)
    groups = t.groups
    cin_g, cout_g = t.c_in // groups, t.c_out // groups
    kvol = dz.k * hz.k * wz.k
    k, p = cin_g * kvol, dz.out * hz.out * wz.out
    in_image = dz.size * hz.size * wz.size
    if cout_g == 0 or k == 0:
        ctx.note_path("llvm")
        return
    if p == 0 or t.n == 0:
        ctx.note_path("llvm")  # dw is only zeroed: no GEMM is emitted
    direct = kvol == 1 and all(ax.s == 1 and ax.p == 0 for ax in axes)

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        accumulate = p > 0 and t.n > 0
        col = None if direct or not accumulate else scratch_ptr(sub, sub.scratch_alloc(4 * k * p))
        dw_t = scratch_ptr(sub, sub.scratch_alloc(4 * k * cout_g)) if accumulate else None
        fa = FortranArgs(sub)
        with sub.for_range(start, stop, name="group") as g:
            dw = sub.addr(t.dw, imul(b, g, cout_g * k), 4)
            if not accumulate:
                fill(sub, dw, I64(0), cout_g * k)
            else:
                fill(sub, dw_t, I64(0), k * cout_g)
                with sub.for_range(0, t.n, name="image") as i:
                    x = sub.addr(t.x, b.add(imul(b, i, t.c_in * in_image), imul(b, g, cin_g * in_image)), 4)
                    dy = sub.addr(t.dy, b.add(imul(b, i, t.c_out * p), imul(b, g, cout_g * p)), 4)
                    if col is not None:
                        im2col(sub, axes, cin_g, x, col)
                    gemm(sub, fa, "s", k, cout_g, p, x if col is None else col, dy, dw_t, tb=True, beta=1.0)
                copy_matrix(sub, dw_t, dw, k, cout_g, F32, F32, transpose=True)

    independent_gemms(ctx, "s", groups, k, cout_g, max(1, p) * max(1, t.n), body)


@lowering(T.Conv2dBackwardWeight, T.Conv3dBackwardWeight, path="llvm|blas", check=check_conv_backward_weight,
          shared_body=True)
def conv_backward_weight_nd(ctx: EmitContext, t) -> None:
    """2-D / 3-D weight gradient `dw = Σ_images dy·im2col(x)ᵀ` per group (dw zeroed first)."""
    conv_backward_weight(ctx, t)
