"""State-space scans as vector IR over the state: `SelectiveScan`, `Mamba2`, `GatedDeltaNet` and
`GatedDeltaNetBackward` (semantics.md §3.9; docs/lowering-ssm.md).

* **Diagonal scans** (`SelectiveScan`, `Mamba2`): every row of the state — a channel's `h[c, :]`, a
  head's `S[p, :]` — is an independent recurrence `h ← decay ⊙ h + u·B_t`, `y_t = Σ C_t ⊙ h`.  A row
  keeps its `n ≤ 128` state values in registers across the whole sequence (`strips`: vectors of
  `ctx.lanes`, then narrower power-of-two vectors for the tail).  Up to 8 neighbouring rows step
  together (sharing B_t, C_t and the cache lines and pages of x, Δ, y); groups split across threads.
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
from .toolkit import (F32, FASTMATH, I64, Index, carried_loop, const, copy_bytes, iadd, imul, splat, vector_registers,
                      zero_bytes)
from .vecmath import exp

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


# ── diagonal scans: SelectiveScan, Mamba2 ────────────────────────────────────

class Row(NamedTuple):
    """What one state row reads at one time step: the decay of its strip `(first, width)`, its input
    weight `u` (Δ·x), where its y_t goes."""

    decay: Callable[[int, int], ir.Value]
    u: ir.Value
    y_at: Index


def group_size(n: int, lanes: int) -> int:
    """Rows stepped together: up to 8 (neighbouring channels share the cache lines and pages of x, Δ, y),
    with at most one register file's worth of state vectors between them (16 on AVX2, 32 with AVX-512)."""
    return max(1, min(8, vector_registers(lanes) // max(1, len(strips(0, n, lanes)))))


def diagonal_scan(ctx: EmitContext, t: "T.SelectiveScan | T.Mamba2", n: int,
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


@lowering(T.SelectiveScan, check=check_state_size)
def selective_scan(ctx: EmitContext, t: T.SelectiveScan) -> None:
    """Rows are the channels of a batch: decay `exp(Δ·A[c, :])`, `u = Δ·x`, B/C shared by the channels."""
    n, d = t.state_size, t.hidden

    def channels(sub: EmitContext, batch: ir.Value, first: ir.Value, size: int) -> None:
        b = sub.b
        cs = [iadd(b, first, g) for g in range(size)]
        a = [{i: sub.load(t.a, F32, iadd(b, imul(b, c, n), i), w) for i, w in strips(0, n, sub.lanes)} for c in cs]

        def step(tt: ir.Value) -> tuple[Index, list[Row]]:
            bt = b.add(b.mul(batch, I64(t.seq)), tt)
            rows = []
            for c, ac in zip(cs, a):
                at = b.add(b.mul(bt, I64(d)), c)
                delta = sub.load(t.delta, F32, at)
                u = b.fmul(delta, sub.load(t.x, F32, at), flags=FASTMATH)
                rows.append(Row(lambda i, w, delta=delta, ac=ac: exp(b, b.fmul(splat(b, delta, w), ac[i],
                                                                                flags=FASTMATH)), u, at))
            return b.mul(bt, I64(n)), rows

        diagonal_scan(sub, t, n, step, size)

    if t.seq:
        grouped_rows(ctx, t.batch, d, group_size(n, ctx.lanes), t.seq * n, channels)


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
