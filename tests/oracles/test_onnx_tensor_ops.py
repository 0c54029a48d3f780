"""Transpose/Expand, Concat, Where, Compare, Reduce, ArgReduce, TopK, Cumsum and the GEMMs against the
matching ONNX ops (Transpose, Expand, Concat, Where, Equal/Less/…, Reduce*, ArgMax/ArgMin, TopK, CumSum,
MatMul, Gemm)."""
from __future__ import annotations

import numpy as np

from rlx_llvm import thunks as T
from rlx_llvm.dtypes import DType
from rlx_llvm.ops import CmpOp, ReduceOp
from tests.oracles.onnx_check import OnnxCase, floats, onnx_run, oracle_test, rng

SUM_TOL = dict(rtol=1e-5, atol=1e-5)   # f32 sums in another order
ONNX_COMPARE = {CmpOp.Eq: "Equal", CmpOp.Lt: "Less", CmpOp.Le: "LessOrEqual", CmpOp.Gt: "Greater",
                CmpOp.Ge: "GreaterOrEqual"}
ONNX_REDUCE = {ReduceOp.Sum: "ReduceSum", ReduceOp.Mean: "ReduceMean", ReduceOp.Max: "ReduceMax",
               ReduceOp.Min: "ReduceMin", ReduceOp.Prod: "ReduceProd"}


def dims(shape) -> str:
    """A shape for a case id."""
    return "x".join(map(str, shape))


def element_strides(shape) -> list[int]:
    """Row-major strides of `shape`, in elements."""
    return [int(np.prod(shape[i + 1:])) for i in range(len(shape))]


def transpose_case(shape, perm, dtype=np.float32) -> OnnxCase:
    """Transpose (output coords walk the permuted input strides) ↔ ONNX Transpose."""
    x = floats(shape, 60, *shape).astype(dtype)
    strides = element_strides(shape)

    def build(src: int, dst: int) -> T.Thunk:
        return T.Transpose(src=src, dst=dst, in_total=x.size, out_dims=tuple(shape[p] for p in perm),
                           in_strides=tuple(strides[p] for p in perm), elem_bytes=x.itemsize)

    return OnnxCase(f"Transpose-{dims(shape)}-perm{dims(perm)}-{x.dtype}", "Transpose", (x,), build,
                    tuple(shape[p] for p in perm), x.dtype, attrs=dict(perm=list(perm)))


def expand_case(shape, out_shape) -> OnnxCase:
    """Transpose with stride 0 on size-1 axes ↔ ONNX Expand."""
    x = floats(shape, 61, *shape)
    strides = [0 if n == 1 else s for n, s in zip(shape, element_strides(shape))]

    def build(src: int, _shape: int, dst: int) -> T.Thunk:
        return T.Transpose(src=src, dst=dst, in_total=x.size, out_dims=tuple(out_shape), in_strides=tuple(strides),
                           elem_bytes=4)

    return OnnxCase(f"Expand-{dims(shape)}-to-{dims(out_shape)}", "Expand", (x, np.array(out_shape, np.int64)), build,
                    tuple(out_shape))


def concat_case(shapes, axis: int) -> OnnxCase:
    """Concat of full-rank inputs ↔ ONNX Concat."""
    xs = [floats(s, 62, i, *s) for i, s in enumerate(shapes)]
    extents = [s[axis] for s in shapes]
    out = (*shapes[0][:axis], sum(extents), *shapes[0][axis + 1:])

    def build(*offsets: int) -> T.Thunk:
        *ins, dst = offsets
        return T.Concat(dst=dst, outer=int(np.prod(out[:axis])), inner=int(np.prod(out[axis + 1:])),
                        total_axis=sum(extents), inputs=tuple((o, e, x.size) for o, e, x in zip(ins, extents, xs)))

    return OnnxCase(f"Concat-{'+'.join(map(dims, shapes))}-axis{axis}", "Concat", xs, build, out,
                    attrs=dict(axis=axis))


def where_case(n: int, true_scalar: bool = False) -> OnnxCase:
    """Where with a 1-byte Bool condition ↔ ONNX Where (a scalar operand as a broadcast `[1]` tensor)."""
    g = rng(63, n)
    cond = g.integers(0, 2, n).astype(bool)
    on_true = floats((1,) if true_scalar else (n,), 64, n)
    on_false = floats((n,), 65, n)

    def build(c: int, t: int, f: int, dst: int) -> T.Thunk:
        return T.Where(cond=c, on_true=t, on_false=f, dst=dst, len=n, elem_bytes=4, cond_elem_bytes=1,
                       cond_scalar=False, true_scalar=true_scalar, false_scalar=False)

    return OnnxCase(f"Where-{n}-scalar{int(true_scalar)}", "Where", (cond, on_true, on_false), build, (n,))


