"""Examples of the nested-schedule kinds: a tanh RNN cell scanned over time (trajectory, checkpoints,
final carry only), its backward (full trajectory, and checkpoints recomputed by a forward body), and a
CustomFn — each body a small schedule of lowered kinds over its own arena."""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..ops import Activation, BinaryOp
from ..schedule import ThunkSchedule
from .layout import Example, example

H = 5                      # carry: 5 f32 (a vector tail at every width)
CARRY = 4 * H
H_AT, W_AT, X_AT, OUT_AT, D_AT = 0, 32, 64, 96, 128   # body arena slots, 32-byte aligned
WEIGHTS = np.linspace(-0.9, 0.8, H, dtype=np.float32)
INIT = bytes(W_AT) + WEIGHTS.tobytes()                # the body's constant: w at W_AT


def cell(tanh: bool = True) -> ThunkSchedule:
    """`out = tanh(h·w + x)` (or linear `h·w + x`) over the body arena."""
    thunks = [T.Fma(a=H_AT, b=W_AT, c=X_AT, dst=OUT_AT, len=H, elem_bytes=4)]
    if tanh:
        thunks.append(T.ActivationInPlace(data=OUT_AT, len=H, act=Activation.Tanh))
    return ThunkSchedule(thunks, arena_bytes=160)


def cell_vjp() -> ThunkSchedule:
    """Backward of the linear cell: `dh = dout·w` at OUT_AT, `dx = dout` at X_AT (dout at D_AT)."""
    mul = T.BinaryFull(lhs=D_AT, rhs=W_AT, dst=OUT_AT, len=H, lhs_len=H, rhs_len=H, op=BinaryOp.Mul,
                       out_dims_bcast=(), bcast_lhs_strides=(), bcast_rhs_strides=(), elem_bytes=4)
    return ThunkSchedule([mul, T.Copy(src=D_AT, dst=X_AT, len=H)], arena_bytes=160)


def scan(length: int, trajectory: bool, checkpoints: int = 0, tanh: bool = True) -> T.Scan:
    """A scan of the cell over `length` steps of xs `[length, H]`."""
    return T.Scan(body=cell(tanh), body_init=INIT, body_input_off=H_AT, body_output_off=OUT_AT, outer_init_off=0,
                  outer_final_off=0, length=length, carry_bytes=CARRY, save_trajectory=trajectory,
                  xs_inputs=((X_AT, 0, CARRY),), bcast_inputs=(), num_checkpoints=checkpoints)


def scan_backward(kind: type, length: int, checkpoints: int) -> "T.ScanBackward | T.ScanBackwardXs":
    """The backward of the linear cell's scan over `length` steps (trajectory upstream)."""
    common = dict(body_vjp=cell_vjp(), body_init=INIT, body_carry_in_off=H_AT, body_x_offs=(X_AT,),
                  body_d_output_off=D_AT, body_dcarry_out_off=OUT_AT, outer_init_off=0, outer_traj_off=0,
                  outer_upstream_off=0, outer_xs_offs=((0, CARRY),), length=length, carry_bytes=CARRY,
                  carry_elem_size=4, save_trajectory=True, num_checkpoints=checkpoints,
                  forward_body=cell(tanh=False), forward_body_init=INIT, forward_body_carry_in_off=H_AT,
                  forward_body_output_off=OUT_AT, forward_body_x_offs=(X_AT,))
    if kind is T.ScanBackwardXs:
        return T.ScanBackwardXs(**common, body_dxs_out_off=X_AT, outer_dxs_off=0, per_step_bytes=CARRY)
    return T.ScanBackward(**common, outer_dinit_off=0)


def control() -> list[Example]:
    """Scan (trajectory, checkpoints, final carry), ScanBackward(Xs) (trajectory, checkpoints), CustomFn."""
    fn = T.CustomFn(body=cell(), body_init=INIT, inputs=((H_AT, 0, CARRY), (X_AT, 0, CARRY)), body_output_off=OUT_AT,
                    outer_output_off=0, out_bytes=CARRY)
    return [
        example("Scan/trajectory7", scan(7, True)),
        example("Scan/checkpoints3of7", scan(7, True, 3)),
        example("Scan/final_carry", scan(6, False)),
        example("ScanBackward/trajectory", scan_backward(T.ScanBackward, 6, 0)),
        example("ScanBackward/checkpoints2of7", scan_backward(T.ScanBackward, 7, 2)),
        example("ScanBackwardXs/checkpoints3of8", scan_backward(T.ScanBackwardXs, 8, 3)),
        example("CustomFn/cell", fn),
    ]
