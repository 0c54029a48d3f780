"""Float64 NumPy reference of the 3-D Gaussian splatting kinds (docs/lowering-splat.md).

`project` and `sh_colour` are written once over "numbers" — anything with `+ − · /` and comparisons —
and a math namespace `m` with `sqrt`, `fmax`, `where`: NumPy arrays with `m = numpy` here (all splats at
once, in float64), scalar IR values in `ir_emit/splat.py` (one splat, in f32).  Compositing is written
separately in each (vectorised over pixels here, a per-pixel loop there).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import thunks as T
from . import read_f64, reference, view

# meta (f32): view matrix [R | t] 3×4 row-major (world → camera, OpenCV axes: x right, y down, z forward),
# fx, fy, cx, cy (pixels), near, far, background RGB; the last two elements are reserved.
VIEW, INTRINSICS, CLIP, BACKGROUND = slice(0, 12), slice(12, 16), slice(16, 18), slice(18, 21)
META_USED = 21
# One prepared splat: depth, centre (u, v), conic (a, b, c) = inverse 2-D covariance [[a, b], [b, c]],
# opacity, RGB, screen radius.  Culled splats are zeros with depth +inf (sorted last, never drawn).
PREP = 11
DEPTH, U, V, CONIC_A, CONIC_B, CONIC_C, OPACITY, RED, GREEN, BLUE, RADIUS = range(PREP)
LOW_PASS = 0.3        # added to the 2-D covariance's diagonal (3DGS / gsplat `eps2d`)
MIN_SPREAD = 0.1      # floor of (a − c)²/4 + b² in the largest eigenvalue (as gsplat)
MAX_ALPHA = 0.99      # alpha is clamped below 1 (as 3DGS)
SH_DEGREES = {1: 0, 4: 1, 9: 2, 16: 3}   # SH coefficients per channel → degree
# The parameter buffers; RenderBackward's `packed` holds their gradients in this order, each laid out as its buffer.
GRAD_PARAMS = ("positions", "scales", "rotations", "opacities", "colors", "sh_coeffs")

_C1 = 0.4886025119029199
_C2 = (1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792, 0.5462742152960396)
_C3 = (-0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154, -0.4570457994644658,
       1.445305721320277, -0.5900435899266435)


def sh_basis(x: Any, y: Any, z: Any, k: int) -> list:
    """The first `k` real SH basis functions (3DGS's order and signs) of a unit direction."""
    xx, yy, zz = x * x, y * y, z * z
    basis = [0.28209479177387814 + 0.0 * x, -_C1 * y, _C1 * z, -_C1 * x,
             _C2[0] * (x * y), _C2[1] * (y * z), _C2[2] * (2.0 * zz - xx - yy), _C2[3] * (x * z),
             _C2[4] * (xx - yy),
             _C3[0] * y * (3.0 * xx - yy), _C3[1] * (x * y) * z, _C3[2] * y * (4.0 * zz - xx - yy),
             _C3[3] * z * (2.0 * zz - 3.0 * xx - 3.0 * yy), _C3[4] * x * (4.0 * zz - xx - yy),
             _C3[5] * z * (xx - yy), _C3[6] * x * (xx - 3.0 * yy)]
    return basis[:k]


def sh_colour(m: Any, direction: Sequence, coeffs: Sequence[Sequence]) -> list:
    """RGB `max(Σ_k Y_k(dir)·coeffs[k] + ½, 0)` of a unit view direction (`coeffs[k]` is RGB)."""
    basis = sh_basis(*direction, len(coeffs))
    return [m.fmax(sum(y * c[ch] for y, c in zip(basis, coeffs)) + 0.5, 0.0) for ch in range(3)]


def quaternion_matrix(m: Any, q: Sequence) -> list:
    """Rotation matrix (rows) of the quaternion (w, x, y, z), normalised first."""
    inv = 1.0 / m.sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3])
    w, x, y, z = (c * inv for c in q)
    return [[1.0 - 2.0 * (y * y + z * z), 2.0 * (x * y - w * z), 2.0 * (x * z + w * y)],
            [2.0 * (x * y + w * z), 1.0 - 2.0 * (x * x + z * z), 2.0 * (y * z - w * x)],
            [2.0 * (x * z - w * y), 2.0 * (y * z + w * x), 1.0 - 2.0 * (x * x + y * y)]]


def _matmul(a: list, b: list) -> list:
    return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


def _transpose(a: list) -> list:
    return [list(r) for r in zip(*a)]


