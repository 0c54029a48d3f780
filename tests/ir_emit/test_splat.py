"""Gaussian splatting (Render, Prepare, Rasterize) against the float64 NumPy reference (tests/harness.py).

Scenes: one isotropic splat at the image centre (also against its closed form), overlapping splats listed
back to front (the sort must reorder them), splats off-screen, behind the camera and past `far`, a splat
straddling a tile corner, SH colour of degrees 0–3, and the per-pixel entry limit.  Tolerance: the kernel
runs the same formulas in f32 (≈ 1e-7 relative per operation, a few dozen operations deep, exp to ~1 ulp),
so outputs of order 1 agree to ~1e-6; 2e-5 leaves margin.  Scenes keep depths apart and no alpha near the
cutoff, where f32 and f64 could decide a discontinuity differently.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rlx_llvm import thunks as T
from rlx_llvm.reference.splat import PREP, RADIUS
from rlx_llvm.testing.splat import camera
from tests.harness import Suite, expect_invalid, suite_tests

W, H, TILE = 19, 13, 8
TOL = dict(rtol=2e-5, atol=2e-5)
ARENA = 32 * W * H  # bytes: room for any buffer of the bad-input thunks


def scene(s: Suite, n: int, z=(3.0, 6.0), sh: int = 0) -> dict:
    """Random splats in front of the camera (arrays by field stem)."""
    pos = np.column_stack([s.rng.uniform(-1.2, 1.2, n), s.rng.uniform(-0.8, 0.8, n), s.rng.uniform(*z, n)])
    return dict(positions=pos, scales=s.rng.uniform(0.05, 0.35, (n, 3)), rotations=s.rng.normal(size=(n, 4)),
                opacities=s.rng.uniform(0.3, 0.95, n), colors=s.rng.uniform(0, 1, (n, 3)),
                sh_coeffs=s.rng.normal(0, 0.3, (n, sh, 3)))


def placed(s: Suite, params: dict) -> dict:
    """`*_off`/`*_len` fields of the parameter arrays, put into the suite's arena."""
    fields = {}
    for name, values in params.items():
        values = np.asarray(values, np.float32).reshape(-1)
        fields[f"{name}_off"], fields[f"{name}_len"] = s.put(values), values.size
    return fields


def options(**over) -> dict:
    return dict(width=W, height=H, tile_size=TILE, radius_scale=1.0, alpha_cutoff=1 / 255, max_splat_steps=0,
                transmittance_threshold=1e-4, max_list_entries=0) | over


def render(s: Suite, name: str, params: dict, **over) -> T.GaussianSplatRender:
    """A Render case of the scene `params` on the 19×13 camera."""
    dst, out = s.out(np.float32, 4 * W * H)
    t = T.GaussianSplatRender(**placed(s, params), meta_off=s.put(camera(W, H, 16.0)), dst_off=dst,
                              dst_len=4 * W * H, **options(**over))
    s.add(name, t, [out], **TOL)
    return t


