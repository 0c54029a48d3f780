"""Examples of the normalization families: forward norms and the norm / index backward kernels."""
from __future__ import annotations

from .. import thunks as T
from .layout import Example, example, ints, uniform

ROWS, H = 4, 13            # rows of an odd width: a vector tail at every lane count
BATCH_MAP = (2 * H, (0, 0, H, H))   # AdaLN / gate modulation `[B=2, 1, H]` broadcast over 2 rows each
SPATIAL = dict(n=2, c=6, h=3, w=5)  # NCHW for GroupNorm (3 groups of 2 channels)
VAR = uniform(0.1, 2.0)             # batch-norm variances


def norms() -> list[Example]:
    """LayerNorm, RmsNorm, the fused residual norms, AdaLN, gated residual, GroupNorm, LayerNorm2d, BatchNorm."""
    mod_len, offs = BATCH_MAP
    return [
        example("LayerNorm/rows3_h37", T.LayerNorm(src=0, g=0, b=0, dst=0, rows=3, h=37, eps=1e-5)),
        example("RmsNorm/rows4_h13", T.RmsNorm(src=0, g=0, b=0, dst=0, rows=ROWS, h=H, eps=1e-6)),
        example("FusedResidualLN/bias", T.FusedResidualLN(x=0, res=0, bias=0, g=0, b=0, out=0, rows=ROWS, h=H,
                                                          eps=1e-5, has_bias=True)),
        example("FusedResidualRmsNorm/no_bias", T.FusedResidualRmsNorm(x=0, res=0, bias=0, g=0, b=0, out=0, rows=ROWS,
                                                                       h=H, eps=1e-5, has_bias=False)),
        example("AdaLayerNorm/batch_map", T.AdaLayerNorm(src=0, scale=0, shift=0, dst=0, rows=ROWS, h=H, eps=1e-6,
                                                         layer_norm=True, mod_len=mod_len, mod_off=offs)),
        example("GatedResidual/batch_map", T.GatedResidual(x=0, y=0, gate=0, dst=0, rows=ROWS, h=H, gate_len=mod_len,
                                                           gate_off=offs)),
        example("GroupNorm/2x6x3x5_g3", T.GroupNorm(src=0, g=0, b=0, dst=0, num_groups=3, eps=1e-5, **SPATIAL)),
        example("LayerNorm2d/2x6x3x5", T.LayerNorm2d(src=0, g=0, b=0, dst=0, eps=1e-5, **SPATIAL)),
        example("BatchNormInference/7x9", T.BatchNormInference(src=0, g=0, b=0, mean=0, var=0, dst=0, count=7,
                                                               channels=9, eps=1e-5), var=VAR),
    ]


def norms_backward() -> list[Example]:
    """Backward of the norms (input, gamma, beta), of AdaLN / gated residual, Cumsum, GatherAxis and Rope."""
    mod_len, offs = BATCH_MAP
    rows, bn = dict(rows=ROWS, h=H, eps=1e-5), dict(count=7, channels=9)
    return [
        example("LayerNormBackwardInput", T.LayerNormBackwardInput(x=0, gamma=0, dy=0, dx=0, **rows)),
        example("LayerNormBackwardGamma", T.LayerNormBackwardGamma(x=0, dy=0, dgamma=0, **rows)),
        example("RmsNormBackwardInput", T.RmsNormBackwardInput(x=0, gamma=0, beta=0, dy=0, dx=0, **rows)),
        example("RmsNormBackwardGamma", T.RmsNormBackwardGamma(x=0, gamma=0, beta=0, dy=0, dgamma=0, **rows)),
        example("RmsNormBackwardBeta", T.RmsNormBackwardBeta(x=0, gamma=0, beta=0, dy=0, dbeta=0, **rows)),
        example("GroupNormBackwardInput", T.GroupNormBackwardInput(x=0, gamma=0, beta=0, dy=0, dx=0, num_groups=3,
                                                                   eps=1e-5, **SPATIAL)),
        example("GroupNormBackwardGamma", T.GroupNormBackwardGamma(x=0, dy=0, dgamma=0, num_groups=3, eps=1e-5,
                                                                   **SPATIAL)),
        example("GroupNormBackwardBeta", T.GroupNormBackwardBeta(dy=0, dbeta=0, **SPATIAL)),
        example("BatchNormInferenceBackwardInput", T.BatchNormInferenceBackwardInput(
            x=0, gamma=0, mean=0, var=0, dy=0, dx=0, eps=1e-5, **bn), var=VAR),
        example("BatchNormInferenceBackwardGamma", T.BatchNormInferenceBackwardGamma(
            x=0, mean=0, var=0, dy=0, dgamma=0, eps=1e-5, **bn), var=VAR),
        example("BatchNormInferenceBackwardBeta", T.BatchNormInferenceBackwardBeta(dy=0, dbeta=0, **bn)),
        example("AdaLayerNormBackward/batch_map", T.AdaLayerNormBackward(
            x=0, scale=0, shift=0, dy=0, dst=0, rows=ROWS, h=H, eps=1e-6, layer_norm=False, mod_len=mod_len,
            mod_off=offs)),
        example("GatedResidualBackward/batch_map", T.GatedResidualBackward(
            x=0, y=0, gate=0, dy=0, dst=0, rows=ROWS, h=H, gate_len=mod_len, gate_off=offs)),
        example("CumsumBackward/exclusive", T.CumsumBackward(dy=0, dx=0, rows=ROWS, cols=H, exclusive=True)),
        example("GatherBackward/5x4", T.GatherBackward(dy=0, indices=0, dst=0, outer=2, axis_dim=5, num_idx=6,
                                                       trailing=4), indices=ints(0, 5, "f4")),
        example("RopeBackward/neox", T.RopeBackward(dy=0, cos=0, sin=0, dx=0, batch=2, seq=5, hidden=24, head_dim=8,
                                                    n_rot=8, cos_len=20, cos_row_stride=4, interleaved=False),
                cos=uniform(-1, 1), sin=uniform(-1, 1)),
    ]