def project(m: Any, meta: Sequence, radius_scale: float, position: Sequence, scale: Sequence,
            rotation: Sequence) -> tuple[Any, list]:
    """(visible, [depth, u, v, conic a, b, c, radius]) of one splat (or arrays of them): the EWA projection
    `Σ' = J W Σ Wᵀ Jᵀ + 0.3·I` of `Σ = R S Sᵀ Rᵀ`, radius = radius_scale · 3·√λ_max(Σ')."""
    view_rows = [meta[4 * r:4 * r + 4] for r in range(3)]
    fx, fy, cx, cy = meta[INTRINSICS]
    near, far = meta[CLIP]
    x, y, z = (r[0] * position[0] + r[1] * position[1] + r[2] * position[2] + r[3] for r in view_rows)
    rs = [[c * s for c, s in zip(row, scale)] for row in quaternion_matrix(m, rotation)]      # R·S
    w = [r[:3] for r in view_rows]
    inv_z = 1.0 / z
    jac = [[fx * inv_z, 0.0, -fx * x * inv_z * inv_z], [0.0, fy * inv_z, -fy * y * inv_z * inv_z]]
    t = _matmul(_matmul(jac, w), rs)                                                           # J W R S
    cov = _matmul(t, _transpose(t))
    a, b, c = cov[0][0] + LOW_PASS, cov[0][1], cov[1][1] + LOW_PASS
    det = a * c - b * b
    half = 0.5 * (a - c)
    lam = 0.5 * (a + c) + m.sqrt(m.fmax(half * half + b * b, MIN_SPREAD))
    radius = radius_scale * 3.0 * m.sqrt(lam)
    visible = (z > near) & (z < far) & (det > 0.0) & (radius > 0.0)
    return visible, [z, fx * x * inv_z + cx, fy * y * inv_z + cy, c / det, -b / det, a / det, radius]


def camera_centre(meta: Sequence) -> list:
    """`−Rᵀ t`: the camera's position in world space."""
    return [-(meta[c] * meta[3] + meta[4 + c] * meta[7] + meta[8 + c] * meta[11]) for c in range(3)]


def view_direction(m: Any, meta: Sequence, position: Sequence) -> list:
    """Unit vector from the camera centre to the splat."""
    d = [p - c for p, c in zip(position, camera_centre(meta))]
    inv = 1.0 / m.sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2])
    return [c * inv for c in d]


def splat_count(t) -> int:
    """Splats in a thunk: `positions_len / 3`."""
    return t.positions_len // 3


def sh_per_channel(t) -> int:
    """SH coefficients per colour channel (0: plain `colors`)."""
    n = splat_count(t)
    return t.sh_coeffs_len // (3 * n) if n else 0


def limit(*limits: int) -> float:
    """The tightest of per-pixel entry limits, 0 meaning none."""
    return min([v for v in limits if v > 0], default=np.inf)


# ── stages ──────────────────────────────────────────────────────────────────

def parameters(arena: np.ndarray, t) -> dict:
    """The splat parameter buffers as float64 arrays, by name."""
    return {name: read_f64(arena, getattr(t, f"{name}_off"), getattr(t, f"{name}_len")) for name in GRAD_PARAMS}


def prepare(params: dict, meta: np.ndarray, t) -> np.ndarray:
    """`[n, PREP]` float64 prepared splats, depth-sorted (stable), culled ones last as zeros + inf depth."""
    n = splat_count(t)
    f = lambda name, width: params[name].reshape(n, width).T
    pos, scale, rot = f("positions", 3), f("scales", 3), f("rotations", 4)
    with np.errstate(all="ignore"):
        visible, (depth, u, v, ca, cb, cc, radius) = project(np, meta, float(t.radius_scale), pos, scale, rot)
        k = sh_per_channel(t)
        if k:
            coeffs = params["sh_coeffs"].reshape(n, k, 3).transpose(1, 2, 0)
            rgb = sh_colour(np, view_direction(np, meta, pos), coeffs)
        else:
            rgb = f("colors", 3)
        rec = np.stack([depth, u, v, ca, cb, cc, f("opacities", 1)[0], *rgb, radius], axis=1)
    rec = np.where(visible[:, None], rec, 0.0)
    rec[~visible, DEPTH] = np.inf
    return rec[np.argsort(rec[:, DEPTH], kind="stable")]


