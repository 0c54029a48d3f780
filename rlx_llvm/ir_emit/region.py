"""ElementwiseRegion: a fused chain of scalar steps, one pass over memory (semantics.md §2.10).

Per output element `gid`, each step reads external inputs (a scalar input reads element 0, a
tiled one element `gid mod input_modulus[i]`) or earlier steps' results, computes in f32, and the
last step is stored in `out_lane`.  The loop is an explicit `<W x float>` main loop plus a scalar
tail; every step is the same elementmath rule for both, so the tail cannot disagree with the body.
"""
from __future__ import annotations

from llvmlite import ir

from .. import thunks as T
from ..dtypes import DType
from ..errors import ValidationError
from ..ops import ChainOperand, ChainStep
from . import elementmath as em
from .context import EmitContext
from .rows import parallel_elements
from .toolkit import F32, I32, I64, STORAGE, narrow_from_f32, splat, widen_to_f32
from ..registry import lowering

MAX_INPUTS, MAX_STEPS = 16, 32


def check_region(t) -> None:
    """Operands refer to existing inputs / earlier steps; moduli divide len; ≤16 inputs, ≤32 steps."""
    n_in = len(t.input_offs)
    if n_in > MAX_INPUTS:
        raise ValidationError(f"{n_in} inputs; a region takes at most {MAX_INPUTS}", field="input_offs")
    if len(t.chain) > MAX_STEPS:
        raise ValidationError(f"{len(t.chain)} steps; a region takes at most {MAX_STEPS}", field="chain")
    if t.scalar_input_mask >> n_in:
        raise ValidationError(f"scalar_input_mask 0x{t.scalar_input_mask:x} flags inputs beyond the "
                              f"{n_in} given", field="scalar_input_mask")
    for i, m in enumerate(t.input_modulus[:n_in]):
        if m and t.len % m:
            raise ValidationError(f"input_modulus[{i}] = {m} does not divide len = {t.len}",
                                  field="input_modulus")
    for k, step in enumerate(t.chain):
        if not isinstance(step, ChainStep):
            raise ValidationError(f"chain[{k}] is not a ChainStep: {step!r}", field="chain")
        for op in _operands(step):
            if not isinstance(op, ChainOperand) or not isinstance(op.index, int):
                raise ValidationError(f"chain[{k}] has a bad operand {op!r}", field="chain")
            if isinstance(op, ChainOperand.Input) and not 0 <= op.index < n_in:
                raise ValidationError(f"chain[{k}] reads Input({op.index}) but the region has {n_in} "
                                      "inputs", field="chain")
            if isinstance(op, ChainOperand.Step) and not 0 <= op.index < k:
                raise ValidationError(f"chain[{k}] reads Step({op.index}), which is not an earlier step",
                                      field="chain")


def _operands(step) -> tuple:
    if isinstance(step, (ChainStep.Activation, ChainStep.Cast)):
        return (step.x,)
    if isinstance(step, (ChainStep.Binary, ChainStep.Compare)):
        return (step.lhs, step.rhs)
    return (step.cond, step.on_true, step.on_false)


@lowering(T.ElementwiseRegion, check=check_region, inplace=True)
def elementwise_region(ctx: EmitContext, t) -> None:
    """Emit the fused chain as one vector loop over `len` output elements, split across threads
    when it moves enough bytes (`rows.parallel_elements`)."""
    if t.len == 0 or not t.chain:
        return
    streaming = ctx.streams(t.dst, t.out_lane.itemsize, t.len)
    scalar_ids = [i for i in range(len(t.input_offs)) if t.scalar_input_mask >> i & 1]
    scalars_of: dict[EmitContext, dict] = {}  # per function (caller or split body): loaded once

    def body(sub: EmitContext, gid: ir.Value, w: int) -> None:
        if sub not in scalars_of:
            with sub.b.goto_entry_block():
                scalars_of[sub] = {i: sub.load_lane(t.in_lanes[i], t.input_offs[i], 0) for i in scalar_ids}
        scalars, inputs = scalars_of[sub], {}

        def read(op) -> ir.Value:
            if isinstance(op, ChainOperand.Step):
                return regs[op.index]
            i = op.index
            if i not in inputs:
                inputs[i] = _read_input(sub, t, i, gid, w, scalars)
            return inputs[i]

        regs: list[ir.Value] = []
        for step in t.chain:
            regs.append(_step(sub.b, step, read))
        sub.store_lane(t.out_lane, t.dst, regs[-1], gid, streaming=streaming)

    parallel_elements(ctx, t.len, _bytes_per_element(t), body)


