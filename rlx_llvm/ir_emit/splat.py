"""3-D Gaussian splatting — `GaussianSplatPrepare`, `GaussianSplatRasterize`, `GaussianSplatRender` (their
composition) and `GaussianSplatRenderBackward` as scalar IR (docs/lowering-splat.md; layouts in reference/splat.py).

Prepare projects every splat (the EWA formulas of `reference.splat.project`, emitted on `Num` values)
into an unsorted staging area of scratch, then places each record at its stable depth rank (a counted
O(n²) rank count: no data-dependent control flow, so any bytes are safe).  Rasterize runs rows of pixels
in parallel; each pixel walks the sorted list branch-free, compositing the splats whose tile bounding box
covers its tile, front to back.  The backward walks each pixel back to front into per-record gradients,
then maps them to the parameters with forward-mode tangents (`Dual`) through the same projection formulas.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

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
        if isinstance(x, Dual):
            return NotImplemented
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


def emit_prepare(ctx: EmitContext, t, out: Slot) -> Slot | None:
    """Project every splat and write the records, depth-sorted, to `out`; returns the unsorted staging
    (None without splats)."""
    n = S.splat_count(t)
    if n == 0:
        return None
    stage = Slot(ctx.scratch_alloc(4 * S.PREP * n), scratch=True)
    meta = load_meta(ctx, t)
    with ctx.for_range(0, n, name="project") as i:
        for k, f in enumerate(project_one(ctx, t, meta, i)):
            stage.store(ctx, f, iadd(ctx.b, imul(ctx.b, i, S.PREP), k))
    with ctx.for_range(0, n, name="place") as i:
        rank = depth_rank(ctx, stage, n, i)
        for k, f in enumerate(load_row(ctx, stage, i, S.PREP)):
            out.store(ctx, f, iadd(ctx.b, imul(ctx.b, rank, S.PREP), k))
    return stage


# ── rasterize ───────────────────────────────────────────────────────────────

@dataclass
class Pixel:
    """One pixel's centre and tile, as f32 `Num`s."""

    cx: Num
    cy: Num
    tx: Num
    ty: Num

    @classmethod
    def at(cls, b: ir.IRBuilder, t, px: ir.Value, py: ir.Value) -> "Pixel":
        f = lambda x: Num(b, b.uitofp(x, F32))
        ts = I64(t.tile_size)
        return cls(f(px) + 0.5, f(py) + 0.5, f(b.udiv(px, ts)), f(b.udiv(py, ts)))


@dataclass
class Hit:
    """How prepared splat `rec` meets a pixel: tile membership, the Gaussian's exponent and value, alpha."""

    rec: list[Num]
    dx: Num
    dy: Num
    in_tile: Num
    power: Num
    gauss: Num
    clamped: Num
    alpha: Num


def hit(ctx: EmitContext, t, rec: list[Num], pix: Pixel) -> Hit:
    """`Hit` of record `rec` at `pix` (the formulas of `reference.splat.rasterize`)."""
    b, m, ts = ctx.b, IRMath(ctx.b), t.tile_size
    floor = lambda x: Num(b, vm.floor(b, x.v))
    ceil = lambda x: Num(b, vm.ceil(b, x.v))
    _, u, v, ca, cb, cc, opacity, _, _, _, r = rec
    in_tile = ((floor((u - r) / ts) <= pix.tx) & (pix.tx < ceil((u + r) / ts))
               & (floor((v - r) / ts) <= pix.ty) & (pix.ty < ceil((v + r) / ts)) & (r > 0.0))
    dx, dy = pix.cx - u, pix.cy - v
    power = -0.5 * (ca * dx * dx + cc * dy * dy) - cb * dx * dy
    gauss = Num(b, vm.exp(b, power.v))
    raw = opacity * gauss
    clamped = raw > S.MAX_ALPHA
    return Hit(rec, dx, dy, in_tile, power, gauss, clamped, m.where(clamped, S.MAX_ALPHA, raw))


