"""Data-movement lowerings against the NumPy reference and the ONNX operator spec.

Every case lives in one schedule over one arena, compiled twice per module: as is, and with the
streaming threshold forced to 0 so the non-temporal, prefetching paths run on small shapes too.
The arena starts as random bytes (inputs and sentinel alike); each case's output bytes must equal
the reference's (byte-exact: the kernels move bit patterns), and no byte outside every declared
output may change.  ONNX cases compare with outputs written by hand from the spec's examples.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import rlx_llvm as rl
import rlx_llvm.ir_emit.movement as ir_movement
from rlx_llvm import thunks as T
from tests.harness import Outcome, Suite, expect_invalid, streaming_forced, suite_tests

def row_major(shape) -> tuple[int, ...]:
    """Row-major element strides."""
    return tuple(int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(len(shape)))


# ── the movement cases ──────────────────────────────────────────────────────

def permuted(shape, perm) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(out_dims, in_strides) of `np.transpose(x, perm)` for a row-major `x` of `shape`."""
    st = row_major(shape)
    return tuple(shape[p] for p in perm), tuple(st[p] for p in perm)


def expanded(in_shape, out_shape) -> tuple[int, ...]:
    """In-strides of `np.broadcast_to(x, out_shape)` (0 on broadcast axes)."""
    in_shape = (1,) * (len(out_shape) - len(in_shape)) + tuple(in_shape)
    st = row_major(in_shape)
    return tuple(0 if d == 1 and o != 1 else s for d, o, s in zip(in_shape, out_shape, st))


def transpose_thunk(s: Suite, out_dims, in_strides, in_total: int, eb: int, skew: int = 0):
    """A Transpose (TransposeF64 for 8-byte elements on odd cases) with fresh slots."""
    n = int(np.prod(out_dims, dtype=np.int64))
    src, dst = s.slot(in_total * eb, skew), s.slot(n * eb, skew)
    return T.Transpose(src=src, dst=dst, in_total=in_total, out_dims=tuple(out_dims), in_strides=tuple(in_strides),
                       elem_bytes=eb)


def add_transposes(s: Suite) -> None:
    rng = np.random.default_rng(1)
    shapes = [(7,), (37, 53), (64, 48), (16, 16), (15, 17), (1, 40), (40, 1), (3, 5), (5, 6, 7), (3, 4, 5, 6),
              (2, 3, 4, 5, 6), (2, 3, 2, 5, 4, 3), (9, 40, 20), (20, 3, 18), (33, 2, 65)]
    widths = itertools.cycle((4, 2, 8, 1, 16, 4, 8))
    for shape in shapes:
        r = len(shape)
        perms = {tuple(range(r)), tuple(reversed(range(r))), tuple(int(p) for p in rng.permutation(r))}
        for perm in sorted(perms):
            ebs = (1, 2, 4, 8, 16) if r == 2 and perm == (1, 0) else (next(widths),)
            for eb in ebs:
                out, st = permuted(shape, perm)
                s.add(f"transpose{shape}{perm}x{eb}",
                      transpose_thunk(s, out, st, int(np.prod(shape)), eb, skew=4 if eb == 4 and r == 2 else 0))
    for shape, perm in [((70, 90), (1, 0)), ((6, 40, 24), (2, 1, 0))]:
        out, st = permuted(shape, perm)
        n = int(np.prod(shape))
        s.add(f"transpose_f64{shape}{perm}", T.TransposeF64(src=s.slot(8 * n), dst=s.slot(8 * n), in_total=n,
                                                            out_dims=out, in_strides=st))
    for in_shape, out_shape in [((1, 5), (4, 5)), ((5, 1), (5, 36)), ((1,), (37,)), ((), (3, 4)), ((3, 1, 4), (3, 5, 4)),
                                ((2, 1, 1), (2, 3, 20)), ((1, 6), (40, 6))]:
        n = int(np.prod(in_shape, dtype=np.int64))
        for eb in sorted({4, next(widths)}):
            s.add(f"expand{in_shape}->{out_shape}x{eb}",
                  transpose_thunk(s, out_shape, expanded(in_shape, out_shape), n, eb))
    s.add("expand_then_transpose", transpose_thunk(s, (5, 4, 3), (0, 1, 4), 12, 4))
    s.add("transpose_empty", transpose_thunk(s, (3, 0, 4), (1, 3, 0), 12, 4))
    s.add("transpose_scalar", transpose_thunk(s, (), (), 1, 8))
    s.add("transpose_wraps_mod_in_total", transpose_thunk(s, (4, 4), (4, 1), 10, 4))
    s.add("transpose_strided_no_unit_axis", transpose_thunk(s, (6, 7), (2, 14), 98, 4))
    s.add("transpose_large_streams", transpose_thunk(s, (1024, 2048), (1, 1024), 2048 * 1024, 4))


