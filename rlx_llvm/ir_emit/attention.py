"""Attention, rotary embeddings and SwiGLU as native code (semantics.md §2.7, §3.4;
docs/lowering-attention.md).

* `Attention` — one work unit per (batch, query head), split across rlx_llvm's threads when the
  thunk does enough arithmetic.  Per query row: the scaled dots `q·k_j` (a vector reduction over
  `head_dim` per key) go to a per-thread scratch row; one vector pass over that row applies the
  soft-cap (our vector tanh), the Custom overwrite, the Bias add and the Causal/Sliding overwrite
  (lane ids against the row's visible key range); the softmax is the row max, our vector exp
  (stored and summed) and `1/Σ`; the weighted sum `Σ_j p_j·v_j` keeps up to four output vectors
  in registers across the loop over keys.
* `Rope` — per row and head, NeoX halves as contiguous vectors; GPT-J pairs as `2w`-wide vectors
  with the half-width table duplicated and the pair swapped by shuffles.  `RopeBackward` is the same
  rotation by −θ (sin negated).
* `AxialRope2d` — each token's `cos/sin(x·f_c)`, `cos/sin(y·f_c)` are computed once (vector
  sin/cos) into scratch and applied to every head.
* `FusedSwiGLU` — `up · gate·σ(gate)` with our vector sigmoid.
"""
from __future__ import annotations

import math

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..ops import MaskKind
from ..thunks.attention import Rope
from . import vecmath as vm
from .context import EmitContext
from .toolkit import (F32, FASTMATH, I1, I32, I64, as_value, carried_loop, const, iadd, imul, lane_index, load_lanes,
                      splat, store_lanes, transpose_vectors, vec)
from ..registry import lowering
from .rows import SUM, exp_sum, parallel_rows, reduce_row, row_max

PARALLEL_MIN_FLOPS = 1 << 18   # ≈ 20-40 µs of attention work per thread before a fork pays off
OUT_VECTORS = 4                # output vectors of the weighted sum held in registers at once


def _mask_const(w: int, k: int) -> ir.Constant:
    """`<w x i1>` with the first `k` lanes on."""
    return ir.Constant(ir.VectorType(I1, w), [ir.Constant(I1, 1 if j < k else 0) for j in range(w)])