def is_listed(t, h: Hit, seen: Num) -> Num:
    """Whether the hit is among its tile's first `limit` entries (`seen` entries before it)."""
    cap = S.limit(t.max_list_entries, t.max_splat_steps)
    return h.in_tile & (seen < cap) if cap != INF else h.in_tile


def drawn(t, h: Hit, listed: Num) -> Num:
    """A listed hit with a non-positive exponent and alpha ≥ `alpha_cutoff`."""
    return listed & (h.power <= 0.0) & (h.alpha >= float(t.alpha_cutoff))


def both(b: ir.IRBuilder, x: Num, y: Num, negate_y: bool = False) -> Num:
    """`x ∧ y` (or `x ∧ ¬y`) of i1 `Num`s."""
    return Num(b, b.and_(x.v, b.not_(y.v) if negate_y else y.v))


def composite(ctx: EmitContext, t, prep: Slot, count: int, pix: Pixel) -> tuple[list[Num], Num, Num, ir.Value]:
    """(RGB, transmittance, tile entries seen, index the walk stopped at — `count` if it did not) of a
    front-to-back walk over the splats whose tile box covers the pixel's tile."""
    b, m = ctx.b, IRMath(ctx.b)

    def step(k: ir.Value, carried: list[ir.Value]) -> list[ir.Value]:
        trans, red, green, blue, seen = (Num(b, v) for v in carried[:5])
        active, end = Num(b, carried[5]), carried[6]
        h = hit(ctx, t, load_row(ctx, prep, k, S.PREP), pix)
        draw = drawn(t, h, both(b, active, is_listed(t, h, seen)))
        after = trans * (1.0 - h.alpha)
        stop = draw & (after <= float(t.transmittance_threshold))
        draw = both(b, draw, stop, negate_y=True)
        weight = h.alpha * trans
        new = [m.where(draw, acc + weight * c, acc) for acc, c in zip((red, green, blue), h.rec[S.RED:S.BLUE + 1])]
        return [m.where(draw, after, trans).v, *(x.v for x in new), (seen + m.where(h.in_tile, 1.0, 0.0)).v,
                both(b, active, stop, negate_y=True).v, b.select(stop.v, k, end)]

    zero = ir.Constant(F32, 0.0)
    init = [ir.Constant(F32, 1.0), zero, zero, zero, zero, ir.Constant(I1, 1), I64(count)]
    out = carried_loop(ctx, 0, count, 1, init, step, name="splat")
    trans, red, green, blue, seen = (Num(b, v) for v in out[:5])
    return [red, green, blue], trans, seen, out[6]


def pixels(ctx: EmitContext, t, body, parallel: bool = True) -> None:
    """`body(ctx, pixel index, Pixel)` over rows of the image, rows split across threads if `parallel`."""
    def rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        with sub.for_range(start, stop, name="py") as py:
            with sub.for_range(0, t.width, name="px") as px:
                body(sub, b.add(b.mul(py, I64(t.width)), px), Pixel.at(b, t, px, py))
    if parallel:
        ctx.parallel_for(t.height, rows, grain=1, min_work=1)
    else:
        rows(ctx, I64(0), I64(t.height))


def emit_rasterize(ctx: EmitContext, t, prep: Slot, count: int) -> None:
    """Every pixel `composite`d into `dst` (RGBA, row-major) over the background."""
    if t.width == 0 or t.height == 0:
        return
    dst = Slot(t.dst_off)

    def pixel(sub: EmitContext, at: ir.Value, pix: Pixel) -> None:
        rgb, trans, _, _ = composite(sub, t, prep, count, pix)
        background = load_meta(sub, t)[S.BACKGROUND]
        rgba = [c + trans * bg for c, bg in zip(rgb, background)] + [1.0 - trans]
        for ch, value in enumerate(rgba):
            dst.store(sub, value, sub.b.add(sub.b.mul(at, I64(4)), I64(ch)))
    pixels(ctx, t, pixel)


@lowering(T.GaussianSplatRender, check=check_render)
def gaussian_splat_render(ctx: EmitContext, t: T.GaussianSplatRender) -> None:
    """Prepare into scratch, then rasterize."""
    stage = Slot(ctx.scratch_alloc(4 * S.PREP * max(1, S.splat_count(t))), scratch=True)
    emit_prepare(ctx, t, stage)
    emit_rasterize(ctx, t, stage, S.splat_count(t))


