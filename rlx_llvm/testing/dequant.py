"""Examples of DequantMatMul (symmetric and asymmetric) and DequantMatMulInt4: k not a multiple of the block, odd n."""
from __future__ import annotations

from .. import thunks as T
from .layout import Example, example, ints, normal, uniform


def dequant() -> list[Example]:
    """Int8 codes over their whole range, nibble bytes over all 256 values, positive scales."""
    cases = []
    for kind, codes in ((T.DequantMatMul, ints(-128, 128, "i1")), (T.DequantMatMulInt4, ints(0, 256, "u1"))):
        for asym in (False, True):
            t = kind(x=0, w_q=0, scale=0, zp=0, dst=0, m=3, k=37, n=5, block_size=16, is_asymmetric=asym)
            zp = {"zp": normal(scale=4.0)} if asym else {}
            cases.append(example(f"{kind.__name__}/{'asym' if asym else 'sym'}", t, w_q=codes,
                                 scale=uniform(0.01, 0.1), rtol=1e-5, **zp))
    return cases
