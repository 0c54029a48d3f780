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


def build() -> Suite:
    s = Suite(41)
    for layout in LAYOUTS:
        add_quantize(s, layout)
        add_dequantize(s, layout)
    add_quantize(s, (1, 1, HUGE), tag="-threads")                       # split across threads
    add_quantize(s, (7, 3, 4001), tag="-threads")
    add_dequantize(s, (3, 5, 2003), tag="-threads")
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
    for ste in SteKind:
        add_fake_backward(s, (7, 3, 4001), 2, ste, tag="-threads")
    add_fake_quantize(s, (1, 3, 5), 8, ScaleMode.Fixed, np.array([np.nan, -1.0, 1e-30], np.float32), tag="-floor")
    add_fake_quantize(s, (1, 3, 5), 8, ScaleMode.EMA(decay=0.0), np.array([np.nan, np.inf, 1.0], np.float32),
                      tag="-odd-state")
    add_fake_specs(s)
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
    if kind is T.FakeQuantize:
        fields = dict(x=0, out=256, ste=SteKind.Identity, scale_mode=ScaleMode.PerBatch, state_off=None) | fields
    else:
        fields = dict(x=0, dy=256, dx=512, ste=SteKind.Tanh) | fields
    return kind(**fields)


@pytest.mark.parametrize("kind", [T.FakeQuantize, T.FakeQuantizeBackward])
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
