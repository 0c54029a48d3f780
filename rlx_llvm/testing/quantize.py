"""Examples of the quantization kinds: int8 Quantize/Dequantize, FakeQuantize and its backward, LSQ."""
from __future__ import annotations

from .. import thunks as T
from ..ops import ScaleMode, SteKind
from .layout import Example, example, ints, uniform

CHANNELS = dict(len=3 * 4 * 11, chan_axis=1, chan_dim=4, inner=11)   # [3, 4, 11]: odd segments, vector tails
SCALES = (0.02, 0.05, 0.011, 0.3)
ZERO_POINTS = (0, -3, 17, -128)
STATE = uniform(0.005, 0.05)     # running scales of EMA / Fixed
LEARNED = uniform(0.1, 0.5)      # LSQ scales: normal data spans inside and beyond ±7·s


def quantize() -> list[Example]:
    """Every kind of the family."""
    return int8() + fake_quantize() + lsq()


def int8() -> list[Example]:
    """Per-channel int8 Quantize and Dequantize."""
    return [
        example("Quantize/per_channel", T.Quantize(x=0, q=0, scales=SCALES, zero_points=ZERO_POINTS, **CHANNELS)),
        example("Dequantize/per_channel", T.Dequantize(q=0, x=0, scales=SCALES, zero_points=ZERO_POINTS, **CHANNELS),
                q=ints(-128, 128, "i1")),
    ]


def fake_quantize() -> list[Example]:
    """FakeQuantize under each ScaleMode and bit width, and its backward under each STE."""
    fq = lambda bits, mode, state: T.FakeQuantize(x=0, out=0, bits=bits, ste=SteKind.Identity, scale_mode=mode,
                                                  state_off=state, **CHANNELS)
    back = lambda ste: T.FakeQuantizeBackward(x=0, dy=0, dx=0, bits=4, ste=ste, **CHANNELS)
    return [
        example("FakeQuantize/per_batch_8bit", fq(8, ScaleMode.PerBatch, None)),
        example("FakeQuantize/ema_4bit", fq(4, ScaleMode.EMA(decay=0.9), 0), state_off=STATE),
        example("FakeQuantize/fixed_2bit", fq(2, ScaleMode.Fixed, 0), state_off=STATE),
        *[example(f"FakeQuantizeBackward/{ste.name}", back(ste), rtol=1e-5 if ste is SteKind.Tanh else None)
          for ste in SteKind],
    ]


def lsq() -> list[Example]:
    """The LSQ forward and its two gradients, 4-bit, learned scales around the data's range."""
    fields = dict(x=0, scale_off=0, bits=4, **CHANNELS)
    return [
        example("FakeQuantizeLSQ/4bit", T.FakeQuantizeLSQ(out=0, **fields), scale_off=LEARNED),
        example("FakeQuantizeLSQBackwardX/4bit", T.FakeQuantizeLSQBackwardX(dy=0, dx=0, **fields),
                scale_off=LEARNED),
        example("FakeQuantizeLSQBackwardScale/4bit", T.FakeQuantizeLSQBackwardScale(dy=0, dscale=0, **fields),
                scale_off=LEARNED, rtol=1e-4),
    ]
