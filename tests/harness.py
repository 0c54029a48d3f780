"""The one test harness: thunk suites checked against the NumPy oracle, and element kernels JIT-ed alone.

A `Suite` lays its cases out in one arena — 64-byte-aligned slots with random guard bytes between
them — and compiles them as ONE program (JIT compiles cost tens of ms each: every parametrized case
of a family shares it).  `Suite.run()` runs the program and `rlx_llvm.reference` on copies of the
same bytes; the `Outcome` then checks each case (NaN-aware tolerance, or bit-exact), that no byte
outside the declared outputs changed (guards, inputs no output aliases), and that the bytes do not
depend on the thread count.  `suite_tests` binds those checks as pytest tests; `expect_invalid`
checks that bad input is a ValidationError naming the field.

`Kernel` / `JitHarness` compile bare element emitters (`emit(builder, *values)`) into a vector loop
plus a scalar tail, for the math-library tests that run below the thunk level.
"""
from __future__ import annotations

import contextlib
import ctypes
import math
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator

import numpy as np
import pytest
from llvmlite import binding as llvm
from llvmlite import ir

import rlx_llvm as rl
from rlx_llvm import reference as ref
from rlx_llvm import registry
from rlx_llvm.dtypes import HalfKind
from rlx_llvm.jit import host
from rlx_llvm.reference.halves import f32_to_bf16_bits, f32_to_f16_bits

ALIGN = 64   # every slot starts on a cache line (plus an optional skew)
GUARD = 64   # random bytes between slots: a stray write or read past a slot shows
NAN_FILL = 0xFF  # a `fill` that is a NaN in every float width (f16, bf16, f32, f64)

Output = tuple[int, np.dtype, int]   # (byte offset, dtype, element count)

W = host().lanes(32)                              # f32 lanes of the host's vectors
WIDTHS = (1, W - 1, W, W + 1, 2 * W + 3, 771)    # rows of 1 element, odd widths, W±1
HUGE = 100_003                                    # a row far larger than L1/L2


# ── comparing ───────────────────────────────────────────────────────────────

def assert_same(got: np.ndarray, want: np.ndarray, zero_sign: bool = True, what: str = "") -> None:
    """Bit-identical, except that any NaN matches any NaN (and ±0 match unless `zero_sign`)."""
    assert got.shape == want.shape, f"{what}: shapes {got.shape} != {want.shape}"
    if got.dtype.kind not in "fc":
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"{what}: {bad.size} differ, first at {bad[:5]}: got {got[bad[:5]]}, want {want[bad[:5]]}"
        return
    gn, wn = np.isnan(got), np.isnan(want)
    assert np.array_equal(gn, wn), f"{what}: NaN positions differ at {np.flatnonzero(gn != wn)[:5]}"
    ints = np.dtype(f"i{got.itemsize}")
    differ = (got.view(ints) != want.view(ints)) & ~wn
    if not zero_sign:
        differ &= ~((got == 0) & (want == 0))
    bad = np.flatnonzero(differ)
    assert bad.size == 0, f"{what}: {bad.size} differ, first at {bad[:5]}: got {got[bad[:5]]!r}, want {want[bad[:5]]!r}"


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float, atol: "float | np.ndarray" = 0.0,
                 what: str = "") -> None:
    """Same NaN and infinity positions; finite values within `atol + rtol·|want|` (atol may be per element)."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(invalid="ignore"):
        ok = (g == w) | (np.isnan(g) & np.isnan(w)) | (np.abs(g - w) <= atol + rtol * np.abs(w))
    bad = np.flatnonzero(~ok)
    assert bad.size == 0, (f"{what}: {bad.size} of {g.size} differ, first at {bad[:5]}: got {got[bad[:5]]}, "
                           f"want {want[bad[:5]]}")


# ── data ────────────────────────────────────────────────────────────────────

F32_SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, np.inf, -np.inf, np.nan, 1e-40, -1e-40,
                         1e-45, 1e-30, 3.0e38, -3.0e38, 88.0, -88.0, 100.0, -100.0, 1e5, 20.0, -20.0, 7.0, 1e-8],
                        dtype=np.float32)
F64_SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5, np.inf, -np.inf, np.nan, 5e-324, -1e-310,
                         1e-300, 1e300, -1e300, 700.0, -700.0, 20.0, 1e-8], dtype=np.float64)


def f32_values(n: int, seed: int, scale: float = 3.0, specials: np.ndarray = F32_SPECIALS) -> np.ndarray:
    """Random normals with the f32 special values sprinkled in."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    if n:
        k = min(n, specials.size)
        x[rng.choice(n, k, replace=False)] = specials[:k]
    return x


