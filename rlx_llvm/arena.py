"""Arena: one zeroed, 64-byte-aligned, NumPy-backed byte buffer that every thunk addresses."""
from __future__ import annotations

import contextlib
import math

import numpy as np

from . import limits
from .dtypes import DType
from .errors import ValidationError

ALIGNMENT = 64
NUMERIC_KINDS = "biufc"  # NumPy dtype kinds an arena holds: bool, signed, unsigned, float, complex


def _numeric(dtype: np.dtype) -> bool:
    """A NumPy number type, or one of ml_dtypes' (bfloat16, float8_*, int4 …: scalars of kind 'V')."""
    return dtype.kind in NUMERIC_KINDS or (dtype.fields is None and dtype.type.__module__.startswith("ml_dtypes"))
Shape = "int | tuple[int, ...]"


def _natural(where: str, name: str, value: object, high: int | None = None) -> int:
    """`value` as an int in 0..high (any int ≥ 0 when `high` is None), else a ValidationError naming it."""
    is_int = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not is_int or value < 0 or (high is not None and value > high):
        allowed = "an int ≥ 0" if high is None else f"an int in 0..{high}"
        raise ValidationError(f"{where}: {name} must be {allowed}, got {value!r}")
    return int(value)


def _shape(where: str, shape: Shape) -> tuple[int, ...]:
    """A shape (an int or a sequence of ints) as a tuple of non-negative ints."""
    if isinstance(shape, (tuple, list)):
        return tuple(_natural(where, f"shape[{i}]", n) for i, n in enumerate(shape))
    return (_natural(where, "shape", shape),)


def _as_dtype(where: str, dtype: "DType | str | np.dtype | type") -> np.dtype:
    """The NumPy dtype of an RLX DType (or its name), or any numeric NumPy or ml_dtypes dtype (e.g.
    uint16 for raw half bits, ml_dtypes.bfloat16); anything else is a ValidationError."""
    if dtype is not None:
        with contextlib.suppress(ValueError):
            return DType.parse(dtype).numpy
        with contextlib.suppress(TypeError, ValueError):
            if _numeric(np.dtype(dtype)):
                return np.dtype(dtype)
    names = ", ".join(d.value for d in DType)
    raise ValidationError(f"{where}: dtype must be one of {names} or a numeric NumPy dtype, got {dtype!r}")


def _as_bytes(where: str, data: object, dtype: "DType | str | np.dtype | None" = None) -> np.ndarray:
    """`data` as flat uint8: bytes-like as they are; an ndarray or NumPy scalar as its own dtype (or cast
    to `dtype`); anything else (a list, a Python number) only with an explicit `dtype`."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        if dtype is not None:
            raise ValidationError(f"{where}: dtype={dtype!r} does not apply to raw bytes; pass an array instead")
        return np.frombuffer(data, dtype=np.uint8)
    if dtype is None and not isinstance(data, (np.ndarray, np.generic)):
        raise ValidationError(f"{where}: a Python {type(data).__name__} has no element type; pass an ndarray "
                              f"or say which with dtype= (e.g. dtype='f32')")
    target = None if dtype is None else _as_dtype(where, dtype)
    try:
        array = np.ascontiguousarray(data, dtype=target)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValidationError(f"{where}: cannot store the data as {target}: {exc}") from None
    if not _numeric(array.dtype):
        raise ValidationError(f"{where}: an arena holds numbers; got an array of dtype {array.dtype}")
    return array.reshape(-1).view(np.uint8)


class Arena:
    """A flat little-endian byte buffer; offsets are bytes, every access is bounds-checked."""

    def __init__(self, nbytes: int) -> None:
        nbytes = _natural("Arena", "nbytes", nbytes)
        limits.check_bytes("Arena", nbytes, field="nbytes")
        raw = np.zeros(nbytes + ALIGNMENT, dtype=np.uint8)
        start = (-raw.ctypes.data) % ALIGNMENT
        self._raw = raw
        self.bytes: np.ndarray = raw[start:start + nbytes]
        """The whole arena as a writable uint8 array."""
        self._address = int(raw.ctypes.data) + start
        self._nbytes = nbytes

    @classmethod
    def from_bytes(cls, data: "bytes | np.ndarray") -> "Arena":
        """A new aligned arena holding a copy of `data` (bytes-like, or an array's raw bytes)."""
        if not isinstance(data, (bytes, bytearray, memoryview, np.ndarray)):
            raise ValidationError(f"from_bytes: data must be bytes-like or an ndarray, got {type(data).__name__}")
        src = _as_bytes("from_bytes", data)
        arena = cls(src.size)
        arena.bytes[:] = src
        return arena

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self._nbytes

    @property
    def address(self) -> int:
        """Address of byte 0 (64-byte aligned)."""
        return self._address

    def _span(self, where: str, offset: int, nbytes: int) -> int:
        """`offset` as an int, checked so that bytes [offset, offset + nbytes) lie inside the arena."""
        offset = _natural(where, "offset", offset, self.nbytes)
        if offset + nbytes > self.nbytes:
            raise ValidationError(f"{where}: bytes [{offset}, {offset + nbytes}) are outside the arena "
                                  f"of {self.nbytes} bytes")
        return offset

    def _typed(self, where: str, offset: int, dtype: "DType | str | np.dtype", shape: Shape) -> np.ndarray:
        """The live typed view behind `view` and `read`; the offset must be a multiple of the itemsize."""
        dt, shape = _as_dtype(where, dtype), _shape(where, shape)
        nbytes = math.prod(shape) * dt.itemsize
        offset = self._span(where, offset, nbytes)
        if offset % dt.itemsize:
            raise ValidationError(f"{where}: offset {offset} is not a multiple of {dt.itemsize} "
                                  f"(the itemsize of {dt})")
        return self.bytes[offset:offset + nbytes].view(dt).reshape(shape)

    def view(self, offset: int, dtype: "DType | str | np.dtype", shape: Shape) -> np.ndarray:
        """A writable typed view of the arena at `offset` (bf16 is viewed as its uint16 bits)."""
        return self._typed("view", offset, dtype, shape)

    def read(self, offset: int, dtype: "DType | str | np.dtype", shape: Shape) -> np.ndarray:
        """A copy of the typed data at `offset`."""
        return self._typed("read", offset, dtype, shape).copy()

    def write(self, offset: int, data: "np.ndarray | bytes | object",
              dtype: "DType | str | np.dtype | None" = None) -> None:
        """Copy `data` into the arena at `offset`: an ndarray as its own dtype (or cast to `dtype`), bytes
        as they are; a list or Python number needs `dtype` (there is no silent float64)."""
        raw = _as_bytes("write", data, dtype)
        offset = self._span("write", offset, raw.size)
        self.bytes[offset:offset + raw.size] = raw

    def fill(self, value: int) -> None:
        """Set every byte to `value` (tests fill with a sentinel pattern)."""
        self.bytes[:] = _natural("fill", "value", value, 255)

    def __repr__(self) -> str:
        return f"Arena({self.nbytes} bytes at 0x{self.address:x})"
