"""Backward kernels of the norms as native code (semantics.md §3.3, §3.12).

* Row-norm input gradients (LayerNorm, RmsNorm): per row the forward's statistics (`norms.row_stats`,
  LayerNorm's one-pass variance), one pass for `mean(g)` and `mean(g·x̂)` (g = dy·γ, x̂ recomputed),
  then `dx = inv·(g − mean(g) − x̂·mean(g·x̂))` (RMS drops the `mean(g)` term).  Rows split across threads.
* Gamma/beta gradients reduce over rows: the row statistics go to scratch first (rows split across
  threads), then each W-column vector sums `dy·x̂` (or `dy`) down all rows in an f64 vector
  accumulator — column vectors split across threads, so no sum is ever split.
* GroupNorm backward: per (batch, group) block the forward's two-pass statistics; the block sums
  and dγ/dβ go channel by channel (vectors over H·W; dγ/dβ in f64, channels split across threads).
* AdaLayerNorm / GatedResidual backward (packed outputs): the row gradients split by rows (AdaLayerNorm's dx
  is `row_input_grad` with γ = 1 + scale[m + j] and the forward's two-pass statistics); the modulation /
  gate gradients are f64 sums into the `mod_len` / `gate_len` elements, which are split across threads,
  every thread walking all rows and adding the part of each row's slice that lands in its elements.
* BatchNormInference backward: per-channel α = γ/√(var + eps) (or inv) in scratch, then the rows;
  dγ/dβ are the same f64 column sums as the row norms'.
"""
from __future__ import annotations

from typing import Callable

from llvmlite import ir

from .. import thunks as T
from .context import EmitContext
from .toolkit import (F32, F64, FASTMATH, I64, Index, carried_loop, fconst, iadd, imul, splat, sqrt, vec,
                      zero_bytes)
from .norms import (Stats, check_ada_layer_norm, check_gated_residual, check_group_norm, normalized, row_loader,
                    row_stats)
from ..registry import lowering
from .rows import SUM, offset_table, parallel_rows, reduce_row, row_offset

Load = Callable[[Index, int], ir.Value]   # (element j of the row, lanes) → f32 values


def _f(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value) -> ir.Value:
    return getattr(b, op)(x, y, flags=FASTMATH)


# ── row-norm input gradients ────────────────────────────────────────────────

def row_input_grad(ctx: EmitContext, n: int, x: Load, dy: Load, gamma: Load, dx: Callable[[Index, ir.Value], None],
                   stats: Stats) -> None:
    """One row (or block) of `n`: `dx(j, inv·(g − mean(g) − x̂·mean(g·x̂)))`, g = dy·γ, x̂ from the forward's
    statistics (no `mean(g)` term for RMS)."""
    b = ctx.b
    count = ir.Constant(F32, float(n))
    mean, inv = row_stats(ctx, n, x, stats)

    def g(j: Index, w: int) -> ir.Value:
        return _f(b, "fmul", dy(j, w), gamma(j, w))

    def xh(j: Index, w: int) -> ir.Value:
        return normalized(ctx, x(j, w), mean, inv)
    if stats.center:
        sg, sgx = reduce_row(ctx, n, lambda j, w: (g(j, w), _f(b, "fmul", g(j, w), xh(j, w))), [SUM, SUM])
        mg = b.fdiv(sg, count)
    else:
        (sgx,) = reduce_row(ctx, n, lambda j, w: (_f(b, "fmul", g(j, w), xh(j, w)),), [SUM])
    mgx = b.fdiv(sgx, count)

    def out(j: Index, w: int) -> None:
        v = g(j, w)
        if stats.center:
            v = _f(b, "fsub", v, splat(b, mg, w))
        v = _f(b, "fsub", v, _f(b, "fmul", xh(j, w), splat(b, mgx, w)))
        dx(j, _f(b, "fmul", v, splat(b, inv, w)))
    ctx.vector_loop(n, out, name="dx")


def _input_grad(ctx: EmitContext, t, center: bool) -> None:
    """LayerNorm / RmsNorm input gradient, rows split across threads."""
    h = t.h

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="row") as r:
            b = sub.b
            base = imul(b, r, h)
            row_input_grad(sub, h, row_loader(sub, base, (t.x,)), row_loader(sub, base, (t.dy,)),
                           lambda j, w: sub.load(t.gamma, F32, j, w),
                           lambda j, v: sub.store(t.dx, v, iadd(b, base, j)), Stats(center, False, t.eps))
    if h:
        parallel_rows(ctx, t.rows, 16 * h, body)