def add_reverses(s: Suite) -> None:
    for dims, eb in [((3, 4, 5), 4), ((3, 4, 5), 16), ((17, 33), 1), ((6, 70), 2), ((4, 9, 10), 8), ((100,), 4),
                     ((2, 3, 2, 3, 2, 3), 4)]:
        for mask in itertools.product((False, True), repeat=len(dims)):
            if len(dims) > 2 and sum(mask) not in (0, 1, len(dims)) and mask not in ((True, False, True),
                                                                                    (True, False) * 3):
                continue
            n = int(np.prod(dims))
            s.add(f"reverse{dims}{''.join('r' if m else '.' for m in mask)}x{eb}",
                  T.Reverse(src=s.slot(n * eb), dst=s.slot(n * eb, 8 if eb == 4 else 0), dims=dims, rev_mask=mask,
                            elem_bytes=eb))
    s.add("reverse_empty", T.Reverse(src=s.slot(64), dst=s.slot(64), dims=(3, 0), rev_mask=(True, True), elem_bytes=4))


def add_narrows(s: Suite) -> None:
    for outer, src_stride, dst_stride, inner, eb in [(5, 12, 7, 7, 4), (1, 9, 9, 9, 8), (6, 10, 10, 10, 2),
                                                     (4, 100, 40, 33, 16), (3, 17, 5, 5, 1), (7, 64, 64, 48, 4),
                                                     (0, 4, 4, 4, 4), (4, 4, 4, 0, 4)]:
        src = s.slot(max(1, ((outer - 1) * src_stride + inner)) * eb)
        dst = s.slot(max(1, ((outer - 1) * dst_stride + inner)) * eb)
        s.add(f"narrow{outer}x{inner}/{src_stride}->{dst_stride}x{eb}",
              T.Narrow(src=src, dst=dst, outer=outer, src_stride=src_stride, dst_stride=dst_stride, inner=inner,
                       elem_bytes=eb))
    same = s.slot(40 * 4)
    s.add("narrow_in_place_is_noop", T.Narrow(src=same, dst=same, outer=4, src_stride=10, dst_stride=10, inner=10,
                                              elem_bytes=4))


def add_concats(s: Suite) -> None:
    for kind, eb in ((T.Concat, 4), (T.ConcatF64, 8)):
        for outer, inner, extents in [(3, 4, (2, 3, 1)), (5, 1, (7, 16, 9)), (1, 6, (1, 2)), (4, 16, (3, 0, 2)),
                                      (0, 3, (2, 2))]:
            inputs = tuple((s.slot(outer * e * inner * eb), e, outer * e * inner) for e in extents)
            s.add(f"{kind.__name__}{outer}x{extents}x{inner}",
                  kind(dst=s.slot(outer * sum(extents) * inner * eb), outer=outer, inner=inner,
                       total_axis=sum(extents), inputs=inputs))
        outer, inner = 4, 5
        inputs = ((s.slot(4 * 2 * 5 * eb), 2, 40), (s.slot(eb), 1, 1), (s.slot(3 * 5 * eb), 3, 15),
                  (s.slot(3 * 5 * eb), 3, 7))
        s.add(f"{kind.__name__}_broadcasts", kind(dst=s.slot(outer * 9 * inner * eb), outer=outer, inner=inner,
                                                   total_axis=9, inputs=inputs))


def add_kv_appends(s: Suite) -> None:
    for outer, seq_cap, pos, inner_bytes in [(1, 8, 3, 256), (4, 6, 0, 48), (4, 6, 5, 100), (12, 3, 2, 12)]:
        s.add(f"kv_append{outer}x{seq_cap}@{pos}x{inner_bytes}",
              T.KvAppend(src=s.slot(outer * inner_bytes), dst=s.slot(outer * seq_cap * inner_bytes), outer=outer,
                         seq_cap=seq_cap, pos=pos, inner_bytes=inner_bytes))


def add_resamples(s: Suite) -> None:
    for n, c, h, w in [(1, 1, 1, 1), (2, 3, 4, 5), (1, 2, 3, 16), (1, 1, 2, 33), (1, 2, 3, 8), (0, 3, 4, 4)]:
        s.add(f"resize2x{n, c, h, w}", T.ResizeNearest2x(src=s.slot(4 * n * c * h * w), dst=s.slot(16 * n * c * h * w),
                                                         n=n, c=c, h=h, w=w))
    for dims in [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (5, 7, 9)), ((5, 7, 9), (2, 3, 4)), ((1, 2, 3), (3, 3, 3)),
                 ((3, 1, 5), (3, 4, 5))]:
        (di, hi, wi), (do, ho, wo) = dims
        n, c = 2, 3
        s.add(f"interpolate3d{dims}", T.Interpolate3d(src=s.slot(4 * n * c * di * hi * wi),
                                                      dst=s.slot(4 * n * c * do * ho * wo), n=n, c=c, d_in=di,
                                                      h_in=hi, w_in=wi, d_out=do, h_out=ho, w_out=wo))


