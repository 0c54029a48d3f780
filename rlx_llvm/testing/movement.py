"""Examples of the data-movement families: copies between layouts, and gathers / scatters by index."""
from __future__ import annotations

from .. import thunks as T
from ..ops import ScatterNdReduction as Red
from .layout import Example, example, ints

F32_IDX, I64_IDX = "f4", "i8"   # index storage: f32-encoded (`*_i64 = 0`) or i64


def movement() -> list[Example]:
    """Transposes, concats, narrow, reverse, KV append, resamples and im2col."""
    return [
        example("Transpose/5x9", T.Transpose(src=0, dst=0, in_total=45, out_dims=(5, 9), in_strides=(1, 5),
                                             elem_bytes=4)),
        example("TransposeF64/3x5x3", T.TransposeF64(src=0, dst=0, in_total=45, out_dims=(3, 5, 3),
                                                      in_strides=(1, 9, 3)), dtype="f8"),
        example("Concat/3_rows", T.Concat(dst=0, outer=3, inner=5, total_axis=6, inputs=((0, 2, 30), (0, 3, 45),
                                                                                        (0, 1, 15)))),
        example("ConcatF64/broadcast_row", T.ConcatF64(dst=0, outer=3, inner=5, total_axis=4,
                                                       inputs=((0, 3, 45), (0, 1, 5))), dtype="f8"),
        example("Narrow/5_rows", T.Narrow(src=0, dst=0, outer=5, src_stride=12, dst_stride=7, inner=7, elem_bytes=4)),
        example("Reverse/3x4x5_axes02", T.Reverse(src=0, dst=0, dims=(3, 4, 5), rev_mask=(True, False, True),
                                                  elem_bytes=4)),
        example("KvAppend/pos5", T.KvAppend(src=0, dst=0, outer=4, seq_cap=6, pos=5, inner_bytes=100), dtype="u1"),
        example("ResizeNearest2x/2x3x4x5", T.ResizeNearest2x(src=0, dst=0, n=2, c=3, h=4, w=5)),
        example("Interpolate3d/up_down", T.Interpolate3d(src=0, dst=0, n=1, c=2, d_in=2, h_in=3, w_in=4, d_out=5,
                                                         h_out=2, w_out=9)),
        example("Im2Col/3x3_pad1", T.Im2Col(x=0, col=0, n=1, c_in=2, h=5, w=5, h_out=5, w_out=5, kh=3, kw=3,
                                            sh=1, sw=1, ph=1, pw=1, dh=1, dw_dil=1)),
    ]


def indexing() -> list[Example]:
    """Gathers and scatters, with indices in range (f32-encoded or i64)."""
    return [
        example("Gather/f32_idx", T.Gather(table=0, table_len=70, idx=0, dst=0, num_idx=9, trailing=7, idx_i64=0,
                                           table_bytes=4), idx=ints(0, 10, F32_IDX)),
        example("Gather/i64_idx_8byte", T.Gather(table=0, table_len=70, idx=0, dst=0, num_idx=9, trailing=7,
                                                 idx_i64=1, table_bytes=8), idx=ints(0, 10, I64_IDX), table="f8",
                dst="f8"),
        example("GatherAxis/3x5x2", T.GatherAxis(table=0, idx=0, dst=0, outer=3, axis_dim=5, num_idx=4, trailing=2,
                                                 idx_i64=0, table_bytes=4), idx=ints(0, 5, F32_IDX)),
        example("GatherNd/k2", T.GatherNd(data=0, indices=0, dst=0, data_shape=(3, 4, 5), indices_shape=(2, 2, 2),
                                          data_len=60, indices_len=8, out_len=20, indices_i64=1, batch_dims=0),
                indices=ints(0, 3, I64_IDX)),
        example("GatherElements/axis1", T.GatherElements(data=0, indices=0, dst=0, data_shape=(4, 5),
                                                         indices_shape=(4, 7), data_len=20, indices_len=28, out_len=28,
                                                         indices_i64=0, data_elem_bytes=4, axis=1),
                indices=ints(-5, 5, F32_IDX)),
        example("ScatterAdd/6x5", T.ScatterAdd(updates=0, indices=0, dst=0, num_updates=9, out_dim=6, trailing=5),
                indices=ints(0, 6, F32_IDX)),
        example("ScatterNd/rows_add", T.ScatterNd(data=0, indices=0, updates=0, dst=0, data_shape=(4, 6),
                                                  indices_shape=(5, 1), data_len=24, updates_len=30, indices_len=5,
                                                  indices_i64=1, reduction=Red.Add), indices=ints(0, 4, I64_IDX)),
        example("ScatterElements/axis1_max", T.ScatterElements(
            data=0, indices=0, updates=0, dst=0, data_shape=(4, 5), indices_shape=(2, 4), data_len=20, updates_len=8,
            indices_len=8, indices_i64=0, axis=1, reduction=Red.Max), indices=ints(0, 5, F32_IDX)),
    ]