@lowering(T.LayerNormBackwardInput, inplace=True)
def layer_norm_backward_input(ctx: EmitContext, t) -> None:
    """LayerNorm's input gradient; μ and the one-pass variance recomputed from `x`."""
    _input_grad(ctx, t, center=True)


@lowering(T.RmsNormBackwardInput, inplace=True)
def rms_norm_backward_input(ctx: EmitContext, t) -> None:
    """RmsNorm's input gradient `inv·(g − x̂·mean(g·x̂))` (β does not enter)."""
    _input_grad(ctx, t, center=False)


# ── gamma / beta: sums down the rows ────────────────────────────────────────

Term = Callable[[EmitContext, ir.Value, Index, int], ir.Value]   # (ctx, row, column, lanes) → f32


def _row_stats_to_scratch(ctx: EmitContext, t, center: bool, two_pass: bool = False) -> int:
    """Scratch offset of `(μ, inv)` per row (μ = 0 for RMS), computed with the forward's statistics."""
    table = ctx.scratch_alloc(8 * t.rows)
    stats = Stats(center, two_pass, t.eps)

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="row") as r:
            b = sub.b
            mean, inv = row_stats(sub, t.h, row_loader(sub, imul(b, r, t.h), (t.x,)), stats)
            at = imul(b, r, 2)
            sub.store(table, ir.Constant(F32, 0.0) if mean is None else mean, at, base=sub.shared)
            sub.store(table, inv, iadd(b, at, 1), base=sub.shared)
    parallel_rows(ctx, t.rows, 4 * t.h, body)
    return table


def _column_sums(ctx: EmitContext, rows: int, h: int, out: int, term: Term) -> None:
    """`out[j] = Σ_r term(r, j)`: per W-column vector, an f64 sum down the rows, rounded to f32 once."""
    w = ctx.lanes

    def column(sub: EmitContext, j: Index, lanes: int) -> None:
        b = sub.b
        zero = fconst(vec(F64, lanes), 0.0)
        (acc,) = carried_loop(sub, 0, rows, 1, [zero],
                              lambda r, a: [b.fadd(a[0], b.fpext(term(sub, r, j, lanes), vec(F64, lanes)))],
                              name="down")
        sub.store(out, b.fptrunc(acc, vec(F32, lanes)), j)

    def vectors(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="colvec") as u:
            column(sub, imul(sub.b, u, w), w)
    parallel_rows(ctx, h // w, 8 * w * rows, vectors)
    with ctx.for_range(h - h % w, h, name="col.tail") as j:
        column(ctx, j, 1)


def _stat(ctx: EmitContext, table: int, r: ir.Value, k: int) -> ir.Value:
    """μ (k = 0) or inv (k = 1) of row `r`."""
    return ctx.load(table, F32, iadd(ctx.b, imul(ctx.b, r, 2), k), base=ctx.shared)


def _gamma_grad(ctx: EmitContext, t, center: bool) -> None:
    """`dγ[j] = Σ_rows dy·x̂` with x̂ = (x − μ)·inv from the forward's statistics."""
    if not t.h:
        return
    table = _row_stats_to_scratch(ctx, t, center)

    def term(sub: EmitContext, r: ir.Value, j: Index, lanes: int) -> ir.Value:
        b = sub.b
        at = iadd(b, imul(b, r, t.h), j)
        mean = _stat(sub, table, r, 0) if center else None
        xh = normalized(sub, sub.load(t.x, F32, at, lanes), mean, _stat(sub, table, r, 1))
        return _f(b, "fmul", sub.load(t.dy, F32, at, lanes), xh)
    _column_sums(ctx, t.rows, t.h, t.dgamma, term)


@lowering(T.LayerNormBackwardGamma)
def layer_norm_backward_gamma(ctx: EmitContext, t) -> None:
    """`dγ[j] = Σ_rows dy·x̂` (f64 sums; zeros when there are no rows)."""
    _gamma_grad(ctx, t, center=True)


@lowering(T.RmsNormBackwardGamma)
def rms_norm_backward_gamma(ctx: EmitContext, t) -> None:
    """`dγ[j] = Σ_rows dy·x·inv` (f64 sums)."""
    _gamma_grad(ctx, t, center=False)


@lowering(T.RmsNormBackwardBeta)
def rms_norm_backward_beta(ctx: EmitContext, t) -> None:
    """`dβ[j] = Σ_rows dy` (f64 sums)."""
    if t.h:
        _column_sums(ctx, t.rows, t.h, t.dbeta,
                     lambda sub, r, j, lanes: sub.load(t.dy, F32, iadd(sub.b, imul(sub.b, r, t.h), j), lanes))


# ── BatchNormInference backward ([count, channels], statistics are inputs) ──

def _channel_table(ctx: EmitContext, channels: int, value: Callable[[Index, int], ir.Value]) -> int:
    """Scratch offset of `value(c)` for every channel, computed once before the rows."""
    table = ctx.scratch_alloc(4 * channels)
    ctx.vector_loop(channels, lambda c, w: ctx.store(table, value(c, w), c, base=ctx.scratch), name="chan")
    return table


def _inv_std(ctx: EmitContext, t) -> Callable[[Index, int], ir.Value]:
    """`c ↦ 1/√(var[c] + eps)` (IEEE sqrt and divide)."""
    def inv(c: Index, w: int) -> ir.Value:
        b = ctx.b
        v = b.fadd(ctx.load(t.var, F32, c, w), splat(b, ir.Constant(F32, t.eps), w))
        return b.fdiv(splat(b, ir.Constant(F32, 1.0), w), sqrt(ctx, v))
    return inv


@lowering(T.BatchNormInferenceBackwardInput, inplace=True)
def batch_norm_inference_backward_input(ctx: EmitContext, t) -> None:
    """`dx[i, c] = α[c]·dy[i, c]`, α = γ/√(var + eps) precomputed per channel (PyTorch's eval-mode form)."""
    ch = t.channels
    if not (t.count and ch):
        return
    inv = _inv_std(ctx, t)
    alpha = _channel_table(ctx, ch, lambda c, w: ctx.b.fmul(ctx.load(t.gamma, F32, c, w), inv(c, w)))

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="row") as r:
            b = sub.b
            base = imul(b, r, ch)
            sub.vector_loop(ch, lambda c, w: sub.store(t.dx, b.fmul(sub.load(alpha, F32, c, w, base=sub.shared),
                                                                     sub.load(t.dy, F32, iadd(b, base, c), w)),
                                                        iadd(b, base, c)), name="dx")
    parallel_rows(ctx, t.count, 8 * ch, body)


