"""Element types: DType (RLX's rlx_ir::DType), LaneKind and HalfKind."""
from __future__ import annotations

import enum
import functools

import numpy as np


class DType(enum.Enum):
    """RLX tensor element type; `.itemsize`, `.numpy` and the class predicates describe it."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    F64 = "f64"
    I8 = "i8"
    I16 = "i16"
    I32 = "i32"
    I64 = "i64"
    U8 = "u8"
    U32 = "u32"
    Bool = "bool"
    C64 = "c64"
    C128 = "c128"

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _ITEMSIZE[self]

    @property
    def numpy(self) -> np.dtype:
        """The NumPy dtype that stores it (bf16 is stored as its uint16 bit pattern)."""
        return np.dtype(_NUMPY[self])

    @property
    def is_float(self) -> bool:
        """Real floating point (f16, bf16, f32, f64)."""
        return self in (DType.F32, DType.F16, DType.BF16, DType.F64)

    @property
    def is_int(self) -> bool:
        """Integer (signed or unsigned), not Bool."""
        return self in (DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U32)

    @property
    def is_signed(self) -> bool:
        """Signed integer."""
        return self in (DType.I8, DType.I16, DType.I32, DType.I64)

    @property
    def is_complex(self) -> bool:
        """Interleaved complex (c64, c128)."""
        return self in (DType.C64, DType.C128)

    @classmethod
    def parse(cls, spec: "DType | str | np.dtype | type") -> "DType":
        """Accept a DType, its display name ("f32", "bf16") or a NumPy dtype."""
        if isinstance(spec, DType):
            return spec
        if isinstance(spec, str):
            key = spec.lower()
            if key in _BY_NAME:
                return _BY_NAME[key]
        try:
            dt = np.dtype(spec)
        except TypeError:
            dt = None
        if dt is not None and dt in _BY_NUMPY:
            return _BY_NUMPY[dt]
        raise ValueError(f"unknown dtype {spec!r}")


_ITEMSIZE = {DType.F32: 4, DType.F16: 2, DType.BF16: 2, DType.F64: 8, DType.I8: 1, DType.I16: 2,
             DType.I32: 4, DType.I64: 8, DType.U8: 1, DType.U32: 4, DType.Bool: 1,
             DType.C64: 8, DType.C128: 16}
_NUMPY = {DType.F32: "<f4", DType.F16: "<f2", DType.BF16: "<u2", DType.F64: "<f8", DType.I8: "i1",
          DType.I16: "<i2", DType.I32: "<i4", DType.I64: "<i8", DType.U8: "u1", DType.U32: "<u4",
          DType.Bool: "?", DType.C64: "<c8", DType.C128: "<c16"}
_BY_NAME = {d.value: d for d in DType} | {d.name.lower(): d for d in DType} | {
    "float32": DType.F32, "float": DType.F32, "float16": DType.F16, "half": DType.F16,
    "bfloat16": DType.BF16, "float64": DType.F64, "double": DType.F64, "int8": DType.I8,
    "int16": DType.I16, "int32": DType.I32, "int64": DType.I64, "uint8": DType.U8,
    "uint32": DType.U32, "complex64": DType.C64, "complex128": DType.C128}
_BY_NUMPY = {np.dtype(np.float32): DType.F32, np.dtype(np.float16): DType.F16,
             np.dtype(np.float64): DType.F64, np.dtype(np.int8): DType.I8,
             np.dtype(np.int16): DType.I16, np.dtype(np.int32): DType.I32,
             np.dtype(np.int64): DType.I64, np.dtype(np.uint8): DType.U8,
             np.dtype(np.uint32): DType.U32, np.dtype(np.bool_): DType.Bool,
             np.dtype(np.complex64): DType.C64, np.dtype(np.complex128): DType.C128}


class LaneKind(enum.Enum):
    """Storage width of one lane of a fused region operand (math is always f32)."""

    F32 = "F32"
    F16 = "F16"
    Bf16 = "Bf16"
    F64 = "F64"

    @functools.cached_property
    def itemsize(self) -> int:
        """Bytes per lane (worked out once per member: a region's extents ask once per input)."""
        return {"F32": 4, "F16": 2, "Bf16": 2, "F64": 8}[self.value]

    @property
    def dtype(self) -> DType:
        """The DType stored in the lane."""
        return {"F32": DType.F32, "F16": DType.F16, "Bf16": DType.BF16, "F64": DType.F64}[self.value]

    @classmethod
    def resolve(cls, dtype: DType, elem_bytes: int) -> "LaneKind":
        """RLX's rule: F16&2 → F16, BF16&2 → Bf16, F64&8 → F64, anything else → F32."""
        return {(DType.F16, 2): cls.F16, (DType.BF16, 2): cls.Bf16,
                (DType.F64, 8): cls.F64}.get((dtype, elem_bytes), cls.F32)


class HalfKind(enum.Enum):
    """How one GEMM operand is laid out: full f32 or packed 2 B/elem."""

    F32 = "F32"
    Bf16 = "Bf16"
    F16 = "F16"

    @property
    def packed(self) -> bool:
        """Packed layouts need widening before an f32 kernel may read them."""
        return self is not HalfKind.F32

    @property
    def itemsize(self) -> int:
        """Bytes per element in the arena."""
        return 4 if self is HalfKind.F32 else 2
