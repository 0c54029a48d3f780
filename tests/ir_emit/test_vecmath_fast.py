"""The cheaper vecmath paths (docs/transcendentals.md): `exp_shifted` (softmax's e^(x − max)) against `exp`."""
from __future__ import annotations

import numpy as np
import pytest

from rlx_llvm.ir_emit import vecmath as vm
from tests.harness import Kernel


@pytest.fixture(scope="module")
def k(jit):
    """`exp_shifted` and `exp` as f32 kernels of the host's width, one module."""
    return jit.build("test_vecmath_fast", [Kernel("exp_shifted", lambda b, x: vm.exp_shifted(b, x), ins=("f32",)),
                                           Kernel("exp", lambda b, x: vm.exp(b, x), ins=("f32",))])


def f32_between(lo: float, hi: float, stride: int = 1) -> np.ndarray:
    """Every `stride`-th f32 (by bit pattern) in [lo, hi], lo ≤ hi ≤ 0, both ends included."""
    a, b = (int(np.array([v], np.float32).view(np.int32)[0]) for v in (hi, lo))  # bits grow with |x|
    return np.unique(np.r_[np.arange(a, b + 1, stride), b].astype(np.int32)).view(np.float32)


def test_exp_shifted_is_exp_down_to_the_flush(k) -> None:
    """Bit for bit `exp` over [−87.3, 0]: every 1009th f32 (1.1 million, −0 included) and every f32 of
    [−87.3, −80], every 1001st of [−1e−3, 0]."""
    x = np.concatenate([f32_between(vm.EXP_FLUSH_F32, -0.0, 1009), f32_between(vm.EXP_FLUSH_F32, -80.0),
                        f32_between(-1e-3, -0.0, 1001)])
    np.testing.assert_array_equal(k["exp_shifted"](x), k["exp"](x))


def test_exp_shifted_flushes_below_and_keeps_nan(k) -> None:
    """Below −87.3 (where e^x < 1.22e−38) exactly 0; −inf → 0; NaN → NaN."""
    below = np.concatenate([f32_between(-88.8, np.nextafter(np.float32(vm.EXP_FLUSH_F32), np.float32(-100))),
                            np.array([-1e3, -3e38, -np.inf], np.float32)])
    assert not k["exp_shifted"](below).any()
    assert np.abs(k["exp"](below)).max() < 1.22e-38
    assert np.isnan(k["exp_shifted"](np.array([np.nan, -np.nan], np.float32))).all()
