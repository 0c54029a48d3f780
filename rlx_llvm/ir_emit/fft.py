"""The FFT family as native code (semantics.md §2.16, §3.11; docs/lowering-fft.md): `Fft1d`, and the
spectrum features `LogMel` and `LogMelBackward` as vector IR over real-block rows.

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
from ..errors import ValidationError
from ..reference.fft import FFTQ_SCALES, I32_MAX, I32_MIN, Q, REAL, interleaved, norm_scale, q30_twiddles
from ..registry import lowering
from . import vecmath as vm
from .context import EmitContext
from .rows import MAX, parallel_rows, reduce_row
from .toolkit import (F32, F64, FASTMATH, I8, I32, I64, PTR, Index, carried_loop, const, iadd, imul, lane_index,
                      scalar_of, scratch_ptr, sizeof, splat, vec, width_of, zero_bytes)

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
    c = const(scalar_of(x[0].type), s, width_of(x[0]))
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
        return cls(constant_array(ctx, f"{name}.re", ty, values.real.tolist()),
                   constant_array(ctx, f"{name}.im", ty, values.imag.tolist()), ty)

    def load(self, b: ir.IRBuilder, index: Index, width: int = 1) -> Pair:
        """Entries `index … index + width − 1`."""
        return tuple(b.load(b.gep(g, [I64(index) if isinstance(index, int) else index], source_etype=self.ty,
                                  inbounds=True), typ=vec(self.ty, width), align=sizeof(self.ty))
                     for g in (self.re, self.im))


def constant_array(ctx: EmitContext, name: str, ty: ir.Type, values: Sequence[float | int]) -> ir.GlobalVariable:
    """A private constant global array of `ty` holding `values`, named after the thunk's function."""
    aty = ir.ArrayType(ty, len(values))
    g = ir.GlobalVariable(ctx.module, aty, name=f"{ctx.fn.name}.{name}")
    g.global_constant, g.linkage = True, "private"
    g.initializer = ir.Constant(aty, [ir.Constant(ty, v) for v in values])
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
        return cls(m, constant_array(ctx, f"{name}.rev", I32, bit_reversed(m)),
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


# ── LogMel, LogMelBackward ───────────────────────────────────────────────────

LN10 = math.log(10.0)
MEL_FLOOR = 1e-10     # each mel energy is clamped below at this before the log10
FLOOR_DECADES = 8.0   # a row's log-mels are floored at its max − 8
DEAD_BAND = 1e-6      # LogMelBackward passes no gradient where L is within this of the floor
MEL_TILE = 8          # vectors of mel accumulators kept in registers (of AVX2's 16)


def check_log_mel(t: "T.LogMel | T.LogMelBackward") -> None:
    """The one-sided bins lie inside each row's `n_fft` points."""
    if t.n_bins > t.n_fft:
        raise ValidationError(f"n_bins {t.n_bins} exceeds n_fft {t.n_fft} (a row holds n_fft points)", field="n_bins")


@dataclass(frozen=True)
class MelRow:
    """One row's one-sided power, mel energies and log-mels (before the floor) in per-thread scratch."""

    power: int   # scratch offsets of f32 arrays: [n_bins], [padded], [padded]
    mel: int
    log_mel: int
    filters_t: int   # the shared scratch's `[n_bins, padded]` transposed filters, zero past n_mels
    padded: int      # n_mels rounded up to whole vectors

    @classmethod
    def alloc(cls, ctx: EmitContext, t: "T.LogMel | T.LogMelBackward", filters_t: int) -> "MelRow":
        padded = mels_padded(t, ctx.lanes)
        return cls(*(ctx.scratch_alloc(4 * max(1, k)) for k in (t.n_bins, padded, padded)), filters_t, padded)

    def at(self, ctx: EmitContext, array: int, i: Index, width: int = 1) -> ir.Value:
        return ctx.load(array, F32, i, width, base=ctx.scratch)

    def put(self, ctx: EmitContext, array: int, i: Index, value: ir.Value) -> None:
        ctx.store(array, value, i, base=ctx.scratch)


def mels_padded(t: "T.LogMel | T.LogMelBackward", lanes: int) -> int:
    """`n_mels` rounded up to whole vectors of `lanes`."""
    return -(-t.n_mels // lanes) * lanes


def spectrum_point(ctx: EmitContext, spec: int, n_fft: int, row: ir.Value, k: Index, width: int, part: int
                   ) -> ir.Value:
    """`re[k …]` (part 0) or `im[k …]` (part 1) of a real-block row of `n_fft` points."""
    return ctx.load(spec, F32, iadd(ctx.b, imul(ctx.b, row, 2 * n_fft), iadd(ctx.b, k, part * n_fft)), width)


def mel_row(ctx: EmitContext, t: "T.LogMel | T.LogMelBackward", row: ir.Value, s: MelRow) -> ir.Value:
    """Fill `s` for `row`: `P = re² + im²`, `mel = filters · P`, `L = log10(max(mel, 1e−10))`; returns
    the row's floor `max_m L − 8` (NaN-ignoring max)."""
    b = ctx.b

    def power(k: ir.Value, w: int) -> None:
        re, im = (spectrum_point(ctx, t.spec, t.n_fft, row, k, w, part) for part in (0, 1))
        s.put(ctx, s.power, k, b.fadd(b.fmul(re, re), b.fmul(im, im)))
    ctx.vector_loop(t.n_bins, power)
    w = ctx.lanes
    for first in range(0, s.padded, MEL_TILE * w):   # MEL_TILE vectors of mels in registers over every bin
        vectors = min(MEL_TILE, (s.padded - first) // w)

        def bin_step(k: ir.Value, acc: list[ir.Value]) -> list[ir.Value]:
            p = splat(b, s.at(ctx, s.power, k), w)
            row_at = iadd(b, imul(b, k, s.padded), first)
            return [b.fadd(a, b.fmul(ctx.load(s.filters_t, F32, iadd(b, row_at, v * w), w, base=ctx.shared), p,
                                     flags=FASTMATH), flags=FASTMATH) for v, a in enumerate(acc)]
        acc = carried_loop(ctx, 0, t.n_bins, 1, [splat_f32(b, 0.0, w)] * vectors, bin_step, name="bin")
        for v, a in enumerate(acc):
            s.put(ctx, s.mel, first + v * w, a)

    def log_mel(m: ir.Value, width: int) -> None:
        clamped = vm.maxnum(b, s.at(ctx, s.mel, m, width), splat_f32(b, MEL_FLOOR, width))
        s.put(ctx, s.log_mel, m, b.fmul(vm.log(b, clamped), splat_f32(b, 1.0 / LN10, width)))
    ctx.vector_loop(t.n_mels, log_mel)
    (top,) = reduce_row(ctx, t.n_mels, lambda j, w: (s.at(ctx, s.log_mel, j, w),), [MAX])
    return b.fsub(top, ir.Constant(F32, FLOOR_DECADES))


def splat_f32(b: ir.IRBuilder, x: "ir.Value | float", width: int) -> ir.Value:
    """A scalar value or constant as `width` f32 lanes."""
    return const(F32, x, width) if isinstance(x, float) else splat(b, x, width)


def mel_rows(ctx: EmitContext, t: "T.LogMel | T.LogMelBackward", row_fn: Callable) -> None:
    """`row_fn(sub, row, scratch)` for every row, rows split across threads."""

    b, padded = ctx.b, mels_padded(t, ctx.lanes)
    filters_t = ctx.scratch_alloc(4 * max(1, t.n_bins * padded))
    zero_bytes(ctx, scratch_ptr(ctx, filters_t), 4 * t.n_bins * padded)
    with ctx.for_range(0, t.n_mels, name="m") as m:
        def transpose(k: ir.Value, w: int) -> None:   # one filter row into a column, element by element
            ctx.store(filters_t, ctx.load(t.filters, F32, b.add(imul(b, m, t.n_bins), k)), b.add(imul(b, k, padded), m),
                      base=ctx.scratch)
        ctx.vector_loop(t.n_bins, transpose, width=1)

    def chunk(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        s = MelRow.alloc(sub, t, filters_t)
        with sub.for_range(start, stop, name="row") as row:
            row_fn(sub, row, s)
    parallel_rows(ctx, t.outer, 8 * t.n_fft + 4 * t.n_mels * max(1, t.n_bins), chunk)


@lowering(T.LogMel, check=check_log_mel)
def log_mel(ctx: EmitContext, t: T.LogMel) -> None:
    def row_fn(sub: EmitContext, row: ir.Value, s: MelRow) -> None:
        b = sub.b
        floor = mel_row(sub, t, row, s)

        def out(m: ir.Value, w: int) -> None:
            floored = vm.maxnum(b, s.at(sub, s.log_mel, m, w), splat_f32(b, floor, w))
            y = b.fmul(b.fadd(floored, splat_f32(b, 4.0, w)), splat_f32(b, 0.25, w))
            sub.store(t.dst, y, iadd(b, imul(b, row, t.n_mels), m))
        sub.vector_loop(t.n_mels, out)
    mel_rows(ctx, t, row_fn)


@lowering(T.LogMelBackward, check=check_log_mel)
def log_mel_backward(ctx: EmitContext, t: T.LogMelBackward) -> None:
    def row_fn(sub: EmitContext, row: ir.Value, s: MelRow) -> None:
        b = sub.b
        floor = mel_row(sub, t, row, s)
        dpower = s.power   # P is no longer needed: dP accumulates in its place

        def dmel(m: ir.Value, w: int) -> None:   # into s.mel: dy·0.25/(mel·ln10) where live, else 0
            mel, lm = s.at(sub, s.mel, m, w), s.at(sub, s.log_mel, m, w)
            above = b.fsub(vm.maxnum(b, lm, splat_f32(b, floor, w)), splat_f32(b, floor, w))
            live = b.and_(b.fcmp_ordered(">", above, splat_f32(b, DEAD_BAND, w)),
                          b.fcmp_ordered(">", mel, splat_f32(b, MEL_FLOOR, w)))
            dy = sub.load(t.dy, F32, iadd(b, imul(b, row, t.n_mels), m), w)
            g = b.fdiv(b.fmul(dy, splat_f32(b, 0.25, w)), b.fmul(mel, splat_f32(b, LN10, w)))
            s.put(sub, s.mel, m, b.select(live, g, splat_f32(b, 0.0, w)))
        sub.vector_loop(t.n_mels, dmel)
        sub.vector_loop(t.n_bins, lambda k, w: s.put(sub, dpower, k, splat_f32(b, 0.0, w)))
        with sub.for_range(0, t.n_mels, name="m") as m:
            g, first = s.at(sub, s.mel, m), imul(b, m, t.n_bins)

            def axpy(k: ir.Value, w: int) -> None:
                f = sub.load(t.filters, F32, iadd(b, first, k), w)
                s.put(sub, dpower, k, b.fadd(s.at(sub, dpower, k, w), b.fmul(splat_f32(b, g, w), f)))
            sub.vector_loop(t.n_bins, axpy)
        base = imul(b, row, 2 * t.n_fft)

        def grad(k: ir.Value, w: int) -> None:
            two_dp = b.fmul(s.at(sub, dpower, k, w), splat_f32(b, 2.0, w))
            for part in (0, 1):
                x = spectrum_point(sub, t.spec, t.n_fft, row, k, w, part)
                sub.store(t.dst, b.fmul(two_dp, x), iadd(b, base, iadd(b, k, part * t.n_fft)))
        sub.vector_loop(t.n_bins, grad)

        def zeros(k: ir.Value, w: int) -> None:
            for part in (0, 1):
                sub.store(t.dst, splat_f32(b, 0.0, w), iadd(b, base, iadd(b, k, part * t.n_fft + t.n_bins)))
        sub.vector_loop(t.n_fft - t.n_bins, zeros)
    mel_rows(ctx, t, row_fn)


# ── WelchPeaks ───────────────────────────────────────────────────────────────

def check_welch_peaks(t: T.WelchPeaks) -> None:
    """At least one segment to average, and the one-sided bins inside each row."""
    if t.n_segments < 1:
        raise ValidationError(f"n_segments must be at least 1, got {t.n_segments}", field="n_segments")
    if t.n_fft < 1:
        raise ValidationError(f"n_fft must be at least 1, got {t.n_fft}", field="n_fft")


def welch_psd(ctx: EmitContext, t: T.WelchPeaks, row: ir.Value, psd: int) -> None:
    """`psd[k] = (w_k · Σ_s (re² + im²)) / n_segments` of batch row `row` into scratch, the sum over
    segments in order (no contraction: the reference's roundings)."""
    b, n_bins = ctx.b, t.n_fft // 2 + 1
    ctx.vector_loop(n_bins, lambda k, w: ctx.store(psd, splat_f32(b, 0.0, w), k, base=ctx.scratch))
    with ctx.for_range(0, t.n_segments, name="seg") as seg:
        spectrum = iadd(b, imul(b, row, t.n_segments), seg)

        def add(k: ir.Value, w: int) -> None:
            re, im = (spectrum_point(ctx, t.spec, t.n_fft, spectrum, k, w, part) for part in (0, 1))
            total = b.fadd(ctx.load(psd, F32, k, w, base=ctx.scratch), b.fadd(b.fmul(re, re), b.fmul(im, im)))
            ctx.store(psd, total, k, base=ctx.scratch)
        ctx.vector_loop(n_bins, add)
    count = float(t.n_segments)

    def mean(k: ir.Value, w: int) -> None:
        bins = lane_index(b, k, w)
        at_end = b.or_(b.icmp_signed("==", bins, const(I64, 0, w)), b.icmp_signed("==", bins, const(I64, n_bins - 1, w)))
        weight = b.select(at_end, splat_f32(b, 1.0, w), splat_f32(b, 2.0, w))
        total = ctx.load(psd, F32, k, w, base=ctx.scratch)
        ctx.store(psd, b.fdiv(b.fmul(total, weight), splat_f32(b, count, w)), k, base=ctx.scratch)
    ctx.vector_loop(n_bins, mean)


def ranks_above(b: ir.IRBuilder, v: ir.Value, best: ir.Value) -> ir.Value:
    """Whether power `v` ranks strictly above `best`: larger, or a number where `best` is NaN (NaNs rank last)."""
    return b.or_(b.fcmp_ordered(">", v, best), b.and_(b.fcmp_unordered("uno", best, best),
                                                      b.fcmp_ordered("ord", v, v)))


@lowering(T.WelchPeaks, check=check_welch_peaks)
def welch_peaks(ctx: EmitContext, t: T.WelchPeaks) -> None:
    n_bins = t.n_fft // 2 + 1
    k = min(t.k, n_bins)

    def chunk(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        psd, taken = sub.scratch_alloc(4 * n_bins), sub.scratch_alloc(n_bins)
        with sub.for_range(start, stop, name="row") as row:
            welch_psd(sub, t, row, psd)
            zero_bytes(sub, scratch_ptr(sub, taken), n_bins)
            out = imul(b, row, 2 * t.k)
            with sub.for_range(0, k, name="rank") as rank:
                def better(j: ir.Value, best: list[ir.Value]) -> list[ir.Value]:
                    v = sub.load(psd, F32, j, base=sub.scratch)
                    free = b.icmp_unsigned("==", sub.load(taken, I8, j, base=sub.scratch), I8(0))
                    take = b.and_(free, b.or_(b.icmp_signed("<", best[0], I64(0)), ranks_above(b, v, best[1])))
                    return [b.select(take, j, best[0]), b.select(take, v, best[1])]
                best_j, best_v = carried_loop(sub, 0, n_bins, 1, [I64(-1), ir.Constant(F32, math.nan)], better,
                                              name="bin")
                sub.store(taken, I8(1), best_j, base=sub.scratch)
                at = b.add(out, b.mul(rank, I64(2)))
                sub.store(t.dst, b.uitofp(best_j, F32), at)
                sub.store(t.dst, best_v, b.add(at, I64(1)))
            past = iadd(b, out, 2 * k)   # pairs past n_bins: zeros
            sub.vector_loop(2 * (t.k - k), lambda i, w: sub.store(t.dst, splat_f32(b, 0.0, w), iadd(b, past, i)))
    parallel_rows(ctx, t.welch_batch, 8 * t.n_segments * t.n_fft, chunk)


# ── FftButterflyStage ────────────────────────────────────────────────────────

def check_butterfly_stage(t: T.FftButterflyStage) -> None:
    """A power-of-two `n_fft ≥ 2` and a stage of its radix-2 transform."""
    if t.n_fft < 2 or not is_pow2(t.n_fft):
        raise ValidationError(f"n_fft must be a power of two ≥ 2, got {t.n_fft}", field="n_fft")
    if t.stage >= t.n_fft.bit_length() - 1:
        raise ValidationError(f"stage {t.stage} is past the last of log2({t.n_fft}) stages", field="stage")


@lowering(T.FftButterflyStage, check=check_butterfly_stage, inplace=True)
def fft_butterfly_stage(ctx: EmitContext, t: T.FftButterflyStage) -> None:
    """Pair p joins points `i0 = (p // h)·2h + p % h` and `i1 = i0 + h` (`h = 2^stage`): gate 0 copies
    them; otherwise `(a + w·b, a − w·b)`, swapped where `rev` is non-zero."""
    b, h, half = ctx.b, 1 << t.stage, t.n_fft // 2

    def point(base: ir.Value, i: ir.Value) -> Pair:
        at = b.add(base, b.mul(i, I64(2)))
        return ctx.load(t.state_src, F32, at), ctx.load(t.state_src, F32, b.add(at, I64(1)))

    def put(base: ir.Value, i: ir.Value, z: Pair) -> None:
        at = b.add(base, b.mul(i, I64(2)))
        ctx.store(t.state_dst, z[0], at)
        ctx.store(t.state_dst, z[1], b.add(at, I64(1)))

    def pick(flag: ir.Value, x: Pair, y: Pair) -> Pair:
        return b.select(flag, x[0], y[0]), b.select(flag, x[1], y[1])

    zero = ir.Constant(F32, 0.0)
    with ctx.for_range(0, t.batch, name="batch") as item:
        base = imul(b, item, 2 * t.n_fft)
        with ctx.for_range(0, half, name="pair") as p:
            top = b.add(b.mul(b.udiv(p, I64(h)), I64(2 * h)), b.urem(p, I64(h)))
            bottom = b.add(top, I64(h))
            x, y = point(base, top), point(base, bottom)
            tw = ctx.load(t.tw_re_src, F32, p), ctx.load(t.tw_im_src, F32, p)
            wy = cmul(b, tw, y)
            plus = b.fadd(x[0], wy[0]), b.fadd(x[1], wy[1])
            minus = b.fsub(x[0], wy[0]), b.fsub(x[1], wy[1])
            gated = b.fcmp_unordered("!=", ctx.load(t.gate_src, F32, p), zero)
            swapped = b.fcmp_unordered("!=", ctx.load(t.rev_src, F32, p), zero)
            put(base, top, pick(gated, pick(swapped, minus, plus), x))
            put(base, bottom, pick(gated, pick(swapped, plus, minus), y))


# ── Fft1dQ: fixed point ─────────────────────────────────────────────────────

def check_fft1d_q(t: T.Fft1dQ) -> None:
    """A power-of-two `n_complex`, a known `norm_tag` and `scale_tag`."""
    if t.n_complex < 1 or not is_pow2(t.n_complex):
        raise ValidationError(f"the fixed-point FFT is radix-2: n_complex must be a power of two, got {t.n_complex}",
                              field="n_complex")
    if t.norm_tag not in (0, 1, 2):
        raise ValidationError(f"unknown norm_tag {t.norm_tag} (0 Backward, 1 Forward, 2 Ortho)", field="norm_tag")
    if t.scale_tag not in FFTQ_SCALES:
        raise ValidationError(f"unknown scale_tag {t.scale_tag} (0 None, 1 PerStage)", field="scale_tag")


def saturate(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """An i64 clamped to the i32 range, as i32."""
    v = b.select(b.icmp_signed("<", v, I64(I32_MIN)), I64(I32_MIN), v)
    return b.trunc(b.select(b.icmp_signed(">", v, I64(I32_MAX)), I64(I32_MAX), v), I32)


def q_butterfly(ctx: EmitContext, t: T.Fft1dQ, base: ir.Value, a: ir.Value, c: ir.Value, w: Pair) -> None:
    """Points `a`, `c` of the row at element `base` of dst: `t = w·x_c` (Q30, round half up), `x_a ± t`
    (halved, round half up, under PerStage), saturated to i32."""
    b, n = ctx.b, t.n_complex

    def load(i: ir.Value, part: int) -> ir.Value:
        return b.sext(ctx.load(t.dst, I32, b.add(base, b.add(i, I64(part * n)))), I64)

    def store(i: ir.Value, part: int, v: ir.Value) -> None:
        if t.scale_tag == 1:
            v = b.ashr(b.add(v, I64(1)), I64(1))
        ctx.store(t.dst, saturate(b, v), b.add(base, b.add(i, I64(part * n))))

    (ar, ai), (cr, ci) = (load(a, 0), load(a, 1)), (load(c, 0), load(c, 1))
    half_ulp = I64(1 << (Q - 1))
    tr = b.ashr(b.add(b.sub(b.mul(w[0], cr), b.mul(w[1], ci)), half_ulp), I64(Q))
    ti = b.ashr(b.add(b.add(b.mul(w[0], ci), b.mul(w[1], cr)), half_ulp), I64(Q))
    for part, (x, y) in enumerate(((ar, tr), (ai, ti))):
        store(a, part, b.add(x, y))
        store(c, part, b.sub(x, y))


@lowering(T.Fft1dQ, check=check_fft1d_q)
def fft1d_q(ctx: EmitContext, t: T.Fft1dQ) -> None:
    """Radix-2 DIT on i32 real-block rows with Q30 twiddles: bit-reversed copy into dst, `log2 n` stages in
    place (i64 products, saturating sums), then the `norm_tag` factor (rounded half to even); rows in parallel."""
    n = t.n_complex
    if t.outer == 0:
        return
    w_re, w_im = q30_twiddles(n, t.inverse)
    rev = constant_array(ctx, "rev", I64, bit_reversed(n))
    tw = [constant_array(ctx, name, I64, [int(v) for v in vals]) for name, vals in (("tw_re", w_re), ("tw_im", w_im))]
    factor = norm_scale(t.norm_tag, t.inverse, n)

    def rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        with sub.for_range(start, stop, name="row") as row:
            base = b.mul(row, I64(2 * n))
            with sub.for_range(0, n, name="scatter") as i:
                j = b.load(b.gep(rev, [I64(0), i], inbounds=True), typ=I64)
                for part in (0, 1):
                    value = sub.load(t.src, I32, b.add(base, b.add(j, I64(part * n))))
                    sub.store(t.dst, value, b.add(base, b.add(i, I64(part * n))))
            half = 1
            while half < n:
                stride = n // (2 * half)
                with sub.for_range(0, n, 2 * half, name=f"group{half}") as g, \
                        sub.for_range(0, half, name=f"k{half}") as k:
                    at = b.mul(k, I64(stride))
                    w = tuple(b.load(b.gep(tab, [I64(0), at], inbounds=True), typ=I64) for tab in tw)
                    q_butterfly(sub, t, base, b.add(g, k), b.add(b.add(g, k), I64(half)), w)
                half *= 2
            if factor != 1.0:
                rint = sub.intrinsic("llvm.rint.f64", F64, [F64])
                with sub.for_range(0, 2 * n, name="norm") as i:
                    v = b.fmul(b.sitofp(sub.load(t.dst, I32, b.add(base, i)), F64), ir.Constant(F64, factor))
                    sub.store(t.dst, saturate(b, b.fptosi(b.call(rint, [v]), I64)), b.add(base, i))

    ctx.parallel_for(t.outer, rows, grain=1, min_work=max(1, PAR_WORK // max(1, n * max(1, n.bit_length()))))
