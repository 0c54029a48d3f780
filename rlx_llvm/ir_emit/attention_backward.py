"""AttentionBackward and AttentionBackwardAll as native code (semantics.md §3.4;
docs/lowering-attention-backward.md).

One work unit per (batch, head), split across rlx_llvm's threads; a unit owns its rows of dK and dV,
so they accumulate without races.  Per unit, Kᵀ (and Vᵀ when dP is needed) go to scratch once; then
per block of query rows (scratch `rows × kv_seq`, the forward's block size, so scratch stays
O(kv_seq·head_dim) however long the sequence):

    P  = softmax(mask(Q·Kᵀ/√D))            register tiles, then Attention's mask pass and row softmax
    dP = dY·Vᵀ                              register tiles
    dS = P ⊙ (dP − rowsum(P ⊙ dP))          one vector pass per row
    dV += Pᵀ·dY,  dK += dSᵀ·Q/√D,  dQ = dS·K/√D     register tiles (β = 1 for the sums over blocks)

The score, mask and softmax steps are the forward `Attention`'s own helpers on the equivalent
Attention thunk (`scale = 1/√head_dim`, no soft-cap, K/V heads = heads).
"""
from __future__ import annotations

from dataclasses import replace

from llvmlite import ir

from .. import thunks as T
from ..ops import AttentionBwdWrt
from ..reference.attention_backward import effective_mask, score_scale
from ..registry import lowering
from .attention import (BLOCK_BYTES, PARALLEL_MIN_FLOPS, _masks, _scratch_at, _softmax_row, _tiles,
                        _transpose_keys)
from .context import EmitContext
from .rows import SUM, reduce_row
from .toolkit import F32, FASTMATH, I64, const, iadd, imul, splat

GRADS = ("dq", "dk", "dv")


def as_attention(t) -> T.Attention:
    """The forward Attention whose gradients `t` asks for (its probabilities are recomputed)."""
    hd = t.heads * t.head_dim
    return T.Attention(q=t.q, k=t.k, v=t.v, mask=t.mask, out=0, batch=t.batch, seq=t.seq, kv_seq=t.kv_seq,
                       heads=t.heads, kv_heads=t.heads, head_dim=t.head_dim, v_head_dim=t.head_dim,
                       mask_kind=effective_mask(t), scale=score_scale(t), softcap=0.0, q_row_stride=hd,
                       k_row_stride=hd, v_row_stride=hd, bhsd=t.bhsd)


@lowering(T.AttentionBackward)
def attention_backward(ctx: EmitContext, t) -> None:
    """The one gradient `wrt` names."""
    name = {AttentionBwdWrt.Query: "dq", AttentionBwdWrt.Key: "dk", AttentionBwdWrt.Value: "dv"}[t.wrt]
    _gradients(ctx, t, {name: t.out})


@lowering(T.AttentionBackwardAll)
def attention_backward_all(ctx: EmitContext, t) -> None:
    """dQ, dK and dV from one recompute."""
    _gradients(ctx, t, dict(zip(GRADS, (t.out_q, t.out_k, t.out_v))))