def f64_values(n: int, seed: int) -> np.ndarray:
    """Random normals with the f64 special values sprinkled in."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 3.0
    if n:
        k = min(n, F64_SPECIALS.size)
        x[rng.choice(n, k, replace=False)] = F64_SPECIALS[:k]
    return x


# ── single references ───────────────────────────────────────────────────────

def run_reference(thunk, nbytes: int, inputs: dict) -> np.ndarray:
    """The arena after running `thunk`'s reference on `nbytes` zeros holding `inputs` (offset → array)."""
    ref.load_all()
    arena = np.zeros(nbytes, np.uint8)
    for off, v in inputs.items():
        arena[off:off + v.nbytes] = v.reshape(-1).view(np.uint8)
    ref.REFERENCES[type(thunk)](arena, thunk)
    return arena


def f32_at(arena: np.ndarray, offset: int, *shape: int) -> np.ndarray:
    """The f32 array of `shape` at byte `offset` of `arena` (a view)."""
    return arena[offset:offset + 4 * math.prod(shape)].view(np.float32).reshape(shape)


def forward_matrix(forward: Callable[[np.ndarray, int], np.ndarray], n_in: int, n_out: int) -> np.ndarray:
    """`[n_in, n_out]`: row i is `forward(e_i, n_out)` for the i-th f32 basis vector (a linear map's matrix)."""
    rows = []
    for i in range(n_in):
        e = np.zeros(n_in, np.float32)
        e[i] = 1.0
        rows.append(forward(e, n_out).astype(np.float64))
    return np.array(rows)


# ── threads ─────────────────────────────────────────────────────────────────

@contextlib.contextmanager
def num_threads(n: int) -> Iterator[int]:
    """Run the body with `rl.set_num_threads(n)`, restoring the previous setting after; yields that setting."""
    saved = rl.get_num_threads()
    rl.set_num_threads(n)
    try:
        yield saved
    finally:
        rl.set_num_threads(saved)


@contextlib.contextmanager
def streaming_forced() -> Iterator[None]:
    """Compile with the movement and indexing streaming thresholds at 0: the non-temporal, prefetching
    paths run on small shapes too."""
    from rlx_llvm.ir_emit import indexing, movement
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(movement, "STREAM_BYTES", 0)
        mp.setattr(indexing, "STREAM_BYTES", 0)
        yield


def run_on_copy(program, before: np.ndarray, threads: "int | None" = None) -> np.ndarray:
    """The arena bytes after running `program` on a copy of `before` (with `threads` threads if given)."""
    arena = rl.Arena(before.size)
    arena.bytes[:] = before
    with num_threads(threads) if threads else contextlib.nullcontext():
        program.run(arena)
    return arena.bytes.copy()


# ── one arena of many cases ─────────────────────────────────────────────────

