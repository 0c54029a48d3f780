"""Examples of the `[k, n]` dequantizing GEMMs: DequantMatMul (sym/asym), DequantMatMulInt4, DequantMatMulFp8
(E4M3, E5M2), DequantMatMulNvfp4 and DequantMatMulMxFp4x2 — k not a multiple of the block, odd n."""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from .layout import Example, Values, example, ints, normal, uniform


def finite_codes(below: int) -> Values:
    """Sign-magnitude bytes with magnitude < `below` (the first non-finite code), either sign."""
    return Values(np.dtype("u1"), lambda rng, n: (rng.integers(0, below, n) | rng.integers(0, 2, n) << 7)
                  .astype("u1"))


def dequant() -> list[Example]:
    """Int8 codes over their whole range, nibble bytes over all 256 values, finite FP8 codes, E4M3 block
    scales from 2^−4 to 2^3, positive f32 scales."""
    cases = []
    for kind, codes in ((T.DequantMatMul, ints(-128, 128, "i1")), (T.DequantMatMulInt4, ints(0, 256, "u1"))):
        for asym in (False, True):
            t = kind(x=0, w_q=0, scale=0, zp=0, dst=0, m=3, k=37, n=5, block_size=16, is_asymmetric=asym)
            zp = {"zp": normal(scale=4.0)} if asym else {}
            cases.append(example(f"{kind.__name__}/{'asym' if asym else 'sym'}", t, w_q=codes,
                                 scale=uniform(0.01, 0.1), rtol=1e-5, **zp))
    for e5m2, below in ((False, 0x78), (True, 0x7C)):
        t = T.DequantMatMulFp8(x=0, w_q=0, scale=0, dst=0, m=3, k=37, n=5, e5m2=e5m2)
        cases.append(example(f"DequantMatMulFp8/{'e5m2' if e5m2 else 'e4m3'}", t, w_q=finite_codes(below),
                             scale=uniform(0.01, 0.1), rtol=1e-5))
    t = T.DequantMatMulNvfp4(x=0, w_q=0, scale=0, global_scale=0, dst=0, m=3, k=37, n=5)
    cases.append(example("DequantMatMulNvfp4/k37", t, w_q=ints(0, 256, "u1"), scale=ints(0x18, 0x50, "u1"),
                         global_scale=uniform(0.5, 2.0), rtol=1e-5))
    t = T.DequantMatMulMxFp4x2(x=0, w_q=0, scale=0, dst=0, m=3, k=37, n=5, group=16)
    cases.append(example("DequantMatMulMxFp4x2/group16", t, w_q=ints(0, 256, "u1"), scale=uniform(0.01, 0.1),
                         rtol=1e-5))
    return cases