def build() -> Suite:
    s = Suite(13, fill=0xFF)
    one = dict(positions=[[0.0, 0.0, 4.0]], scales=[[0.25] * 3], rotations=[[1, 0, 0, 0]], opacities=[0.8],
               colors=[[1.0, 0.5, 0.25]], sh_coeffs=np.zeros((1, 0, 3)))
    render(s, "centred", one)
    back_to_front = scene(s, 6, z=(2.0, 9.0))
    back_to_front["positions"][:, :2] *= 0.2
    order = np.argsort(-back_to_front["positions"][:, 2])
    render(s, "overlapping", {k: v[order] for k, v in back_to_front.items()})
    hidden = scene(s, 7)
    hidden["positions"][:4] = [[0.0, 0.0, -3.0], [40.0, 0.0, 4.0], [0.0, 0.0, 0.05], [0.0, 0.0, 500.0]]
    render(s, "culled", hidden)
    corner = dict(one, positions=[[(TILE - W / 2) / 4, (TILE - H / 2) / 4, 4.0]])  # on pixel (8, 8): a tile corner
    render(s, "tile-corner", corner)
    render(s, "tile-corner-wide", corner, radius_scale=2.5, tile_size=4)
    for k in (1, 4, 9, 16):
        render(s, f"sh{k}", scene(s, 5, sh=k))
    render(s, "many", scene(s, 24))
    render(s, "step-limit", scene(s, 24), max_splat_steps=3, max_list_entries=5)
    render(s, "threshold", scene(s, 24), transmittance_threshold=0.3, alpha_cutoff=0.05)
    render(s, "empty", {k: v[:0] for k, v in one.items()})

    params = placed(s, scene(s, 9, sh=4))
    meta = s.put(camera(W, H, 16.0))
    prep, out = s.out(np.float32, PREP * 9)
    s.add("prepare", T.GaussianSplatPrepare(**params, meta_off=meta, meta_len=23, prep_off=prep, prep_len=PREP * 9,
                                            **options()), [out], **TOL)
    dst, out = s.out(np.float32, 4 * W * H)
    raster = {k: v for k, v in options().items() if k != "radius_scale"}
    s.add("rasterize", T.GaussianSplatRasterize(prep_off=prep, prep_len=PREP * 9, meta_off=meta, meta_len=21,
                                                dst_off=dst, dst_len=4 * W * H, count=9, **raster), [out], **TOL)

    overlapping = scene(s, 4, z=(2.5, 6.0))
    overlapping["positions"][:, :2] *= 0.3
    backward(s, "backward", overlapping)
    backward(s, "backward-sh9-band1", scene(s, 3, sh=9), sh_band=1)
    backward(s, "backward-clipped", scene(s, 3), loss_grad_clip=0.5)
    return s


def backward(s: Suite, name: str, params: dict, sh_band: int = 3, loss_grad_clip: float = 0.0) -> None:
    """A RenderBackward case: its reference is central differences of the float64 Render, so the tolerance
    covers f32 accumulation over pixels (gradients of order 1–10 agree to ~1e-5 relative in practice)."""
    fields = placed(s, params)
    total = sum(v for k, v in fields.items() if k.endswith("_len"))
    packed, out = s.out(np.float32, total)
    t = T.GaussianSplatRenderBackward(**fields, meta_off=s.put(camera(W, H, 16.0)),
                                      d_loss_off=s.put(s.normal(4 * W * H)), d_loss_len=4 * W * H, packed_off=packed,
                                      packed_len=total, **options(), loss_grad_clip=loss_grad_clip, sh_band=sh_band,
                                      max_anisotropy=0.0)
    s.add(name, t, [out], rtol=1e-3, atol=1e-3)


SUITE = build()

