"""Attention and its fused blocks, rotary embeddings, SwiGLU (semantics.md §2.7, §3.4).

All tensors are f32.  Weights of the fused blocks are `[in, out]`.  A mask buffer is read only for
the mask kinds that have one: `Custom` (a `[batch, kv_seq]` keep-mask) and `Bias` (an additive
`[batch, heads, seq, kv_seq]` tensor).
"""
from __future__ import annotations

from typing import Iterable

from ..ops import AttentionBwdWrt, MaskKind
from .base import F32, Extent, Thunk, f32, strided, u32, usize


def mask_elems(kind: MaskKind, batch: int, heads: int, seq: int, kv_seq: int) -> int:
    """f32 elements of the mask buffer a mask kind reads (0 for kinds synthesized in-kernel)."""
    if kind == MaskKind.Custom:
        return batch * kv_seq
    if kind == MaskKind.Bias:
        return batch * heads * seq * kv_seq
    return 0


class Attention(Thunk):
    """Scaled dot-product attention with GQA, soft-cap, masks and strided `[B,S,H,D]` (or `[B,H,S,D]`) operands."""

    family = "attention"

    q: usize
    k: usize
    v: usize
    mask: usize
    out: usize
    batch: u32
    seq: u32
    kv_seq: u32
    heads: u32
    kv_heads: u32
    head_dim: u32
    v_head_dim: u32
    mask_kind: MaskKind
    scale: f32
    softcap: f32
    q_row_stride: u32
    k_row_stride: u32
    v_row_stride: u32
    bhsd: bool

    def _operand(self, seq: int, heads: int, dim: int, row_stride: int) -> int:
        if self.bhsd:
            return self.batch * heads * seq * dim
        return strided(self.batch * seq, row_stride, heads * dim)

    def _reads(self) -> Iterable[Extent]:
        yield self.span("q", F32 * self._operand(self.seq, self.heads, self.head_dim, self.q_row_stride))
        yield self.span("k", F32 * self._operand(self.kv_seq, self.kv_heads, self.head_dim, self.k_row_stride))
        yield self.span("v", F32 * self._operand(self.kv_seq, self.kv_heads, self.v_head_dim, self.v_row_stride))
        yield self.span("mask", F32 * mask_elems(self.mask_kind, self.batch, self.heads, self.seq, self.kv_seq))

    def _writes(self) -> Iterable[Extent]:
        yield self.span("out", F32 * self.batch * self.seq * self.heads * self.v_head_dim)


class _AttentionGrad(Thunk):
    """Shared operand sizes of the attention backward thunks (contiguous Q/dY `[B,S,H,D]`, K/V `[B,KV,H,D]`)."""

    family = "attention"
    mask_present = True  # whether `mask` names a buffer (beyond the usize::MAX convention)

    @property
    def q_elems(self) -> int:
        """Elements of Q, dY and dQ."""
        return self.batch * self.seq * self.heads * self.head_dim

    @property
    def kv_elems(self) -> int:
        """Elements of K, V, dK and dV."""
        return self.batch * self.kv_seq * self.heads * self.head_dim

    def _reads(self) -> Iterable[Extent]:
        yield self.span("q", F32 * self.q_elems)
        yield self.span("k", F32 * self.kv_elems)
        yield self.span("v", F32 * self.kv_elems)
        yield self.span("dy", F32 * self.q_elems)
        if self.mask_present:
            yield self.span("mask", F32 * mask_elems(self.mask_kind, self.batch, self.heads, self.seq, self.kv_seq))


class AttentionBackward(_AttentionGrad):
    """One attention gradient (dQ, dK or dV per `wrt`) from a score + softmax recompute; `mask` 0 = none."""

    q: usize
    k: usize
    v: usize
    dy: usize
    mask: usize
    out: usize
    batch: u32
    seq: u32
    kv_seq: u32
    heads: u32
    head_dim: u32
    mask_kind: MaskKind
    wrt: AttentionBwdWrt
    bhsd: bool

    @property
    def mask_present(self) -> bool:  # type: ignore[override]
        """This thunk uses offset 0 for "no mask" (semantics.md §1)."""
        return self.mask != 0

    def _writes(self) -> Iterable[Extent]:
        yield self.span("out", F32 * (self.q_elems if self.wrt == AttentionBwdWrt.Query else self.kv_elems))


class AttentionBackwardAll(_AttentionGrad):
    """dQ, dK and dV from one score + softmax recompute, into three sub-ranges of one packed slot."""

    q: usize
    k: usize
    v: usize
    dy: usize
    mask: usize
    out_q: usize
    out_k: usize
    out_v: usize
    batch: u32
    seq: u32
    kv_seq: u32
    heads: u32
    head_dim: u32
    mask_kind: MaskKind
    bhsd: bool

    def _writes(self) -> Iterable[Extent]:
        yield self.span("out_q", F32 * self.q_elems)
        yield self.span("out_k", F32 * self.kv_elems)
        yield self.span("out_v", F32 * self.kv_elems)


class Rope(Thunk):
    """Rotary position embedding of the first `n_rot` dims of every head (NeoX pairs, or GPT-J with `interleaved`)."""

    family = "attention"

    src: usize
    cos: usize
    sin: usize
    dst: usize
    batch: u32
    seq: u32
    hidden: u32
    head_dim: u32
    n_rot: u32
    cos_len: u32
    cos_row_stride: u32
    src_row_stride: u32
    interleaved: bool

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * strided(self.batch * self.seq, self.src_row_stride, self.hidden))
        yield self.span("cos", F32 * self.cos_len)
        yield self.span("sin", F32 * self.cos_len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.batch * self.seq * self.hidden)


