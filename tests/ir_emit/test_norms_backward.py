"""Norm backward kernels: native code against the float64 references (one compiled schedule), and the
references against the math — finite differences of the forward norms."""
from __future__ import annotations

import numpy as np
import pytest

from rlx_llvm import thunks as T
from rlx_llvm.reference import norms_backward as nb
from rlx_llvm.reference.norms import normalize_rows
from tests.harness import W, WIDTHS, Suite, expect_invalid, f32_at, run_reference, special_rows, suite_tests

F32 = np.dtype(np.float32)


# ── the cases ───────────────────────────────────────────────────────────────

def add_input_grad(s: Suite, kind: str, rows: int, h: int, x: np.ndarray, tag: str = "", inplace: bool = False) -> None:
    """LayerNormBackwardInput / RmsNormBackwardInput (`inplace`: dx is dy)."""
    dy = s.put(s.normal(rows * h))
    dx, o = (dy, (dy, F32, rows * h)) if inplace else s.out(np.float32, rows * h)
    extra = {"beta": s.put(s.normal(h))} if kind.startswith("Rms") else {}
    s.add(f"{kind}-{rows}x{h}{tag}", getattr(T, kind)(x=s.put(x), gamma=s.put(s.normal(h)), dy=dy, dx=dx, rows=rows,
                                                     h=h, eps=1e-5, **extra), [o], rtol=1e-4, atol=1e-4)


def add_param_grad(s: Suite, kind: str, rows: int, h: int, x: np.ndarray, dy: np.ndarray, tag: str = "") -> None:
    """LayerNormBackwardGamma / RmsNormBackwardGamma / RmsNormBackwardBeta."""
    out, o = s.out(np.float32, h)
    name = {"LayerNormBackwardGamma": "dgamma", "RmsNormBackwardGamma": "dgamma", "RmsNormBackwardBeta": "dbeta"}[kind]
    fields = dict(x=s.put(x), dy=s.put(dy), rows=rows, h=h, eps=1e-5, **{name: out})
    if kind.startswith("Rms"):
        fields.update(gamma=s.put(s.normal(h)), beta=s.put(s.normal(h)))
    s.add(f"{kind}-{rows}x{h}{tag}", getattr(T, kind)(**fields), [o], rtol=1e-4, atol=1e-4)


INPUT_KINDS = ("LayerNormBackwardInput", "RmsNormBackwardInput")
PARAM_KINDS = ("LayerNormBackwardGamma", "RmsNormBackwardGamma", "RmsNormBackwardBeta")


def add_norms(s: Suite) -> None:
    for h in WIDTHS:
        for rows in ((0, 1, 7) if h in (W + 1, 771) else (7,)):
            for kind in INPUT_KINDS:
                add_input_grad(s, kind, rows, h, special_rows(s, rows, h))
            for kind in PARAM_KINDS:
                add_param_grad(s, kind, rows, h, s.normal(rows * h, scale=2.0, shift=0.5), s.normal(rows * h))
    for kind in PARAM_KINDS:   # NaN / ±inf in x (LayerNorm: a whole row's x̂) and in dy (one column)
        dy = s.normal(7 * (W + 1))
        dy[3 * (W + 1) + 2], dy[4 * (W + 1) + 5], dy[5 * (W + 1) + 5] = np.nan, np.inf, -np.inf
        add_param_grad(s, kind, 7, W + 1, special_rows(s, 7, W + 1), dy, tag="-special")
    for kind in INPUT_KINDS:   # big enough to split across threads (rows; column vectors below)
        add_input_grad(s, kind, 97, 771, s.normal(97 * 771, scale=2.0, shift=0.5), tag="-threads")
    for kind in PARAM_KINDS:
        h = 3001 if kind == "RmsNormBackwardBeta" else 771
        add_param_grad(s, kind, 97, h, s.normal(97 * h, scale=2.0, shift=0.5), s.normal(97 * h), tag="-threads")
    for kind in INPUT_KINDS:
        add_input_grad(s, kind, 5, 40, s.normal(200), tag="-inplace", inplace=True)


