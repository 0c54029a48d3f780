"""Control flow with nested schedules: `Scan`, `ScanBackward`, `ScanBackwardXs`, `CustomFn`
(semantics.md §3.10; docs/lowering-control.md).

A body is a `ThunkSchedule` over its own arena.  It is compiled into the same module
(`EmitContext.nested_schedule`: `@t3_scan.body` runs `@t3_scan.body.t0_…`, …), and its private
arena and scratch live in the outer thunk's scratch, so the outer loop calls it natively: per step
only the slice copies and one call, no Python and no re-JIT.  A body's failing status is the
outer thunk's status.
"""
from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from .. import registry
from .. import thunks as T
from ..errors import UnsupportedThunkError, ValidationError
from ..registry import lowering
from .context import EmitContext
from .toolkit import F32, F64, I32, I64, I8, copy_bytes, counted_loop, fail_unless, for_range, zero_bytes


# ── validation ───────────────────────────────────────────────────────────────

def check_body(schedule, init: bytes | None, field: str, init_field: str) -> None:
    """The nested schedule validates (recursively, errors keep their path), runs natively, and its
    `init` image fits its arena."""
    from ..validate import validate_schedule
    try:
        validate_schedule(schedule, registry.LOWERINGS)
    except ValidationError as exc:
        raise ValidationError(f"body {exc}", field=field) from None
    except UnsupportedThunkError as exc:
        listed = ", ".join(f"thunk {i} {k}" for i, k in exc.missing)
        raise ValidationError(f"body {listed}: no lowering yet", field=field) from None
    for j, t in enumerate(schedule.thunks):
        if registry.LOWERINGS[type(t)].emit is None:
            raise ValidationError(f"body thunk {j} {type(t).__name__} runs as a "
                                  f"{registry.LOWERINGS[type(t)].path} fallback; bodies must be native",
                                  field=field)
    if init is not None and len(init) > schedule.arena_bytes:
        raise ValidationError(f"{len(init)} bytes do not fit the body arena of {schedule.arena_bytes} bytes",
                              field=init_field)


def check_slot(schedule, offset: int, nbytes: int, field: str, what: str) -> None:
    """Body bytes `[offset, offset + nbytes)` lie inside the body arena."""
    if offset + nbytes > schedule.arena_bytes:
        raise ValidationError(f"{what} [{offset}, {offset + nbytes}) lies outside the body arena of "
                              f"{schedule.arena_bytes} bytes", field=field)


def check_scan(t: T.Scan) -> None:
    """Body, carry slots and per-step / broadcast slots all inside the body arena."""
    check_body(t.body, t.body_init, "body", "body_init")
    check_slot(t.body, t.body_input_off, t.carry_bytes, "body_input_off", "the carry")
    check_slot(t.body, t.body_output_off, t.carry_bytes, "body_output_off", "the carry")
    for name, slots in (("xs_inputs", t.xs_inputs), ("bcast_inputs", t.bcast_inputs)):
        for i, (body_off, _, nbytes) in enumerate(slots):
            check_slot(t.body, body_off, nbytes, f"{name}[{i}]", "the slice")


def check_custom_fn(t: T.CustomFn) -> None:
    """Body, input slots and the output inside the body arena."""
    check_body(t.body, t.body_init, "body", "body_init")
    for i, (body_off, _, nbytes) in enumerate(t.inputs):
        check_slot(t.body, body_off, nbytes, f"inputs[{i}]", "the input")
    check_slot(t.body, t.body_output_off, t.out_bytes, "body_output_off", "the output")


