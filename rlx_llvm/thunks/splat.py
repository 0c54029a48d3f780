"""3-D Gaussian splatting (delegated to rlx-splat in RLX; semantics.md §3.12 leaves the internals UNKNOWN).

Every `*_off` is an f32 buffer of `*_len` elements.  The camera / background `meta` block is 23 f32
(RLX reads `min(meta_len, 23)` where a length is given).
"""
from __future__ import annotations

from typing import Iterable

from .base import F32, Extent, Thunk, f32, u32, usize

META_ELEMS = 23
_PARAMS = ("positions", "scales", "rotations", "opacities", "colors", "sh_coeffs")


class _Splat(Thunk):
    family = "splat"

    def _buffer(self, name: str, elems: int | None = None) -> Extent:
        """The f32 buffer `{name}_off` of `{name}_len` elements (or `elems`)."""
        n = getattr(self, f"{name}_len") if elems is None else elems
        return self.span(f"{name}_off", F32 * n)

    def _params(self) -> Iterable[Extent]:
        for name in _PARAMS:
            yield self._buffer(name)


class GaussianSplatRender(_Splat):
    """Render splats (project, tile-bin, sort, rasterize) into a `height × width` RGBA image at `dst_off`."""

    positions_off: usize
    positions_len: usize
    scales_off: usize
    scales_len: usize
    rotations_off: usize
    rotations_len: usize
    opacities_off: usize
    opacities_len: usize
    colors_off: usize
    colors_len: usize
    sh_coeffs_off: usize
    sh_coeffs_len: usize
    meta_off: usize
    dst_off: usize
    dst_len: usize
    width: u32
    height: u32
    tile_size: u32
    radius_scale: f32
    alpha_cutoff: f32
    max_splat_steps: u32
    transmittance_threshold: f32
    max_list_entries: u32

    def _reads(self) -> Iterable[Extent]:
        yield from self._params()
        yield self._buffer("meta", META_ELEMS)

    def _writes(self) -> Iterable[Extent]:
        yield self._buffer("dst")


class GaussianSplatRenderBackward(_Splat):
    """Backward of GaussianSplatRender: parameter gradients from `d_loss`, packed at `packed_off`."""

    positions_off: usize
    positions_len: usize
    scales_off: usize
    scales_len: usize
    rotations_off: usize
    rotations_len: usize
    opacities_off: usize
    opacities_len: usize
    colors_off: usize
    colors_len: usize
    sh_coeffs_off: usize
    sh_coeffs_len: usize
    meta_off: usize
    d_loss_off: usize
    d_loss_len: usize
    packed_off: usize
    packed_len: usize
    width: u32
    height: u32
    tile_size: u32
    radius_scale: f32
    alpha_cutoff: f32
    max_splat_steps: u32
    transmittance_threshold: f32
    max_list_entries: u32
    loss_grad_clip: f32
    sh_band: u32
    max_anisotropy: f32

    def _reads(self) -> Iterable[Extent]:
        yield from self._params()
        yield self._buffer("meta", META_ELEMS)
        yield self._buffer("d_loss")

    def _writes(self) -> Iterable[Extent]:
        yield self._buffer("packed")


class GaussianSplatPrepare(_Splat):
    """Splat stage 1: project, bin, sort and pack the rasterizer's inputs at `prep_off`."""

    positions_off: usize
    positions_len: usize
    scales_off: usize
    scales_len: usize
    rotations_off: usize
    rotations_len: usize
    opacities_off: usize
    opacities_len: usize
    colors_off: usize
    colors_len: usize
    sh_coeffs_off: usize
    sh_coeffs_len: usize
    meta_off: usize
    meta_len: usize
    prep_off: usize
    prep_len: usize
    width: u32
    height: u32
    tile_size: u32
    radius_scale: f32
    alpha_cutoff: f32
    max_splat_steps: u32
    transmittance_threshold: f32
    max_list_entries: u32

    def _reads(self) -> Iterable[Extent]:
        yield from self._params()
        yield self._buffer("meta", min(self.meta_len, META_ELEMS))

    def _writes(self) -> Iterable[Extent]:
        yield self._buffer("prep")


class GaussianSplatRasterize(_Splat):
    """Splat stage 2: tile rasterization of a prepared buffer of `count` splats into `dst_off`."""

    prep_off: usize
    prep_len: usize
    meta_off: usize
    meta_len: usize
    dst_off: usize
    dst_len: usize
    count: usize
    width: u32
    height: u32
    tile_size: u32
    alpha_cutoff: f32
    max_splat_steps: u32
    transmittance_threshold: f32
    max_list_entries: u32

    def _reads(self) -> Iterable[Extent]:
        yield self._buffer("prep")
        yield self._buffer("meta", min(self.meta_len, META_ELEMS))

    def _writes(self) -> Iterable[Extent]:
        yield self._buffer("dst")
