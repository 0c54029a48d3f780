"""Control flow and user code: Nop, bounded scans and their backward, CustomFn bodies, CustomOp kernels
(semantics.md §3.10).

Scan and CustomFn bodies are nested `ThunkSchedule`s over their own private arenas; the extents
below are only the bytes these thunks read and write in the OUTER arena.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from .base import F32, Extent, Shape, Thunk, u8, u32, usize

if TYPE_CHECKING:  # resolved lazily: schedule.py imports this package
    from ..schedule import ThunkSchedule


class Nop(Thunk):
    """Skip (the value is already in the arena); `ThunkSchedule.strip_nops` removes these."""

    family = "control"


class Scan(Thunk):
    """Bounded scan: run `body` `length` times threading one carry, optionally saving the trajectory."""

    family = "control"
    outer_offset_at = {"xs_inputs": 1, "bcast_inputs": 1}  # (body_off, outer_off, bytes): the arena offset

    body: ThunkSchedule
    body_init: bytes
    body_input_off: usize
    body_output_off: usize
    outer_init_off: usize
    outer_final_off: usize
    length: u32
    carry_bytes: u32
    save_trajectory: bool
    xs_inputs: tuple[tuple[usize, usize, u32], ...]
    bcast_inputs: tuple[tuple[usize, usize, u32], ...]
    num_checkpoints: u32

    @property
    def saved_rows(self) -> int:
        """Carries written to the outer arena: the trajectory rows (K checkpoints or `length`), or 1."""
        if not self.save_trajectory:
            return 1
        k = self.num_checkpoints
        return k if 0 < k < self.length else self.length

    def _reads(self) -> Iterable[Extent]:
        yield self.span("outer_init_off", self.carry_bytes)
        for i, (_, outer, per_step) in enumerate(self.xs_inputs):
            yield Extent(f"xs_inputs[{i}]", outer, self.length * per_step)
        for i, (_, outer, total) in enumerate(self.bcast_inputs):
            yield Extent(f"bcast_inputs[{i}]", outer, total)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("outer_final_off", self.saved_rows * self.carry_bytes)


class _ScanGrad(Thunk):
    """Outer-arena reads shared by the scan backward thunks: init carry, trajectory, upstream, xs."""

    family = "control"

    @property
    def trajectory_rows(self) -> int:
        """Rows of the forward trajectory: K checkpoints when `0 < K < length`, else `length`."""
        k = self.num_checkpoints
        return k if 0 < k < self.length else self.length

    def _reads(self) -> Iterable[Extent]:
        yield self.span("outer_init_off", self.carry_bytes)
        yield self.span("outer_traj_off", self.trajectory_rows * self.carry_bytes)
        yield self.span("outer_upstream_off", (self.length if self.save_trajectory else 1) * self.carry_bytes)
        for i, (outer, per_step) in enumerate(self.outer_xs_offs):
            yield Extent(f"outer_xs_offs[{i}]", outer, self.length * per_step)


class ScanBackward(_ScanGrad):
    """Reverse-mode companion of Scan: walks `t = length−1 … 0` through `body_vjp`, writes `dinit`."""

    body_vjp: ThunkSchedule
    body_init: bytes
    body_carry_in_off: usize
    body_x_offs: tuple[usize, ...]
    body_d_output_off: usize
    body_dcarry_out_off: usize
    outer_init_off: usize
    outer_traj_off: usize
    outer_upstream_off: usize
    outer_xs_offs: tuple[tuple[usize, u32], ...]
    outer_dinit_off: usize
    length: u32
    carry_bytes: u32
    carry_elem_size: u32
    save_trajectory: bool
    num_checkpoints: u32
    forward_body: ThunkSchedule | None
    forward_body_init: bytes | None
    forward_body_carry_in_off: usize
    forward_body_output_off: usize
    forward_body_x_offs: tuple[usize, ...]

    def _writes(self) -> Iterable[Extent]:
        yield self.span("outer_dinit_off", self.carry_bytes)


class ScanBackwardXs(_ScanGrad):
    """Scan backward that stacks one `dxs` gradient: row `t` of `[length, per_step]` at `outer_dxs_off`."""

    body_vjp: ThunkSchedule
    body_init: bytes
    body_carry_in_off: usize
    body_x_offs: tuple[usize, ...]
    body_d_output_off: usize
    body_dcarry_out_off: usize
    body_dxs_out_off: usize
    outer_init_off: usize
    outer_traj_off: usize
    outer_upstream_off: usize
    outer_xs_offs: tuple[tuple[usize, u32], ...]
    outer_dxs_off: usize
    length: u32
    carry_bytes: u32
    carry_elem_size: u32
    per_step_bytes: u32
    save_trajectory: bool
    num_checkpoints: u32
    forward_body: ThunkSchedule | None
    forward_body_init: bytes | None
    forward_body_carry_in_off: usize
    forward_body_output_off: usize
    forward_body_x_offs: tuple[usize, ...]

    def _writes(self) -> Iterable[Extent]:
        yield self.span("outer_dxs_off", self.length * self.per_step_bytes)


class CustomFn(Thunk):
    """A user sub-graph: copy the `inputs` into a fresh body arena, run `body` once, copy `out_bytes` back."""

    family = "control"
    outer_offset_at = {"inputs": 1}  # (body_off, outer_off, bytes): the arena offset is second

    body: ThunkSchedule
    body_init: bytes
    inputs: tuple[tuple[usize, usize, u32], ...]
    body_output_off: usize
    outer_output_off: usize
    out_bytes: u32

    def _reads(self) -> Iterable[Extent]:
        for i, (_, outer, nbytes) in enumerate(self.inputs):
            yield Extent(f"inputs[{i}]", outer, nbytes)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("outer_output_off", self.out_bytes)


class CustomOp(Thunk):
    """A registered CPU kernel (named by `kernel`) over contiguous f32 `(offset, len, shape)` operands."""

    family = "control"

    kernel: str
    inputs: tuple[tuple[usize, u32, Shape], ...]
    output: tuple[usize, u32, Shape]
    attrs: tuple[u8, ...]

    def _reads(self) -> Iterable[Extent]:
        for i, (off, n, _) in enumerate(self.inputs):
            yield Extent(f"inputs[{i}]", off, F32 * n)

    def _writes(self) -> Iterable[Extent]:
        off, n, _ = self.output
        yield Extent("output", off, F32 * n)