@lowering(T.BatchNormInferenceBackwardGamma)
def batch_norm_inference_backward_gamma(ctx: EmitContext, t) -> None:
    """`dγ[c] = Σ_i dy·(x − mean[c])·inv[c]` (f64 sums down the rows)."""
    if not t.channels:
        return
    inv = _channel_table(ctx, t.channels, _inv_std(ctx, t))

    def term(sub: EmitContext, r: ir.Value, j: Index, lanes: int) -> ir.Value:
        b = sub.b
        at = iadd(b, imul(b, r, t.channels), j)
        xh = _f(b, "fmul", _f(b, "fsub", sub.load(t.x, F32, at, lanes), sub.load(t.mean, F32, j, lanes)),
                sub.load(inv, F32, j, lanes, base=sub.shared))
        return _f(b, "fmul", sub.load(t.dy, F32, at, lanes), xh)
    _column_sums(ctx, t.count, t.channels, t.dgamma, term)


@lowering(T.BatchNormInferenceBackwardBeta)
def batch_norm_inference_backward_beta(ctx: EmitContext, t) -> None:
    """`dβ[c] = Σ_i dy[i, c]` (f64 sums down the rows)."""
    if t.channels:
        _column_sums(ctx, t.count, t.channels, t.dbeta,
                     lambda sub, r, j, lanes: sub.load(t.dy, F32, iadd(sub.b, imul(sub.b, r, t.channels), j), lanes))


# ── GroupNorm backward (NCHW; per (batch, group) a contiguous block of (C/G)·H·W) ──

def _group_geometry(t) -> tuple[int, int, int]:
    """(H·W, channels per group, block size)."""
    hw, cpg = t.h * t.w, t.c // t.num_groups
    return hw, cpg, cpg * hw


