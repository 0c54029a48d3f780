"""The quantization kinds against their NumPy references, all cases in one compiled schedule
(tests/harness.py): per-tensor and per-channel layouts whose segments are 1, W−1, W, W+1 and many
vectors long, special values (NaN, ±inf, denormals, exact halves), spec examples written by hand,
and one bad-input test per check rule.  The ONNX oracle is tests/oracles/test_onnx_quantize.py."""
from __future__ import annotations

import numpy as np
import pytest

from rlx_llvm import thunks as T
from rlx_llvm.ops import ScaleMode, SteKind
from tests.harness import HUGE, W, Outcome, Suite, expect_invalid, f32_values, run_reference, suite_tests

I8, F32 = np.dtype(np.int8), np.dtype(np.float32)

# (outer, chan_dim, inner): per tensor, channels on the last axis (inner 1), odd and vector-sized segments
LAYOUTS = [(1, 1, n) for n in (1, W - 1, W, W + 1, 2 * W + 3, 771)] + [
    (5, 7, 1), (3, 4, W - 1), (2, 3, W), (4, 2, W + 1), (2, 5, 37), (1, 64, 3), (9, 1, 13)]


def channels(outer: int, chan_dim: int, inner: int) -> dict:
    """The layout fields of a `[outer, chan_dim, inner]` tensor."""
    return dict(len=outer * chan_dim * inner, chan_axis=1, chan_dim=chan_dim, inner=inner)


def int8_params(s: Suite, chan_dim: int) -> dict:
    """Random positive scales (over six decades) and int8 zero points (extremes included)."""
    scales = 10.0 ** s.rng.uniform(-4, 2, chan_dim)
    zps = s.rng.integers(-128, 128, chan_dim)
    zps[:2] = (-128, 127)[:chan_dim]
    return dict(scales=tuple(float(np.float32(v)) for v in scales), zero_points=tuple(int(z) for z in zps))


def add_quantize(s: Suite, layout: tuple, params: "dict | None" = None, x: "np.ndarray | None" = None,
                 tag: str = "") -> str:
    """A Quantize case over `x` (default: scaled normals with the f32 specials); returns its name."""
    fields = channels(*layout)
    params = params or int8_params(s, layout[1])
    if x is None:
        with np.errstate(over="ignore"):
            x = f32_values(fields["len"], s.seed + len(s.cases), scale=40.0) * np.float32(params["scales"][0])
    q, o = s.out(I8, fields["len"])
    name = f"Quantize-{layout}{tag}"
    s.add(name, T.Quantize(x=s.put(x), q=q, **params, **fields), [o])
    return name


def add_dequantize(s: Suite, layout: tuple, params: "dict | None" = None, tag: str = "") -> str:
    """A Dequantize case over every int8 value (cycled); returns its name."""
    fields = channels(*layout)
    q = (np.arange(fields["len"]) * 37 % 256 - 128).astype(np.int8)
    x, o = s.out(F32, fields["len"])
    name = f"Dequantize-{layout}{tag}"
    s.add(name, T.Dequantize(q=s.put(q), x=x, **(params or int8_params(s, layout[1])), **fields), [o])
    return name


# Quantize with scale 2 (reciprocal 0.5, exact): halves round away from zero; saturation; NaN → zp.
SPEC_X = np.array([1, 3, -1, -3, 5, 255, -257, np.nan, np.inf, -np.inf, 0.9999, -0.0, 1e-45], np.float32)
SPEC_Q = np.array([1, 2, -1, -2, 3, 127, -128, 0, 127, -128, 0, 0, 0], np.int8)


def add_specs(s: Suite) -> None:
    """Hand-written examples: the ties and saturation above, and one per-channel zero point."""
    add_quantize(s, (1, 1, SPEC_X.size), dict(scales=(2.0,), zero_points=(0,)), SPEC_X, tag="-spec")
    s.cases[-1].expect = (s.cases[-1].outputs[0][0], SPEC_Q)
    x = np.array([0.0, 1.0, -1.0, 0.0, 1.0, -1.0], np.float32)      # [1, 2, 3]: channel 0 then channel 1
    add_quantize(s, (1, 2, 3), dict(scales=(0.25, 0.5), zero_points=(10, -128)), x, tag="-spec-zp")
    s.cases[-1].expect = (s.cases[-1].outputs[0][0], np.array([10, 14, 6, -128, -126, -128], np.int8))


