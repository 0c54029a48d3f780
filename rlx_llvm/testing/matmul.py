"""Examples of the matrix families: GEMM variants, dense linear algebra, and the SciPy fallbacks."""
from __future__ import annotations

from .. import thunks as T
from ..dtypes import HalfKind
from ..ops import Activation
from .layout import Example, bf16, example, ints, spd, well_conditioned

M, K, N = 5, 7, 9   # no dimension a multiple of the vector width
MKN = dict(m=M, k=K, n=N)


def gemm() -> list[Example]:
    """Plain, transposed, f64, complex, half-precision, batched, fused and structured matrix products."""
    return [
        example("Sgemm/5x7x9", T.Sgemm(a=0, b=0, c=0, **MKN)),
        example("SgemmT/ta_tb", T.SgemmT(a=0, b=0, c=0, ta=True, tb=True, **MKN)),
        example("Dgemm/5x7x9", T.Dgemm(a=0, b=0, c=0, **MKN), dtype="f8"),
        example("CgemmC64/5x7x9", T.CgemmC64(a=0, b=0, c=0, **MKN), dtype="c8"),
        example("SgemmBf16/5x7x9", T.SgemmBf16(a=0, b=0, c=0, **MKN), b=bf16()),
        example("SgemmF16/5x7x9", T.SgemmF16(a=0, b=0, c=0, **MKN), b="f2"),
        example("SgemmHalf/f32_bf16_to_f16", T.SgemmHalf(a=0, b=0, c=0, a_kind=HalfKind.F32, b_kind=HalfKind.Bf16,
                                                         c_kind=HalfKind.F16, **MKN), b=bf16(), c="f2"),
        example("BatchedSgemm/b_bcast", T.BatchedSgemm(a=0, b=0, c=0, batch=3, a_bcast=False, b_bcast=True, **MKN)),
        example("BatchedDgemmF64/3x5x7x9", T.BatchedDgemmF64(a=0, b=0, c=0, batch=3, a_bcast=False, b_bcast=False,
                                                             **MKN), dtype="f8"),
        example("Conv2D1x1/2x5x7_hw11", T.Conv2D1x1(src=0, weight=0, dst=0, n=2, c_in=5, c_out=7, hw=11)),
        example("FusedMmBiasAct/gelu", T.FusedMmBiasAct(a=0, w=0, bias=0, c=0, act=Activation.Gelu, **MKN)),
        example("FusedMmBiasAct/none", T.FusedMmBiasAct(a=0, w=0, bias=0, c=0, act=None, **MKN)),
        example("GroupedMatMul/3_experts", T.GroupedMatMul(input=0, weight=0, expert_idx=0, dst=0, m=M, k_dim=K, n=N,
                                                           num_experts=3, w_transposed=True),
                expert_idx=ints(0, 3, "f4")),
        example("LoraMatMul/r3", T.LoraMatMul(x=0, w=0, a=0, b=0, dst=0, r=3, scale=0.37, **MKN)),
        example("SynthMatMul/d4", T.SynthMatMul(x=0, indices=0, codebook=0, dst=0, m=M, k=12, n=N, entry_dim=4,
                                                num_entries=5), indices=ints(0, 5, "u1")),
    ]


def linalg() -> list[Example]:
    """Dense solves (single and batched, f32 and f64), Cholesky, triangular solve and determinant."""
    n, nrhs = 6, 3
    return [
        example("DenseSolveF32/6x3", T.DenseSolveF32(a=0, b=0, x=0, n=n, nrhs=nrhs), a=well_conditioned(n)),
        example("DenseSolveF64/6x3", T.DenseSolveF64(a=0, b=0, x=0, n=n, nrhs=nrhs), dtype="f8",
                a=well_conditioned(n, "f8")),
        example("BatchedDenseSolveF32/2x6x3", T.BatchedDenseSolveF32(a=0, b=0, x=0, batch=2, n=n, nrhs=nrhs),
                a=well_conditioned(n)),
        example("BatchedDenseSolveF64/2x6x3", T.BatchedDenseSolveF64(a=0, b=0, x=0, batch=2, n=n, nrhs=nrhs),
                dtype="f8", a=well_conditioned(n, "f8")),
        example("CholeskyF32/6", T.CholeskyF32(a=0, l=0, n=n), a=spd(n)),
        example("TriangularSolveF32/lower_t", T.TriangularSolveF32(a=0, b=0, x=0, n=n, nrhs=nrhs, lower=True,
                                                                   transpose=True), a=well_conditioned(n, lower=True)),
        example("DetF32/log_abs", T.DetF32(a=0, out=0, n=n, log_abs=True), a=well_conditioned(n)),
    ]


def fallbacks() -> list[Example]:
    """The SciPy fallbacks: one SVD factor, one QR factor, an argsort."""
    return [
        example("SvdF32/S_7x4", T.SvdF32(a=0, out=0, m=7, n=4, part=1)),
        example("QrF32/R_7x4", T.QrF32(a=0, out=0, m=7, n=4, part=1)),
        example("SortF32/argsort_desc", T.SortF32(src=0, dst=0, outer=2, axis_dim=9, inner=3, descending=True,
                                                  arg=True)),
    ]