@dataclass
class Case:
    """One thunk, its outputs and how to compare them: `compare(got, want)` if given, else bit-exact
    (`assert_same`) when `exact`, both tolerances are 0 or the dtype is integral, else `assert_close`."""

    name: str
    thunk: object
    outputs: list[Output]
    rtol: float = 0.0
    atol: "float | np.ndarray" = 0.0
    exact: bool = False
    zero_sign: bool = True
    compare: "Callable[[np.ndarray, np.ndarray], None] | None" = None
    expect: "tuple[int, np.ndarray] | None" = None   # (offset, output written by hand from a spec example)

    def check(self, got: np.ndarray, want: np.ndarray) -> None:
        """Every output in arena `got` matches the same bytes of arena `want`."""
        for off, dtype, count in self.outputs:
            g, w = (a[off:off + count * dtype.itemsize].view(dtype) for a in (got, want))
            what = f"{self.name} @{off}: {self.thunk!r}"
            if self.compare is not None:
                self.compare(g, w)
            elif self.exact or dtype.kind not in "fc" or not (np.any(self.rtol) or np.any(self.atol)):
                assert_same(g, w, self.zero_sign, what)
            else:
                assert_close(g, w, self.rtol, self.atol, what)


class Suite:
    """Bump allocator of guarded slots, the input bytes written into them, and the cases.

    The arena starts as random bytes (seeded); slots that are not inputs start as `fill` when given
    (e.g. 0xFF, a NaN in every float width, so a missing write shows), else stay random.
    `rtol`/`atol` are the defaults of `add`."""

    def __init__(self, seed: int = 0, *, rtol: float = 0.0, atol: float = 0.0, fill: "int | None" = None) -> None:
        self.seed, self.rtol, self.atol, self.fill = seed, rtol, atol, fill
        self.rng = np.random.default_rng(seed)
        self.top = GUARD
        self.slots: list[tuple[int, int]] = []
        self.inputs: list[tuple[int, np.ndarray]] = []
        self.cases: list[Case] = []

    # layout
    def slot(self, nbytes: int, skew: int = 0) -> int:
        """A fresh slot of `nbytes`, starting `skew` bytes past a 64-byte boundary, guard bytes after."""
        off = self.top + skew
        self.top = (off + max(nbytes, 1) + ALIGN - 1) // ALIGN * ALIGN + GUARD
        self.slots.append((off, nbytes))
        return off

    def put(self, values: np.ndarray, skew: int = 0) -> int:
        """A slot holding `values` (any dtype), written before the run."""
        values = np.ascontiguousarray(values)
        off = self.slot(values.nbytes, skew)
        self.inputs.append((off, values))
        return off

    def out(self, dtype, count: int) -> tuple[int, Output]:
        """A fresh output slot and its `(offset, dtype, count)` record."""
        dtype = np.dtype(dtype)
        off = self.slot(count * dtype.itemsize)
        return off, (off, dtype, count)

    @property
    def nbytes(self) -> int:
        return self.top

    # data
    def normal(self, *shape: int, scale: float = 1.0, shift: float = 0.0, dtype=np.float32) -> np.ndarray:
        """Normals of `shape` (`scale`·N(0, 1) + `shift`)."""
        return (self.rng.standard_normal(shape) * scale + shift).astype(dtype)

    def half(self, kind: HalfKind, *shape: int) -> np.ndarray:
        """Normals stored as `kind` (f32, f16, or bf16 bits)."""
        x = self.normal(*shape)
        if kind is HalfKind.Bf16:
            return f32_to_bf16_bits(x)
        return f32_to_f16_bits(x).view(np.float16) if kind is HalfKind.F16 else x

    # cases
    def add(self, name: str, thunk, outputs: "list[Output] | None" = None, *, dtype=np.uint8, **how) -> Case:
        """Register a case (unique name); `outputs` default to the thunk's declared writes as `dtype`
        (bytes: compared bit-exactly)."""
        assert name not in {c.name for c in self.cases}, name
        if outputs is None:
            dtype = np.dtype(dtype)
            outputs = [(e.offset, dtype, e.nbytes // dtype.itemsize) for e in thunk.writes()]
        how = {"rtol": self.rtol, "atol": self.atol, **how}
        case = Case(name, thunk, outputs, **how)
        self.cases.append(case)
        return case

    def add_each(self, cases: "list[tuple[str, object]]", how: Callable[[object], dict]) -> None:
        """Register every `(name, thunk)`, compared as `how(thunk)` says (the keywords of `add`)."""
        for name, thunk in cases:
            self.add(name, thunk, **how(thunk))

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.cases]

    def subset(self, keep: Callable[[Case], bool]) -> "Suite":
        """The cases `keep` accepts, in the same arena layout (for a second compile of some of them)."""
        sub = Suite(self.seed, rtol=self.rtol, atol=self.atol, fill=self.fill)
        sub.top, sub.slots, sub.inputs = self.top, self.slots, self.inputs
        sub.cases = [c for c in self.cases if keep(c)]
        return sub

    def initial_bytes(self) -> np.ndarray:
        """The arena before the run: random guards, `fill` in the non-input slots, the inputs."""
        arena = np.random.default_rng([self.seed, 1]).integers(0, 256, self.nbytes, dtype=np.uint8)
        if self.fill is not None:
            for off, nbytes in self.slots:
                arena[off:off + nbytes] = self.fill
        for off, values in self.inputs:
            arena[off:off + values.nbytes] = values.reshape(-1).view(np.uint8)
        return arena

    def arena(self) -> rl.Arena:
        """A fresh arena holding `initial_bytes()`."""
        return rl.Arena.from_bytes(self.initial_bytes())

    def schedule(self) -> rl.ThunkSchedule:
        """Every case's thunk, in order, over this arena."""
        return rl.ThunkSchedule([c.thunk for c in self.cases], arena_bytes=self.nbytes)

    def compile(self, compiling: ContextManager = contextlib.nullcontext()):
        """Every case as one program (compiled inside `compiling`, e.g. a patched threshold)."""
        registry.load_all()
        with compiling:
            return rl.compile(self.schedule(), cache=False)

    def run(self, compiling: ContextManager = contextlib.nullcontext()) -> "Outcome":
        """Compile every case into one program; run it and the references on the same bytes."""
        program = self.compile(compiling)
        before = self.initial_bytes()
        want = before.copy()
        ref.run(self.schedule(), want)
        return Outcome(self, before, run_on_copy(program, before), want, program)


def special_rows(s: Suite, rows: int, h: int) -> np.ndarray:
    """Normal rows, then a constant row (variance exactly 0), a row of zeros, and rows holding NaN,
    +inf and −inf (when there are enough rows)."""
    x = s.normal(rows, h, scale=2.0, shift=0.5)
    extra = [np.full(h, 2.0), np.zeros(h), None, None, None]
    for r, fill in enumerate(extra[:max(0, rows - 1)], start=1):
        if fill is not None:
            x[r] = fill
    for r, bad in zip(range(3, rows), (np.nan, np.inf, -np.inf)):
        x[r, h // 2] = bad
    return x.astype(np.float32).reshape(-1)


def padding_mask(s: Suite, batch: int, seq: int, full_masked: bool) -> np.ndarray:
    """1 = keep; each sequence padded at the end; sequence 0 fully masked when `full_masked`."""
    m = np.ones((batch, seq), np.float32)
    for bi in range(batch):
        m[bi, seq - bi * (seq // 3):] = 0.0 if bi else 1.0
    if full_masked:
        m[0] = 0.0
    return m.reshape(-1)


def bert_inputs(s: Suite, batch, seq, hs, nh, inter, full_masked=False) -> dict:
    """The input slots and shape fields of a FusedBertLayer (everything but `out`)."""
    w = lambda k, n: s.put(s.normal(k * n, scale=k ** -0.5))
    small = lambda n, shift=0.0: s.put(s.normal(n, scale=0.1, shift=shift))
    return dict(hidden=s.put(s.normal(batch * seq * hs)), qkv_w=w(hs, 3 * hs), qkv_b=small(3 * hs),
                out_w=w(hs, hs), out_b=small(hs), mask=s.put(padding_mask(s, batch, seq, full_masked)),
                ln1_g=small(hs, 1.0), ln1_b=small(hs), eps1=1e-12, fc1_w=w(hs, inter), fc1_b=small(inter),
                fc2_w=w(inter, hs), fc2_b=small(hs), ln2_g=small(hs, 1.0), ln2_b=small(hs),
                eps2=1e-5, batch=batch, seq=seq, hs=hs, nh=nh, dh=hs // nh, int_dim=inter)


@dataclass
class Outcome:
    """The arena before, after the program, and after the references."""

    suite: Suite
    before: np.ndarray
    got: np.ndarray
    want: np.ndarray
    program: object

    def case(self, name: str) -> Case:
        return next(c for c in self.suite.cases if c.name == name)

    def index(self, name: str) -> int:
        """The position of case `name`'s thunk in the program."""
        return next(i for i, c in enumerate(self.suite.cases) if c.name == name)

    def thunk_ir(self, name: str) -> str:
        """The LLVM IR of case `name`'s thunk."""
        return self.program.llvm_ir(thunk=self.index(name))

    def output(self, name: str, k: int = 0, arena: "np.ndarray | None" = None) -> np.ndarray:
        """Output `k` of case `name` as its dtype, from `arena` (default: what the program wrote)."""
        off, dtype, count = self.case(name).outputs[k]
        return (self.got if arena is None else arena)[off:off + count * dtype.itemsize].view(dtype)

    def check(self, name: str) -> None:
        """Every output of case `name` matches the reference."""
        self.case(name).check(self.got, self.want)

    def check_spec(self, name: str, rtol: float = 0.0) -> None:
        """The compiled output equals the one written by hand from a spec example."""
        off, expect = self.case(name).expect
        got = self.got[off:off + expect.nbytes].view(expect.dtype).reshape(expect.shape)
        if rtol:
            np.testing.assert_allclose(got, expect, rtol=rtol)
        else:
            np.testing.assert_array_equal(got, expect)

    def check_untouched(self) -> None:
        """No byte outside every case's declared outputs changed — in the program's run or the reference's."""
        keep = np.ones(self.before.size, dtype=bool)
        for c in self.suite.cases:
            for ext in c.thunk.writes():
                keep[ext.offset:ext.offset + ext.nbytes] = False
        for who, after in (("the program", self.got), ("the reference", self.want)):
            changed = np.flatnonzero((after != self.before) & keep)
            assert changed.size == 0, f"{who} changed bytes outside the outputs, first at {changed[:8]}"

    def check_thread_independent(self, names: "list[str] | None" = None) -> None:
        """One thread and two give byte-identical arenas (or, given `names`, identical outputs of those cases)."""
        one, two = (run_on_copy(self.program, self.before, n) for n in (1, 2))
        differ = one != two
        if names is not None:
            mask = np.zeros_like(differ)
            for off, dtype, count in (o for name in names for o in self.case(name).outputs):
                mask[off:off + count * dtype.itemsize] = True
            differ &= mask
        diff = np.flatnonzero(differ)
        assert diff.size == 0, f"results depend on the thread count, first byte {diff[:8]}"


def suite_tests(suite: Suite, compiling: Callable[[], ContextManager] = contextlib.nullcontext,
                paths: frozenset = frozenset({"llvm"}), fixture: str = "outcome") -> tuple:
    """The module-scoped fixture named `fixture` (the suite compiled inside `compiling()` once, and run)
    and the four tests every family runs: parity per case, nothing outside the outputs changes, the
    thread count does not change the bytes, the kinds are lowered on `paths`.  Bind the returned names
    at module level (the fixture under the name `fixture`)."""
    @pytest.fixture(scope="module", name=fixture)
    def outcome() -> Outcome:
        return suite.run(compiling())

    @pytest.mark.parametrize("name", suite.names)
    def test_matches_reference(request, name: str) -> None:
        request.getfixturevalue(fixture).check(name)

    def test_nothing_outside_the_outputs_changes(request) -> None:
        request.getfixturevalue(fixture).check_untouched()

    def test_thread_count_does_not_change_results(request) -> None:
        request.getfixturevalue(fixture).check_thread_independent()

    def test_every_kind_is_native(request) -> None:
        assert {r.path for r in request.getfixturevalue(fixture).program.report()} == paths

    return (outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
            test_thread_count_does_not_change_results, test_every_kind_is_native)


def expect_invalid(thunk, nbytes: int, field_name: str, match: str = "") -> rl.ValidationError:
    """Compiling a one-thunk schedule of `nbytes` raises a ValidationError naming `field_name` (and `match`)."""
    registry.load_all()
    with pytest.raises(rl.ValidationError) as info:
        rl.compile(rl.ThunkSchedule([thunk], arena_bytes=nbytes), cache=False)
    assert info.value.field == field_name, str(info.value)
    assert match in str(info.value), str(info.value)
    return info.value


# ── bare element kernels ────────────────────────────────────────────────────
# `jit.build(key, [Kernel(...), ...])`: each `Kernel(name, emit, ins, outs)` becomes
# `void name(ptr in0, …, ptr out0, …, i64 n)` with an explicit `<W x T>` main loop and a scalar tail
# that run the *same* emitter (`emit(b, *values)` → one value or a tuple, one per output).  All kernels
# of one `build` share one module (one O3 + codegen), cached per `key` for the session; the result maps
# names to NumPy callables and keeps the optimized IR and assembly for inspection.

_TYPES = {"f32": (ir.FloatType(), np.float32), "f64": (ir.DoubleType(), np.float64),
          "i64": (ir.IntType(64), np.int64), "i32": (ir.IntType(32), np.int32),
          "bool": (ir.IntType(8), np.uint8)}
PTR = ir.PointerType()
I64 = ir.IntType(64)


@dataclass(frozen=True)
class Kernel:
    """One element-wise kernel: `emit(builder, *inputs)` on scalars and on `<width x T>` vectors."""

    name: str
    emit: Callable
    ins: tuple = ("f32", "f32")
    outs: tuple = ("f32",)
    width: int = 16


class Compiled:
    """The kernels of one module as NumPy callables (`fns[name](*arrays)`), plus IR / asm text."""

    def __init__(self, fns: dict, ir_text: str, asm: str, owner: "JitHarness") -> None:
        self.fns, self.ir, self.asm = fns, ir_text, asm
        self._owner = owner  # keeps the engine (and so the machine code) alive

    def __getitem__(self, name: str) -> Callable:
        return self.fns[name]

    def function_asm(self, name: str) -> str:
        """The assembly of one function (from its label to the next `.size`)."""
        start = self.asm.index(f"\n{name}:")
        end = self.asm.index(".size", start)
        return self.asm[start:end]


def _vec(ty: ir.Type, w: int) -> ir.Type:
    return ty if w == 1 else ir.VectorType(ty, w)


def _emit_body(b: ir.IRBuilder, k: Kernel, args, index, w: int) -> None:
    ins, outs = args[:len(k.ins)], args[len(k.ins):len(k.ins) + len(k.outs)]
    vals = []
    for ptr, name in zip(ins, k.ins):
        ety = _TYPES[name][0]
        p = b.gep(ptr, [index], inbounds=True, source_etype=ety)
        ld = b.load(p, typ=_vec(ety, w))
        ld.align = _size(ety)
        vals.append(ld)
    res = k.emit(b, *vals)
    res = res if isinstance(res, tuple) else (res,)
    assert len(res) == len(outs), f"{k.name}: emitter gave {len(res)} results for {len(outs)} outputs"
    for ptr, name, v in zip(outs, k.outs, res):
        ety = _TYPES[name][0]
        if str(v.type).endswith("i1>") or str(v.type) == "i1":
            v = b.zext(v, _vec(ety, w))
        p = b.gep(ptr, [index], inbounds=True, source_etype=ety)
        st = b.store(v, p)
        st.align = _size(ety)


def _size(ety: ir.Type) -> int:
    return {"float": 4, "double": 8}.get(str(ety)) or ety.width // 8


def _define(module: ir.Module, k: Kernel) -> None:
    fnty = ir.FunctionType(ir.VoidType(), [PTR] * (len(k.ins) + len(k.outs)) + [I64])
    fn = ir.Function(module, fnty, k.name)
    n = fn.args[-1]
    entry, vhead, vbody, shead, sbody, done = (fn.append_basic_block(s) for s in
                                               ("entry", "vhead", "vbody", "shead", "sbody", "done"))
    b = ir.IRBuilder(entry)
    nvec = b.and_(n, I64(~(k.width - 1)))
    b.branch(vhead)
    b.position_at_end(vhead)
    i = b.phi(I64)
    i.add_incoming(I64(0), entry)
    b.cbranch(b.icmp_signed("<", i, nvec), vbody, shead)
    b.position_at_end(vbody)
    _emit_body(b, k, fn.args, i, k.width)
    i.add_incoming(b.add(i, I64(k.width)), b.block)
    b.branch(vhead)
    b.position_at_end(shead)
    j = b.phi(I64)
    j.add_incoming(i, vhead)
    b.cbranch(b.icmp_signed("<", j, n), sbody, done)
    b.position_at_end(sbody)
    _emit_body(b, k, fn.args, j, 1)
    j.add_incoming(b.add(j, I64(1)), b.block)
    b.branch(shead)
    b.position_at_end(done)
    b.ret_void()


class JitHarness:
    """One MCJIT engine for the session; `build` compiles a list of kernels into one module."""

    def __init__(self) -> None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self._cache: dict = {}
        self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self._machine())
        self._opt_tm = self._machine()
        self._lib = False

    @staticmethod
    def _machine():
        target = llvm.Target.from_triple(llvm.get_process_triple())
        return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                            features=llvm.get_host_cpu_features().flatten(),
                                            opt=3, codemodel="jitdefault", jit=True)

    def build(self, key: str, kernels: list[Kernel]) -> Compiled:
        if key in self._cache:
            return self._cache[key]
        module = ir.Module(name=key)
        module.triple = llvm.get_process_triple()
        module.data_layout = str(self._opt_tm.target_data)
        for k in kernels:
            _define(module, k)
        mod = llvm.parse_assembly(str(module))
        mod.verify()
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        # the kernels are explicitly vectorized: skip the loop vectorizer / unroller (compile time ÷3)
        pto.loop_vectorization = False
        pto.slp_vectorization = False
        pto.loop_unrolling = False
        pb = llvm.create_pass_builder(self._opt_tm, pto)
        pb.getModulePassManager().run(mod, pb)
        asm = self._opt_tm.emit_assembly(mod)
        ir_text = str(mod)
        for f in mod.functions:
            if f.is_declaration and not f.name.startswith("llvm."):
                if not self._lib:
                    llvm.load_library_permanently("libm.so.6")
                    self._lib = True
                assert llvm.address_of_symbol(f.name), f"unresolved external {f.name}"
        self._engine.add_module(mod)
        self._engine.finalize_object()
        fns = {k.name: self._wrap(k, self._engine.get_function_address(k.name)) for k in kernels}
        compiled = Compiled(fns, ir_text, asm, self)
        self._cache[key] = compiled
        return compiled

    @staticmethod
    def _wrap(k: Kernel, addr: int) -> Callable:
        assert addr, k.name
        cfn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * (len(k.ins) + len(k.outs))), ctypes.c_int64)(addr)

        def call(*arrays):
            assert len(arrays) == len(k.ins), f"{k.name} takes {len(k.ins)} arrays"
            n = np.broadcast_shapes(*(np.shape(a) for a in arrays)) if arrays else ()
            ins = [np.ascontiguousarray(np.broadcast_to(np.asarray(a, _TYPES[t][1]), n)).reshape(-1)
                   for a, t in zip(arrays, k.ins)]
            count = ins[0].size if ins else 0
            outs = [np.empty(count, _TYPES[t][1]) for t in k.outs]
            cfn(*[a.ctypes.data for a in ins + outs], count)
            outs = [o.reshape(n) for o in outs]
            return outs[0] if len(outs) == 1 else tuple(outs)
        call.kernel = k
        return call
