"""Quantization: INT8 kernels, (fake) quantize, dequant-matmuls, native scaled low-precision GEMMs
(semantics.md §2.9, §2.11, §2.12, §3.7, §3.8).

Packed weight sizes follow each format's block geometry; a scheme the thunk cannot hold makes
`reads()` raise ValidationError naming the `scheme` field.
"""
from __future__ import annotations

from typing import Iterable

from ..errors import ValidationError
from ..ops import QuantScheme, ScaledFormat, ScaleLayout, ScaleMode, SteKind
from .base import F32, HALF, I8, I32, Extent, Thunk, cdiv, f32, i32, u8, u32, usize
from .conv import grouped_weight

GGUF_BLOCKS: dict[str, tuple[int, int]] = {
    "GgufQ4K": (256, 144), "GgufQ5K": (256, 176), "GgufQ6K": (256, 210), "GgufQ8K": (256, 292),
    "GgufQ2K": (256, 84), "GgufQ3K": (256, 110), "GgufQ4_0": (32, 18), "GgufQ4_1": (32, 20),
    "GgufQ5_0": (32, 22), "GgufQ5_1": (32, 24), "GgufQ8_0": (32, 34), "GgufIQ4NL": (32, 18),
    "GgufIQ4XS": (256, 136), "GgufIQ2XXS": (256, 66), "GgufIQ2XS": (256, 74), "GgufIQ2S": (256, 82),
    "GgufIQ3XXS": (256, 98), "GgufIQ3S": (256, 110), "GgufIQ1S": (256, 50), "GgufIQ1M": (256, 56),
    "GgufTQ1_0": (256, 54), "GgufTQ2_0": (256, 66), "GgufMXFP4": (32, 17), "GgufNVFP4": (16, 9),
    "GgufQ1_0": (128, 18), "GgufQ2_0": (128, 34),
}
"""GGUF block geometry: scheme name → (elements, bytes) per block."""


def _bad_scheme(thunk: Thunk, what: str) -> ValidationError:
    return ValidationError(f"scheme {thunk.scheme!r} is not {what}", kind=thunk.kind_name, field="scheme")


def gguf_bytes(thunk: Thunk, rows: int, k: int) -> int:
    """Bytes of a GGUF-packed `[rows, k]` matrix (each row a whole number of blocks)."""
    block = GGUF_BLOCKS.get(thunk.scheme.name) if isinstance(thunk.scheme, QuantScheme) else None
    if block is None:
        raise _bad_scheme(thunk, "a GGUF block format")
    elems, nbytes = block
    return rows * cdiv(k, elems) * nbytes


def gguf_layout(thunk: Thunk, rows: int, k: int, copies: str = "") -> str:
    """Why a GGUF `[rows, k]` matrix has `gguf_bytes`: its block geometry, for error messages."""
    elems, nbytes = GGUF_BLOCKS[thunk.scheme.name]
    return (f"{copies}{rows} rows × {cdiv(k, elems)} {thunk.scheme.name} blocks of {nbytes} bytes "
            f"({elems} weights per block)")


def mlx_layout(thunk: Thunk, rows: int, k: int, copies: str = "") -> str:
    """Why an MLX `[rows, k]` matrix has `mlx_bytes`: words per row and groups, for error messages."""
    s = thunk.scheme
    bits = s.bits if isinstance(s, QuantScheme.MlxAffine) else 4 if isinstance(s, QuantScheme.MlxMxfp4) else 8
    return (f"{copies}{rows} rows × {cdiv(k * bits, 32)} u32 words of {bits}-bit codes, "
            f"{cdiv(k, s.group_size)} groups of group_size = {s.group_size} per row")


def block_layout(k: int, block: int, n: int, what: str, field: str = "block_size") -> str:
    """`what` per block of `field` = `block` rows of W per column, for error messages."""
    return f"{cdiv(k, block)} × {n} {what}, one per block of {field} = {block} rows per column"


def mlx_bytes(thunk: Thunk, rows: int, k: int, scale_itemsize: int) -> tuple[int, int, int]:
    """(codes, scales, biases) bytes of an MLX-quantized `[rows, k]` matrix: codes packed in u32 words
    per row, one scale (and for affine one bias) per `group_size` elements; mxfp scales are E8M0 bytes."""
    s = thunk.scheme
    if isinstance(s, QuantScheme.MlxAffine):
        groups = rows * cdiv(k, s.group_size)
        return rows * cdiv(k * s.bits, 32) * 4, groups * scale_itemsize, groups * scale_itemsize
    if isinstance(s, (QuantScheme.MlxMxfp4, QuantScheme.MlxMxfp8)):
        bits = 4 if isinstance(s, QuantScheme.MlxMxfp4) else 8
        return rows * cdiv(k * bits, 32) * 4, rows * cdiv(k, s.group_size), 0
    raise _bad_scheme(thunk, "an MLX format (MlxAffine, MlxMxfp4, MlxMxfp8)")