(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


def image(outcome, name: str) -> np.ndarray:
    off, dtype, count = outcome.case(name).outputs[0]
    return outcome.got[off:off + 4 * count].view(np.float32).reshape(H, W, 4)


def test_centred_splat_is_its_closed_form(outcome) -> None:
    """An isotropic splat of σ = 0.25 at depth 4 on the optical axis: σ_px² = (16·0.25/4)² + 0.3 around the
    principal point, so alpha = 0.8·exp(−d²/2σ_px²) in the tiles its 3σ box touches (x tiles 0–1: px < 16), and RGB
    mixes (1, ½, ¼) over the background."""
    img = image(outcome, "centred")
    py, px = np.mgrid[0:H, 0:W] + 0.5
    var = 1.0 + 0.3
    d2 = (px - W / 2) ** 2 + (py - H / 2) ** 2
    alpha = np.where(px < 2 * TILE, 0.8 * np.exp(-d2 / (2 * var)), 0.0)
    alpha = np.where(alpha >= 1 / 255, alpha, 0.0)
    rgb = alpha[..., None] * [1.0, 0.5, 0.25] + (1 - alpha[..., None]) * [0.1, 0.2, 0.3]
    np.testing.assert_allclose(img[..., 3], alpha, atol=1e-5)
    np.testing.assert_allclose(img[..., :3], rgb, atol=1e-5)


def test_scenes_draw_something(outcome) -> None:
    """Guard against vacuous parity: every scene but `empty` covers some pixels, `culled` hides its first four."""
    for name in outcome.suite.names:
        if name.startswith(("prepare", "rasterize", "empty", "backward")):
            continue
        assert image(outcome, name)[..., 3].max() > 0.1, name
    assert not image(outcome, "empty")[..., 3].any()


def test_prepare_sorts_and_culls(outcome) -> None:
    """Prepared depths are non-decreasing, culled records (radius 0) last with depth +inf."""
    off, _, count = outcome.case("prepare").outputs[0]
    rec = outcome.got[off:off + 4 * count].view(np.float32).reshape(-1, PREP)
    assert (np.diff(rec[:, 0]) >= 0).all()
    assert ((rec[:, RADIUS] > 0) == np.isfinite(rec[:, 0])).all()


def _render_fields() -> dict:
    return dict(positions_off=0, positions_len=6, scales_off=0, scales_len=6, rotations_off=0, rotations_len=8,
                opacities_off=0, opacities_len=2, colors_off=0, colors_len=6, sh_coeffs_off=0, sh_coeffs_len=0,
                meta_off=0, dst_off=ARENA // 2, dst_len=4 * W * H, **options())


@pytest.mark.parametrize("field, value", [("positions_len", 7), ("scales_len", 3), ("rotations_len", 6),
                                          ("opacities_len", 3), ("colors_len", 9), ("sh_coeffs_len", 7),
                                          ("sh_coeffs_len", 6 * 2), ("dst_len", 4 * W * H - 4), ("tile_size", 0)])
def test_inconsistent_counts_are_refused(field: str, value: int) -> None:
    expect_invalid(T.GaussianSplatRender(**(_render_fields() | {field: value})), ARENA, field)


def test_prepare_and_rasterize_lengths_are_checked() -> None:
    base = {k: v for k, v in _render_fields().items() if not k.startswith("dst")}
    prepare = T.GaussianSplatPrepare(**base, meta_len=23, prep_off=ARENA // 2, prep_len=2 * PREP)
    expect_invalid(dataclasses.replace(prepare, prep_len=2 * PREP + 1), ARENA, "prep_len")
    expect_invalid(dataclasses.replace(prepare, meta_len=20), ARENA, "meta_len")
    raster = T.GaussianSplatRasterize(prep_off=0, prep_len=3 * PREP, meta_off=0, meta_len=23, dst_off=ARENA // 2,
                                      dst_len=4 * W * H, count=3,
                                      **{k: v for k, v in options().items() if k != "radius_scale"})
    expect_invalid(dataclasses.replace(raster, count=4), ARENA, "prep_len")


def test_backward_is_not_vacuous(outcome) -> None:
    """Every parameter buffer of the backward scene gets non-zero gradients; SH bands above `sh_band` get 0."""
    off, _, count = outcome.case("backward").outputs[0]
    g = outcome.got[off:off + 4 * count].view(np.float32)
    n = 4
    for start, stop in ((0, 3 * n), (3 * n, 6 * n), (6 * n, 10 * n), (10 * n, 11 * n), (11 * n, 14 * n)):
        assert np.abs(g[start:stop]).max() > 1e-3
    off, _, count = outcome.case("backward-sh9-band1").outputs[0]
    sh = outcome.got[off:off + 4 * count].view(np.float32)[14 * 3:].reshape(3, 9, 3)
    assert not sh[:, 4:].any() and np.abs(sh[:, :4]).max() > 1e-3


def test_backward_lengths_are_checked() -> None:
    fields = {k: v for k, v in _render_fields().items() if not k.startswith("dst")}
    t = T.GaussianSplatRenderBackward(**fields, d_loss_off=ARENA // 2, d_loss_len=4 * W * H, packed_off=ARENA // 4,
                                      packed_len=28, loss_grad_clip=0.0, sh_band=0, max_anisotropy=0.0)
    expect_invalid(dataclasses.replace(t, packed_len=27), ARENA, "packed_len")
    expect_invalid(dataclasses.replace(t, d_loss_len=4 * W * H - 4), ARENA, "d_loss_len")
    expect_invalid(dataclasses.replace(t, max_anisotropy=10.0), ARENA, "max_anisotropy")