def _gradients(ctx: EmitContext, t, outs: dict) -> None:
    """Write the gradients named in `outs` (name → arena offset)."""
    units, hd, seq, kv = t.batch * t.heads, t.head_dim, t.seq, t.kv_seq
    if not (units and hd):
        return
    if not (seq and kv):  # no scores: every gradient is 0
        for name, off in outs.items():
            n = t.q_elems if name == "dq" else t.kv_elems
            ctx.vector_loop(n, lambda i, w, off=off: ctx.store(off, const(F32, 0.0, w), i), name="zero")
        return
    per_unit = 2 * seq * kv * hd * (2 + 3 * len(outs)) + 10 * seq * kv
    body = lambda sub, s, e: _units(sub, t, as_attention(t), outs, s, e)
    if units >= 2 and units * per_unit >= 2 * PARALLEL_MIN_FLOPS:
        ctx.parallel_for(units, body, grain=1, min_work=max(1, -(-PARALLEL_MIN_FLOPS // per_unit)))
    else:
        body(ctx, I64(0), I64(units))


def _units(ctx: EmitContext, t, a: T.Attention, outs: dict, start: ir.Value, stop: ir.Value) -> None:
    """Units `[start, stop)`: (batch, head) pairs."""
    b = ctx.b
    hd, kv = t.head_dim, t.kv_seq
    need_ds = "dq" in outs or "dk" in outs
    qb = max(1, min(t.seq, BLOCK_BYTES // (4 * kv)))
    kt = ctx.scratch_alloc(4 * hd * kv)
    vt = ctx.scratch_alloc(4 * hd * kv) if need_ds else None
    p = ctx.scratch_alloc(4 * qb * kv)
    ds = ctx.scratch_alloc(4 * qb * kv) if need_ds else None
    step = hd if t.bhsd else t.heads * hd  # row step of Q/dY and of K/V (same head count)
    with ctx.for_range(start, stop, name="unit") as u:
        bi = b.udiv(u, I64(t.heads))
        if t.bhsd:
            q0, k0 = imul(b, imul(b, u, t.seq), hd), imul(b, imul(b, u, kv), hd)
        else:
            h = b.urem(u, I64(t.heads))
            q0 = iadd(b, imul(b, imul(b, bi, t.seq), step), imul(b, h, hd))
            k0 = iadd(b, imul(b, imul(b, bi, kv), step), imul(b, h, hd))
        _transpose_keys(ctx, a, kt, k0, step)
        if need_ds:
            _transpose_keys(ctx, _with_keys(a, t.v), vt, k0, step)
        for name in ("dk", "dv"):
            if name in outs:
                _zero_rows(ctx, outs[name], k0, step, kv, hd)
        unit = _Unit(ctx, t, a, outs, kt, vt, p, ds, bi, u, q0, k0, step)
        full, rest = t.seq // qb, t.seq % qb
        if full:
            with ctx.for_range(0, full, name="qblock") as blk:
                unit.block(imul(b, blk, qb), qb)
        if rest:
            unit.block(I64(full * qb), rest)


def _with_keys(a: T.Attention, off: int) -> T.Attention:
    """`a` reading its keys at `off` (to transpose V with the key transpose)."""
    return replace(a, k=off)


def _zero_rows(ctx: EmitContext, off: int, row0, step: int, rows: int, width: int) -> None:
    """Zero `rows` rows of `width` elements, `step` apart, from element `row0` of the slot at `off`."""
    b = ctx.b
    with ctx.for_range(0, rows, name="zrow") as j:
        at = iadd(b, row0, imul(b, j, step))
        ctx.vector_loop(width, lambda d, w: ctx.store(off, const(F32, 0.0, w), iadd(b, at, d)), name="zero")


class _Unit:
    """One (batch, head) unit's operands; `block(i0, rows)` does a block of query rows."""

    def __init__(self, ctx, t, a, outs, kt, vt, p, ds, bi, u, q0, k0, step) -> None:
        self.ctx, self.t, self.a, self.outs = ctx, t, a, outs
        self.kt, self.vt, self.p, self.ds = kt, vt, p, ds
        self.bi, self.u, self.q0, self.k0, self.step = bi, u, q0, k0, step

    def block(self, i0: ir.Value, rows: int) -> None:
        """Query rows `[i0, i0 + rows)`: P, then dS, then their products into the gradients."""
        ctx, t, a, outs, step = self.ctx, self.t, self.a, self.outs, self.step
        b = ctx.b
        kv, hd, scale = t.kv_seq, t.head_dim, a.scale
        pp = _scratch_at(ctx, self.p)
        qrow = iadd(b, self.q0, imul(b, i0, step))
        _tiles(ctx, rows, kv, hd, ctx.addr(t.q, qrow, 4), step, 1, _scratch_at(ctx, self.kt), kv, pp, kv, scale)
        with ctx.for_range(0, rows, name="prow") as r:
            row = ctx.addr(0, imul(b, r, kv), 4, base=pp)
            _masks(ctx, a, row, self.bi, self.u, iadd(b, i0, r))
            rinv = _softmax_row(ctx, kv, row)
            ctx.vector_loop(kv, lambda j, w: ctx.store(0, b.fmul(ctx.load(0, F32, j, w, base=row), splat(b, rinv, w),
                                                                 flags=FASTMATH), j, base=row), name="norm")
        dy = ctx.addr(t.dy, qrow, 4)
        if "dv" in outs:
            _tiles(ctx, kv, hd, rows, pp, 1, kv, dy, step, ctx.addr(outs["dv"], self.k0, 4), step, 1.0, beta=1.0)
        if self.ds is None:
            return
        dsp = _scratch_at(ctx, self.ds)
        _tiles(ctx, rows, kv, hd, dy, step, 1, _scratch_at(ctx, self.vt), kv, dsp, kv, 1.0)
        with ctx.for_range(0, rows, name="dsrow") as r:
            prow = ctx.addr(0, imul(b, r, kv), 4, base=pp)
            drow = ctx.addr(0, imul(b, r, kv), 4, base=dsp)
            pj = lambda j, w: ctx.load(0, F32, j, w, base=prow)
            dj = lambda j, w: ctx.load(0, F32, j, w, base=drow)
            (dot,) = reduce_row(ctx, kv, lambda j, w: (b.fmul(pj(j, w), dj(j, w), flags=FASTMATH),), [SUM])
            ctx.vector_loop(kv, lambda j, w: ctx.store(0, b.fmul(pj(j, w), b.fsub(dj(j, w), splat(b, dot, w)),
                                                                 flags=FASTMATH), j, base=drow), name="ds")
        if "dk" in outs:
            _tiles(ctx, kv, hd, rows, dsp, 1, kv, ctx.addr(t.q, qrow, 4), step, ctx.addr(outs["dk"], self.k0, 4),
                   step, scale, beta=1.0)
        if "dq" in outs:
            _tiles(ctx, rows, hd, kv, dsp, kv, 1, ctx.addr(t.k, self.k0, 4), step, ctx.addr(outs["dq"], qrow, 4),
                   step, scale)
