"""NumPy references of the nested-schedule kinds: Scan, ScanBackward(Xs), CustomFn (semantics.md §3.10).

Bodies run through `rlx_llvm.reference.run` on a private NumPy arena, step by step, exactly as the
spec reads; the checkpointed backward recomputes each carry from the nearest checkpoint before it
(quadratic, but plainly right — the native code does it segment by segment)."""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from . import reference, run


def body_arena(schedule, init: bytes | None) -> np.ndarray:
    """A fresh body arena: the init image, then zeros."""
    arena = np.zeros(schedule.arena_bytes, np.uint8)
    image = np.frombuffer(init or b"", np.uint8)
    arena[:image.size] = image
    return arena


def put(dst: np.ndarray, at: int, src: np.ndarray, src_at: int, nbytes: int) -> None:
    """Copy `nbytes` bytes."""
    dst[at:at + nbytes] = src[src_at:src_at + nbytes]


def checkpoint_steps(length: int, num: int) -> list[int]:
    """Steps whose carries the checkpoint rows hold: `min(ceil((k+1)·length/num) − 1, length − 1)`."""
    return [min(-(-(k + 1) * length // num) - 1, length - 1) for k in range(num)]


@reference(T.Scan)
def scan(arena: np.ndarray, t: T.Scan) -> None:
    body, n = body_arena(t.body, t.body_init), t.carry_bytes
    put(body, t.body_input_off, arena, t.outer_init_off, n)
    for body_off, outer, total in t.bcast_inputs:
        put(body, body_off, arena, outer, total)
    rows = (checkpoint_steps(t.length, t.num_checkpoints) if 0 < t.num_checkpoints < t.length
            else range(t.length)) if t.save_trajectory else []
    row_of = {step: k for k, step in enumerate(rows)}
    for step in range(t.length):
        for body_off, outer, per_step in t.xs_inputs:
            put(body, body_off, arena, outer + step * per_step, per_step)
        run(t.body, body)
        if step in row_of:
            put(arena, t.outer_final_off + row_of[step] * n, body, t.body_output_off, n)
        put(body, t.body_input_off, body.copy(), t.body_output_off, n)
    if not t.save_trajectory:
        put(arena, t.outer_final_off, body, t.body_input_off, n)


@reference(T.CustomFn)
def custom_fn(arena: np.ndarray, t: T.CustomFn) -> None:
    body = body_arena(t.body, t.body_init)
    for body_off, outer, nbytes in t.inputs:
        put(body, body_off, arena, outer, nbytes)
    run(t.body, body)
    put(arena, t.outer_output_off, body, t.body_output_off, t.out_bytes)


def carry_into(arena: np.ndarray, t, step: int) -> np.ndarray:
    """The carry going into `step` (a copy): from the trajectory, or recomputed from the last checkpoint."""
    n = t.carry_bytes
    if not 0 < t.num_checkpoints < t.length:
        src = t.outer_init_off if step == 0 else t.outer_traj_off + (step - 1) * n
        return arena[src:src + n].copy()
    saved = [-1] + checkpoint_steps(t.length, t.num_checkpoints)   # carry after step s, for s in saved
    k = max(i for i, s in enumerate(saved) if s < step)
    src = t.outer_init_off if k == 0 else t.outer_traj_off + (k - 1) * n
    carry = arena[src:src + n].copy()
    body = body_arena(t.forward_body, t.forward_body_init)
    for s in range(saved[k] + 1, step):
        body[t.forward_body_carry_in_off:t.forward_body_carry_in_off + n] = carry
        for body_off, (outer, per_step) in zip(t.forward_body_x_offs, t.outer_xs_offs):
            put(body, body_off, arena, outer + s * per_step, per_step)
        run(t.forward_body, body)
        carry = body[t.forward_body_output_off:t.forward_body_output_off + n].copy()
    return carry


@reference(T.ScanBackward, T.ScanBackwardXs)
def scan_backward(arena: np.ndarray, t) -> None:
    n, dtype = t.carry_bytes, np.float32 if t.carry_elem_size == 4 else np.float64
    vjp = body_arena(t.body_vjp, t.body_init)
    dcarry = (np.zeros(n, np.uint8) if t.save_trajectory
              else arena[t.outer_upstream_off:t.outer_upstream_off + n].copy())
    for step in reversed(range(t.length)):
        if t.save_trajectory:
            upstream = arena[t.outer_upstream_off + step * n:t.outer_upstream_off + (step + 1) * n]
            dcarry = (dcarry.view(dtype) + upstream.view(dtype)).astype(dtype).view(np.uint8)
        vjp[t.body_carry_in_off:t.body_carry_in_off + n] = carry_into(arena, t, step)
        for body_off, (outer, per_step) in zip(t.body_x_offs, t.outer_xs_offs):
            put(vjp, body_off, arena, outer + step * per_step, per_step)
        vjp[t.body_d_output_off:t.body_d_output_off + n] = dcarry
        run(t.body_vjp, vjp)
        dcarry = vjp[t.body_dcarry_out_off:t.body_dcarry_out_off + n].copy()
        if isinstance(t, T.ScanBackwardXs):
            put(arena, t.outer_dxs_off + step * t.per_step_bytes, vjp, t.body_dxs_out_off, t.per_step_bytes)
    if isinstance(t, T.ScanBackward):
        arena[t.outer_dinit_off:t.outer_dinit_off + n] = dcarry
