"""QMatMul and QConv2d against their NumPy references, bit-exact, all cases in one compiled schedule
(tests/harness.py); hand-written spec examples of the requantization (ties to even, saturation, the
float64 product); one bad-input test per check rule.  The ONNX oracle is tests/oracles/test_onnx_qgemm.py."""
from __future__ import annotations

import dataclasses

import llvmlite.binding as llvm
import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import jit
from rlx_llvm import thunks as T
from rlx_llvm.codegen import ModuleBuilder
from rlx_llvm.ir_emit import qgemm
from tests.harness import W, Outcome, Suite, expect_invalid, suite_tests

I8 = np.dtype(np.int8)


def int8s(s: Suite, count: int) -> np.ndarray:
    """Uniform int8 values, the extremes −128 and 127 included."""
    return s.rng.integers(-128, 128, count).astype(np.int8)


def add_qmatmul(s: Suite, m: int, k: int, n: int, zps=(0, 0, 0), mult: float = 0.003, tag: str = "") -> str:
    """A QMatMul case over random int8 data and int32 bias; returns its name."""
    x, w = s.put(int8s(s, m * k)), s.put(int8s(s, k * n))
    bias = s.put(s.rng.integers(-50_000, 50_000, n).astype(np.int32))
    out, o = s.out(I8, m * n)
    name = f"QMatMul-{m}x{k}x{n}-zp{zps}-m{mult}{tag}"
    s.add(name, T.QMatMul(x=x, w=w, bias=bias, out=out, m=m, k=k, n=n, x_zp=zps[0], w_zp=zps[1], out_zp=zps[2],
                          mult=mult), [o])
    return name


