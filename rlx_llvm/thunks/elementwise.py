"""Element-wise thunks: the fused region, broadcast binaries, activations, compare/select, complex
helpers (semantics.md §2.10, §3.1, §3.12)."""
from __future__ import annotations

from typing import Iterable

from ..dtypes import LaneKind
from ..errors import ValidationError
from ..ops import Activation, BinaryOp, ChainStep, CmpOp
from .base import (C64, F32, F64, U32x16, Extent, Thunk, _Unary, f32, u8, u32, usize, walked)


class ElementwiseRegion(Thunk):
    """A fused element-wise chain: one pass computes every scalar step per output element, in f32."""

    family = "elementwise"

    dst: usize
    len: u32
    input_offs: tuple[usize, ...]
    chain: tuple[ChainStep, ...]
    scalar_input_mask: u32 = 0
    input_modulus: U32x16 = (0,) * 16
    in_lanes: tuple[LaneKind, ...] = ()
    out_lane: LaneKind = LaneKind.F32

    def __post_init__(self) -> None:
        """Pad `input_modulus` to 16 entries; an empty `in_lanes` means an F32 lane per input."""
        super().__post_init__()
        modulus = self.input_modulus
        if isinstance(modulus, tuple) and len(modulus) < 16:
            object.__setattr__(self, "input_modulus", modulus + (0,) * (16 - len(modulus)))
        if self.in_lanes == () and isinstance(self.input_offs, tuple):
            object.__setattr__(self, "in_lanes", (LaneKind.F32,) * len(self.input_offs))

    def check_fields(self) -> None:
        """The generic checks, plus `in_lanes` parallel to `input_offs`."""
        super().check_fields()
        if len(self.in_lanes) != len(self.input_offs):
            raise ValidationError(f"in_lanes has {len(self.in_lanes)} entries for {len(self.input_offs)} inputs",
                                  kind=self.kind_name, field="in_lanes")

    def input_elems(self, i: int) -> int:
        """Lanes input `i` is read at: 1 if scalar, its broadcast period if tiled, else `len`."""
        if self.scalar_input_mask >> i & 1:
            return 1
        if i < len(self.input_modulus) and self.input_modulus[i]:
            return self.input_modulus[i]
        return self.len

    def _reads(self) -> Iterable[Extent]:
        if not (self.len and self.chain):  # RLX: len 0 or an empty chain is a no-op
            return
        for i, off in enumerate(self.input_offs):
            lane = self.in_lanes[i] if i < len(self.in_lanes) else LaneKind.F32
            yield Extent(f"input_offs[{i}]", off, self.input_elems(i) * lane.itemsize)

    def _writes(self) -> Iterable[Extent]:
        if self.chain:
            yield self.span("dst", self.len * self.out_lane.itemsize)


class _Broadcast(Thunk):
    """BinaryFull's three indexing paths: equal lengths, a stride walk over `out_dims_bcast`, or `i mod n`."""

    family = "elementwise"
    # `elem_bytes`: a field of BinaryFull, a class constant of the F64 / C64 twins (no ClassVar
    # annotation here: it would pin the field to the front of BinaryFull's field order).

    def operand_elems(self, n: int, strides: tuple[int, ...]) -> int:
        """Elements read from an operand of `n` elements (lengths count as at least 1)."""
        if not self.len:
            return 0
        if self.lhs_len == self.rhs_len == self.len:
            return self.len
        if self.out_dims_bcast:
            return walked(self.out_dims_bcast, strides)
        return min(max(n, 1), self.len)

    def _reads(self) -> Iterable[Extent]:
        yield self.span("lhs", self.elem_bytes * self.operand_elems(self.lhs_len, self.bcast_lhs_strides))
        yield self.span("rhs", self.elem_bytes * self.operand_elems(self.rhs_len, self.bcast_rhs_strides))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", self.elem_bytes * self.len)


class BinaryFull(_Broadcast):
    """Element-wise binary op with NumPy-style broadcast on f32 (`elem_bytes` 4) or i64 (8) lanes."""

    lhs: usize
    rhs: usize
    dst: usize
    len: u32
    lhs_len: u32
    rhs_len: u32
    op: BinaryOp
    out_dims_bcast: tuple[u32, ...]
    bcast_lhs_strides: tuple[u32, ...]
    bcast_rhs_strides: tuple[u32, ...]
    elem_bytes: u8


class BinaryFullF64(_Broadcast):
    """f64 element-wise binary with broadcast (BinaryFull at 8 bytes per element)."""

    lhs: usize
    rhs: usize
    dst: usize
    len: u32
    lhs_len: u32
    rhs_len: u32
    op: BinaryOp
    out_dims_bcast: tuple[u32, ...]
    bcast_lhs_strides: tuple[u32, ...]
    bcast_rhs_strides: tuple[u32, ...]
    elem_bytes = F64


class BinaryFullC64(_Broadcast):
    """Complex (C64) element-wise binary with broadcast; lengths and strides count complex elements."""

    lhs: usize
    rhs: usize
    dst: usize
    len: u32
    lhs_len: u32
    rhs_len: u32
    op: BinaryOp
    out_dims_bcast: tuple[u32, ...]
    bcast_lhs_strides: tuple[u32, ...]
    bcast_rhs_strides: tuple[u32, ...]
    elem_bytes = C64


class BiasAdd(Thunk):
    """`dst[r, j] = src[r, j] + bias[j]` over `[m, n]`."""

    family = "elementwise"

    src: usize
    bias: usize
    dst: usize
    m: u32
    n: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.m * self.n)
        yield self.span("bias", F32 * self.n)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.m * self.n)


