"""The FFT family as native code (semantics.md §2.16, §3.11; docs/lowering-fft.md): `Fft1d`.

Every table is computed in f64 at compile time for the thunk's `n` and stored as a private constant
global in the rows' real type (f32 rows: the f64 values rounded once).  A row is transformed in
per-thread scratch, split into re and im arrays:

* **n a power of two** — iterative radix-2 decimation in time: the row is scattered to bit-reversed
  positions, then `log2 n` stages of butterflies, each stage's `n/2` twiddles contiguous in one
  table, so the butterflies of a block run across vector lanes;
* **n ≤ 16 otherwise** — the naive DFT, unrolled with constant twiddles;
* **any other n** — Bluestein: `X_k = c_k · Σ_j (x_j c_j) conj(c_{k−j})` with the chirp
  `c_k = e^{∓πi k²/n}`, the convolution as a power-of-two FFT of size `m ≥ 2n − 1` (the same radix-2
  code), a product with the chirp's spectrum (a table) and a second forward FFT of the conjugate.

Rows run in parallel; the `norm_tag` scale (§2.16) is applied as the row is written.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from llvmlite import ir

from .. import thunks as T
from ..dtypes import DType
from ..errors import ValidationError
from ..reference.fft import REAL, interleaved, norm_scale
from ..registry import lowering
from .context import EmitContext
from .toolkit import F32, F64, I32, I64, PTR, Index, carried_loop, iadd, imul, scratch_ptr, sizeof, vec, zero_bytes

NAIVE_MAX = 16          # a length up to this that is not a power of two runs the unrolled DFT
PAR_WORK = 1 << 15      # butterflies worth forking a thread for

Pair = tuple[ir.Value, ir.Value]   # (re, im), scalars or vectors


def is_pow2(n: int) -> bool:
    """Whether `n ≥ 1` is a power of two."""
    return n & (n - 1) == 0


def bluestein_size(n: int) -> int:
    """The power-of-two convolution length of Bluestein's algorithm: the least `m ≥ 2n − 1`."""
    return 1 << (2 * n - 2).bit_length()


def check_fft1d(t: T.Fft1d) -> None:
    """`n_complex ≥ 1`, a known `norm_tag` and a float or complex row type."""
    if t.n_complex < 1:
        raise ValidationError(f"n_complex must be at least 1, got {t.n_complex}", field="n_complex")
    if t.norm_tag not in (0, 1, 2):
        raise ValidationError(f"unknown norm_tag {t.norm_tag} (0 Backward, 1 Forward, 2 Ortho)", field="norm_tag")
    if t.dtype not in REAL:
        raise ValidationError(f"Fft1d rows of {t.dtype.value} are not supported (f32, f64, c64, c128)", field="dtype")


# ── complex arithmetic on (re, im) pairs ────────────────────────────────────

def cmul(b: ir.IRBuilder, x: Pair, y: Pair) -> Pair:
    """`x · y`."""
    return (b.fsub(b.fmul(x[0], y[0]), b.fmul(x[1], y[1])), b.fadd(b.fmul(x[0], y[1]), b.fmul(x[1], y[0])))


def cscale(b: ir.IRBuilder, x: Pair, s: float) -> Pair:
    """`x · s` for a real constant `s` (nothing for 1)."""
    if s == 1.0:
        return x
    k = [ir.Constant(x[0].type, s)] if not isinstance(x[0].type, ir.VectorType) else None
    c = k[0] if k else ir.Constant(x[0].type, [ir.Constant(x[0].type.element, s)] * x[0].type.count)
    return b.fmul(x[0], c), b.fmul(x[1], c)