@lowering(T.GroupNormBackwardInput, check=check_group_norm, inplace=True)
def group_norm_backward_input(ctx: EmitContext, t) -> None:
    """Per (batch, group) block: the forward's two-pass μ, inv, then `dx = inv·(g − mean(g) − x̂·mean(g·x̂))`,
    g = dy·γ[c].  H·W = 1: the block is a row of channels (`row_input_grad` with γ[c0 + j])."""
    hw, cpg, size = _group_geometry(t)
    stats = Stats(True, True, t.eps)

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="group") as u:
            b = sub.b
            base = imul(b, u, size)
            c0 = imul(b, b.urem(u, I64(t.num_groups)), cpg)
            x, dy = row_loader(sub, base, (t.x,)), row_loader(sub, base, (t.dy,))
            if hw == 1:
                row_input_grad(sub, size, x, dy, lambda j, w: sub.load(t.gamma, F32, iadd(b, c0, j), w),
                               lambda j, v: sub.store(t.dx, v, iadd(b, base, j)), stats)
            else:
                _group_block_grad(sub, t, base, c0, x, dy, stats)
    if size:
        parallel_rows(ctx, t.n * t.num_groups, 12 * size, body)


def _group_block_grad(ctx: EmitContext, t, base: ir.Value, c0: ir.Value, x: Load, dy: Load, stats: Stats) -> None:
    """One block channel by channel (vectors over H·W): Σg = Σ_c γ[c]·Σ_hw dy, Σg·x̂ = Σ_c γ[c]·Σ_hw dy·x̂, then dx."""
    b = ctx.b
    hw, cpg, size = _group_geometry(t)
    count = ir.Constant(F32, float(size))
    mean, inv = row_stats(ctx, size, x, stats)

    def xh(k: Index, w: int) -> ir.Value:
        return normalized(ctx, x(k, w), mean, inv)

    def channel_sums(cc: ir.Value, acc: list) -> list:
        at, gc = imul(b, cc, hw), ctx.load(t.gamma, F32, iadd(b, c0, cc))
        s_dy, s_dyx = reduce_row(ctx, hw, lambda j, w: (dy(iadd(b, at, j), w), _f(
            b, "fmul", dy(iadd(b, at, j), w), xh(iadd(b, at, j), w))), [SUM, SUM])
        return [_f(b, "fadd", acc[0], _f(b, "fmul", gc, s_dy)), _f(b, "fadd", acc[1], _f(b, "fmul", gc, s_dyx))]
    zero = ir.Constant(F32, 0.0)
    sg, sgx = carried_loop(ctx, 0, cpg, 1, [zero, zero], channel_sums, name="chan.sum")
    mg, mgx = b.fdiv(sg, count), b.fdiv(sgx, count)
    with ctx.for_range(0, cpg, name="chan") as cc:
        at, gc = imul(b, cc, hw), ctx.load(t.gamma, F32, iadd(b, c0, cc))

        def out(j: Index, w: int) -> None:
            k = iadd(b, at, j)
            v = _f(b, "fsub", _f(b, "fmul", dy(k, w), splat(b, gc, w)), splat(b, mg, w))
            v = _f(b, "fsub", v, _f(b, "fmul", xh(k, w), splat(b, mgx, w)))
            ctx.store(t.dx, _f(b, "fmul", v, splat(b, inv, w)), iadd(b, base, k))
        ctx.vector_loop(hw, out, name="dx")


def _channel_sums_f64(ctx: EmitContext, t, out: int, term: Callable[[EmitContext, ir.Value, ir.Value, Index, int],
                                                                     ir.Value]) -> None:
    """`out[c] = Σ_n Σ_hw term(n, c, j)` in f64 (per-channel vector sums over H·W), channels split across threads."""
    hw = t.h * t.w

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="chan") as c:
            b = sub.b

            def batch(nn: ir.Value, acc: list) -> list:
                (s,) = reduce_row(sub, hw, lambda j, w: (b.fpext(term(sub, nn, c, j, w), vec(F64, w)),), [SUM],
                                  elem=F64)
                return [b.fadd(acc[0], s)]
            (total,) = carried_loop(sub, 0, t.n, 1, [ir.Constant(F64, 0.0)], batch, name="batch")
            sub.store(out, b.fptrunc(total, F32), c)
    parallel_rows(ctx, t.c, 8 * t.n * hw, body)


def _nchw(ctx: EmitContext, t, nn: ir.Value, c: ir.Value, j: Index) -> ir.Value:
    """Element index of `(nn, c, j)` in `[n, c, h·w]`."""
    b = ctx.b
    return iadd(b, imul(b, iadd(b, imul(b, nn, t.c), c), t.h * t.w), j)