MODES = (ScaleMode.PerBatch, ScaleMode.EMA(decay=0.9), ScaleMode.Fixed)
FAKE_LAYOUTS = [(1, 1, 1), (1, 1, W + 1), (1, 1, 771), (5, 7, 1), (3, 4, W - 1), (2, 3, W), (2, 5, 37)]


def fake_input(s: Suite, layout: tuple) -> np.ndarray:
    """Normals with the f32 specials, exact halves of the 2-bit grid, and one channel of zeros."""
    outer, chan_dim, inner = layout
    x = f32_values(outer * chan_dim * inner, s.seed + len(s.cases)).reshape(layout)
    if chan_dim > 2:
        x[:, 1] = 0.0                       # maxabs 0: the scale floor 1e-12
        x[:, 2] = s.rng.integers(-4, 5, (outer, inner)) * 0.5     # x/s on exact halves (2 bits: s = 2)
    return x.reshape(-1)


def add_fake_quantize(s: Suite, layout: tuple, bits: int, mode, state: "np.ndarray | None" = None,
                      x: "np.ndarray | None" = None, tag: str = "") -> str:
    """A FakeQuantize case (EMA/Fixed: the state buffer, random unless given; EMA's state is an output)."""
    fields = channels(*layout)
    out, o = s.out(F32, fields["len"])
    outputs, state_off = [o], None
    if mode != ScaleMode.PerBatch:
        if state is None:
            state = s.rng.uniform(-0.02, 0.2, layout[1]).astype(np.float32)   # some ≤ 0: EMA restarts
        state_off = s.put(state.astype(np.float32))
        if isinstance(mode, ScaleMode.EMA):
            outputs.append((state_off, F32, layout[1]))
    name = f"FakeQuantize-{layout}-{bits}bit-{mode!r}{tag}"
    s.add(name, T.FakeQuantize(x=s.put(fake_input(s, layout) if x is None else x), out=out, bits=bits,
                               ste=SteKind.Identity, scale_mode=mode, state_off=state_off, **fields), outputs)
    return name


def tanh_tolerance(dy: np.ndarray) -> np.ndarray:
    """Per-element bound for the Tanh STE: f32 tanh (a few ulp) against float64's, times |dy|."""
    return 4e-7 * np.abs(dy.astype(np.float64)) + 1e-30


def add_fake_backward(s: Suite, layout: tuple, bits: int, ste: SteKind, tag: str = "") -> str:
    """A FakeQuantizeBackward case; returns its name."""
    fields = channels(*layout)
    dy = f32_values(fields["len"], s.seed + 7 + len(s.cases))
    dx, o = s.out(F32, fields["len"])
    name = f"FakeQuantizeBackward-{layout}-{bits}bit-{ste.name}{tag}"
    how = dict(atol=tanh_tolerance(dy), rtol=1e-6) if ste is SteKind.Tanh else {}
    s.add(name, T.FakeQuantizeBackward(x=s.put(fake_input(s, layout)), dy=s.put(dy), dx=dx, bits=bits, ste=ste,
                                       **fields), [o], **how)
    return name


# FakeQuantize, 2 bits (q_max 1), per tensor: maxabs 2 (NaN ignored) → s = 2; x/s rounds half away.
FAKE_X = np.array([2, 1, -1, 0.99, -0.2, np.nan, 3.0e-39], np.float32)
FAKE_OUT = np.array([2, 2, -2, 0, -0.0, np.nan, 0], np.float32)


def add_fake_specs(s: Suite) -> None:
    """Hand-written FakeQuantize examples: the grid above; EMA restarting from a zero state."""
    add_fake_quantize(s, (1, 1, FAKE_X.size), 2, ScaleMode.PerBatch, x=FAKE_X, tag="-spec")
    s.cases[-1].expect = (s.cases[-1].outputs[0][0], FAKE_OUT)
    x = np.array([4, -1, 0.5, 1, 1, 0], np.float32)          # [1, 2, 3], 2 bits: maxabs 4 and 1
    state = np.array([0.0, 3.0], np.float32)                  # channel 0 restarts (s = 4), channel 1 blends
    add_fake_quantize(s, (1, 2, 3), 2, ScaleMode.EMA(decay=0.5), state, x, tag="-spec")
    # s = (4, 0.5·3 + 0.5·1 = 2): x/s = (1, −0.25, 0.125), (0.5, 0.5, 0) → (4, −0, 0), (2, 2, 0)
    s.cases[-1].expect = (s.cases[-1].outputs[0][0], np.array([4, -0.0, 0, 2, 2, 0], np.float32))


