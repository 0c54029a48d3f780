"""3-D Gaussian splatting — `GaussianSplatPrepare`, `GaussianSplatRasterize` and `GaussianSplatRender`
(their composition) as scalar IR (docs/lowering-splat.md; the layouts are in reference/splat.py).

Prepare projects every splat (the EWA formulas of `reference.splat.project`, emitted on `Num` values)
into an unsorted staging area of scratch, then places each record at its stable depth rank (a counted
O(n²) rank count: no data-dependent control flow, so any bytes are safe).  Rasterize runs rows of pixels
in parallel; each pixel walks the sorted list branch-free, compositing the splats whose tile bounding box
covers its tile, front to back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..reference import splat as S
from ..registry import lowering
from . import vecmath as vm
from .context import EmitContext
from .toolkit import F32, I1, I64, carried_loop, imul, iadd

INF = float("inf")


class Num:
    """A scalar IR value with Python arithmetic (f32 ops, or i1 for comparisons and `&`)."""

    __slots__ = ("b", "v")

    def __init__(self, b: ir.IRBuilder, v: ir.Value) -> None:
        self.b, self.v = b, v

    def _of(self, x: "Num | float") -> ir.Value:
        return x.v if isinstance(x, Num) else ir.Constant(F32, float(x))

    def _op(self, name: str, x: "Num | float", swap: bool = False) -> "Num":
        l, r = (self._of(x), self.v) if swap else (self.v, self._of(x))
        return Num(self.b, getattr(self.b, name)(l, r))

    def __add__(self, x): return self._op("fadd", x)
    def __radd__(self, x): return self if isinstance(x, (int, float)) and x == 0 else self._op("fadd", x, True)
    def __sub__(self, x): return self._op("fsub", x)
    def __rsub__(self, x): return self._op("fsub", x, True)
    def __mul__(self, x): return self._op("fmul", x)
    def __rmul__(self, x): return self._op("fmul", x, True)
    def __truediv__(self, x): return self._op("fdiv", x)
    def __rtruediv__(self, x): return self._op("fdiv", x, True)
    def __neg__(self): return Num(self.b, self.b.fneg(self.v))

    def _cmp(self, op: str, x) -> "Num":
        return Num(self.b, self.b.fcmp_ordered(op, self.v, self._of(x)))   # NaN: false

    def __gt__(self, x): return self._cmp(">", x)
    def __lt__(self, x): return self._cmp("<", x)
    def __ge__(self, x): return self._cmp(">=", x)
    def __le__(self, x): return self._cmp("<=", x)
    def __and__(self, x): return Num(self.b, self.b.and_(self.v, x.v))


@dataclass(frozen=True)
class IRMath:
    """`sqrt`, `fmax`, `where` on `Num`s (the namespace `reference.splat` formulas take)."""

    b: ir.IRBuilder

    def sqrt(self, x: Num) -> Num:
        return Num(self.b, vm.sqrt(self.b, x.v))

    def fmax(self, x: Num, y: "Num | float") -> Num:
        return Num(self.b, vm.maxnum(self.b, x.v, x._of(y)))

    def where(self, cond: Num, x: "Num | float", y: "Num | float") -> Num:
        return Num(self.b, self.b.select(cond.v, cond._of(x), cond._of(y)))


@dataclass(frozen=True)
class Slot:
    """An f32 array at `offset` of the arena, or of the thunk's shared scratch."""

    offset: int
    scratch: bool = False

    def load(self, ctx: EmitContext, index) -> Num:
        return Num(ctx.b, ctx.load(self.offset, F32, index, base=ctx.shared if self.scratch else None))

    def store(self, ctx: EmitContext, value: "Num | ir.Value", index) -> None:
        v = value.v if isinstance(value, Num) else value
        ctx.store(self.offset, v, index, base=ctx.shared if self.scratch else None)


def load_row(ctx: EmitContext, slot: Slot, row, width: int) -> list[Num]:
    """Elements `row·width …` of a slot."""
    base = imul(ctx.b, row, width)
    return [slot.load(ctx, iadd(ctx.b, base, k)) for k in range(width)]


# ── checks ──────────────────────────────────────────────────────────────────