def add_batch_norm(s: Suite) -> None:
    """BatchNormInference backward: channels below, at and around W, long rows, many rows, a negative var."""
    for count, ch in ((7, 3), (5, W), (9, W + 1), (3, 768), (1000, 5), (2, 1001), (1, 1), (0, 5), (97, 1001)):
        n = count * ch
        var = (np.abs(s.normal(ch)) + 0.1).astype(np.float32)
        var[ch // 2] = -1.0 if ch > 2 else var[ch // 2]   # → NaN column, as in the forward
        x, dy = s.normal(n, scale=2.0), s.normal(n)
        if n > 10:
            dy[3], x[7] = np.inf, np.nan
        stats = dict(mean=s.put(s.normal(ch)), var=s.put(var))
        dx, o = s.out(np.float32, n)
        s.add(f"BatchNormInferenceBackwardInput-{count}x{ch}", T.BatchNormInferenceBackwardInput(
            x=s.put(x), gamma=s.put(s.normal(ch)), dy=s.put(dy), dx=dx, count=count, channels=ch, eps=1e-5,
            **stats), [o], rtol=1e-5, atol=1e-5)
        dg, o = s.out(np.float32, ch)
        s.add(f"BatchNormInferenceBackwardGamma-{count}x{ch}", T.BatchNormInferenceBackwardGamma(
            x=s.put(x), dy=s.put(dy), dgamma=dg, count=count, channels=ch, eps=1e-5, **stats), [o],
            rtol=1e-4, atol=1e-4)
        db, o = s.out(np.float32, ch)
        s.add(f"BatchNormInferenceBackwardBeta-{count}x{ch}", T.BatchNormInferenceBackwardBeta(
            dy=s.put(dy), dbeta=db, count=count, channels=ch), [o], rtol=1e-5, atol=1e-5)


def add_group_norm(s: Suite) -> None:
    """GroupNorm backward on NCHW shapes: H·W of 1, below W, W-multiples and odd, empty batches; NaN in one group."""
    for n, c, hh, ww, groups in ((2, 6, 3, 5, 3), (1, 64, 1, 1, 4), (2, 32, 8, 8, 8), (1, 3, 17, 1, 1),
                                 (3, 4, 1, W + 1, 2), (1, 16, 40, 40, 16), (3, 64, 9, 21, 8), (0, 4, 2, 2, 2),
                                 (2, 4, 0, 3, 2), (3, 2 * W + 6, 1, 1, 2)):
        count = n * c * hh * ww
        x, dy = s.normal(count, scale=1.5, shift=1.0), s.normal(count)
        if n == 2 and c == 6:
            x[0], dy[c * hh * ww - 1] = np.nan, np.inf   # the first group of batch 0 NaN; an inf dy in the last channel
        geo = dict(n=n, c=c, h=hh, w=ww)
        name = f"{n}x{c}x{hh}x{ww}-g{groups}"
        dx, o = s.out(np.float32, count)
        s.add(f"GroupNormBackwardInput-{name}", T.GroupNormBackwardInput(
            x=s.put(x), gamma=s.put(s.normal(c)), beta=s.put(s.normal(c)), dy=s.put(dy), dx=dx, num_groups=groups,
            eps=1e-5, **geo), [o], rtol=1e-4, atol=1e-4)
        dg, o = s.out(np.float32, c)
        s.add(f"GroupNormBackwardGamma-{name}", T.GroupNormBackwardGamma(
            x=s.put(x), dy=s.put(dy), dgamma=dg, num_groups=groups, eps=1e-5, **geo), [o], rtol=1e-4, atol=1e-4)
        db, o = s.out(np.float32, c)
        s.add(f"GroupNormBackwardBeta-{name}", T.GroupNormBackwardBeta(dy=s.put(dy), dbeta=db, **geo), [o],
              rtol=1e-5, atol=1e-5)


def modulation_maps(s: Suite, rows: int, h: int) -> dict:
    """name → (mod_len, per-row offsets): the broadcast maps AdaLayerNorm/GatedResidual see, and overlaps."""
    return {"batch": (2 * h, tuple((r * 2 // max(rows, 1)) * h for r in range(rows))),   # [B, 1, D], B = 2
            "rows": (rows * h, tuple(r * h for r in range(rows))),                        # no broadcast
            "shared": (h + 3, (0,) * rows),                 # every row one slice; 3 elements no row reads
            "table": (3 * h, tuple(int(v) for v in s.rng.integers(0, 2 * h + 1, rows)))}  # arbitrary, overlapping


def add_modulated(s: Suite, rows: int, h: int, maps: dict, tag: str = "") -> None:
    """AdaLayerNormBackward (LayerNorm and RMS) and GatedResidualBackward over the broadcast maps `maps`."""
    n = rows * h
    for mname, (mod_len, offs) in maps.items():
        for ln in (True, False):
            dy = s.normal(n)
            if n > 2 * h + 3:   # an inf and a NaN upstream gradient
                dy[h + 1], dy[2 * h + 2] = np.inf, np.nan
            dst, o = s.out(np.float32, n + 2 * mod_len)
            s.add(f"AdaLayerNormBackward-{rows}x{h}-{mname}-ln{int(ln)}{tag}", T.AdaLayerNormBackward(
                x=s.put(special_rows(s, rows, h)), scale=s.put(s.normal(mod_len, scale=0.5)), shift=s.put(s.normal(mod_len)),
                dy=s.put(dy), dst=dst, rows=rows, h=h, eps=1e-6, layer_norm=ln, mod_len=mod_len, mod_off=offs), [o],
                rtol=1e-4, atol=1e-4)
        y, dy = s.normal(n), s.normal(n)
        if n > 2 * h + 3:
            y[h + 1], dy[2 * h + 2], y[n - 1] = np.nan, np.inf, -np.inf
        dst, o = s.out(np.float32, 2 * n + mod_len)
        s.add(f"GatedResidualBackward-{rows}x{h}-{mname}{tag}", T.GatedResidualBackward(
            x=s.put(s.normal(n)), y=s.put(y), gate=s.put(s.normal(mod_len)), dy=s.put(dy), dst=dst, rows=rows, h=h,
            gate_len=mod_len, gate_off=offs), [o], rtol=1e-5, atol=1e-5)


def add_modulations(s: Suite) -> None:
    for h in WIDTHS:
        for rows in ((0, 1, 7) if h in (W + 1, 771) else (7,)):
            add_modulated(s, rows, h, modulation_maps(s, rows, h))
    add_modulated(s, 3, 0, {"empty": (5, (0, 2, 5))})   # h = 0: only zeros for the modulation gradients
    for mname in ("batch", "rows", "shared"):   # big enough to split rows and modulation elements across threads
        add_modulated(s, 97, 771, {mname: modulation_maps(s, 97, 771)[mname]}, tag="-threads")


def build() -> Suite:
    s = Suite(11, rtol=2e-5, atol=2e-5)
    add_norms(s)
    add_modulations(s)
    add_batch_norm(s)
    add_group_norm(s)
    return s


SUITE = build()

(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


# ── the references against the math ─────────────────────────────────────────

def numeric_grad(f, x: np.ndarray, step: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar `f` at every element of `x` (float64)."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = step
        g[i] = (f(x + e) - f(x - e)) / (2 * step)
    return g


@pytest.mark.parametrize("center", [True, False])
def test_norm_gradients_are_the_derivatives_of_the_forward(center: bool) -> None:
    """dx, dγ (and RMS's dβ) equal finite differences of `Σ dy·(norm(x)·γ + β)` with the forward's statistics."""
    rng = np.random.default_rng(1)
    rows, h, eps = 3, 6, 1e-5
    x, dy = rng.standard_normal((rows, h)) * 2 + 0.5, rng.standard_normal((rows, h))
    gamma, beta = rng.standard_normal(h), rng.standard_normal(h)

    def loss(x, gamma, beta):
        return float((dy * (normalize_rows(x, eps, center, two_pass=False) * gamma + beta)).sum())
    grads = nb.layer_norm_grads(x, gamma, dy, eps) if center else nb.rms_norm_grads(x, gamma, dy, eps)
    np.testing.assert_allclose(grads[0], numeric_grad(lambda v: loss(v, gamma, beta), x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grads[1], numeric_grad(lambda v: loss(x, v, beta), gamma), rtol=1e-6, atol=1e-7)
    if not center:
        np.testing.assert_allclose(grads[2], numeric_grad(lambda v: loss(x, gamma, v), beta), rtol=1e-6, atol=1e-7)


def test_group_norm_gradients_are_the_derivatives_of_the_forward() -> None:
    """dx, dγ, dβ equal finite differences of `Σ dy·GroupNorm(x)` (two-pass block statistics)."""
    rng = np.random.default_rng(5)
    n, c, hw, groups, eps = 2, 4, 3, 2, 1e-5
    x, dy = rng.standard_normal((n, c, hw)) * 1.5 + 1.0, rng.standard_normal((n, c, hw))
    gamma, beta = rng.standard_normal(c), rng.standard_normal(c)

    def loss(x, gamma, beta):
        xh = normalize_rows(x.reshape(n * groups, -1), eps, center=True, two_pass=True).reshape(n, c, hw)
        return float((dy * (xh * gamma[None, :, None] + beta[None, :, None])).sum())
    dx, dg, db = nb.group_norm_grads(x, gamma, dy, groups, eps)
    np.testing.assert_allclose(dx, numeric_grad(lambda v: loss(v, gamma, beta), x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dg, numeric_grad(lambda v: loss(x, v, beta), gamma), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(db, numeric_grad(lambda v: loss(x, gamma, v), beta), rtol=1e-6, atol=1e-7)


def test_batch_norm_inference_gradients_are_the_derivatives_of_the_forward() -> None:
    """The three BatchNormInference backward references against finite differences of the forward reference."""
    rng = np.random.default_rng(6)
    count, ch = 4, 3
    x, dy = rng.standard_normal(count * ch).astype(np.float32), rng.standard_normal(count * ch).astype(np.float32)
    g, b, mean = (rng.standard_normal(ch).astype(np.float32) for _ in range(3))
    var = (rng.random(ch) + 0.5).astype(np.float32)
    geo = dict(count=count, channels=ch, eps=1e-5)
    inputs = {0: x, 256: g, 512: b, 768: mean, 1024: var, 1536: dy}

    def loss(off: int, v: np.ndarray) -> float:   # Σ dy·BatchNormInference(...) with input `off` replaced by v
        y = f32_at(run_reference(T.BatchNormInference(src=0, g=256, b=512, mean=768, var=1024, dst=2048, **geo), 4096,
                            {**inputs, off: v.astype(np.float32)}), 2048, count * ch)
        return float(y.astype(np.float64) @ dy.astype(np.float64))

    def fd(off: int, v: np.ndarray) -> np.ndarray:   # the forward is affine in x, g and b: any step will do
        return np.array([(loss(off, v + e / 8) - loss(off, v - e / 8)) * 4 for e in np.eye(v.size, dtype=np.float32)])
    bwd = lambda thunk, off, m: f32_at(run_reference(thunk, 4096, inputs), off, m)  # noqa: E731
    dx = bwd(T.BatchNormInferenceBackwardInput(x=0, gamma=256, mean=768, var=1024, dy=1536, dx=2048, **geo), 2048,
             x.size)
    dg = bwd(T.BatchNormInferenceBackwardGamma(x=0, mean=768, var=1024, dy=1536, dgamma=2048, **geo), 2048, ch)
    db = bwd(T.BatchNormInferenceBackwardBeta(dy=1536, dbeta=2048, count=count, channels=ch), 2048, ch)
    for got, off, v in ((dx, 0, x), (dg, 256, g), (db, 512, b)):
        np.testing.assert_allclose(got, fd(off, v), rtol=1e-4, atol=1e-4)


def test_group_norm_backward_groups_must_divide_channels() -> None:
    expect_invalid(T.GroupNormBackwardInput(x=0, gamma=256, beta=512, dy=1024, dx=2048, n=1, c=6, h=2, w=2,
                                            num_groups=4, eps=1e-5), 4096, "num_groups")


def test_group_norm_backward_gamma_needs_a_group() -> None:
    expect_invalid(T.GroupNormBackwardGamma(x=0, dy=1024, dgamma=2048, n=1, c=6, h=2, w=2, num_groups=0, eps=1e-5),
                   4096, "num_groups")


# ── AdaLayerNorm / GatedResidual backward against finite differences of the forward references ──

def _ada_forward(x, scale, shift, offs, ln: bool, eps: float) -> np.ndarray:
    rows, h = x.shape
    t = T.AdaLayerNorm(src=0, scale=1024, shift=2048, dst=4096, rows=rows, h=h, eps=eps, layer_norm=ln,
                       mod_len=scale.size, mod_off=offs)
    return f32_at(run_reference(t, 8192, {0: x.astype(np.float32).reshape(-1), 1024: scale, 2048: shift}), 4096,
                   rows * h).reshape(rows, h)


@pytest.mark.parametrize("ln", [True, False])
def test_ada_layer_norm_backward_is_the_derivative_of_the_forward(ln: bool) -> None:
    """dx, dscale, dshift against central differences of `Σ dy·AdaLayerNorm(x)`: the float64 core with the
    forward's float64 math (tight), and the AdaLayerNormBackward reference against the f32 forward reference.
    Rows 0 and 2 share a modulation slice, row 1 overlaps it half-way: their contributions add up, and the
    elements no row reads (the last 2) get 0."""
    rng = np.random.default_rng(7)
    rows, h, eps, offs = 3, 6, 1e-5, (0, 3, 0)
    mod_len = 11
    x, dy = rng.standard_normal((rows, h)) * 2 + 0.5, rng.standard_normal((rows, h))
    scale, shift = rng.standard_normal(mod_len) * 0.5, rng.standard_normal(mod_len)
    cols = np.asarray(offs)[:, None] + np.arange(h)

    def loss(x, scale, shift):   # the forward in float64: two-pass LayerNorm (or RMS), no affine, then modulation
        y = normalize_rows(x, eps, ln, two_pass=True) * (1 + scale[cols]) + shift[cols]
        return float((dy * y).sum())
    dx, ds, dt = nb.ada_layer_norm_grads(x, scale, dy, offs, eps, ln)
    np.testing.assert_allclose(dx, numeric_grad(lambda v: loss(v, scale, shift), x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ds, numeric_grad(lambda v: loss(x, v, shift), scale), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dt, numeric_grad(lambda v: loss(x, scale, v), shift), rtol=1e-6, atol=1e-7)
    assert (ds[9:] == 0).all() and (dt[9:] == 0).all()
    np.testing.assert_allclose(dt[:3], dy[0, :3] + dy[2, :3])            # two rows on one element
    np.testing.assert_allclose(dt[3:6], (dy[0, 3:] + dy[1, :3] + dy[2, 3:]))  # three rows

    # the packed reference against finite differences of the f32 forward reference (loss in f64)
    x32, dy32 = x.astype(np.float32), dy.astype(np.float32)
    s32, t32 = scale.astype(np.float32), shift.astype(np.float32)
    got = f32_at(run_reference(T.AdaLayerNormBackward(x=0, scale=1024, shift=2048, dy=3072, dst=4096, rows=rows, h=h,
                                                 eps=eps, layer_norm=ln, mod_len=mod_len, mod_off=offs), 8192,
                          {0: x32.reshape(-1), 1024: s32, 2048: t32, 3072: dy32.reshape(-1)}), 4096,
                  rows * h + 2 * mod_len)
    f32_loss = lambda xx, ss, tt: float((dy32.astype(np.float64) * _ada_forward(  # noqa: E731
        xx, ss.astype(np.float32), tt.astype(np.float32), offs, ln, eps)).sum())
    step = 2.0 ** -8
    fd = lambda f, v: np.array([(f(v + e * step) - f(v - e * step)) / (2 * step)  # noqa: E731
                                for e in np.eye(v.size).reshape(v.size, *v.shape)])
    np.testing.assert_allclose(got[:rows * h], fd(lambda v: f32_loss(v, s32, t32), x32.astype(np.float64)),
                               rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(got[rows * h:rows * h + mod_len], fd(lambda v: f32_loss(x32, v, t32),
                                                                    s32.astype(np.float64)), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(got[rows * h + mod_len:], fd(lambda v: f32_loss(x32, s32, v), t32.astype(np.float64)),
                               rtol=1e-3, atol=1e-3)


def test_gated_residual_backward_is_the_derivative_of_the_forward() -> None:
    """`[dx ‖ dy ‖ dgate]` against central differences of `Σ dy·GatedResidual(x, y, gate)` (forward reference);
    overlapping gate slices add up, unread gate elements get 0."""
    rng = np.random.default_rng(8)
    rows, h, offs, gate_len = 3, 5, (0, 2, 0), 9
    n = rows * h
    x, y, dy = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    gate = rng.standard_normal(gate_len).astype(np.float32)
    inputs = {0: x, 1024: y, 2048: gate}
    fwd = T.GatedResidual(x=0, y=1024, gate=2048, dst=4096, rows=rows, h=h, gate_len=gate_len, gate_off=offs)

    def fd(off: int, v: np.ndarray) -> np.ndarray:   # the forward is affine in each input: any step will do
        loss = lambda u: float(f32_at(run_reference(fwd, 8192, {**inputs, off: u.astype(np.float32)}), 4096,  # noqa: E731
                                       n).astype(np.float64) @ dy.astype(np.float64))
        return np.array([(loss(v + e / 8) - loss(v - e / 8)) * 4 for e in np.eye(v.size, dtype=np.float32)])
    got = f32_at(run_reference(T.GatedResidualBackward(x=0, y=1024, gate=2048, dy=3072, dst=4096, rows=rows, h=h,
                                                  gate_len=gate_len, gate_off=offs), 8192, {**inputs, 3072: dy}),
                  4096, 2 * n + gate_len)
    for part, (off, v) in zip((got[:n], got[n:2 * n], got[2 * n:]), ((0, x), (1024, y), (2048, gate))):
        np.testing.assert_allclose(part, fd(off, v), rtol=1e-5, atol=1e-5)
    assert (got[2 * n + 7:] == 0).all()


# ── bad inputs: the forward's offset rules ──────────────────────────────────

def test_ada_layer_norm_backward_offsets_per_row() -> None:
    expect_invalid(T.AdaLayerNormBackward(x=0, scale=1024, shift=2048, dy=3072, dst=4096, rows=4, h=8, eps=1e-6,
                                          layer_norm=True, mod_len=16, mod_off=(0, 8, 0)), 8192, "mod_off")


def test_ada_layer_norm_backward_offsets_inside_mod_len() -> None:
    expect_invalid(T.AdaLayerNormBackward(x=0, scale=1024, shift=2048, dy=3072, dst=4096, rows=2, h=8, eps=1e-6,
                                          layer_norm=False, mod_len=16, mod_off=(0, 9)), 8192, "mod_off")


def test_gated_residual_backward_offsets_per_row() -> None:
    expect_invalid(T.GatedResidualBackward(x=0, y=1024, gate=2048, dy=3072, dst=4096, rows=2, h=8, gate_len=16,
                                           gate_off=(0,)), 8192, "gate_off")


def test_gated_residual_backward_offsets_inside_gate_len() -> None:
    expect_invalid(T.GatedResidualBackward(x=0, y=1024, gate=2048, dy=3072, dst=4096, rows=2, h=8, gate_len=8,
                                           gate_off=(0, 8)), 8192, "gate_off")