def _bytes_per_element(t) -> int:
    """Bytes a region moves per output element (scalar and tiled inputs stay in cache)."""
    streamed = [t.in_lanes[i] for i in range(len(t.input_offs))
                if not (t.scalar_input_mask >> i & 1) and t.input_modulus[i] in (0, t.len)]
    return t.out_lane.itemsize + sum(lane.itemsize for lane in streamed)


def _read_input(ctx: EmitContext, t, i: int, gid: ir.Value, w: int, scalars: dict) -> ir.Value:
    b, lane, off = ctx.b, t.in_lanes[i], t.input_offs[i]
    if i in scalars:
        return splat(b, scalars[i], w)
    m = t.input_modulus[i]
    if not m or m == t.len:
        return ctx.load_lane(lane, off, gid, w)
    row = b.urem(gid, I64(m))
    if w == 1 or m % w == 0:
        # gid is a multiple of w in the vector loop and w divides m: the w lanes are contiguous.
        return ctx.load_lane(lane, off, row, w)
    return _gather_lanes(ctx, lane, off, gid, m, w)


def _gather_lanes(ctx: EmitContext, lane, off: int, gid: ir.Value, m: int, w: int) -> ir.Value:
    """Tiled input whose period is not a multiple of W: lanes (gid + j) mod m, one load each.

    (llvmlite builds no vector GEPs, so there is no vector of pointers for `llvm.masked.gather`;
    LLVM's SLP vectorizer may still merge these loads.)
    """
    b = ctx.b
    storage = STORAGE[lane.dtype]
    raw = ir.Constant(ir.VectorType(storage, w), None)
    for j in range(w):
        row = b.urem(b.add(gid, I64(j)), I64(m))
        raw = b.insert_element(raw, ctx.load(off, storage, row), I32(j))
    return widen_to_f32(b, lane.dtype, raw)


def _step(b: ir.IRBuilder, step, read) -> ir.Value:
    if isinstance(step, ChainStep.Activation):
        return em.activation(b, step.act, read(step.x), region=True)
    if isinstance(step, ChainStep.Cast):
        return region_cast(b, step.dtype, read(step.x))
    if isinstance(step, ChainStep.Binary):
        return em.binary(b, step.op, read(step.lhs), read(step.rhs))
    if isinstance(step, ChainStep.Compare):
        hit = em.compare(b, step.op, read(step.lhs), read(step.rhs))
        return b.uitofp(hit, _f32_like(hit))
    cond = read(step.cond)
    truthy = b.fcmp_unordered("!=", cond, ir.Constant(cond.type, None))  # NaN is truthy
    return b.select(truthy, read(step.on_true), read(step.on_false))


def _f32_like(v: ir.Value) -> ir.Type:
    return ir.VectorType(F32, v.type.count) if isinstance(v.type, ir.VectorType) else F32


_INT_BITS = {DType.I8: (8, True), DType.I16: (16, True), DType.I32: (32, True), DType.I64: (64, True),
             DType.U8: (8, False), DType.U32: (32, False)}


def region_cast(b: ir.IRBuilder, dtype: DType, x: ir.Value) -> ir.Value:
    """Mid-chain Cast: halves round-trip (RNE), ints `v as iN as f32` (saturating), Bool → 0/1."""
    if dtype in (DType.F32, DType.F64, DType.C64, DType.C128):
        return x
    if dtype in (DType.F16, DType.BF16):
        return widen_to_f32(b, dtype, narrow_from_f32(b, dtype, x))
    if dtype is DType.Bool:
        nz = b.fcmp_unordered("!=", x, ir.Constant(x.type, None))
        return b.uitofp(nz, x.type)
    bits, signed = _INT_BITS[dtype]
    as_int = em.f32_to_int_sat(b, x, bits, signed)
    return b.sitofp(as_int, x.type) if signed else b.uitofp(as_int, x.type)