def check_scan_backward(t: "T.ScanBackward | T.ScanBackwardXs") -> None:
    """The vjp body and its slots; the forward body when checkpoints make it needed; f32/f64 carries."""
    if t.carry_elem_size not in (4, 8) or t.carry_bytes % t.carry_elem_size:
        raise ValidationError(f"carry_elem_size must be 4 (f32) or 8 (f64) and divide carry_bytes = "
                              f"{t.carry_bytes}, got {t.carry_elem_size}", field="carry_elem_size")
    check_body(t.body_vjp, t.body_init, "body_vjp", "body_init")
    for field in ("body_carry_in_off", "body_d_output_off", "body_dcarry_out_off"):
        check_slot(t.body_vjp, getattr(t, field), t.carry_bytes, field, "the carry")
    if len(t.body_x_offs) != len(t.outer_xs_offs):
        raise ValidationError(f"{len(t.body_x_offs)} body slots for {len(t.outer_xs_offs)} outer xs",
                              field="body_x_offs")
    for i, (off, (_, per_step)) in enumerate(zip(t.body_x_offs, t.outer_xs_offs)):
        check_slot(t.body_vjp, off, per_step, f"body_x_offs[{i}]", "the xs slice")
    if isinstance(t, T.ScanBackwardXs):
        check_slot(t.body_vjp, t.body_dxs_out_off, t.per_step_bytes, "body_dxs_out_off", "the dxs slice")
    if not recomputes(t):
        return
    if t.forward_body is None:
        raise ValidationError(f"num_checkpoints = {t.num_checkpoints} < length = {t.length} needs a "
                              "forward_body to recompute the carries between checkpoints", field="forward_body")
    check_body(t.forward_body, t.forward_body_init, "forward_body", "forward_body_init")
    for field in ("forward_body_carry_in_off", "forward_body_output_off"):
        check_slot(t.forward_body, getattr(t, field), t.carry_bytes, field, "the carry")
    if len(t.forward_body_x_offs) != len(t.outer_xs_offs):
        raise ValidationError(f"{len(t.forward_body_x_offs)} forward body slots for {len(t.outer_xs_offs)} "
                              "outer xs", field="forward_body_x_offs")
    for i, (off, (_, per_step)) in enumerate(zip(t.forward_body_x_offs, t.outer_xs_offs)):
        check_slot(t.forward_body, off, per_step, f"forward_body_x_offs[{i}]", "the xs slice")


# ── a compiled body with its private arena ──────────────────────────────────

@dataclass
class Body:
    """A nested schedule compiled into the module; its arena and scratch lie in the thunk's scratch."""

    ctx: EmitContext
    run_fn: ir.Function
    arena: ir.Value
    scratch: ir.Value
    init: ir.GlobalVariable | None
    arena_bytes: int

    def at(self, offset: int, index: "ir.Value | int" = 0, size: int = 1) -> ir.Value:
        """Pointer to byte `offset + index·size` of the body arena."""
        return self.ctx.addr(offset, index, size, base=self.arena)

    def reset(self) -> None:
        """Clone the init image into the body arena; bytes past it start as zeros."""
        n = 0 if self.init is None else self.init.value_type.count
        if n:
            copy_bytes(self.ctx, self.arena, self.init, n)
        zero_bytes(self.ctx, self.at(n), self.arena_bytes - n)

    def run(self) -> None:
        """Run the body once; a failing status returns from the thunk."""
        status = self.ctx.b.call(self.run_fn, [self.arena, self.scratch])
        fail_unless(self.ctx, self.ctx.b.icmp_unsigned("==", status, I32(0)), status)


def open_body(ctx: EmitContext, schedule, init: bytes | None, name: str) -> Body:
    """Compile `schedule` as `@<thunk>.<name>` and reserve its arena and scratch."""
    run_fn, scratch_bytes = ctx.nested_schedule(schedule, name)
    arena_off = ctx.scratch_alloc(schedule.arena_bytes)
    scratch_off = ctx.scratch_alloc(scratch_bytes)
    image = None
    if init:
        ty = ir.ArrayType(I8, len(init))
        image = ir.GlobalVariable(ctx.module, ty, name=f"{ctx.fn.name}.{name}.init")
        image.global_constant, image.linkage = True, "private"
        image.initializer = ir.Constant(ty, bytearray(init))
    return Body(ctx, run_fn, ctx.addr(arena_off, base=ctx.scratch), ctx.addr(scratch_off, base=ctx.scratch),
                image, schedule.arena_bytes)


def copy(ctx: EmitContext, dst: ir.Value, src: ir.Value, nbytes: int) -> None:
    """`memcpy` of a constant number of bytes (nothing for 0)."""
    if nbytes:
        copy_bytes(ctx, dst, src, I64(nbytes))


# ── Scan ─────────────────────────────────────────────────────────────────────

def checkpoint_step(b: ir.IRBuilder, k: ir.Value, length: int, num: int) -> ir.Value:
    """The step whose carry is checkpoint row `k`: `min(ceil((k+1)·length/num) − 1, length − 1)`."""
    last = b.sub(b.udiv(b.add(b.mul(b.add(k, I64(1)), I64(length)), I64(num - 1)), I64(num)), I64(1))
    return b.select(b.icmp_unsigned("<", last, I64(length - 1)), last, I64(length - 1))


