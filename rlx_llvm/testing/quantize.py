"""Examples of the quantization kinds: int8 Quantize/Dequantize, FakeQuantize and its backward, LSQ."""
from __future__ import annotations

from .. import thunks as T
from .layout import Example, example, ints

CHANNELS = dict(len=3 * 4 * 11, chan_axis=1, chan_dim=4, inner=11)   # [3, 4, 11]: odd segments, vector tails
SCALES = (0.02, 0.05, 0.011, 0.3)
ZERO_POINTS = (0, -3, 17, -128)


def quantize() -> list[Example]:
    """Per-channel int8 Quantize and Dequantize."""
    return [
        example("Quantize/per_channel", T.Quantize(x=0, q=0, scales=SCALES, zero_points=ZERO_POINTS, **CHANNELS)),
        example("Dequantize/per_channel", T.Dequantize(q=0, x=0, scales=SCALES, zero_points=ZERO_POINTS, **CHANNELS),
                q=ints(-128, 128, "i1")),
    ]