@lowering(T.GaussianSplatPrepare, check=check_prepare)
def gaussian_splat_prepare(ctx: EmitContext, t: T.GaussianSplatPrepare) -> None:
    """The depth-sorted prepared splats at `prep`."""
    emit_prepare(ctx, t, Slot(t.prep_off))


@lowering(T.GaussianSplatRasterize, check=check_rasterize)
def gaussian_splat_rasterize(ctx: EmitContext, t: T.GaussianSplatRasterize) -> None:
    """Composite `count` prepared splats, in their stored order."""
    emit_rasterize(ctx, t, Slot(t.prep_off), t.count)


# ── backward ────────────────────────────────────────────────────────────────

class Dual:
    """A `Num` with tangents `t[p] = ∂value/∂x_p` (forward-mode derivatives along the `x_p` seeded)."""

    __slots__ = ("x", "t")

    def __init__(self, x: Num, t: list[Num]) -> None:
        self.x, self.t = x, t

    def _parts(self, y) -> tuple[Num | float, list | None]:
        return (y.x, y.t) if isinstance(y, Dual) else (y, None)

    def __add__(self, y):
        v, t = self._parts(y)
        return Dual(self.x + v, self.t if t is None else [a + c for a, c in zip(self.t, t)])

    __radd__ = __add__

    def __sub__(self, y):
        v, t = self._parts(y)
        return Dual(self.x - v, self.t if t is None else [a - c for a, c in zip(self.t, t)])

    def __rsub__(self, y):
        return Dual(y - self.x, [-a for a in self.t])

    def __neg__(self):
        return Dual(-self.x, [-a for a in self.t])

    def __mul__(self, y):
        v, t = self._parts(y)
        if t is None:
            return Dual(self.x * v, [a * v for a in self.t])
        return Dual(self.x * v, [a * v + self.x * c for a, c in zip(self.t, t)])

    __rmul__ = __mul__

    def __truediv__(self, y):
        v, t = self._parts(y)
        q = self.x / v
        if t is None:
            return Dual(q, [a / v for a in self.t])
        return Dual(q, [(a - q * c) / v for a, c in zip(self.t, t)])

    def __rtruediv__(self, y):
        q = y / self.x
        return Dual(q, [-(q * a) / self.x for a in self.t])

    def __gt__(self, y): return self.x > self._parts(y)[0]
    def __lt__(self, y): return self.x < self._parts(y)[0]


@dataclass(frozen=True)
class DualMath:
    """`sqrt`, `fmax`, `where` on `Dual`s (and plain `Num`s / floats)."""

    b: ir.IRBuilder
    tangents: int

    def lift(self, x) -> Dual:
        zero = Num(self.b, ir.Constant(F32, 0.0))
        if isinstance(x, Dual):
            return x
        return Dual(x if isinstance(x, Num) else zero + float(x), [zero] * self.tangents)

    def sqrt(self, x: Dual) -> Dual:
        r = IRMath(self.b).sqrt(x.x)
        return Dual(r, [a * (0.5 / r) for a in x.t])

    def fmax(self, x: Dual, y: float) -> Dual:
        m = IRMath(self.b)
        above = x.x > y
        return Dual(m.fmax(x.x, y), [m.where(above, a, 0.0) for a in x.t])

    def where(self, cond: Num, x, y) -> Dual:
        m = IRMath(self.b)
        x, y = self.lift(x), self.lift(y)
        return Dual(m.where(cond, x.x, y.x), [m.where(cond, a, c) for a, c in zip(x.t, y.t)])


def seeded(b: ir.IRBuilder, values: list[Num], first: int, tangents: int) -> list[Dual]:
    """`values` as Duals whose tangent `first + j` is 1 for the j-th value."""
    one, zero = (Num(b, ir.Constant(F32, c)) for c in (1.0, 0.0))
    return [Dual(v, [one if p == first + j else zero for p in range(tangents)]) for j, v in enumerate(values)]