def scale_bytes(layout: ScaleLayout, rows: int, k: int) -> int:
    """Bytes of the scale tensor of a `[rows, k]` code matrix: one f32, or one byte per K-block per row."""
    if isinstance(layout, ScaleLayout.BlockMxE8M0):
        return rows * cdiv(k, layout.block)
    if isinstance(layout, ScaleLayout.Nvfp4):
        return rows * cdiv(k, layout.group)
    return F32


def scale_layout(layout: ScaleLayout, rows: int, k: int, copies: str = "") -> str:
    """Why the scale tensor has `scale_bytes`: blocks per row, for error messages."""
    if isinstance(layout, ScaleLayout.BlockMxE8M0):
        return f"{copies}{rows} rows × {cdiv(k, layout.block)} E8M0 bytes, one per block of {layout.block}"
    if isinstance(layout, ScaleLayout.Nvfp4):
        return f"{copies}{rows} rows × {cdiv(k, layout.group)} E4M3 bytes, one per group of {layout.group}"
    return "one f32 per tensor"


# ── INT8 kernels ─────────────────────────────────────────────────────────────

class QMatMul(Thunk):
    """INT8 matmul with i32 accumulation, requantized to i8: `out = rq(bias + (x − x_zp)·(w − w_zp))`."""

    family = "quant"

    x: usize
    w: usize
    bias: usize
    out: usize
    m: u32
    k: u32
    n: u32
    x_zp: i32
    w_zp: i32
    out_zp: i32
    mult: f32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", I8 * self.m * self.k)
        yield self.span("w", I8 * self.k * self.n)
        yield self.span("bias", I32 * self.n)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("out", I8 * self.m * self.n)


class QConv2d(Thunk):
    """INT8 NCHW conv2d with i32 accumulation and per-output requantization to i8."""

    family = "quant"

    x: usize
    w: usize
    bias: usize
    out: usize
    n: u32
    c_in: u32
    h: u32
    w_in: u32
    c_out: u32
    h_out: u32
    w_out: u32
    kh: u32
    kw: u32
    sh: u32
    sw: u32
    ph: u32
    pw: u32
    dh: u32
    dw: u32
    groups: u32
    x_zp: i32
    w_zp: i32
    out_zp: i32
    mult: f32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", I8 * self.n * self.c_in * self.h * self.w_in)
        yield self.span("w", I8 * grouped_weight(self.c_out, self.c_in, self.groups, self.kh, self.kw))
        yield self.span("bias", I32 * self.c_out)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("out", I8 * self.n * self.c_out * self.h_out * self.w_out)


class Quantize(Thunk):
    """f32 → i8: `q = clamp(round(x / scale[c]) + zp[c])`, channel `c = (i / inner) mod chan_dim`."""

    family = "quant"

    x: usize
    q: usize
    len: u32
    chan_axis: u32
    chan_dim: u32
    inner: u32
    scales: tuple[f32, ...]
    zero_points: tuple[i32, ...]

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("q", I8 * self.len)


class Dequantize(Thunk):
    """i8 → f32: `x = (q − zp[c])·scale[c]` (the inverse of Quantize)."""

    family = "quant"

    q: usize
    x: usize
    len: u32
    chan_axis: u32
    chan_dim: u32
    inner: u32
    scales: tuple[f32, ...]
    zero_points: tuple[i32, ...]

    def _reads(self) -> Iterable[Extent]:
        yield self.span("q", I8 * self.len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.len)


class FakeQuantize(Thunk):
    """QAT fake-quantize (symmetric quantize-dequantize per channel); EMA/Fixed scales live at `state_off`."""

    family = "quant"

    x: usize
    out: usize
    len: u32
    chan_axis: u32
    chan_dim: u32
    inner: u32
    bits: u8
    ste: SteKind
    scale_mode: ScaleMode
    state_off: usize | None

    def _state(self) -> Iterable[Extent]:
        if self.state_off is not None and self.scale_mode != ScaleMode.PerBatch:
            yield Extent("state_off", self.state_off, F32 * self.chan_dim)

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.len)
        yield from self._state()

    def _writes(self) -> Iterable[Extent]:
        yield self.span("out", F32 * self.len)
        if isinstance(self.scale_mode, ScaleMode.EMA):  # the running scale is updated in place
            yield from self._state()