# ── constant tables ─────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Table:
    """A complex table as two arrays (re, im) of element type `ty`: private constant globals, or pointers."""

    re: ir.Value
    im: ir.Value
    ty: ir.Type

    @classmethod
    def of(cls, ctx: EmitContext, name: str, ty: ir.Type, values: np.ndarray) -> "Table":
        """The complex128 `values` rounded to `ty`, as globals named after the thunk's function."""
        def part(suffix: str, xs: np.ndarray) -> ir.GlobalVariable:
            aty = ir.ArrayType(ty, len(xs))
            g = ir.GlobalVariable(ctx.module, aty, name=f"{ctx.fn.name}.{name}.{suffix}")
            g.global_constant, g.linkage = True, "private"
            g.initializer = ir.Constant(aty, [ir.Constant(ty, float(v)) for v in xs])
            return g
        return cls(part("re", values.real), part("im", values.imag), ty)

    def load(self, b: ir.IRBuilder, index: Index, width: int = 1) -> Pair:
        """Entries `index … index + width − 1`."""
        return tuple(b.load(b.gep(g, [I64(index) if isinstance(index, int) else index], source_etype=self.ty,
                                  inbounds=True), typ=vec(self.ty, width), align=sizeof(self.ty))
                     for g in (self.re, self.im))


def index_table(ctx: EmitContext, name: str, values: Sequence[int]) -> ir.GlobalVariable:
    """A private constant i32 table."""
    aty = ir.ArrayType(I32, len(values))
    g = ir.GlobalVariable(ctx.module, aty, name=f"{ctx.fn.name}.{name}")
    g.global_constant, g.linkage = True, "private"
    g.initializer = ir.Constant(aty, [ir.Constant(I32, int(v)) for v in values])
    return g


def bit_reversed(m: int) -> list[int]:
    """`rev[i]`: `i` with its `log2 m` bits reversed."""
    bits = m.bit_length() - 1
    return [int(format(i, f"0{bits}b")[::-1], 2) if bits else 0 for i in range(m)]


def roots(k: np.ndarray, d: int, sign: int) -> np.ndarray:
    """`e^{sign·2πi k/d}` in f64, exact (0, ±1) at multiples of a quarter turn."""
    k = np.asarray(k, dtype=np.int64) % d
    z = np.exp(sign * 2j * np.pi * k / d)
    quarter, rest = np.divmod(4 * k, d)
    exact = np.array([1, sign * 1j, -1, -sign * 1j])[quarter % 4]
    return np.where(rest == 0, exact, z)


def stage_twiddles(m: int) -> np.ndarray:
    """Forward twiddles of every radix-2 stage, stage of half-size `h` at `[h − 1, 2h − 1)`: `e^{−πi j/h}`."""
    parts = [roots(np.arange(h), 2 * h, -1) for h in (1 << s for s in range(m.bit_length() - 1))]
    return np.concatenate(parts) if parts else np.zeros(0, complex)


# ── rows in the arena, split arrays in scratch ──────────────────────────────

@dataclass(frozen=True)
class Rows:
    """`Fft1d` rows at arena `offset`: `2n` reals of `ty` each, real-block or interleaved."""

    offset: int
    n: int
    ty: ir.Type
    interleaved: bool

    def positions(self, b: ir.IRBuilder, row: ir.Value, i: Index) -> tuple[Index, Index]:
        """Element indices of the re and im parts of point `i` of `row`."""
        base = imul(b, row, 2 * self.n)
        if self.interleaved:
            re = iadd(b, base, imul(b, i, 2))
            return re, iadd(b, re, 1)
        re = iadd(b, base, i)
        return re, iadd(b, re, self.n)

    def load(self, ctx: EmitContext, row: ir.Value, i: Index) -> Pair:
        """Point `i` of `row`."""
        return tuple(ctx.load(self.offset, self.ty, at) for at in self.positions(ctx.b, row, i))

    def store(self, ctx: EmitContext, row: ir.Value, i: Index, z: Pair) -> None:
        """Points `i …` of `row` (as many as `z` has lanes)."""
        b, width = ctx.b, z[0].type.count if isinstance(z[0].type, ir.VectorType) else 1
        re_at, im_at = self.positions(b, row, i)
        if self.interleaved and width > 1:
            pairs = ir.Constant(vec(I32, 2 * width), [k for j in range(width) for k in (j, width + j)])
            ctx.store(self.offset, b.shuffle_vector(z[0], z[1], pairs), re_at)
            return
        ctx.store(self.offset, z[0], re_at)
        ctx.store(self.offset, z[1], im_at)