def compare_case(op: CmpOp, lhs_shape, rhs_shape, dtype=np.float32) -> OnnxCase:
    """Compare into a 1-byte Bool ↔ ONNX Equal/Less/…, NaNs included; a partial broadcast walks strides.

    ONNX has no NotEqual: `Ne` is compared with ONNX Not(Equal).
    """
    lhs, rhs = (values_with_repeats(shape, key, dtype) for shape, key in ((lhs_shape, 66), (rhs_shape, 67)))
    out = np.broadcast_shapes(lhs_shape, rhs_shape)
    n = int(np.prod(out))
    walk = {}
    if lhs.size != rhs.size:
        walk = dict(out_dims_bcast=out, bcast_lhs_strides=broadcast_strides(lhs_shape, out),
                    bcast_rhs_strides=broadcast_strides(rhs_shape, out))

    def build(lo: int, ro: int, dst: int) -> T.Thunk:
        return T.Compare(lhs=lo, rhs=ro, dst=dst, len=n, op=op, inputs_i64=int(dtype == np.int64),
                         inputs_elem_bytes=lhs.itemsize, dst_elem_bytes=1, lhs_scalar=False, rhs_scalar=False,
                         lhs_len=lhs.size, rhs_len=rhs.size,
                         **(walk or dict(out_dims_bcast=(), bcast_lhs_strides=(), bcast_rhs_strides=())))

    onnx_op = ONNX_COMPARE.get(op, "Equal")
    not_equal = (lambda: np.logical_not(onnx_run("Equal", [lhs, rhs])[0])) if op is CmpOp.Ne else None
    return OnnxCase(f"Compare{op.name}-{dims(lhs_shape)}-{dims(rhs_shape)}-{np.dtype(dtype)}", onnx_op, (lhs, rhs),
                    build, out, np.dtype(bool), expect=not_equal)


def values_with_repeats(shape, key: int, dtype) -> np.ndarray:
    """Small values (so that equal pairs occur), with NaN and ±0 among the floats."""
    v = rng(key, *shape).integers(-3, 4, shape).astype(dtype)
    if v.dtype.kind == "f":
        v.flat[::5] = np.nan
        v.flat[1::7] = -0.0
    return v


def broadcast_strides(shape, out) -> tuple[int, ...]:
    """An operand's element strides in the output's coordinates (0 on broadcast axes), NumPy-aligned."""
    padded = (1,) * (len(out) - len(shape)) + tuple(shape)
    return tuple(0 if d == 1 else s for d, s in zip(padded, element_strides(padded)))


def reduce_case(op: ReduceOp, outer: int, reduced: int, inner: int) -> OnnxCase:
    """Reduce over the middle axis ↔ ONNX Reduce*(axes=[1], keepdims=0) (no NaN: RLX's Max/Min ignore it)."""
    x = floats((outer, reduced, inner), 68, outer, reduced, inner)
    if op is ReduceOp.Prod:
        x = np.float32(1) + x * np.float32(0.1)

    def build(src: int, _axes: int, dst: int) -> T.Thunk:
        return T.Reduce(src=src, dst=dst, outer=outer, reduced=reduced, inner=inner, op=op)

    exact = op in (ReduceOp.Max, ReduceOp.Min)
    return OnnxCase(f"Reduce{op.name}-{outer}x{reduced}x{inner}", ONNX_REDUCE[op], (x, np.array([1], np.int64)), build,
                    (outer, inner), attrs=dict(keepdims=0), **({} if exact else SUM_TOL))


def arg_reduce_case(is_max: bool, outer: int, reduced: int, inner: int) -> OnnxCase:
    """ArgReduce (f32 indices) ↔ ONNX ArgMax / ArgMin(axis=1, keepdims=0)."""
    x = floats((outer, reduced, inner), 69, outer, reduced, inner)

    def build(src: int, dst: int) -> T.Thunk:
        return T.ArgReduce(src=src, dst=dst, outer=outer, reduced=reduced, inner=inner, is_max=is_max)

    op = "ArgMax" if is_max else "ArgMin"
    return OnnxCase(f"{op}-{outer}x{reduced}x{inner}", op, (x,), build, (outer, inner), attrs=dict(axis=1, keepdims=0))


def top_k_case(outer: int, axis_dim: int, k: int, indices_i64: bool) -> OnnxCase:
    """TopK indices (f32 or i64) ↔ the indices output of ONNX TopK(axis=-1, largest, sorted)."""
    x = floats((outer, axis_dim), 70, outer, axis_dim)

    def build(src: int, _k: int, dst: int) -> T.Thunk:
        return T.TopK(src=src, dst=dst, outer=outer, axis_dim=axis_dim, k=k, indices_i64=int(indices_i64))

    return OnnxCase(f"TopK-{outer}x{axis_dim}-k{k}-{'i64' if indices_i64 else 'f32'}", "TopK",
                    (x, np.array([k], np.int64)), build, (outer, k), np.dtype(np.int64 if indices_i64 else np.float32),
                    output=1)