class FakeQuantizeBackward(Thunk):
    """Backward of FakeQuantize under the `ste` straight-through estimator."""

    family = "quant"

    x: usize
    dy: usize
    dx: usize
    len: u32
    chan_axis: u32
    chan_dim: u32
    inner: u32
    bits: u8
    ste: SteKind

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.len)
        yield self.span("dy", F32 * self.len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dx", F32 * self.len)


class FakeQuantizeLSQ(Thunk):
    """LSQ fake-quantize with a learned per-channel scale read from `scale_off`."""

    family = "quant"

    x: usize
    scale_off: usize
    out: usize
    len: u32
    chan_axis: u32
    chan_dim: u32
    inner: u32
    bits: u8

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.len)
        yield self.span("scale_off", F32 * self.chan_dim)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("out", F32 * self.len)


class FakeQuantizeLSQBackwardX(Thunk):
    """LSQ x-gradient: `dy` passed through inside the quantization range, 0 outside."""

    family = "quant"

    x: usize
    scale_off: usize
    dy: usize
    dx: usize
    len: u32
    chan_axis: u32
    chan_dim: u32
    inner: u32
    bits: u8

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.len)
        yield self.span("scale_off", F32 * self.chan_dim)
        yield self.span("dy", F32 * self.len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dx", F32 * self.len)


class FakeQuantizeLSQBackwardScale(Thunk):
    """LSQ scale-gradient per channel: `dscale[c] = Σ ψ(x/s[c])·dy`."""

    family = "quant"

    x: usize
    scale_off: usize
    dy: usize
    dscale: usize
    len: u32
    chan_axis: u32
    chan_dim: u32
    inner: u32
    bits: u8

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.len)
        yield self.span("scale_off", F32 * self.chan_dim)
        yield self.span("dy", F32 * self.len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dscale", F32 * self.chan_dim)


# ── dequant + matmul ─────────────────────────────────────────────────────────

class _DequantMatMul(Thunk):
    """`dst[m,n] = x[m,k] @ dequant(w_q)` with f32 activations and output."""

    family = "quant"

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.m * self.k)
        yield from self._weights()

    def _weights(self) -> Iterable[Extent]:
        return ()

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.m * self.n)


class DequantMatMul(_DequantMatMul):
    """Int8Block dequant + matmul: i8 `w_q[k,n]`, f32 `scale`/`zp` per `[k / block_size, n]` block."""

    x: usize
    w_q: usize
    scale: usize
    zp: usize
    dst: usize
    m: u32
    k: u32
    n: u32
    block_size: u32
    is_asymmetric: bool

    def _weights(self) -> Iterable[Extent]:
        blocks = cdiv(self.k, self.block_size) * self.n
        per_block = block_layout(self.k, self.block_size, self.n, "f32 values")
        yield self.span("w_q", I8 * self.k * self.n)
        yield self.span("scale", F32 * blocks, layout=per_block)
        if self.is_asymmetric:
            yield self.span("zp", F32 * blocks, layout=per_block)


class DequantMatMulInt4(_DequantMatMul):
    """Int4 block dequant + matmul: unsigned nibbles of `[k,n]` (even index low), f32 `scale`/`zp` blocks."""

    x: usize
    w_q: usize
    scale: usize
    zp: usize
    dst: usize
    m: u32
    k: u32
    n: u32
    block_size: u32
    is_asymmetric: bool

    def _weights(self) -> Iterable[Extent]:
        blocks = cdiv(self.k, self.block_size) * self.n
        per_block = block_layout(self.k, self.block_size, self.n, "f32 values")
        yield self.span("w_q", cdiv(self.k * self.n, 2), layout=f"{self.k} × {self.n} 4-bit codes, two per byte")
        yield self.span("scale", F32 * blocks, layout=per_block)
        if self.is_asymmetric:
            yield self.span("zp", F32 * blocks, layout=per_block)


class DequantMatMulFp8(_DequantMatMul):
    """FP8 (E4M3, or E5M2 with `e5m2`) `w_q[k,n]` bytes with a per-column f32 `scale[n]`."""

    x: usize
    w_q: usize
    scale: usize
    dst: usize
    m: u32
    k: u32
    n: u32
    e5m2: bool

    def _weights(self) -> Iterable[Extent]:
        yield self.span("w_q", self.k * self.n)
        yield self.span("scale", F32 * self.n)


