"""Data movement: transposes, concats, gathers, scatters, slices, flips, KV append, resampling
(semantics.md §3.5).  Index tensors are f32-encoded unless an `*_i64` flag says i64."""
from __future__ import annotations

from typing import ClassVar, Iterable

from ..ops import ScatterNdReduction
from .base import F32, F64, I64, Extent, Thunk, i32, prod, strided, u8, u32, usize


def index_bytes(is_i64: int) -> int:
    """Bytes per index element: 8 when the indices are i64, else 4 (f32-encoded)."""
    return I64 if is_i64 else F32


class Transpose(Thunk):
    """N-D transpose / broadcast: output element at row-major coords `c` of `out_dims` is `src[Σ c·in_strides]`."""

    family = "movement"

    src: usize
    dst: usize
    in_total: u32
    out_dims: tuple[u32, ...]
    in_strides: tuple[u32, ...]
    elem_bytes: u8

    def _reads(self) -> Iterable[Extent]:
        if prod(self.out_dims):
            yield self.span("src", self.elem_bytes * self.in_total)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", self.elem_bytes * prod(self.out_dims))


class TransposeF64(Thunk):
    """Transpose at 8 bytes per element (the f64 twin of Transpose)."""

    family = "movement"

    src: usize
    dst: usize
    in_total: u32
    out_dims: tuple[u32, ...]
    in_strides: tuple[u32, ...]

    def _reads(self) -> Iterable[Extent]:
        if prod(self.out_dims):
            yield self.span("src", F64 * self.in_total)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F64 * prod(self.out_dims))


class _Concat(Thunk):
    """Concat along an axis into `dst[outer, total_axis·inner]`; `inputs` are `(offset, axis_extent, numel)`."""

    family = "movement"
    elem_bytes: ClassVar[int]

    dst: usize
    outer: u32
    inner: u32
    total_axis: u32
    inputs: tuple[tuple[usize, u32, u32], ...]

    def input_elems(self, extent: int, numel: int) -> int:
        """Elements read from one input: all of it, or (rank-deficient) one scalar or one row repeated."""
        full = self.outer * extent * self.inner
        if numel >= full:
            return full
        return 1 if numel == 1 else extent * self.inner

    def _reads(self) -> Iterable[Extent]:
        for i, (off, extent, numel) in enumerate(self.inputs):
            yield Extent(f"inputs[{i}]", off, self.elem_bytes * self.input_elems(extent, numel))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", self.elem_bytes * self.outer * self.total_axis * self.inner)


class Concat(_Concat):
    """Concat of 4-byte elements along an axis (rank-deficient inputs broadcast over `outer`)."""

    elem_bytes = F32


class ConcatF64(_Concat):
    """Concat of 8-byte elements along an axis (the f64 / i64 twin of Concat)."""

    elem_bytes = F64


class Gather(Thunk):
    """Axis-0 gather: row `idx[i]` of `table` (rows of `trailing` elements) → row `i` of `dst`."""

    family = "movement"

    table: usize
    table_len: u32
    idx: usize
    dst: usize
    num_idx: u32
    trailing: u32
    idx_i64: u8
    table_bytes: u8

    def _reads(self) -> Iterable[Extent]:
        yield self.span("table", self.table_bytes * self.table_len)
        yield self.span("idx", index_bytes(self.idx_i64) * self.num_idx)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", self.table_bytes * self.num_idx * self.trailing)


class GatherAxis(Thunk):
    """Gather along one axis: `dst[o, k, :] = table[o, idx[k], :]` over `[outer, axis_dim, trailing]`."""

    family = "movement"

    table: usize
    idx: usize
    dst: usize
    outer: u32
    axis_dim: u32
    num_idx: u32
    trailing: u32
    idx_i64: u8
    table_bytes: u8

    def _reads(self) -> Iterable[Extent]:
        yield self.span("table", self.table_bytes * self.outer * self.axis_dim * self.trailing)
        yield self.span("idx", index_bytes(self.idx_i64) * self.num_idx)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", self.table_bytes * self.outer * self.num_idx * self.trailing)


class GatherNd(Thunk):
    """ONNX GatherND on f32 data (index tuples address contiguous slices)."""

    family = "movement"

    data: usize
    indices: usize
    dst: usize
    data_shape: tuple[u32, ...]
    indices_shape: tuple[u32, ...]
    data_len: u32
    indices_len: u32
    out_len: u32
    indices_i64: u8
    batch_dims: i32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("data", F32 * self.data_len)
        yield self.span("indices", index_bytes(self.indices_i64) * self.indices_len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.out_len)