LSQ_KINDS = (T.FakeQuantizeLSQ, T.FakeQuantizeLSQBackwardX, T.FakeQuantizeLSQBackwardScale)


def learned_scales(s: Suite, chan_dim: int, bits: int) -> np.ndarray:
    """Scales putting normal data both inside and beyond ±q_max·s, with odd ones (0, negative, NaN, inf)."""
    q_max = {8: 127.0, 4: 7.0, 2: 1.0}[bits]
    scales = (s.rng.uniform(0.3, 3.0, chan_dim) / q_max).astype(np.float32)
    scales[3:7] = np.array([0.0, -0.5, np.nan, np.inf], np.float32)[:max(0, chan_dim - 3)]
    return scales


def lsq_sum_tolerance(x: np.ndarray, scales: np.ndarray, dy: np.ndarray, layout: tuple, bits: int) -> np.ndarray:
    """Per-channel bound on an f32 sum's error: 1e-6 · Σ|ψ·dy| ≤ 1e-6 · q_max · Σ|dy| (float64)."""
    q_max = {8: 127.0, 4: 7.0, 2: 1.0}[bits]
    return 1e-6 * q_max * np.abs(dy.astype(np.float64)).reshape(layout).sum(axis=(0, 2)) + 1e-30


def add_lsq(s: Suite, kind, layout: tuple, bits: int, x: "np.ndarray | None" = None,
            scales: "np.ndarray | None" = None, dy: "np.ndarray | None" = None, tag: str = "") -> str:
    """An LSQ case of `kind` (forward, x-gradient or scale-gradient); returns its name."""
    fields = channels(*layout)
    x = fake_input(s, layout) if x is None else x
    scales = learned_scales(s, layout[1], bits) if scales is None else scales
    dy = f32_values(fields["len"], s.seed + 11 + len(s.cases)) if dy is None else dy
    common = dict(x=s.put(x), scale_off=s.put(scales), bits=bits, **fields)
    name = f"{kind.__name__}-{layout}-{bits}bit{tag}"
    if kind is T.FakeQuantizeLSQ:
        out, o = s.out(F32, fields["len"])
        s.add(name, kind(out=out, **common), [o])
    elif kind is T.FakeQuantizeLSQBackwardX:
        dx, o = s.out(F32, fields["len"])
        s.add(name, kind(dy=s.put(dy), dx=dx, **common), [o])
    else:
        ds, o = s.out(F32, layout[1])
        s.add(name, kind(dy=s.put(dy), dscale=ds, **common), [o],
              atol=lsq_sum_tolerance(x, scales, dy, layout, bits), rtol=1e-6)
    return name


# LSQ scale gradient, 2 bits (q_max 1), s = 1, dy = 1: ψ = −0.3, −0.3, 1, −1, 0.5 (a tie rounds away) → −0.1
LSQ_X = np.array([0.3, -0.7, 2.0, -5.0, 0.5], np.float32)
# 4 bits (q_max 7), s = 1: ψ = 7 for both; the f32 term 7·(−3e38) overflows to −inf, and −inf + 7·inf is NaN
# (RLX multiplies in f32; a float64 product, −2.1e39, would sum to +inf)
LSQ_OVERFLOW_X, LSQ_OVERFLOW_DY = np.array([10.0, 10.0], np.float32), np.array([-3e38, np.inf], np.float32)


