"""Examples of the convolution family: 2-D / 3-D convolutions (forward, backward, transposed) and pooling."""
from __future__ import annotations

from .. import thunks as T
from ..ops import ReduceOp
from .layout import Example, example

# Shapes: 2-D 3×3 same-padding on 5×7 images in 2 groups; 3-D 3×3×3 on 3×4×5; strided backward 6×6 → 3×3.
CONV2D = dict(n=1, c_in=4, h=5, c_out=4, h_out=5, w_out=7, kh=3, kw=3, sh=1, sw=1, ph=1, pw=1, dh=1, groups=2)
CONV3D = dict(n=1, c_in=2, d=3, h=4, c_out=2, d_out=3, h_out=4, w_out=5, kd=3, kh=3, kw=3, sd=1, sh=1, sw=1,
              pd=1, ph=1, pw=1, dd=1, dh=1, groups=1)
BACK2D = dict(n=1, c_in=4, h=6, c_out=4, h_out=3, w_out=3, kh=3, kw=3, sh=2, sw=2, ph=1, pw=1, dh=1, groups=2)
POOL2D = dict(n=1, c=2, h=4, w=5, h_out=2, w_out=2, kh=2, kw=2, sh=2, sw=2, ph=0, pw=0)
POOL3D = dict(n=1, c=2, d=4, h=6, w=5, d_out=2, h_out=3, w_out=2, kd=2, kh=2, kw=2, sd=2, sh=2, sw=2, pd=0, ph=0,
              pw=0)


def conv() -> list[Example]:
    """Every convolution and pooling kind once."""
    return [
        example("Conv2D/3x3_groups2", T.Conv2D(src=0, weight=0, dst=0, w=7, dw=1, **CONV2D)),
        example("Conv2dBackwardInput/stride2", T.Conv2dBackwardInput(dy=0, w=0, dx=0, w_in=6, dw=1, **BACK2D)),
        example("Conv2dBackwardWeight/stride2", T.Conv2dBackwardWeight(x=0, dy=0, dw=0, w=6, dw_dil=1, **BACK2D)),
        example("ConvTranspose2d/stride2", T.ConvTranspose2d(src=0, weight=0, dst=0, n=1, c_in=4, h=4, w_in=3, c_out=4,
                                                             h_out=8, w_out=6, kh=4, kw=4, sh=2, sw=2, ph=1, pw=1,
                                                             dh=1, dw=1, groups=2)),
        example("Conv3d/3x3x3", T.Conv3d(src=0, weight=0, dst=0, w=5, dw=1, **CONV3D)),
        example("Conv3dBackwardInput/3x3x3", T.Conv3dBackwardInput(dy=0, w=0, dx=0, w_in=5, dw=1, **CONV3D)),
        example("Conv3dBackwardWeight/3x3x3", T.Conv3dBackwardWeight(x=0, dy=0, dw=0, w=5, dw_dil=1, **CONV3D)),
        example("ConvTranspose3d/stride2", T.ConvTranspose3d(
            src=0, weight=0, dst=0, n=1, c_in=2, d=2, h=3, w_in=3, c_out=2, d_out=4, h_out=5, w_out=5, kd=2, kh=3,
            kw=3, sd=2, sh=2, sw=2, pd=0, ph=1, pw=1, dd=1, dh=1, dw=1, groups=1)),
        example("Pool2D/max", T.Pool2D(src=0, dst=0, kind=ReduceOp.Max, **POOL2D)),
        example("Pool3D/mean", T.Pool3D(src=0, dst=0, kind=ReduceOp.Mean, **POOL3D)),
        example("MaxPool2dBackward", T.MaxPool2dBackward(x=0, dy=0, dx=0, **POOL2D)),
        example("MaxPool3dBackward", T.MaxPool3dBackward(x=0, dy=0, dx=0, **POOL3D)),
    ]
