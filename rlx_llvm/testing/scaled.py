"""Examples of the scaled low-precision kinds: FP8/FP6/FP4 codes with per-tensor, MX (E8M0) and NVFP4 scales."""
from __future__ import annotations

from .. import thunks as T
from ..ops import ScaledFormat as F, ScaleLayout as L
from .layout import Example, example, ints, uniform

CODES = ints(0, 256, "u1")
POSITIVE = ints(0, 0x38, "u1")   # finite positive codes of every format (a sum without cancellation)
SCALES = {"PerTensor": uniform(0.25, 4.0), "BlockMxE8M0": ints(120, 136, "u1"), "Nvfp4": ints(0x28, 0x58, "u1")}
LAYOUTS = (L.PerTensor, L.BlockMxE8M0(block=32), L.Nvfp4(group=16))
ROWS, COLS = 3, 45          # a short last block in every row


def scaled() -> list[Example]:
    """ScaledQuantScale, ScaledQuantize, ScaledDequantize, ScaledMatMul and ScaledGroupedMatMul per layout, on formats of 8, 6 and 4 bits."""
    out = []
    for layout, fmt in zip(LAYOUTS, (F.F8E4M3, F.F6E3M2, F.F4E2M1)):
        name, shape = layout.name, dict(rows=ROWS, cols=COLS, fmt=fmt, layout=layout)
        out += [example(f"ScaledQuantScale/{name}", T.ScaledQuantScale(x=0, dst=0, **shape)),
                example(f"ScaledQuantize/{name}", T.ScaledQuantize(x=0, scale=0, dst=0, **shape),
                        scale=SCALES[name]),
                example(f"ScaledDequantize/{name}", T.ScaledDequantize(codes=0, scale=0, dst=0, **shape),
                        codes=CODES, scale=SCALES[name]),
                example(f"ScaledMatMul/{name}", T.ScaledMatMul(lhs=0, rhs=0, lhs_scale=0, rhs_scale=0, bias=0, dst=0,
                                                               m=ROWS, k=COLS, n=19, lhs_fmt=F.F8E4M3, rhs_fmt=fmt,
                                                               layout=layout, has_bias=True),
                        rtol=1e-5, lhs=POSITIVE, rhs=POSITIVE, lhs_scale=SCALES[name], rhs_scale=SCALES[name]),
                example(f"ScaledGroupedMatMul/{name}",
                        T.ScaledGroupedMatMul(input=0, weight=0, input_scale=0, weight_scale=0, expert_idx=0, bias=0,
                                              dst=0, m=ROWS + 2, k=COLS, n=19, num_experts=3, lhs_fmt=F.F8E4M3,
                                              rhs_fmt=fmt, layout=layout, has_bias=True),
                        rtol=1e-5, input=POSITIVE, weight=POSITIVE, input_scale=SCALES[name],
                        weight_scale=SCALES[name], expert_idx=ints(0, 3, "f4"))]
    return out
