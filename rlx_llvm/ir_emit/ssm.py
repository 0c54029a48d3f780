"""State-space scans as vector IR over the state: `SelectiveScan`, `Mamba2`, `GatedDeltaNet` and
`GatedDeltaNetBackward` (semantics.md §3.9; docs/lowering-ssm.md).

* **SelectiveScan** and **Mamba2** (the diagonal scans): lanes are channels — a vector holds state i of
  W neighbouring channels (SelectiveScan: of `hidden`; Mamba2: the p of one head), so
  `h_i ← decay_i ⊙ h_i + u·B_i` and `y += C_i·h_i` are vertical (B_i, C_i broadcast, no horizontal sums).
  SelectiveScan's decay is a streamlined `2^(Δ·A₂[:, i])` per lane (`exp2_decay`: a fast path for steps
  whose |Δ·A₂| ≤ 125, a checked one otherwise); Mamba2's is one `exp(dt·a)` per step.  Blocks of a
  64-byte line of channels run in groups over chunks of steps, their states kept in scratch between
  chunks (`chunked_blocks`); groups split across threads.
* **Gated DeltaNet**: per (batch, head) the `n × n` state lives in per-thread scratch (L1/L2) across
  tokens; every column strip of it is its own recurrence given k, so a token is two passes over the
  rows per strip of `W` columns with the strip's accumulators in registers: `sk = Σ_i k_i·α_i S[i]`,
  then `S[i] ← α_i S[i] + k_i·d` while `o = Σ_i q_i·S[i]`.  (batch, head) pairs split across threads.
* **Backward**: the same strips in reverse time; the states are recomputed from √seq checkpoints.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..registry import lowering
from .context import EmitContext
from .rows import SUM
from .toolkit import (F32, FASTMATH, I32, I64, Index, carried_loop, const, copy_bytes, iadd, imul, prefetch, splat,
                      splat_like, vec, vector_registers, width_of, zero_bytes)
from .vecmath import exp, fabs, fma, poly

MAX_STATE = 128       # n ≤ 128: a row of the state fits in registers, a DeltaNet state in L2
PAR_WORK = 1 << 14    # state-element updates a thread should get at least (a fork costs a few µs)


def check_state_size(t: "T.SelectiveScan | T.Mamba2 | T._DeltaNet") -> None:
    """`state_size ≤ 128`."""
    if t.state_size > MAX_STATE:
        raise ValidationError(f"state_size {t.state_size} is above {MAX_STATE} (the state of a row is kept in "
                              "registers / L1 across the sequence)", field="state_size")


# ── strips of the state ──────────────────────────────────────────────────────

def strips(start: int, n: int, lanes: int) -> list[tuple[int, int]]:
    """`(first, width)` covering `[start, n)`: vectors of `lanes`, then halving power-of-two widths."""
    out, w = [], lanes
    while start < n:
        while w > n - start:
            w //= 2
        out.append((start, w))
        start += w
    return out


def for_strips(ctx: EmitContext, n: int, body: Callable[[Index, int], None]) -> None:
    """`body(j, W)` over whole vectors of `[0, n)` (a loop), then `body(j, w)` over the tail strips."""
    full = n - n % ctx.lanes
    if full:
        with ctx.for_range(0, full, ctx.lanes, name="strip") as j:
            body(j, ctx.lanes)
    for j, w in strips(full, n, ctx.lanes):
        body(j, w)


def fmadd(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    """`x·y + z` (contractible to one fma)."""
    return b.fadd(b.fmul(x, y, flags=FASTMATH), z, flags=FASTMATH)


def split_rows(ctx: EmitContext, rows: int, work_per_row: int, body: Callable[[EmitContext, ir.Value], None]) -> None:
    """`body(ctx, row)` for every row, rows split across threads when there is enough work."""
    def chunk(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="row") as row:
            body(sub, row)
    ctx.parallel_for(rows, chunk, grain=1, min_work=max(1, -(-PAR_WORK // max(1, work_per_row))))


# ── the diagonal scans: lanes are channels ───────────────────────────────────

# 2^f on [−½, ½] with f(0) = 1 exactly (a minimax fit of degree 5,
# relative error 1.6e-7 in f32 Horner; docs/lowering-ssm.md).
EXP2_P = (1.0, 0.6931470036506653, 0.24022242426872253, 0.05550733581185341, 0.009671512991189957,
          0.001326472731307149)
ROUNDER = 1.5 * 2.0 ** 23  # t + ROUNDER rounds t to an integer held in the low mantissa bits (|t| < 2^22)
SAFE_T = 125.0             # |t| ≤ 125: 2^t as p's exponent bits + n is a normal number, no clamps needed
Y_CHAINS = 2               # independent partial sums of y_t (half the fma chain)
PREFETCH_STEPS = 8         # steps ahead whose x, Δ, y lines are requested (each step is a new page)
CHUNK = 64                 # steps a block runs before the next block of its group takes the same rows
GROUP = 8                  # blocks sharing a chunk of rows (their states wait in per-thread scratch)
MAMBA2_VECTORS = 4         # Mamba2 block: 4 vectors share each step's decay and B_i, C_i broadcasts
MAX_CARRIED = 256          # state vectors a block carries at most (LLVM allocates more for seconds)


def exp2_decay(b: ir.IRBuilder, delta: ir.Value, a2: ir.Value, checked: bool) -> ir.Value:
    """2^t for t = Δ·A₂: n = round(t) by the rounder trick (no fast-math flags: it must not fold), then
    `P(t − n)·2^n`.  Fast (`checked=False`, the caller has checked |t| ≤ SAFE_T): `t + rounder` and `t − n`
    as fmas of Δ·A₂, 2^n added to P's exponent bits — 10 vector instructions.  `checked`: t clamped to
    [−127, 128] first (NaN kept) and P multiplied by 2^n built from bits: n = −127 gives +0 (2^t < 2^−126.5
    flushes to 0), n = 128 gives +inf, NaN stays NaN."""
    rounder = splat_like(delta, ROUNDER)
    ity = vec(I32, width_of(delta))
    if checked:
        lo, hi = splat_like(delta, -127.0), splat_like(delta, 128.0)
        t = b.fmul(delta, a2)
        t = b.select(b.fcmp_ordered("<", t, lo), lo, t)
        t = b.select(b.fcmp_ordered(">", t, hi), hi, t)
        shifted = b.fadd(t, rounder)
        fraction = b.fsub(t, b.fsub(shifted, rounder))
    else:
        shifted = fma(b, delta, a2, rounder)
        fraction = fma(b, delta, a2, b.fneg(b.fsub(shifted, rounder)))
    p = poly(b, fraction, EXP2_P)
    exponent = b.shl(b.bitcast(shifted, ity), const(I32, 23, width_of(delta)))   # n·2^23 (mod 2^32)
    if checked:
        return b.fmul(p, b.bitcast(b.add(exponent, const(I32, 127 << 23, width_of(delta))), delta.type))
    return b.bitcast(b.add(b.bitcast(p, ity), exponent), delta.type)


def block_vectors(n: int, lanes: int) -> int:
    """Channel vectors per block: a 64-byte line of x, Δ, y per step when the states of its channels
    (`vectors·n`) fit twice the register file (the rest spills to L1), else one vector."""
    line = max(1, 16 // lanes)
    return line if line * n <= 2 * vector_registers(lanes) else 1


class SeqLayout(NamedTuple):
    """Where one sequence's operands are: x/y of channel c at time row r (= batch·seq + t) at element
    `r·stride + first + c`; its B_t / C_t rows at `(r·bc_rows + bc_row)·n`."""

    batch: ir.Value
    first: Index
    stride: int
    bc_rows: int = 1
    bc_row: Index = 0


class ChannelBlock:
    """Channels `first + o … + w` of each part `(o, w)` of one sequence, one channel per lane: state i of
    the channels is one vector, so `h_i ← decay_i ⊙ h_i + u·B_i` and `y += C_i·h_i` are vertical (B_i, C_i
    broadcast scalars, no horizontal sums).  Subclasses say what a step's decays and u are (`advance`)."""

    def __init__(self, ctx: EmitContext, t: "T.SelectiveScan | T.Mamba2", seq: SeqLayout,
                 parts: list[tuple[int, int]]) -> None:
        self.ctx, self.t, self.seq, self.parts, self.n = ctx, t, seq, parts, t.state_size

    def run(self, start: Index, stop: Index, state: int | None = None, at: Index = 0) -> None:
        """Steps `[start, stop)`, the states in registers (spilled to L1 beyond the register file): from
        zeros, or from scratch (offset `state`, element `at`) and written back there.  Where the steps need
        it (`safe`), two copies of the loop: the fast one, and the checked one for ranges that fail the test."""
        safe = self.safe(start, stop)
        if safe is None:
            self.steps(start, stop, state, at, checked=False)
            return
        with self.ctx.b.if_else(safe) as (fast, slow):
            with fast:
                self.steps(start, stop, state, at, checked=False)
            with slow:
                self.steps(start, stop, state, at, checked=True)

    def safe(self, start: Index, stop: Index) -> ir.Value | None:
        """Whether steps `[start, stop)` may take the fast path (`None`: there is only one)."""
        return None

    def steps(self, start: Index, stop: Index, state: int | None, at: Index, checked: bool) -> None:
        """The loop over steps `[start, stop)` (see `run`)."""
        ctx, n = self.ctx, self.n
        slots = [(k, i) for k, _ in enumerate(self.parts) for i in range(n)]
        spots = [iadd(ctx.b, at, sum(w for _, w in self.parts[:k]) * n + i * self.parts[k][1]) for k, i in slots]
        if state is None:
            init = [const(F32, 0.0, self.parts[k][1]) for k, _ in slots]
        else:
            init = [ctx.load(state, F32, spot, self.parts[k][1], base=ctx.scratch)
                    for (k, _), spot in zip(slots, spots)]

        def step(tt: ir.Value, h: list[ir.Value]) -> list[ir.Value]:
            self.prefetch(tt)
            row = self.row(tt)
            return self.advance(row, self.x_at(row), h, checked)

        final = carried_loop(ctx, start, stop, 1, init, step, name="t")
        if state is not None:
            for value, spot in zip(final, spots):
                ctx.store(state, value, spot, base=ctx.scratch)

    def row(self, tt: ir.Value) -> ir.Value:
        """The time row (batch·seq + t) of step `tt`."""
        b = self.ctx.b
        return b.add(b.mul(self.seq.batch, I64(self.t.seq)), tt)

    def x_at(self, row: ir.Value) -> Index:
        """Element of x / y of the block's first channel at time row `row`."""
        return iadd(self.ctx.b, self.ctx.b.mul(row, I64(self.seq.stride)), self.seq.first)

    def advance(self, row: ir.Value, at: Index, h: list[ir.Value], checked: bool) -> list[ir.Value]:
        """The states after time row `row` (x at element `at`), y_t stored (`checked`: see `run`)."""
        raise NotImplementedError

    def update(self, row: ir.Value, at: Index, us: list[ir.Value], decay: Callable[[int, int], ir.Value],
               h: list[ir.Value]) -> list[ir.Value]:
        """`h_i ← decay(k, i) ⊙ h_i + u_k·B_i` for every part k, y_t = Σ C_i·h_i stored.  Each decay is emitted
        right before its use: computing them all first keeps n·parts more vectors live (spills, ~15 % slower)."""
        ctx, b, t, n = self.ctx, self.ctx.b, self.t, self.n
        bc = imul(b, iadd(b, b.mul(row, I64(self.seq.bc_rows)), self.seq.bc_row), n)
        new = []
        for k, ((o, w), u) in enumerate(zip(self.parts, us)):
            ys = [const(F32, 0.0, w)] * Y_CHAINS
            for i in range(n):
                drive = b.fmul(u, splat(b, ctx.load(t.b, F32, iadd(b, bc, i)), w), flags=FASTMATH)
                state = fmadd(b, decay(k, i), h[k * n + i], drive)
                ys[i % Y_CHAINS] = fmadd(b, splat(b, ctx.load(t.c, F32, iadd(b, bc, i)), w), state, ys[i % Y_CHAINS])
                new.append(state)
            ctx.store(t.dst, tree_sum(b, ys), iadd(b, at, o))
        return new

    def prefetch(self, tt: ir.Value) -> None:
        """Request x, Δ and y of step `tt + PREFETCH_STEPS` (the last step near the end)."""
        b, t = self.ctx.b, self.t
        ahead = b.add(tt, I64(PREFETCH_STEPS))
        ahead = b.select(b.icmp_signed("<", ahead, I64(t.seq)), ahead, I64(t.seq - 1))
        at = self.x_at(self.row(ahead))
        for slot in self.streams():
            prefetch(self.ctx, slot, at, 4)

    def streams(self) -> tuple[int, ...]:
        """The slots read or written at a step's x element."""
        return self.t.x, self.t.dst


