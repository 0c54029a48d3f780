"""Examples of the element-wise families: Nop, ElementwiseRegion, element-wise kernels, casts, activation backward."""
from __future__ import annotations

from .. import thunks as T
from ..dtypes import DType, LaneKind
from ..ops import Activation, BinaryOp, ChainOperand as In, ChainStep as S, CmpOp
from .layout import Example, bf16, example, ints, uniform

N = 45  # elements: a vector tail at 4, 8 and 16 lanes

# Element types of the cast kinds' names (bf16 as its uint16 bits).
_TYPES = {"F32": "f4", "F64": "f8", "I32": "i4", "I64": "i8", "Bool": "u1", "F16": "f2", "Bf16": "<u2"}
CASTS = ("CastF32ToI64", "CastF32ToF64", "CastF64ToF32", "CastF64ToI64", "CastF64ToI32", "CastF64ToBool",
         "CastI64ToI32", "CastI64ToF64", "CastI32ToF64", "CastF32ToF16", "CastF16ToF32", "CastF32ToBf16",
         "CastBf16ToF32", "CastF32ToI32", "CastI64ToF32", "CastBoolToI32", "CastBoolToF32", "CastF32ToBool",
         "CastI32ToF32", "CastI32ToI64", "CastI32ToBool", "CastI64ToBool", "CastBoolToI64")


def nop() -> list[Example]:
    """Nop: no buffers at all."""
    return [example("Nop", T.Nop())]


def region() -> list[Example]:
    """A fused f32 chain, and one over bf16/f16 lanes with a modulus-broadcast input into f64."""
    return [
        example("ElementwiseRegion/add_gelu", T.ElementwiseRegion(dst=0, len=N, input_offs=(0, 0), chain=(
            S.Binary(BinaryOp.Add, In.Input(0), In.Input(1)), S.Activation(Activation.Gelu, In.Step(0))))),
        example("ElementwiseRegion/halves_where_cast", T.ElementwiseRegion(
            dst=0, len=N, input_offs=(0, 0), input_modulus=(0, 9), in_lanes=(LaneKind.Bf16, LaneKind.F16),
            out_lane=LaneKind.F64, chain=(S.Compare(CmpOp.Lt, In.Input(0), In.Input(1)),
                                          S.Where(In.Step(0), In.Input(0), In.Input(1)),
                                          S.Cast(DType.I8, In.Step(1)))),
            input_offs_0=bf16(4.0), input_offs_1=uniform(-4, 4, "f2"), dst="f8"),
    ]


def _broadcast(op: BinaryOp, dims: tuple[int, int] = (), lhs: tuple = (), rhs: tuple = (), **kw) -> dict:
    """BinaryFull-style fields: `len` N (or the product of `dims`), operands as long as the output."""
    n = dims[0] * dims[1] if dims else N
    return dict(lhs=0, rhs=0, dst=0, len=n, lhs_len=n, rhs_len=n, op=op, out_dims_bcast=dims,
                bcast_lhs_strides=lhs, bcast_rhs_strides=rhs) | kw


