"""Examples of the INT8 kernels: QMatMul and QConv2d (int32 accumulation, ONNX requantization)."""
from __future__ import annotations

from .. import thunks as T
from .layout import Example, example, ints

INT8 = ints(-128, 128, "i1")
BIAS = ints(-2000, 2000, "i4")


def qgemm() -> list[Example]:
    """QMatMul with odd sizes (row and column tails) and a grouped, padded, strided QConv2d."""
    return [
        example("QMatMul/5x37x19", T.QMatMul(x=0, w=0, bias=0, out=0, m=5, k=37, n=19, x_zp=3, w_zp=-2, out_zp=-5,
                                             mult=0.0031), x=INT8, w=INT8, bias=BIAS),
        example("QConv2d/3x3_s2_groups2", T.QConv2d(x=0, w=0, bias=0, out=0, n=1, c_in=4, h=7, w_in=6, c_out=6,
                                                    h_out=4, w_out=3, kh=3, kw=3, sh=2, sw=2, ph=1, pw=1, dh=1, dw=1,
                                                    groups=2, x_zp=-7, w_zp=4, out_zp=9, mult=0.0042),
                x=INT8, w=INT8, bias=BIAS),
    ]