def cumsum_case(rows: int, cols: int, exclusive: bool, dtype: DType = DType.F32) -> OnnxCase:
    """Cumsum along the last axis ↔ ONNX CumSum(axis=1) (f32 sums in order; i64 exact)."""
    x = floats((rows, cols), 71, rows, cols)
    if dtype is DType.I64:
        x = (x * 1000).astype(np.int64)

    def build(src: int, _axis: int, dst: int) -> T.Thunk:
        return T.Cumsum(src=src, dst=dst, rows=rows, cols=cols, exclusive=exclusive, dtype=dtype)

    return OnnxCase(f"Cumsum-{rows}x{cols}-excl{int(exclusive)}-{dtype.value}", "CumSum", (x, np.array(1, np.int64)),
                    build, x.shape, x.dtype, attrs=dict(exclusive=int(exclusive)),
                    **(SUM_TOL if dtype is DType.F32 else {}))


def gemm_case(m: int, k: int, n: int, ta: bool = False, tb: bool = False, bias: bool = False) -> OnnxCase:
    """Sgemm ↔ MatMul; SgemmT ↔ Gemm(transA, transB); FusedMmBiasAct(act=None) ↔ Gemm with C."""
    a = floats((k, m) if ta else (m, k), 72, m, k)
    b = floats((n, k) if tb else (k, n), 73, k, n)
    c = floats((n,), 74, n)
    dims_ = dict(m=m, k=k, n=n)
    if bias:
        build = lambda ao, bo, co, dst: T.FusedMmBiasAct(a=ao, w=bo, bias=co, c=dst, act=None, **dims_)  # noqa: E731
        return OnnxCase(f"FusedMmBiasAct-{m}x{k}x{n}", "Gemm", (a, b, c), build, (m, n), **SUM_TOL)
    if ta or tb:
        build = lambda ao, bo, dst: T.SgemmT(a=ao, b=bo, c=dst, ta=ta, tb=tb, **dims_)  # noqa: E731
        return OnnxCase(f"SgemmT-{m}x{k}x{n}-ta{int(ta)}tb{int(tb)}", "Gemm", (a, b), build, (m, n),
                        attrs=dict(transA=int(ta), transB=int(tb)), **SUM_TOL)
    build = lambda ao, bo, dst: T.Sgemm(a=ao, b=bo, c=dst, **dims_)  # noqa: E731
    return OnnxCase(f"Sgemm-{m}x{k}x{n}", "MatMul", (a, b), build, (m, n), **SUM_TOL)


SHAPES3 = [(2, 5, 3), (1, 13, 1), (4, 1, 7), (3, 100, 2), (2, 1001, 1)]

CASES = [
    transpose_case((2, 3, 4), (2, 0, 1)),
    transpose_case((1, 13), (1, 0)),
    transpose_case((3, 1, 5, 2), (3, 1, 0, 2), np.float64),
    expand_case((3, 1), (3, 5)),
    expand_case((1, 4, 1), (2, 4, 9)),
    concat_case([(2, 3), (2, 1), (2, 5)], 1),
    concat_case([(1, 4, 3), (2, 4, 3)], 0),
    concat_case([(2, 1, 9), (2, 2, 9)], 1),
    where_case(1),
    where_case(13),
    where_case(37, true_scalar=True),
    *(compare_case(op, (23,), (23,)) for op in CmpOp),
    compare_case(CmpOp.Lt, (3, 4), (1, 4)),
    compare_case(CmpOp.Ge, (2, 1, 5), (3, 1)),
    compare_case(CmpOp.Eq, (9,), (9,), np.int64),
    *(reduce_case(op, *s) for op in ReduceOp for s in SHAPES3),
    *(arg_reduce_case(is_max, *s) for is_max in (True, False) for s in SHAPES3),
    top_k_case(1, 7, 3, False),
    top_k_case(3, 13, 5, True),
    top_k_case(2, 1, 1, False),
    top_k_case(4, 100, 10, True),
    cumsum_case(1, 7, False),
    cumsum_case(3, 13, True),
    cumsum_case(5, 1, False, DType.I64),
    cumsum_case(2, 100, True, DType.I64),
    gemm_case(1, 7, 13),
    gemm_case(3, 8, 5),
    gemm_case(17, 33, 9),
    gemm_case(5, 3, 11, ta=True),
    gemm_case(4, 9, 1, tb=True),
    gemm_case(6, 13, 7, ta=True, tb=True),
    gemm_case(3, 17, 5, bias=True),
]

test_tensor_ops_match_onnx = oracle_test(CASES)