def build() -> Suite:
    s = Suite(41)
    for layout in LAYOUTS:
        add_quantize(s, layout)
        add_dequantize(s, layout)
    add_quantize(s, (1, 1, HUGE), tag="-threads")                       # split across threads
    add_quantize(s, (7, 3, 4001), tag="-threads")
    add_dequantize(s, (3, 5, 2003), tag="-threads")
    add_quantize(s, (4001, 7, 1), tag="-threads")                       # short segments: periodic, threaded
    add_dequantize(s, (3001, 3, 5), tag="-threads")
    small = dict(scales=(1e-38,), zero_points=(3,))                        # reciprocal 1e38: denormals count
    add_quantize(s, (1, 1, 45), small, f32_values(45, 3, scale=1e-39), tag="-tiny-scale")
    add_quantize(s, (1, 1, 19), dict(scales=(3.0e38,), zero_points=(-7,)), tag="-huge-scale")
    add_quantize(s, (1, 1, 21), dict(scales=(-0.1,), zero_points=(0,)), tag="-negative-scale")
    add_dequantize(s, (1, 1, 300), dict(scales=(-1e-30,), zero_points=(-128,)), tag="-negative-scale")
    add_specs(s)
    for layout in FAKE_LAYOUTS:
        for bits, mode in zip((8, 4, 2), MODES):
            add_fake_quantize(s, layout, bits, mode)
        for bits, ste in zip((8, 4, 2, 8), SteKind):
            add_fake_backward(s, layout, bits, ste)
    for mode in MODES:
        add_fake_quantize(s, (1, 1, HUGE), 8, mode, tag="-threads")
        add_fake_quantize(s, (7, 3, 4001), 4, mode, tag="-threads")
        add_fake_quantize(s, (3001, 9, 1), 2, mode, tag="-threads")
    for ste in SteKind:
        add_fake_backward(s, (7, 3, 4001), 2, ste, tag="-threads")
        add_fake_backward(s, (2001, 5, 3), 8, ste, tag="-threads")
    add_fake_quantize(s, (1, 3, 5), 8, ScaleMode.Fixed, np.array([np.nan, -1.0, 1e-30], np.float32), tag="-floor")
    add_fake_quantize(s, (1, 3, 5), 8, ScaleMode.EMA(decay=0.0), np.array([np.nan, np.inf, 1.0], np.float32),
                      tag="-odd-state")
    add_fake_specs(s)
    for layout in FAKE_LAYOUTS + [(2, 9, 5), (3, 2, 2 * W + 3)]:
        for kind, bits in zip(LSQ_KINDS * 2, (8, 4, 2, 2, 8, 4)):
            add_lsq(s, kind, layout, bits)
    for kind in LSQ_KINDS:
        add_lsq(s, kind, (7, 3, 4001), 4, tag="-threads")
        add_lsq(s, kind, (3001, 11, 1), 8, tag="-threads")
    add_lsq(s, T.FakeQuantizeLSQBackwardScale, (1, 1, LSQ_X.size), 2, LSQ_X, np.ones(1, np.float32),
            np.ones(LSQ_X.size, np.float32), tag="-spec")
    s.cases[-1].expect = (s.cases[-1].outputs[0][0], np.array([-0.1], np.float32))
    add_lsq(s, T.FakeQuantizeLSQBackwardScale, (1, 1, 2), 4, LSQ_OVERFLOW_X, np.ones(1, np.float32),
            LSQ_OVERFLOW_DY, tag="-overflow")
    s.cases[-1].expect = (s.cases[-1].outputs[0][0], np.array([np.nan], np.float32))
    return s