class ScanBlock(ChannelBlock):
    """SelectiveScan: decay_i = 2^(Δ·A₂[:, i]) per lane (A₂ = A·log₂e gathered once per block), u = Δ·x."""

    def __init__(self, ctx: EmitContext, t: T.SelectiveScan, seq: SeqLayout, parts: list[tuple[int, int]]) -> None:
        super().__init__(ctx, t, seq, parts)
        b = ctx.b
        self.a2 = [[b.fmul(a, splat_like(a, 1.0 / math.log(2.0))) for a in self.gather_a(o, w)] for o, w in parts]
        self.a_max = [self.largest(part) for part in self.a2]

    def gather_a(self, o: int, w: int) -> list[ir.Value]:
        """A[c, i] of the part's channels c, as one vector per state i."""
        b, n = self.ctx.b, self.n
        rows = [imul(b, iadd(b, self.seq.first, o + lane), n) for lane in range(w)]
        return [gather(self.ctx, self.t.a, [iadd(b, row, i) for row in rows]) for i in range(n)]

    def largest(self, a2: list[ir.Value]) -> ir.Value:
        """max_i |A₂[:, i]| per lane, NaN where any is NaN or infinite (so no Δ passes the fast-path test)."""
        b = self.ctx.b
        mags = [fabs(b, a) for a in a2]
        top, total = mags[0], mags[0]
        for m in mags[1:]:
            top = b.select(b.fcmp_ordered(">", m, top), m, top)
            total = b.fadd(total, m)
        return b.fadd(top, b.fmul(total, splat_like(top, 0.0)))   # + 0·Σ: NaN for a NaN or inf among them

    def safe(self, start: Index, stop: Index) -> ir.Value:
        """Every |Δ·A₂| of the steps ≤ SAFE_T (false for a NaN): one pass over their Δ."""
        b = self.ctx.b

        def check(tt: ir.Value, ok: list[ir.Value]) -> list[ir.Value]:
            return [b.and_(k, b.fcmp_ordered("<=", b.fmul(fabs(b, d), m), splat_like(d, SAFE_T)))
                    for k, d, m in zip(ok, self.deltas(self.x_at(self.row(tt))), self.a_max)]

        everywhere = [const(ir.IntType(1), 1, w) for _, w in self.parts]
        return all_true(b, carried_loop(self.ctx, start, stop, 1, everywhere, check, name="safe"))

    def deltas(self, at: Index) -> list[ir.Value]:
        """Δ of every part at x element `at`."""
        return [self.ctx.load(self.t.delta, F32, iadd(self.ctx.b, at, o), w) for o, w in self.parts]

    def advance(self, row: ir.Value, at: Index, h: list[ir.Value], checked: bool) -> list[ir.Value]:
        """decay = 2^(Δ·A₂[:, i]) per part and state."""
        ctx, b = self.ctx, self.ctx.b
        deltas = self.deltas(at)
        us = [b.fmul(d, ctx.load(self.t.x, F32, iadd(b, at, o), w), flags=FASTMATH)
              for d, (o, w) in zip(deltas, self.parts)]
        return self.update(row, at, us, lambda k, i: exp2_decay(b, deltas[k], self.a2[k][i], checked), h)

    def streams(self) -> tuple[int, ...]:
        return self.t.x, self.t.delta, self.t.dst