@lowering(T.GroupNormBackwardGamma, check=check_group_norm)
def group_norm_backward_gamma(ctx: EmitContext, t) -> None:
    """`dγ[c] = Σ_{n, hw} dy·x̂`, x̂ from the forward's two-pass block statistics (kept in scratch)."""
    hw, cpg, size = _group_geometry(t)
    if not t.c:
        return
    units = t.n * t.num_groups
    table = ctx.scratch_alloc(8 * units)

    def stats(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="group") as u:
            b = sub.b
            mean, inv = row_stats(sub, size, row_loader(sub, imul(b, u, size), (t.x,)), Stats(True, True, t.eps))
            sub.store(table, mean, imul(b, u, 2), base=sub.shared)
            sub.store(table, inv, iadd(b, imul(b, u, 2), 1), base=sub.shared)
    if size:
        parallel_rows(ctx, units, 4 * size, stats)

    def term(sub: EmitContext, nn: ir.Value, c: ir.Value, j: Index, w: int) -> ir.Value:
        b = sub.b
        u = iadd(b, imul(b, nn, t.num_groups), b.udiv(c, I64(cpg)))
        k = _nchw(sub, t, nn, c, j)
        xh = normalized(sub, sub.load(t.x, F32, k, w), _stat(sub, table, u, 0), _stat(sub, table, u, 1))
        return _f(b, "fmul", sub.load(t.dy, F32, k, w), xh)
    _channel_sums_f64(ctx, t, t.dgamma, term)


@lowering(T.GroupNormBackwardBeta)
def group_norm_backward_beta(ctx: EmitContext, t) -> None:
    """`dβ[c] = Σ_{n, hw} dy` (f64 sums)."""
    if t.c:
        _channel_sums_f64(ctx, t, t.dbeta, lambda sub, nn, c, j, w: sub.load(t.dy, F32, _nchw(sub, t, nn, c, j), w))


# ── AdaLayerNorm / GatedResidual backward (per-row broadcast offsets, packed outputs) ──

OffsetTerms = Callable[[EmitContext, ir.Value, ir.Value, int], tuple]   # (ctx, row, j, lanes) → f32 values


def _smin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def _smax(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed(">", x, y), x, y)


def _range_loop(ctx: EmitContext, start: ir.Value, stop: ir.Value, body: Callable[[ir.Value, int], None],
                name: str = "k") -> None:
    """`body(k, W)` in W-steps over the run-time range `[start, stop)`, then `body(k, 1)` over the rest
    (nothing when `stop ≤ start`)."""
    b, w = ctx.b, ctx.lanes
    stop = _smax(b, start, stop)
    vec_stop = b.add(start, b.and_(b.sub(stop, start), I64(~(w - 1))))   # W is a power of two
    with ctx.for_range(start, vec_stop, w, name=f"{name}.vec") as k:
        body(k, w)
    with ctx.for_range(vec_stop, stop, 1, name=f"{name}.tail") as k:
        body(k, 1)


