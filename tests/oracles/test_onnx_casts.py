"""Every Cast* kind and CastGeneric over all real dtype pairs against ONNX Cast, bit-exact.

ONNX leaves a float → integer cast undefined when the value is NaN, infinite or out of the
integer's range (RLX saturates, NaN → 0): those inputs — and only those — are dropped from the
float → integer cases. Everything else ONNX defines (float → float overflow to ±inf, RNE halves,
integer → integer wrapping, anything → bool as `x != 0`) is compared bit for bit. Complex dtypes
have no ONNX Cast counterpart that keeps the imaginary part and are left to the NumPy-oracle tests.
"""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
from onnx import helper

from rlx_llvm import thunks as T
from rlx_llvm.dtypes import DType as D
from tests.oracles.onnx_check import OnnxCase, oracle_test, rng

REAL = [d for d in D if d not in (D.C64, D.C128)]
SHORT = {"F32": D.F32, "F64": D.F64, "F16": D.F16, "Bf16": D.BF16, "I32": D.I32, "I64": D.I64, "Bool": D.Bool}
FLOATS = [0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 0.49999997, 1 / 3, 1e-45, 1e-8, 6e-8, 1.00390625, 127.5, 128.0,
          -128.5, 255.9, 256.0, -1.0, 65504.0, 65519.0, 65520.0, 1e5, 2.0**31 - 1, -2.0**31, 2.0**31, 2.0**32,
          2.0**63, -2.0**63, 2.0**64, 3.4e38, 1e300, -1e300, np.inf, -np.inf, np.nan]
INTS = [0, 1, -1, 2, 127, 128, -128, -129, 255, 256, 32767, 32768, -32769, 65535, 65536, 2**24 + 1, 2**31 - 1,
        -2**31, 2**31, 2**32 - 1, 2**32, 2**53 + 1, 2**63 - 1, -2**63]


def numpy_dtype(d: D) -> np.dtype:
    """The NumPy dtype of a DType's values (bf16 as ml_dtypes.bfloat16, not its bit pattern)."""
    return np.dtype(ml_dtypes.bfloat16) if d is D.BF16 else np.dtype(d.numpy)


def is_float(d: D) -> bool:
    """Whether `d` is a floating-point dtype."""
    return numpy_dtype(d).kind == "f" or d is D.BF16


def source_values(d: D) -> np.ndarray:
    """Edge values and random ones in dtype `d` (37 or more, not a multiple of 8)."""
    g = rng(50, REAL.index(d))
    with np.errstate(all="ignore"):
        if d is D.Bool:
            return g.integers(0, 2, 37).astype(bool)
        if is_float(d):
            return np.concatenate([FLOATS, g.standard_normal(21) * 300]).astype(numpy_dtype(d))
        return np.concatenate([np.array(INTS, np.int64), g.integers(-1000, 1000, 19)]).astype(numpy_dtype(d))


def onnx_defined(values: np.ndarray, src: D, dst: D) -> np.ndarray:
    """The inputs whose cast ONNX defines: for float → integer, finite values whose truncation fits."""
    if not (is_float(src) and not is_float(dst) and dst is not D.Bool):
        return values
    info = np.iinfo(numpy_dtype(dst))
    whole = np.trunc(values.astype(np.float64))
    with np.errstate(invalid="ignore"):   # the bounds are powers of two, exact in f64
        fits = np.isfinite(whole) & (whole >= float(info.min)) & (whole < float(info.max) + 1)
    return values[fits]


def cast_case(kind: str, src: D, dst: D) -> OnnxCase:
    """A Cast* thunk (or CastGeneric) from `src` to `dst` ↔ ONNX Cast(to=dst)."""
    x = onnx_defined(source_values(src), src, dst)
    cls = getattr(T, kind)
    dtypes = dict(src_dtype=src, dst_dtype=dst) if cls is T.CastGeneric else {}

    def build(src_off: int, dst_off: int) -> T.Thunk:
        return cls(src=src_off, dst=dst_off, len=x.size, **dtypes)

    return OnnxCase(f"{kind}-{src.value}-to-{dst.value}-{x.size}", "Cast", (x,), build, x.shape, numpy_dtype(dst),
                    attrs=dict(to=helper.np_dtype_to_tensor_dtype(numpy_dtype(dst))))


def dedicated_kinds() -> list[tuple[str, D, D]]:
    """(kind, source, destination) of every dedicated Cast thunk, from its name."""
    found = (re.fullmatch(r"Cast(\w+?)To(\w+)", k) for k in T.ALL_THUNKS)
    return [(m.group(0), SHORT[m.group(1)], SHORT[m.group(2)]) for m in found if m]


CASES = [*(cast_case(kind, s, d) for kind, s, d in dedicated_kinds()),
         *(cast_case("CastGeneric", s, d) for s in REAL for d in REAL)]

test_casts_match_onnx = oracle_test(CASES)


def test_every_dedicated_cast_kind_is_covered():
    assert len(dedicated_kinds()) == sum(k.startswith("Cast") for k in T.ALL_THUNKS) - 1   # all but CastGeneric