def _need(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ValidationError(message, field=field)


def check_splats(t) -> None:
    """Every parameter buffer holds `positions_len / 3` splats; SH of degree 0–3; tiles of ≥ 1 pixel."""
    _need(t.tile_size >= 1, "tile_size", f"tile_size = {t.tile_size}: tiles need at least one pixel")
    _need(t.positions_len % 3 == 0, "positions_len", f"positions_len = {t.positions_len} is not 3 per splat")
    n = S.splat_count(t)
    for name, per in (("scales", 3), ("rotations", 4), ("opacities", 1), ("colors", 3)):
        got = getattr(t, f"{name}_len")
        _need(got == per * n, f"{name}_len", f"{name}_len = {got}, but {n} splats need {per * n}")
    k, rest = divmod(t.sh_coeffs_len, 3 * n) if n else (0, t.sh_coeffs_len)
    _need(rest == 0 and (k == 0 or k in S.SH_DEGREES), "sh_coeffs_len",
          f"sh_coeffs_len = {t.sh_coeffs_len}: {n} splats need 0 or 3·n·k with k in {sorted(S.SH_DEGREES)}")


def check_image(t) -> None:
    """`dst_len` is the RGBA image."""
    _need(t.dst_len == 4 * t.width * t.height, "dst_len",
          f"dst_len = {t.dst_len}, but a {t.width}×{t.height} RGBA image has {4 * t.width * t.height}")


def check_meta(t) -> None:
    """`meta_len` covers the camera and background."""
    _need(t.meta_len >= S.META_USED, "meta_len", f"meta_len = {t.meta_len}: the camera needs {S.META_USED}")


def check_render(t: T.GaussianSplatRender) -> None:
    check_splats(t)
    check_image(t)


def check_prepare(t: T.GaussianSplatPrepare) -> None:
    check_splats(t)
    check_meta(t)
    n = S.splat_count(t)
    _need(t.prep_len == S.PREP * n, "prep_len", f"prep_len = {t.prep_len}, but {n} splats need {S.PREP * n}")


def check_rasterize(t: T.GaussianSplatRasterize) -> None:
    _need(t.tile_size >= 1, "tile_size", f"tile_size = {t.tile_size}: tiles need at least one pixel")
    check_meta(t)
    check_image(t)
    _need(t.prep_len == S.PREP * t.count, "prep_len",
          f"prep_len = {t.prep_len}, but count = {t.count} prepared splats need {S.PREP * t.count}")


# ── prepare ─────────────────────────────────────────────────────────────────

def load_meta(ctx: EmitContext, t) -> list[Num]:
    """The camera and background (`reference.splat` meta layout)."""
    return [Slot(t.meta_off).load(ctx, k) for k in range(S.META_USED)]


def project_one(ctx: EmitContext, t, meta: list[Num], i) -> list[Num]:
    """Splat `i`'s prepared record (zeros with depth +inf when culled)."""
    m = IRMath(ctx.b)
    param = lambda name, width: load_row(ctx, Slot(getattr(t, f"{name}_off")), i, width)
    pos = param("positions", 3)
    visible, (depth, u, v, ca, cb, cc, radius) = project(m, meta, t, pos, param("scales", 3), param("rotations", 4))
    k = S.sh_per_channel(t)
    if k:
        coeffs = param("sh_coeffs", 3 * k)
        rgb = S.sh_colour(m, S.view_direction(m, meta, pos), [coeffs[3 * j:3 * j + 3] for j in range(k)])
    else:
        rgb = param("colors", 3)
    record = [depth, u, v, ca, cb, cc, param("opacities", 1)[0], *rgb, radius]
    return [m.where(visible, f, INF if j == S.DEPTH else 0.0) for j, f in enumerate(record)]


def project(m: IRMath, meta: list[Num], t, pos, scale, rot):
    """`reference.splat.project` in f32 IR."""
    return S.project(m, meta, float(t.radius_scale), pos, scale, rot)


def depth_rank(ctx: EmitContext, stage: Slot, n: int, i: ir.Value) -> ir.Value:
    """Position of record `i` in the stable depth order: #{j : d_j < d_i, or d_j = d_i and j < i}."""
    b = ctx.b
    key = stage.load(ctx, imul(b, i, S.PREP)).v

    def count(j: ir.Value, acc: list[ir.Value]) -> list[ir.Value]:
        other = stage.load(ctx, imul(b, j, S.PREP)).v
        before = b.or_(b.fcmp_ordered("<", other, key),
                       b.and_(b.fcmp_ordered("==", other, key), b.icmp_signed("<", j, i)))
        return [b.add(acc[0], b.zext(before, I64))]
    return carried_loop(ctx, 0, n, 1, [I64(0)], count, name="rank")[0]


def emit_prepare(ctx: EmitContext, t, out: Slot) -> int:
    """Project every splat and write the records, depth-sorted, to `out`; returns the splat count."""
    n = S.splat_count(t)
    if n == 0:
        return 0
    stage = Slot(ctx.scratch_alloc(4 * S.PREP * n), scratch=True)
    meta = load_meta(ctx, t)
    with ctx.for_range(0, n, name="project") as i:
        for k, f in enumerate(project_one(ctx, t, meta, i)):
            stage.store(ctx, f, iadd(ctx.b, imul(ctx.b, i, S.PREP), k))
    with ctx.for_range(0, n, name="place") as i:
        rank = depth_rank(ctx, stage, n, i)
        for k, f in enumerate(load_row(ctx, stage, i, S.PREP)):
            out.store(ctx, f, iadd(ctx.b, imul(ctx.b, rank, S.PREP), k))
    return n


# ── rasterize ───────────────────────────────────────────────────────────────

def composite(ctx: EmitContext, t, prep: Slot, count: int, px: ir.Value, py: ir.Value,
              background: Sequence[Num]) -> list[Num]:
    """RGBA of pixel (px, py): front-to-back over the splats whose tile box covers its tile."""
    b = ctx.b
    m = IRMath(b)
    f = lambda x: Num(b, b.uitofp(x, F32))
    ts = t.tile_size
    cx, cy = f(px) + 0.5, f(py) + 0.5
    tx, ty = f(b.udiv(px, I64(ts))), f(b.udiv(py, I64(ts)))
    cap = S.limit(t.max_list_entries, t.max_splat_steps)
    floor = lambda x: Num(b, vm.floor(b, x.v))
    ceil = lambda x: Num(b, vm.ceil(b, x.v))

    def step(k: ir.Value, carried: list[ir.Value]) -> list[ir.Value]:
        trans, red, green, blue, seen = (Num(b, v) for v in carried[:5])
        active = Num(b, carried[5])
        _, u, v, ca, cb, cc, opacity, *rgb, r = load_row(ctx, prep, k, S.PREP)
        in_tile = ((floor((u - r) / ts) <= tx) & (tx < ceil((u + r) / ts))
                   & (floor((v - r) / ts) <= ty) & (ty < ceil((v + r) / ts)) & (r > 0.0))
        listed = active & in_tile & (seen < cap) if cap != INF else active & in_tile
        dx, dy = cx - u, cy - v
        power = -0.5 * (ca * dx * dx + cc * dy * dy) - cb * dx * dy
        alpha = opacity * Num(b, vm.exp(b, power.v))
        alpha = m.where(alpha > S.MAX_ALPHA, S.MAX_ALPHA, alpha)
        draw = listed & (power <= 0.0) & (alpha >= float(t.alpha_cutoff))
        after = trans * (1.0 - alpha)
        stop = draw & (after <= float(t.transmittance_threshold))
        draw = Num(b, b.and_(draw.v, b.not_(stop.v)))
        weight = alpha * trans
        new = [m.where(draw, acc + weight * c, acc) for acc, c in zip((red, green, blue), rgb)]
        return [m.where(draw, after, trans).v, *(x.v for x in new), (seen + m.where(in_tile, 1.0, 0.0)).v,
                b.and_(active.v, b.not_(stop.v))]

    zero = ir.Constant(F32, 0.0)
    init = [ir.Constant(F32, 1.0), zero, zero, zero, zero, ir.Constant(I1, 1)]
    trans, red, green, blue, _, _ = (Num(b, v) for v in carried_loop(ctx, 0, count, 1, init, step, name="splat"))
    return [c + trans * bg for c, bg in zip((red, green, blue), background)] + [1.0 - trans]


def emit_rasterize(ctx: EmitContext, t, prep: Slot, count: int) -> None:
    """Rows of pixels in parallel, each pixel `composite`d into `dst` (RGBA, row-major)."""
    if t.width == 0 or t.height == 0:
        return
    dst = Slot(t.dst_off)

    def rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        background = load_meta(sub, t)[S.BACKGROUND]
        with sub.for_range(start, stop, name="py") as py:
            with sub.for_range(0, t.width, name="px") as px:
                rgba = composite(sub, t, prep, count, px, py, background)
                pixel = b.add(b.mul(py, I64(t.width)), px)
                for ch, value in enumerate(rgba):
                    dst.store(sub, value, b.add(b.mul(pixel, I64(4)), I64(ch)))
    ctx.parallel_for(t.height, rows, grain=1, min_work=1)


@lowering(T.GaussianSplatRender, check=check_render)
def gaussian_splat_render(ctx: EmitContext, t: T.GaussianSplatRender) -> None:
    """Prepare into scratch, then rasterize."""
    stage = Slot(ctx.scratch_alloc(4 * S.PREP * max(1, S.splat_count(t))), scratch=True)
    emit_rasterize(ctx, t, stage, emit_prepare(ctx, t, stage))


@lowering(T.GaussianSplatPrepare, check=check_prepare)
def gaussian_splat_prepare(ctx: EmitContext, t: T.GaussianSplatPrepare) -> None:
    """The depth-sorted prepared splats at `prep`."""
    emit_prepare(ctx, t, Slot(t.prep_off))


@lowering(T.GaussianSplatRasterize, check=check_rasterize)
def gaussian_splat_rasterize(ctx: EmitContext, t: T.GaussianSplatRasterize) -> None:
    """Composite `count` prepared splats, in their stored order."""
    emit_rasterize(ctx, t, Slot(t.prep_off), t.count)
