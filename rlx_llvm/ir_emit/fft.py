"""The FFT family as native code (semantics.md §2.16, §3.11; docs/lowering-fft.md): `Fft1d`, and the
spectrum features `LogMel` and `LogMelBackward` as vector IR over real-block rows.

`Fft1d` runs a **block of W rows at once**, one row per vector lane (W = the f32 or f64 lanes of a
register; fewer rows than that, and a block's leftover rows, run with W = 1).  The block's rows are
transposed into per-thread scratch — point `i` of every row as one vector of re and one of im — so
every butterfly is plain vector arithmetic with no shuffles, whatever the radix, and twiddles are
broadcasts.  Then, for the thunk's `n`:

* **n a product of 2, 3, 5, 7, 11, 13** (every power of two, 1000 = 8·5³ …) — a mixed-radix
  **Stockham autosort** FFT: one pass per radix (8 and 4 for powers of two, then 2, 3, 5, 7, 11, 13),
  ping-ponging between two buffers, natural order in and out (no bit reversal).  A pass of radix `r`
  over length `L = r·m` at stride `s` takes `a_j = x[q + s(p + jm)]`, runs the unrolled `r`-point DFT
  and writes `y[q + s(rp + k)] = w_L^{pk} · DFT_r(a)_k`;
* **any other n** — Bluestein: `X_k = c_k · Σ_j (x_j c_j) conj(c_{k−j})` with the chirp
  `c_k = e^{∓πi k²/n}`, the convolution as two forward Stockham FFTs of a 2·3·5-smooth `m ≥ 2n − 1`
  and a product with the chirp's spectrum.

Every table (per-pass twiddles, chirps) is computed in f64 at compile time for the thunk's `n` and
stored as a private constant global in the rows' real type (f32 rows: the f64 values rounded once).
The passes, the transposes and the products are internal functions shared by every thunk of a module
(run-time lengths); rows run in parallel; the `norm_tag` scale (§2.16) is applied as the rows are written.
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
from .toolkit import (F32, F64, FASTMATH, I8, I32, I64, PTR, Index, carried_loop, const, fconst, iadd, imul,
                      lane_index, scratch_ptr, sizeof, splat, transpose_vectors, vec, zero_bytes)

ODD_PRIMES = (3, 5, 7, 11, 13)   # odd radices with an unrolled pass; a larger prime factor → Bluestein
PAR_WORK = 1 << 15               # butterflies worth forking a thread for
BLOCK_BYTES = 1 << 24            # a block's two buffers stay under this (fewer lanes for huge n)

Pair = tuple[ir.Value, ir.Value]   # (re, im), scalars or vectors


def is_pow2(n: int) -> bool:
    """Whether `n ≥ 1` is a power of two."""
    return n & (n - 1) == 0


def check_fft1d(t: T.Fft1d) -> None:
    """`n_complex ≥ 1`, a known `norm_tag` and a float or complex row type."""
    if t.n_complex < 1:
        raise ValidationError(f"n_complex must be at least 1, got {t.n_complex}", field="n_complex")
    if t.norm_tag not in (0, 1, 2):
        raise ValidationError(f"unknown norm_tag {t.norm_tag} (0 Backward, 1 Forward, 2 Ortho)", field="norm_tag")
    if t.dtype not in REAL:
        raise ValidationError(f"Fft1d rows of {t.dtype.value} are not supported (f32, f64, c64, c128)", field="dtype")


# ── plans: radices and tables, in f64 ───────────────────────────────────────

def radices(n: int) -> list[int] | None:
    """The Stockham passes of `n`: 8s for its power of two (8·2 as 4·4, a lone 2 or 4 as is), then its
    odd primes; None when a prime factor is larger than 13."""
    twos = (n & -n).bit_length() - 1
    eights, extra = divmod(twos, 3)
    out = [8] * eights + {0: [], 1: [2], 2: [4]}[extra]
    if extra == 1 and eights:
        out[-2:] = [4, 4]
    rest = n >> twos
    for p in ODD_PRIMES:
        while rest % p == 0:
            out.append(p)
            rest //= p
    return out if rest == 1 else None


def bluestein_size(n: int) -> int:
    """Bluestein's convolution length: the least 2·3·5-smooth `m ≥ 2n − 1`."""
    m = 2 * n - 1
    while True:
        k = m
        for p in (2, 3, 5):
            while k % p == 0:
                k //= p
        if k == 1:
            return m
        m += 1