@lowering(T.Scan, check=check_scan)
def scan(ctx: EmitContext, t: T.Scan) -> None:
    """Carry in; broadcast slices once; per step: xs slices, the body, the trajectory row, carry out → in."""
    b, body = ctx.b, open_body(ctx, t.body, t.body_init, "body")
    body.reset()
    copy(ctx, body.at(t.body_input_off), ctx.addr(t.outer_init_off), t.carry_bytes)
    for body_off, outer, total in t.bcast_inputs:
        copy(ctx, body.at(body_off), ctx.addr(outer), total)
    checkpoints = t.save_trajectory and 0 < t.num_checkpoints < t.length
    with counted_loop(ctx, 0, t.length, 1, [I64(0)], name="step") as loop:
        step, (row,) = loop.index, loop.values
        for body_off, outer, per_step in t.xs_inputs:
            copy(ctx, body.at(body_off), ctx.addr(outer, step, per_step), per_step)
        body.run()
        if checkpoints:
            due = b.icmp_unsigned("==", step, checkpoint_step(b, row, t.length, t.num_checkpoints))
            with b.if_then(due):
                copy(ctx, ctx.addr(t.outer_final_off, row, t.carry_bytes), body.at(t.body_output_off), t.carry_bytes)
            row = b.add(row, b.zext(due, I64))
        elif t.save_trajectory:
            copy(ctx, ctx.addr(t.outer_final_off, step, t.carry_bytes), body.at(t.body_output_off), t.carry_bytes)
        if t.body_output_off != t.body_input_off:
            copy(ctx, body.at(t.body_input_off), body.at(t.body_output_off), t.carry_bytes)
        loop.carry([row])
    if not t.save_trajectory:
        copy(ctx, ctx.addr(t.outer_final_off), body.at(t.body_input_off), t.carry_bytes)


@lowering(T.CustomFn, check=check_custom_fn)
def custom_fn(ctx: EmitContext, t: T.CustomFn) -> None:
    """Fresh body arena, inputs copied in, the body once, `out_bytes` copied back."""
    body = open_body(ctx, t.body, t.body_init, "body")
    body.reset()
    for body_off, outer, nbytes in t.inputs:
        copy(ctx, body.at(body_off), ctx.addr(outer), nbytes)
    body.run()
    copy(ctx, ctx.addr(t.outer_output_off), body.at(t.body_output_off), t.out_bytes)


# ── Scan backward ────────────────────────────────────────────────────────────

def recomputes(t: "T.ScanBackward | T.ScanBackwardXs") -> bool:
    """Only checkpoints are saved, so the carries between them are recomputed with `forward_body`."""
    return 0 < t.num_checkpoints < t.length


