"""Element-wise thunks: BinaryFull (f32/i64, f64, c64), BiasAdd, activations, Compare, Where, Fma,
SgdMomentum, the complex helpers (semantics.md §3.1, §3.12) and SplineActivation (§3.8, its own row loop).

Everything here is one *walk*: output element `o` at row-major coordinates `c` of `dims` reads
input `k` at element `Σ c·strides[k]` and writes every output at `o`.  `emit_walk` drops size-1
axes, merges axes that every operand walks contiguously, runs nested `for_range` loops over the
outer axes (accumulating each operand's base index) and an explicit `<W x …>` vector loop over
the innermost axis, where each operand is a contiguous load (stride 1), a splat of a value loaded
once per row (stride 0), or a gather (any other stride).  The element type (`Elem`) and the math
(`compute`) are parameters, so BinaryFull, BinaryFullF64, BinaryFullC64, Compare, Where, BiasAdd and
the unary kernels share the same loop code.  The only other loop is `emit_modular`, BinaryFull's
legacy `i mod len` indexing when the two lengths do not nest (otherwise it, too, becomes a walk).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Sequence, Union

import numpy as np
from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..ops import Activation, BinaryOp, CmpOp
from . import elementmath as em
from . import vecmath as vm
from .context import EmitContext
from .toolkit import F32, F64, I1, I32, I64, I8, as_value, carried_loop, const, iadd, imul, lane_index, splat, width_of
from ..registry import lowering
from .rows import SPAN_GRAIN, parallel_rows, span_vector_loop

Value = Union[ir.Value, tuple]  # a scalar/vector, or (re, im) for a complex element


# ── element storage ─────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Elem:
    """How one element is stored: `parts` consecutive scalars of `storage` (2 = interleaved complex)."""

    name: str
    storage: ir.Type
    scalar_bytes: int
    parts: int = 1

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.scalar_bytes * self.parts


F32_ELEM = Elem("f32", F32, 4)
F64_ELEM = Elem("f64", F64, 8)
I64_ELEM = Elem("i64", I64, 8)
I32_BITS = Elem("bits32", I32, 4)   # Where's byte-generic 4-byte data
I64_BITS = Elem("bits64", I64, 8)   # Where's byte-generic 8-byte data
BOOL_ELEM = Elem("bool", I8, 1)
C64_ELEM = Elem("c64", F32, 4, parts=2)


IDX = ("nuw", "nsw")  # element indices here never wrap or go negative


def _lane_mask(w: int, start: int, step: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(I32, w), [ir.Constant(I32, start + step * j) for j in range(w)])


def splat_value(b: ir.IRBuilder, x: Value, w: int) -> Value:
    """Broadcast a scalar element (or a complex pair of scalars, part by part) to `w` lanes."""
    if isinstance(x, tuple):
        return tuple(splat(b, p, w) for p in x)
    return splat(b, x, w)


def load_run(ctx: EmitContext, elem: Elem, offset: int, index: "ir.Value | int", w: int) -> Value:
    """`w` consecutive elements from element `index` (complex is deinterleaved into (re, im))."""
    if elem.parts == 1:
        return ctx.load(offset, elem.storage, index, w)
    flat = ctx.load(offset, elem.storage, imul(ctx.b, index, elem.parts, IDX), elem.parts * w)
    b = ctx.b
    if w == 1:
        return tuple(b.extract_element(flat, I32(p)) for p in range(elem.parts))
    undef = ir.Constant(flat.type, None)
    return tuple(b.shuffle_vector(flat, undef, _lane_mask(w, p, elem.parts)) for p in range(elem.parts))


def store_run(ctx: EmitContext, elem: Elem, offset: int, value: Value, index: "ir.Value | int") -> None:
    """Store `value` (scalar, vector, or complex (re, im)) at element `index`."""
    if elem.parts == 1:
        ctx.store(offset, value, index)
        return
    b, w = ctx.b, width_of(value[0])
    base = imul(b, index, elem.parts, IDX)
    if w == 1:
        for p, part in enumerate(value):
            ctx.store(offset, part, iadd(b, base, p, IDX))
        return
    re, im = value  # interleave: lanes re0 im0 re1 im1 …
    mask = ir.Constant(ir.VectorType(I32, 2 * w), [ir.Constant(I32, j // 2 + (w if j % 2 else 0))
                                                   for j in range(2 * w)])
    ctx.store(offset, b.shuffle_vector(re, im, mask), base)


def _gather(ctx: EmitContext, storage: ir.Type, size: int, offset: int, indices: ir.Value) -> ir.Value:
    """`llvm.masked.gather` of `storage` elements at a vector of element indices (all lanes on)."""
    b, w = ctx.b, indices.type.count
    ptrs = b.gep(ctx.addr(offset), [indices], source_etype=storage, inbounds=True)
    # llvmlite types a gep by its base pointer; with a vector index LLVM yields a vector of
    # pointers, so the result type is set to match (the gep's own text does not print it)
    ptrs.type = ir.VectorType(ir.PointerType(), w)
    suffix = {"float": "f32", "double": "f64"}.get(str(storage), str(storage))
    vty = ir.VectorType(storage, w)
    gather = ctx.intrinsic(f"llvm.masked.gather.v{w}{suffix}.v{w}p0", vty,
                           [ir.VectorType(ir.PointerType(), w), I32, ir.VectorType(I1, w), vty])
    return b.call(gather, [ptrs, I32(size), const(I1, 1, w), ir.Constant(vty, None)])


def load_gather(ctx: EmitContext, elem: Elem, offset: int, indices: ir.Value) -> Value:
    """Elements at a vector of element indices."""
    if elem.parts == 1:
        return _gather(ctx, elem.storage, elem.scalar_bytes, offset, indices)
    b, w = ctx.b, indices.type.count
    flat = b.mul(indices, ir.Constant(indices.type, [I64(elem.parts)] * w), flags=("nuw", "nsw"))
    return tuple(_gather(ctx, elem.storage, elem.scalar_bytes, offset,
                         b.add(flat, ir.Constant(indices.type, [I64(p)] * w)) if p else flat)
                 for p in range(elem.parts))


def load_strided(ctx: EmitContext, elem: Elem, offset: int, first: "ir.Value | int", stride: int,
                 w: int) -> Value:
    """`w` elements `first, first + stride, …` (a gather for w > 1)."""
    if w == 1:
        return load_run(ctx, elem, offset, first, 1)
    b = ctx.b
    vty = ir.VectorType(I64, w)
    start = splat(b, as_value(first), w)
    lanes = ir.Constant(vty, [I64(stride * j) for j in range(w)])
    return load_gather(ctx, elem, offset, b.add(start, lanes, flags=("nuw", "nsw")))


def lane_width(ctx: EmitContext, elems: Sequence[Elem]) -> int:
    """Vector width for a loop over these elements: one register of the widest scalar."""
    widest = max((e.scalar_bytes for e in elems), default=4)
    return max(1, ctx.lanes * 4 // max(widest, 4))


# ── the walk ────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Operand:
    """An input of a walk: slot offset, storage, and its element stride per output axis."""

    offset: int
    elem: Elem
    strides: tuple[int, ...]


@dataclass(frozen=True)
class Output:
    """An output of a walk (always contiguous in the output's row-major order)."""

    offset: int
    elem: Elem


Compute = Callable[..., "Value | Sequence[Value]"]


def contiguous_strides(dims: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides of a contiguous array of shape `dims`."""
    out, acc = [], 1
    for d in reversed(dims):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def simplify_walk(dims: Sequence[int], stride_sets: Sequence[Sequence[int]]
                  ) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop size-1 axes and merge neighbouring axes that every operand walks contiguously."""
    keep = [k for k, d in enumerate(dims) if d != 1]
    merged_dims: list[int] = []
    merged: list[list[int]] = [[] for _ in stride_sets]
    for k in keep:
        d = dims[k]
        if merged_dims and all(m[-1] == s[k] * d for m, s in zip(merged, stride_sets)):
            merged_dims[-1] *= d
            for m, s in zip(merged, stride_sets):
                m[-1] = s[k]
        else:
            merged_dims.append(d)
            for m, s in zip(merged, stride_sets):
                m.append(s[k])
    if not merged_dims:  # a single element
        return (1,), [(0,) for _ in stride_sets]
    return tuple(merged_dims), [tuple(m) for m in merged]


def max_walk_index(dims: Sequence[int], strides: Sequence[int]) -> int:
    """Largest element index an operand is read at (−1 when the walk is empty)."""
    if any(d == 0 for d in dims):
        return -1
    return sum((d - 1) * s for d, s in zip(dims, strides))


def emit_walk(ctx: EmitContext, dims: Sequence[int], inputs: Sequence[Operand], outputs: Sequence[Output],
              compute: Compute, width: int | None = None) -> None:
    """outputs[o] = compute(b, *inputs at Σ c·strides) for every row-major coordinate `c` of `dims`.

    `compute(b, *values)` gets one value per input (complex inputs as (re, im)) and returns the
    output value, or a sequence of them when there are several outputs.  A walk that moves enough
    bytes is split across threads: a one-axis walk by element ranges, a deeper one by ranges of
    its outermost axis.
    """
    if math.prod(dims) == 0:
        return
    dims, sets = simplify_walk(dims, [op.strides for op in inputs])
    w = width or lane_width(ctx, [op.elem for op in inputs] + [o.elem for o in outputs])
    if not _split_safe(dims, sets, inputs, outputs):
        return _walk_rows(ctx, dims, sets, inputs, outputs, compute, w, I64(0), I64(dims[0]))
    per_elem = _bytes_per_element(inputs, sets, outputs)
    if len(dims) == 1:
        def elements(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
            _walk_rows(sub, dims, sets, inputs, outputs, compute, w, start, stop)
        parallel_rows(ctx, dims[0], per_elem, elements, grain=SPAN_GRAIN)
        return
    parallel_rows(ctx, dims[0], per_elem * math.prod(dims[1:]),
                  lambda sub, start, stop: _walk_rows(sub, dims, sets, inputs, outputs, compute, w, start, stop))


def _bytes_per_element(inputs: Sequence[Operand], sets: Sequence[tuple[int, ...]], outputs: Sequence[Output]) -> int:
    """Bytes a walk moves per output element (an operand broadcast along the inner axis stays in cache)."""
    return sum(o.elem.itemsize for o in outputs) + sum(op.elem.itemsize for op, s in zip(inputs, sets) if s[-1])


def _split_safe(dims: Sequence[int], sets: Sequence[tuple[int, ...]], inputs: Sequence[Operand],
                outputs: Sequence[Output]) -> bool:
    """Whether threads may write the outputs in any order: every input that overlaps an output is
    read exactly where it is written (the same offset and contiguous), so no result depends on another."""
    out_strides = contiguous_strides(dims)
    n = math.prod(dims)
    for op, s in zip(inputs, sets):
        end = op.offset + (max_walk_index(dims, s) + 1) * op.elem.itemsize
        for out in outputs:
            overlaps = out.offset < end and op.offset < out.offset + n * out.elem.itemsize
            if overlaps and not (op.offset == out.offset and tuple(s) == out_strides and op.elem == out.elem):
                return False
    return True


def _walk_rows(ctx: EmitContext, dims: Sequence[int], sets: Sequence[tuple[int, ...]], inputs: Sequence[Operand],
               outputs: Sequence[Output], compute: Compute, w: int, start: ir.Value, stop: ir.Value) -> None:
    """The walk over coordinates whose outermost index lies in `[start, stop)`."""
    out_strides = contiguous_strides(dims)
    b = ctx.b
    with contextlib.ExitStack() as loops:
        bases: list = [0] * len(inputs)
        out_base = 0
        for axis, extent in enumerate(dims[:-1]):
            lo, hi = (start, stop) if axis == 0 else (0, extent)
            c = loops.enter_context(ctx.for_range(lo, hi, name=f"axis{axis}"))
            bases = [iadd(b, base, imul(b, c, s[axis], IDX), IDX) if s[axis] else base for base, s in zip(bases, sets)]
            out_base = iadd(b, out_base, imul(b, c, out_strides[axis], IDX), IDX)
        inner = [s[-1] for s in sets]
        # stride-0 operands of the innermost axis: one scalar load per row, splat in the body
        row_values = {k: load_run(ctx, op.elem, op.offset, bases[k], 1)
                      for k, op in enumerate(inputs) if inner[k] == 0}

        def body(j: ir.Value, lanes: int) -> None:
            values = []
            for k, op in enumerate(inputs):
                if inner[k] == 0:
                    values.append(splat_value(b, row_values[k], lanes))
                elif inner[k] == 1:
                    values.append(load_run(ctx, op.elem, op.offset, iadd(b, bases[k], j, IDX), lanes))
                else:
                    first = iadd(b, bases[k], imul(b, j, inner[k], IDX), IDX)
                    values.append(load_strided(ctx, op.elem, op.offset, first, inner[k], lanes))
            _store_all(ctx, outputs, compute(b, *values), iadd(b, out_base, j, IDX))

        if len(dims) == 1:
            span_vector_loop(ctx, start, stop, body, width=w)
        else:
            ctx.vector_loop(dims[-1], body, width=w)


def _store_all(ctx: EmitContext, outputs: Sequence[Output], result, index) -> None:
    results = [result] if len(outputs) == 1 else list(result)
    for out, value in zip(outputs, results):
        store_run(ctx, out.elem, out.offset, value, index)


def emit_modular(ctx: EmitContext, n: int, inputs: Sequence[tuple[Operand, int]], outputs: Sequence[Output],
                 compute: Compute, width: int | None = None) -> None:
    """outputs[i] = compute(b, *(input[i mod m])) — legacy indexing whose periods do not nest.

    Periods of 1 are splats and periods ≥ n contiguous; any other period gathers lanes
    `(i + lane) mod m` (a `urem` per element: only reached by odd shapes, see `legacy_walk`).
    """
    if n == 0:
        return
    w = width or lane_width(ctx, [op.elem for op, _ in inputs] + [o.elem for o in outputs])
    b = ctx.b
    scalars = {k: load_run(ctx, op.elem, op.offset, 0, 1) for k, (op, m) in enumerate(inputs) if m == 1}

    def body(i: ir.Value, lanes: int) -> None:
        values = []
        for k, (op, m) in enumerate(inputs):
            if m == 1:
                values.append(splat_value(b, scalars[k], lanes))
            elif m >= n:
                values.append(load_run(ctx, op.elem, op.offset, i, lanes))
            elif lanes == 1:
                values.append(load_run(ctx, op.elem, op.offset, b.urem(i, I64(m)), 1))
            else:
                idx = lane_index(b, i, lanes)
                values.append(load_gather(ctx, op.elem, op.offset, b.urem(idx, const(I64, m, lanes))))
        _store_all(ctx, outputs, compute(b, *values), i)

    ctx.vector_loop(n, body, width=w)


# ── BinaryFull: the three indexing paths as walks ───────────────────────────

@dataclass(frozen=True)
class WalkPlan:
    """A walk over `dims` with one stride vector per operand."""

    dims: tuple[int, ...]
    strides: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class ModularPlan:
    """Legacy indexing `i mod period` per operand that no walk expresses."""

    n: int
    periods: tuple[int, ...]


def legacy_walk(n: int, lhs_len: int, rhs_len: int) -> "WalkPlan | ModularPlan":
    """`l[i mod lhs_len] op r[i mod rhs_len]` (lengths ≥ 1) as a walk when the periods nest.

    A period ≥ n is the identity.  With periods p | q | n the index space is
    `[n/q, q/p, p]`: the long operand has strides `[0, p, 1]`, the short one `[0, 0, 1]`.
    """
    periods = [min(max(lhs_len, 1), n), min(max(rhs_len, 1), n)] if n else [1, 1]
    small, big = sorted(periods)
    if n == 0 or n % big or big % small:
        return ModularPlan(n, tuple(periods))
    dims = (n // big, big // small, small)
    strides = tuple((0, small, 1) if p == big else (0, 0, 1) for p in periods)
    return WalkPlan(dims, strides)


def binary_plan(t) -> "WalkPlan | ModularPlan":
    """Which of BinaryFull's three paths a thunk takes, as a walk (or the modular fallback)."""
    if t.lhs_len == t.rhs_len == t.len:
        return WalkPlan((t.len,), ((1,), (1,)))
    if t.out_dims_bcast:
        return WalkPlan(tuple(t.out_dims_bcast), (tuple(t.bcast_lhs_strides), tuple(t.bcast_rhs_strides)))
    return legacy_walk(t.len, t.lhs_len, t.rhs_len)


def emit_plan(ctx: EmitContext, plan: "WalkPlan | ModularPlan", inputs: Sequence[tuple[int, Elem]],
              out: Output, compute: Compute) -> None:
    """Run a plan over the given input slots."""
    if isinstance(plan, WalkPlan):
        ops = [Operand(off, elem, s) for (off, elem), s in zip(inputs, plan.strides)]
        emit_walk(ctx, plan.dims, ops, [out], compute)
    else:
        ops = [(Operand(off, elem, (1,)), m) for (off, elem), m in zip(inputs, plan.periods)]
        emit_modular(ctx, plan.n, ops, [out], compute)


def _check_bcast(t, lhs_len: int, rhs_len: int) -> None:
    """The stride walk stays inside each operand and describes exactly `len` outputs."""
    dims, ls, rs = t.out_dims_bcast, t.bcast_lhs_strides, t.bcast_rhs_strides
    if len(ls) != len(dims):
        raise ValidationError(f"bcast_lhs_strides has {len(ls)} entries but out_dims_bcast has {len(dims)}",
                              field="bcast_lhs_strides")
    if len(rs) != len(dims):
        raise ValidationError(f"bcast_rhs_strides has {len(rs)} entries but out_dims_bcast has {len(dims)}",
                              field="bcast_rhs_strides")
    if not dims:
        return
    if math.prod(dims) != t.len:
        raise ValidationError(f"out_dims_bcast {list(dims)} holds {math.prod(dims)} elements, not len = {t.len}",
                              field="out_dims_bcast")
    for name, strides, n in (("lhs", ls, lhs_len), ("rhs", rs, rhs_len)):
        top = max_walk_index(dims, strides)
        if top >= max(n, 1):  # lengths count as at least 1
            raise ValidationError(f"the broadcast walk reads {name} element {top}, but {name}_len = {n} "
                                  f"(indices must be < {max(n, 1)})", field=f"bcast_{name}_strides")


def _check_alias(dst: int, plan: "WalkPlan | ModularPlan", operands: Sequence[tuple[str, int]]) -> None:
    """An output may alias an input only where the input is read at the output's own index."""
    if not isinstance(plan, WalkPlan) or math.prod(plan.dims) == 0:
        return
    dims, sets = simplify_walk(plan.dims, plan.strides)
    for (name, off), strides in zip(operands, sets):
        if off == dst and strides != contiguous_strides(dims):
            raise ValidationError(f"dst aliases {name} but {name} is broadcast (strides {list(strides)}); "
                                  "in-place needs an identity walk", field="dst")


_C64_OPS = (BinaryOp.Add, BinaryOp.Sub, BinaryOp.Mul, BinaryOp.Div)


def check_binary_full(t) -> None:
    """elem_bytes 4 or 8; broadcast vectors agree; the walk stays inside lhs_len / rhs_len."""
    if t.elem_bytes not in (4, 8):  # a field of BinaryFull, a class constant of the F64/C64 variants
        raise ValidationError(f"elem_bytes must be 4 (f32) or 8 (i64), got {t.elem_bytes}", field="elem_bytes")
    _check_bcast(t, t.lhs_len, t.rhs_len)
    _check_alias(t.dst, binary_plan(t), (("lhs", t.lhs), ("rhs", t.rhs)))


def check_binary_full_c64(t) -> None:
    """BinaryFull's checks, and only Add/Sub/Mul/Div (Max/Min/Pow/… have no natural complex form)."""
    if t.op not in _C64_OPS:
        raise ValidationError(f"BinaryFullC64 supports Add/Sub/Mul/Div, not {t.op.name}", field="op")
    check_binary_full(t)


def _binary_thunk(ctx: EmitContext, t, elem: Elem, op: Compute) -> None:
    """Any BinaryFull variant: the thunk's plan, `op(b, l, r)` on `elem` elements."""
    emit_plan(ctx, binary_plan(t), [(t.lhs, elem), (t.rhs, elem)], Output(t.dst, elem), op)


@lowering(T.BinaryFull, check=check_binary_full, inplace=True)
def binary_full(ctx: EmitContext, t) -> None:
    """f32 (elem_bytes 4) or i64 (elem_bytes 8) element-wise binary with broadcast."""
    if t.elem_bytes == 8:
        _binary_thunk(ctx, t, I64_ELEM, lambda b, l, r: em.binary_i64(b, t.op, l, r))
    else:
        _binary_thunk(ctx, t, F32_ELEM, lambda b, l, r: em.binary(b, t.op, l, r))


@lowering(T.BinaryFullF64, check=check_binary_full, inplace=True)
def binary_full_f64(ctx: EmitContext, t) -> None:
    """f64 element-wise binary with broadcast."""
    _binary_thunk(ctx, t, F64_ELEM, lambda b, l, r: em.binary_f64(b, t.op, l, r))


@lowering(T.BinaryFullC64, check=check_binary_full_c64, inplace=True)
def binary_full_c64(ctx: EmitContext, t) -> None:
    """Complex (interleaved f32 pairs) element-wise binary with broadcast; strides in complex units."""
    _binary_thunk(ctx, t, C64_ELEM, lambda b, l, r: em.binary_c64(b, t.op, l, r))


# ── BiasAdd ─────────────────────────────────────────────────────────────────

@lowering(T.BiasAdd, inplace=True)
def bias_add(ctx: EmitContext, t) -> None:
    """dst[r, j] = src[r, j] + bias[j] over [m, n]."""
    add = lambda b, x, bias: em.binary(b, BinaryOp.Add, x, bias)  # noqa: E731
    emit_walk(ctx, (t.m, t.n), [Operand(t.src, F32_ELEM, (t.n, 1)), Operand(t.bias, F32_ELEM, (0, 1))],
              [Output(t.dst, F32_ELEM)], add)


# ── activations ─────────────────────────────────────────────────────────────

def _map(ctx: EmitContext, n: int, inputs: Sequence[tuple[int, Elem]], outputs: Sequence[Output],
         compute: Compute) -> None:
    """A one-axis walk: every input read at the output's index."""
    emit_walk(ctx, (n,), [Operand(off, elem, (1,)) for off, elem in inputs], outputs, compute)


@lowering(T.ActivationInPlace, inplace=True)
def activation_in_place(ctx: EmitContext, t) -> None:
    """data[i] = act(data[i]) in f32 (standalone semantics: Gelu is the erf form)."""
    _map(ctx, t.len, [(t.data, F32_ELEM)], [Output(t.data, F32_ELEM)],
         lambda b, x: em.activation(b, t.act, x, region=False))


F64_UNSUPPORTED = (Activation.Gelu, Activation.GeluApprox, Activation.Silu)
C64_SUPPORTED = (Activation.Neg, Activation.Exp, Activation.Log, Activation.Sqrt)


def check_activation_f64(t) -> None:
    """ActivationF64 has no Gelu / GeluApprox / Silu (RLX panics)."""
    if t.kind in F64_UNSUPPORTED:
        raise ValidationError(f"ActivationF64 does not support {t.kind.name} (no Gelu/GeluApprox/Silu)",
                              field="kind")


def check_activation_c64(t) -> None:
    """ActivationC64 supports only Neg, Exp, Log, Sqrt."""
    if t.kind not in C64_SUPPORTED:
        raise ValidationError(f"ActivationC64 supports Neg/Exp/Log/Sqrt, not {t.kind.name}", field="kind")


@lowering(T.ActivationF64, check=check_activation_f64, inplace=True)
def activation_f64(ctx: EmitContext, t) -> None:
    """dst[i] = kind(src[i]) in f64 (Round is ties-to-even)."""
    _map(ctx, t.len, [(t.src, F64_ELEM)], [Output(t.dst, F64_ELEM)],
         lambda b, x: em.activation_f64(b, t.kind, x))


@lowering(T.ActivationC64, check=check_activation_c64, inplace=True)
def activation_c64(ctx: EmitContext, t) -> None:
    """dst[i] = kind(src[i]) on complex elements."""
    _map(ctx, t.len, [(t.src, C64_ELEM)], [Output(t.dst, C64_ELEM)],
         lambda b, z: tuple(em.activation_c64(b, t.kind, z[0], z[1])))


# ── Compare ─────────────────────────────────────────────────────────────────

def compare_input_elem(t) -> Elem:
    """The input element of a Compare: i64 (`inputs_i64` or 8 bytes), Bool (1 byte) or f32 (4)."""
    if t.inputs_i64 or t.inputs_elem_bytes == 8:
        return I64_ELEM
    return BOOL_ELEM if t.inputs_elem_bytes == 1 else F32_ELEM


def compare_plan(t) -> WalkPlan:
    """The broadcast walk when `out_dims_bcast` is set, else flat with scalar operands as splats."""
    if t.out_dims_bcast:
        return WalkPlan(tuple(t.out_dims_bcast), (tuple(t.bcast_lhs_strides), tuple(t.bcast_rhs_strides)))
    return WalkPlan((t.len,), ((0,) if t.lhs_scalar else (1,), (0,) if t.rhs_scalar else (1,)))


def check_compare(t) -> None:
    """Input width 1/4/8 (unless `inputs_i64`, which means i64), output width 1 or 4, a walk inside
    lhs_len / rhs_len."""
    if not t.inputs_i64 and t.inputs_elem_bytes not in (1, 4, 8):
        raise ValidationError(f"inputs_elem_bytes must be 1 (Bool), 4 (f32) or 8 (i64), got "
                              f"{t.inputs_elem_bytes}", field="inputs_elem_bytes")
    if t.dst_elem_bytes not in (1, 4):
        raise ValidationError(f"dst_elem_bytes must be 1 (Bool) or 4 (f32), got {t.dst_elem_bytes}",
                              field="dst_elem_bytes")
    _check_bcast(t, t.lhs_len, t.rhs_len)
    _check_alias(t.dst, compare_plan(t), (("lhs", t.lhs), ("rhs", t.rhs)))


def compare_values(b: ir.IRBuilder, op: CmpOp, elem: Elem, l: ir.Value, r: ir.Value) -> ir.Value:
    """`l op r` as i1: IEEE for f32 (NaN is unequal to everything), signed for i64, unsigned bytes for Bool."""
    if elem is BOOL_ELEM:
        return b.icmp_unsigned(_CMP_PRED[op], l, r)
    return em.compare(b, op, l, r)


_CMP_PRED = {CmpOp.Eq: "==", CmpOp.Ne: "!=", CmpOp.Lt: "<", CmpOp.Le: "<=", CmpOp.Gt: ">", CmpOp.Ge: ">="}


def _bool_to(b: ir.IRBuilder, hit: ir.Value, elem: Elem) -> ir.Value:
    """An i1 as a 1-byte Bool (0/1) or an f32 0.0/1.0."""
    w = width_of(hit)
    if elem is BOOL_ELEM:
        return b.zext(hit, ir.VectorType(I8, w) if w > 1 else I8)
    return b.uitofp(hit, ir.VectorType(F32, w) if w > 1 else F32)


@lowering(T.Compare, check=check_compare, inplace=True)
def compare(ctx: EmitContext, t) -> None:
    """out[i] = (L(i) op R(i)) ? 1 : 0 as Bool or f32."""
    elem = compare_input_elem(t)
    out = BOOL_ELEM if t.dst_elem_bytes == 1 else F32_ELEM
    emit_plan(ctx, compare_plan(t), [(t.lhs, elem), (t.rhs, elem)], Output(t.dst, out),
              lambda b, l, r: _bool_to(b, compare_values(b, t.op, elem, l, r), out))


# ── Where ───────────────────────────────────────────────────────────────────

def check_where(t) -> None:
    """cond is 1-byte Bool or f32; data is 4 or 8 bytes."""
    if t.cond_elem_bytes not in (1, 4):
        raise ValidationError(f"cond_elem_bytes must be 1 (Bool) or 4 (f32), got {t.cond_elem_bytes}",
                              field="cond_elem_bytes")
    if t.elem_bytes not in (4, 8):
        raise ValidationError(f"elem_bytes must be 4 or 8, got {t.elem_bytes}", field="elem_bytes")


def truthy(b: ir.IRBuilder, cond: ir.Value) -> ir.Value:
    """cond != 0 as i1; for f32 unordered, so a NaN condition is true."""
    zero = ir.Constant(cond.type, None)
    if isinstance(cond.type, ir.VectorType) and cond.type.element == F32 or cond.type == F32:
        return b.fcmp_unordered("!=", cond, zero)
    return b.icmp_unsigned("!=", cond, zero)


@lowering(T.Where, check=check_where, inplace=True)
def where(ctx: EmitContext, t) -> None:
    """out[i] = cond(i) != 0 ? on_true(i) : on_false(i), a bit-exact select of 4- or 8-byte data."""
    cond = BOOL_ELEM if t.cond_elem_bytes == 1 else F32_ELEM
    data = I64_BITS if t.elem_bytes == 8 else I32_BITS
    stride = lambda scalar: (0,) if scalar else (1,)  # noqa: E731
    emit_walk(ctx, (t.len,), [Operand(t.cond, cond, stride(t.cond_scalar)),
                              Operand(t.on_true, data, stride(t.true_scalar)),
                              Operand(t.on_false, data, stride(t.false_scalar))],
              [Output(t.dst, data)], lambda b, c, x, y: b.select(truthy(b, c), x, y))


# ── Fma, SgdMomentum ────────────────────────────────────────────────────────

def check_fma(t) -> None:
    """elem_bytes 4 (f32) or 8 (f64)."""
    if t.elem_bytes not in (4, 8):
        raise ValidationError(f"elem_bytes must be 4 (f32) or 8 (f64), got {t.elem_bytes}", field="elem_bytes")


@lowering(T.Fma, check=check_fma, inplace=True)
def fma(ctx: EmitContext, t) -> None:
    """dst = a·b + c rounded once (`llvm.fma`)."""
    elem = F64_ELEM if t.elem_bytes == 8 else F32_ELEM

    def fused(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
        w = width_of(x)
        name = ("f64" if elem is F64_ELEM else "f32") if w == 1 else f"v{w}{'f64' if elem is F64_ELEM else 'f32'}"
        fn = ctx.intrinsic(f"llvm.fma.{name}", x.type, [x.type] * 3)
        return b.call(fn, [x, y, z])

    _map(ctx, t.len, [(t.a, elem), (t.b, elem), (t.c, elem)], [Output(t.dst, elem)], fused)


def f32_constant(value: float, like: ir.Value) -> ir.Constant:
    """`value` rounded to f32, shaped like `like`."""
    return const(F32, float(np.float32(value)), width_of(like))


@lowering(T.SgdMomentum, inplace=True)
def sgd_momentum(ctx: EmitContext, t) -> None:
    """v' = mom·v + g; p' = p − lr·v' in f32 (each operation rounded: no contraction)."""
    def step(b: ir.IRBuilder, p: ir.Value, v: ir.Value, g: ir.Value):
        v_new = b.fadd(b.fmul(f32_constant(t.mom, v), v), g)
        return b.fsub(p, b.fmul(f32_constant(t.lr, v), v_new)), v_new

    _map(ctx, t.len, [(t.param, F32_ELEM), (t.vel, F32_ELEM), (t.grad, F32_ELEM)],
         [Output(t.p_out, F32_ELEM), Output(t.v_out, F32_ELEM)], step)


# ── complex helpers ─────────────────────────────────────────────────────────

@lowering(T.ComplexNormSqF32)
def complex_norm_sq_f32(ctx: EmitContext, t) -> None:
    """dst[i] = re² + im² of the complex src[i]."""
    _map(ctx, t.len, [(t.src, C64_ELEM)], [Output(t.dst, F32_ELEM)],
         lambda b, z: b.fadd(b.fmul(z[0], z[0]), b.fmul(z[1], z[1])))


@lowering(T.ComplexNormSqBackwardF32, inplace=True)
def complex_norm_sq_backward_f32(ctx: EmitContext, t) -> None:
    """dz[i] = g[i]·z[i] (complex times real)."""
    _map(ctx, t.len, [(t.z, C64_ELEM), (t.g, F32_ELEM)], [Output(t.dz, C64_ELEM)],
         lambda b, z, g: (b.fmul(g, z[0]), b.fmul(g, z[1])))


@lowering(T.ConjugateC64, inplace=True)
def conjugate_c64(ctx: EmitContext, t) -> None:
    """dst[i] = (re, −im) (the sign bit of im flips, NaN included)."""
    _map(ctx, t.len, [(t.src, C64_ELEM)], [Output(t.dst, C64_ELEM)], lambda b, z: (z[0], b.fneg(z[1])))


# ── SplineActivation (KAN Gaussian-RBF spline) ──────────────────────────────

def spline_grid(grid_min: float, grid_max: float, num_basis: int) -> tuple[np.float32, np.float32, np.float32]:
    """`(gmin, step, inv_h)` in f32: `step = (gmax − gmin)/(nb − 1)` (1 when nb ≤ 1), `inv_h = 1/step`
    (inf when gmin = gmax; the reference uses the same values)."""
    gmin, gmax = np.float32(grid_min), np.float32(grid_max)
    with np.errstate(all="ignore"):
        step = (gmax - gmin) / np.float32(num_basis - 1) if num_basis > 1 else np.float32(1.0)
        return gmin, np.float32(step), np.float32(np.float32(1.0) / np.float32(step))


@lowering(T.SplineActivation, inplace=True)
def spline_activation(ctx: EmitContext, t) -> None:
    """`y[r, c] = Σ_g coeff[c, g]·exp(−((x[r, c] − center_g)·inv_h)²)`, `center_g = gmin + g·step`, all f32,
    g summed in order.  Channels are the vector lanes: `coeff` is transposed once into scratch
    (`[num_basis, channels]`, so each basis function's coefficients are a contiguous vector), then every
    row runs its channel vectors through the basis loop; rows split across threads."""
    rows, ch, nb = t.rows, t.channels, t.num_basis
    if not rows * ch:
        return
    gmin, step, inv_h = spline_grid(t.grid_min, t.grid_max, nb)
    table = ctx.scratch_alloc(4 * ch * nb)
    with ctx.for_range(0, ch, name="c") as c:
        with ctx.for_range(0, nb, name="g") as g:
            b = ctx.b
            v = ctx.load(t.coeff, F32, b.add(b.mul(c, I64(nb)), g))
            ctx.store(table, v, b.add(b.mul(g, I64(ch)), c), base=ctx.scratch)

    def body(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        with sub.for_range(start, stop, name="row") as r:
            base = b.mul(r, I64(ch))

            def channels(j: ir.Value, w: int) -> None:
                x = sub.load(t.x, F32, b.add(base, j), w)

                def basis(g: ir.Value, acc: list) -> list:
                    center = b.fadd(const(F32, float(gmin)), b.fmul(b.sitofp(g, F32), const(F32, float(step))))
                    d = b.fmul(b.fsub(x, splat(b, center, w)), const(F32, float(inv_h), w))
                    e = vm.exp(b, b.fneg(b.fmul(d, d)))
                    k = sub.load(table, F32, b.add(b.mul(g, I64(ch)), j), w, base=sub.shared)
                    return [b.fadd(acc[0], b.fmul(k, e))]
                (y,) = carried_loop(sub, 0, nb, 1, [const(F32, 0.0, w)], basis, name="basis")
                sub.store(t.dst, y, b.add(base, j))
            sub.vector_loop(ch, channels, name="chan")
    parallel_rows(ctx, rows, 8 * ch * max(nb, 1), body)
