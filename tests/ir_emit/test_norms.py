"""Normalization thunks against their float64 NumPy references, all cases in one compiled schedule.

The arena is filled with a sentinel byte pattern, the inputs are written into their slots, and
the program and the references run on copies of the same bytes: every declared output must match
within its tolerance and no byte outside the declared outputs may change.  `Suite` — the harness
— is shared with test_reductions.py and test_losses.py.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import reference as ref
from rlx_llvm import thunks as T
from rlx_llvm.ir_emit import parallel
from rlx_llvm.jit import host

W = host().lanes(32)
WIDTHS = (1, W - 1, W, W + 1, 2 * W + 3, 771)   # rows of 1 element, odd widths, W±1
HUGE = 100_003                                    # a row far larger than L1/L2
SENTINEL = 0xA7


@dataclass
class Case:
    """One thunk, its outputs `(offset, dtype, count)` and how to compare them."""

    name: str
    thunk: object
    outputs: list
    rtol: float = 2e-5
    atol: "float | np.ndarray" = 2e-5
    exact: bool = False


@dataclass
class Suite:
    """Bump allocator of 64-byte slots, the input bytes written into them, and the cases."""

    seed: int
    top: int = 0
    inputs: list = field(default_factory=list)
    cases: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def slot(self, nbytes: int) -> int:
        """A fresh 64-byte-aligned slot."""
        off = self.top
        self.top += (max(nbytes, 1) + 63) // 64 * 64
        return off

    def put(self, values: np.ndarray) -> int:
        """A slot holding `values` (any dtype)."""
        values = np.ascontiguousarray(values)
        off = self.slot(values.nbytes)
        self.inputs.append((off, values))
        return off

    def normal(self, n: int, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
        """n f32 normals."""
        return (self.rng.standard_normal(n) * scale + shift).astype(np.float32)

    def out(self, dtype, count: int) -> tuple[int, tuple]:
        """A fresh output slot and its `(offset, dtype, count)` record."""
        off = self.slot(count * np.dtype(dtype).itemsize)
        return off, (off, np.dtype(dtype), count)

    def add(self, name: str, thunk, outputs: list, **tol) -> None:
        """Register a case (names must be unique)."""
        assert name not in {c.name for c in self.cases}, name
        self.cases.append(Case(name, thunk, outputs, **tol))

    def names(self) -> list[str]:
        return [c.name for c in self.cases]

    def run(self, families: tuple[str, ...]) -> "Outcome":
        """Compile every case into one schedule, run it and the references on the same bytes."""
        for fam in families:
            importlib.import_module(f"rlx_llvm.ir_emit.{fam}")
            importlib.import_module(f"rlx_llvm.reference.{fam}")
        sched = rl.ThunkSchedule([c.thunk for c in self.cases], arena_bytes=self.top)
        prog = rl.compile(sched, cache=False)
        arena = rl.Arena(self.top)
        arena.bytes[:] = SENTINEL
        for off, values in self.inputs:
            arena.bytes[off:off + values.nbytes] = values.reshape(-1).view(np.uint8)
        before = arena.bytes.copy()
        expected = before.copy()
        prog.run(arena)
        for c in self.cases:
            ref.REFERENCES[type(c.thunk).__name__](expected, c.thunk)
        return Outcome(self, before, arena.bytes.copy(), expected, prog)


def run_with_threads(prog, before: np.ndarray, threads: int) -> np.ndarray:
    """The arena bytes after running `prog` on a copy of `before` with `threads` rlx_llvm threads."""
    saved = parallel.get_threads()
    parallel.set_threads(threads)
    try:
        arena = rl.Arena(before.size)
        arena.bytes[:] = before
        prog.run(arena)
        return arena.bytes.copy()
    finally:
        parallel.set_threads(saved)


@dataclass
class Outcome:
    """The arena before, after the program, and after the references."""

    suite: Suite
    before: np.ndarray
    got: np.ndarray
    want: np.ndarray
    prog: object

    def case(self, name: str) -> Case:
        return next(c for c in self.suite.cases if c.name == name)

    def check(self, name: str) -> None:
        """Every output of case `name` matches the reference (NaN matches NaN, inf matches inf)."""
        c = self.case(name)
        for off, dtype, count in c.outputs:
            got = self.got[off:off + count * dtype.itemsize].view(dtype)
            want = self.want[off:off + count * dtype.itemsize].view(dtype)
            if c.exact or dtype.kind in "iu":
                np.testing.assert_array_equal(got, want, err_msg=f"{name}: {c.thunk!r}")
                continue
            g, w = got.astype(np.float64), want.astype(np.float64)
            with np.errstate(invalid="ignore"):
                close = (np.abs(g - w) <= c.atol + c.rtol * np.abs(w)) | (g == w) | (np.isnan(g) & np.isnan(w))
            bad = np.flatnonzero(~close)
            assert bad.size == 0, (f"{name}: {bad.size} of {count} differ, first at {bad[:5]}: got {got[bad[:5]]}, "
                                   f"want {want[bad[:5]]} ({c.thunk!r})")

    def check_thread_independent(self) -> None:
        """One thread and all threads give the same bytes (rows split, reductions never do)."""
        one = run_with_threads(self.prog, self.before, 1)
        many = run_with_threads(self.prog, self.before, parallel.MAX_THREADS)
        diff = np.flatnonzero(one != many)
        assert diff.size == 0, f"results depend on the thread count, first byte {diff[:8]}"

    def check_untouched(self) -> None:
        """No byte outside every case's declared outputs changed."""
        keep = np.ones(self.before.size, dtype=bool)
        for c in self.suite.cases:
            for ext in c.thunk.writes():
                keep[ext.offset:ext.offset + ext.nbytes] = False
        changed = np.flatnonzero((self.got != self.before) & keep)
        assert changed.size == 0, f"bytes outside the outputs changed, first at {changed[:8]}"