def add_im2cols(s: Suite) -> None:
    for n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw in [(1, 2, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1),
                                                       (2, 3, 7, 6, 3, 2, 2, 1, 0, 1, 1, 2),
                                                       (0, 1, 4, 4, 2, 2, 2, 2, 0, 0, 1, 1),
                                                       (1, 2, 6, 6, 3, 3, 1, 1, 2, 2, 2, 2),
                                                       (1, 1, 3, 3, 5, 5, 1, 1, 4, 4, 1, 1)]:
        h_out = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        w_out = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        batch = n or 1
        s.add(f"im2col{n, c, h, w}k{kh, kw}s{sh, sw}p{ph, pw}d{dh, dw}",
              T.Im2Col(x=s.slot(4 * batch * c * h * w), col=s.slot(4 * batch * h_out * w_out * c * kh * kw), n=n,
                       c_in=c, h=h, w=w, h_out=h_out, w_out=w_out, kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw, dh=dh,
                       dw_dil=dw))


# ── ONNX spec cases (expected outputs written by hand from the operator docs' examples) ──

def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def add_onnx_cases(s: Suite) -> None:
    # Transpose, default perm (reverse the axes) and perm=[1, 0, 2] on small known data.
    x = f32(np.arange(6).reshape(2, 3))
    out, st = permuted((2, 3), (1, 0))
    dst = s.slot(24)
    s.add("onnx_transpose_default", T.Transpose(src=s.put(x), dst=dst, in_total=6, out_dims=out, in_strides=st,
                                                elem_bytes=4), expect=(dst, f32([[0, 3], [1, 4], [2, 5]])))
    x = f32(np.arange(12).reshape(2, 3, 2))
    out, st = permuted((2, 3, 2), (1, 0, 2))
    dst = s.slot(48)
    s.add("onnx_transpose_perm_102", T.Transpose(src=s.put(x), dst=dst, in_total=12, out_dims=out, in_strides=st,
                                                 elem_bytes=4),
          expect=(dst, f32([[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5], [10, 11]]])))
    # Concat: concat_1d_axis_0, concat_2d_axis_0, concat_2d_axis_1 and a 3-D axis-1 case.
    a, b = s.put(f32([1, 2])), s.put(f32([3, 4]))
    dst = s.slot(16)
    s.add("onnx_concat_1d_axis_0", T.Concat(dst=dst, outer=1, inner=1, total_axis=4, inputs=((a, 2, 2), (b, 2, 2))),
          expect=(dst, f32([1, 2, 3, 4])))
    a, b = s.put(f32([[1, 2], [3, 4]])), s.put(f32([[5, 6], [7, 8]]))
    dst = s.slot(32)
    s.add("onnx_concat_2d_axis_0", T.Concat(dst=dst, outer=1, inner=2, total_axis=4, inputs=((a, 2, 4), (b, 2, 4))),
          expect=(dst, f32([[1, 2], [3, 4], [5, 6], [7, 8]])))
    dst = s.slot(32)
    s.add("onnx_concat_2d_axis_1", T.Concat(dst=dst, outer=2, inner=1, total_axis=4, inputs=((a, 2, 4), (b, 2, 4))),
          expect=(dst, f32([[1, 2, 5, 6], [3, 4, 7, 8]])))
    a = s.put(f32([[[1, 2], [3, 4]], [[5, 6], [7, 8]]]))
    b = s.put(f32([[[9, 10], [11, 12]], [[13, 14], [15, 16]]]))
    dst = s.slot(64)
    s.add("onnx_concat_3d_axis_1", T.Concat(dst=dst, outer=2, inner=2, total_axis=4, inputs=((a, 2, 8), (b, 2, 8))),
          expect=(dst, f32([[[1, 2], [3, 4], [9, 10], [11, 12]], [[5, 6], [7, 8], [13, 14], [15, 16]]])))
    # Resize nearest: resize_upsample_scales_nearest (scales 2, 3) and resize_downsample_scales_nearest (0.6).
    x = s.put(f32([[1, 2], [3, 4]]))
    dst = s.slot(4 * 24)
    s.add("onnx_resize_upsample_nearest", T.Interpolate3d(src=x, dst=dst, n=1, c=1, d_in=1, h_in=2, w_in=2, d_out=1,
                                                          h_out=4, w_out=6),
          expect=(dst, f32([[1, 1, 1, 2, 2, 2], [1, 1, 1, 2, 2, 2], [3, 3, 3, 4, 4, 4], [3, 3, 3, 4, 4, 4]])))
    dst = s.slot(4 * 16)
    s.add("onnx_resize_upsample_nearest_2x", T.ResizeNearest2x(src=x, dst=dst, n=1, c=1, h=2, w=2),
          expect=(dst, f32([[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4], [3, 3, 4, 4]])))
    x = s.put(f32([[1, 2, 3, 4], [5, 6, 7, 8]]))
    dst = s.slot(8)
    s.add("onnx_resize_downsample_nearest", T.Interpolate3d(src=x, dst=dst, n=1, c=1, d_in=1, h_in=2, w_in=4,
                                                            d_out=1, h_out=1, w_out=2), expect=(dst, f32([[1, 3]])))