def _offset_sums(ctx: EmitContext, rows: int, h: int, offs, table, length: int, outs: tuple[int, ...],
                 terms: OffsetTerms) -> None:
    """`outs[i][k] = Σ_{(r, j): offs[r] + j = k} terms(r, j)[i]` for every `k < length` (0 where no row lands).

    f64 accumulators in scratch, rounded to f32 once.  The `length` elements (in W-blocks) are split
    across threads; each thread walks all rows in order and adds the part of row r's slice
    `[offs[r], offs[r] + h)` inside its own elements — no element is shared, rows add up in row order
    whatever the thread count."""
    if not length:
        return
    w, n = ctx.lanes, len(outs)
    acc = ctx.scratch_alloc(8 * n * length)
    units = -(-length // w)

    def slot(i: int) -> int:
        return acc + 8 * length * i

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        k0, k1 = b.mul(start, I64(w)), _smin(b, b.mul(stop, I64(w)), I64(length))

        def zero(k: ir.Value, lanes: int) -> None:
            for i in range(n):
                sub.store(slot(i), fconst(vec(F64, lanes), 0.0), k, base=sub.shared)
        _range_loop(sub, k0, k1, zero, name="zero")
        with sub.for_range(0, rows, name="row") as r:
            m = row_offset(sub, offs, r, table)

            def add(k: ir.Value, lanes: int) -> None:
                vals = terms(sub, r, b.sub(k, m), lanes)
                for i, v in enumerate(vals):
                    a = sub.load(slot(i), F64, k, lanes, base=sub.shared)
                    sub.store(slot(i), b.fadd(a, b.fpext(v, vec(F64, lanes))), k, base=sub.shared)
            _range_loop(sub, _smax(b, k0, m), _smin(b, k1, b.add(m, I64(h))), add, name="slice")

        def out(k: ir.Value, lanes: int) -> None:
            for i in range(n):
                sub.store(outs[i], b.fptrunc(sub.load(slot(i), F64, k, lanes, base=sub.shared), vec(F32, lanes)), k)
        _range_loop(sub, k0, k1, out, name="out")
    parallel_rows(ctx, units, max(1, (4 * (n + 1) * rows * h + 12 * n * length) // units), body)


@lowering(T.AdaLayerNormBackward, check=check_ada_layer_norm)
def ada_layer_norm_backward(ctx: EmitContext, t) -> None:
    """Packed `[dx ‖ dscale ‖ dshift]`: `dx = inv·(g − mean(g) − ŷ·mean(g·ŷ))`, g = dy·(1 + scale[m + j]), ŷ and
    inv from the forward's two-pass LayerNorm (or RMS, no `mean(g)`) statistics; `dscale[k] = Σ dy·ŷ`,
    `dshift[k] = Σ dy` over the (row, j) with `mod_off[row] + j = k` (f64 sums, zeros where no row lands)."""
    rows, h, n = t.rows, t.h, t.rows * t.h
    ds, dt = t.dst + 4 * n, t.dst + 4 * (n + t.mod_len)
    if not n:
        zero_bytes(ctx, ctx.addr(ds), 8 * t.mod_len)
        return
    table = offset_table(ctx, t.mod_off, "mod_off")
    stats = Stats(t.layer_norm, True, t.eps)
    one = ir.Constant(F32, 1.0)

    def grad_rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="row") as r:
            b = sub.b
            base, m = imul(b, r, h), row_offset(sub, t.mod_off, r, table)
            row_input_grad(sub, h, row_loader(sub, base, (t.x,)), row_loader(sub, base, (t.dy,)),
                           lambda j, w: _f(b, "fadd", splat(b, one, w), sub.load(t.scale, F32, iadd(b, m, j), w)),
                           lambda j, v: sub.store(t.dst, v, iadd(b, base, j)), stats)
    parallel_rows(ctx, rows, 16 * h, grad_rows)
    moments = _row_stats_to_scratch(ctx, t, t.layer_norm, two_pass=True)

    def terms(sub: EmitContext, r: ir.Value, j: ir.Value, w: int) -> tuple:
        b = sub.b
        at = iadd(b, imul(b, r, h), j)
        mean = _stat(sub, moments, r, 0) if t.layer_norm else None
        dy = sub.load(t.dy, F32, at, w)
        return _f(b, "fmul", dy, normalized(sub, sub.load(t.x, F32, at, w), mean, _stat(sub, moments, r, 1))), dy
    _offset_sums(ctx, rows, h, t.mod_off, table, t.mod_len, (ds, dt), terms)


@lowering(T.GatedResidualBackward, check=check_gated_residual)
def gated_residual_backward(ctx: EmitContext, t) -> None:
    """Packed `[dx ‖ dy ‖ dgate]`: `dx = dy`, `d(y) = dy·gate[m + j]`, `dgate[k] = Σ dy·y` over the (row, j) with
    `gate_off[row] + j = k` (f64 sums, zeros where no row lands); `x` is not read."""
    rows, h, n = t.rows, t.h, t.rows * t.h
    dg = t.dst + 8 * n
    if not n:
        zero_bytes(ctx, ctx.addr(dg), 4 * t.gate_len)
        return
    table = offset_table(ctx, t.gate_off, "gate_off")

    def grad_rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="row") as r:
            b = sub.b
            base, m = imul(b, r, h), row_offset(sub, t.gate_off, r, table)

            def step(j: Index, w: int) -> None:
                at = iadd(b, base, j)
                dy = sub.load(t.dy, F32, at, w)
                sub.store(t.dst, dy, at)
                sub.store(t.dst + 4 * n, _f(b, "fmul", dy, sub.load(t.gate, F32, iadd(b, m, j), w)), at)
            sub.vector_loop(h, step, name="dxy")
    parallel_rows(ctx, rows, 16 * h, grad_rows)

    def terms(sub: EmitContext, r: ir.Value, j: ir.Value, w: int) -> tuple:
        b = sub.b
        at = iadd(b, imul(b, r, h), j)
        return (_f(b, "fmul", sub.load(t.dy, F32, at, w), sub.load(t.y, F32, at, w)),)
    _offset_sums(ctx, rows, h, t.gate_off, table, t.gate_len, (dg,), terms)