def rasterize(prep: np.ndarray, meta: np.ndarray, t) -> np.ndarray:
    """`[height, width, 4]` RGBA: each pixel composites its tile's list front to back."""
    h, w, ts = t.height, t.width, t.tile_size
    py, px = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    cx, cy = px + 0.5, py + 0.5
    tx, ty = px // ts, py // ts
    colour, trans = np.zeros((h, w, 3)), np.ones((h, w))
    seen = np.zeros((h, w))
    active = np.ones((h, w), bool)
    cap = limit(t.max_list_entries, t.max_splat_steps)
    with np.errstate(all="ignore"):
        for s in prep:
            r = s[RADIUS]
            in_tile = ((np.floor((s[U] - r) / ts) <= tx) & (tx < np.ceil((s[U] + r) / ts))
                       & (np.floor((s[V] - r) / ts) <= ty) & (ty < np.ceil((s[V] + r) / ts)) & (r > 0))
            step = active & in_tile & (seen < cap)
            seen += in_tile
            dx, dy = cx - s[U], cy - s[V]
            power = -0.5 * (s[CONIC_A] * dx * dx + s[CONIC_C] * dy * dy) - s[CONIC_B] * dx * dy
            alpha = s[OPACITY] * np.exp(power)
            alpha = np.where(alpha > MAX_ALPHA, MAX_ALPHA, alpha)
            draw = step & (power <= 0.0) & (alpha >= t.alpha_cutoff)
            after = trans * (1.0 - alpha)
            stop = draw & (after <= t.transmittance_threshold)
            active &= ~stop
            draw &= ~stop
            colour += np.where(draw[..., None], (alpha * trans)[..., None] * s[RED:BLUE + 1], 0.0)
            trans = np.where(draw, after, trans)
    rgb = colour + trans[..., None] * meta[BACKGROUND]
    return np.concatenate([rgb, (1.0 - trans)[..., None]], axis=2)


def _meta(arena: np.ndarray, t) -> np.ndarray:
    return read_f64(arena, t.meta_off, META_USED)


def _store(arena: np.ndarray, off: int, values: np.ndarray) -> None:
    view(arena, off, np.float32, values.size)[:] = values.reshape(-1).astype(np.float32)


@reference(T.GaussianSplatRender)
def gaussian_splat_render(arena: np.ndarray, t) -> None:
    """Prepare, then rasterize into `dst` (RGBA)."""
    meta = _meta(arena, t)
    _store(arena, t.dst_off, rasterize(prepare(parameters(arena, t), meta, t), meta, t))


@reference(T.GaussianSplatPrepare)
def gaussian_splat_prepare(arena: np.ndarray, t) -> None:
    """The depth-sorted prepared splats at `prep`."""
    _store(arena, t.prep_off, prepare(parameters(arena, t), _meta(arena, t), t))


@reference(T.GaussianSplatRasterize)
def gaussian_splat_rasterize(arena: np.ndarray, t) -> None:
    """Composite `count` prepared splats (in their stored order) into `dst`."""
    prep = read_f64(arena, t.prep_off, PREP * t.count).reshape(t.count, PREP)
    _store(arena, t.dst_off, rasterize(prep, _meta(arena, t), t))



# ── backward ────────────────────────────────────────────────────────────────
FD_STEP = 1e-5


def loss_weights(arena: np.ndarray, t) -> np.ndarray:
    """`d_loss` (RGBA per pixel) clipped to ±`loss_grad_clip` when that is > 0."""
    d = read_f64(arena, t.d_loss_off, t.d_loss_len).reshape(t.height, t.width, 4)
    clip = float(t.loss_grad_clip)
    return np.clip(d, -clip, clip) if clip > 0 else d


def sh_band_mask(t) -> np.ndarray:
    """Per packed SH element: 1 where its coefficient's band (⌊√k⌋) is ≤ `sh_band`."""
    k = sh_per_channel(t)
    bands = np.floor(np.sqrt(np.arange(k)))
    return np.tile(np.repeat(bands <= t.sh_band, 3), splat_count(t)).astype(np.float64)


@reference(T.GaussianSplatRenderBackward)
def gaussian_splat_render_backward(arena: np.ndarray, t) -> None:
    """∂(Σ d_loss · Render)/∂ every parameter by central differences (step 1e-5) of the float64 Render;
    `colors` under SH and SH coefficients of bands above `sh_band` get 0."""
    params, weights, meta = parameters(arena, t), loss_weights(arena, t), _meta(arena, t)

    def loss(changed: dict) -> float:
        return float((weights * rasterize(prepare(params | changed, meta, t), meta, t)).sum())

    grads = []
    for name in GRAD_PARAMS:
        g = np.zeros(params[name].size)
        for j in range(g.size):
            step = np.zeros_like(g)
            step[j] = FD_STEP
            g[j] = (loss({name: params[name] + step}) - loss({name: params[name] - step})) / (2 * FD_STEP)
        grads.append(g)
    if sh_per_channel(t):
        grads[4][:] = 0.0
        grads[5] *= sh_band_mask(t)
    _store(arena, t.packed_off, np.concatenate(grads))
