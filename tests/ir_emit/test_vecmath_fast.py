"""The cheaper vecmath paths (docs/transcendentals.md): `exp_shifted` (softmax's e^(x − max)) against `exp`; erf and
erfc with the tail's piece by a lane permute against the select chain."""
from __future__ import annotations

import numpy as np
import pytest

from rlx_llvm.ir_emit import vecmath as vm
from rlx_llvm.ir_emit.toolkit import F32, F64, vec
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


# ── erf / erfc: the tail's piece by a lane permute, bit for bit the select chain ──────────────

ERF_KERNELS = [("erfc", vm.erfc, "f32", 16), ("erfc", vm.erfc, "f32", 8), ("erf", vm.erf, "f32", 16),
               ("erf", vm.erf, "f64", 8)]


@pytest.fixture(scope="module")
def pieces(jit):
    """erf/erfc kernels (f32 at 16 and 8 lanes, f64 at 8) twice: as emitted for this host, and with the tail's
    piece chosen by compares and selects (what a host without a variable lane permute runs)."""
    def build(key: str):
        return jit.build(key, [Kernel(f"{name}_{ty}x{w}_{key}", fn, ins=(ty,), outs=(ty,), width=w)
                               for name, fn, ty, w in ERF_KERNELS])
    host = build("host")
    real = vm.permute_intrinsic
    vm.permute_intrinsic = lambda ty: ""
    try:
        return host, build("selects")
    finally:
        vm.permute_intrinsic = real


def tail_inputs(dtype) -> np.ndarray:
    """±: every 613th f32 of [0, 11] (f64: every 4 398 046 511 111th, ≈ 1M each), each piece edge and clamp
    end ± 2 ulp, inf, NaN and the largest finite value."""
    ity = np.int32 if dtype == np.float32 else np.int64
    top = int(np.array([11.0], dtype).view(ity)[0])
    grid = np.arange(0, top, 613 if dtype == np.float32 else 4_398_046_511_111, dtype=ity).view(dtype)
    fty = F32 if dtype == np.float32 else F64
    pieces = vm.ERFC_G_F32 if fty == F32 else vm.ERFC_G_F64
    edges = np.array([p[0] for p in pieces[:-1]] + list(vm._PIECE_RANGE[fty]), dtype)
    near = (edges.view(ity)[:, None] + np.arange(-2, 3, dtype=ity)).ravel().view(dtype)
    x = np.concatenate([grid, near, np.array([np.inf, np.nan, np.finfo(dtype).max], dtype)])
    return np.concatenate([x, -x])


@pytest.mark.parametrize("name, ty, w", [(n, t, w) for n, _, t, w in ERF_KERNELS],
                         ids=[f"{n}-{t}x{w}" for n, _, t, w in ERF_KERNELS])
def test_erf_pieces_by_permute_match_selects(pieces, name, ty, w) -> None:
    """The permute (`vm.permute_intrinsic`: AVX-512 / AVX2 where the host has it) gives the select chain's bits."""
    host, selects = pieces
    x = tail_inputs(np.float32 if ty == "f32" else np.float64)
    got, want = host[f"{name}_{ty}x{w}_host"](x), selects[f"{name}_{ty}x{w}_selects"](x)
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))
    permutes = host.function_asm(f"{name}_{ty}x{w}_host").count("vperm")
    assert permutes >= (10 if vm.permute_intrinsic(vec(F32 if ty == "f32" else F64, w)) else 0)
    assert selects.function_asm(f"{name}_{ty}x{w}_selects").count("vperm") == 0
