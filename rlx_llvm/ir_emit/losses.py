"""Softmax cross-entropy losses (semantics.md §3.6), row by row with the softmax row pieces.

Labels are f32-encoded class ids converted like Rust's `label as usize` (truncate toward zero,
NaN and negatives → 0).  A label ≥ c — where RLX would index out of bounds — is *ignored*, the
way PyTorch treats `ignore_index`: that row's loss is 0 and its gradient row is 0.  The kernel
never reads or writes outside its slots whatever the label data holds.
"""
from __future__ import annotations

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from .context import EmitContext
from .toolkit import F32, FASTMATH, I64, Index, fconst, iadd, imul, lane_index, nan_max, splat
from ..registry import lowering
from .rows import MAX, SUM, exp_sum, parallel_rows, reduce_row, row_max


def check_classes(t) -> None:
    """At least one class per row."""
    if t.c == 0 and t.n:
        raise ValidationError("c = 0: a softmax over no classes has no loss", field="c")


def label_index(ctx: EmitContext, label: ir.Value, classes: int) -> tuple[ir.Value, ir.Value]:
    """(label < classes, `label as usize` as an i64 — 0 when out of range, so always a safe index)."""
    b = ctx.b
    valid = b.fcmp_unordered("<", label, ir.Constant(F32, float(classes)))  # NaN → 0, which is valid
    clamped = nan_max(ctx, label, ir.Constant(F32, 0.0))                   # NaN, negatives → 0
    safe = b.select(valid, clamped, ir.Constant(F32, 0.0))                  # no conversion of huge values
    return valid, b.fptosi(safe, I64)


def log_sum_exp(ctx: EmitContext, n: int, load, store=None) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(m, Σexp(x − m), m + ln Σ) of a row."""
    from . import vecmath as vm
    m = row_max(ctx, n, load)
    s = exp_sum(ctx, n, load, m, store)
    return m, s, ctx.b.fadd(m, vm.log(ctx.b, s))


@lowering(T.SoftmaxCrossEntropy, check=check_classes)
def softmax_cross_entropy(ctx: EmitContext, t) -> None:
    """`loss[n] = (m + ln Σ e^{x−m}) − x[label]`; an out-of-range label gives loss 0."""
    def rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        with sub.for_range(start, stop, name="row") as r:
            base = imul(b, r, t.c)
            _, _, lse = log_sum_exp(sub, t.c, lambda j, w: sub.load(t.logits, F32, iadd(b, base, j), w))
            valid, lab = label_index(sub, sub.load(t.labels, F32, r), t.c)
            picked = sub.load(t.logits, F32, b.add(base, lab))
            sub.store(t.dst, b.select(valid, b.fsub(lse, picked), ir.Constant(F32, 0.0)), r)
    parallel_rows(ctx, t.n, 4 * t.c, rows)


@lowering(T.SoftmaxCrossEntropyDense, check=check_classes)
def softmax_cross_entropy_dense(ctx: EmitContext, t) -> None:
    """`loss[n] = lse(x_n) − Σ_c t[n,c]·x[n,c]`; max and the dot product share the first pass."""
    def rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        from . import vecmath as vm
        b = sub.b
        with sub.for_range(start, stop, name="row") as r:
            base = imul(b, r, t.c)

            def load(j: Index, w: int) -> ir.Value:
                return sub.load(t.logits, F32, iadd(b, base, j), w)

            def max_and_dot(j: Index, w: int) -> tuple[ir.Value, ir.Value]:
                x = load(j, w)
                return x, b.fmul(sub.load(t.targets, F32, iadd(b, base, j), w), x, flags=FASTMATH)
            m, dot = reduce_row(sub, t.c, max_and_dot, [MAX, SUM])
            s = exp_sum(sub, t.c, load, m)
            sub.store(t.dst, b.fsub(b.fadd(m, vm.log(b, s)), dot), r)
    parallel_rows(ctx, t.n, 8 * t.c, rows)


@lowering(T.SoftmaxCrossEntropyBackward, check=check_classes)
def softmax_cross_entropy_backward(ctx: EmitContext, t) -> None:
    """`dlogits[n, k] = (softmax(x_n)[k] − [k = label])·d_loss[n]`; a row whose label is out of
    range gets zeros.  The exponentials are parked in dlogits, then rescaled from L1."""
    def rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        with sub.for_range(start, stop, name="row") as r:
            base = imul(b, r, t.c)
            m = row_max(sub, t.c, lambda j, w: sub.load(t.logits, F32, iadd(b, base, j), w))
            s = exp_sum(sub, t.c, lambda j, w: sub.load(t.logits, F32, iadd(b, base, j), w), m,
                        store=lambda j, e: sub.store(t.dlogits, e, iadd(b, base, j)))
            rinv = b.fdiv(ir.Constant(F32, 1.0), s)
            valid, lab = label_index(sub, sub.load(t.labels, F32, r), t.c)
            g = sub.load(t.d_loss, F32, r)

            def grad(j: Index, w: int) -> None:
                idx = iadd(b, base, j)
                p = b.fmul(sub.load(t.dlogits, F32, idx, w), splat(b, rinv, w), flags=FASTMATH)
                col = lane_index(b, j, w)
                hot = b.icmp_signed("==", col, splat(b, lab, w))
                p = b.select(hot, b.fsub(p, fconst(p, 1.0), flags=FASTMATH), p)
                d = b.fmul(p, splat(b, g, w), flags=FASTMATH)
                sub.store(t.dlogits, b.select(valid, d, fconst(d, 0.0)), idx)
            sub.vector_loop(t.c, grad, name="grad")
    parallel_rows(ctx, t.n, 12 * t.c, rows)