class Mamba2Block(ChannelBlock):
    """Mamba2: the channels are the p of one (batch, head); decay = exp(dt·a[h]) (one scalar per step, every
    state), u = dt·x."""

    def __init__(self, ctx: EmitContext, t: T.Mamba2, seq: SeqLayout, parts: list[tuple[int, int]],
                 head: ir.Value) -> None:
        super().__init__(ctx, t, seq, parts)
        self.head, self.a = head, ctx.load(t.a, F32, head)

    def dt(self, row: ir.Value) -> ir.Value:
        """dt of the head at time row `row`."""
        b = self.ctx.b
        return self.ctx.load(self.t.dt, F32, b.add(b.mul(row, I64(self.t.heads)), self.head))

    def advance(self, row: ir.Value, at: Index, h: list[ir.Value], checked: bool) -> list[ir.Value]:
        ctx, b, dt = self.ctx, self.ctx.b, self.dt(row)
        decay = exp(b, b.fmul(dt, self.a, flags=FASTMATH))
        us = [b.fmul(splat(b, dt, w), ctx.load(self.t.x, F32, iadd(b, at, o), w), flags=FASTMATH)
              for o, w in self.parts]
        return self.update(row, at, us, lambda k, i: splat(b, decay, self.parts[k][1]), h)