class GatherElements(Thunk):
    """ONNX GatherElements / take_along_axis, byte-generic (`data_elem_bytes` per element)."""

    family = "movement"

    data: usize
    indices: usize
    dst: usize
    data_shape: tuple[u32, ...]
    indices_shape: tuple[u32, ...]
    data_len: u32
    indices_len: u32
    out_len: u32
    indices_i64: u8
    data_elem_bytes: u8
    axis: i32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("data", self.data_elem_bytes * self.data_len)
        yield self.span("indices", index_bytes(self.indices_i64) * self.indices_len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", self.data_elem_bytes * self.out_len)


class ScatterAdd(Thunk):
    """`dst` zeroed, then `dst[indices[i], :] += updates[i, :]` (rows of `trailing` f32)."""

    family = "movement"

    updates: usize
    indices: usize
    dst: usize
    num_updates: u32
    out_dim: u32
    trailing: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("updates", F32 * self.num_updates * self.trailing)
        yield self.span("indices", F32 * self.num_updates)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.out_dim * self.trailing)


class _Scatter(Thunk):
    """`dst = copy(data)`, then the updates are combined in at the indexed positions (f32 data)."""

    family = "movement"

    def _reads(self) -> Iterable[Extent]:
        yield self.span("data", F32 * self.data_len)
        yield self.span("indices", index_bytes(self.indices_i64) * self.indices_len)
        yield self.span("updates", F32 * self.updates_len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.data_len)


class ScatterNd(_Scatter):
    """ONNX ScatterND: copy `data`, then write (or reduce) `updates` at multi-index locations."""

    data: usize
    indices: usize
    updates: usize
    dst: usize
    data_shape: tuple[u32, ...]
    indices_shape: tuple[u32, ...]
    data_len: u32
    updates_len: u32
    indices_len: u32
    indices_i64: u8
    reduction: ScatterNdReduction


class ScatterElements(_Scatter):
    """ONNX ScatterElements along `axis`: copy `data`, then write (or reduce) each update."""

    data: usize
    indices: usize
    updates: usize
    dst: usize
    data_shape: tuple[u32, ...]
    indices_shape: tuple[u32, ...]
    data_len: u32
    updates_len: u32
    indices_len: u32
    indices_i64: u8
    axis: i32
    reduction: ScatterNdReduction


class Narrow(Thunk):
    """Copy `outer` rows of `inner` elements from `src + o·src_stride` to `dst + o·dst_stride`."""

    family = "movement"

    src: usize
    dst: usize
    outer: u32
    src_stride: u32
    dst_stride: u32
    inner: u32
    elem_bytes: u8

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", self.elem_bytes * strided(self.outer, self.src_stride, self.inner))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", self.elem_bytes * strided(self.outer, self.dst_stride, self.inner))


class Reverse(Thunk):
    """Flip the axes of a row-major `dims` tensor that `rev_mask` selects (byte-generic)."""

    family = "movement"

    src: usize
    dst: usize
    dims: tuple[u32, ...]
    rev_mask: tuple[bool, ...]
    elem_bytes: u8

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", self.elem_bytes * prod(self.dims))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", self.elem_bytes * prod(self.dims))


class KvAppend(Thunk):
    """In-place KV-cache append: chunk `o` of `src` lands at `dst + (o·seq_cap + pos)·inner_bytes`."""

    family = "movement"

    src: usize
    dst: usize
    outer: u32
    seq_cap: u32
    pos: u32
    inner_bytes: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", self.outer * self.inner_bytes)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", strided(self.outer, self.seq_cap * self.inner_bytes, self.inner_bytes),
                        skip=self.pos * self.inner_bytes)


class ResizeNearest2x(Thunk):
    """Nearest-neighbour 2× upsample of NCHW `[n, c, h, w]` to `[n, c, 2h, 2w]`."""

    family = "movement"

    src: usize
    dst: usize
    n: u32
    c: u32
    h: u32
    w: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.n * self.c * self.h * self.w)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.n * self.c * 4 * self.h * self.w)


class Interpolate3d(Thunk):
    """Nearest-neighbour NCDHW resample from `(d_in, h_in, w_in)` to `(d_out, h_out, w_out)`."""

    family = "movement"

    src: usize
    dst: usize
    n: u32
    c: u32
    d_in: u32
    h_in: u32
    w_in: u32
    d_out: u32
    h_out: u32
    w_out: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.n * self.c * self.d_in * self.h_in * self.w_in)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.n * self.c * self.d_out * self.h_out * self.w_out)