TANGENTS = 10   # ∂/∂ position (3), scale (3), rotation (4)


def check_backward(t: T.GaussianSplatRenderBackward) -> None:
    """The splat buffers, `d_loss` as the RGBA image, `packed` as every parameter; no anisotropy cap."""
    check_splats(t)
    _need(t.d_loss_len == 4 * t.width * t.height, "d_loss_len",
          f"d_loss_len = {t.d_loss_len}, but a {t.width}×{t.height} RGBA image has {4 * t.width * t.height}")
    total = sum(getattr(t, f"{name}_len") for name in S.GRAD_PARAMS)
    _need(t.packed_len == total, "packed_len", f"packed_len = {t.packed_len}, but the parameters hold {total}")
    _need(t.max_anisotropy == 0.0, "max_anisotropy",
          f"max_anisotropy = {t.max_anisotropy}: an anisotropy cap is not supported (0 = none)")


def backprop_pixel(ctx: EmitContext, t, prep: Slot, grad: Slot, count: int, at: ir.Value, pix: Pixel) -> None:
    """Add one pixel's ∂L/∂(u, v, conic, opacity, RGB) to `grad` (rows as `prep`): the forward walk, then
    back to front with `T_k = T_{k+1}/(1 − α_k)` and the colour `S_k` composited behind splat k."""
    b, m = ctx.b, IRMath(ctx.b)
    _, trans_end, seen_end, end = composite(ctx, t, prep, count, pix)
    clip = float(t.loss_grad_clip)
    d = [Slot(t.d_loss_off).load(ctx, b.add(b.mul(at, I64(4)), I64(ch))) for ch in range(4)]
    d = [m.where(g > clip, clip, m.where(g < -clip, -clip, g)) for g in d] if clip > 0 else d
    behind = [trans_end * bg for bg in load_meta(ctx, t)[S.BACKGROUND]]

    def step(j: ir.Value, carried: list[ir.Value]) -> list[ir.Value]:
        k = b.sub(I64(count - 1), j)
        trans, *rest = (Num(b, v) for v in carried)
        behind, seen = rest[:3], rest[3]
        h = hit(ctx, t, load_row(ctx, prep, k, S.PREP), pix)
        seen = seen - m.where(h.in_tile, 1.0, 0.0)
        draw = drawn(t, h, both(b, is_listed(t, h, seen), Num(b, b.icmp_signed("<", k, end))))
        keep = 1.0 - h.alpha
        t_k = trans / keep
        colour = h.rec[S.RED:S.BLUE + 1]
        d_alpha = sum(g * (c * t_k - s / keep) for g, c, s in zip(d, colour, behind)) + d[3] * trans_end / keep
        d_power = m.where(h.clamped, 0.0, d_alpha * h.alpha)
        ca, cb, cc = h.rec[S.CONIC_A:S.CONIC_C + 1]
        dx, dy = h.dx, h.dy
        fields = {S.U: d_power * (ca * dx + cb * dy), S.V: d_power * (cc * dy + cb * dx),
                  S.CONIC_A: d_power * (-0.5 * (dx * dx)), S.CONIC_B: -(d_power * (dx * dy)),
                  S.CONIC_C: d_power * (-0.5 * (dy * dy)), S.OPACITY: m.where(h.clamped, 0.0, d_alpha * h.gauss),
                  **{S.RED + ch: g * h.alpha * t_k for ch, g in enumerate(d[:3])}}
        for f, g in fields.items():
            idx = b.add(b.mul(k, I64(S.PREP)), I64(f))
            grad.store(ctx, grad.load(ctx, idx) + m.where(draw, g, 0.0), idx)
        behind = [m.where(draw, s + c * h.alpha * t_k, s) for s, c in zip(behind, colour)]
        return [m.where(draw, t_k, trans).v, *(x.v for x in behind), seen.v]

    carried_loop(ctx, 0, count, 1, [trans_end.v, *(x.v for x in behind), seen_end.v], step, name="back")


