"""Examples of the attention families: attention, RoPE, SwiGLU, and the fused transformer layers."""
from __future__ import annotations

from .. import thunks as T
from ..ops import MaskKind
from .layout import Example, Values, example, ints, normal, uniform

BATCH, SEQ, HS, NH = 2, 5, 16, 2   # a tiny transformer: 2 heads of 8
INTER = 24                         # MLP width
UNIT = uniform(-1, 1)              # cos / sin tables
KEEP = ints(0, 2, "f4")            # a 0/1 keep-mask


def weight(fan_in: int) -> Values:
    """Weights of variance 1/fan_in (activations stay of order 1)."""
    return normal(scale=fan_in ** -0.5)


def attention() -> list[Example]:
    """Attention (grouped-query, custom mask), Rope, AxialRope2d and FusedSwiGLU."""
    return [
        example("Attention/gqa_custom_mask", T.Attention(
            q=0, k=0, v=0, mask=0, out=0, batch=BATCH, seq=SEQ, kv_seq=7, heads=4, kv_heads=2, head_dim=6,
            v_head_dim=5, mask_kind=MaskKind.Custom, scale=6 ** -0.5, softcap=0.0, q_row_stride=24, k_row_stride=12,
            v_row_stride=10, bhsd=False), mask=KEEP),
        example("Rope/neox_partial", T.Rope(src=0, cos=0, sin=0, dst=0, batch=BATCH, seq=SEQ, hidden=24, head_dim=12,
                                            n_rot=10, cos_len=25, cos_row_stride=5, src_row_stride=24,
                                            interleaved=False), cos=UNIT, sin=UNIT),
        example("AxialRope2d/rep2", T.AxialRope2d(src=0, dst=0, batch=2, seq=13, hidden=24, end_x=3, end_y=3,
                                                  head_dim=8, num_heads=3, theta=10000.0, repeat_factor=2)),
        example("FusedSwiGLU/3x11", T.FusedSwiGLU(src=0, dst=0, n_half=11, total=33, gate_first=True)),
    ]


def fused_layers() -> list[Example]:
    """FusedAttnBlock (with RoPE), FusedBertLayer and FusedNomicLayer on a tiny transformer."""
    m, dh, cos_len = BATCH * SEQ, HS // NH, (SEQ + 3) * HS // NH // 2
    shape = dict(batch=BATCH, seq=SEQ, hs=HS, nh=NH, dh=dh)
    norm = dict(ln1_g=normal(scale=0.1, shift=1.0), ln2_g=normal(scale=0.1, shift=1.0))
    return [
        example("FusedAttnBlock/rope_bias", T.FusedAttnBlock(
            hidden=0, qkv_w=0, out_w=0, mask=0, mask_kind=MaskKind.Custom, out=0, qkv_b=0, out_b=0, cos=0, sin=0,
            cos_len=cos_len, in_dim=HS, out_dim=HS, has_bias=True, has_rope=True, interleaved=False, **shape),
            rtol=1e-4, qkv_w=weight(HS), out_w=weight(HS), mask=KEEP, cos=UNIT, sin=UNIT),
        example("FusedBertLayer", T.FusedBertLayer(
            hidden=0, qkv_w=0, qkv_b=0, out_w=0, out_b=0, mask=0, ln1_g=0, ln1_b=0, eps1=1e-12, fc1_w=0, fc1_b=0,
            fc2_w=0, fc2_b=0, ln2_g=0, ln2_b=0, eps2=1e-5, out=0, int_dim=INTER, **shape),
            rtol=1e-4, qkv_w=weight(HS), out_w=weight(HS), fc1_w=weight(HS), fc2_w=weight(INTER), mask=KEEP, **norm),
        example("FusedNomicLayer", T.FusedNomicLayer(
            hidden=0, qkv_w=0, out_w=0, mask=0, cos=0, sin=0, cos_len=cos_len, ln1_g=0, ln1_b=0, eps1=1e-5,
            fc11_w=0, fc12_w=0, fc2_w=0, ln2_g=0, ln2_b=0, eps2=1e-5, out=0, int_dim=INTER, interleaved=False,
            **shape), rtol=1e-4, qkv_w=weight(HS), out_w=weight(HS), fc11_w=weight(HS), fc2_w=weight(INTER),
            mask=KEEP, cos=UNIT, sin=UNIT, **norm),
    ]
