"""Examples of the Gaussian splatting kinds: a few splats in front of a pinhole camera (docs/lowering-splat.md)."""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..reference.splat import PREP
from .layout import Example, Values, buffer_fields, example, normal, uniform

WIDTH, HEIGHT, TILE = 13, 11, 8
SPLATS = 5


def camera(width: int = WIDTH, height: int = HEIGHT, focal: float = 14.0) -> np.ndarray:
    """The 23-element meta: identity view, focal `focal` px, centred principal point, near 0.1, far 100,
    background (0.1, 0.2, 0.3), two reserved zeros."""
    view = np.hstack([np.eye(3), np.zeros((3, 1))]).reshape(-1)
    return np.concatenate([view, [focal, focal, width / 2, height / 2, 0.1, 100.0, 0.1, 0.2, 0.3, 0.0, 0.0]]
                          ).astype(np.float32)


def in_front(rng: np.random.Generator, count: int) -> np.ndarray:
    """Positions (x, y, z) with |x|, |y| < 1 and z in [3, 5): inside the example camera's view."""
    p = rng.uniform(-1.0, 1.0, (count // 3, 3))
    p[:, 2] = rng.uniform(3.0, 5.0, count // 3)
    return p.reshape(-1).astype(np.float32)


POSITIONS = Values(np.dtype("f4"), in_front)
META = Values(np.dtype("f4"), lambda rng, n: camera()[:n])


def params(n: int = SPLATS, sh: int = 0) -> dict:
    """The parameter fields of `n` splats (placeholder offsets), with `sh` SH coefficients per channel."""
    fields = {}
    for name, per in (("positions", 3), ("scales", 3), ("rotations", 4), ("opacities", 1), ("colors", 3),
                      ("sh_coeffs", 3 * sh)):
        fields[f"{name}_off"], fields[f"{name}_len"] = 0, per * n
    return fields


def limits(radius_scale: float = 1.0) -> dict:
    """The image, tile and compositing fields shared by the kinds."""
    return dict(width=WIDTH, height=HEIGHT, tile_size=TILE, alpha_cutoff=1 / 255, max_splat_steps=0,
                transmittance_threshold=1e-4, max_list_entries=0) | {"radius_scale": radius_scale}


VALUES = dict(positions_off=POSITIONS, scales_off=uniform(0.1, 0.4), rotations_off=normal(),
              opacities_off=uniform(0.3, 0.9), colors_off=uniform(0.0, 1.0), sh_coeffs_off=normal(scale=0.3),
              meta_off=META)


def splat() -> list[Example]:
    """Render (plain and SH degree 1), Prepare and Rasterize of five splats into a 13×11 image, 8-pixel tiles."""
    image = dict(dst_off=0, dst_len=4 * WIDTH * HEIGHT)
    prepared = dict(prep_off=0, prep_len=PREP * SPLATS)
    cases = [("GaussianSplatRender/plain", T.GaussianSplatRender(**params(), meta_off=0, **image, **limits())),
             ("GaussianSplatRender/sh1", T.GaussianSplatRender(**params(sh=4), meta_off=0, **image, **limits())),
             ("GaussianSplatPrepare", T.GaussianSplatPrepare(**params(), meta_off=0, meta_len=23, **prepared,
                                                             **limits()))]
    out = [example(name, t, rtol=1e-4, **{k: v for k, v in VALUES.items() if k in buffer_fields(t)})
           for name, t in cases]
    raster = {k: v for k, v in limits().items() if k != "radius_scale"}
    out.append(example("GaussianSplatRasterize",
                       T.GaussianSplatRasterize(**prepared, meta_off=0, meta_len=23, **image, count=SPLATS,
                                                **raster), rtol=1e-4, prep_off=PREPARED, meta_off=META))
    return out + splat_backward()


def _prepared(rng: np.random.Generator, count: int) -> np.ndarray:
    """Prepared records: centres on the image, small conics, radii of a few pixels, increasing depth."""
    n = count // PREP
    rec = np.zeros((n, PREP))
    rec[:, 0] = np.sort(rng.uniform(1.0, 5.0, n))
    rec[:, 1], rec[:, 2] = rng.uniform(0, WIDTH, n), rng.uniform(0, HEIGHT, n)
    rec[:, 3], rec[:, 4], rec[:, 5] = rng.uniform(0.1, 0.5, n), rng.uniform(-0.05, 0.05, n), rng.uniform(0.1, 0.5, n)
    rec[:, 6] = rng.uniform(0.3, 0.9, n)
    rec[:, 7:10] = rng.uniform(0, 1, (n, 3))
    rec[:, 10] = rng.uniform(2.0, 8.0, n)
    return rec.reshape(-1).astype(np.float32)


PREPARED = Values(np.dtype("f4"), _prepared)



def splat_backward() -> list[Example]:
    """RenderBackward of three splats (plain, and SH degree 1 with band 1) — checked against central differences."""
    out = []
    for sh in (0, 4):
        fields = params(3, sh)
        t = T.GaussianSplatRenderBackward(
            **fields, meta_off=0, d_loss_off=0, d_loss_len=4 * WIDTH * HEIGHT, packed_off=0,
            packed_len=sum(v for k, v in fields.items() if k.endswith("_len")), **limits(), loss_grad_clip=0.0,
            sh_band=1, max_anisotropy=0.0)
        values = {k: v for k, v in VALUES.items() if k in buffer_fields(t)}
        out.append(example(f"GaussianSplatRenderBackward/sh{sh}", t, rtol=2e-3, d_loss_off=normal(), **values))
    return out