@dataclass(frozen=True)
class Split:
    """`m` complex values in scratch as an re array then an im array (offsets from `scratch_alloc`)."""

    offset: int
    m: Index
    ty: ir.Type

    @classmethod
    def alloc(cls, ctx: EmitContext, m: int, ty: ir.Type) -> "Split":
        return cls(ctx.scratch_alloc(2 * m * sizeof(ty)), m, ty)

    def load(self, ctx: EmitContext, i: Index, width: int = 1, base: ir.Value | None = None) -> Pair:
        """Points `i …` (`width` of them) of the buffer in `base` (default: this thread's scratch)."""
        base = ctx.scratch if base is None else base
        return (ctx.load(self.offset, self.ty, i, width, base=base),
                ctx.load(self.offset, self.ty, iadd(ctx.b, i, self.m), width, base=base))

    def store(self, ctx: EmitContext, i: Index, z: Pair, base: ir.Value | None = None) -> None:
        """Points `i …` of the buffer in `base` (default: this thread's scratch)."""
        base = ctx.scratch if base is None else base
        ctx.store(self.offset, z[0], i, base=base)
        ctx.store(self.offset, z[1], iadd(ctx.b, i, self.m), base=base)

    def pointer(self, ctx: EmitContext) -> ir.Value:
        """The buffer's address in this thread's scratch."""
        return scratch_ptr(ctx, self.offset)

    def zero(self, ctx: EmitContext) -> None:
        zero_bytes(ctx, scratch_ptr(ctx, self.offset), 2 * self.m * sizeof(self.ty))


# ── the radix-2 transform of a Split ────────────────────────────────────────

def type_name(ty: ir.Type) -> str:
    return "f32" if ty == F32 else "f64"