def chunked_blocks(ctx: EmitContext, t: "T.SelectiveScan | T.Mamba2", sequences: int, blocks: int, block: int,
                   run: Callable[[EmitContext, ir.Value, ir.Value, Index, Index, int, Index], None]) -> None:
    """`run(ctx, sequence, first channel, start, stop, state, at)` for every block of `block` channels of
    every sequence: groups of GROUP blocks (split across threads) step through the rows in chunks of CHUNK
    steps, each chunk through every block of the group, whose states wait in per-thread scratch between
    chunks — so a chunk's lines of x, Δ, y (and their pages) are fetched once for the whole group."""
    groups = -(-blocks // GROUP)
    state_floats = t.state_size * block

    def group_rows(sub: EmitContext, r: ir.Value) -> None:
        b = sub.b
        sequence, g = b.udiv(r, I64(groups)), b.urem(r, I64(groups))
        first = b.mul(g, I64(GROUP))
        count = b.sub(b.select(b.icmp_signed("<", b.add(first, I64(GROUP)), I64(blocks)),
                               b.add(first, I64(GROUP)), I64(blocks)), first)
        state = sub.scratch_alloc(4 * state_floats * min(GROUP, blocks))
        zero_bytes(sub, sub.addr(state, 0, 1, base=sub.scratch), 4 * state_floats * min(GROUP, blocks))
        with sub.for_range(0, t.seq, CHUNK, name="chunk") as start:
            stop = b.add(start, I64(CHUNK))
            stop = b.select(b.icmp_signed("<", stop, I64(t.seq)), stop, I64(t.seq))
            with sub.for_range(0, count, name="block") as j:
                run(sub, sequence, b.mul(b.add(first, j), I64(block)), start, stop, state,
                    b.mul(j, I64(state_floats)))

    split_rows(ctx, sequences * groups, t.seq * t.state_size * block * GROUP, group_rows)


def tree_sum(b: ir.IRBuilder, xs: list[ir.Value]) -> ir.Value:
    """Σ xs added pairwise."""
    while len(xs) > 1:
        xs = [b.fadd(x, y, flags=FASTMATH) for x, y in zip(xs[::2], xs[1::2])] + xs[len(xs) & ~1:]
    return xs[0]


def all_true(b: ir.IRBuilder, masks: list[ir.Value]) -> ir.Value:
    """Whether every lane of every `<w x i1>` mask (or i1) is true."""
    out = None
    for m in masks:
        w = width_of(m)
        whole = m if w == 1 else b.icmp_unsigned("==", b.bitcast(m, ir.IntType(w)), ir.IntType(w)((1 << w) - 1))
        out = whole if out is None else b.and_(out, whole)
    return out


def gather(ctx: EmitContext, offset: int, indices: list[Index]) -> ir.Value:
    """The f32 elements at `indices` as one vector (a scalar for one index)."""
    values = [ctx.load(offset, F32, i) for i in indices]
    if len(values) == 1:
        return values[0]
    out = ir.Constant(ir.VectorType(F32, len(values)), None)
    for lane, v in enumerate(values):
        out = ctx.b.insert_element(out, v, I32(lane))
    return out


def diagonal_scan(ctx: EmitContext, t: "T.SelectiveScan | T.Mamba2", sequences: int, channels: int, vectors: int,
                  make: Callable[[EmitContext, ir.Value, Index, list[tuple[int, int]]], ChannelBlock]) -> None:
    """Every sequence's `channels`: blocks of `vectors` vectors chunk by chunk (`chunked_blocks`), then the
    channels left over as halving power-of-two strips through the whole sequence.  `make(ctx, sequence,
    first, parts)` builds the block of channels `first + o … + w` of each part `(o, w)`."""
    w = ctx.lanes
    block = vectors * w
    blocks = channels // block
    parts = [(o, w) for o in range(0, block, w)]
    if blocks:
        chunked_blocks(ctx, t, sequences, blocks, block, lambda sub, sequence, first, start, stop, state, at:
                       make(sub, sequence, first, parts).run(start, stop, state, at))
    first, tail = blocks * block, strips(blocks * block, channels, w)
    if tail:
        split_rows(ctx, sequences, t.seq * t.state_size * (channels - first), lambda sub, sequence:
                   make(sub, sequence, I64(first), [(o - first, width) for o, width in tail]).run(0, t.seq))


@lowering(T.SelectiveScan, check=check_state_size)
def selective_scan(ctx: EmitContext, t: T.SelectiveScan) -> None:
    """The sequences are the batches, the channels `hidden`."""
    if t.seq and t.state_size and t.hidden:
        diagonal_scan(ctx, t, t.batch, t.hidden, block_vectors(t.state_size, ctx.lanes),
                      lambda sub, batch, first, parts: ScanBlock(sub, t, SeqLayout(batch, first, t.hidden), parts))


def mamba2_vectors(n: int) -> int:
    """Vectors per Mamba2 block: MAMBA2_VECTORS (0.81× / 0.87× the time of 1–2 vectors at n = 16 / 64), at
    most MAX_CARRIED state vectors (n = 128: 2 vectors — 4 took 9 s to compile, 2 take 3 s and run as fast)."""
    return max(1, min(MAMBA2_VECTORS, MAX_CARRIED // max(1, n)))


@lowering(T.Mamba2, check=check_state_size)
def mamba2(ctx: EmitContext, t: T.Mamba2) -> None:
    """The sequences are the (batch, head) pairs, the channels a head's `head_dim` (x / y rows of `heads·head_dim`,
    b / c rows per head)."""
    h, p = t.heads, t.head_dim

    def make(sub: EmitContext, bh: ir.Value, first: Index, parts: list[tuple[int, int]]) -> Mamba2Block:
        b = sub.b
        batch, head = b.udiv(bh, I64(h)), b.urem(bh, I64(h))
        return Mamba2Block(sub, t, SeqLayout(batch, iadd(b, b.mul(head, I64(p)), first), h * p, h, head), parts, head)

    if t.seq and t.state_size and p:
        diagonal_scan(ctx, t, t.batch * h, p, mamba2_vectors(t.state_size), make)


class Token(NamedTuple):
    """One token of one (batch, head): where its q/k/v/dy rows start (`row`), its beta / scalar-gate index
    (`bsh`), its row decays `alpha(i)` = e^{g} (scalars) and its beta."""

    row: ir.Value
    bsh: ir.Value
    alpha: Callable[[Index], ir.Value]
    beta: ir.Value


class DeltaNetHead:
    """One (batch, head) of a gated DeltaNet thunk in one thread's code.

    Its states (`n × n`, row i = key index) lie in one scratch block, each named by its first element:
    `load(s, i, j, w)` is `S[i, j:j+w]` of the state starting at element `s`."""

    def __init__(self, sub: EmitContext, t: T._DeltaNet, bh: ir.Value, states: int) -> None:
        b, n = sub.b, t.state_size
        self.sub, self.t, self.n = sub, t, n
        self.batch, self.head = b.udiv(bh, I64(t.heads)), b.urem(bh, I64(t.heads))
        self.bh = bh
        self.states = sub.scratch_alloc(4 * n * n * states)
        self.alphas = sub.scratch_alloc(4 * n) if t.gate_per_channel else None
        self.inv_sqrt_n = const(F32, 1.0 / math.sqrt(n))

    # state buffers
    def at(self, s: Index, i: Index, j: Index) -> Index:
        """Element `(i, j)` of the state starting at element `s`."""
        b = self.sub.b
        return iadd(b, s, iadd(b, imul(b, i, self.n), j))

    def load(self, s: Index, i: Index, j: Index, w: int) -> ir.Value:
        """`S[i, j:j+w]`."""
        return self.sub.load(self.states, F32, self.at(s, i, j), w, base=self.sub.scratch)

    def store(self, s: Index, i: Index, j: Index, value: ir.Value) -> None:
        """`S[i, j:j+w] = value`."""
        self.sub.store(self.states, value, self.at(s, i, j), base=self.sub.scratch)

    def pointer(self, s: Index) -> ir.Value:
        """Address of the state starting at element `s`."""
        return self.sub.addr(self.states, s, 4, base=self.sub.scratch)

    def copy(self, dst: ir.Value, src: ir.Value) -> None:
        """Copy one `n × n` state between two addresses."""
        copy_bytes(self.sub, dst, src, 4 * self.n * self.n)

    def initial_state(self, s: Index) -> None:
        """State `s` = `state[b, h]` with `carry_state`, else zeros."""
        if self.t.carry_state:
            self.copy(self.pointer(s), self.sub.addr(self.t.state, self.bh, 4 * self.n * self.n))
        else:
            zero_bytes(self.sub, self.pointer(s), 4 * self.n * self.n)

    # tokens
    def token(self, tt: ir.Value) -> Token:
        """Token `tt`: its indices, beta and row decays (per channel: e^{g} of the row into scratch first)."""
        sub, t, b = self.sub, self.t, self.sub.b
        bsh = b.add(b.mul(b.add(b.mul(self.batch, I64(t.seq)), tt), I64(t.heads)), self.head)
        row = b.mul(bsh, I64(self.n))
        if t.gate_per_channel:
            def decay(i: Index, w: int) -> None:
                sub.store(self.alphas, exp(b, sub.load(t.g, F32, iadd(b, row, i), w)), i, base=sub.scratch)
            for_strips(sub, self.n, decay)
            alpha = lambda i: sub.load(self.alphas, F32, i, base=sub.scratch)
        else:
            gate = exp(b, sub.load(t.g, F32, bsh))
            alpha = lambda i: gate
        return Token(row, bsh, alpha, sub.load(t.beta, F32, bsh))

    def row_value(self, name: str, tok: Token, i: Index, w: int) -> ir.Value:
        """`name[row + i]` (q, k) splat to `w` lanes."""
        b = self.sub.b
        return splat(b, self.sub.load(getattr(self.t, name), F32, iadd(b, tok.row, i)), w)

    def decayed(self, tok: Token, s: Index, i: Index, j: Index, w: int) -> ir.Value:
        """`S'[i, j:j+w] = α_i·S[i, j:j+w]`."""
        return self.sub.b.fmul(splat(self.sub.b, tok.alpha(i), w), self.load(s, i, j, w), flags=FASTMATH)

    def rows(self, init: list[ir.Value], body: Callable[[ir.Value, list[ir.Value]], list[ir.Value]]
             ) -> list[ir.Value]:
        """`for i in range(n): values = body(i, values)`."""
        return carried_loop(self.sub, 0, self.n, 1, init, body, name="i")

    def delta(self, tok: Token, s: Index, j: Index, w: int) -> tuple[ir.Value, ir.Value]:
        """(`v − Σ_i k_i·S'[i]`, d = that·β) of columns `j:j+w`, from the state before the token."""
        b = self.sub.b
        (sk,) = self.rows([const(F32, 0.0, w)], lambda i, acc: [
            fmadd(b, self.row_value("k", tok, i, w), self.decayed(tok, s, i, j, w), acc[0])])
        resid = b.fsub(self.sub.load(self.t.v, F32, iadd(b, tok.row, j), w), sk, flags=FASTMATH)
        return resid, b.fmul(resid, splat(b, tok.beta, w), flags=FASTMATH)

    def forward(self, tok: Token, src: Index, dst: Index, out: bool) -> None:
        """One token: state `dst` = the update of state `src` (they may be one), and `o` to the output if `out`."""
        sub, b = self.sub, self.sub.b

        def strip(j: Index, w: int) -> None:
            _, d = self.delta(tok, src, j, w)

            def update(i: ir.Value, acc: list[ir.Value]) -> list[ir.Value]:
                s = fmadd(b, self.row_value("k", tok, i, w), d, self.decayed(tok, src, i, j, w))
                self.store(dst, i, j, s)
                return [fmadd(b, self.row_value("q", tok, i, w), s, acc[0])] if out else []

            o = self.rows([const(F32, 0.0, w)] if out else [], update)
            if out:
                sub.store(self.t.dst, b.fmul(o[0], splat(b, self.inv_sqrt_n, w), flags=FASTMATH),
                          iadd(b, tok.row, j))

        for_strips(sub, self.n, strip)


@lowering(T.GatedDeltaNet, check=check_state_size)
def gated_delta_net(ctx: EmitContext, t: T.GatedDeltaNet) -> None:
    """Per (batch, head): the state into scratch, every token in order, the final state back with `carry_state`."""
    n = t.state_size
    if not (t.seq and n):
        return

    def head(sub: EmitContext, bh: ir.Value) -> None:
        it = DeltaNetHead(sub, t, bh, states=1)
        it.initial_state(0)
        with sub.for_range(0, t.seq, name="t") as tt:
            it.forward(it.token(tt), 0, 0, out=True)
        if t.carry_state:
            it.copy(sub.addr(t.state, bh, 4 * n * n), it.pointer(0))

    split_rows(ctx, t.batch * t.heads, t.seq * n * n, head)


# ── gated DeltaNet backward ──────────────────────────────────────────────────

def checkpointing(seq: int) -> tuple[int, int]:
    """(tokens per chunk ≈ √seq, chunks): the states kept are one per chunk plus one chunk's worth."""
    chunk = max(1, math.isqrt(max(seq - 1, 0)) + 1)
    return chunk, -(-seq // chunk)


class Gradients:
    """Where each gradient of the packed dst starts (`GatedDeltaNetBackward.parts()`), and `add` into it."""

    def __init__(self, sub: EmitContext, t: T.GatedDeltaNetBackward) -> None:
        self.sub, self.at, offset = sub, {}, t.dst
        for name, count in t.parts():
            self.at[name] = offset
            offset += 4 * count

    def add(self, name: str, index: Index, value: ir.Value) -> None:
        """`d<name>[index] += value` (scalar)."""
        sub = self.sub
        sub.store(self.at[name], sub.b.fadd(sub.load(self.at[name], F32, index), value, flags=FASTMATH), index)

    def zero(self, name: str, index: Index, count: int) -> None:
        """`d<name>[index : index + count] = 0`."""
        zero_bytes(self.sub, self.sub.addr(self.at[name], index, 4), 4 * count)


def backward_token(it: DeltaNetHead, grads: Gradients, tok: Token, prev: Index, ds: Index) -> None:
    """Undo one token: the gradients of its inputs from `dS` (∂L/∂S after it) and the state `prev` before it;
    `dS` becomes ∂L/∂S before it.  Per column strip: S' = α⊙S, d = (v − S'ᵀk)·β, S_t = S' + k dᵀ, then
    G = dS + q doᵀ (∂L/∂S_t), dd = Gᵀk, dS' = G − k (dd·β)ᵀ, and dS ← α⊙dS'."""
    sub, t, b, n = it.sub, it.t, it.sub.b, it.n
    hsum = lambda v: SUM.horizontal(sub, v)
    grads.zero("q", tok.row, n)
    grads.zero("k", tok.row, n)
    grads.zero("g", tok.row if t.gate_per_channel else tok.bsh, n if t.gate_per_channel else 1)
    grads.zero("beta", tok.bsh, 1)

    def strip(j: Index, w: int) -> None:
        resid, d = it.delta(tok, prev, j, w)
        do = b.fmul(sub.load(t.dy, F32, iadd(b, tok.row, j), w), splat(b, it.inv_sqrt_n, w), flags=FASTMATH)
        k = lambda i: it.row_value("k", tok, i, w)
        upstream = lambda i: fmadd(b, it.row_value("q", tok, i, w), do, it.load(ds, i, j, w))   # G[i]

        def through_output(i: ir.Value, acc: list[ir.Value]) -> list[ir.Value]:
            after = fmadd(b, k(i), d, it.decayed(tok, prev, i, j, w))                        # S_t[i]
            grads.add("q", iadd(b, tok.row, i), hsum(b.fmul(after, do, flags=FASTMATH)))
            return [fmadd(b, k(i), upstream(i), acc[0])]

        (dd,) = it.rows([const(F32, 0.0, w)], through_output)
        beta = splat(b, tok.beta, w)
        sub.store(grads.at["v"], b.fmul(dd, beta, flags=FASTMATH), iadd(b, tok.row, j))
        grads.add("beta", tok.bsh, hsum(b.fmul(dd, resid, flags=FASTMATH)))
        dsk = b.fneg(b.fmul(dd, beta, flags=FASTMATH))

        def through_decay(i: ir.Value, acc: list[ir.Value]) -> list[ir.Value]:
            decayed, g = it.decayed(tok, prev, i, j, w), upstream(i)
            grads.add("k", iadd(b, tok.row, i), hsum(fmadd(b, g, d, b.fmul(decayed, dsk, flags=FASTMATH))))
            dsp = fmadd(b, k(i), dsk, g)                                                      # dS'[i]
            gate = hsum(b.fmul(dsp, decayed, flags=FASTMATH))
            it.store(ds, i, j, b.fmul(splat(b, tok.alpha(i), w), dsp, flags=FASTMATH))
            if t.gate_per_channel:
                grads.add("g", iadd(b, tok.row, i), gate)
                return []
            return [b.fadd(acc[0], gate, flags=FASTMATH)]

        gate = it.rows([] if t.gate_per_channel else [const(F32, 0.0)], through_decay)
        if not t.gate_per_channel:
            grads.add("g", tok.bsh, gate[0])

    for_strips(sub, n, strip)


@lowering(T.GatedDeltaNetBackward, check=check_state_size)
def gated_delta_net_backward(ctx: EmitContext, t: T.GatedDeltaNetBackward) -> None:
    """Per (batch, head), 2·chunks passes over chunks of tokens, each running the chunk forward from its
    checkpoint and keeping every state: chunks 0, 1, … (the state after one is the next one's checkpoint),
    then chunks in reverse (its tokens undone last to first).  dstate = the final dS."""
    n = t.state_size
    if not n:
        return
    chunk, chunks = checkpointing(t.seq)
    size = n * n
    first_buf, ds = chunks * size, (chunks + chunk + 1) * size   # states: checkpoints ‖ a chunk's ‖ dS

    def head(sub: EmitContext, bh: ir.Value) -> None:
        b = sub.b
        it = DeltaNetHead(sub, t, bh, states=chunks + chunk + 2)
        grads = Gradients(sub, t)
        buf = lambda k: b.add(I64(first_buf), b.mul(k, I64(size)))     # state before token start + k
        it.initial_state(0)
        zero_bytes(sub, it.pointer(ds), 4 * size)
        with sub.for_range(0, 2 * chunks, name="pass") as r:
            undoing = b.icmp_signed(">=", r, I64(chunks))
            c = b.select(undoing, b.sub(I64(2 * chunks - 1), r), r)
            start = b.mul(c, I64(chunk))
            stop = b.add(start, I64(chunk))
            length = b.sub(b.select(b.icmp_signed("<", stop, I64(t.seq)), stop, I64(t.seq)), start)
            it.copy(it.pointer(buf(I64(0))), it.pointer(b.mul(c, I64(size))))
            with sub.for_range(0, length, name="redo") as k:
                it.forward(it.token(b.add(start, k)), buf(k), buf(b.add(k, I64(1))), out=False)
            with b.if_else(undoing) as (undo, keep):
                with undo:
                    with sub.for_range(0, length, name="undo") as m:
                        k = b.sub(b.sub(length, I64(1)), m)
                        backward_token(it, grads, it.token(b.add(start, k)), buf(k), ds)
                with keep:   # checkpoint c + 1 (for the last chunk: buf[0], about to be overwritten)
                    it.copy(it.pointer(b.mul(b.add(c, I64(1)), I64(size))), it.pointer(buf(length)))
        if t.carry_state:
            it.copy(sub.addr(grads.at["state"], bh, 4 * size), it.pointer(ds))

    split_rows(ctx, t.batch * t.heads, 3 * max(t.seq, 1) * size, head)