def roots(k: np.ndarray, d: int, sign: int) -> np.ndarray:
    """`e^{sign·2πi k/d}` in f64, exact (0, ±1) at multiples of a quarter turn."""
    k = np.asarray(k, dtype=np.int64) % d
    z = np.exp(sign * 2j * np.pi * k / d)
    quarter, rest = np.divmod(4 * k, d)
    exact = np.array([1, sign * 1j, -1, -sign * 1j])[quarter % 4]
    return np.where(rest == 0, exact, z)


def pass_twiddles(length: int, r: int, sign: int) -> np.ndarray:
    """The twiddles of a radix-`r` pass over `length` points: `w_L^{pk}` at `[p, k − 1]`, `k = 1 … r − 1`."""
    p, k = np.meshgrid(np.arange(length // r), np.arange(1, r), indexing="ij")
    return roots(p * k, length, sign).reshape(-1)


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


# ── constant tables ─────────────────────────────────────────────────────────

def constant_array(ctx: EmitContext, name: str, ty: ir.Type, values: Sequence[float | int]) -> ir.GlobalVariable:
    """A private constant global array of `ty` holding `values`, named after the thunk's function."""
    aty = ir.ArrayType(ty, len(values))
    g = ir.GlobalVariable(ctx.module, aty, name=f"{ctx.fn.name}.{name}")
    g.global_constant, g.linkage = True, "private"
    g.initializer = ir.Constant(aty, [ir.Constant(ty, v) for v in values])
    return g


def complex_table(ctx: EmitContext, name: str, ty: ir.Type, values: np.ndarray) -> ir.GlobalVariable:
    """Complex128 `values` rounded to `ty`, interleaved (re, im), as a constant global."""
    return constant_array(ctx, name, ty, np.stack([values.real, values.imag], axis=-1).reshape(-1).tolist())


def bit_reversed(m: int) -> list[int]:
    """`rev[i]`: `i` with its `log2 m` bits reversed."""
    bits = m.bit_length() - 1
    return [int(format(i, f"0{bits}b")[::-1], 2) if bits else 0 for i in range(m)]


# ── complex arithmetic on (re, im) pairs ────────────────────────────────────

def cmul(b: ir.IRBuilder, x: Pair, y: Pair) -> Pair:
    """`x · y`."""
    return (b.fsub(b.fmul(x[0], y[0]), b.fmul(x[1], y[1])), b.fadd(b.fmul(x[0], y[1]), b.fmul(x[1], y[0])))


def cadd(b: ir.IRBuilder, x: Pair, y: Pair) -> Pair:
    return b.fadd(x[0], y[0]), b.fadd(x[1], y[1])


def csub(b: ir.IRBuilder, x: Pair, y: Pair) -> Pair:
    return b.fsub(x[0], y[0]), b.fsub(x[1], y[1])


def conjugate(b: ir.IRBuilder, z: Pair) -> Pair:
    """`conj(z)`."""
    return z[0], b.fneg(z[1])


def times_i(b: ir.IRBuilder, z: Pair, sign: int) -> Pair:
    """`sign·i · z` (exact)."""
    return (b.fneg(z[1]), z[0]) if sign > 0 else (z[1], b.fneg(z[0]))


def rotate(b: ir.IRBuilder, z: Pair, k: int, r: int, sign: int) -> Pair:
    """`z · e^{sign·2πi k/r}`: exact at quarter turns, two products at odd eighths."""
    quarter, rest = divmod(4 * k % (4 * r), r)
    if rest == 0:
        if quarter % 2:
            return times_i(b, z, sign if quarter == 1 else -sign)
        return z if quarter == 0 else (b.fneg(z[0]), b.fneg(z[1]))
    w = complex(roots(np.array([k]), r, sign)[0])
    if 8 * k % r:
        return cmul(b, z, (fconst(z[0], w.real), fconst(z[0], w.imag)))
    # (±1 ± i)/√2 = ±√½·(1 + t·i), t = ±1
    turned = cadd(b, z, times_i(b, z, 1 if w.real * w.imag > 0 else -1))
    return scale_pair(b, turned, math.copysign(math.sqrt(0.5), w.real))


def small_dft(b: ir.IRBuilder, a: list[Pair], sign: int) -> list[Pair]:
    """The unrolled DFT `y_k = Σ_j a_j e^{sign·2πi jk/r}` of `r = len(a)` points: radix-2 splits with
    exact rotations for powers of two; for odd `r` the symmetric form with the pairs `a_j ± a_{r−j}`."""
    r = len(a)
    if r == 1:
        return a
    if r % 2 == 0:
        even, odd = small_dft(b, a[0::2], sign), small_dft(b, a[1::2], sign)
        turned = [rotate(b, o, k, r, sign) for k, o in enumerate(odd)]
        return [cadd(b, e, t) for e, t in zip(even, turned)] + [csub(b, e, t) for e, t in zip(even, turned)]
    pairs = [(cadd(b, a[j], a[r - j]), csub(b, a[j], a[r - j])) for j in range(1, r // 2 + 1)]
    out = [a[0]] * r
    for plus, _ in pairs:
        out[0] = cadd(b, out[0], plus)
    for k in range(1, r // 2 + 1):   # y_k, y_{r−k} = Σ_j (a_j ± a_{r−j}) cos, ± i·sign Σ_j (a_j − a_{r−j}) sin
        real_part, sines = a[0], []
        for j, (plus, minus) in enumerate(pairs, 1):
            angle = 2 * math.pi * j * k / r
            real_part = cadd(b, real_part, scale_pair(b, plus, math.cos(angle)))
            sines.append(scale_pair(b, minus, math.sin(angle)))
        odd = sines[0]
        for term in sines[1:]:
            odd = cadd(b, odd, term)
        turned = times_i(b, odd, sign)
        out[k], out[r - k] = cadd(b, real_part, turned), csub(b, real_part, turned)
    return out


def scale_pair(b: ir.IRBuilder, z: Pair, s: float) -> Pair:
    """`z · s` for a real constant `s`."""
    c = fconst(z[0], s)
    return b.fmul(z[0], c), b.fmul(z[1], c)


# ── blocks: W rows as vector lanes in scratch ───────────────────────────────

@dataclass(frozen=True)
class Block:
    """Points of `w` rows at `ptr`: point `i` as a `<w x ty>` of re then one of im (`2w` reals)."""

    ptr: ir.Value
    ty: ir.Type
    w: int

    def at(self, ctx: EmitContext, i: Index, part: int) -> ir.Value:
        return ctx.addr(0, iadd(ctx.b, imul(ctx.b, i, 2 * self.w), part * self.w), sizeof(self.ty), base=self.ptr)

    def load(self, ctx: EmitContext, i: Index) -> Pair:
        """Point `i` of every row."""
        return tuple(ctx.b.load(self.at(ctx, i, part), typ=vec(self.ty, self.w), align=sizeof(self.ty))
                     for part in (0, 1))

    def store(self, ctx: EmitContext, i: Index, z: Pair) -> None:
        for part in (0, 1):
            ctx.b.store(z[part], self.at(ctx, i, part), align=sizeof(self.ty))


def type_name(ty: ir.Type, w: int) -> str:
    return ("f32" if ty == F32 else "f64") + (f"x{w}" if w > 1 else "")


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


def broadcast(ctx: EmitContext, table: ir.Value, ty: ir.Type, i: ir.Value, w: int) -> Pair:
    """Complex entry `i` of an interleaved table, each part splat to `w` lanes."""
    return tuple(splat(ctx.b, ctx.load(0, ty, iadd(ctx.b, imul(ctx.b, i, 2), part), base=table), w) for part in (0, 1))


def pass_function(ctx: EmitContext, r: int, sign: int, ty: ir.Type, w: int) -> ir.Function:
    """`void rlx.fft.pass<r>…(ptr x, ptr y, ptr twiddles, i64 m, i64 s)`: one Stockham pass of radix
    `r` over `L = r·m` points at stride `s`: `y[q + s(rp + k)] = w_L^{pk} · DFT_r(x[q + s(p + jm)])_k`."""
    def emit(body: EmitContext, x, y, tw, m, s) -> None:
        b, src, dst = body.b, Block(x, ty, w), Block(y, ty, w)
        sm = b.mul(s, m)
        with body.for_range(0, m, name="p") as p:
            twiddles = [broadcast(body, tw, ty, iadd(b, imul(b, p, r - 1), k - 1), w) for k in range(1, r)]
            first_in, first_out = b.mul(s, p), b.mul(s, imul(b, p, r))
            with body.for_range(0, s, name="q") as q:
                at = b.add(first_in, q)
                a = [src.load(body, at if j == 0 else b.add(at, imul(b, sm, j))) for j in range(r)]
                at = b.add(first_out, q)
                for k, z in enumerate(small_dft(b, a, sign)):
                    twisted = z if k == 0 else cmul(b, z, twiddles[k - 1])
                    dst.store(body, at if k == 0 else b.add(at, imul(b, s, k)), twisted)
    direction = "f" if sign < 0 else "b"
    return shared_function(ctx, f"rlx.fft.pass{r}{direction}.{type_name(ty, w)}", [PTR, PTR, PTR, I64, I64], 3, emit)


def shuffle_mask(lanes: list[int]) -> ir.Constant:
    return ir.Constant(vec(I32, len(lanes)), lanes)


@dataclass(frozen=True)
class RowLayout:
    """Where point `i`'s re and im sit in a row of `2n` reals: interleaved pairs or real-block halves."""

    interleaved: bool

    def parts(self, b: ir.IRBuilder, n: ir.Value, i: Index) -> tuple[Index, Index]:
        if self.interleaved:
            re = imul(b, i, 2)
            return re, iadd(b, re, 1)
        return i, iadd(b, i, n)

    def load_run(self, ctx: EmitContext, row: ir.Value, ty: ir.Type, n: ir.Value, i: ir.Value, w: int) -> Pair:
        """Points `i … i + w − 1` of the row at `row` as (re lanes, im lanes)."""
        b = ctx.b
        if not self.interleaved:
            return tuple(ctx.load(0, ty, at, w, base=row) for at in self.parts(b, n, i))
        pairs = ctx.load(0, ty, imul(b, i, 2), 2 * w, base=row)
        return tuple(b.shuffle_vector(pairs, ir.Constant(pairs.type, None), shuffle_mask(list(range(part, 2 * w, 2))))
                     for part in (0, 1))

    def store_run(self, ctx: EmitContext, row: ir.Value, n: ir.Value, i: ir.Value, z: Pair) -> None:
        """Points `i …` (as many as `z` has lanes) of the row at `row`."""
        b, w = ctx.b, z[0].type.count
        if not self.interleaved:
            for part, at in zip(z, self.parts(b, n, i)):
                ctx.store(0, part, at, base=row)
            return
        pairs = b.shuffle_vector(z[0], z[1], shuffle_mask([k for j in range(w) for k in (j, w + j)]))
        ctx.store(0, pairs, imul(b, i, 2), base=row)


def block_rows(ctx: EmitContext, first: ir.Value, ty: ir.Type, n: ir.Value, w: int) -> list[ir.Value]:
    """The addresses of `w` consecutive rows of `2n` reals from `first`."""
    return [first if l == 0 else ctx.addr(0, ctx.b.mul(n, I64(2 * l)), sizeof(ty), base=first) for l in range(w)]


def whole_runs(b: ir.IRBuilder, n: ir.Value, w: int) -> ir.Value:
    """Where the runs of `w` points end (`n` rounded down to a multiple of `w`; 0 for one lane)."""
    return b.and_(n, I64(-w)) if w > 1 else I64(0)


def gather_function(ctx: EmitContext, layout: RowLayout, ty: ir.Type, w: int) -> ir.Function:
    """`void rlx.fft.gather…(ptr rows, ptr block, i64 n)`: `w` consecutive rows (`2n` reals apart) into a
    block, whole runs of `w` points as a load per row and a transpose."""
    def emit(body: EmitContext, rows, block, n) -> None:
        b, out = body.b, Block(block, ty, w)
        row, whole = block_rows(body, rows, ty, n, w), whole_runs(b, n, w)
        if w > 1:
            with body.for_range(0, whole, w, name="run") as i:
                runs = [layout.load_run(body, row[l], ty, n, i, w) for l in range(w)]
                columns = [transpose_vectors(b, [run[part] for run in runs]) for part in (0, 1)]
                for j in range(w):
                    out.store(body, iadd(b, i, j), (columns[0][j], columns[1][j]))
        with body.for_range(whole, n, name="point") as i:
            point = [[body.load(0, ty, at, base=row[l]) for at in layout.parts(b, n, i)] for l in range(w)]
            out.store(body, i, tuple(lanes_of(b, [p[part] for p in point]) for part in (0, 1)))
    kind = "pairs" if layout.interleaved else "halves"
    return shared_function(ctx, f"rlx.fft.gather.{kind}.{type_name(ty, w)}", [PTR, PTR, I64], 2, emit)


def scatter_function(ctx: EmitContext, layout: RowLayout, ty: ir.Type, w: int) -> ir.Function:
    """`void rlx.fft.scatter…(ptr block, ptr rows, i64 n, ty scale)`: a block back into `w` rows, each
    point times `scale` (the inverse of the gather)."""
    def emit(body: EmitContext, block, rows, n, scale) -> None:
        b, src, factor = body.b, Block(block, ty, w), splat(body.b, scale, w)
        row, whole = block_rows(body, rows, ty, n, w), whole_runs(b, n, w)
        if w > 1:
            with body.for_range(0, whole, w, name="run") as i:
                points = [scale_by(b, src.load(body, iadd(b, i, j)), factor) for j in range(w)]
                runs = [transpose_vectors(b, [p[part] for p in points]) for part in (0, 1)]
                for l in range(w):
                    layout.store_run(body, row[l], n, i, (runs[0][l], runs[1][l]))
        with body.for_range(whole, n, name="point") as i:
            z = scale_by(b, src.load(body, i), factor)
            for l in range(w):
                for part, at in zip(z, layout.parts(b, n, i)):
                    body.store(0, part if w == 1 else b.extract_element(part, I32(l)), at, base=row[l])
    kind = "pairs" if layout.interleaved else "halves"
    return shared_function(ctx, f"rlx.fft.scatter.{kind}.{type_name(ty, w)}", [PTR, PTR, I64, ty], 2, emit)


def lanes_of(b: ir.IRBuilder, values: list[ir.Value]) -> ir.Value:
    """Scalars as one vector (the scalar itself for one)."""
    if len(values) == 1:
        return values[0]
    v = ir.Constant(vec(values[0].type, len(values)), None)
    for l, x in enumerate(values):
        v = b.insert_element(v, x, I32(l))
    return v


def scale_by(b: ir.IRBuilder, z: Pair, factor: ir.Value) -> Pair:
    return b.fmul(z[0], factor), b.fmul(z[1], factor)


def product_function(ctx: EmitContext, ty: ir.Type, w: int, conj_in: bool, conj_out: bool) -> ir.Function:
    """`void rlx.fft.product…(ptr block, ptr table, i64 count)`: `x_i ← [conj] ([conj] x_i · t_i)` in place
    for `i < count` (Bluestein's chirp and spectrum products)."""
    def emit(body: EmitContext, block, table, count) -> None:
        b, x = body.b, Block(block, ty, w)
        with body.for_range(0, count, name="i") as i:
            z = x.load(body, i)
            z = cmul(b, conjugate(b, z) if conj_in else z, broadcast(body, table, ty, i, w))
            x.store(body, i, conjugate(b, z) if conj_out else z)
    flags = ("c" if conj_in else "") + ("C" if conj_out else "")
    return shared_function(ctx, f"rlx.fft.product{flags}.{type_name(ty, w)}", [PTR, PTR, I64], 2, emit)


# ── Fft1d ───────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Stockham:
    """A Stockham FFT of `n` points: its radices and one twiddle table per pass."""

    n: int
    radices: tuple[int, ...]
    sign: int
    tables: tuple[ir.GlobalVariable, ...]

    @classmethod
    def of(cls, ctx: EmitContext, name: str, n: int, rs: list[int], sign: int, ty: ir.Type) -> "Stockham":
        tables, length = [], n
        for i, r in enumerate(rs):
            tables.append(complex_table(ctx, f"{name}.tw{i}", ty, pass_twiddles(length, r, sign)))
            length //= r
        return cls(n, tuple(rs), sign, tuple(tables))

    def run(self, ctx: EmitContext, x: ir.Value, y: ir.Value, ty: ir.Type, w: int) -> tuple[ir.Value, ir.Value]:
        """The passes from block `x` (`y` the other buffer): (buffer holding the spectrum, the other)."""
        length, stride = self.n, 1
        for r, table in zip(self.radices, self.tables):
            length //= r
            ctx.b.call(pass_function(ctx, r, self.sign, ty, w), [x, y, table, I64(length), I64(stride)])
            x, y, stride = y, x, stride * r
        return x, y


def lane_width(t: T.Fft1d, lanes: int) -> int:
    """Rows per block: the register's lanes of the row type, at most the row count (a power of two)
    and few enough that the block's two buffers stay under BLOCK_BYTES."""
    size = np.dtype(REAL[t.dtype]).itemsize
    w = lanes * 4 // size
    while w > 1 and (w > t.outer or 2 * points(t.n_complex) * 2 * w * size > BLOCK_BYTES):
        w //= 2
    return w


def points(n: int) -> int:
    """The points a row's buffers hold: `n`, or Bluestein's `m`."""
    return n if radices(n) is not None else bluestein_size(n)


def fft1d_blocks(ctx: EmitContext, t: T.Fft1d) -> Callable[[EmitContext, ir.Value, int, tuple[int, int]], None]:
    """The tables of `t`'s transform (in `ctx`'s module) and the emitter of one block of rows."""
    n, ty = t.n_complex, F64 if REAL[t.dtype] is np.float64 else F32
    size, layout = sizeof(ty), RowLayout(interleaved(t.dtype))
    sign, scale = (1 if t.inverse else -1), norm_scale(t.norm_tag, t.inverse, n)
    rs = radices(n)
    if rs is not None:
        fft = Stockham.of(ctx, "fft", n, rs, sign, ty)
    else:
        m = bluestein_size(n)
        fft = Stockham.of(ctx, "conv", m, radices(m), -1, ty)
        c = complex_table(ctx, "chirp", ty, chirp(n, sign))
        spectrum = complex_table(ctx, "chirp_fft", ty, chirp_spectrum(n, m, sign))

    def block(sub: EmitContext, row: ir.Value, w: int, buffers: tuple[int, int]) -> None:
        b = sub.b
        x, y = (scratch_ptr(sub, off) for off in buffers)
        src, dst = (sub.addr(off, imul(b, row, 2 * n), size) for off in (t.src, t.dst))
        b.call(gather_function(sub, layout, ty, w), [src, x, I64(n)])
        if rs is not None:
            x, y = fft.run(sub, x, y, ty, w)
            b.call(scatter_function(sub, layout, ty, w), [x, dst, I64(n), ir.Constant(ty, scale)])
            return
        b.call(product_function(sub, ty, w, False, False), [x, c, I64(n)])
        zero_bytes(sub, sub.addr(0, 2 * n * w, size, base=x), 2 * (fft.n - n) * w * size)
        x, y = fft.run(sub, x, y, ty, w)
        b.call(product_function(sub, ty, w, False, True), [x, spectrum, I64(fft.n)])
        x, y = fft.run(sub, x, y, ty, w)
        b.call(product_function(sub, ty, w, True, False), [x, c, I64(n)])
        b.call(scatter_function(sub, layout, ty, w), [x, dst, I64(n), ir.Constant(ty, scale / fft.n)])
    return block


def butterflies(n: int) -> int:
    """About how many butterflies one row of `n` points costs."""
    m = points(n)
    return max(1, m * max(1, m.bit_length() - 1) // 2) * (1 if m == n else 2)


@lowering(T.Fft1d, check=check_fft1d)
def fft1d(ctx: EmitContext, t: T.Fft1d) -> None:
    """Blocks of `w` rows as vector lanes, the leftover rows of a chunk one at a time; chunks across threads."""
    block, w = fft1d_blocks(ctx, t), lane_width(t, ctx.lanes)
    nbytes = 2 * points(t.n_complex) * w * np.dtype(REAL[t.dtype]).itemsize

    def chunk(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        buffers = (sub.scratch_alloc(nbytes), sub.scratch_alloc(nbytes))
        whole = b.add(start, b.and_(b.sub(stop, start), I64(-w)))
        with sub.for_range(start, whole, w, name="block") as row:
            block(sub, row, w, buffers)
        if w > 1:
            with sub.for_range(whole, stop, name="row") as row:
                block(sub, row, 1, buffers)
    ctx.parallel_for(t.outer, chunk, grain=w, min_work=max(1, PAR_WORK // butterflies(t.n_complex)))


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
