"""Examples of the attention gradients: one AttentionBackward per wrt and an AttentionBackwardAll."""
from __future__ import annotations

from .. import thunks as T
from ..ops import AttentionBwdWrt, MaskKind
from .layout import Example, example, ints

SHAPE = dict(batch=2, seq=5, kv_seq=7, heads=3, head_dim=6)


def attention_backward() -> list[Example]:
    """dK under a Bias mask (`mask = 1`: a placeholder that names a buffer), dQ causal, dV BHSD, all three
    under a Custom keep-mask."""
    one = lambda wrt, kind, bhsd, mask=0: T.AttentionBackward(  # noqa: E731
        q=0, k=0, v=0, dy=0, mask=mask, out=0, mask_kind=kind, wrt=wrt, bhsd=bhsd, **SHAPE)
    return [
        example("AttentionBackward/key_bias", one(AttentionBwdWrt.Key, MaskKind.Bias, False, mask=1), rtol=1e-4),
        example("AttentionBackward/query_causal", one(AttentionBwdWrt.Query, MaskKind.Causal, False), rtol=1e-4),
        example("AttentionBackward/value_bhsd", one(AttentionBwdWrt.Value, MaskKind.None_, True), rtol=1e-4),
        example("AttentionBackwardAll/custom", T.AttentionBackwardAll(
            q=0, k=0, v=0, dy=0, mask=0, out_q=0, out_k=0, out_v=0, mask_kind=MaskKind.Custom, bhsd=False, **SHAPE),
            rtol=1e-4, mask=ints(0, 2, "f4")),
    ]