class AxialRope2d(Thunk):
    """SAM2 axial 2-D RoPE on `[batch, seq, num_heads·head_dim]` (x angles, then y angles)."""

    family = "attention"

    src: usize
    dst: usize
    batch: u32
    seq: u32
    hidden: u32
    end_x: u32
    end_y: u32
    head_dim: u32
    num_heads: u32
    theta: f32
    repeat_factor: u32

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * self.batch * self.seq * self.hidden)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.batch * self.seq * self.hidden)


class FusedSwiGLU(Thunk):
    """Fused SwiGLU over rows of `[up ‖ gate]` (swapped with `gate_first`): `out = up · silu(gate)`."""

    family = "attention"

    src: usize
    dst: usize
    n_half: u32
    total: u32
    gate_first: bool

    def _reads(self) -> Iterable[Extent]:
        yield self.span("src", F32 * 2 * self.total)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.total)


class FusedAttnBlock(Thunk):
    """Fused attention block: QKV projection → [RoPE] → SDPA → output projection; `out_b` 0 = no bias."""

    family = "attention"

    hidden: usize
    qkv_w: usize
    out_w: usize
    mask: usize
    mask_kind: MaskKind
    out: usize
    qkv_b: usize
    out_b: usize
    cos: usize
    sin: usize
    cos_len: u32
    batch: u32
    seq: u32
    hs: u32
    nh: u32
    dh: u32
    in_dim: u32
    out_dim: u32
    has_bias: bool
    has_rope: bool
    interleaved: bool

    def _reads(self) -> Iterable[Extent]:
        m = self.batch * self.seq
        yield self.span("hidden", F32 * m * self.in_dim)
        yield self.span("qkv_w", F32 * self.in_dim * 3 * self.hs)
        yield self.span("out_w", F32 * self.hs * self.out_dim)
        yield self.span("mask", F32 * mask_elems(self.mask_kind, self.batch, self.nh, self.seq, self.seq))
        if self.has_bias:
            yield self.span("qkv_b", F32 * 3 * self.hs)
        if self.out_b != 0:
            yield self.span("out_b", F32 * self.out_dim)
        if self.has_rope:
            yield self.span("cos", F32 * self.cos_len)
            yield self.span("sin", F32 * self.cos_len)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("out", F32 * self.batch * self.seq * self.out_dim)


class FusedBertLayer(Thunk):
    """A whole post-LN BERT layer: attention, residual + LN, GELU FFN, residual + LN."""

    family = "attention"

    hidden: usize
    qkv_w: usize
    qkv_b: usize
    out_w: usize
    out_b: usize
    mask: usize
    ln1_g: usize
    ln1_b: usize
    eps1: f32
    fc1_w: usize
    fc1_b: usize
    fc2_w: usize
    fc2_b: usize
    ln2_g: usize
    ln2_b: usize
    eps2: f32
    out: usize
    batch: u32
    seq: u32
    hs: u32
    nh: u32
    dh: u32
    int_dim: u32

    def _reads(self) -> Iterable[Extent]:
        hs, inter = self.hs, self.int_dim
        yield self.span("hidden", F32 * self.batch * self.seq * hs)
        yield self.span("qkv_w", F32 * hs * 3 * hs)
        yield self.span("qkv_b", F32 * 3 * hs)
        yield self.span("out_w", F32 * hs * hs)
        yield self.span("out_b", F32 * hs)
        yield self.span("mask", F32 * self.batch * self.seq)
        for name in ("ln1_g", "ln1_b", "fc2_b", "ln2_g", "ln2_b"):
            yield self.span(name, F32 * hs)
        yield self.span("fc1_w", F32 * hs * inter)
        yield self.span("fc1_b", F32 * inter)
        yield self.span("fc2_w", F32 * inter * hs)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("out", F32 * self.batch * self.seq * self.hs)


class FusedNomicLayer(Thunk):
    """A whole Nomic layer: attention with RoPE, residual + LN, SwiGLU FFN (`fc11_w` = `[up | gate]`), residual + LN."""

    family = "attention"

    hidden: usize
    qkv_w: usize
    out_w: usize
    mask: usize
    cos: usize
    sin: usize
    cos_len: u32
    ln1_g: usize
    ln1_b: usize
    eps1: f32
    fc11_w: usize
    fc12_w: usize
    fc2_w: usize
    ln2_g: usize
    ln2_b: usize
    eps2: f32
    out: usize
    batch: u32
    seq: u32
    hs: u32
    nh: u32
    dh: u32
    int_dim: u32
    interleaved: bool

    def _reads(self) -> Iterable[Extent]:
        hs, inter = self.hs, self.int_dim
        yield self.span("hidden", F32 * self.batch * self.seq * hs)
        yield self.span("qkv_w", F32 * hs * 3 * hs)
        yield self.span("out_w", F32 * hs * hs)
        yield self.span("mask", F32 * self.batch * self.seq)
        yield self.span("cos", F32 * self.cos_len)
        yield self.span("sin", F32 * self.cos_len)
        for name in ("ln1_g", "ln1_b", "ln2_g", "ln2_b"):
            yield self.span(name, F32 * hs)
        yield self.span("fc11_w", F32 * hs * 2 * inter)
        yield self.span("fc2_w", F32 * inter * hs)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("out", F32 * self.batch * self.seq * self.hs)
