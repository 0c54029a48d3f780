"""Arena: one zeroed, 64-byte-aligned, NumPy-backed byte buffer that every thunk addresses."""
from __future__ import annotations

import numpy as np

from .dtypes import DType
from .errors import ValidationError

ALIGNMENT = 64


def _as_dtype(dtype: "DType | str | np.dtype | type") -> np.dtype:
    try:
        return DType.parse(dtype).numpy
    except ValueError:
        return np.dtype(dtype)  # any other NumPy dtype (e.g. uint16 for raw half bits)


class Arena:
    """A flat little-endian byte buffer; offsets are bytes, every access is bounds-checked."""

    def __init__(self, nbytes: int) -> None:
        if not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise ValidationError(f"arena size must be a non-negative int, got {nbytes!r}")
        raw = np.zeros(int(nbytes) + ALIGNMENT, dtype=np.uint8)
        start = (-raw.ctypes.data) % ALIGNMENT
        self._raw = raw
        self.bytes: np.ndarray = raw[start:start + int(nbytes)]
        """The whole arena as a writable uint8 array."""
        self._address = int(raw.ctypes.data) + start
        self._nbytes = int(nbytes)

    @classmethod
    def from_bytes(cls, data: "bytes | np.ndarray") -> "Arena":
        """A new aligned arena holding a copy of `data`."""
        src = np.frombuffer(bytes(data), dtype=np.uint8) if not isinstance(data, np.ndarray) \
            else data.reshape(-1).view(np.uint8)
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

    def _check(self, offset: int, nbytes: int, what: str) -> None:
        if not isinstance(offset, (int, np.integer)) or offset < 0 or offset + nbytes > self.nbytes:
            raise ValidationError(f"{what}: bytes [{offset}, {offset + nbytes}) are outside the arena "
                                  f"of {self.nbytes} bytes")

    def view(self, offset: int, dtype: "DType | str | np.dtype", shape: "int | tuple[int, ...]") -> np.ndarray:
        """A writable typed view of the arena at `offset` (bf16 is viewed as its uint16 bits)."""
        dt = _as_dtype(dtype)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        count = int(np.prod(shape, dtype=np.int64))
        self._check(offset, count * dt.itemsize, "view")
        if offset % dt.itemsize:
            raise ValidationError(f"view: offset {offset} is not a multiple of the {dt} itemsize")
        return self.bytes[offset:offset + count * dt.itemsize].view(dt).reshape(shape)

    def write(self, offset: int, array: "np.ndarray | bytes") -> None:
        """Copy an array's bytes into the arena at `offset`."""
        data = np.frombuffer(array, dtype=np.uint8) if isinstance(array, (bytes, bytearray)) \
            else np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        self._check(offset, data.size, "write")
        self.bytes[offset:offset + data.size] = data

    def read(self, offset: int, dtype: "DType | str | np.dtype", shape: "int | tuple[int, ...]") -> np.ndarray:
        """A copy of the typed data at `offset`."""
        return self.view(offset, dtype, shape).copy()

    def fill(self, value: int) -> None:
        """Set every byte to `value` (tests fill with a sentinel pattern)."""
        self.bytes[:] = value

    def __repr__(self) -> str:
        return f"Arena({self.nbytes} bytes at 0x{self.address:x})"