def _dot_width(ctx: EmitContext, n: int) -> tuple[int, int]:
    """(vector width, accumulators) for a reduction over `n` contiguous elements."""
    w = ctx.lanes
    while w > 1 and w > n:
        w //= 2
    return w, max(1, min(4, n // max(1, w)))


# ── Attention ───────────────────────────────────────────────────────────────

def check_attention(t) -> None:
    """Consistent heads, strides and mask kind."""
    if t.kv_heads == 0 and t.heads:
        raise ValidationError("kv_heads = 0 with heads > 0", field="kv_heads")
    if t.kv_heads and t.heads % t.kv_heads:
        raise ValidationError(f"heads = {t.heads} is not a multiple of kv_heads = {t.kv_heads}", field="kv_heads")
    if t.kv_heads > t.heads:
        raise ValidationError(f"kv_heads = {t.kv_heads} exceeds heads = {t.heads}", field="kv_heads")
    if not t.bhsd:
        for name, need in (("q_row_stride", t.heads * t.head_dim), ("k_row_stride", t.kv_heads * t.head_dim),
                           ("v_row_stride", t.kv_heads * t.v_head_dim)):
            if getattr(t, name) < need:
                raise ValidationError(f"{name} = {getattr(t, name)} is smaller than a row ({need} elements)",
                                      field=name)
    if not (t.softcap >= 0.0) or math.isinf(t.softcap):
        raise ValidationError(f"softcap = {t.softcap}; it must be ≥ 0 and finite (0 = off)", field="softcap")


@lowering(T.Attention, check=check_attention, shared_body=True)
def attention(ctx: EmitContext, t) -> None:
    """`out = softmax(mask(softcap(q·kᵀ·scale)))·v` per (batch, head, query row)."""
    units = t.batch * t.heads
    if not (units and t.seq and t.v_head_dim):
        return
    per_unit = 2 * t.seq * max(1, t.kv_seq) * (t.head_dim + t.v_head_dim) + 8 * t.seq * t.kv_seq
    group = t.heads // t.kv_heads
    if t.seq < TILE_MIN_SEQ and t.kv_seq and t.head_dim and 2 <= group <= MAX_GROUP:
        units, per_unit = t.batch * t.kv_heads, per_unit * group  # GQA decode: a unit is a KV head
        body = lambda sub, s, e: _attention_groups(sub, t, s, e)
    else:
        body = lambda sub, s, e: _attention_units(sub, t, s, e)
    if units >= 2 and units * per_unit >= 2 * PARALLEL_MIN_FLOPS:
        ctx.parallel_for(units, body, grain=1, min_work=max(1, -(-PARALLEL_MIN_FLOPS // per_unit)))
    else:
        body(ctx, I64(0), I64(units))


TILE_MIN_SEQ = 8          # query rows from which Q·Kᵀ and P·V run as register-tile GEMMs
BLOCK_BYTES = 256 << 10  # score block (query rows × kv_seq) of the tiled path, per thread
MAX_GROUP = 8             # GQA decode: query heads sharing one pass over their KV head's K and V
CAUSAL_BLOCK = 48         # query rows per block under Causal/Sliding masks


def _attention_units(ctx: EmitContext, t, start: ir.Value, stop: ir.Value) -> None:
    b = ctx.b
    group = t.heads // t.kv_heads
    hd, dv, kv = t.head_dim, t.v_head_dim, t.kv_seq
    tiled = kv > 0 and hd > 0 and t.seq >= TILE_MIN_SEQ
    if tiled:
        qb = max(1, min(t.seq, BLOCK_BYTES // (4 * kv)))
        if t.mask_kind == MaskKind.Causal or isinstance(t.mask_kind, MaskKind.SlidingWindow):
            qb = min(qb, CAUSAL_BLOCK)  # finer blocks skip more of the invisible keys
        kt = ctx.scratch_alloc(4 * hd * kv)
        scores = ctx.scratch_alloc(4 * qb * kv)
        rinvs = ctx.scratch_alloc(4 * qb)
    else:
        scores = ctx.scratch_alloc(4 * max(1, kv))
    with ctx.for_range(start, stop, name="unit") as u:
        bi = b.udiv(u, I64(t.heads))
        h = b.urem(u, I64(t.heads))
        kvh = b.udiv(h, I64(group)) if group > 1 else h
        if t.bhsd:
            q0, q_step = imul(b, imul(b, u, t.seq), hd), hd
            kv_unit = iadd(b, imul(b, bi, t.kv_heads), kvh)
            k_row0 = imul(b, imul(b, kv_unit, kv), hd)
            v_row0 = imul(b, imul(b, kv_unit, kv), dv)
            k_step, v_step = hd, dv
        else:
            q0 = iadd(b, imul(b, imul(b, bi, t.seq), t.q_row_stride), imul(b, h, hd))
            q_step = t.q_row_stride
            k_row0 = iadd(b, imul(b, imul(b, bi, kv), t.k_row_stride), imul(b, kvh, hd))
            v_row0 = iadd(b, imul(b, imul(b, bi, kv), t.v_row_stride), imul(b, kvh, dv))
            k_step, v_step = t.k_row_stride, t.v_row_stride
        out0, out_step = iadd(b, imul(b, imul(b, bi, t.seq), t.heads * dv), imul(b, h, dv)), t.heads * dv
        if tiled:
            _transpose_keys(ctx, t, kt, k_row0, k_step)
            full, rest = t.seq // qb, t.seq % qb
            if full:
                with ctx.for_range(0, full, name="qblock") as blk:
                    _query_block(ctx, t, imul(b, blk, qb), qb, kt, scores, rinvs, bi, u, q0, q_step, v_row0, v_step,
                                 out0, out_step)
            if rest:
                _query_block(ctx, t, full * qb, rest, kt, scores, rinvs, bi, u, q0, q_step, v_row0, v_step,
                             out0, out_step)
        else:
            with ctx.for_range(0, t.seq, name="qrow") as i:
                q_base = iadd(b, q0, imul(b, i, q_step))
                out_base = iadd(b, out0, imul(b, i, out_step))
                if kv == 0:  # nothing to attend to: zeros
                    ctx.vector_loop(dv, lambda d, w: ctx.store(t.out, const(F32, 0.0, w), iadd(b, out_base, d)),
                                    name="zero")
                else:
                    _scores(ctx, t, scores, q_base, k_row0, k_step)
                    _masks(ctx, t, scores, bi, u, i)
                    rinv = _softmax_row(ctx, kv, scores)
                    _weighted_sum(ctx, t, scores, rinv, v_row0, v_step, out_base)


def _transpose_keys(ctx: EmitContext, t, kt: int, k_row0, k_step: int) -> None:
    """`Kt[d, j] = K[j, d]` of this unit's KV head, into scratch (`[head_dim, kv_seq]`): W×W blocks
    of W key-row vectors transposed in registers (shuffles); the ragged edges by scalar loads."""
    b = ctx.b
    base = _scratch_at(ctx, kt)
    w, kv, hd = ctx.lanes, t.kv_seq, t.head_dim
    main, dmain = kv - kv % w, hd - hd % w
    key = lambda j, d: iadd(b, iadd(b, k_row0, imul(b, j, k_step)), d)
    if main and dmain:
        with ctx.for_range(0, main, w, name="ktj") as j0:
            with ctx.for_range(0, dmain, w, name="ktd") as d0:
                rows = [ctx.load(t.k, F32, key(iadd(b, j0, r), d0), w) for r in range(w)]
                for d, x in enumerate(transpose_vectors(b, rows)):
                    ctx.store(0, x, iadd(b, imul(b, iadd(b, d0, d), kv), j0), base=base)
    if main and hd > dmain:
        vty = ir.VectorType(F32, w)
        with ctx.for_range(0, main, w, name="ktj") as j0:
            with ctx.for_range(dmain, hd, name="ktdt") as d:
                x = ir.Constant(vty, None)
                for lane in range(w):
                    x = b.insert_element(x, ctx.load(t.k, F32, key(iadd(b, j0, lane), d)), I32(lane))
                ctx.store(0, x, iadd(b, imul(b, d, kv), j0), base=base)
    if kv > main:
        with ctx.for_range(main, kv, name="ktt") as j:
            with ctx.for_range(0, hd, name="ktdt") as d:
                ctx.store(0, ctx.load(t.k, F32, key(j, d)), iadd(b, imul(b, d, kv), j), base=base)


def _query_block(ctx: EmitContext, t, i0, rows: int, kt: int, scores: int, rinvs: int, bi, u, q0, q_step: int,
                 v_row0, v_step: int, out0, out_step: int) -> None:
    """Query rows `[i0, i0 + rows)`: `S = scale·Q·Kᵀ` (tiles), masks + softmax per row, `out = P·V` (tiles)."""
    b = ctx.b
    kv = t.kv_seq
    sbase = _scratch_at(ctx, scores)
    rbase = _scratch_at(ctx, rinvs)
    keys = _visible_keys(ctx, t, i0, rows)
    a = ctx.addr(t.q, iadd(b, q0, imul(b, i0, q_step)), 4)
    _tiles(ctx, rows, kv, t.head_dim, a, q_step, 1, _scratch_at(ctx, kt), kv, sbase, kv, t.scale, n_limit=keys)
    with ctx.for_range(0, rows, name="srow") as r:
        row = ctx.addr(0, imul(b, r, kv), 4, base=sbase)
        _masks(ctx, t, row, bi, u, iadd(b, i0, r))
        ctx.store(0, _softmax_row(ctx, kv, row), r, base=rbase)
    c = iadd(b, out0, imul(b, i0, out_step))
    _tiles(ctx, rows, t.v_head_dim, keys if keys is not None else kv, sbase, kv, 1, ctx.addr(t.v, v_row0, 4),
           v_step, ctx.addr(t.out, c, 4), out_step, 1.0)
    with ctx.for_range(0, rows, name="orow") as r:  # out = (Σ e·v)/Σe: scale dv outputs, not kv weights
        o = iadd(b, c, imul(b, r, out_step))
        rinv = ctx.load(0, F32, r, base=rbase)
        ctx.vector_loop(t.v_head_dim, lambda d, w: ctx.store(
            t.out, b.fmul(ctx.load(t.out, F32, iadd(b, o, d), w), splat(b, rinv, w), flags=FASTMATH),
            iadd(b, o, d)), name="norm")


def _visible_keys(ctx: EmitContext, t, i0, rows: int) -> "ir.Value | None":
    """For Causal/Sliding: how many leading keys any row of the block `[i0, i0 + rows)` can see
    (the rest have weight exactly 0, so their scores and products are skipped); all `kv_seq` when
    the block's first row is fully masked (it is uniform over every key).  None for other masks."""
    kind = t.mask_kind
    if not (kind == MaskKind.Causal or isinstance(kind, MaskKind.SlidingWindow)):
        return None
    b = ctx.b
    kv = I64(t.kv_seq)
    first = as_value(iadd(b, i0, t.kv_seq - t.seq))
    last1 = b.add(first, I64(rows))  # (absolute position of the last row) + 1
    lim = b.select(b.icmp_signed("<", last1, kv), last1, kv)
    return b.select(b.icmp_signed("<", first, I64(0)), kv, lim)


def _tiles(ctx: EmitContext, m: int, n: int, k: int, a: ir.Value, a_row: int, a_col: int, bm: ir.Value, ldb: int,
           c: ir.Value, ldc: int, alpha: float, n_limit: "ir.Value | None" = None, beta: float = 0.0) -> None:
    """`C[m, n] = α·A·B (+ β·C)` by gemm.py's register tiles: A strided (`a_row`, `a_col`), B and C
    row-major with leading dims `ldb`, `ldc` (pointers at element 0)."""
    from .gemm import ACCUMULATORS, TileShape, _maybe_loop, _runs, register_tile
    bld = ctx.b
    w = ctx.lanes
    pw = register_tile(w)[1] * w
    full, rest = n // pw, n % pw

    def panel(col, width: int) -> None:
        nv = -(-width // w)
        mr = max(1, min(m, ACCUMULATORS.get(w, 12) // nv))
        for r0, rows, count in _runs(m, mr):
            fn = TileShape(F32, w, rows, nv, beta != 0.0, ragged=width % w != 0).function(ctx)
            with _maybe_loop(ctx, count, "atile") as tr:
                row0 = iadd(bld, r0, imul(bld, tr, rows))
                bld.call(fn, [ctx.addr(0, imul(bld, row0, a_row), 4, base=a), ctx.addr(0, col, 4, base=bm),
                              ctx.addr(0, iadd(bld, imul(bld, row0, ldc), col), 4, base=c),
                              I64(a_row), I64(a_col), I64(ldb), I64(ldc), as_value(k), I64(width - (nv - 1) * w),
                              ir.Constant(F32, alpha), ir.Constant(F32, beta)])
    if n_limit is None:
        if full == 1:
            panel(0, pw)
        elif full:
            with ctx.for_range(0, full, name="apanel") as j:
                panel(imul(bld, j, pw), pw)
        if rest:
            panel(full * pw, rest)
        return
    # only the panels holding one of the first `n_limit` columns
    if full:
        need = bld.udiv(bld.add(n_limit, I64(pw - 1)), I64(pw))
        stop = bld.select(bld.icmp_signed("<", need, I64(full)), need, I64(full))
        with ctx.for_range(0, stop, name="apanel") as j:
            panel(imul(bld, j, pw), pw)
    if rest:
        with bld.if_then(bld.icmp_signed(">", n_limit, I64(full * pw))):
            panel(full * pw, rest)


def _scores(ctx: EmitContext, t, scores: int, q_base, k_row0, k_step: int) -> None:
    """`scores[j] = (q·k_j)·scale` for every key j."""
    b = ctx.b
    hd = t.head_dim
    w, accs = _dot_width(ctx, hd)
    scale = ir.Constant(F32, t.scale)
    with ctx.for_range(0, t.kv_seq, name="key") as j:
        k_base = iadd(b, k_row0, imul(b, j, k_step))
        if hd == 0:
            dot = ir.Constant(F32, 0.0)
        else:
            (dot,) = reduce_row(ctx, hd, lambda d, lw: (b.fmul(ctx.load(t.q, F32, iadd(b, q_base, d), lw),
                                                               ctx.load(t.k, F32, iadd(b, k_base, d), lw),
                                                               flags=FASTMATH),),
                                [SUM], accs=accs, width=w)
        ctx.store(0, b.fmul(dot, scale, flags=FASTMATH), j, base=_scratch_at(ctx, scores))


def _scratch_at(ctx: EmitContext, off: "int | ir.Value") -> ir.Value:
    """A scratch offset as a pointer (a pointer is returned unchanged)."""
    return off if isinstance(off, ir.Value) else ctx.addr(off, 0, 1, base=ctx.scratch)


def _masks(ctx: EmitContext, t, scores: int, bi, u, i) -> None:
    """One vector pass over the score row: soft-cap → Custom overwrite → Bias add → Causal/Sliding."""
    kind = t.mask_kind
    causal = kind == MaskKind.Causal
    sliding = isinstance(kind, MaskKind.SlidingWindow)
    custom, bias = kind == MaskKind.Custom, kind == MaskKind.Bias
    if not (t.softcap > 0 or causal or sliding or custom or bias):
        return
    b = ctx.b
    kv = t.kv_seq
    neg = float(ctx.schedule.mask_neg_inf)
    thr = float(ctx.schedule.mask_threshold)
    base = _scratch_at(ctx, scores)
    a = iadd(b, i, kv - t.seq)  # the query's absolute position (queries sit at the end of the keys)
    mask_row = imul(b, bi, kv)
    bias_row = imul(b, iadd(b, imul(b, u, t.seq), i), kv)  # ((b·heads + h)·seq + i)·kv_seq

    def body(j: ir.Value, w: int) -> None:
        s = ctx.load(0, F32, j, w, base=base)
        if t.softcap > 0:
            cap = const(F32, t.softcap, w)
            s = b.fmul(cap, vm.tanh(b, b.fdiv(s, cap)), flags=FASTMATH)
        negv = const(F32, neg, w)
        if custom:
            m = ctx.load(t.mask, F32, iadd(b, mask_row, j), w)
            s = b.select(b.fcmp_ordered("<", m, const(F32, thr, w)), negv, s)
        if bias:
            s = b.fadd(s, ctx.load(t.mask, F32, iadd(b, bias_row, j), w), flags=FASTMATH)
        if causal or sliding:
            jv = lane_index(b, j, w)
            av = splat(b, a, w)
            ok = b.icmp_signed("<=", jv, av)
            if sliding:
                ok = b.and_(ok, b.icmp_signed(">=", jv, b.sub(av, splat(b, I64(kind.w), w))))
            s = b.select(ok, s, negv)
        ctx.store(0, s, j, base=base)
    ctx.vector_loop(kv, body, name="mask")


def _softmax_row(ctx: EmitContext, n: int, scores: int) -> ir.Value:
    """Exponentials `e_j = exp(s_j − max)` in place; returns `1/Σe`."""
    b = ctx.b
    base = _scratch_at(ctx, scores)
    load = lambda j, w: ctx.load(0, F32, j, w, base=base)
    m = row_max(ctx, n, load)
    s = exp_sum(ctx, n, load, m, store=lambda j, e: ctx.store(0, e, j, base=base))
    return b.fdiv(ir.Constant(F32, 1.0), s)


def _weighted_sum(ctx: EmitContext, t, scores: int, rinv, v_row0, v_step: int, out_base) -> None:
    """`out[d] = rinv·Σ_j e_j·v_j[d]`, up to OUT_VECTORS output vectors in registers per sweep."""
    b = ctx.b
    w = ctx.lanes
    dv = t.v_head_dim
    base = _scratch_at(ctx, scores)
    chunk = OUT_VECTORS * w
    for c0 in range(0, dv, chunk):
        width = min(chunk, dv - c0)
        vw = w if width >= w else _pow2_at_least(width)
        nvec = -(-width // vw)
        masks = [None if (k + 1) * vw <= width else _mask_const(vw, width - k * vw) for k in range(nvec)]

        def step(j: ir.Value, accs: list) -> list:
            p = splat(b, ctx.load(0, F32, j, 1, base=base), vw)
            v_at = iadd(b, iadd(b, v_row0, imul(b, j, v_step)), c0)
            return [vm.fma(b, p, load_lanes(ctx, t.v, F32, iadd(b, v_at, k * vw), vw, masks[k]), accs[k])
                    for k in range(nvec)]
        accs = carried_loop(ctx, 0, t.kv_seq, 1, [const(F32, 0.0, vw) for _ in range(nvec)], step, name="pv")
        r = splat(b, rinv, vw)
        for k in range(nvec):
            store_lanes(ctx, t.out, b.fmul(accs[k], r, flags=FASTMATH), iadd(b, out_base, c0 + k * vw), masks[k])


def _attention_groups(ctx: EmitContext, t, start: ir.Value, stop: ir.Value) -> None:
    """GQA with few query rows: a unit is one (batch, KV head); each key and value row is loaded once
    for the `group` query heads that share it (scores and output accumulators for all of them)."""
    b = ctx.b
    g = t.heads // t.kv_heads
    hd, dv, kv = t.head_dim, t.v_head_dim, t.kv_seq
    scores = ctx.scratch_alloc(4 * g * kv)
    with ctx.for_range(start, stop, name="gunit") as gu:
        bi = b.udiv(gu, I64(t.kv_heads))
        kvh = b.urem(gu, I64(t.kv_heads))
        heads = [iadd(b, imul(b, kvh, g), r) for r in range(g)]
        units = [iadd(b, imul(b, bi, t.heads), h) for h in heads]
        if t.bhsd:
            k_row0, v_row0, k_step, v_step = imul(b, imul(b, gu, kv), hd), imul(b, imul(b, gu, kv), dv), hd, dv
        else:
            k_row0 = iadd(b, imul(b, imul(b, bi, kv), t.k_row_stride), imul(b, kvh, hd))
            v_row0 = iadd(b, imul(b, imul(b, bi, kv), t.v_row_stride), imul(b, kvh, dv))
            k_step, v_step = t.k_row_stride, t.v_row_stride
        with ctx.for_range(0, t.seq, name="qrow") as i:
            if t.bhsd:
                q_bases = [imul(b, iadd(b, imul(b, u, t.seq), i), hd) for u in units]
            else:
                row = imul(b, iadd(b, imul(b, bi, t.seq), i), t.q_row_stride)
                q_bases = [iadd(b, row, imul(b, h, hd)) for h in heads]
            orow = imul(b, iadd(b, imul(b, bi, t.seq), i), t.heads * dv)
            out_bases = [iadd(b, orow, imul(b, h, dv)) for h in heads]
            rows = [ctx.addr(scores, r * kv * 4, 1, base=ctx.scratch) for r in range(g)]
            _scores_group(ctx, t, rows, q_bases, k_row0, k_step)
            rinvs = []
            for r in range(g):
                _masks(ctx, t, rows[r], bi, units[r], i)
                rinvs.append(_softmax_row(ctx, kv, rows[r]))
            _weighted_sum_group(ctx, t, rows, rinvs, v_row0, v_step, out_bases)


def _scores_group(ctx: EmitContext, t, rows: list, q_bases: list, k_row0, k_step: int) -> None:
    """`rows[r][j] = (q_r·k_j)·scale`, each k_j loaded once for every query row r."""
    b = ctx.b
    hd, g = t.head_dim, len(rows)
    w, accs = _dot_width(ctx, hd)
    accs = max(1, min(accs, 16 // g))
    scale = ir.Constant(F32, t.scale)
    with ctx.for_range(0, t.kv_seq, name="key") as j:
        k_base = iadd(b, k_row0, imul(b, j, k_step))

        def terms(d, lw):
            kx = ctx.load(t.k, F32, iadd(b, k_base, d), lw)
            return tuple(b.fmul(ctx.load(t.q, F32, iadd(b, qb, d), lw), kx, flags=FASTMATH) for qb in q_bases)
        dots = reduce_row(ctx, hd, terms, [SUM] * g, accs=accs, width=w)
        for r in range(g):
            ctx.store(0, b.fmul(dots[r], scale, flags=FASTMATH), j, base=rows[r])


def _weighted_sum_group(ctx: EmitContext, t, rows: list, rinvs: list, v_row0, v_step: int, out_bases: list) -> None:
    """`out_r[d] = rinv_r·Σ_j e_rj·v_j[d]`, each v_j chunk loaded once for every row r."""
    b = ctx.b
    w, g, dv = ctx.lanes, len(rows), t.v_head_dim
    chunk = max(1, 24 // g) * w
    for c0 in range(0, dv, chunk):
        width = min(chunk, dv - c0)
        vw = w if width >= w else _pow2_at_least(width)
        nvec = -(-width // vw)
        masks = [None if (k + 1) * vw <= width else _mask_const(vw, width - k * vw) for k in range(nvec)]

        def step(j: ir.Value, accs: list) -> list:
            v_at = iadd(b, iadd(b, v_row0, imul(b, j, v_step)), c0)
            vs = [load_lanes(ctx, t.v, F32, iadd(b, v_at, k * vw), vw, masks[k]) for k in range(nvec)]
            new = []
            for r in range(g):
                p = splat(b, ctx.load(0, F32, j, 1, base=rows[r]), vw)
                new += [vm.fma(b, p, vs[k], accs[r * nvec + k]) for k in range(nvec)]
            return new
        accs = carried_loop(ctx, 0, t.kv_seq, 1, [const(F32, 0.0, vw) for _ in range(g * nvec)], step, name="pvg")
        for r in range(g):
            rv = splat(b, rinvs[r], vw)
            for k in range(nvec):
                store_lanes(ctx, t.out, b.fmul(accs[r * nvec + k], rv, flags=FASTMATH),
                            iadd(b, out_bases[r], c0 + k * vw), masks[k])


def _pow2_at_least(n: int) -> int:
    """The least power of two ≥ n."""
    w = 1
    while w < n:
        w *= 2
    return w


# ── Rope ────────────────────────────────────────────────────────────────────

def rope_per_token(t) -> bool:
    """Whether the tables hold one row per token of the batch (semantics.md §3.4)."""
    if t.cos_row_stride == 0:
        return False
    rows = t.cos_len // t.cos_row_stride
    return rows == t.batch * t.seq and rows != t.seq


def check_rope(t) -> None:
    """`n_rot` even and ≤ head_dim, heads tile `hidden`, strides cover rows, tables cover positions."""
    if t.head_dim == 0 or t.hidden % t.head_dim:
        raise ValidationError(f"hidden = {t.hidden} is not a multiple of head_dim = {t.head_dim}", field="head_dim")
    if t.n_rot % 2:
        raise ValidationError(f"n_rot = {t.n_rot} is odd (it rotates pairs)", field="n_rot")
    if t.n_rot > t.head_dim:
        raise ValidationError(f"n_rot = {t.n_rot} exceeds head_dim = {t.head_dim}", field="n_rot")
    if t.src_row_stride < t.hidden:
        raise ValidationError(f"src_row_stride = {t.src_row_stride} is smaller than a row ({t.hidden})",
                              field="src_row_stride")
    r = t.n_rot // 2
    if r and t.cos_row_stride < r:
        raise ValidationError(f"cos_row_stride = {t.cos_row_stride} is smaller than n_rot/2 = {r}",
                              field="cos_row_stride")
    if r and t.batch * t.seq:
        rows = t.batch * t.seq if rope_per_token(t) else t.seq
        need = (rows - 1) * t.cos_row_stride + r
        if t.cos_len < need:
            raise ValidationError(f"cos_len = {t.cos_len} does not cover {rows} table rows of stride "
                                  f"{t.cos_row_stride} ({need} elements)", field="cos_len")


@lowering(T.Rope, check=check_rope)
def rope(ctx: EmitContext, t) -> None:
    """Rotate the first `n_rot` dims of every head by the row's table; copy the rest."""
    rows = t.batch * t.seq
    if not (rows and t.hidden):
        return
    parallel_rows(ctx, rows, 8 * t.hidden, lambda sub, s, e: _rope_rows(sub, t, s, e))


def _rope_rows(ctx: EmitContext, t, start: ir.Value, stop: ir.Value, inverse: bool = False) -> None:
    """Rows [start, stop) of a Rope; `inverse` rotates by −θ (sin negated: RopeBackward's transpose)."""
    b = ctx.b
    hd, r = t.head_dim, t.n_rot // 2
    per_token = rope_per_token(t)
    with ctx.for_range(start, stop, name="row") as row:
        src_row = imul(b, row, t.src_row_stride)
        dst_row = imul(b, row, t.hidden)
        pos = row if per_token else b.urem(row, I64(t.seq))
        tab = imul(b, pos, t.cos_row_stride)
        with ctx.for_range(0, t.hidden // hd, name="head") as h:
            sx = iadd(b, src_row, imul(b, h, hd))
            dx = iadd(b, dst_row, imul(b, h, hd))
            if r:
                (_rope_pairs if t.interleaved else _rope_halves)(ctx, t, r, sx, dx, tab, inverse)
            if hd > t.n_rot:
                ctx.vector_loop(hd - t.n_rot, lambda d, w: ctx.store(
                    t.dst, ctx.load(t.src, F32, iadd(b, iadd(b, sx, t.n_rot), d), w),
                    iadd(b, iadd(b, dx, t.n_rot), d)), name="pass")


def _angles(ctx: EmitContext, t, tab, i, w: int, inverse: bool) -> tuple[ir.Value, ir.Value]:
    """cos and sin of the pairs `i .. i + w` from the table row `tab` (sin negated when `inverse`)."""
    c = ctx.load(t.cos, F32, iadd(ctx.b, tab, i), w)
    s = ctx.load(t.sin, F32, iadd(ctx.b, tab, i), w)
    return c, (ctx.b.fneg(s) if inverse else s)


def _rope_halves(ctx: EmitContext, t, r: int, sx, dx, tab, inverse: bool = False) -> None:
    """NeoX: `y[i] = x[i]c − x[i+r]s`, `y[i+r] = x[i+r]c + x[i]s`."""
    b = ctx.b

    def body(i: ir.Value, w: int) -> None:
        c, s = _angles(ctx, t, tab, i, w, inverse)
        x0 = ctx.load(t.src, F32, iadd(b, sx, i), w)
        x1 = ctx.load(t.src, F32, iadd(b, iadd(b, sx, r), i), w)
        ctx.store(t.dst, b.fsub(b.fmul(x0, c), b.fmul(x1, s)), iadd(b, dx, i))
        ctx.store(t.dst, b.fadd(b.fmul(x1, c), b.fmul(x0, s)), iadd(b, iadd(b, dx, r), i))
    ctx.vector_loop(r, body, name="rot")


def _rope_pairs(ctx: EmitContext, t, r: int, sx, dx, tab, inverse: bool = False) -> None:
    """GPT-J: `(x[2i], x[2i+1]) → (x[2i]c − x[2i+1]s, x[2i+1]c + x[2i]s)`, `w` pairs per 2w-vector."""
    b = ctx.b

    def body(i: ir.Value, w: int) -> None:
        n = 2 * w
        c, s = _angles(ctx, t, tab, i, w, inverse)
        x = ctx.load(t.src, F32, iadd(b, sx, imul(b, i, 2)), n)
        y = _rotate_pairs(b, x, c, s, w)
        ctx.store(t.dst, y, iadd(b, dx, imul(b, i, 2)))
    ctx.vector_loop(r, body, width=max(1, ctx.lanes // 2), name="rot")


def _rotate_pairs(b: ir.IRBuilder, x: ir.Value, c: ir.Value, s: ir.Value, w: int) -> ir.Value:
    """Pairs `(x0, x1)` of the 2w-vector x → `(x0c − x1s, x1c + x0s)` with w angles in c, s."""
    n = 2 * w
    idx = lambda lst: ir.Constant(ir.VectorType(I32, n), [ir.Constant(I32, v) for v in lst])
    if w == 1:
        vty = ir.VectorType(F32, 1)
        c = b.insert_element(ir.Constant(vty, None), c, I32(0))
        s = b.insert_element(ir.Constant(vty, None), s, I32(0))
    cc = b.shuffle_vector(c, c, idx([k // 2 for k in range(n)]))
    ss = b.shuffle_vector(s, s, idx([k // 2 for k in range(n)]))
    swapped = b.shuffle_vector(x, x, idx([k ^ 1 for k in range(n)]))
    sign = ir.Constant(ir.VectorType(F32, n), [ir.Constant(F32, -1.0 if k % 2 == 0 else 1.0) for k in range(n)])
    return b.fadd(b.fmul(x, cc), b.fmul(b.fmul(swapped, ss), sign))


# ── RopeBackward ────────────────────────────────────────────────────────────

def as_rope(t) -> Rope:
    """The Rope whose transpose `t` is: dy → dx, contiguous rows, same tables, stride and pairing."""
    return Rope(src=t.dy, dst=t.dx, cos=t.cos, sin=t.sin, batch=t.batch, seq=t.seq, hidden=t.hidden,
                head_dim=t.head_dim, n_rot=t.n_rot, cos_len=t.cos_len, cos_row_stride=t.cos_row_stride,
                src_row_stride=t.hidden, interleaved=t.interleaved)


def check_rope_backward(t) -> None:
    """Rope's rules: `n_rot` even and ≤ head_dim, heads tile `hidden`, tables cover the positions."""
    check_rope(as_rope(t))


@lowering(T.RopeBackward, check=check_rope_backward, inplace=True)
def rope_backward(ctx: EmitContext, t) -> None:
    """Rotate every head's first `n_rot` dims by −θ: `dx0 = dy0·c + dy1·s`, `dx1 = dy1·c − dy0·s`; copy the rest."""
    rows = t.batch * t.seq
    if rows and t.hidden:
        parallel_rows(ctx, rows, 8 * t.hidden, lambda sub, s, e: _rope_rows(sub, as_rope(t), s, e, inverse=True))


# ── AxialRope2d ─────────────────────────────────────────────────────────────

def axial_freqs(t) -> list[float]:
    """`f_c = 1/θ^(4c/head_dim)` for `c < head_dim/4`, as f32 values."""
    import numpy as np
    q4 = t.head_dim // 4
    return [float(np.float32(1.0 / (float(np.float32(t.theta)) ** (4.0 * c / t.head_dim)))) for c in range(q4)]


def check_axial(t) -> None:
    """`head_dim` a positive multiple of 4, heads tile `hidden`, `repeat_factor ≥ 1`, `end_x ≥ 1`."""
    if t.head_dim == 0 or t.head_dim % 4:
        raise ValidationError(f"head_dim = {t.head_dim} is not a positive multiple of 4", field="head_dim")
    if t.num_heads * t.head_dim != t.hidden:
        raise ValidationError(f"hidden = {t.hidden} ≠ num_heads·head_dim = {t.num_heads * t.head_dim}",
                              field="hidden")
    if t.repeat_factor == 0:
        raise ValidationError("repeat_factor = 0", field="repeat_factor")
    if t.end_x == 0:
        raise ValidationError("end_x = 0", field="end_x")


@lowering(T.AxialRope2d, check=check_axial)
def axial_rope_2d(ctx: EmitContext, t) -> None:
    """Interleaved pairs of each head's first half rotated by `x·f_c`, of the second half by `y·f_c`."""
    rows = t.batch * t.seq
    if not (rows and t.hidden):
        return
    parallel_rows(ctx, rows, 8 * t.hidden, lambda sub, s, e: _axial_rows(sub, t, s, e))


def _axial_rows(ctx: EmitContext, t, start: ir.Value, stop: ir.Value) -> None:
    b = ctx.b
    hd, q4 = t.head_dim, t.head_dim // 4
    freqs = axial_freqs(t)
    fty = ir.ArrayType(F32, q4)
    g = ir.GlobalVariable(ctx.module, fty, name=f"{ctx.fn.name}.freqs")
    g.global_constant, g.linkage = True, "private"
    g.initializer = ir.Constant(fty, [ir.Constant(F32, f) for f in freqs])
    table = ctx.scratch_alloc(4 * 4 * q4)  # cos x, sin x, cos y, sin y
    tbase = _scratch_at(ctx, table)
    with ctx.for_range(start, stop, name="row") as row:
        tok = b.urem(row, I64(t.seq))
        pos = b.udiv(tok, I64(t.repeat_factor))
        px = b.uitofp(b.urem(pos, I64(t.end_x)), F32)
        py = b.uitofp(b.udiv(pos, I64(t.end_x)), F32)

        def angles(c: ir.Value, w: int) -> None:
            f = b.load(b.gep(g, [I64(0), c], inbounds=True, source_etype=fty), typ=vec(F32, w), align=4)
            ax = b.fmul(splat(b, px, w), f)
            ay = b.fmul(splat(b, py, w), f)
            for k, v in enumerate((vm.cos(b, ax), vm.sin(b, ax), vm.cos(b, ay), vm.sin(b, ay))):
                ctx.store(0, v, iadd(b, c, k * q4), base=tbase)
        ctx.vector_loop(q4, angles, name="ang")
        base = imul(b, row, t.hidden)
        with ctx.for_range(0, t.num_heads, name="head") as h:
            hb = iadd(b, base, imul(b, h, hd))
            for half in (0, 1):
                off = iadd(b, hb, half * (hd // 2))

                def body(c: ir.Value, w: int, half=half, off=off) -> None:
                    cs = ctx.load(0, F32, iadd(b, c, 2 * half * q4), w, base=tbase)
                    sn = ctx.load(0, F32, iadd(b, c, (2 * half + 1) * q4), w, base=tbase)
                    x = ctx.load(t.src, F32, iadd(b, off, imul(b, c, 2)), 2 * w)
                    ctx.store(t.dst, _rotate_pairs(b, x, cs, sn, w), iadd(b, off, imul(b, c, 2)))
                ctx.vector_loop(q4, body, width=max(1, ctx.lanes // 2), name=f"rot{half}")


# ── FusedSwiGLU ─────────────────────────────────────────────────────────────

def check_swiglu(t) -> None:
    """`total` is a whole number of rows of `n_half`."""
    if t.total and (t.n_half == 0 or t.total % t.n_half):
        raise ValidationError(f"total = {t.total} is not a multiple of n_half = {t.n_half}", field="total")


@lowering(T.FusedSwiGLU, check=check_swiglu)
def fused_swiglu(ctx: EmitContext, t) -> None:
    """`out[r, i] = up·gate·σ(gate)` over rows `[up ‖ gate]` (or `[gate ‖ up]` with `gate_first`)."""
    if not t.total:
        return
    n = t.n_half
    rows = t.total // n
    up_off, gate_off = (n, 0) if t.gate_first else (0, n)

    def rows_body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        with sub.for_range(start, stop, name="row") as r:
            src = imul(b, r, 2 * n)
            dst = imul(b, r, n)

            def body(i: ir.Value, w: int) -> None:
                up = sub.load(t.src, F32, iadd(b, iadd(b, src, up_off), i), w)
                g = sub.load(t.src, F32, iadd(b, iadd(b, src, gate_off), i), w)
                sub.store(t.dst, b.fmul(up, b.fmul(g, vm.sigmoid(b, g))), iadd(b, dst, i))
            sub.vector_loop(n, body, name="swiglu")
    parallel_rows(ctx, rows, 12 * n, rows_body)