SUITE = build()
(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


@pytest.mark.parametrize("name", ["Quantize-(1, 1, 13)-spec", "Quantize-(1, 2, 3)-spec-zp",
                                  "FakeQuantize-(1, 1, 7)-2bit-ScaleMode.PerBatch-spec",
                                  "FakeQuantize-(1, 2, 3)-2bit-ScaleMode.EMA(decay=0.5)-spec"])
def test_spec_examples(outcome: Outcome, name: str) -> None:
    outcome.check_spec(name)


def test_ties_round_away_from_zero(outcome: Outcome) -> None:
    got = outcome.output("Quantize-(1, 1, 13)-spec")
    assert list(got[:5]) == [1, 2, -1, -2, 3], got   # ties to even would give 0, 2, 0, -2, 2


def test_dequantize_inverts_quantize_on_the_grid() -> None:
    """Dequantize(q) quantizes back to q for every int8 value (per channel)."""
    fields, params = channels(1, 3, 256), dict(scales=(0.1, 0.0071, 3.0), zero_points=(-128, 0, 77))
    q = np.tile(np.arange(-128, 128, dtype=np.int8), 3)
    back = run_reference(T.Dequantize(q=0, x=1024, **params, **fields), 8192, {0: q})
    again = run_reference(T.Quantize(x=1024, q=0, **params, **fields), 8192, {1024: back[1024:4096].view(np.float32)})
    assert np.array_equal(again[:768].view(np.int8), q)


def test_lsq_scale_gradient_spec(outcome: Outcome) -> None:
    outcome.check_spec("FakeQuantizeLSQBackwardScale-(1, 1, 5)-2bit-spec", rtol=1e-6)


def test_lsq_scale_gradient_terms_are_f32_products(outcome: Outcome) -> None:
    outcome.check_spec("FakeQuantizeLSQBackwardScale-(1, 1, 2)-4bit-overflow")


def test_ema_spec_writes_the_blended_state(outcome: Outcome) -> None:
    state = outcome.output("FakeQuantize-(1, 2, 3)-2bit-ScaleMode.EMA(decay=0.5)-spec", 1)
    assert list(state) == [4.0, 2.0], state


def central_difference(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """d f/d x element by element, in float64."""
    return (f(x + h) - f(x - h)) / (2 * h)


@pytest.mark.parametrize("ste, surrogate", [
    (SteKind.ClippedIdentity, lambda x, s, q: np.clip(x, -q * s, q * s)),
    (SteKind.Tanh, lambda x, s, q: s * np.tanh(x / s))])
def test_ste_is_the_derivative_of_its_surrogate(ste: SteKind, surrogate) -> None:
    """ClippedIdentity's dx is d/dx clamp(x, ±q_max·s), Tanh's is d/dx s·tanh(x/s) (finite differences,
    away from the clamp's kinks)."""
    x = np.random.default_rng(3).uniform(-2.0, 2.0, 64).astype(np.float32)
    x[0] = 2.5                                                  # the largest: s = 2.5/7 (4 bits)
    s = np.float64(np.float32(np.float32(2.5) / np.float32(7.0)))
    fields = channels(1, 1, x.size)
    dy = np.ones(x.size, np.float32)
    arena = run_reference(T.FakeQuantizeBackward(x=0, dy=512, dx=1024, bits=4, ste=ste, **fields), 2048,
                          {0: x, 512: dy})
    dx = arena[1024:1024 + 4 * x.size].view(np.float32)
    want = central_difference(lambda v: surrogate(v, s, 7.0), x.astype(np.float64))
    away = np.abs(np.abs(x) - 7.0 * s) > 1e-4
    np.testing.assert_allclose(dx[away], want[away], rtol=1e-5, atol=1e-6)


def lsq_reference(kind, x: np.ndarray, scale: float, dy: np.ndarray, bits: int = 4) -> np.ndarray:
    """One per-tensor LSQ kind run by the NumPy reference: its output (f32)."""
    n = x.size
    common = dict(x=0, scale_off=4096, bits=bits, **channels(1, 1, n))
    inputs = {0: x.astype(np.float32), 4096: np.float32([scale]), 8192: dy.astype(np.float32)}
    outputs = {T.FakeQuantizeLSQ: dict(out=12288), T.FakeQuantizeLSQBackwardX: dict(dy=8192, dx=12288),
               T.FakeQuantizeLSQBackwardScale: dict(dy=8192, dscale=12288)}[kind]
    count = 1 if kind is T.FakeQuantizeLSQBackwardScale else n
    return run_reference(kind(**outputs, **common), 16384, inputs)[12288:12288 + 4 * count].view(np.float32)


def test_lsq_gradients_are_derivatives_where_they_exist() -> None:
    """Finite differences: `dx` is d/dx of clamp(x, ±q_max·s) (the STE), and beyond the range, where
    the forward `±q_max·s` is differentiable in s, `dscale` is d/ds of Σ dy·out."""
    rng = np.random.default_rng(5)
    s, q_max = 0.25, 7.0
    x = rng.uniform(-4.0, 4.0, 200).astype(np.float32)
    x = x[np.abs(np.abs(x) - q_max * s) > 1e-3]
    dy = rng.standard_normal(x.size).astype(np.float32)
    dx = lsq_reference(T.FakeQuantizeLSQBackwardX, x, s, dy)
    clamp_grad = central_difference(lambda v: np.clip(v, -q_max * s, q_max * s), x.astype(np.float64))
    np.testing.assert_allclose(dx, dy * clamp_grad, rtol=1e-5, atol=1e-6)
    beyond = x[np.abs(x) > q_max * s]
    dyb = dy[np.abs(x) > q_max * s]
    dscale = lsq_reference(T.FakeQuantizeLSQBackwardScale, beyond, s, dyb)
    forward = lambda scale: float(np.sum(dyb.astype(np.float64) *
                                         lsq_reference(T.FakeQuantizeLSQ, beyond, scale, dyb)))
    h = 1e-3
    np.testing.assert_allclose(dscale[0], (forward(s + h) - forward(s - h)) / (2 * h), rtol=1e-4)


# ── bad input ────────────────────────────────────────────────────────────────

def int8_thunk(kind, **changes):
    fields = dict(len=12, chan_axis=0, chan_dim=2, inner=6, scales=(0.1, 0.2), zero_points=(0, 1)) | changes
    return kind(**(dict(x=0, q=256) | fields))


@pytest.mark.parametrize("kind", [T.Quantize, T.Dequantize])
def test_bad_int8_parameters_are_refused(kind) -> None:
    expect_invalid(int8_thunk(kind, chan_dim=0, scales=(), zero_points=()), 1024, "chan_dim", "at least 1")
    expect_invalid(int8_thunk(kind, inner=0), 1024, "inner", "at least 1")
    expect_invalid(int8_thunk(kind, len=13), 1024, "len", "chan_dim·inner = 12")
    expect_invalid(int8_thunk(kind, scales=(0.1,)), 1024, "scales", "chan_dim = 2")
    expect_invalid(int8_thunk(kind, zero_points=(0, 1, 2)), 1024, "zero_points", "chan_dim = 2")
    expect_invalid(int8_thunk(kind, zero_points=(0, 128)), 1024, "zero_points", "int8")
    expect_invalid(int8_thunk(kind, zero_points=(-129, 0)), 1024, "zero_points", "int8")
    expect_invalid(int8_thunk(kind, scales=(0.1, float("inf"))), 1024, "scales", "finite")
    expect_invalid(int8_thunk(kind, scales=(float("nan"), 0.1)), 1024, "scales", "finite")


def fake_thunk(kind, **changes):
    fields = dict(len=12, chan_axis=0, chan_dim=2, inner=6, bits=8) | changes
    buffers = {T.FakeQuantize: dict(x=0, out=256, ste=SteKind.Identity, scale_mode=ScaleMode.PerBatch, state_off=None),
               T.FakeQuantizeBackward: dict(x=0, dy=256, dx=512, ste=SteKind.Tanh),
               T.FakeQuantizeLSQ: dict(x=0, scale_off=256, out=512),
               T.FakeQuantizeLSQBackwardX: dict(x=0, scale_off=256, dy=384, dx=512),
               T.FakeQuantizeLSQBackwardScale: dict(x=0, scale_off=256, dy=384, dscale=512)}[kind]
    return kind(**(buffers | fields))


@pytest.mark.parametrize("kind", [T.FakeQuantize, T.FakeQuantizeBackward, *LSQ_KINDS])
def test_bad_fake_quantize_fields_are_refused(kind) -> None:
    expect_invalid(fake_thunk(kind, bits=3), 1024, "bits", "8, 4, 2")
    expect_invalid(fake_thunk(kind, bits=16), 1024, "bits", "8, 4, 2")
    expect_invalid(fake_thunk(kind, chan_dim=0), 1024, "chan_dim", "at least 1")
    expect_invalid(fake_thunk(kind, inner=0), 1024, "inner", "at least 1")
    expect_invalid(fake_thunk(kind, len=18), 1024, "len", "chan_dim·inner = 12")


@pytest.mark.parametrize("mode", [ScaleMode.EMA(decay=0.9), ScaleMode.Fixed])
def test_tracked_scale_needs_a_state_buffer(mode) -> None:
    expect_invalid(fake_thunk(T.FakeQuantize, scale_mode=mode), 1024, "state_off", "state buffer")


def test_ema_decay_must_be_finite() -> None:
    thunk = fake_thunk(T.FakeQuantize, scale_mode=ScaleMode.EMA(decay=float("nan")), state_off=768)
    expect_invalid(thunk, 1024, "scale_mode", "finite")