class DequantMatMulNvfp4(_DequantMatMul):
    """NVFP4 dequant + matmul: E2M1 nibbles of `[k,n]`, E4M3 scale bytes per 16-row group, one f32 global scale."""

    x: usize
    w_q: usize
    scale: usize
    global_scale: usize
    dst: usize
    m: u32
    k: u32
    n: u32

    def _weights(self) -> Iterable[Extent]:
        yield self.span("w_q", cdiv(self.k * self.n, 2), layout=f"{self.k} × {self.n} E2M1 codes, two per byte")
        yield self.span("scale", cdiv(self.k, 16) * self.n,
                        layout=block_layout(self.k, 16, self.n, "E4M3 scale bytes", "the NVFP4 block"))
        yield self.span("global_scale", F32)


class DequantMatMulMxFp4x2(_DequantMatMul):
    """Two-level residual E2M1 dequant + matmul: nibble planes `[q0 | q1]`, f32 scale planes `[s0 | s1]`."""

    x: usize
    w_q: usize
    scale: usize
    dst: usize
    m: u32
    k: u32
    n: u32
    group: u32

    def _weights(self) -> Iterable[Extent]:
        yield self.span("w_q", 2 * cdiv(self.k * self.n, 2),
                        layout=f"2 planes of {self.k} × {self.n} E2M1 codes, two per byte")
        yield self.span("scale", 2 * F32 * cdiv(self.k, self.group) * self.n,
                        layout="2 planes of " + block_layout(self.k, self.group, self.n, "f32 scales", "group"))


class DequantMatMulGguf(_DequantMatMul):
    """GGUF-packed `[n, k]` weight (K-quant / legacy / IQ blocks) dequantized and multiplied: `dst = x @ Wᵀ`."""

    x: usize
    w_q: usize
    dst: usize
    m: u32
    k: u32
    n: u32
    scheme: QuantScheme

    def _weights(self) -> Iterable[Extent]:
        yield self.span("w_q", gguf_bytes(self, self.n, self.k), layout=gguf_layout(self, self.n, self.k))


class DequantMatMulMlx(_DequantMatMul):
    """MLX affine / mxfp weight `[n, k]` (u32-packed codes, f32 scales and biases) dequantized and multiplied."""

    x: usize
    w_q: usize
    scale: usize
    zp: usize
    dst: usize
    m: u32
    k: u32
    n: u32
    scheme: QuantScheme

    def _weights(self) -> Iterable[Extent]:
        codes, scales, biases = mlx_bytes(self, self.n, self.k, F32)
        layout = mlx_layout(self, self.n, self.k)
        yield self.span("w_q", codes, layout=layout)
        yield self.span("scale", scales, layout=layout)
        yield self.span("zp", biases, layout=layout)


class DequantGroupedMatMulGguf(Thunk):
    """MoE matmul over a stack of `num_experts` GGUF `[n, k_dim]` slabs; row `i` uses expert `expert_idx[i]`."""

    family = "quant"

    input: usize
    w_q: usize
    expert_idx: usize
    dst: usize
    m: u32
    k_dim: u32
    n: u32
    num_experts: u32
    scheme: QuantScheme

    def _reads(self) -> Iterable[Extent]:
        yield self.span("input", F32 * self.m * self.k_dim)
        yield self.span("w_q", self.num_experts * gguf_bytes(self, self.n, self.k_dim),
                        layout=gguf_layout(self, self.n, self.k_dim, f"{self.num_experts} experts × "))
        yield self.span("expert_idx", F32 * self.m)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.m * self.n)


class DequantGroupedMatMulMlx(Thunk):
    """MoE matmul over MLX-quantized `[n, k_dim]` expert slabs of `slab_bytes` codes each (bf16 scales with `scale_bf16`)."""

    family = "quant"

    input: usize
    w_q: usize
    scale: usize
    zp: usize
    expert_idx: usize
    dst: usize
    m: u32
    k_dim: u32
    n: u32
    num_experts: u32
    slab_bytes: u32
    scheme: QuantScheme
    scale_bf16: bool

    def _reads(self) -> Iterable[Extent]:
        _, scales, biases = mlx_bytes(self, self.n, self.k_dim, HALF if self.scale_bf16 else F32)
        layout = mlx_layout(self, self.n, self.k_dim, f"{self.num_experts} experts × ")
        yield self.span("input", F32 * self.m * self.k_dim)
        yield self.span("w_q", self.num_experts * self.slab_bytes,
                        layout=f"{self.num_experts} experts × slab_bytes = {self.slab_bytes}")
        yield self.span("scale", self.num_experts * scales, layout=layout)
        yield self.span("zp", self.num_experts * biases, layout=layout)
        yield self.span("expert_idx", F32 * self.m)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.m * self.n)