def elementwise() -> list[Example]:
    """The element-wise kernels: binaries with broadcast, activations, compare/where, fma, complex helpers."""
    return [
        example("BinaryFull/pow_f32", T.BinaryFull(**_broadcast(BinaryOp.Pow, elem_bytes=4)), lhs=uniform(0.1, 2)),
        example("BinaryFull/sub_i64_bcast", T.BinaryFull(**_broadcast(BinaryOp.Sub, (9, 5), (1, 0), (0, 1),
                                                                      lhs_len=9, rhs_len=5, elem_bytes=8)),
                dtype="i8"),
        example("BinaryFullF64/max_scalar", T.BinaryFullF64(**_broadcast(BinaryOp.Max, rhs_len=1)), dtype="f8"),
        example("BinaryFullC64/div", T.BinaryFullC64(**_broadcast(BinaryOp.Div)), dtype="c8"),
        example("BiasAdd/5x9", T.BiasAdd(src=0, bias=0, dst=0, m=5, n=9)),
        example("ActivationInPlace/mish", T.ActivationInPlace(data=0, len=N, act=Activation.Mish)),
        example("ActivationF64/softplus", T.ActivationF64(src=0, dst=0, len=N, kind=Activation.Softplus), dtype="f8"),
        example("ActivationC64/sqrt", T.ActivationC64(src=0, dst=0, len=N, kind=Activation.Sqrt), dtype="c8"),
        example("Compare/ge_scalar", T.Compare(
            lhs=0, rhs=0, dst=0, len=N, op=CmpOp.Ge, inputs_i64=0, inputs_elem_bytes=4, dst_elem_bytes=1,
            lhs_scalar=False, rhs_scalar=True, lhs_len=N, rhs_len=1, out_dims_bcast=(), bcast_lhs_strides=(),
            bcast_rhs_strides=()), dst="u1"),
        example("Where/i64_true_scalar", T.Where(cond=0, on_true=0, on_false=0, dst=0, len=N, elem_bytes=8,
                                                 cond_elem_bytes=1, cond_scalar=False, true_scalar=True,
                                                 false_scalar=False), dtype="i8", cond="u1"),
        example("Fma/f32", T.Fma(a=0, b=0, c=0, dst=0, len=N, elem_bytes=4)),
        example("SgdMomentum", T.SgdMomentum(param=0, vel=0, grad=0, p_out=0, v_out=0, lr=0.1, mom=0.9, len=N)),
        example("ComplexNormSqF32", T.ComplexNormSqF32(src=0, dst=0, len=N), src="c8"),
        example("ComplexNormSqBackwardF32", T.ComplexNormSqBackwardF32(z=0, g=0, dz=0, len=N), z="c8", dz="c8"),
        example("ConjugateC64", T.ConjugateC64(src=0, dst=0, len=N), dtype="c8"),
        example("SplineActivation/5x9", T.SplineActivation(x=0, coeff=0, dst=0, rows=5, channels=9, num_basis=5,
                                                           grid_min=-1.0, grid_max=1.0)),
    ]


def _cast(kind: str) -> Example:
    """One fixed-type cast, its element types read off its name (`CastF32ToI64`: f32 → i64)."""
    src, dst = kind.removeprefix("Cast").split("To")
    values = {"Bf16": bf16(100.0), "Bool": ints(0, 2, "u1"), "I32": "i4", "I64": "i8"}.get(src) \
        or uniform(-300, 300, _TYPES[src])
    return example(kind, getattr(T, kind)(src=0, dst=0, len=N), src=values, dst=_TYPES[dst])


def casts() -> list[Example]:
    """Copies, the fixed-type casts, CastGeneric and RoundHalf."""
    return [
        example("Copy", T.Copy(src=0, dst=0, len=N)),
        example("CopyF64", T.CopyF64(src=0, dst=0, len=N), dtype="f8"),
        example("CopyI64", T.CopyI64(src=0, dst=0, len=N), dtype="i8"),
        example("CastGeneric/u8_bf16", T.CastGeneric(src=0, dst=0, len=N, src_dtype=DType.U8, dst_dtype=DType.BF16),
                src=ints(0, 256, "u1"), dst="<u2"),
        example("CastGeneric/c128_i16", T.CastGeneric(src=0, dst=0, len=N, src_dtype=DType.C128,
                                                      dst_dtype=DType.I16), src=uniform(-4e4, 4e4, "f8"), dst="i2"),
        example("RoundHalf/bf16", T.RoundHalf(src=0, dst=0, len=N, bf16=True)),
        *(_cast(kind) for kind in CASTS),
    ]


def activation_backward() -> list[Example]:
    """ReLU and general activation backward, f32 and f64."""
    return [
        example("ReluBackward", T.ReluBackward(x=0, dy=0, dx=0, len=N)),
        example("ReluBackwardF64", T.ReluBackwardF64(x=0, dy=0, dx=0, len=N), dtype="f8"),
        example("ActivationBackward/gelu", T.ActivationBackward(x=0, dy=0, dx=0, len=N, kind=Activation.Gelu)),
        example("ActivationBackwardF64/tanh", T.ActivationBackwardF64(x=0, dy=0, dx=0, len=N, kind=Activation.Tanh),
                dtype="f8"),
    ]
