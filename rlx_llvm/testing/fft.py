"""Examples of the FFT family: Fft1d on each of its three algorithms (radix-2, the naive DFT, Bluestein) and
each row layout (f32/f64 real blocks, c64/c128 interleaved), forward and inverse, every norm."""
from __future__ import annotations

from .. import thunks as T
from ..dtypes import DType
from .layout import Example, example, ints, uniform


def fft() -> list[Example]:
    """Fft1d: three rows each, n = 16 (radix-2), 12 (naive DFT), 37 (Bluestein); LogMel and its backward
    with non-negative filters; WelchPeaks (bit-exact: the reference keeps the kernel's f32 roundings)."""
    cases = []
    for n, dtype, inverse, norm in ((16, DType.C64, False, 0), (12, DType.F32, True, 2), (37, DType.F64, True, 1),
                                    (37, DType.C128, False, 2), (16, DType.F64, True, 0)):
        t = T.Fft1d(src=0, dst=0, outer=3, n_complex=n, inverse=inverse, norm_tag=norm, dtype=dtype)
        real = "f8" if dtype in (DType.F64, DType.C128) else "f4"
        cases.append(example(f"Fft1d/{dtype.value}_n{n}_{'inv' if inverse else 'fwd'}_norm{norm}", t, dtype=real,
                             rtol=1e-5 * 6 if real == "f4" else 1e-12))
    shape = dict(spec=0, filters=0, dst=0, outer=3, n_fft=16, n_bins=9, n_mels=5)
    cases.append(example("LogMel/16fft_9bins_5mels", T.LogMel(**shape), filters=uniform(0.0, 1.0), rtol=1e-5))
    cases.append(example("LogMelBackward/16fft_9bins_5mels", T.LogMelBackward(**shape, dy=0),
                         filters=uniform(0.0, 1.0), rtol=1e-4))
    t = T.WelchPeaks(spec=0, dst=0, welch_batch=2, n_fft=16, n_segments=3, k=4)
    cases.append(example("WelchPeaks/16fft_3segs_top4", t, rtol=0.0))
    t = T.FftButterflyStage(state_src=0, state_dst=0, gate_src=0, rev_src=0, tw_re_src=0, tw_im_src=0, batch=3,
                            n_fft=16, stage=1)
    cases.append(example("FftButterflyStage/16fft_stage1", t, gate_src=ints(0, 2, "f4"), rev_src=ints(0, 2, "f4"),
                         rtol=0.0))
    for n, inverse, norm, scale in ((16, False, 0, 0), (8, True, 2, 1)):
        t = T.Fft1dQ(src=0, dst=0, outer=3, n_complex=n, inverse=inverse, norm_tag=norm, scale_tag=scale)
        cases.append(example(f"Fft1dQ/n{n}_{'inv' if inverse else 'fwd'}_norm{norm}_scale{scale}", t,
                             src=ints(-(1 << 20), 1 << 20, "i4"), dtype="i4", rtol=0.0))
    return cases
