"""A packed buffer that runs past the arena is refused with its block geometry in the message."""
from __future__ import annotations

import pytest

import rlx_llvm as rl
from rlx_llvm import thunks as T
from rlx_llvm.errors import ValidationError
from rlx_llvm.ops import QuantScheme, ScaleLayout, ScaledFormat

BIG = 1 << 20   # where the packed buffer starts: everything else lies below it

CASES = [
    (T.DequantMatMulGguf(x=0, w_q=BIG, dst=4096, m=1, k=64, n=3, scheme=QuantScheme.GgufQ4_0),
     "w_q", "3 rows × 2 GgufQ4_0 blocks of 18 bytes (32 weights per block)"),
    (T.DequantMatMulGguf(x=0, w_q=BIG, dst=4096, m=1, k=512, n=2, scheme=QuantScheme.GgufQ4K),
     "w_q", "2 rows × 2 GgufQ4K blocks of 144 bytes (256 weights per block)"),
    (T.DequantGroupedMatMulGguf(input=0, w_q=BIG, expert_idx=2048, dst=4096, m=1, k_dim=32, n=2,
                                num_experts=3, scheme=QuantScheme.GgufQ8_0),
     "w_q", "3 experts × 2 rows × 1 GgufQ8_0 blocks of 34 bytes"),
    (T.DequantMatMul(x=0, w_q=1024, scale=BIG, zp=0, dst=4096, m=1, k=10, n=4, block_size=4,
                     is_asymmetric=False),
     "scale", "3 × 4 f32 values, one per block of block_size = 4 rows per column"),
    (T.DequantMatMulInt4(x=0, w_q=1024, scale=2048, zp=BIG, dst=4096, m=1, k=8, n=4, block_size=8,
                         is_asymmetric=True),
     "zp", "one per block of block_size = 8 rows"),
    (T.ScaledMatMul(lhs=0, rhs=512, lhs_scale=1024, rhs_scale=BIG, bias=0, dst=4096, m=2, k=64, n=3,
                    lhs_fmt=ScaledFormat.F8E4M3, rhs_fmt=ScaledFormat.F8E4M3,
                    layout=ScaleLayout.BlockMxE8M0(block=32), has_bias=False),
     "rhs_scale", "3 rows × 2 E8M0 bytes, one per block of 32"),
]


@pytest.mark.parametrize("thunk, field, layout", CASES, ids=lambda c: getattr(c, "kind_name", None))
def test_too_short_names_field_and_block(thunk, field: str, layout: str) -> None:
    """The buffer ends one past the arena: the error names the field, its bytes and the block size."""
    with pytest.raises(ValidationError) as err:
        rl.compile(rl.ThunkSchedule([thunk], arena_bytes=BIG + 1))
    assert err.value.field == field
    assert "outside the arena" in str(err.value) and layout in str(err.value)
