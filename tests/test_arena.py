"""Arena: alignment, zeroing, typed views and bounds checks."""
import numpy as np
import pytest

from rlx_llvm import Arena, DType, ValidationError


def test_new_arena_is_zeroed_and_aligned():
    a = Arena(1000)
    assert a.nbytes == 1000 and a.address % 64 == 0
    assert not a.bytes.any()


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "f64", "i8", "i16", "i32", "i64", "u8", "u32",
                                   "bool", "c64", DType.F32, np.float64, np.dtype(np.int32)])
def test_write_read_round_trip(dtype):
    a = Arena(4096)
    np_dtype = DType.parse(dtype).numpy
    data = (np.arange(24) % 2).astype(np_dtype)
    a.write(64, data)
    assert np.array_equal(a.read(64, dtype, (4, 6)), data.reshape(4, 6))


def test_view_is_live():
    a = Arena(64)
    v = a.view(0, "f32", 16)
    v[3] = 2.5
    assert a.read(12, "f32", 1)[0] == 2.5


@pytest.mark.parametrize("offset, count", [(-4, 1), (60, 2), (64, 1), (0, 17)])
def test_out_of_bounds_is_a_validation_error(offset, count):
    a = Arena(64)
    with pytest.raises(ValidationError, match="outside the arena"):
        a.view(offset, "f32", count)
    with pytest.raises(ValidationError):
        a.write(offset, np.zeros(count, np.float32)) if offset >= 0 else a.read(offset, "f32", count)


def test_misaligned_view_is_rejected():
    with pytest.raises(ValidationError, match="multiple"):
        Arena(64).view(2, "f32", 1)


def test_from_bytes_copies():
    src = np.arange(10, dtype=np.uint8)
    a = Arena.from_bytes(src)
    src[0] = 99
    assert a.bytes[0] == 0 and a.address % 64 == 0


def test_bad_size():
    with pytest.raises(ValidationError):
        Arena(-1)
