"""FusedAttnBlock, FusedBertLayer and FusedNomicLayer as native code by composing the existing
emitters inside one thunk function (semantics.md §3.4; docs/lowering-fused-layers.md).

No new kernels: the projections are `gemm.gemm` (IR tiles or BLAS) with scratch operands and a
bias(/erf-GELU) epilogue, the attention core is `attention.attention` run on a sub-context whose
"arena" is this thread's scratch (Q/K/V are column ranges of the scratch QKV buffer, the Custom
mask buffer (Custom or Bias) is copied next to them; RoPE is `attention._rope_rows` on the same sub-context, with the
tables copied into scratch), and the LayerNorms use `norms.row_stats`/`normalized` (RLX's
one-pass variance) with loaders that read scratch and arena slots.  Intermediates live in the
calling thread's scratch; every step splits across rlx_llvm's threads when it is large enough:
the GEMMs by column panels (scratch operands are `ScratchRef`s, which a parallel body re-derives
from `ctx.shared`), attention by (batch, head) units, the LayerNorms and SwiGLU by rows.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..ops import Activation, MaskKind
from ..thunks.attention import Attention, Rope, mask_elems
from . import elementmath as em
from .attention import _rope_rows, attention
from .context import ArenaRef, EmitContext, ScratchRef
from .toolkit import F32, FASTMATH, I64, copy_bytes, iadd, imul, scratch_ptr
from .gemm import Epilogue, check_blas_ints, gemm
from .norms import Stats, normalized, row_stats
from ..registry import lowering
from .blas_calls import FortranArgs

# Row loops (LayerNorm, SwiGLU) fork only when every thread gets at least this many elements
# (≈ 128 KiB of f32, several µs of work against a fork/join of a few µs).
ROW_PARALLEL_MIN_ELEMENTS = 1 << 15


# ── validation ───────────────────────────────────────────────────────────────

def _check_heads(t) -> None:
    if t.nh * t.dh != t.hs:
        raise ValidationError(f"nh·dh = {t.nh}·{t.dh} ≠ hs = {t.hs}", field="dh")


def check_attn_block(t) -> None:
    """Heads that tile hs, RoPE tables that cover the sequence, BLAS-sized dims (every mask kind)."""
    _check_heads(t)
    if t.has_rope:
        _check_rope(t)
    check_blas_ints("in_dim", "out_dim", "hs")(t)


def _check_rope(t) -> None:
    """RoPE rotates pairs of each head (dh even) by table rows `pos·dh/2` for pos < seq."""
    if t.dh % 2:
        raise ValidationError(f"dh = {t.dh} is odd; RoPE rotates pairs", field="dh")
    need = t.seq * (t.dh // 2)
    if t.cos_len < need:
        raise ValidationError(f"cos_len = {t.cos_len} does not cover seq = {t.seq} table rows of dh/2 = "
                              f"{t.dh // 2} ({need} elements)", field="cos_len")


def check_nomic_layer(t) -> None:
    """Heads that tile hs, RoPE tables that cover the sequence, BLAS-sized dims."""
    _check_heads(t)
    _check_rope(t)
    check_blas_ints("hs", "int_dim")(t)


def check_bert_layer(t) -> None:
    """Heads that tile hs, BLAS-sized dims."""
    _check_heads(t)
    check_blas_ints("hs", "int_dim")(t)


# ── pieces ───────────────────────────────────────────────────────────────────

def _scratch_f32(ctx: EmitContext, count: int) -> int:
    return ctx.scratch_alloc(4 * max(1, count))


def _bias_act(ctx: EmitContext, c: int, m: int, n: int, bias: int, act) -> Epilogue:
    """Epilogue `C[r, j] = act(C[r, j] + bias[j])` on a scratch C (the FusedMmBiasAct pass).

    C is addressed through `sub.shared`: inside a GEMM's parallel body `sub.scratch` is that
    thread's private buffer, not the thunk's intermediates."""
    def epilogue(sub: EmitContext, col0: ir.Value, width: int) -> None:
        b = sub.b
        with sub.for_range(0, m, name="row") as r:
            row = b.add(imul(b, r, n), col0)

            def body(j: ir.Value, w: int) -> None:
                at = b.add(row, j)
                x = b.fadd(sub.load(c, F32, at, w, base=sub.shared), sub.load(bias, F32, b.add(col0, j), w))
                if act is not None:
                    x = em.activation(b, act, x, region=False)
                sub.store(c, x, at, base=sub.shared)
            sub.vector_loop(width, body, name="col")
    return epilogue


def _project(ctx: EmitContext, m: int, n: int, k: int, a: "ArenaRef | int", w: int, c: int, bias: "int | None",
             act=None) -> None:
    """Scratch `C[m, n] = act(A·W (+ bias))`; `a` an arena offset (ArenaRef) or a scratch offset (int).

    Scratch operands are `ScratchRef`s, so the IR tiles can split column panels across threads."""
    a_op = a if isinstance(a, ArenaRef) else ScratchRef(a)
    epi = None if bias is None else _bias_act(ctx, c, m, n, bias, act)
    gemm(ctx, FortranArgs(ctx), "s", m, n, k, a_op, ArenaRef(w), ScratchRef(c), epilogue=epi)


def _split_rows(ctx: EmitContext, rows: int, width: int, row_body: Callable[[EmitContext, ir.Value], None]) -> None:
    """Run `row_body(sub, r)` for every row in [0, rows), split across threads by rows when each
    thread gets at least `ROW_PARALLEL_MIN_ELEMENTS` elements (rows of `width` are independent).
    The body must address the thunk's scratch through `sub.shared`."""
    def chunk(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(start, stop, name="row") as r:
            row_body(sub, r)
    min_rows = max(1, -(-ROW_PARALLEL_MIN_ELEMENTS // max(1, width)))
    if rows >= 2 * min_rows:
        ctx.parallel_for(rows, chunk, grain=1, min_work=min_rows)
    else:
        chunk(ctx, I64(0), I64(rows))


def _on_scratch(ctx: EmitContext, emit) -> None:
    """Run `emit(sub)` on a sub-context whose "arena" is this thread's scratch (so thunk-shaped
    emitters address scratch offsets), sharing the builder, scratch bump and outlined counter
    (its parallel bodies get arena = this scratch, and their own per-thread scratch beyond it)."""
    sub = EmitContext(ctx.module, ctx.fn, ctx.index, ctx.thunk, ctx.schedule, ctx.lanes, ctx._declare,
                      arena=ctx.scratch, scratch=ctx.scratch, builder=ctx.b, shared=ctx.shared)
    sub.scratch_bytes, sub._outlined = ctx.scratch_bytes, ctx._outlined
    emit(sub)
    ctx.scratch_bytes, ctx._outlined = sub.scratch_bytes, sub._outlined
    ctx.paths |= sub.paths
    ctx._streamed |= sub._streamed


def _to_scratch(ctx: EmitContext, src: int, count: int) -> int:
    """Copy `count` f32 of the arena slot `src` into fresh scratch; returns the scratch offset."""
    dst = _scratch_f32(ctx, count)
    if count:
        copy_bytes(ctx, scratch_ptr(ctx, dst), ctx.addr(src), 4 * count)
    return dst


def _attend(ctx: EmitContext, qkv: int, mask: int, kind, batch: int, seq: int, nh: int, dh: int, out: int,
            rope=None) -> None:
    """Scratch `out[m, hs] = MHA(qkv[m, 3hs])`: `attention.attention` on the scratch sub-context;
    the mask buffer (Custom `[batch, seq]`, Bias `[batch, nh, seq, seq]`) is copied into scratch first.  `rope = (cos, sin, interleaved)`
    (arena offsets) rotates q and k first: `attention._rope_rows` over the `[m, 2hs]` q|k columns
    (as 2·nh heads) into a scratch buffer, table row `pos·dh/2` for the token's position `pos`."""
    hs, m = nh * dh, batch * seq
    elems = mask_elems(kind, batch, nh, seq, seq)  # Custom [b, s], Bias [b, nh, s, s], else none
    mk = _to_scratch(ctx, mask, elems) if elems else 0
    q, k, qk_stride = qkv, qkv + 4 * hs, 3 * hs
    if rope is not None:
        cos, sin, interleaved = rope
        r = dh // 2
        cs, sn, qk = _to_scratch(ctx, cos, seq * r), _to_scratch(ctx, sin, seq * r), _scratch_f32(ctx, m * 2 * hs)
        rot = Rope(src=qkv, cos=cs, sin=sn, dst=qk, batch=batch, seq=seq, hidden=2 * hs, head_dim=dh, n_rot=dh,
                   cos_len=seq * r, cos_row_stride=r, src_row_stride=3 * hs, interleaved=interleaved)
        if r:
            _on_scratch(ctx, lambda sub: _rope_rows(sub, rot, I64(0), I64(m)))
        q, k, qk_stride = qk, qk + 4 * hs, 2 * hs
    fake = Attention(q=q, k=k, v=qkv + 8 * hs, mask=mk, out=out, batch=batch, seq=seq, kv_seq=seq,
                     heads=nh, kv_heads=nh, head_dim=dh, v_head_dim=dh, mask_kind=kind,
                     scale=float(np.float32(dh ** -0.5)), softcap=0.0, q_row_stride=qk_stride,
                     k_row_stride=qk_stride, v_row_stride=3 * hs, bhsd=False)
    _on_scratch(ctx, lambda sub: attention(sub, fake))


def _residual_ln(ctx: EmitContext, rows: int, h: int, x: int, res: int, res_in_scratch: bool, bias: "int | None",
                 g: int, beta: int, eps: float, dst: int, dst_in_scratch: bool) -> None:
    """`dst = LN(x + res + bias)·g + beta` per row (the FusedResidualLN math, one-pass variance);
    `x` is a scratch offset, `res`/`dst` scratch or arena offsets.  Rows split across threads."""
    if not (rows and h):
        return

    def ln_row(sub: EmitContext, r: ir.Value) -> None:
        b, sc = sub.b, sub.shared
        rbase = sc if res_in_scratch else None
        dbase = sc if dst_in_scratch else None
        row = imul(b, r, h)

        def load(j, w):
            idx = iadd(b, row, j)
            v = b.fadd(sub.load(x, F32, idx, w, base=sc), sub.load(res, F32, idx, w, base=rbase), flags=FASTMATH)
            return v if bias is None else b.fadd(v, sub.load(bias, F32, j, w), flags=FASTMATH)
        mean, inv = row_stats(sub, h, load, Stats(True, False, eps))

        def out(j, w):
            y = normalized(sub, load(j, w), mean, inv)
            y = b.fadd(b.fmul(y, sub.load(g, F32, j, w), flags=FASTMATH), sub.load(beta, F32, j, w), flags=FASTMATH)
            sub.store(dst, y, iadd(b, row, j), base=dbase)
        sub.vector_loop(h, out, name="ln_norm")

    _split_rows(ctx, rows, h, ln_row)


# ── the thunks ───────────────────────────────────────────────────────────────

@lowering(T.FusedAttnBlock, path="llvm|blas", check=check_attn_block, shared_body=True)
def fused_attn_block(ctx: EmitContext, t) -> None:
    """`out = MHA(hidden·qkv_w (+ qkv_b))·out_w (+ out_b)`."""
    m, hs = t.batch * t.seq, t.hs
    if m == 0 or t.out_dim == 0:
        return
    qkv = _scratch_f32(ctx, m * 3 * hs)
    attn = _scratch_f32(ctx, m * hs)
    _project(ctx, m, 3 * hs, t.in_dim, ArenaRef(t.hidden), t.qkv_w, qkv, t.qkv_b if t.has_bias else None)
    if hs:
        _attend(ctx, qkv, t.mask, t.mask_kind, t.batch, t.seq, t.nh, t.dh, attn,
                rope=(t.cos, t.sin, t.interleaved) if t.has_rope else None)
    # the output projection writes the arena directly, with the FusedMmBiasAct bias pass
    a_op = ScratchRef(attn)
    if t.out_b != 0:
        def epi(sub: EmitContext, col0: ir.Value, width: int) -> None:
            b = sub.b
            with sub.for_range(0, m, name="row") as r:
                row = b.add(imul(b, r, t.out_dim), col0)

                def body(j, w):
                    at = b.add(row, j)
                    sub.store(t.out, b.fadd(sub.load(t.out, F32, at, w), sub.load(t.out_b, F32, b.add(col0, j), w)),
                              at)
                sub.vector_loop(width, body, name="col")
    else:
        epi = None
    gemm(ctx, FortranArgs(ctx), "s", m, t.out_dim, hs, a_op, ArenaRef(t.out_w), ArenaRef(t.out), epilogue=epi)


@lowering(T.FusedBertLayer, path="llvm|blas", check=check_bert_layer, shared_body=True)
def fused_bert_layer(ctx: EmitContext, t) -> None:
    """Post-LN BERT layer (semantics.md §3.4), every step an existing emitter on scratch."""
    m, hs, inter = t.batch * t.seq, t.hs, t.int_dim
    if m == 0 or hs == 0:
        return
    qkv = _scratch_f32(ctx, m * 3 * hs)
    attn = _scratch_f32(ctx, m * hs)
    y = _scratch_f32(ctx, m * hs)
    n1 = _scratch_f32(ctx, m * hs)
    f = _scratch_f32(ctx, m * inter)
    _project(ctx, m, 3 * hs, hs, ArenaRef(t.hidden), t.qkv_w, qkv, t.qkv_b)
    _attend(ctx, qkv, t.mask, MaskKind.Custom, t.batch, t.seq, t.nh, t.dh, attn)
    _project(ctx, m, hs, hs, attn, t.out_w, y, None)
    _residual_ln(ctx, m, hs, y, t.hidden, False, t.out_b, t.ln1_g, t.ln1_b, t.eps1, n1, True)
    _project(ctx, m, inter, hs, n1, t.fc1_w, f, t.fc1_b, Activation.Gelu)
    _project(ctx, m, hs, inter, f, t.fc2_w, y, None)
    _residual_ln(ctx, m, hs, y, n1, True, t.fc2_b, t.ln2_g, t.ln2_b, t.eps2, t.out, False)


@lowering(T.FusedNomicLayer, path="llvm|blas", check=check_nomic_layer, shared_body=True)
def fused_nomic_layer(ctx: EmitContext, t) -> None:
    """Nomic layer (semantics.md §3.4): RoPE attention, residual + LN, SwiGLU FFN, residual + LN."""
    m, hs, inter = t.batch * t.seq, t.hs, t.int_dim
    if m == 0 or hs == 0:
        return
    qkv = _scratch_f32(ctx, m * 3 * hs)
    attn = _scratch_f32(ctx, m * hs)
    y = _scratch_f32(ctx, m * hs)
    n1 = _scratch_f32(ctx, m * hs)
    u = _scratch_f32(ctx, m * 2 * inter)
    g = _scratch_f32(ctx, m * inter)
    _project(ctx, m, 3 * hs, hs, ArenaRef(t.hidden), t.qkv_w, qkv, None)
    _attend(ctx, qkv, t.mask, MaskKind.Custom, t.batch, t.seq, t.nh, t.dh, attn,
            rope=(t.cos, t.sin, t.interleaved))
    _project(ctx, m, hs, hs, attn, t.out_w, y, None)
    _residual_ln(ctx, m, hs, y, t.hidden, False, None, t.ln1_g, t.ln1_b, t.eps1, n1, True)
    _project(ctx, m, 2 * inter, hs, n1, t.fc11_w, u, None)
    if inter:
        _swiglu_rows(ctx, m, inter, u, g)
    _project(ctx, m, hs, inter, g, t.fc2_w, y, None)
    _residual_ln(ctx, m, hs, y, n1, True, None, t.ln2_g, t.ln2_b, t.eps2, t.out, False)


def _swiglu_rows(ctx: EmitContext, m: int, inter: int, u: int, g: int) -> None:
    """Scratch `g[r, j] = up · silu(gate)` from `[up | gate]` rows of `2·int` in scratch `u`;
    rows split across threads."""
    def glu_row(sub: EmitContext, r: ir.Value) -> None:
        b, sc = sub.b, sub.shared
        row = imul(b, r, 2 * inter)

        def body(j, w):
            at = iadd(b, row, j)
            up = sub.load(u, F32, at, w, base=sc)
            gate = sub.load(u, F32, iadd(b, at, inter), w, base=sc)
            sub.store(g, b.fmul(up, em.activation(b, Activation.Silu, gate, region=False), flags=FASTMATH),
                      iadd(b, imul(b, r, inter), j), base=sc)
        sub.vector_loop(inter, body, name="glu")

    _split_rows(ctx, m, inter, glu_row)
