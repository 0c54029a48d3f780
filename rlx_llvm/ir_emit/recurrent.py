"""LSTM, GRU and Elman RNN as native code (semantics.md §3.9; docs/lowering-recurrent.md).

One emitter for the three cells (`Cell`: gate count and gate math).  Per layer:

1. **Input projection**: one GEMM over every step of both directions at once,
   `proj[B·S, D·G·H] = x_l[B·S, in_l]·W_ihᵀ` (the layer's D weight blocks are adjacent), into
   scratch — sgemm with the transpose flag (`project`).  It completes before either recurrence
   writes `dst`, so `dst` itself holds a layer's output and is the next layer's input.
2. **Recurrence**, the directions side by side (one thread each with two threads), each one call of
   `DirectionRun` (one internal function per cell and tile shape, all dims arguments, shared by
   every layer and thunk).  A step is a GEMM, then a gate pass:
   * `zh = h·W_hhᵀ` into scratch, its columns in groups of W hidden units with their G gates adjacent
     (column vector `u·G + g`).  Batch 1 with W | H: dot products over W_hh's own rows (`gemv`, no
     packing).  Otherwise `W_hh` is packed once per call into panels of nv column vectors
     (`[panel][k][nv·W]`) and `gemm.TileShape` register tiles of up to 6 rows × nv vectors run over
     them, panels outer (a panel stays in L1 while every row tile reads it).
   * The gate pass: per batch row, two groups of W units at a time, the projection and biases added
     to zh and the cell's σ/tanh on one wide vector per gate (`update_units`), writing `h'` (and `c'`).
   `h` is double-buffered in scratch, `c` is updated in place; after the step the new `h` rows are
   copied into `dst` at step `t` (forward t = 0…S−1, reverse t = S−1…0).

State rows are padded to `hp = ⌈H/W⌉·W` so nothing needs masks: the padded weights and biases
are zero, the pad lanes of `h`/`c` never feed a product (k < H) and are never copied out.
With `carry`, `h0` (`c0`) `[L·D, batch, H]` seed the state and receive the final one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, NamedTuple

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..kernels.blas import BLAS_INT_MAX
from ..registry import lowering
from ..thunks.base import cdiv
from . import elementmath as em
from . import vecmath as vm
from .blas_calls import FortranArgs
from .context import ArenaRef, EmitContext, ScratchRef, pointer
from .gemm import ACCUMULATORS, TileShape, blas_gemm, ir_tiles_win, tile_gemm
from .toolkit import (F32, I32, I64, PTR, carried_loop, copy_bytes, splat_like, transpose_vectors, vector_registers,
                      zero_bytes)


def sigmoid(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """σ(x) = e/(1+e) (x < 0) or 1/(1+e), e = e^−|x|; NaN → NaN; below ~1e−38 not denormal-exact."""
    e = vm.exp_nonpositive(b, b.fneg(vm.fabs(b, x)))
    num = b.select(b.fcmp_ordered("<", x, splat_like(x, 0.0)), e, splat_like(x, 1.0))
    return b.select(vm.is_nan(b, x), x, b.fdiv(num, b.fadd(splat_like(x, 1.0), e)))


def tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """tanh(x) = ±(1 − e)/(1 + e), e = e^−2|x| (absolute error ~1e−7 near 0, well inside the cell's tolerance)."""
    e = vm.exp_nonpositive(b, b.fmul(vm.fabs(b, x), splat_like(x, -2.0)))
    one = splat_like(x, 1.0)
    return b.select(vm.is_nan(b, x), x, vm.copysign(b, b.fdiv(b.fsub(one, e), b.fadd(one, e)), x))


# step(b, zx, zh, h, c) → (h', c'): per gate, zx = x·W_ihᵀ + input-side bias and zh = h·W_hhᵀ (+ b_hh).
Step = Callable[[ir.IRBuilder, list[ir.Value], list[ir.Value], ir.Value, ir.Value], tuple[ir.Value, ir.Value]]


def lstm_step(b: ir.IRBuilder, zx: list[ir.Value], zh: list[ir.Value], h: ir.Value, c: ir.Value
              ) -> tuple[ir.Value, ir.Value]:
    """Gates i, f, g, o: `c' = σ(f)·c + σ(i)·tanh(g)`, `h' = σ(o)·tanh(c')`."""
    i, f, g, o = (b.fadd(x, y) for x, y in zip(zx, zh))
    c = b.fadd(b.fmul(sigmoid(b, f), c), b.fmul(sigmoid(b, i), tanh(b, g)))
    return b.fmul(sigmoid(b, o), tanh(b, c)), c


def gru_step(b: ir.IRBuilder, zx: list[ir.Value], zh: list[ir.Value], h: ir.Value, c: ir.Value
             ) -> tuple[ir.Value, ir.Value]:
    """Gates r, z, n: `n = tanh(x_n + r·(W_hn h + b_hn))`, `h' = n + z·(h − n)`."""
    r = sigmoid(b, b.fadd(zx[0], zh[0]))
    z = sigmoid(b, b.fadd(zx[1], zh[1]))
    n = tanh(b, b.fadd(zx[2], b.fmul(r, zh[2])))
    return vm.fma(b, z, b.fsub(h, n), n), c


def rnn_step(relu: bool) -> Step:
    """`h' = act(zx + zh)`: tanh, or RLX's Relu (Rust `max(x, 0)`: NaN → 0, −0 → +0)."""
    def step(b: ir.IRBuilder, zx: list[ir.Value], zh: list[ir.Value], h: ir.Value, c: ir.Value
             ) -> tuple[ir.Value, ir.Value]:
        z = b.fadd(zx[0], zh[0])
        return (em.rust_max(b, z, splat_like(z, 0.0)) if relu else tanh(b, z)), c
    return step


@dataclass(frozen=True)
class Cell:
    """What the shared emitter needs to know of a cell kind."""

    name: str
    gates: int
    step: Step
    has_c: bool = False        # an LSTM cell state
    hidden_bias: bool = False  # b_hh kept apart (GRU: it sits inside the reset product)
    reads_h: bool = False      # the gate math reads the old h (GRU's interpolation)


CELLS = {
    T.Lstm: Cell("lstm", 4, lstm_step, has_c=True),
    T.Gru: Cell("gru", 3, gru_step, hidden_bias=True, reads_h=True),
}
RNN_CELLS = {relu: Cell("rnn_relu" if relu else "rnn_tanh", 1, rnn_step(relu)) for relu in (False, True)}


def cell_of(t: T._Recurrent) -> Cell:
    """The cell of a thunk."""
    return RNN_CELLS[bool(t.relu)] if isinstance(t, T.Rnn) else CELLS[type(t)]


TILE_ROWS = 6  # batch rows per h·W_hhᵀ tile: each tile reads its W_hh panel once, so more rows, fewer reads


def tile_shape(lanes: int, batch: int) -> tuple[int, int]:
    """(vectors, rows) of the h·W_hhᵀ register tile (`gemm.TileShape`: per k, the panel's nv weight vectors
    are loaded, then each row's h element is broadcast into its nv accumulators): up to `TILE_ROWS` rows,
    then the widest panel whose rows·nv accumulators fit the GEMM budget and, with the nv weight vectors
    and one broadcast, the register file (AVX2: 6 rows × 2 vectors; AVX-512: 6 × 4)."""
    rows = max(1, min(batch, TILE_ROWS))
    return max(1, min(ACCUMULATORS.get(lanes, 12) // rows, (vector_registers(lanes) - 1) // (rows + 1))), rows


# ── internal functions per cell and tile shape ───────────────────────────────

@dataclass(frozen=True)
class Shaped:
    """An internal function per (cell, lanes, rows, vectors), defined once per module on first use."""

    cell: Cell
    w: int
    rows: int
    vectors: int

    suffix: ClassVar[str] = ""
    params: ClassVar[tuple[ir.Type, ...]] = ()

    @property
    def name(self) -> str:
        """The function's symbol, e.g. `rlx.rnn.lstm.w8.r6.v2.run`."""
        return f"rlx.rnn.{self.cell.name}.w{self.w}.r{self.rows}.v{self.vectors}{self.suffix}"

    def function(self, ctx: EmitContext) -> ir.Function:
        """The function in `ctx`'s module, emitted by `_body` on first use."""
        existing = ctx.module.globals.get(self.name)
        if existing is not None:
            return existing
        fn = ir.Function(ctx.module, ir.FunctionType(ir.VoidType(), list(self.params)), name=self.name)
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        fn.attributes.add("noinline")
        body = EmitContext(ctx.module, fn, ctx.index, ctx.thunk, ctx.schedule, ctx.lanes, ctx.declare,
                           arena=fn.args[0], scratch=fn.args[0])
        self._body(body, *fn.args)
        body.b.ret_void()
        return fn

    def _body(self, ctx: EmitContext, *args: ir.Value) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Units:
    """Where the gate math of a step reads and writes: the projection row (gate g at `g·hidden`), the
    packed biases `[2][G][hp]`, the old and new h and c (indexed by state element)."""

    proj: ir.Value
    bias: ir.Value
    h_prev: ir.Value
    h_next: ir.Value
    c: ir.Value
    hidden: ir.Value
    hp: ir.Value


class Unit(NamedTuple):
    """W hidden units of one batch row: their projection element (gate 0), state element and first unit."""

    proj: ir.Value
    state: ir.Value
    j: ir.Value


def update_units(ctx: EmitContext, cell: Cell, w: int, zh: list[list[ir.Value]], at: Units, units: list[Unit]) -> None:
    """The cell for every group in `units` at once: zh[g][u] = h·W_hhᵀ of gate g for group u.  The groups'
    vectors are joined into one wide vector per gate, so each step of σ/tanh is one IR operation that
    LLVM splits into independent register operations side by side (the groups' latency chains overlap
    instead of queuing one after another); writes h' (and c')."""
    b, g_count = ctx.b, cell.gates
    load = lambda index, base: join(b, [ctx.load(0, F32, index(u), w, base=base) for u in units])  # noqa: E731
    zx, hw = [], []
    for g in range(g_count):
        x = load(lambda u: b.add(u.proj, b.mul(I64(g), at.hidden)), at.proj)
        zx.append(b.fadd(x, load(lambda u: b.add(b.mul(I64(g), at.hp), u.j), at.bias)))
        hw.append(join(b, zh[g]))
        if cell.hidden_bias:
            hw[g] = b.fadd(hw[g], load(lambda u: b.add(b.mul(I64(g_count + g), at.hp), u.j), at.bias))
    zero = ir.Constant(ir.VectorType(F32, w * len(units)), None)
    h_old = load(lambda u: u.state, at.h_prev) if cell.reads_h else zero
    c_old = load(lambda u: u.state, at.c) if cell.has_c else zero
    h_new, c_new = cell.step(b, zx, hw, h_old, c_old)
    for u, h in zip(units, parts(b, h_new, w)):
        ctx.store(0, h, u.state, base=at.h_next)
    if cell.has_c:
        for u, c in zip(units, parts(b, c_new, w)):
            ctx.store(0, c, u.state, base=at.c)


def join(b: ir.IRBuilder, vectors: list[ir.Value]) -> ir.Value:
    """One vector of the lanes of `vectors` (all of one width), in order."""
    out, w = vectors[0], vectors[0].type.count
    for v in vectors[1:]:
        n = out.type.count
        if n > w:  # shufflevector takes operands of one width: pad v with undefined lanes
            v = b.shuffle_vector(v, ir.Constant(v.type, None), ir.Constant(ir.VectorType(I32, n), list(range(w)) + [w] * (n - w)))
        out = b.shuffle_vector(out, v, ir.Constant(ir.VectorType(I32, n + w), list(range(n + w))))
    return out


def parts(b: ir.IRBuilder, wide: ir.Value, w: int) -> list[ir.Value]:
    """`wide` cut into vectors of `w` lanes."""
    if wide.type.count == w:
        return [wide]
    return [b.shuffle_vector(wide, ir.Constant(wide.type, None), ir.Constant(ir.VectorType(I32, w), list(range(i, i + w))))
            for i in range(0, wide.type.count, w)]


def _sum(b: ir.IRBuilder, terms) -> ir.Value:
    total = terms[0]
    for x in terms[1:]:
        total = b.add(total, x)
    return total


# ── one (layer, direction) ───────────────────────────────────────────────────

@dataclass(frozen=True)
class DirectionRun(Shaped):
    """One (layer, direction) of any thunk with this cell and tile shape (all dims are arguments, so
    every layer and every thunk of a module shares it):

    `void (ptr w_hh, ptr bias_x, ptr bias_h, ptr h0, ptr c0, ptr dst, ptr proj, ptr wh, ptr bias, ptr h, ptr c,
    ptr zh, i64 batch, i64 seq, i64 hidden, i64 dst_row, i64 proj_row, i64 reverse, i64 carry)`

    `w_hh`, the biases and `h0`/`c0` at this (layer, direction)'s block; `dst` and `proj` at the
    direction's first column (rows `dst_row`, `proj_row` elements apart per step); `wh`, `bias`,
    `h`, `c`, `zh` this direction's scratch (packed W_hh, packed biases, two h buffers, c, one step's h·W_hhᵀ).
    """

    NAMES = ("w_hh", "bias_x", "bias_h", "h0", "c0", "dst", "proj", "wh", "bias", "h", "c", "zh",
             "batch", "seq", "hidden", "dst_row", "proj_row", "reverse", "carry")
    params: ClassVar[tuple[ir.Type, ...]] = (PTR,) * 12 + (I64,) * 7
    gemv: bool = False   # batch 1 with W | H: h·W_hhᵀ as dot products over W_hh's own rows (`Direction.gemv`)

    @property
    def suffix(self) -> str:  # type: ignore[override]
        """`.run`, or `.gemv.run`."""
        return ".gemv.run" if self.gemv else ".run"

    def _body(self, ctx: EmitContext, *args: ir.Value) -> None:
        Direction(self, ctx, dict(zip(self.NAMES, args))).run()


GROUPS = 2  # groups of W units per gate-pass iteration (one wide vector per gate: `update_units`)


class Direction:
    """The body of a `DirectionRun`: pack, seed the state, step, write the final state back.

    h·W_hhᵀ of a step is written to `zh` as `[batch][column vectors]`, column vector `u·G + g` holding
    gate g of hidden units `u·W … u·W + W − 1`, so a group's G gate vectors are adjacent."""

    def __init__(self, shape: DirectionRun, ctx: EmitContext, args: dict[str, ir.Value]) -> None:
        self.shape, self.ctx, self.a = shape, ctx, args
        b, g, w, nv = ctx.b, shape.cell.gates, shape.w, shape.vectors
        self.groups = b.udiv(b.add(args["hidden"], I64(w - 1)), I64(w))   # groups of W hidden units
        self.hp = b.mul(self.groups, I64(w))                               # padded state row
        self.state = b.mul(args["batch"], self.hp)                         # one h buffer, and c
        self.columns = b.mul(self.groups, I64(g))                          # column vectors of h·W_hhᵀ
        self.panels = b.udiv(b.add(self.columns, I64(nv - 1)), I64(nv))    # of nv column vectors each
        self.panel = b.mul(args["hidden"], I64(nv * w))                    # floats of one packed panel
        self.zh_row = b.mul(self.panels, I64(nv * w))

    def ptr(self, name: str, *terms: ir.Value) -> ir.Value:
        """Pointer to f32 element `Σ terms` of buffer `name`."""
        return self.ctx.addr(0, _sum(self.ctx.b, list(terms)) if terms else 0, 4, base=self.a[name])

    def run(self) -> None:
        """Pack W_hh and the biases, seed h (c), run the steps, write the final state back with `carry`."""
        ctx, b, a = self.ctx, self.ctx.b, self.a
        if not self.shape.gemv:
            self.pack_weights()
        self.pack_biases()
        self.seed()
        with ctx.for_range(0, a["seq"], name="step") as s:
            self.step(s)
        with b.if_then(b.icmp_unsigned("!=", a["carry"], I64(0))):
            final = b.mul(b.and_(a["seq"], I64(1)), self.state)       # the h buffer step S−1 wrote
            self.copy_rows("h0", "h", final, to_arena=True)
            if self.shape.cell.has_c:
                self.copy_rows("c0", "c", I64(0), to_arena=True)

    def pack_weights(self) -> None:
        """Panels of nv column vectors, `wh[q][k][v·W + lane] = W_hh[g·H + u·W + lane, k]` for column vector
        `q·nv + v = u·G + g`; zero past H and past the last column vector (wh is zeroed first only then).
        W×W blocks transposed in registers when W divides H, else element by element.  Memory-bound: 1 MB
        read and written per (layer, direction) at hidden 256."""
        ctx, b, h, w = self.ctx, self.ctx.b, self.a["hidden"], self.shape.w
        padded = b.or_(b.icmp_unsigned("!=", self.hp, h), b.icmp_unsigned("!=", b.urem(self.columns, I64(self.shape.vectors)), I64(0)))
        with b.if_then(padded):
            zero_bytes_at(ctx, self.ptr("wh"), b.mul(b.mul(self.panels, self.panel), I64(4)))
        with b.if_else(b.icmp_unsigned("==", b.urem(h, I64(w)), I64(0))) as (blocks, elements):
            with blocks:
                self.pack_columns(w, self.pack_block)
            with elements:
                self.pack_columns(1, self.pack_element)

    def pack_columns(self, step: int, pack: Callable[[ir.Value, ir.Value, ir.Value, ir.Value], None]) -> None:
        """`pack(src, dst, lane, k)` for every column vector, its lanes < H and k < H in steps of `step`, where
        `src` is W_hh's row of the vector's first lane and `dst` its first lane of wh at k = 0."""
        ctx, b, h, w, nv, g_count = self.ctx, self.ctx.b, self.a["hidden"], self.shape.w, self.shape.vectors, self.shape.cell.gates
        with ctx.for_range(0, self.columns, name="col") as cv:
            u, g = b.udiv(cv, I64(g_count)), b.urem(cv, I64(g_count))
            live = b.sub(h, b.mul(u, I64(w)))
            live = b.select(b.icmp_unsigned("<", live, I64(w)), live, I64(w))  # lanes of this vector < H
            src = self.ptr("w_hh", b.mul(b.add(b.mul(g, h), b.mul(u, I64(w))), h))
            dst = self.ptr("wh", b.mul(b.udiv(cv, I64(nv)), self.panel), b.mul(b.urem(cv, I64(nv)), I64(w)))
            with ctx.for_range(0, live, step, name="lane") as lane:
                with ctx.for_range(0, h, step, name="wk") as k:
                    pack(src, dst, lane, k)

    def pack_element(self, src: ir.Value, dst: ir.Value, lane: ir.Value, k: ir.Value) -> None:
        """`dst[k][lane] = src[lane][k]` (rows of src H apart, of dst nv·W apart)."""
        ctx, b, h = self.ctx, self.ctx.b, self.a["hidden"]
        x = ctx.load(0, F32, b.add(b.mul(lane, h), k), base=src)
        ctx.store(0, x, b.add(b.mul(k, I64(self.shape.vectors * self.shape.w)), lane), base=dst)

    def pack_block(self, src: ir.Value, dst: ir.Value, lane: ir.Value, k: ir.Value) -> None:
        """The W×W block at (lane, k) of src, transposed into dst (`transpose`)."""
        ctx, b, h, w = self.ctx, self.ctx.b, self.a["hidden"], self.shape.w
        rows = [ctx.load(0, F32, b.add(b.mul(b.add(lane, I64(r)), h), k), w, base=src) for r in range(w)]
        for m, column in enumerate(transpose_vectors(b, rows)):
            ctx.store(0, column, b.add(b.mul(b.add(k, I64(m)), I64(self.shape.vectors * w)), lane), base=dst)

    def pack_biases(self) -> None:
        """`bias[which][g][j]` in rows of hp: the input-side bias, then (GRU) b_hh; zero past H."""
        ctx, b, h, g_count = self.ctx, self.ctx.b, self.a["hidden"], self.shape.cell.gates
        per = b.mul(self.hp, I64(g_count))
        zero_bytes_at(ctx, self.ptr("bias"), b.mul(per, I64(8)))
        for which, name in enumerate(("bias_x", "bias_h") if self.shape.cell.hidden_bias else ("bias_x",)):
            with ctx.for_range(0, b.mul(h, I64(g_count)), name="bias") as row:
                g, j = b.udiv(row, h), b.urem(row, h)
                x = ctx.load(0, F32, row, base=self.a[name])
                ctx.store(0, x, 0, base=self.ptr("bias", b.mul(per, I64(which)), b.mul(g, self.hp), j))

    def seed(self) -> None:
        """h (and c) buffer 0 from h0 (c0) with `carry`, else zeros (the pad lanes always zero)."""
        ctx, b = self.ctx, self.ctx.b
        for region in ("h", "c"):
            zero_bytes_at(ctx, self.ptr(region), b.mul(self.state, I64(4)))
        with b.if_then(b.icmp_unsigned("!=", self.a["carry"], I64(0))):
            self.copy_rows("h0", "h", I64(0), to_arena=False)
            if self.shape.cell.has_c:
                self.copy_rows("c0", "c", I64(0), to_arena=False)

    def copy_rows(self, name: str, region: str, first: ir.Value, to_arena: bool) -> None:
        """Copy the H live floats of every batch row between state `name` `[batch, H]` and `region`."""
        ctx, b, h = self.ctx, self.ctx.b, self.a["hidden"]
        with ctx.for_range(0, self.a["batch"], name="row") as r:
            arena, state = self.ptr(name, b.mul(r, h)), self.ptr(region, first, b.mul(r, self.hp))
            copy_bytes(ctx, *((arena, state) if to_arena else (state, arena)), b.mul(h, I64(4)))

    def row_runs(self) -> list[tuple[ir.Value, ir.Value, int]]:
        """`(start, stop, rows)` tiles covering the batch: R-row tiles, then R−1-row tiles, then single rows.
        A batch `q·R + r` (0 < r, R ≥ 3) takes `R − r` tiles of R − 1 when that leaves ≥ 0 tiles of R
        (16 = 2·6 + 4 → 6 + 5 + 5: a one-row tile reads a whole panel for few FMAs), else q tiles of R and r
        single rows."""
        b, batch, rows = self.ctx.b, self.a["batch"], self.shape.rows
        if rows == 1:
            return [(I64(0), batch, 1)]
        q, r = b.udiv(batch, I64(rows)), b.urem(batch, I64(rows))
        balanced = b.and_(b.icmp_unsigned("!=", r, I64(0)), b.icmp_unsigned(">=", b.add(q, b.add(r, I64(1))), I64(rows)))
        balanced = b.and_(balanced, ir.IntType(1)(rows > 2))
        big = b.mul(b.select(balanced, b.sub(b.add(q, b.add(r, I64(1))), I64(rows)), q), I64(rows))
        mid = b.add(big, b.mul(b.select(balanced, b.sub(I64(rows), r), I64(0)), I64(rows - 1)))
        return [(I64(0), big, rows)] + ([(big, mid, rows - 1)] if rows > 2 else []) + [(mid, batch, 1)]

    def step(self, s: ir.Value) -> None:
        """Step `s` (time t = s, or S−1−s in reverse): h·W_hhᵀ into zh, the gate pass, the new h rows into dst."""
        b, a = self.ctx.b, self.a
        time = b.select(b.icmp_unsigned("!=", a["reverse"], I64(0)), b.sub(b.sub(a["seq"], I64(1)), s), s)
        old = b.mul(b.and_(s, I64(1)), self.state)
        new = b.sub(self.state, old)
        (self.gemv if self.shape.gemv else self.gemm)(s, old)
        self.gates(time, old, new)
        self.copy_out(time, new)

    def gemm(self, s: ir.Value, old: ir.Value) -> None:
        """zh = h·W_hhᵀ by `gemm.TileShape` register tiles: panels outer (a panel's H·nv·W floats stay in L1
        while every row tile reads it); odd steps walk the panels backwards (the last ones read are still in
        L2: see `gemv`)."""
        ctx, b, a, w, nv = self.ctx, self.ctx.b, self.a, self.shape.w, self.shape.vectors
        runs = self.row_runs()
        with ctx.for_range(0, self.panels, name="panel") as i:
            q = self.serpentine(s, i, self.panels, 1)
            wh = self.ptr("wh", b.mul(q, self.panel))
            for start, stop, rows in runs:
                tile = TileShape(F32, w, rows, nv, False).function(ctx)
                with ctx.for_range(start, stop, rows, name=f"rows{rows}") as r0:
                    b.call(tile, [self.ptr("h", old, b.mul(r0, self.hp)), wh,
                                  self.ptr("zh", b.mul(r0, self.zh_row), b.mul(q, I64(nv * w))),
                                  self.hp, I64(1), I64(nv * w), self.zh_row, a["hidden"], I64(w),
                                  ir.Constant(F32, 1.0), ir.Constant(F32, 0.0)])

    def gemv(self, s: ir.Value, old: ir.Value) -> None:
        """One batch-1 step's h·W_hhᵀ straight from W_hh (no packing): per W rows of W_hh, W accumulators of
        `W_hh[row, k:k+W]·h[k:k+W]` over k, their lane sums as one vector (`transpose`, then adds) into its
        column vector of zh.  W divides H.  Odd steps walk the rows backwards, so a step starts on the rows the
        last one read last — still in L2 when W_hh is larger than L2 (forwards every time, LRU would have
        evicted each row before its next use)."""
        ctx, b, h, w, g_count = self.ctx, self.ctx.b, self.a["hidden"], self.shape.w, self.shape.cell.gates
        zero = ir.Constant(ir.VectorType(F32, w), None)
        h_old = self.ptr("h", old)
        with ctx.for_range(0, b.mul(h, I64(g_count)), w, name="gemv") as i:
            row0 = self.serpentine(s, i, b.mul(h, I64(g_count)), w)
            weights = self.ptr("w_hh", b.mul(row0, h))

            def k_step(k: ir.Value, acc: list[ir.Value]) -> list[ir.Value]:
                hk = ctx.load(0, F32, k, w, base=h_old)
                return [vm.fma(b, ctx.load(0, F32, b.add(b.mul(I64(r), h), k), w, base=weights), hk, acc[r])
                        for r in range(w)]

            sums = transpose_vectors(b, carried_loop(ctx, 0, h, w, [zero] * w, k_step, name="k"))
            total = sums[0]
            for column in sums[1:]:
                total = b.fadd(total, column)
            g, j = b.udiv(row0, h), b.urem(row0, h)          # gate g of units j … j + W − 1 (W | j)
            ctx.store(0, total, b.add(b.mul(j, I64(g_count)), b.mul(g, I64(w))), base=self.a["zh"])

    def gates(self, time: ir.Value, old: ir.Value, new: ir.Value) -> None:
        """The cell for every batch row, `GROUPS` groups of W units at a time (`update_units`), reading
        this step's zh, projection row and biases; the next row's projection is prefetched (rows of one
        step lie `seq·proj_row` apart, too far apart for the hardware prefetchers)."""
        ctx, b, a, w, g_count = self.ctx, self.ctx.b, self.a, self.shape.w, self.shape.cell.gates
        proj_at = lambda r: b.mul(b.add(b.mul(r, a["seq"]), time), a["proj_row"])  # noqa: E731
        self.prefetch_proj(proj_at(I64(0)))
        whole = b.mul(b.udiv(self.groups, I64(GROUPS)), I64(GROUPS))
        with ctx.for_range(0, a["batch"], name="row") as r:
            following = b.add(r, I64(1))
            self.prefetch_proj(proj_at(b.select(b.icmp_unsigned("<", following, a["batch"]), following, r)))
            state = b.mul(r, self.hp)
            units = Units(self.ptr("proj", proj_at(r)), self.ptr("bias"), self.ptr("h", old, state),
                          self.ptr("h", new, state), self.ptr("c", state), a["hidden"], self.hp)
            zh = self.ptr("zh", b.mul(r, self.zh_row))
            for start, stop, count in ((I64(0), whole, GROUPS), (whole, self.groups, 1)):
                with ctx.for_range(start, stop, count, name=f"units{count}") as u0:
                    us = [b.add(u0, I64(i)) for i in range(count)]
                    update_units(ctx, self.shape.cell, w,
                                 [[ctx.load(0, F32, b.mul(b.add(b.mul(u, I64(g_count)), I64(g)), I64(w)), w, base=zh)
                                   for u in us] for g in range(g_count)],
                                 units, [Unit(j, j, j) for j in (b.mul(u, I64(w)) for u in us)])

    def prefetch_proj(self, row: ir.Value) -> None:
        """Hint a projection row of this direction (G·H floats from element `row`) into L1."""
        ctx, b = self.ctx, self.ctx.b
        fn = ctx.intrinsic("llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
        with ctx.for_range(0, b.mul(self.a["hidden"], I64(4 * self.shape.cell.gates)), 64, name="pf") as byte:
            b.call(fn, [ctx.addr(0, b.add(b.mul(row, I64(4)), byte), 1, base=self.a["proj"]), I32(0), I32(3), I32(1)])

    def copy_out(self, time: ir.Value, new: ir.Value) -> None:
        """The new h rows (buffer at `new`) into dst at step `time`."""
        ctx, b, a = self.ctx, self.ctx.b, self.a
        with ctx.for_range(0, a["batch"], name="out") as r:
            out = self.ptr("dst", b.mul(b.add(b.mul(r, a["seq"]), time), a["dst_row"]))
            copy_bytes(ctx, out, self.ptr("h", new, b.mul(r, self.hp)), b.mul(a["hidden"], I64(4)))

    def serpentine(self, s: ir.Value, i: ir.Value, stop: ir.Value, step: int) -> ir.Value:
        """`i` of `range(0, stop, step)` on even steps `s`, the same range backwards on odd ones."""
        b = self.ctx.b
        return b.select(b.icmp_unsigned("!=", b.and_(s, I64(1)), I64(0)), b.sub(b.sub(stop, I64(step)), i), i)


def zero_bytes_at(ctx: EmitContext, dst: ir.Value, nbytes: ir.Value) -> None:
    """`memset(dst, 0, nbytes)` of a run-time byte count."""
    fn = ctx.intrinsic("llvm.memset.p0.i64", ir.VoidType(), [PTR, ir.IntType(8), I64, ir.IntType(1)])
    ctx.b.call(fn, [dst, ir.IntType(8)(0), nbytes, ir.IntType(1)(0)])


# ── the thunk ────────────────────────────────────────────────────────────────

def check_recurrent(t: T._Recurrent) -> None:
    """At least one layer; the projection GEMM's dims fit 32-bit BLAS integers."""
    if t.num_layers == 0:
        raise ValidationError("num_layers must be at least 1", field="num_layers")
    dims = {"batch": t.batch * t.seq, "hidden": t.directions * t.gates * t.hidden,
            "input_size": max(t.input_size, t.directions * t.hidden)}
    for field, value in dims.items():
        if value > BLAS_INT_MAX:
            raise ValidationError(f"{field}: the input projection's dim {value} exceeds the 32-bit BLAS integer "
                                  f"bound {BLAS_INT_MAX}", field=field)


@lowering(T.Lstm, T.Gru, T.Rnn, path="llvm|blas", check=check_recurrent)
def recurrent(ctx: EmitContext, t: T._Recurrent) -> None:
    """Every layer: one GEMM projects the steps for both directions, then the directions run side by side."""
    if t.batch * t.seq * t.hidden == 0:
        ctx.note_path("llvm")  # nothing to compute; carried states stay as they are
        return
    cell, dirs, h, w = cell_of(t), t.directions, t.hidden, ctx.lanes
    nv, rows = tile_shape(w, t.batch)
    hp = cdiv(h, w) * w
    panels = cdiv(cell.gates * hp // w, nv)
    gh, steps = cell.gates * h, t.batch * t.seq
    proj_elems = steps * dirs * gh + hp  # slack: the pad units of the last gate read past H
    per_dir = dict(wh=panels * h * nv * w, bias=2 * cell.gates * hp, h=2 * t.batch * hp, c=t.batch * hp,
                   zh=t.batch * panels * nv * w)
    scratch = {name: ctx.scratch_alloc(4 * n) for name, n in dict(proj=proj_elems, **{
        region: dirs * n for region, n in per_dir.items()}).items()}
    run_fn = DirectionRun(cell, w, rows, nv, gemv=t.batch == 1 and h % w == 0).function(ctx)
    fa, w_ih_at = FortranArgs(ctx), t.w_ih
    inputs = [t.input_size if layer == 0 else dirs * h for layer in range(t.num_layers)]
    tiled = [tiles_project(w, steps, dirs * gh, n_in) for n_in in inputs]
    spare = ctx.scratch_alloc(4 * dirs * gh * max(n_in for n_in, yes in zip(inputs, tiled) if yes)) if any(tiled) else None
    for layer, n_in in enumerate(inputs):
        project(ctx, fa, ArenaRef(t.x if layer == 0 else t.dst), w_ih_at, steps, dirs * gh, n_in,
                ScratchRef(scratch["proj"]), spare if tiled[layer] else None)
        w_ih_at += 4 * dirs * gh * n_in

        def directions(sub: EmitContext, start: ir.Value, stop: ir.Value, layer: int = layer) -> None:
            b = sub.b
            with sub.for_range(start, stop, name="dir") as d:
                slot = b.add(I64(layer * dirs), d)  # (layer, direction) block of weights and states
                at = lambda offset, per: sub.addr(offset, b.mul(slot, I64(per)), 4)  # noqa: E731
                mine = lambda region, col=0: sub.addr(scratch[region], b.mul(d, I64(col or per_dir[region])), 4,  # noqa: E731
                                                      base=sub.shared)
                carried = [at(getattr(t, name), t.batch * h) if t.carry and name in t.carried else at(t.x, 0)
                           for name in ("h0", "c0")]
                biases = [at(getattr(t, name), gh) for name in t.biases] * (2 if len(t.biases) == 1 else 1)
                b.call(run_fn, [at(t.w_hh, gh * h), *biases, *carried, sub.addr(t.dst, b.mul(d, I64(h)), 4),
                                mine("proj", gh), mine("wh"), mine("bias"), mine("h"), mine("c"), mine("zh"),
                                I64(t.batch), I64(t.seq), I64(h), I64(dirs * h), I64(dirs * gh), d,
                                I64(int(t.carry))])

        if dirs == 2:
            ctx.parallel_for(2, directions)
        else:
            directions(ctx, I64(0), I64(1))


def project(ctx: EmitContext, fa: FortranArgs, x: ArenaRef, w_ih: int, m: int, n: int, k: int, out: ScratchRef,
            spare: int | None = None) -> None:
    """`out[m, n] = x[m, k]·W_ihᵀ` with W_ih `[n, k]` at arena offset `w_ih`.  With `spare` (scratch for n·k
    floats, see `tiles_project`): the GEMM family's IR tiles (`tiled_projection`).  Else sgemm with the
    transpose flag (AVX2: transposing W_ih on every run measured costlier than the tiles gain, LSTM 2×2
    layers, hidden 256, seq 128, batch 1: 40 → 21 ms)."""
    if k == 0:
        zero_bytes(ctx, pointer(ctx, out), 4 * m * n)
        ctx.note_path("llvm")
        return
    if spare is not None:
        tiled_projection(ctx, x, w_ih, m, n, k, out, spare)
        ctx.note_path("llvm")
        return
    blas_gemm(ctx, fa, "s", m, n, k, x, ArenaRef(w_ih), out, ta=False, tb=True, alpha=1.0, beta=0.0)
    ctx.note_path("blas")


def tiled_projection(ctx: EmitContext, x: ArenaRef, w_ih: int, m: int, n: int, k: int, out: ScratchRef,
                     spare: int) -> None:
    """`out = x·W_ihᵀ` by IR tiles, which stream rows of their B operand, so one operand is block-transposed
    into `spare` first, whichever moves fewer floats: W_ih (`n·k`, then `out = x·(W_ihᵀ)`), or — few rows,
    as at batch 1 — x and the product (`m·k + n·m`, `outᵀ = W_ih·xᵀ`, then `outᵀ` transposed into out)."""
    w = ctx.lanes
    if m % w == 0 and m * (k + n) < n * k:
        x_t, out_t = ScratchRef(spare), ScratchRef(spare + 4 * k * m)
        transpose_matrix(ctx, pointer(ctx, x), pointer(ctx, x_t), m, k)
        tile_gemm(ctx, "s", n, m, k, ArenaRef(w_ih), x_t, out_t, ta=False, alpha=1.0, beta=0.0)
        transpose_matrix(ctx, pointer(ctx, out_t), pointer(ctx, out), n, m)
        return
    w_t = ScratchRef(spare)
    transpose_matrix(ctx, pointer(ctx, ArenaRef(w_ih)), pointer(ctx, w_t), n, k)
    tile_gemm(ctx, "s", m, n, k, x, w_t, out, ta=False, alpha=1.0, beta=0.0)


def tiles_project(lanes: int, m: int, n: int, k: int) -> bool:
    """Whether a layer's projection runs as IR tiles over a transposed copy of W_ih: with 16-lane vectors
    (SciPy's OpenBLAS runs its AVX2 kernel there; the tiles use the full width), W | n and W | k (the
    copy moves W×W blocks) and the GEMM family takes the size (`ir_tiles_win`)."""
    return lanes >= 16 and n % lanes == 0 and k % lanes == 0 and ir_tiles_win(m, "s", n, k)


def transpose_matrix(ctx: EmitContext, src: ir.Value, dst: ir.Value, rows: int, cols: int) -> None:
    """Row-major `src[rows, cols]` into `dst[cols, rows]`, W×W blocks transposed in registers (W divides both);
    columns outer, so each W rows of dst are written front to back (LSTM batch 1: 0.96-0.97× of rows outer)."""
    b, w = ctx.b, ctx.lanes
    with ctx.for_range(0, cols, w, name="tc") as c:
        with ctx.for_range(0, rows, w, name="tr") as r:
            block = [ctx.load(0, F32, b.add(b.mul(b.add(r, I64(i)), I64(cols)), c), w, base=src) for i in range(w)]
            for i, column in enumerate(transpose_vectors(b, block)):
                ctx.store(0, column, b.add(b.mul(b.add(c, I64(i)), I64(rows)), r), base=dst)
