"""One small valid instance of every lowered thunk kind, laid out in disjoint arena slots.

Used by the sentinel test (nothing outside the declared outputs changes) and as the seeds the
fuzzer mutates.
"""
from __future__ import annotations

from rlx_llvm import thunks as T
from rlx_llvm.dtypes import DType, LaneKind
from rlx_llvm.ops import Activation, BinaryOp, ChainOperand as In, ChainStep as S, CmpOp, ReduceOp

SLOT = 1024  # bytes per slot: room for 40 elements of up to 16 bytes
N = 40
CASTS = ["CastF32ToI64", "CastF32ToF64", "CastF64ToF32", "CastF64ToI64", "CastF64ToI32", "CastF64ToBool",
         "CastI64ToI32", "CastI64ToF64", "CastI32ToF64", "CastF32ToF16", "CastF16ToF32", "CastF32ToBf16",
         "CastBf16ToF32", "CastF32ToI32", "CastI64ToF32", "CastBoolToI32", "CastBoolToF32", "CastF32ToBool",
         "CastI32ToF32", "CastI32ToI64", "CastI32ToBool", "CastI64ToBool", "CastBoolToI64"]


def slots(k: int) -> list[int]:
    """Offsets of k consecutive fresh slots (call per thunk)."""
    return [i * SLOT for i in range(k)]


