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

The register tiles are this module's `gemm`: every stride a compile-time constant, MR × 2 vectors
of C in SSA registers across k, emitted inline.  Under Causal/Sliding each block's products stop at
its last visible key (rounded up to whole tiles): the keys after it have P = 0 exactly.
The score, mask and softmax steps are the forward `Attention`'s own helpers on the equivalent
Attention thunk (`scale = 1/√head_dim`, no soft-cap, K/V heads = heads).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from llvmlite import ir

from .. import thunks as T
from ..ops import AttentionBwdWrt, MaskKind
from ..reference.attention_backward import effective_mask, score_scale
from ..registry import lowering
from .attention import (BLOCK_BYTES, CAUSAL_BLOCK, PARALLEL_MIN_FLOPS, _masks, _scratch_at, _softmax_row,
                        _transpose_keys, _visible_keys)
from .context import EmitContext
from .rows import SUM, reduce_row
from .toolkit import (F32, FASTMATH, I1, I8, I64, as_value, carried_loop, const, iadd, imul, lane_index, load_lanes,
                      splat, store_lanes, suffix, vector_registers)

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
    if a.mask_kind == MaskKind.Causal or isinstance(a.mask_kind, MaskKind.SlidingWindow):
        qb = min(qb, CAUSAL_BLOCK)  # finer blocks skip more of the invisible keys
    kt = ctx.scratch_alloc(4 * hd * kv)
    vt = ctx.scratch_alloc(4 * hd * kv) if need_ds else None
    p = ctx.scratch_alloc(4 * qb * score_stride(kv))
    ds = ctx.scratch_alloc(4 * qb * score_stride(kv)) if need_ds else None
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


