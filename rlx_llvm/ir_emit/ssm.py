"""State-space scans as vector IR over the state: `SelectiveScan`, `Mamba2`, `GatedDeltaNet` and
`GatedDeltaNetBackward` (semantics.md §3.9; docs/lowering-ssm.md).

* **SelectiveScan**: lanes are channels — a vector holds state i of W neighbouring channels, so
  `h_i ← 2^(Δ·A₂[:, i])·h_i + (Δ·x)·B_i` and `y += C_i·h_i` are vertical (no horizontal sums), with a
  streamlined `2^t` (`exp2_decay`: a fast path when the block's |Δ·A₂| ≤ 125, a checked one otherwise).
* **Mamba2**: every row `S[p, :]` of a head is an independent recurrence `S ← decay·S + u·b_t`,
  `y_t = Σ c_t ⊙ S`.  A row keeps its `n ≤ 128` state values in registers across the whole sequence
  (`strips`: vectors of `ctx.lanes`, then narrower power-of-two vectors for the tail).  Up to 8
  neighbouring rows step together (sharing b_t, c_t and cache lines); groups split across threads.
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


def lane_sum(ctx: EmitContext, parts: list[ir.Value]) -> ir.Value:
    """The sum of every lane of `parts` (vectors of any widths): same widths added first, one reduction each."""
    b = ctx.b
    by_width: dict[int, ir.Value] = {}
    for p in parts:
        w = p.type.count if isinstance(p.type, ir.VectorType) else 1
        by_width[w] = b.fadd(by_width[w], p, flags=FASTMATH) if w in by_width else p
    total = const(F32, 0.0)
    for w in sorted(by_width, reverse=True):
        total = b.fadd(total, SUM.horizontal(ctx, by_width[w]), flags=FASTMATH)
    return total


def fmadd(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    """`x·y + z` (contractible to one fma)."""
    return b.fadd(b.fmul(x, y, flags=FASTMATH), z, flags=FASTMATH)


def split_rows(ctx: EmitContext, rows: int, work_per_row: int, body: Callable[[EmitContext, ir.Value], None]) -> None:
    """`body(ctx, row)` for every row, rows split across threads when there is enough work."""
    def chunk(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="row") as row:
            body(sub, row)
    ctx.parallel_for(rows, chunk, grain=1, min_work=max(1, -(-PAR_WORK // max(1, work_per_row))))


# ── Mamba2: rows of the state in registers ───────────────────────────────────

class Row(NamedTuple):
    """What one state row reads at one time step: the decay of its strip `(first, width)`, its input
    weight `u` (dt·x), where its y_t goes."""

    decay: Callable[[int, int], ir.Value]
    u: ir.Value
    y_at: Index


def group_size(n: int, lanes: int) -> int:
    """Rows stepped together: up to 8 (neighbouring rows share the cache lines of x and y),
    with at most one register file's worth of state vectors between them (16 on AVX2, 32 with AVX-512)."""
    return max(1, min(8, vector_registers(lanes) // max(1, len(strips(0, n, lanes)))))


def diagonal_scan(ctx: EmitContext, t: T.Mamba2, n: int,
                  step: Callable[[ir.Value], tuple[Index, list[Row]]], rows: int) -> None:
    """`rows` rows at once: `h ← decay ⊙ h + u·B_t`, `y_t = Σ C_t ⊙ h` for t < seq, every h in registers
    from 0; `step(t)` gives where B_t / C_t start (shared by the rows) and each row's `Row`."""
    b = ctx.b
    parts = strips(0, n, ctx.lanes)

    def advance(tt: ir.Value, h: list[ir.Value]) -> list[ir.Value]:
        bc_at, each = step(tt)
        bs = [ctx.load(t.b, F32, iadd(b, bc_at, i), w) for i, w in parts]
        cs = [ctx.load(t.c, F32, iadd(b, bc_at, i), w) for i, w in parts]
        new, ys = [], []
        for r, row in enumerate(each):
            terms = []
            for k, (i, w) in enumerate(parts):
                drive = b.fmul(splat(b, row.u, w), bs[k], flags=FASTMATH)
                hv = fmadd(b, row.decay(i, w), h[r * len(parts) + k], drive)
                new.append(hv)
                terms.append(b.fmul(cs[k], hv, flags=FASTMATH))
            ys.append(lane_sum(ctx, terms))
        for row, y in zip(each, ys):
            ctx.store(t.dst, y, row.y_at)
        return new

    carried_loop(ctx, 0, t.seq, 1, [const(F32, 0.0, w) for _ in range(rows) for _, w in parts], advance, name="t")


def grouped_rows(ctx: EmitContext, outer: int, inner: int, group: int, work_per_row: int,
                 body: Callable[[EmitContext, ir.Value, ir.Value, int], None]) -> None:
    """`body(ctx, o, first, size)` over groups of `size` neighbouring rows `first…` of each `o < outer`
    (`inner` rows each): whole groups of `group`, then the rows left over one by one; across threads."""
    full = inner // group
    for size, count, base in ((group, full, 0), (1, inner - full * group, full * group)):
        if count:
            def run(sub: EmitContext, r: ir.Value, size: int = size, count: int = count, base: int = base) -> None:
                b = sub.b
                first = b.add(I64(base), b.mul(b.urem(r, I64(count)), I64(size)))
                body(sub, b.udiv(r, I64(count)), first, size)
            split_rows(ctx, outer * count, work_per_row * size, run)


# ── SelectiveScan: lanes are channels ──────────────────────────────────────────

# 2^f on [−½, ½] with f(0) = 1 exactly (a minimax fit of degree 5,
# relative error 1.6e-7 in f32 Horner; docs/lowering-ssm.md).
EXP2_P = (1.0, 0.6931470036506653, 0.24022242426872253, 0.05550733581185341, 0.009671512991189957,
          0.001326472731307149)
ROUNDER = 1.5 * 2.0 ** 23  # t + ROUNDER rounds t to an integer held in the low mantissa bits (|t| < 2^22)
SAFE_T = 125.0             # |t| ≤ 125: 2^t as p's exponent bits + n is a normal number, no clamps needed
Y_CHAINS = 2               # independent partial sums of y_t (half the fma chain)
PREFETCH_STEPS = 8         # steps ahead whose x, Δ, y lines are requested (each step is a new page)


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


class ChannelBlock:
    """Channels `first + o … + w` of each part `(o, w)` of one batch through every step, one channel per
    lane: state i of the channels is one vector, so `h_i ← 2^(Δ·A₂[:, i])·h_i + (Δ·x)·B_i` and
    `y += C_i·h_i` are vertical (B_i, C_i broadcast; A₂ = A·log₂e gathered once per block)."""

    def __init__(self, ctx: EmitContext, t: T.SelectiveScan, batch: ir.Value, first: Index,
                 parts: list[tuple[int, int]]) -> None:
        b = ctx.b
        self.ctx, self.t, self.batch, self.first, self.parts = ctx, t, batch, first, parts
        self.a2 = [[b.fmul(a, splat_like(a, 1.0 / math.log(2.0))) for a in self.gather_a(o, w)] for o, w in parts]
        self.a_max = [self.largest(part) for part in self.a2]

    def gather_a(self, o: int, w: int) -> list[ir.Value]:
        """A[c, i] of the part's channels c, as one vector per state i."""
        b, n = self.ctx.b, self.t.state_size
        rows = [imul(b, iadd(b, self.first, o + lane), n) for lane in range(w)]
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

    def run(self) -> None:
        """Every step, the state in registers (spilled to L1 beyond the register file)."""
        t = self.t
        carried_loop(self.ctx, 0, t.seq, 1, [const(F32, 0.0, w) for _, w in self.parts for _ in range(t.state_size)],
                     self.advance, name="t")

    def advance(self, tt: ir.Value, h: list[ir.Value]) -> list[ir.Value]:
        """Step `tt`: the fast path when every |Δ·A₂| ≤ SAFE_T, else the checked one."""
        ctx, b, t = self.ctx, self.ctx.b, self.t
        step = b.add(b.mul(self.batch, I64(t.seq)), tt)
        at = iadd(b, b.mul(step, I64(t.hidden)), self.first)
        self.prefetch(tt)
        deltas = [ctx.load(t.delta, F32, iadd(b, at, o), w) for o, w in self.parts]
        safe = [b.fcmp_ordered("<=", b.fmul(fabs(b, d), m), splat_like(d, SAFE_T)) for d, m in zip(deltas, self.a_max)]
        fast = all_true(b, safe)
        with b.if_else(fast) as (then, otherwise):
            with then:
                quick, quick_block = self.update(step, at, deltas, h, checked=False), b.block
            with otherwise:
                slow, slow_block = self.update(step, at, deltas, h, checked=True), b.block
        out = []
        for x, y in zip(quick, slow):
            phi = b.phi(x.type)
            phi.add_incoming(x, quick_block)
            phi.add_incoming(y, slow_block)
            out.append(phi)
        return out

    def update(self, step: ir.Value, at: ir.Value, deltas: list[ir.Value], h: list[ir.Value], checked: bool
               ) -> list[ir.Value]:
        """The new states of every part, their y_t stored."""
        ctx, b, t, n = self.ctx, self.ctx.b, self.t, self.t.state_size
        bc = b.mul(step, I64(n))
        new = []
        for k, ((o, w), delta) in enumerate(zip(self.parts, deltas)):
            u = b.fmul(delta, ctx.load(t.x, F32, iadd(b, at, o), w), flags=FASTMATH)
            decays = [exp2_decay(b, delta, a, checked) for a in self.a2[k]]
            ys = [const(F32, 0.0, w)] * Y_CHAINS
            for i, decay in enumerate(decays):
                drive = b.fmul(u, splat(b, ctx.load(t.b, F32, iadd(b, bc, i)), w), flags=FASTMATH)
                state = fmadd(b, decay, h[k * n + i], drive)
                ys[i % Y_CHAINS] = fmadd(b, splat(b, ctx.load(t.c, F32, iadd(b, bc, i)), w), state, ys[i % Y_CHAINS])
                new.append(state)
            ctx.store(t.dst, tree_sum(b, ys), iadd(b, at, o))
        return new

    def prefetch(self, tt: ir.Value) -> None:
        """Request x, Δ and y of step `tt + PREFETCH_STEPS` (the last step near the end)."""
        b, t = self.ctx.b, self.t
        ahead = b.add(tt, I64(PREFETCH_STEPS))
        ahead = b.select(b.icmp_signed("<", ahead, I64(t.seq)), ahead, I64(t.seq - 1))
        at = iadd(b, b.mul(b.add(b.mul(self.batch, I64(t.seq)), ahead), I64(t.hidden)), self.first)
        for slot in (t.x, t.delta, t.dst):
            prefetch(self.ctx, slot, at, 4)


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


@lowering(T.SelectiveScan, check=check_state_size)
def selective_scan(ctx: EmitContext, t: T.SelectiveScan) -> None:
    """Blocks of `block_vectors` channel vectors per batch (split across threads), then the channels left
    over in halving power-of-two strips."""
    n, d, w = t.state_size, t.hidden, ctx.lanes
    if not (t.seq and n and d):
        return
    block = block_vectors(n, w) * w
    blocks = d // block
    if blocks:
        def run(sub: EmitContext, r: ir.Value) -> None:
            b = sub.b
            ChannelBlock(sub, t, b.udiv(r, I64(blocks)), b.mul(b.urem(r, I64(blocks)), I64(block)),
                         [(o, w) for o in range(0, block, w)]).run()
        split_rows(ctx, t.batch * blocks, t.seq * n * block, run)
    tail = strips(blocks * block, d, w)
    if tail:
        with ctx.for_range(0, t.batch, name="batch") as batch:
            for first, width in tail:
                ChannelBlock(ctx, t, batch, first, [(0, width)]).run()


@lowering(T.Mamba2, check=check_state_size)
def mamba2(ctx: EmitContext, t: T.Mamba2) -> None:
    """Rows are the p of a (batch, head): decay `exp(dt·a[h])` (one scalar per step), `u = dt·x[p]`."""
    n, h, p = t.state_size, t.heads, t.head_dim

    def rows_of_head(sub: EmitContext, bh: ir.Value, first: ir.Value, size: int) -> None:
        b = sub.b
        batch, head = b.udiv(bh, I64(h)), b.urem(bh, I64(h))
        a = sub.load(t.a, F32, head)

        def step(tt: ir.Value) -> tuple[Index, list[Row]]:
            bsh = b.add(b.mul(b.add(b.mul(batch, I64(t.seq)), tt), I64(h)), head)
            dt = sub.load(t.dt, F32, bsh)
            decay = exp(b, b.fmul(dt, a, flags=FASTMATH))
            rows = []
            for g in range(size):
                at = b.add(b.mul(bsh, I64(p)), iadd(b, first, g))
                rows.append(Row(lambda i, w: splat(b, decay, w), b.fmul(dt, sub.load(t.x, F32, at), flags=FASTMATH),
                                at))
            return b.mul(bsh, I64(n)), rows

        diagonal_scan(sub, t, n, step, size)

    if t.seq:
        grouped_rows(ctx, t.batch * h, p, group_size(n, ctx.lanes), t.seq * n, rows_of_head)



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