class DequantMoEWeightsGguf(Thunk):
    """Materialize a GGUF expert stack as f32 `[num_experts, k_dim, n]` (each slab transposed)."""

    family = "quant"

    w_q: usize
    dst: usize
    k_dim: u32
    n: u32
    num_experts: u32
    scheme: QuantScheme

    def _reads(self) -> Iterable[Extent]:
        yield self.span("w_q", self.num_experts * gguf_bytes(self, self.n, self.k_dim),
                        layout=gguf_layout(self, self.n, self.k_dim, f"{self.num_experts} experts × "))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.num_experts * self.k_dim * self.n)


# ── native scaled low-precision GEMM ─────────────────────────────────────────

class ScaledMatMul(Thunk):
    """Scaled low-precision TN GEMM: code bytes `lhs[m,k]`, `rhs[n,k]`, scales per `layout`, f32 `dst[m,n]`."""

    family = "quant"

    lhs: usize
    rhs: usize
    lhs_scale: usize
    rhs_scale: usize
    bias: usize
    dst: usize
    m: u32
    k: u32
    n: u32
    lhs_fmt: ScaledFormat
    rhs_fmt: ScaledFormat
    layout: ScaleLayout
    has_bias: bool

    def _reads(self) -> Iterable[Extent]:
        yield self.span("lhs", self.m * self.k)
        yield self.span("rhs", self.n * self.k)
        yield self.span("lhs_scale", scale_bytes(self.layout, self.m, self.k),
                        layout=scale_layout(self.layout, self.m, self.k))
        yield self.span("rhs_scale", scale_bytes(self.layout, self.n, self.k),
                        layout=scale_layout(self.layout, self.n, self.k))
        if self.has_bias:
            yield self.span("bias", F32 * self.n)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.m * self.n)


class ScaledGroupedMatMul(Thunk):
    """Expert-indexed ScaledMatMul: `weight[E, n, k]` codes with per-expert scales and bias."""

    family = "quant"

    input: usize
    weight: usize
    input_scale: usize
    weight_scale: usize
    expert_idx: usize
    bias: usize
    dst: usize
    m: u32
    k: u32
    n: u32
    num_experts: u32
    lhs_fmt: ScaledFormat
    rhs_fmt: ScaledFormat
    layout: ScaleLayout
    has_bias: bool

    def _reads(self) -> Iterable[Extent]:
        e = self.num_experts
        yield self.span("input", self.m * self.k)
        yield self.span("weight", e * self.n * self.k)
        yield self.span("input_scale", scale_bytes(self.layout, self.m, self.k),
                        layout=scale_layout(self.layout, self.m, self.k))
        yield self.span("weight_scale", e * scale_bytes(self.layout, self.n, self.k),
                        layout=scale_layout(self.layout, self.n, self.k, f"{self.num_experts} experts × "))
        yield self.span("expert_idx", F32 * self.m)
        if self.has_bias:
            yield self.span("bias", F32 * e * self.n)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.m * self.n)


class ScaledQuantize(Thunk):
    """f32 `x[rows, cols]` → one low-precision code byte per element, using the `scale` tensor."""

    family = "quant"

    x: usize
    scale: usize
    dst: usize
    rows: u32
    cols: u32
    fmt: ScaledFormat
    layout: ScaleLayout

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.rows * self.cols)
        yield self.span("scale", scale_bytes(self.layout, self.rows, self.cols),
                        layout=scale_layout(self.layout, self.rows, self.cols))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", self.rows * self.cols)  # one code byte per element


class ScaledQuantScale(Thunk):
    """The per-tensor / per-block scale tensor of `x[rows, cols]` for ScaledQuantize."""

    family = "quant"

    x: usize
    dst: usize
    rows: u32
    cols: u32
    fmt: ScaledFormat
    layout: ScaleLayout

    def _reads(self) -> Iterable[Extent]:
        yield self.span("x", F32 * self.rows * self.cols)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", scale_bytes(self.layout, self.rows, self.cols),
                        layout=scale_layout(self.layout, self.rows, self.cols))


class ScaledDequantize(Thunk):
    """Code bytes `codes[rows, cols]` → f32 `decode(code)·scale(block)`."""

    family = "quant"

    codes: usize
    scale: usize
    dst: usize
    rows: u32
    cols: u32
    fmt: ScaledFormat
    layout: ScaleLayout

    def _reads(self) -> Iterable[Extent]:
        yield self.span("codes", self.rows * self.cols)
        yield self.span("scale", scale_bytes(self.layout, self.rows, self.cols),
                        layout=scale_layout(self.layout, self.rows, self.cols))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.rows * self.cols)