def score_stride(kv: int) -> int:
    """Elements between rows of the P and dS scratch: `kv` rounded up to an odd number of 64-byte
    lines, so that the rows a tile reads (a power-of-two number of lines apart otherwise) spread
    over every L1 set instead of a few (≈ 6 % faster at kv_seq 128)."""
    lines = -(-kv // 16)
    return 16 * (lines + 1 - lines % 2)


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
        qrow = iadd(b, self.q0, imul(b, i0, step))
        q, dy = Mat(ctx.addr(t.q, qrow, 4), step), Mat(ctx.addr(t.dy, qrow, 4), step)
        p = Mat(_scratch_at(ctx, self.p), score_stride(kv))
        keys = _key_limit(ctx, a, i0, rows)
        gemm(ctx, rows, keys, hd, q, Mat(_scratch_at(ctx, self.kt), kv), p, scale)
        with ctx.for_range(0, rows, name="prow") as r:  # whole rows: Causal/Sliding overwrite the unscored keys
            row = p.at(b, r, 0)
            _masks(ctx, a, row, self.bi, self.u, iadd(b, i0, r))
            rinv = _softmax_row(ctx, kv, row)
            ctx.vector_loop(kv, lambda j, w: ctx.store(0, b.fmul(ctx.load(0, F32, j, w, base=row), splat(b, rinv, w),
                                                                 flags=FASTMATH), j, base=row), name="norm")
        if "dv" in outs:
            gemm(ctx, keys, hd, rows, p.T, dy, Mat(ctx.addr(outs["dv"], self.k0, 4), step), 1.0, beta=1.0)
        if self.ds is None:
            return
        ds = Mat(_scratch_at(ctx, self.ds), score_stride(kv))
        gemm(ctx, rows, keys, hd, dy, Mat(_scratch_at(ctx, self.vt), kv), ds, 1.0)
        with ctx.for_range(0, rows, name="dsrow") as r:
            _ds_row(ctx, kv, p.at(b, r, 0), ds.at(b, r, 0), keys)
        if "dk" in outs:
            gemm(ctx, keys, hd, rows, ds.T, q, Mat(ctx.addr(outs["dk"], self.k0, 4), step), scale, beta=1.0)
        if "dq" in outs:
            gemm(ctx, rows, hd, keys, ds, Mat(ctx.addr(t.k, self.k0, 4), step), Mat(ctx.addr(outs["dq"], qrow, 4), step),
                 scale)


def _key_limit(ctx: EmitContext, a: T.Attention, i0, rows: int) -> Dim:
    """The keys a block of query rows needs: all `kv_seq`, or under Causal/Sliding the visible ones
    rounded up to `key_granule` (the rest have P = 0 exactly and add nothing to any gradient)."""
    keys = _visible_keys(ctx, a, i0, rows)
    if keys is None:
        return a.kv_seq
    b, g = ctx.b, key_granule(ctx.lanes)
    up = b.mul(b.udiv(b.add(keys, I64(g - 1)), I64(g)), I64(g))
    return Upto(a.kv_seq, b.select(b.icmp_signed("<", up, I64(a.kv_seq)), up, I64(a.kv_seq)))


def _ds_row(ctx: EmitContext, kv: int, prow: ir.Value, drow: ir.Value, keys: Dim) -> None:
    """`dS = P ⊙ (dP − Σ P⊙dP)` in place of dP's row; only the first `keys` columns of dP were computed,
    so the sum leaves the others out (their P is 0, their dP stale) and their dS is never read."""
    b = ctx.b
    pj = lambda j, w: ctx.load(0, F32, j, w, base=prow)
    dj = lambda j, w: ctx.load(0, F32, j, w, base=drow)

    def term(j, w):
        x = b.fmul(pj(j, w), dj(j, w), flags=FASTMATH)
        if isinstance(keys, Upto):
            x = b.select(b.icmp_signed("<", lane_index(b, j, w), splat(b, keys.count, w)), x, const(F32, 0.0, w))
        return (x,)
    (dot,) = reduce_row(ctx, kv, term, [SUM])
    ctx.vector_loop(kv, lambda j, w: ctx.store(0, b.fmul(pj(j, w), b.fsub(dj(j, w), splat(b, dot, w)), flags=FASTMATH),
                                               j, base=drow), name="ds")


# ── register-tile GEMM with compile-time strides ────────────────────────────

@dataclass(frozen=True)
class Mat:
    """A strided f32 matrix: element (i, j) at `ptr + 4·(i·row + j·col)`."""

    ptr: ir.Value
    row: int
    col: int = 1

    @property
    def T(self) -> "Mat":
        """The transpose (the same elements, strides swapped)."""
        return Mat(self.ptr, self.col, self.row)

    def at(self, b: ir.IRBuilder, i, j) -> ir.Value:
        """Pointer to element (i, j)."""
        return b.gep(self.ptr, [as_value(iadd(b, imul(b, i, 4 * self.row), imul(b, j, 4 * self.col)))],
                     source_etype=I8, inbounds=True)


def tile_shape(lanes: int) -> tuple[int, int]:
    """(rows, vectors) of C held in registers: two vectors wide, and as many rows as the register file
    holds beside the two B vectors and a broadcast, cut to a multiple of 6 so that `key_granule` stays
    small — 6 × 2 with AVX2's 16 registers (granule 48), 12 × 2 with AVX-512's 32 (granule 96, not 224)."""
    nv = 2
    rows = (vector_registers(lanes) - nv - 2) // nv
    return rows - rows % 6, nv


@dataclass(frozen=True)
class Upto:
    """The first `count` (run time) of a dim of `total`: `count` is `total` or a multiple of the
    tile steps along it (`key_granule`), so only whole tiles are skipped."""

    total: int
    count: ir.Value


Dim = "int | Upto"


def gemm(ctx: EmitContext, m: Dim, n: Dim, k: Dim, a: Mat, bm: Mat, c: Mat, alpha: float, beta: float = 0.0) -> None:
    """`C[m, n] = α·A·B (+ C when β = 1)`: column panels of `NV·W`, each swept by row tiles of MR whose
    MR × NV accumulators stay in registers across k (B and C rows contiguous)."""
    mr, nv = tile_shape(ctx.lanes)
    kk = k.count if isinstance(k, Upto) else k
    _sweep(ctx, n, nv * ctx.lanes, "npanel", lambda col, width: _sweep(
        ctx, m, mr, "mtile", lambda row0, rows: _tile(ctx, row0, col, rows, width, kk, a, bm, c, alpha, beta)))


def _sweep(ctx: EmitContext, dim: Dim, step: int, name: str, body) -> None:
    """`body(start, size)` over tiles of `step` (the last one `dim % step`) covering `dim`."""
    b = ctx.b
    total, limit = (dim.total, dim.count) if isinstance(dim, Upto) else (dim, None)
    full, rest = total // step, total % step
    if full:
        count = I64(full) if limit is None else b.udiv(b.add(limit, I64(step - 1)), I64(step))
        if limit is not None:
            count = b.select(b.icmp_signed("<", count, I64(full)), count, I64(full))
        with ctx.for_range(0, count, name=name) as t:
            body(imul(b, t, step), step)
    if rest and limit is None:
        body(I64(full * step), rest)
    elif rest:
        with b.if_then(b.icmp_signed(">", limit, I64(full * step))):
            body(I64(full * step), rest)


def key_granule(lanes: int) -> int:
    """Key counts are limited in multiples of this: whole row tiles (dK, dV) and column panels (S, dP)."""
    mr, nv = tile_shape(lanes)
    return math.lcm(mr, nv * lanes)


def _tile(ctx: EmitContext, row0, col, rows: int, width: int, k, a: Mat, bm: Mat, c: Mat, alpha: float,
          beta: float) -> None:
    """C[row0 : row0+rows, col : col+width] from the k loop's register accumulators."""
    b = ctx.b
    w = ctx.lanes
    nv = -(-width // w)
    vty = ir.VectorType(F32, w)
    tail = width - (nv - 1) * w
    mask = None if tail == w else ir.Constant(ir.VectorType(I1, w), [ir.Constant(I1, int(i < tail)) for i in range(w)])
    fma = ctx.intrinsic(f"llvm.fma.{suffix(vty)}", vty, [vty, vty, vty])

    def vload(p, v):
        return load_lanes(ctx, 0, F32, 0, w, mask if v == nv - 1 else None, base=p)

    def step(p, acc):
        bv = [vload(bm.at(b, p, iadd(b, col, v * w)), v) for v in range(nv)]
        out = []
        for r in range(rows):
            x = splat(b, b.load(a.at(b, iadd(b, row0, r), p), typ=F32), w)
            out += [b.call(fma, [x, bv[v], acc[r * nv + v]]) for v in range(nv)]
        return out
    acc = carried_loop(ctx, 0, k, 1, [ir.Constant(vty, None)] * (rows * nv), step, name="kstep")
    va = splat(b, ir.Constant(F32, alpha), w)
    for r in range(rows):
        for v in range(nv):
            at = c.at(b, iadd(b, row0, r), iadd(b, col, v * w))
            x = b.fmul(acc[r * nv + v], va, flags=FASTMATH) if alpha != 1.0 else acc[r * nv + v]
            if beta:
                x = b.fadd(x, vload(at, v), flags=FASTMATH)
            store_lanes(ctx, 0, x, 0, mask if v == nv - 1 else None, base=at)
