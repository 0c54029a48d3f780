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


@pytest.mark.parametrize("offset, count", [(60, 2), (0, 17), (64, 1)])
@pytest.mark.parametrize("access", ["view", "read", "write"])
def test_past_the_end_is_a_validation_error(offset, count, access):
    a = Arena(64)
    with pytest.raises(ValidationError, match=rf"{access}: bytes \[{offset}, {offset + 4 * count}\) "
                                              "are outside the arena of 64 bytes"):
        a.write(offset, np.zeros(count, np.float32)) if access == "write" else getattr(a, access)(offset, "f32", count)


def bad_calls(a: Arena) -> dict:
    """Calls that must raise, keyed by the message that names the argument and its allowed range."""
    return {
        "read: shape must be an int ≥ 0, got -1": lambda: a.read(0, "f32", -1),
        "view: shape must be an int ≥ 0, got -1": lambda: a.view(0, "f32", -1),
        r"read: shape\[1\] must be an int ≥ 0, got -2": lambda: a.read(0, "f32", (2, -2)),
        "read: shape must be an int ≥ 0, got True": lambda: a.read(0, "f32", True),
        "read: shape must be an int ≥ 0, got 2.0": lambda: a.read(0, "f32", 2.0),
        r"view: shape\[0\] must be an int ≥ 0, got 1.5": lambda: a.view(0, "f32", [1.5]),
        r"read: offset must be an int in 0\.\.64, got -4": lambda: a.read(-4, "f32", 1),
        r"view: offset must be an int in 0\.\.64, got 65": lambda: a.view(65, "u8", 0),
        r"write: offset must be an int in 0\.\.64, got -1": lambda: a.write(-1, np.zeros(1, np.uint8)),
        r"write: offset must be an int in 0\.\.64, got 4.0": lambda: a.write(4.0, np.zeros(1, np.uint8)),
        r"read: offset must be an int in 0\.\.64, got False": lambda: a.read(False, "f32", 1),
        r"read: offset 2 is not a multiple of 4 \(the itemsize of float32\)": lambda: a.read(2, "f32", 1),
        r"view: offset 4 is not a multiple of 8": lambda: a.view(4, "c64", 1),
        "read: dtype must be one of f32, .*, got 'f33'": lambda: a.read(0, "f33", 1),
        "view: dtype must be one of .*, got None": lambda: a.view(0, None, 1),
        "view: dtype must be one of .*, got 'U4'": lambda: a.view(0, "U4", 1),
        "write: dtype must be one of .*, got 'S4'": lambda: a.write(0, [1], dtype="S4"),
        "write: a Python list has no element type; .*dtype=": lambda: a.write(0, [1.0, 2.0]),
        "write: a Python float has no element type": lambda: a.write(0, 1.0),
        "write: dtype='f32' does not apply to raw bytes": lambda: a.write(0, b"abcd", dtype="f32"),
        "write: cannot store the data as uint8: .*300": lambda: a.write(0, [300], dtype="u8"),
        "write: an arena holds numbers; got an array of dtype <U1": lambda: a.write(0, np.array(["x"])),
        r"fill: value must be an int in 0\.\.255, got 256": lambda: a.fill(256),
        "Arena: nbytes must be an int ≥ 0, got -1": lambda: Arena(-1),
        "Arena: nbytes must be an int ≥ 0, got True": lambda: Arena(True),
        "Arena: nbytes must be an int ≥ 0, got 8.0": lambda: Arena(8.0),
        "from_bytes: data must be bytes-like or an ndarray, got int": lambda: Arena.from_bytes(5),
        "from_bytes: data must be bytes-like or an ndarray, got list": lambda: Arena.from_bytes([1, 2]),
    }


@pytest.mark.parametrize("message", list(bad_calls(Arena(64))))
def test_bad_arguments_are_validation_errors_that_say_what_is_allowed(message):
    a = Arena(64)
    a.fill(7)
    with pytest.raises(ValidationError, match=message):
        bad_calls(a)[message]()
    assert (a.bytes == 7).all()  # a refused call changed nothing


def test_misaligned_view_is_rejected():
    with pytest.raises(ValidationError, match="multiple"):
        Arena(64).view(2, "f32", 1)


def test_from_bytes_copies():
    src = np.arange(10, dtype=np.uint8)
    a = Arena.from_bytes(src)
    src[0] = 99
    assert a.bytes[0] == 0 and a.address % 64 == 0


def test_write_with_an_explicit_dtype_converts():
    a = Arena(64)
    a.write(0, [1.0, 2.5], dtype="f32")
    a.write(8, np.float64([3.0]), dtype=DType.F32)
    a.write(12, [-1], dtype="i32")
    assert a.read(0, "f32", 3).tolist() == [1.0, 2.5, 3.0] and a.read(12, "i32", 1)[0] == -1
    a.write(16, b"\x01\x02")
    a.write(18, np.float16(1.0))  # a NumPy scalar has a dtype
    assert a.read(16, "u8", 2).tolist() == [1, 2] and a.read(18, "f16", 1)[0] == 1.0


def test_empty_access_at_the_end_and_numpy_ints_are_fine():
    a = Arena(np.int64(64))
    assert a.read(np.int32(64), "f32", 0).shape == (0,) and a.view(0, "uint16", (0, 3)).shape == (0, 3)
    assert a.read(60, np.dtype(np.uint16), [np.int64(2)]).shape == (2,)  # raw half bits


def test_ml_dtypes_arrays_are_numbers() -> None:
    """bfloat16 / float8 arrays from ml_dtypes are written as their bytes and read back as themselves."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    arena = Arena(64)
    for dt in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn):
        x = np.array([1.5, -2.0, 0.25], dtype=dt)
        arena.write(0, x)
        np.testing.assert_array_equal(arena.read(0, dt, 3), x)
        assert arena.read(0, np.uint8, x.nbytes).tobytes() == x.tobytes()