class ActivationInPlace(Thunk):
    """`data[i] = act(data[i])` on `len` f32 elements, in place."""

    family = "elementwise"

    data: usize
    len: u32
    act: Activation

    def _reads(self) -> Iterable[Extent]:
        yield self.span("data", F32 * self.len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("data", F32 * self.len)


class ActivationF64(_Unary):
    """f64 element-wise activation `dst = kind(src)`."""

    family = "elementwise"
    src_bytes = dst_bytes = F64

    kind: Activation


class ActivationC64(_Unary):
    """C64 element-wise activation (Neg, Exp, Log, Sqrt); `len` counts complex elements."""

    family = "elementwise"
    src_bytes = dst_bytes = C64

    kind: Activation


class ComplexNormSqF32(_Unary):
    """`dst = |z|² = re² + im²` from C64 `src` to f32 `dst`."""

    family = "elementwise"
    src_bytes, dst_bytes = C64, F32


class ComplexNormSqBackwardF32(Thunk):
    """Wirtinger backward of ComplexNormSqF32: `dz = g·z` (C64 out)."""

    family = "elementwise"

    z: usize
    g: usize
    dz: usize
    len: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("z", C64 * self.len)
        yield self.span("g", F32 * self.len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dz", C64 * self.len)


class ConjugateC64(_Unary):
    """Element-wise C64 conjugate `(re, −im)`."""

    family = "elementwise"
    src_bytes = dst_bytes = C64


class Compare(Thunk):
    """`dst[i] = lhs CMP rhs ? 1 : 0`, written as a 1-byte Bool or an f32."""

    family = "elementwise"

    lhs: usize
    rhs: usize
    dst: usize
    len: u32
    op: CmpOp
    inputs_i64: u8
    inputs_elem_bytes: u8
    dst_elem_bytes: u8
    lhs_scalar: bool
    rhs_scalar: bool
    lhs_len: u32
    rhs_len: u32
    out_dims_bcast: tuple[u32, ...]
    bcast_lhs_strides: tuple[u32, ...]
    bcast_rhs_strides: tuple[u32, ...]

    @property
    def input_bytes(self) -> int:
        """Bytes per input element: 8 for i64, else `inputs_elem_bytes`."""
        return 8 if self.inputs_i64 else self.inputs_elem_bytes

    def operand_elems(self, scalar: bool, strides: tuple[int, ...]) -> int:
        """Elements read from one operand: the stride walk if given, else 1 (scalar) or `len`."""
        if not self.len:
            return 0
        if self.out_dims_bcast:
            return walked(self.out_dims_bcast, strides)
        return 1 if scalar else self.len

    def _reads(self) -> Iterable[Extent]:
        yield self.span("lhs", self.input_bytes * self.operand_elems(self.lhs_scalar, self.bcast_lhs_strides))
        yield self.span("rhs", self.input_bytes * self.operand_elems(self.rhs_scalar, self.bcast_rhs_strides))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", self.dst_elem_bytes * self.len)


class Where(Thunk):
    """`dst[i] = cond[i] != 0 ? on_true[i] : on_false[i]`; a `*_scalar` operand is read at element 0."""

    family = "elementwise"

    cond: usize
    on_true: usize
    on_false: usize
    dst: usize
    len: u32
    elem_bytes: u8
    cond_elem_bytes: u8
    cond_scalar: bool
    true_scalar: bool
    false_scalar: bool

    def _elems(self, scalar: bool) -> int:
        return min(1, self.len) if scalar else self.len

    def _reads(self) -> Iterable[Extent]:
        yield self.span("cond", self.cond_elem_bytes * self._elems(self.cond_scalar))
        yield self.span("on_true", self.elem_bytes * self._elems(self.true_scalar))
        yield self.span("on_false", self.elem_bytes * self._elems(self.false_scalar))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", self.elem_bytes * self.len)


class Fma(Thunk):
    """Single-rounded fused multiply-add `dst = a·b + c` on 4- or 8-byte floats."""

    family = "elementwise"

    a: usize
    b: usize
    c: usize
    dst: usize
    len: u32
    elem_bytes: u8

    def _reads(self) -> Iterable[Extent]:
        for name in ("a", "b", "c"):
            yield self.span(name, self.elem_bytes * self.len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", self.elem_bytes * self.len)


class SgdMomentum(Thunk):
    """Fused SGD-with-momentum update: `v' = mom·v + g; p' = p − lr·v'`."""

    family = "elementwise"

    param: usize
    vel: usize
    grad: usize
    p_out: usize
    v_out: usize
    lr: f32
    mom: f32
    len: u32

    def _reads(self) -> Iterable[Extent]:
        for name in ("param", "vel", "grad"):
            yield self.span(name, F32 * self.len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("p_out", F32 * self.len)
        yield self.span("v_out", F32 * self.len)


class SplineActivation(Thunk):
    """KAN Gaussian-RBF spline activation: `y[r, c] = Σ_g coeff[c, g]·exp(−((x[r, c] − center_g)·inv_h)²)`."""

    family = "elementwise"

    x: usize
    coeff: usize
    dst: usize
    rows: u32
    channels: u32
    num_basis: u32
    grid_min: f32
    grid_max: f32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.rows * self.channels)
        yield self.span("coeff", F32 * self.channels * self.num_basis)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.rows * self.channels)
