"""Thunks against one-node ONNX models run by `onnx.reference.ReferenceEvaluator`.

An `OnnxCase` pairs a thunk with the ONNX node that computes the same thing from the same inputs.
`oracle_test(cases)` lays every case of a family out in one arena, compiles the family ONCE, runs
it natively and with our NumPy oracle (`rlx_llvm.reference`), and returns a pytest test that
compares each engine's output with the ONNX reference evaluator's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Callable, Sequence

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import rlx_llvm as rl
from rlx_llvm import reference as ref

OPSET = 23          # GroupNormalization with per-channel scale (21), RMSNormalization (23)
ALIGN = 64
UNWRITTEN = 0xA5    # every arena byte starts as this: an output the thunk never writes shows
ENGINES = ("native", "reference")


@dataclass
class OnnxCase:
    """One thunk (or a short list) that should compute what ONNX `op` computes on `inputs`.

    `build(*input offsets, *extra offsets, out offset)` makes the thunks; `extra` arrays are written
    to the arena for the thunk only (an RLX operand ONNX has no counterpart for, e.g. a zero bias).
    ONNX output number `output` is compared with the `out_shape`/`out_dtype` result (ONNX results are
    cast with `astype` first, e.g. int64 indices → RLX's f32 indices); both tolerances 0 = bit-exact.
    `expect`, when given, replaces the one-node ONNX result (a relation built from ONNX results, for
    a documented difference by design).
    """

    id: str
    op: str
    inputs: Sequence[np.ndarray]
    build: Callable[..., object]
    out_shape: tuple[int, ...]
    out_dtype: np.dtype = np.dtype(np.float32)
    attrs: dict = field(default_factory=dict)
    extra: Sequence[np.ndarray] = ()
    output: int = 0
    rtol: float = 0.0
    atol: float = 0.0
    expect: "Callable[[], np.ndarray] | None" = None


def onnx_run(op: str, inputs: Sequence[np.ndarray], attrs: "dict | None" = None, outputs: int = 1) -> list[np.ndarray]:
    """Every output of a one-node ONNX model `op(*inputs, **attrs)` under the reference evaluator."""
    names = [f"x{i}" for i in range(len(inputs))]
    outs = [f"y{i}" for i in range(outputs)]
    graph = helper.make_graph(
        [helper.make_node(op, names, outs, **(attrs or {}))], op,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    return ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))


def onnx_expected(case: OnnxCase) -> np.ndarray:
    """The ONNX result a case is compared with, in the case's output dtype."""
    with np.errstate(over="ignore"):   # a cast that overflows to ±inf is defined and compared
        got = case.expect() if case.expect else onnx_run(case.op, case.inputs, case.attrs, case.output + 1)[case.output]
    return np.asarray(got).astype(case.out_dtype).reshape(case.out_shape)


class Layout:
    """Cases placed one after another in one arena (64-byte aligned slots)."""

    def __init__(self) -> None:
        self.nbytes, self.writes, self.thunks = 0, [], []
        self.outputs: dict[str, tuple[int, np.dtype, tuple[int, ...]]] = {}

    def slot(self, nbytes: int) -> int:
        """The offset of a fresh slot of `nbytes`."""
        offset = self.nbytes
        self.nbytes += -(-max(nbytes, 1) // ALIGN) * ALIGN
        return offset

    def put(self, array: np.ndarray) -> int:
        """The offset of a slot holding `array`."""
        offset = self.slot(array.nbytes)
        self.writes.append((offset, np.ascontiguousarray(array)))
        return offset

    def add(self, case: OnnxCase) -> None:
        """Place a case's inputs and output and append its thunks."""
        dtype = np.dtype(case.out_dtype)
        offsets = [self.put(a) for a in (*case.inputs, *case.extra)]
        out = self.slot(dtype.itemsize * int(np.prod(case.out_shape)))
        built = case.build(*offsets, out)
        self.thunks += list(built) if isinstance(built, (list, tuple)) else [built]
        self.outputs[case.id] = (out, dtype, case.out_shape)

    def arena(self) -> "rl.Arena":
        """A fresh arena holding every input."""
        arena = rl.Arena(self.nbytes)
        arena.fill(UNWRITTEN)
        for offset, array in self.writes:
            arena.write(offset, array)
        return arena


def run_cases(cases: Sequence[OnnxCase]) -> dict[str, dict[str, np.ndarray]]:
    """{engine: {case id: output}} after running all cases as one program natively and in NumPy."""
    layout = Layout()
    for case in cases:
        layout.add(case)
    schedule = rl.ThunkSchedule(layout.thunks, arena_bytes=layout.nbytes)
    native, numpy_ = layout.arena(), layout.arena()
    rl.compile(schedule).run(native)
    ref.run(schedule, numpy_)
    return {engine: {cid: arena.read(off, dtype, shape) for cid, (off, dtype, shape) in layout.outputs.items()}
            for engine, arena in zip(ENGINES, (native, numpy_))}


def assert_matches(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> None:
    """Bit-exact (any NaN matches any NaN) when both tolerances are 0, else within `atol + rtol·|want|`."""
    assert got.shape == want.shape and got.dtype == want.dtype
    if rtol or atol:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
        return
    bits = np.dtype(f"u{got.dtype.itemsize}") if got.dtype.itemsize in (1, 2, 4, 8) else got.dtype
    same = got.view(bits) == want.view(bits)
    if got.dtype.kind == "f" or got.dtype == ml_dtypes.bfloat16:
        same |= np.isnan(got.astype(np.float64)) & np.isnan(want.astype(np.float64))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, f"{bad.size} of {got.size} differ, first at {bad[:5]}: got {got.flat[bad[:5]]}, " \
                          f"want {want.flat[bad[:5]]}"


def oracle_test(cases: Sequence[OnnxCase]) -> Callable:
    """A test parametrized over cases × engines; the family is compiled and run once, on first use."""
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids), "case ids must be unique"
    results = cache(lambda: run_cases(cases))
    params = [pytest.param(case, engine, id=f"{case.id}-{engine}") for case in cases for engine in ENGINES]

    @pytest.mark.parametrize("case, engine", params)
    def test(case: OnnxCase, engine: str) -> None:
        assert_matches(results()[engine][case.id], onnx_expected(case), case.rtol, case.atol)

    return test


def rng(*key: int) -> np.random.Generator:
    """A generator seeded by the case parameters (each case draws the same data every run)."""
    return np.random.default_rng(list(key))


def floats(shape: Sequence[int], *key: int) -> np.ndarray:
    """Standard-normal f32 data of `shape`, seeded by `key`."""
    return rng(*key).standard_normal(tuple(shape)).astype(np.float32)