def add_qconv(s: Suite, n: int, c_in: int, hw: tuple, c_out: int, k: tuple, st: tuple, p: tuple, d: tuple,
              groups: int, zps=(3, -5, 7), mult: float = 0.004) -> str:
    """A QConv2d case; returns its name."""
    out = [(i + 2 * pp - dd * (kk - 1) - 1) // ss + 1 for i, kk, ss, pp, dd in zip(hw, k, st, p, d)]
    x = s.put(int8s(s, n * c_in * hw[0] * hw[1]))
    w = s.put(int8s(s, c_out * (c_in // groups) * k[0] * k[1]))
    bias = s.put(s.rng.integers(-50_000, 50_000, c_out).astype(np.int32))
    dst, o = s.out(I8, n * c_out * out[0] * out[1])
    name = f"QConv2d-{n}x{c_in}x{hw}-{c_out}-k{k}s{st}p{p}d{d}g{groups}"
    s.add(name, T.QConv2d(x=x, w=w, bias=bias, out=dst, n=n, c_in=c_in, h=hw[0], w_in=hw[1], c_out=c_out,
                          h_out=out[0], w_out=out[1], kh=k[0], kw=k[1], sh=st[0], sw=st[1], ph=p[0], pw=p[1],
                          dh=d[0], dw=d[1], groups=groups, x_zp=zps[0], w_zp=zps[1], out_zp=zps[2], mult=mult), [o])
    return name


def add_spec(s: Suite) -> tuple[str, np.ndarray]:
    """`x = [1, 3, −1, −3, 5, 127, −128, 0, 7]` (one column), `w = 1` (k = 1), `mult = 0.5`, `out_zp = 0`:
    exact halves round away from zero, as RLX's `f32::round` (0.5 → 1, 1.5 → 2, −0.5 → −1, −1.5 → −2,
    2.5 → 3, 63.5 → 64, 3.5 → 4)."""
    x = np.array([1, 3, -1, -3, 5, 127, -128, 0, 7], np.int8)   # a column: m = 9 rows, k = n = 1
    m = x.size
    w, bias = s.put(np.ones(1, np.int8)), s.put(np.array([0], np.int32))
    out, o = s.out(I8, m)
    case = s.add("QMatMul-spec-ties", T.QMatMul(x=s.put(x), w=w, bias=bias, out=out, m=m, k=1, n=1, x_zp=0, w_zp=0,
                                                 out_zp=0, mult=0.5), [o])
    want = np.array([1, 2, -1, -2, 3, 64, -64, 0, 4], np.int8)  # 127·0.5 = 63.5 → 64; −128·0.5 = −64
    case.expect = (out, want)
    return case.name, want


def build() -> Suite:
    s = Suite(11)
    for m in (1, 3, 4, 5, 9):
        for n in (1, W - 1, W, W + 1, 2 * W, 2 * W + 3, 77):
            add_qmatmul(s, m, 37, n, zps=(int(s.rng.integers(-128, 128)), int(s.rng.integers(-128, 128)),
                                          int(s.rng.integers(-128, 128))), mult=float(s.rng.uniform(1e-4, 2e-2)))
    for zps in ((-128, -128, -128), (127, 127, 127), (-128, 127, 0)):
        add_qmatmul(s, 6, 50, 2 * W + 1, zps, mult=0.5)       # ties and saturation at both ends
    add_qmatmul(s, 5, 0, 19, (1, 2, 3), mult=0.01)            # k = 0: the bias alone
    add_qmatmul(s, 7, 13, 11, (0, 0, 0), mult=0.0)            # out = out_zp
    add_qmatmul(s, 7, 13, 11, (0, 0, 5), mult=-0.003)         # a negative multiplier
    add_qmatmul(s, 4, 1, 2, (0, 0, 0), mult=3.0e38)           # f64 product beyond f32 range saturates
    add_qmatmul(s, 97, 300, 70, (-3, 9, -1), mult=0.0005, tag="-threads")
    add_qconv(s, 1, 3, (7, 11), 4, (3, 3), (1, 1), (1, 1), (1, 1), 1)
    add_qconv(s, 2, 4, (9, 10), 6, (3, 2), (2, 1), (1, 0), (1, 2), 2)
    add_qconv(s, 1, 6, (1, 13), 6, (1, 3), (1, 3), (0, 2), (1, 1), 6, zps=(-128, 127, -128))
    add_qconv(s, 1, 8, (6, 7), 5, (1, 1), (1, 1), (0, 0), (1, 1), 1)              # 1×1: no im2col
    add_qconv(s, 2, 5, (4, 4), 3, (5, 5), (1, 1), (2, 2), (1, 1), 1, mult=0.5)    # kernel as large as the padded input
    add_qconv(s, 1, 2, (3, 3), 2, (3, 3), (2, 2), (4, 4), (1, 1), 1)               # padding larger than the kernel
    add_qconv(s, 3, 8, (12, 37), 16, (3, 3), (1, 1), (1, 1), (1, 1), 2, mult=0.0007)   # pairs split across threads
    add_qconv(s, 1, 8, (12, 37), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1, mult=0.0007)   # rows split across threads
    add_qconv(s, 1, 0, (4, 5), 3, (3, 3), (1, 1), (1, 1), (1, 1), 1)                  # no input channels: the bias
    add_spec(s)
    return s


SUITE = build()
(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


def test_requantization_spec_example(outcome: Outcome) -> None:
    outcome.check_spec("QMatMul-spec-ties")


def test_host_instruction_is_used(outcome: Outcome) -> None:
    scheme = qgemm.dot_scheme(W)
    name = scheme.intrinsic(W, qgemm.host_features())
    if not name:
        pytest.skip(f"this host has no {W}-lane {scheme.name} instruction")
    assert name in outcome.program.llvm_ir()


@pytest.mark.parametrize("scheme", [qgemm.PAIRS, qgemm.QUADS], ids=lambda s: s.name)
def test_portable_scheme_matches(monkeypatch, scheme: qgemm.DotScheme) -> None:
    """Each packing scheme through its portable inner product (no x86 intrinsic), bit-exact: for the
    VNNI quads this runs, on any host, the u8 packing (x + 128) and the zero-point row/column terms
    a VNNI host uses around `vpdpbusd`."""
    portable = dataclasses.replace(scheme, intrinsics={})
    monkeypatch.setattr(qgemm, "dot_scheme", lambda lanes: portable)
    s = Suite(12)
    names = [add_qmatmul(s, 5, 39, 2 * W + 3, (-128, 127, 3), mult=0.5),                 # k = 4·9 + 3
             add_qmatmul(s, 9, 38, 3, (7, -128, -2), mult=0.002),
             add_qmatmul(s, 4, 1, 2 * W, (127, 127, 0), mult=0.01),
             add_qmatmul(s, 97, 300, 70, (-3, 9, -1), mult=0.0005, tag="-threads"),
             add_qconv(s, 2, 4, (9, 10), 6, (3, 2), (2, 1), (1, 0), (1, 2), 2, zps=(127, -128, 0)),   # im2col
             add_qconv(s, 1, 8, (6, 7), 5, (1, 1), (1, 1), (0, 0), (1, 1), 1, zps=(-128, 127, 5)),    # direct 1×1
             add_qconv(s, 3, 8, (12, 37), 16, (3, 3), (1, 1), (1, 1), (1, 1), 2, mult=0.0007)]  # pairs on threads
    outcome = s.run()
    ir_text = outcome.program.llvm_ir()
    assert "pmadd" not in ir_text and "vpdpbusd" not in ir_text
    for name in names:
        outcome.check(name)
    outcome.check_thread_independent(names)


# A VNNI host's code, compiled (not run) for its CPU: this one may have no VNNI.
VNNI_HOSTS = {"znver4": (16, "+avx512f,+avx512bw,+avx512vl,+avx512vnni,+avx2"),   # AVX-512 VNNI, zmm
              "alderlake": (8, "+avx2,+avxvnni")}                                  # AVX-VNNI, ymm (VEX)


@pytest.mark.parametrize("cpu", sorted(VNNI_HOSTS))
def test_vnni_host_compiles_to_vpdpbusd(monkeypatch, cpu: str) -> None:
    lanes, features = VNNI_HOSTS[cpu]
    monkeypatch.setattr(qgemm, "host_features", lambda: set(features.split(",")))
    assert qgemm.dot_scheme(lanes) is qgemm.QUADS
    thunks = [qmatmul(m=9, k=70, n=3 * lanes + 5, x_zp=3, w_zp=-7), qconv()]
    mb = ModuleBuilder(rl.ThunkSchedule(thunks, arena_bytes=1 << 13), lanes)
    for i, t in enumerate(thunks):
        mb.thunk_function(i, t)
    asm = compile_for(str(mb.module), cpu)
    dot = {16: "vpdpbusd\t%zmm", 8: "{vex}\tvpdpbusd\t%ymm"}[lanes]
    assert asm.count(dot) >= 2 * qgemm.tile_rows(lanes), asm.count(dot)    # a whole register tile of them
    assert "vpmaddwd" not in asm


def compile_for(ir_text: str, cpu: str) -> str:
    """O3 assembly of `ir_text` for `cpu` (its own features)."""
    jit.initialize()
    mod = llvm.parse_assembly(ir_text)
    mod.verify()
    machine = llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(cpu=cpu, opt=3)
    pb = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
    return machine.emit_assembly(mod)


def test_ties_round_half_away_not_to_even(outcome: Outcome) -> None:
    got = outcome.output("QMatMul-spec-ties")
    assert got[0] == 1 and got[1] == 2 and got[4] == 3, got   # ONNX's ties-to-even would give 0, 2, 2


# ── bad input ────────────────────────────────────────────────────────────────

def qmatmul(**changes) -> T.QMatMul:
    fields = dict(x=0, w=64, bias=128, out=192, m=2, k=3, n=4, x_zp=0, w_zp=0, out_zp=0, mult=0.01)
    return T.QMatMul(**(fields | changes))


def qconv(**changes) -> T.QConv2d:
    fields = dict(x=0, w=1024, bias=2048, out=3072, n=1, c_in=2, h=5, w_in=5, c_out=2, h_out=5, w_out=5, kh=3, kw=3,
                  sh=1, sw=1, ph=1, pw=1, dh=1, dw=1, groups=1, x_zp=0, w_zp=0, out_zp=0, mult=0.01)
    return T.QConv2d(**(fields | changes))


@pytest.mark.parametrize("field", ["x_zp", "w_zp", "out_zp"])
@pytest.mark.parametrize("value", [128, -129])
def test_zero_point_outside_int8_is_refused(field: str, value: int) -> None:
    expect_invalid(qmatmul(**{field: value}), 1 << 12, field, "int8")
    expect_invalid(qconv(**{field: value}), 1 << 13, field, "int8")


@pytest.mark.parametrize("mult", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_multiplier_is_refused(mult: float) -> None:
    expect_invalid(qmatmul(mult=mult), 1 << 12, "mult", "finite")
    expect_invalid(qconv(mult=mult), 1 << 13, "mult", "finite")


def test_conv_geometry_is_checked() -> None:
    expect_invalid(qconv(groups=0), 1 << 13, "groups")
    expect_invalid(qconv(c_out=3, groups=2, c_in=2), 1 << 13, "groups")
    expect_invalid(qconv(kh=0), 1 << 13, "kh")
    expect_invalid(qconv(sw=0), 1 << 13, "sw")
    expect_invalid(qconv(dh=0), 1 << 13, "dh")
    expect_invalid(qconv(h_out=4), 1 << 13, "h_out")
    expect_invalid(qconv(w_out=6), 1 << 13, "w_out")