def shared_function(ctx: EmitContext, name: str, args: list[ir.Type], pointers: int,
                    emit: Callable[..., None]) -> ir.Function:
    """The internal `void name(args…)` of `ctx`'s module, its body written by `emit(body_ctx, *args)` on
    first use (its first `pointers` arguments are noalias pointers)."""
    existing = ctx.module.globals.get(name)
    if existing is not None:
        return existing
    fn = ir.Function(ctx.module, ir.FunctionType(ir.VoidType(), args), name=name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    for arg in fn.args[:pointers]:
        arg.add_attribute("noalias")
    body = EmitContext(ctx.module, fn, ctx.index, ctx.thunk, ctx.schedule, ctx.lanes, ctx.declare,
                       arena=fn.args[0], scratch=fn.args[0])
    emit(body, *fn.args)
    body.b.ret_void()
    return fn


def stages_function(ctx: EmitContext, ty: ir.Type) -> ir.Function:
    """`void rlx.fft.stages.<ty>(ptr buf, ptr tw_re, ptr tw_im, i64 m, i64 log2m)`: every radix-2
    butterfly stage, in place on a bit-reversed split buffer of `m` points (natural-order spectrum
    after); stage `h` reads twiddles `[h − 1, 2h − 1)`.  One function per module and real type."""
    def emit(body: EmitContext, buf, tw_re, tw_im, m, log2m) -> None:
        emit_stages(body, Split(0, m, ty), Table(tw_re, tw_im, ty), log2m)
    return shared_function(ctx, f"rlx.fft.stages.{type_name(ty)}", [PTR, PTR, PTR, I64, I64], 3, emit)


def emit_stages(ctx: EmitContext, buf: "Split", twiddles: "Table", log2m: ir.Value) -> None:
    """The stage loop of `stages_function`: whole vectors of butterflies where a block holds them."""
    b, w = ctx.b, ctx.lanes
    with ctx.for_range(0, log2m, name="stage") as s:
        h = b.shl(I64(1), s)
        with ctx.for_range(0, b.lshr(buf.m, b.add(s, I64(1))), name="block") as block:
            start = b.shl(block, b.add(s, I64(1)))

            def butterflies(width: int) -> None:
                with ctx.for_range(0, h, width, name=f"fly{width}") as j:
                    top = b.add(start, j)
                    bottom = b.add(top, h)
                    (ar, ai), (br, bi) = buf.load(ctx, top, width), buf.load(ctx, bottom, width)
                    tr, ti = cmul(b, (br, bi), twiddles.load(b, b.add(j, b.sub(h, I64(1))), width))
                    buf.store(ctx, top, (b.fadd(ar, tr), b.fadd(ai, ti)))
                    buf.store(ctx, bottom, (b.fsub(ar, tr), b.fsub(ai, ti)))
            with b.if_else(b.icmp_signed(">=", h, I64(w))) as (wide, narrow):
                with wide:
                    butterflies(w)
                with narrow:
                    butterflies(1)


@dataclass(frozen=True)
class Radix2:
    """The power-of-two FFT of `m` points: bit-reversal and stage twiddle tables, the shared stages."""

    m: int
    rev: ir.GlobalVariable
    twiddles: Table

    @classmethod
    def of(cls, ctx: EmitContext, name: str, m: int, ty: ir.Type, inverse: bool = False) -> "Radix2":
        """The tables for `m` points (the inverse's twiddles are the conjugates)."""
        tw = stage_twiddles(m)
        return cls(m, index_table(ctx, f"{name}.rev", bit_reversed(m)),
                   Table.of(ctx, f"{name}.tw", ty, np.conj(tw) if inverse else tw))

    def reversed_index(self, b: ir.IRBuilder, i: ir.Value) -> ir.Value:
        """`rev[i]` as i64."""
        at = b.gep(self.rev, [i], source_etype=I32, inbounds=True)
        return b.zext(b.load(at, typ=I32, align=4), I64)

    def scatter(self, ctx: EmitContext, count: int, point: Callable[[ir.Value], Pair], buf: Split) -> None:
        """`buf[rev[i]] = point(i)` for `i < count`."""
        with ctx.for_range(0, count, name="scatter") as i:
            buf.store(ctx, self.reversed_index(ctx.b, i), point(i))

    def stages(self, ctx: EmitContext, buf: Split) -> None:
        """Every butterfly stage on bit-reversed `buf` (a call of the module's shared stage function)."""
        fn = stages_function(ctx, buf.ty)
        ctx.b.call(fn, [buf.pointer(ctx), self.twiddles.re, self.twiddles.im, I64(self.m),
                        I64(self.m.bit_length() - 1)])


# ── Fft1d ───────────────────────────────────────────────────────────────────

def dft_function(ctx: EmitContext, ty: ir.Type) -> ir.Function:
    """`void rlx.fft.dft.<ty>(ptr x, ptr y, ptr w_re, ptr w_im, i64 n)`: the naive DFT
    `y_k = Σ_j x_j w[jk mod n]` of split buffers of `n` points.  One function per module and real type."""
    def emit(body: EmitContext, x_ptr, y_ptr, w_re, w_im, n) -> None:
        b, x, y, w = body.b, Split(0, n, ty), Split(0, n, ty), Table(w_re, w_im, ty)
        zero = ir.Constant(ty, 0.0)
        with body.for_range(0, n, name="k") as k:
            def term(j: ir.Value, acc: list[ir.Value]) -> list[ir.Value]:
                p = cmul(b, x.load(body, j, base=x_ptr), w.load(b, b.urem(b.mul(j, k), n)))
                return [b.fadd(acc[0], p[0]), b.fadd(acc[1], p[1])]
            y.store(body, k, tuple(carried_loop(body, 0, n, 1, [zero, zero], term, name="j")), base=y_ptr)
    return shared_function(ctx, f"rlx.fft.dft.{type_name(ty)}", [PTR, PTR, PTR, PTR, I64], 4, emit)


def chirp(n: int, sign: int) -> np.ndarray:
    """Bluestein's `c_k = e^{sign·πi k²/n}`, `k < n` (k² taken mod 2n exactly)."""
    k = np.arange(n, dtype=np.int64)
    return roots((k * k) % (2 * n), 2 * n, sign)


def chirp_spectrum(n: int, m: int, sign: int) -> np.ndarray:
    """The forward FFT of `conj(c)` wrapped to length `m` (indices `k` and `m − k`), in f64."""
    c = np.conj(chirp(n, sign))
    b = np.zeros(m, complex)
    b[:n] = c
    b[m - n + 1:] = c[1:][::-1]
    return np.fft.fft(b)


def fft1d_rows(ctx: EmitContext, t: T.Fft1d) -> Callable[[EmitContext, ir.Value], None]:
    """The tables of `t`'s transform (in `ctx`'s module) and the emitter of one row."""
    n, ty = t.n_complex, F64 if REAL[t.dtype] is np.float64 else F32
    rows, out = (Rows(off, n, ty, interleaved(t.dtype)) for off in (t.src, t.dst))
    sign, scale = (1 if t.inverse else -1), norm_scale(t.norm_tag, t.inverse, n)
    if is_pow2(n):
        fft = Radix2.of(ctx, "fft", n, ty, t.inverse)

        def radix2_row(sub: EmitContext, row: ir.Value) -> None:
            buf = Split.alloc(sub, n, ty)
            fft.scatter(sub, n, lambda i: rows.load(sub, row, i), buf)
            fft.stages(sub, buf)
            sub.vector_loop(n, lambda k, w: out.store(sub, row, k, cscale(sub.b, buf.load(sub, k, w), scale)))
        return radix2_row
    if n <= NAIVE_MAX:
        twiddles = Table.of(ctx, "dft", ty, roots(np.arange(n), n, sign))

        def naive_row(sub: EmitContext, row: ir.Value) -> None:
            x, y = Split.alloc(sub, n, ty), Split.alloc(sub, n, ty)
            with sub.for_range(0, n, name="load") as i:
                x.store(sub, i, rows.load(sub, row, i))
            sub.b.call(dft_function(sub, ty), [x.pointer(sub), y.pointer(sub), twiddles.re, twiddles.im, I64(n)])
            sub.vector_loop(n, lambda k, w: out.store(sub, row, k, cscale(sub.b, y.load(sub, k, w), scale)))
        return naive_row
    m = bluestein_size(n)
    fft = Radix2.of(ctx, "conv", m, ty)
    c = Table.of(ctx, "chirp", ty, chirp(n, sign))
    spectrum = Table.of(ctx, "chirp_fft", ty, chirp_spectrum(n, m, sign))

    def bluestein_row(sub: EmitContext, row: ir.Value) -> None:
        b = sub.b
        a, y = Split.alloc(sub, m, ty), Split.alloc(sub, m, ty)
        a.zero(sub)
        fft.scatter(sub, n, lambda i: cmul(b, rows.load(sub, row, i), c.load(b, i)), a)
        fft.stages(sub, a)
        # the inverse FFT of A·B as conj(FFT(conj(A·B))): conjugate into y's bit-reversed slots
        fft.scatter(sub, m, lambda k: conjugate(b, cmul(b, a.load(sub, k), spectrum.load(b, k))), y)
        fft.stages(sub, y)

        def finish(k: ir.Value, w: int) -> None:
            z = conjugate(b, y.load(sub, k, w))
            out.store(sub, row, k, cscale(b, cmul(b, c.load(b, k, w), z), scale / m))
        sub.vector_loop(n, finish)
    return bluestein_row


def conjugate(b: ir.IRBuilder, z: Pair) -> Pair:
    """`conj(z)`."""
    return z[0], b.fneg(z[1])


def butterflies(n: int) -> int:
    """About how many butterflies one row of `n` points costs."""
    m = n if is_pow2(n) or n <= NAIVE_MAX else bluestein_size(n)
    return max(1, m * max(1, m.bit_length() - 1) // 2) * (1 if m == n else 2)


@lowering(T.Fft1d, check=check_fft1d)
def fft1d(ctx: EmitContext, t: T.Fft1d) -> None:
    row_fn = fft1d_rows(ctx, t)

    def chunk(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="row") as row:
            row_fn(sub, row)
    ctx.parallel_for(t.outer, chunk, grain=1, min_work=max(1, PAR_WORK // butterflies(t.n_complex)))