def expect_invalid(thunk, nbytes: int, field_name: str, families: tuple[str, ...]) -> None:
    """Compiling a one-thunk schedule raises a ValidationError naming `field_name`."""
    for fam in families:
        importlib.import_module(f"rlx_llvm.ir_emit.{fam}")
    with pytest.raises(rl.ValidationError) as info:
        rl.compile(rl.ThunkSchedule([thunk], arena_bytes=nbytes), cache=False)
    assert info.value.field == field_name, str(info.value)


# ── the cases ───────────────────────────────────────────────────────────────

def special_rows(s: Suite, rows: int, h: int) -> np.ndarray:
    """Normal rows, then a constant row (variance exactly 0), a row of zeros, and rows holding NaN,
    +inf and −inf (when there are enough rows)."""
    x = s.normal(rows * h, 2.0, 0.5).reshape(rows, h)
    extra = [np.full(h, 2.0), np.zeros(h), None, None, None]
    for r, fill in enumerate(extra[:max(0, rows - 1)], start=1):
        if fill is not None:
            x[r] = fill
    for r, bad in zip(range(3, rows), (np.nan, np.inf, -np.inf)):
        x[r, h // 2] = bad
    return x.astype(np.float32).reshape(-1)


def build() -> Suite:
    s = Suite(seed=4)
    for h in (*WIDTHS, HUGE):
        rows = 1 if h == HUGE else 7
        for kind in ("LayerNorm", "RmsNorm"):
            x = s.put(special_rows(s, rows, h))
            g, b = s.put(s.normal(h)), s.put(s.normal(h))
            dst, o = s.out(np.float32, rows * h)
            s.add(f"{kind}-{rows}x{h}", getattr(T, kind)(src=x, g=g, b=b, dst=dst, rows=rows, h=h, eps=1e-5), [o])
        for kind in ("FusedResidualLN", "FusedResidualRmsNorm"):
            for has_bias in (True, False):
                x, res = s.put(special_rows(s, rows, h)), s.put(s.normal(rows * h))
                bias, g, b = s.put(s.normal(h)), s.put(s.normal(h)), s.put(s.normal(h))
                dst, o = s.out(np.float32, rows * h)
                s.add(f"{kind}-{rows}x{h}-bias{int(has_bias)}",
                      getattr(T, kind)(x=x, res=res, bias=bias, g=g, b=b, out=dst, rows=rows, h=h, eps=1e-5,
                                       has_bias=has_bias), [o])
    # big enough to split across threads (≥ 256 KiB moved), odd row counts so chunks are uneven
    for kind in ("LayerNorm", "RmsNorm", "FusedResidualLN"):
        rows, h = 97, 771
        if kind == "FusedResidualLN":
            x, res, bias = s.put(s.normal(rows * h)), s.put(s.normal(rows * h)), s.put(s.normal(h))
            dst, o = s.out(np.float32, rows * h)
            t = T.FusedResidualLN(x=x, res=res, bias=bias, g=s.put(s.normal(h)), b=s.put(s.normal(h)), out=dst,
                                  rows=rows, h=h, eps=1e-5, has_bias=True)
        else:
            dst, o = s.out(np.float32, rows * h)
            t = getattr(T, kind)(src=s.put(s.normal(rows * h)), g=s.put(s.normal(h)), b=s.put(s.normal(h)), dst=dst,
                                 rows=rows, h=h, eps=1e-5)
        s.add(f"{kind}-threads-{rows}x{h}", t, [o])
    # in place (dst aliases src exactly)
    for kind in ("LayerNorm", "RmsNorm"):
        x = s.put(s.normal(5 * 40))
        s.add(f"{kind}-inplace", getattr(T, kind)(src=x, g=s.put(s.normal(40)), b=s.put(s.normal(40)), dst=x,
                                                  rows=5, h=40, eps=1e-6), [(x, np.dtype(np.float32), 200)])
    add_modulated(s)
    add_spatial(s)
    add_batch_norm(s)
    return s


def add_modulated(s: Suite) -> None:
    """AdaLayerNorm / GatedResidual with the three kinds of broadcast maps."""
    for rows, h in ((6, W + 1), (4, 64), (1, 1), (9, 33)):
        maps = {"batch": (2 * h, tuple((r * 2 // rows) * h for r in range(rows))),   # [B, 1, D], B = 2
                "rows": (rows * h, tuple(r * h for r in range(rows))),              # no broadcast
                "table": (3 * h, tuple(int(v) for v in s.rng.integers(0, 2 * h + 1, rows)))}  # arbitrary
        for mname, (mod_len, offs) in maps.items():
            for ln in (True, False):
                x = s.put(special_rows(s, rows, h))
                scale, shift = s.put(s.normal(mod_len, 0.5)), s.put(s.normal(mod_len))
                dst, o = s.out(np.float32, rows * h)
                s.add(f"AdaLayerNorm-{rows}x{h}-{mname}-ln{int(ln)}",
                      T.AdaLayerNorm(src=x, scale=scale, shift=shift, dst=dst, rows=rows, h=h, eps=1e-6,
                                     layer_norm=ln, mod_len=mod_len, mod_off=offs), [o])
            x, y, gate = s.put(s.normal(rows * h)), s.put(s.normal(rows * h)), s.put(s.normal(mod_len))
            dst, o = s.out(np.float32, rows * h)
            s.add(f"GatedResidual-{rows}x{h}-{mname}",
                  T.GatedResidual(x=x, y=y, gate=gate, dst=dst, rows=rows, h=h, gate_len=mod_len, gate_off=offs), [o])


def add_spatial(s: Suite) -> None:
    """GroupNorm and LayerNorm2d on NCHW shapes: H·W of 1, below W, W-multiples and odd."""
    for n, c, hh, ww, groups in ((2, 6, 3, 5, 3), (1, 64, 1, 1, 4), (2, 32, 8, 8, 8), (1, 3, 17, 1, 1),
                                 (3, 4, 1, W + 1, 2), (1, 16, 40, 40, 16), (3, 64, 9, 21, 8)):
        count = n * c * hh * ww
        x = s.put(s.normal(count, 1.5, 1.0))
        dst, o = s.out(np.float32, count)
        s.add(f"GroupNorm-{n}x{c}x{hh}x{ww}-g{groups}",
              T.GroupNorm(src=x, g=s.put(s.normal(c)), b=s.put(s.normal(c)), dst=dst, n=n, c=c, h=hh, w=ww,
                          num_groups=groups, eps=1e-5), [o])
        x = s.put(s.normal(count, 1.5, 1.0))
        dst, o = s.out(np.float32, count)
        s.add(f"LayerNorm2d-{n}x{c}x{hh}x{ww}",
              T.LayerNorm2d(src=x, g=s.put(s.normal(c)), b=s.put(s.normal(c)), dst=dst, n=n, c=c, h=hh, w=ww,
                            eps=1e-5), [o])


def add_batch_norm(s: Suite) -> None:
    """BatchNormInference with channel counts below, at and around W, and a long row."""
    for count, ch in ((7, 3), (5, W), (9, W + 1), (3, 768), (1000, 5), (2, 1001), (1, 1), (20001, 3), (97, 1001)):
        x = s.put(s.normal(count * ch, 2.0))
        var = s.put((np.abs(s.normal(ch)) + 0.1).astype(np.float32))
        dst, o = s.out(np.float32, count * ch)
        s.add(f"BatchNormInference-{count}x{ch}",
              T.BatchNormInference(src=x, g=s.put(s.normal(ch)), b=s.put(s.normal(ch)), mean=s.put(s.normal(ch)),
                                   var=var, dst=dst, count=count, channels=ch, eps=1e-5), [o], atol=1e-4)



def suite_tests(suite: "Suite", families: tuple[str, ...]) -> tuple:
    """The fixture and the four tests every family suite runs (compiled once per module):
    parity per case, nothing outside the outputs changes, thread count does not change results,
    every kind lowered natively.  Bind the returned names at module level for pytest to collect."""
    @pytest.fixture(scope="module")
    def outcome() -> Outcome:
        return suite.run(families)

    @pytest.mark.parametrize("name", suite.names())
    def test_matches_reference(outcome: Outcome, name: str) -> None:
        outcome.check(name)

    def test_nothing_outside_the_outputs_changes(outcome: Outcome) -> None:
        outcome.check_untouched()

    def test_thread_count_does_not_change_results(outcome: Outcome) -> None:
        outcome.check_thread_independent()

    def test_every_kind_is_native(outcome: Outcome) -> None:
        assert {r.path for r in outcome.prog.report()} == {"llvm"}

    return (outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
            test_thread_count_does_not_change_results, test_every_kind_is_native)

SUITE = build()
FAMILIES = ("norms",)


(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE, FAMILIES)


def test_special_rows_behave_like_rlx(outcome: Outcome) -> None:
    """Constant rows normalize to exactly `b`; a NaN or ±inf anywhere makes the whole row NaN."""
    c = outcome.case(f"LayerNorm-7x{W + 1}")
    h = W + 1
    off, dtype, count = c.outputs[0]
    y = outcome.got[off:off + count * 4].view(np.float32).reshape(7, h)
    bias = outcome.got[c.thunk.b:c.thunk.b + 4 * h].view(np.float32)
    np.testing.assert_array_equal(y[1], bias)   # constant 2.0 row: var = 0 exactly
    np.testing.assert_array_equal(y[2], bias)   # zeros
    assert np.isnan(y[3:6]).all()


# ── bad inputs: one per check rule ──────────────────────────────────────────

def test_group_norm_groups_must_divide_channels() -> None:
    expect_invalid(T.GroupNorm(src=0, g=256, b=512, dst=1024, n=1, c=6, h=2, w=2, num_groups=4, eps=1e-5),
                   4096, "num_groups", FAMILIES)


def test_group_norm_needs_a_group() -> None:
    expect_invalid(T.GroupNorm(src=0, g=256, b=512, dst=1024, n=1, c=6, h=2, w=2, num_groups=0, eps=1e-5),
                   4096, "num_groups", FAMILIES)


def test_ada_layer_norm_offsets_per_row() -> None:
    expect_invalid(T.AdaLayerNorm(src=0, scale=1024, shift=2048, dst=3072, rows=4, h=8, eps=1e-6, layer_norm=True,
                                  mod_len=16, mod_off=(0, 8, 0)), 4096, "mod_off", FAMILIES)


def test_ada_layer_norm_offsets_inside_mod_len() -> None:
    expect_invalid(T.AdaLayerNorm(src=0, scale=1024, shift=2048, dst=3072, rows=2, h=8, eps=1e-6, layer_norm=False,
                                  mod_len=16, mod_off=(0, 9)), 4096, "mod_off", FAMILIES)


def test_gated_residual_offsets_inside_gate_len() -> None:
    expect_invalid(T.GatedResidual(x=0, y=1024, gate=2048, dst=3072, rows=2, h=8, gate_len=8, gate_off=(0, 8)),
                   4096, "gate_off", FAMILIES)


def test_gated_residual_offsets_per_row() -> None:
    expect_invalid(T.GatedResidual(x=0, y=1024, gate=2048, dst=3072, rows=2, h=8, gate_len=16, gate_off=(0,)),
                   4096, "gate_off", FAMILIES)
