"""Copies and dtype conversions: `len` elements from `src` to `dst` (semantics.md §3.1).

Each fixed cast only differs in its element widths, so the classes are one line of widths each on
top of the shared `src / dst / len` shape.
"""
from __future__ import annotations

from ..dtypes import DType
from .base import BOOL, F32, F64, HALF, I32, I64, _Unary


class _Cast(_Unary):
    family = "casts"


class Copy(_Cast):
    """Copy `len` 4-byte elements (reshape, expand)."""


class CopyF64(_Cast):
    """Copy `len` 8-byte f64 elements."""

    src_bytes = dst_bytes = F64


class CopyI64(_Cast):
    """Copy `len` 8-byte i64 elements."""

    src_bytes = dst_bytes = I64


class RoundHalf(_Cast):
    """Round f32 values to bf16 (`bf16`) or f16 precision, keeping f32 storage."""

    bf16: bool


class CastF32ToI64(_Cast):
    """Truncating f32 → i64 (toward zero, saturating, NaN → 0)."""

    src_bytes, dst_bytes = F32, I64


class CastF32ToF64(_Cast):
    """Widening f32 → f64 (exact)."""

    src_bytes, dst_bytes = F32, F64


class CastF64ToF32(_Cast):
    """Narrowing f64 → f32 (round to nearest)."""

    src_bytes, dst_bytes = F64, F32


class CastF64ToI64(_Cast):
    """Truncating f64 → i64 (toward zero, saturating, NaN → 0)."""

    src_bytes, dst_bytes = F64, I64


class CastF64ToI32(_Cast):
    """Truncating f64 → i32 (toward zero, saturating, NaN → 0)."""

    src_bytes, dst_bytes = F64, I32


class CastF64ToBool(_Cast):
    """f64 → 1-byte Bool (`x != 0.0`)."""

    src_bytes, dst_bytes = F64, BOOL


class CastI64ToI32(_Cast):
    """Narrowing i64 → i32 (wrapping: the low 32 bits)."""

    src_bytes, dst_bytes = I64, I32


class CastI64ToF64(_Cast):
    """i64 → f64 (`x as f64`)."""

    src_bytes, dst_bytes = I64, F64


class CastI32ToF64(_Cast):
    """i32 → f64 (exact)."""

    src_bytes, dst_bytes = I32, F64


class CastF32ToF16(_Cast):
    """f32 → packed 2-byte f16 (round to nearest even)."""

    src_bytes, dst_bytes = F32, HALF


class CastF16ToF32(_Cast):
    """Packed 2-byte f16 → f32 (exact)."""

    src_bytes, dst_bytes = HALF, F32


class CastF32ToBf16(_Cast):
    """f32 → packed 2-byte bf16 (round to nearest even)."""

    src_bytes, dst_bytes = F32, HALF


class CastBf16ToF32(_Cast):
    """Packed 2-byte bf16 → f32 (exact)."""

    src_bytes, dst_bytes = HALF, F32


class CastF32ToI32(_Cast):
    """Truncating f32 → i32 (toward zero, saturating, NaN → 0)."""

    src_bytes, dst_bytes = F32, I32


class CastI64ToF32(_Cast):
    """i64 → f32 (round to nearest)."""

    src_bytes, dst_bytes = I64, F32


class CastBoolToI32(_Cast):
    """1-byte Bool → i32 (0/1)."""

    src_bytes, dst_bytes = BOOL, I32


class CastBoolToF32(_Cast):
    """1-byte Bool → f32 (0.0/1.0)."""

    src_bytes, dst_bytes = BOOL, F32


class CastF32ToBool(_Cast):
    """f32 → 1-byte Bool (`x != 0.0`)."""

    src_bytes, dst_bytes = F32, BOOL


class CastI32ToF32(_Cast):
    """i32 → f32 (round to nearest)."""

    src_bytes, dst_bytes = I32, F32


class CastI32ToI64(_Cast):
    """i32 → i64 (sign-extend)."""

    src_bytes, dst_bytes = I32, I64


class CastI32ToBool(_Cast):
    """i32 → 1-byte Bool (`x != 0`)."""

    src_bytes, dst_bytes = I32, BOOL


class CastI64ToBool(_Cast):
    """i64 → 1-byte Bool (`x != 0`)."""

    src_bytes, dst_bytes = I64, BOOL


class CastBoolToI64(_Cast):
    """1-byte Bool → i64 (0/1)."""

    src_bytes, dst_bytes = BOOL, I64


class CastGeneric(_Cast):
    """Scalar cast between any numeric dtype pair without a dedicated thunk (widths from the dtypes)."""

    src_dtype: DType
    dst_dtype: DType

    @property
    def src_bytes(self) -> int:  # type: ignore[override]
        """Bytes per source element."""
        return self.src_dtype.itemsize

    @property
    def dst_bytes(self) -> int:  # type: ignore[override]
        """Bytes per destination element."""
        return self.dst_dtype.itemsize