def segment_starts(length: int, num: int) -> list[int]:
    """First step of each recompute segment: 0, then one past each checkpointed step."""
    steps = [min(-(-(k + 1) * length // num) - 1, length - 1) for k in range(num)]
    return [0] + [s + 1 for s in steps[:-1]]


def add_into(ctx: EmitContext, dst: ir.Value, src: ir.Value, nbytes: int, elem: int) -> None:
    """`dst[i] += src[i]` over `nbytes` of f32 (`elem` 4) or f64 (8) values."""
    b, ty = ctx.b, F32 if elem == 4 else F64
    with for_range(ctx, 0, nbytes // elem, name="acc") as i:
        at_dst = b.gep(dst, [i], source_etype=ty, inbounds=True)
        at_src = b.gep(src, [i], source_etype=ty, inbounds=True)
        b.store(b.fadd(b.load(at_dst, typ=ty), b.load(at_src, typ=ty)), at_dst)


@lowering(T.ScanBackward, T.ScanBackwardXs, check=check_scan_backward)
def scan_backward(ctx: EmitContext, t: "T.ScanBackward | T.ScanBackwardXs") -> None:
    """`dcarry` from the upstream; for t = length−1 … 0 the vjp body maps (carry_t, xs[t], dcarry) to the
    new dcarry (ScanBackwardXs also stores `dxs[t]`); ScanBackward writes `dinit = dcarry`.  Carries come from the trajectory, or — with
    checkpoints — are recomputed segment by segment with `forward_body` from the checkpoint before."""
    b, n = ctx.b, t.carry_bytes
    vjp = open_body(ctx, t.body_vjp, t.body_init, "vjp")
    dcarry = ctx.addr(ctx.scratch_alloc(n), base=ctx.scratch)
    vjp.reset()
    if t.save_trajectory:
        zero_bytes(ctx, dcarry, n)
    else:
        copy(ctx, dcarry, ctx.addr(t.outer_upstream_off), n)

    def backward_step(step: ir.Value, carry: ir.Value) -> None:
        if t.save_trajectory:
            add_into(ctx, dcarry, ctx.addr(t.outer_upstream_off, step, n), n, t.carry_elem_size)
        copy(ctx, vjp.at(t.body_carry_in_off), carry, n)
        for body_off, (outer, per_step) in zip(t.body_x_offs, t.outer_xs_offs):
            copy(ctx, vjp.at(body_off), ctx.addr(outer, step, per_step), per_step)
        copy(ctx, vjp.at(t.body_d_output_off), dcarry, n)
        vjp.run()
        copy(ctx, dcarry, vjp.at(t.body_dcarry_out_off), n)
        if isinstance(t, T.ScanBackwardXs):
            copy(ctx, ctx.addr(t.outer_dxs_off, step, t.per_step_bytes), vjp.at(t.body_dxs_out_off),
                 t.per_step_bytes)

    def carry_before(step: ir.Value) -> ir.Value:
        """The carry going into `step`: the init for step 0, else trajectory row `step − 1`."""
        first = b.icmp_unsigned("==", step, I64(0))
        row = b.select(first, I64(0), b.sub(step, I64(1)))
        return b.select(first, ctx.addr(t.outer_init_off), ctx.addr(t.outer_traj_off, row, n))

    if not recomputes(t):
        with for_range(ctx, 0, t.length, name="back") as r:
            step = b.sub(I64(t.length - 1), r)
            backward_step(step, carry_before(step))
    else:
        recompute_backward(ctx, t, backward_step)
    if isinstance(t, T.ScanBackward):
        copy(ctx, ctx.addr(t.outer_dinit_off), dcarry, n)


def recompute_backward(ctx: EmitContext, t, backward_step) -> None:
    """Segments `[start_k, start_k+1)` in reverse: rebuild the segment's carries from the checkpoint
    before it with `forward_body` (into a buffer of the longest segment), then step back through it."""
    b, n = ctx.b, t.carry_bytes
    starts = segment_starts(t.length, t.num_checkpoints)
    bounds = list(zip(starts, starts[1:] + [t.length]))
    longest = max(stop - start for start, stop in bounds)
    fwd = open_body(ctx, t.forward_body, t.forward_body_init, "forward")
    carries = ctx.addr(ctx.scratch_alloc(longest * n), base=ctx.scratch)
    table_ty = ir.ArrayType(I64, 2 * len(bounds))
    table = ir.GlobalVariable(ctx.module, table_ty, name=f"{ctx.fn.name}.segments")
    table.global_constant, table.linkage = True, "private"
    table.initializer = ir.Constant(table_ty, [v for pair in bounds for v in pair])
    fwd.reset()
    with for_range(ctx, 0, len(bounds), name="segment") as r:
        k = b.sub(I64(len(bounds) - 1), r)
        start = b.load(b.gep(table, [I64(0), b.mul(k, I64(2))], inbounds=True), typ=I64)
        stop = b.load(b.gep(table, [I64(0), b.add(b.mul(k, I64(2)), I64(1))], inbounds=True), typ=I64)
        first = b.icmp_unsigned("==", k, I64(0))
        row = b.select(first, I64(0), b.sub(k, I64(1)))
        copy(ctx, carries, b.select(first, ctx.addr(t.outer_init_off), ctx.addr(t.outer_traj_off, row, n)), n)
        with for_range(ctx, b.add(start, I64(1)), stop, name="redo") as step:
            prev = b.sub(step, I64(1))
            copy(ctx, fwd.at(t.forward_body_carry_in_off), ctx.addr(0, b.sub(prev, start), n, base=carries), n)
            for body_off, (outer, per_step) in zip(t.forward_body_x_offs, t.outer_xs_offs):
                copy(ctx, fwd.at(body_off), ctx.addr(outer, prev, per_step), per_step)
            fwd.run()
            copy(ctx, ctx.addr(0, b.sub(step, start), n, base=carries), fwd.at(t.forward_body_output_off), n)
        with for_range(ctx, 0, b.sub(stop, start), name="back") as back:
            step = b.sub(b.sub(stop, I64(1)), back)
            backward_step(step, ctx.addr(0, b.sub(step, start), n, base=carries))