def build_suite() -> Suite:
    s = Suite(5)
    for add in (add_transposes, add_reverses, add_narrows, add_concats, add_kv_appends, add_resamples, add_im2cols,
                add_onnx_cases):
        add(s)
    return s


SUITE = build_suite()
SPEC = [c.name for c in SUITE.cases if c.expect is not None]


# Kinds whose kernels have a streaming (non-temporal, prefetching) path: compiled again with streaming forced.
STREAMING_KINDS = {"Transpose", "TransposeF64", "Reverse", "Narrow", "Concat", "ConcatF64", "ResizeNearest2x"}
STREAMED = SUITE.subset(lambda c: type(c.thunk).__name__ in STREAMING_KINDS)

(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


# the streaming cases again, compiled with every output streamed (non-temporal stores, prefetch)
(streamed, test_streamed_matches_reference, test_streamed_changes_nothing_outside_the_outputs,
 test_streamed_thread_count_does_not_change_results, test_streamed_kinds_are_native) = suite_tests(
    STREAMED, streaming_forced, fixture="streamed")


@pytest.mark.parametrize("name", SPEC)
def test_onnx_spec_example(outcome: Outcome, name: str) -> None:
    outcome.check_spec(name)


def test_every_movement_kind_is_lowered():
    kinds = {type(c.thunk).__name__ for c in SUITE.cases}
    assert kinds == {"Transpose", "TransposeF64", "Reverse", "Narrow", "Concat", "ConcatF64", "KvAppend",
                     "ResizeNearest2x", "Interpolate3d", "Im2Col"}
    assert {k: rl.coverage()[k] for k in kinds} == {k: "llvm" for k in kinds}


# ── the plans themselves ────────────────────────────────────────────────────

def test_walk_simplification_merges_contiguous_axes():
    walk = ir_movement.simplify_walk((2, 1, 3, 4), (12, 99, 4, 1))
    assert (walk.dims, walk.strides) == ((24,), (1,))
    walk = ir_movement.simplify_walk(*permuted((4, 5, 6), (0, 2, 1)))
    assert (walk.dims, walk.strides) == ((4, 6, 5), (30, 1, 6))
    assert ir_movement.simplify_walk((3, 0), (1, 1)) is None


# ── validation ──────────────────────────────────────────────────────────────

BAD = {
    "transpose_rank_mismatch": (T.Transpose(src=0, dst=256, in_total=4, out_dims=(2, 2), in_strides=(1,),
                                            elem_bytes=4), "in_strides"),
    "transpose_elem_bytes": (T.Transpose(src=0, dst=256, in_total=4, out_dims=(4,), in_strides=(1,), elem_bytes=3),
                             "elem_bytes"),
    "transpose_in_total_zero": (T.Transpose(src=0, dst=256, in_total=0, out_dims=(4,), in_strides=(0,),
                                            elem_bytes=4), "in_total"),
    "reverse_mask_length": (T.Reverse(src=0, dst=256, dims=(2, 2), rev_mask=(True,), elem_bytes=4), "rev_mask"),
    "reverse_elem_bytes": (T.Reverse(src=0, dst=256, dims=(4,), rev_mask=(True,), elem_bytes=0), "elem_bytes"),
    "narrow_rows_overlap": (T.Narrow(src=0, dst=256, outer=3, src_stride=8, dst_stride=4, inner=8, elem_bytes=4),
                            "dst_stride"),
    "narrow_elem_bytes": (T.Narrow(src=0, dst=256, outer=1, src_stride=4, dst_stride=4, inner=4, elem_bytes=5),
                          "elem_bytes"),
    "concat_extents": (T.Concat(dst=256, outer=1, inner=1, total_axis=5, inputs=((0, 2, 2), (64, 2, 2))), "inputs"),
    "kv_append_pos": (T.KvAppend(src=0, dst=256, outer=1, seq_cap=4, pos=4, inner_bytes=8), "pos"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_thunk_is_a_validation_error(name):
    thunk, fld = BAD[name]
    assert expect_invalid(thunk, 4096, fld).index == 0