def examples() -> list[tuple[object, int]]:
    """(thunk, arena_bytes) pairs; each thunk uses slots from 0 upwards of its own arena."""
    a, b, c, d, e = slots(5)
    out = [
        T.ElementwiseRegion(dst=c, len=N, input_offs=(a, b), chain=(
            S.Binary(BinaryOp.Add, In.Input(0), In.Input(1)), S.Activation(Activation.Gelu, In.Step(0)))),
        T.ElementwiseRegion(dst=c, len=N, input_offs=(a, b), input_modulus=(0, 8), in_lanes=(LaneKind.Bf16,
                            LaneKind.F16), out_lane=LaneKind.F64,
                            chain=(S.Compare(CmpOp.Lt, In.Input(0), In.Input(1)),
                                   S.Where(In.Step(0), In.Input(0), In.Input(1)), S.Cast(DType.I8, In.Step(1)))),
        T.Copy(src=a, dst=b, len=N), T.CopyF64(src=a, dst=b, len=N), T.CopyI64(src=a, dst=b, len=N),
        T.CastGeneric(src=a, dst=b, len=N, src_dtype=DType.U8, dst_dtype=DType.BF16),
        T.CastGeneric(src=a, dst=b, len=N, src_dtype=DType.C128, dst_dtype=DType.I16),
        T.RoundHalf(src=a, dst=b, len=N, bf16=True),
        T.BinaryFull(lhs=a, rhs=b, dst=c, len=N, lhs_len=N, rhs_len=N, op=BinaryOp.Pow, out_dims_bcast=(),
                     bcast_lhs_strides=(), bcast_rhs_strides=(), elem_bytes=4),
        T.BinaryFull(lhs=a, rhs=b, dst=c, len=N, lhs_len=8, rhs_len=5, op=BinaryOp.Sub, out_dims_bcast=(8, 5),
                     bcast_lhs_strides=(1, 0), bcast_rhs_strides=(0, 1), elem_bytes=8),
        T.BinaryFullF64(lhs=a, rhs=b, dst=c, len=N, lhs_len=N, rhs_len=1, op=BinaryOp.Max, out_dims_bcast=(),
                        bcast_lhs_strides=(), bcast_rhs_strides=()),
        T.BinaryFullC64(lhs=a, rhs=b, dst=c, len=N, lhs_len=N, rhs_len=N, op=BinaryOp.Div, out_dims_bcast=(),
                        bcast_lhs_strides=(), bcast_rhs_strides=()),
        T.BiasAdd(src=a, bias=b, dst=c, m=5, n=8),
        T.ActivationInPlace(data=a, len=N, act=Activation.Mish),
        T.ActivationF64(src=a, dst=b, len=N, kind=Activation.Softplus),
        T.ActivationC64(src=a, dst=b, len=N, kind=Activation.Sqrt),
        T.Compare(lhs=a, rhs=b, dst=c, len=N, op=CmpOp.Ge, inputs_i64=0, inputs_elem_bytes=4, dst_elem_bytes=1,
                  lhs_scalar=False, rhs_scalar=True, lhs_len=N, rhs_len=1, out_dims_bcast=(),
                  bcast_lhs_strides=(), bcast_rhs_strides=()),
        T.Where(cond=a, on_true=b, on_false=c, dst=d, len=N, elem_bytes=8, cond_elem_bytes=1, cond_scalar=False,
                true_scalar=True, false_scalar=False),
        T.Fma(a=a, b=b, c=c, dst=d, len=N, elem_bytes=4),
        T.SgdMomentum(param=a, vel=b, grad=c, p_out=d, v_out=e, lr=0.1, mom=0.9, len=N),
        T.ComplexNormSqF32(src=a, dst=b, len=N), T.ComplexNormSqBackwardF32(z=a, g=b, dz=c, len=N),
        T.ConjugateC64(src=a, dst=b, len=N),
    ]
    out += [getattr(T, k)(src=a, dst=b, len=N) for k in CASTS]
    out += [  # a few of the other families (their own tests sweep them; here: sentinel and fuzz seeds)
        T.LayerNorm(src=a, g=b, b=c, dst=d, rows=5, h=8, eps=1e-5),
        T.RmsNorm(src=a, g=b, b=c, dst=d, rows=4, h=10, eps=1e-6),
        T.Softmax(data=a, rows=4, cols=5, inner=2),
        T.Reduce(src=a, dst=b, outer=2, reduced=5, inner=4, op=ReduceOp.Max),
        T.TopK(src=a, dst=b, outer=4, axis_dim=10, k=3, indices_i64=1),
        T.ArgReduce(src=a, dst=b, outer=4, reduced=10, inner=1, is_max=True),
        T.Cumsum(src=a, dst=b, rows=4, cols=10, exclusive=True, dtype=DType.F32),
        T.Histogram(src=a, dst=b, n=N, bins=7, min=-1.0, max=1.0),
        T.SoftmaxCrossEntropy(logits=a, labels=b, dst=c, n=4, c=10),
        T.Transpose(src=a, dst=b, in_total=N, out_dims=(5, 8), in_strides=(1, 5), elem_bytes=4),
        T.Gather(table=a, table_len=N, idx=b, dst=c, num_idx=6, trailing=4, idx_i64=0, table_bytes=4),
        T.ScatterAdd(updates=a, indices=b, dst=c, num_updates=6, out_dim=5, trailing=4),
        T.Narrow(src=a, dst=b, outer=4, src_stride=10, dst_stride=6, inner=6, elem_bytes=4),
        T.ReluBackward(x=a, dy=b, dx=c, len=N), T.ReluBackwardF64(x=a, dy=b, dx=c, len=N),
        T.ActivationBackward(x=a, dy=b, dx=c, len=N, kind=Activation.Gelu),
        T.ActivationBackwardF64(x=a, dy=b, dx=c, len=N, kind=Activation.Tanh),
        T.LayerNormBackwardInput(x=a, gamma=b, dy=c, dx=d, rows=4, h=8, eps=1e-5),
        T.LayerNormBackwardGamma(x=a, dy=b, dgamma=c, rows=4, h=8, eps=1e-5),
        T.RmsNormBackwardInput(x=a, gamma=b, beta=c, dy=d, dx=e, rows=4, h=8, eps=1e-5),
        T.GroupNormBackwardInput(x=a, gamma=b, beta=c, dy=d, dx=e, n=1, c=4, h=2, w=5, num_groups=2, eps=1e-5),
        T.BatchNormInferenceBackwardInput(x=a, gamma=b, mean=c, var=d, dy=e, dx=a + 5 * SLOT, count=5, channels=8,
                                          eps=1e-5),
        T.CumsumBackward(dy=a, dx=b, rows=4, cols=10, exclusive=True),
        T.GatherBackward(dy=a, indices=b, dst=c, outer=1, axis_dim=5, num_idx=6, trailing=4),
        T.RopeBackward(dy=a, cos=b, sin=c, dx=d, batch=1, seq=4, hidden=8, head_dim=4, n_rot=4, cos_len=8,
                       cos_row_stride=2, interleaved=False),
        T.SplineActivation(x=a, coeff=b, dst=c, rows=4, channels=8, num_basis=5, grid_min=-1.0, grid_max=1.0),
        T.Pool2D(src=a, dst=b, n=1, c=2, h=4, w=5, h_out=2, w_out=2, kh=2, kw=2, sh=2, sw=2, ph=0, pw=0,
                 kind=ReduceOp.Max),
        T.MaxPool2dBackward(x=a, dy=b, dx=c, n=1, c=2, h=4, w=5, h_out=2, w_out=2, kh=2, kw=2, sh=2, sw=2, ph=0, pw=0),
        T.Conv2D(src=a, weight=b, dst=c, n=1, c_in=2, h=4, w=4, c_out=2, h_out=4, w_out=4, kh=3, kw=3, sh=1, sw=1,
                 ph=1, pw=1, dh=1, dw=1, groups=1),
        T.Conv2dBackwardInput(dy=a, w=b, dx=c, n=1, c_in=2, h=4, w_in=4, c_out=2, h_out=4, w_out=4, kh=3, kw=3,
                              sh=1, sw=1, ph=1, pw=1, dh=1, dw=1, groups=1),
        T.Conv2dBackwardWeight(x=a, dy=b, dw=c, n=1, c_in=2, h=4, w=4, c_out=2, h_out=4, w_out=4, kh=3, kw=3,
                               sh=1, sw=1, ph=1, pw=1, dh=1, dw_dil=1, groups=1),
        T.ConvTranspose2d(src=a, weight=b, dst=c, n=1, c_in=2, h=3, w_in=3, c_out=2, h_out=6, w_out=6, kh=2, kw=2,
                          sh=2, sw=2, ph=0, pw=0, dh=1, dw=1, groups=1),
    ]
    return [(t, 6 * SLOT) for t in out]
