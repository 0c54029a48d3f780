"""Examples of DequantMatMulMlx and DequantGroupedMatMulMlx: affine (one width whose codes straddle words),
mxfp4 and mxfp8, f32 and bf16 scales, odd m and n."""
from __future__ import annotations

from .. import thunks as T
from ..ops import QuantScheme
from .layout import Example, bf16, example, ints, normal, uniform


def mlx() -> list[Example]:
    """Codes over every bit pattern (mxfp8: the finite positive codes), E8M0 scales near 1."""
    affine4, affine3 = QuantScheme.MlxAffine(bits=4, group_size=32), QuantScheme.MlxAffine(bits=3, group_size=64)
    codes = ints(0, 256, "u1")
    return [
        example("DequantMatMulMlx/affine4_g32", T.DequantMatMulMlx(
            x=0, w_q=0, scale=0, zp=0, dst=0, m=3, k=64, n=5, scheme=affine4),
            w_q=codes, scale=uniform(0.01, 0.1), zp=normal(scale=0.1), rtol=1e-5),
        example("DequantMatMulMlx/affine3_g64", T.DequantMatMulMlx(
            x=0, w_q=0, scale=0, zp=0, dst=0, m=2, k=128, n=3, scheme=affine3),
            w_q=codes, scale=uniform(0.01, 0.1), zp=normal(scale=0.1), rtol=1e-5),
        example("DequantMatMulMlx/mxfp4", T.DequantMatMulMlx(
            x=0, w_q=0, scale=0, zp=0, dst=0, m=3, k=64, n=5, scheme=QuantScheme.MlxMxfp4(group_size=32)),
            w_q=codes, scale=ints(120, 130, "u1"), rtol=1e-5),
        example("DequantGroupedMatMulMlx/affine6_bf16", T.DequantGroupedMatMulMlx(
            input=0, w_q=0, scale=0, zp=0, expert_idx=0, dst=0, m=5, k_dim=64, n=3, num_experts=3,
            slab_bytes=3 * 64 * 6 // 8, scheme=QuantScheme.MlxAffine(bits=6, group_size=32), scale_bf16=True),
            w_q=codes, scale=bf16(0.05), zp=bf16(0.1), expert_idx=ints(0, 3, "f4"), rtol=1e-5),
        example("DequantGroupedMatMulMlx/mxfp8", T.DequantGroupedMatMulMlx(
            input=0, w_q=0, scale=0, zp=0, expert_idx=0, dst=0, m=4, k_dim=32, n=3, num_experts=2,
            slab_bytes=3 * 32, scheme=QuantScheme.MlxMxfp8(group_size=32), scale_bf16=False),
            w_q=ints(0, 0x7F, "u1"), scale=ints(120, 130, "u1"), expert_idx=ints(0, 2, "f4"), rtol=1e-5),
    ]