def parameter_grads(ctx: EmitContext, t, meta: list[Num], i: ir.Value, d_rec: list[Num]) -> dict[str, list[Num]]:
    """Splat `i`'s gradients by buffer from ∂L/∂(its record): forward-mode tangents through the projection
    (and the SH view direction) for position, scale and rotation; the rest in closed form."""
    b, m = ctx.b, IRMath(ctx.b)
    dm = DualMath(b, TANGENTS)
    param = lambda name, width: load_row(ctx, Slot(getattr(t, f"{name}_off")), i, width)
    pos, scale, rot = param("positions", 3), param("scales", 3), param("rotations", 4)
    dual = seeded(b, pos + scale + rot, 0, TANGENTS)
    visible, (_, u, v, ca, cb, cc, _) = S.project(dm, meta, float(t.radius_scale), dual[:3], dual[3:6], dual[6:])
    outputs = {S.U: u, S.V: v, S.CONIC_A: ca, S.CONIC_B: cb, S.CONIC_C: cc}
    k = S.sh_per_channel(t)
    zero = lambda count: [Num(b, ir.Constant(F32, 0.0))] * count
    grads = {"opacities": [d_rec[S.OPACITY]], "colors": d_rec[S.RED:S.BLUE + 1], "sh_coeffs": []}
    if k:
        coeffs = param("sh_coeffs", 3 * k)
        rows = [coeffs[3 * j:3 * j + 3] for j in range(k)]
        rgb = S.sh_colour(dm, S.view_direction(dm, meta, dual[:3]), rows)
        outputs.update({S.RED + ch: c for ch, c in enumerate(rgb)})
        basis = S.sh_basis(*S.view_direction(m, meta, pos), k)
        lit = [sum(y * c[ch] for y, c in zip(basis, rows)) + 0.5 > 0.0 for ch in range(3)]
        grads["colors"] = zero(3)
        grads["sh_coeffs"] = [m.where(lit[ch], d_rec[S.RED + ch] * basis[j], 0.0)
                              if int(j ** 0.5) <= t.sh_band else zero(1)[0] for j in range(k) for ch in range(3)]
    tangent = [sum(d_rec[f] * out.t[p] for f, out in outputs.items()) for p in range(TANGENTS)]
    grads.update(positions=tangent[:3], scales=tangent[3:6], rotations=tangent[6:])
    return {name: [m.where(visible, g, 0.0) for g in values] for name, values in grads.items()}


@lowering(T.GaussianSplatRenderBackward, check=check_backward)
def gaussian_splat_render_backward(ctx: EmitContext, t: T.GaussianSplatRenderBackward) -> None:
    """Prepare, backpropagate every pixel into per-record gradients (one thread: they accumulate), then
    map each splat's record gradient to its parameters and write `packed`."""
    n = S.splat_count(t)
    packed = Slot(t.packed_off)
    if n == 0:
        return
    ordered = Slot(ctx.scratch_alloc(4 * S.PREP * n), scratch=True)
    grad = Slot(ctx.scratch_alloc(4 * S.PREP * n), scratch=True)
    stage = emit_prepare(ctx, t, ordered)
    with ctx.for_range(0, S.PREP * n, name="zero") as j:
        grad.store(ctx, ir.Constant(F32, 0.0), j)
    if t.width and t.height:
        pixels(ctx, t, lambda sub, at, pix: backprop_pixel(sub, t, ordered, grad, n, at, pix), parallel=False)
    meta = load_meta(ctx, t)
    starts = dict(zip(S.GRAD_PARAMS, itertools.accumulate((getattr(t, f"{p}_len") for p in S.GRAD_PARAMS),
                                                          initial=0)))
    with ctx.for_range(0, n, name="params") as i:
        d_rec = load_row(ctx, grad, depth_rank(ctx, stage, n, i), S.PREP)
        for name, values in parameter_grads(ctx, t, meta, i, d_rec).items():
            first = imul(ctx.b, i, len(values))
            for j, g in enumerate(values):
                packed.store(ctx, g, iadd(ctx.b, iadd(ctx.b, first, starts[name]), j))
