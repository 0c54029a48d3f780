"""ElementwiseRegion against the NumPy reference: every step kind, lane kind, broadcast and size."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import rlx_llvm as rl
from rlx_llvm import reference as ref
from rlx_llvm import thunks as T
from rlx_llvm.dtypes import DType, LaneKind
from rlx_llvm.ir_emit.parallel import FORK_SYMBOL, THREADS_SYMBOL, fork_symbol
from rlx_llvm.ops import Activation, BinaryOp, ChainOperand as In, ChainStep as S, CmpOp
from tests.harness import W, Suite, f32_values, suite_tests

Inp, Stp = In.Input, In.Step
SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, np.inf, -np.inf, np.nan, 1e-40, -1e-40,
                     1e-30, 3.0e38, -3.0e38, 88.0, -88.0, 100.0, -100.0, 1e5, 20.0, -20.0, 7.0, 1e-8],
                    dtype=np.float32)
_LANE_NP = {LaneKind.F32: np.float32, LaneKind.F16: np.float16, LaneKind.Bf16: np.uint16,
            LaneKind.F64: np.float64}


def values(n: int, seed: int, scale: float = 3.0) -> np.ndarray:
    """Random normals with this module's special values sprinkled in."""
    return f32_values(n, seed, scale, SPECIALS)


def region(s: Suite, n: int, chain, n_inputs: int, seed: int, *, lanes=None, out_lane=LaneKind.F32,
           scalar_mask: int = 0, modulus=None, data=None) -> T.ElementwiseRegion:
    """One region over fresh input slots of `s` filled with random + special values."""
    lanes = lanes or (LaneKind.F32,) * n_inputs
    modulus = modulus or (0,) * n_inputs
    offs = []
    for i in range(n_inputs):
        count = 1 if scalar_mask >> i & 1 else (modulus[i] or n)
        arr = data[i] if data is not None else values(count, seed * 31 + i)
        offs.append(s.put(_bf16(arr) if lanes[i] is LaneKind.Bf16 else arr.astype(_LANE_NP[lanes[i]])))
    dst = s.slot(n * out_lane.itemsize)
    return T.ElementwiseRegion(dst=dst, len=n, input_offs=tuple(offs), chain=tuple(chain),
                               scalar_input_mask=scalar_mask, input_modulus=tuple(modulus),
                               in_lanes=tuple(lanes), out_lane=out_lane)


def output(t: T.ElementwiseRegion) -> list:
    """The region's output record for `Suite.add`."""
    return [(t.dst, np.dtype(_LANE_NP[t.out_lane]), t.len)]


def _bf16(x: np.ndarray) -> np.ndarray:
    from rlx_llvm.reference.halves import f32_to_bf16_bits
    return f32_to_bf16_bits(x)


N = 4 * W + 3  # main loop iterations plus a tail

EXACT_ACTS = {Activation.Relu, Activation.Neg, Activation.Abs, Activation.Round, Activation.Floor,
              Activation.Ceil, Activation.Sign}


def exact(name: str, t: T.ElementwiseRegion) -> bool:
    """Cases whose every step is exact (or whose bf16 output rounds away any difference)."""
    return (t.out_lane is LaneKind.Bf16
            or name.startswith(("cmp_", "where", "scalar", "modulus", "bias", "in_lane", "cast_"))
            or name.startswith("act_") and t.chain[0].act in EXACT_ACTS
            or name.startswith("bin_") and t.chain[0].op not in (BinaryOp.Pow, BinaryOp.Atan2))


def all_cases() -> Suite:
    """Every region case in one arena: exact cases value-exact (NaN = NaN, ±0 equal), the rest within 4e-6."""
    lay = Suite()
    cases = []
    for k, act in enumerate(Activation):
        x = values(N, 100 + k)
        cases.append((f"act_{act.name}", region(lay, N, [S.Activation(act, Inp(0))], 1, 100 + k, data=[x])))
    for k, op in enumerate(BinaryOp):
        cases.append((f"bin_{op.name}", region(lay, N, [S.Binary(op, Inp(0), Inp(1))], 2, 200 + k)))
    for k, op in enumerate(CmpOp):
        cases.append((f"cmp_{op.name}", region(lay, N, [S.Compare(op, Inp(0), Inp(1))], 2, 300 + k)))
    cases.append(("where", region(lay, N, [S.Where(Inp(0), Inp(1), Inp(2))], 3, 400)))
    for k, dt in enumerate(DType):
        cases.append((f"cast_{dt.name}", region(lay, N, [S.Cast(dt, Inp(0))], 1, 500 + k, data=[
            values(N, 500 + k, scale=1e5)])))
    for k, lane in enumerate(LaneKind):
        cases.append((f"in_lane_{lane.name}", region(lay, N, [S.Binary(BinaryOp.Add, Inp(0), Inp(1))], 2,
                                                    600 + k, lanes=(lane, LaneKind.F32))))
        cases.append((f"out_lane_{lane.name}", region(lay, N, [S.Binary(BinaryOp.Mul, Inp(0), Inp(1))], 2,
                                                     610 + k, out_lane=lane)))
    for n in (0, 1, W - 1, W, W + 1, 1_000_003):
        cases.append((f"size_{n}", region(lay, n, [S.Binary(BinaryOp.Add, Inp(0), Inp(1)),
                                                    S.Activation(Activation.GeluApprox, Stp(0))], 2, 700 + n % 97)))
    cases.append(("scalar", region(lay, N, [S.Binary(BinaryOp.Mul, Inp(0), Inp(1)),
                                            S.Binary(BinaryOp.Add, Stp(0), Inp(2))], 3, 800, scalar_mask=0b110)))
    for m in (1, 2, 3, 7, W, 3 * W, 4 * W + 3):
        n = m * 5
        cases.append((f"modulus_{m}", region(lay, n, [S.Binary(BinaryOp.Sub, Inp(0), Inp(1))], 2, 900 + m,
                                             modulus=(0, m))))
    cases.append(("bias_tiled_bf16", region(lay, 64 * 33, [S.Binary(BinaryOp.Add, Inp(0), Inp(1))], 2, 950,
                                            modulus=(0, 33), lanes=(LaneKind.F32, LaneKind.Bf16))))
    # large enough to split across threads: a scalar, a bf16 tile of 33 and an f16 output
    cases.append(("split_tiled_scalar", region(lay, 64 * 33 * 50, [S.Binary(BinaryOp.Add, Inp(0), Inp(1)),
                                                                      S.Binary(BinaryOp.Mul, Stp(0), Inp(2))],
                                               3, 960, modulus=(0, 33, 0), scalar_mask=0b100,
                                               lanes=(LaneKind.F32, LaneKind.Bf16, LaneKind.F32),
                                               out_lane=LaneKind.F16)))
    # 16 inputs, 32 steps: a long dependent chain touching every input
    chain = [S.Binary(BinaryOp.Add, Inp(0), Inp(1))]
    for k in range(1, 32):
        op = (BinaryOp.Add, BinaryOp.Mul, BinaryOp.Max, BinaryOp.Sub)[k % 4]
        chain.append(S.Binary(op, Stp(k - 1), Inp((k + 1) % 16)))
    cases.append(("wide", region(lay, N, chain, 16, 1000, data=[values(N, 1000 + i, 0.5) for i in range(16)])))
    for name, t in cases:
        how = dict(exact=True, zero_sign=False) if exact(name, t) else dict(rtol=4e-6, atol=4e-6)
        lay.add(name, t, output(t), **how)
    return lay


SUITE = all_cases()

(outcome, test_region_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)




def forks(ir_text: str) -> bool:
    """Whether a thunk's IR splits its loop across threads."""
    return f'@"{fork_symbol()}"(' in ir_text or f"@{fork_symbol()}(" in ir_text


def test_large_regions_split_across_threads(outcome):
    assert forks(outcome.thunk_ir("size_1000003")) and forks(outcome.thunk_ir("split_tiled_scalar"))
    if fork_symbol() == FORK_SYMBOL:   # the pool's runtime is asked how many threads to use now
        assert THREADS_SYMBOL in outcome.thunk_ir("size_1000003")
    assert not forks(outcome.thunk_ir("size_1")) and not forks(outcome.thunk_ir(f"modulus_{W}"))


def test_in_place_region():
    lay = Suite()
    t = region(lay, N, [S.Activation(Activation.Tanh, Inp(0)), S.Binary(BinaryOp.Mul, Stp(0), Inp(1))], 2, 7)
    t = T.ElementwiseRegion(dst=t.input_offs[0], len=t.len, input_offs=t.input_offs, chain=t.chain)
    lay.add("in_place", t, output(t), rtol=2e-6, atol=2e-6)
    lay.run().check("in_place")


def test_empty_chain_and_zero_len_are_noops():
    arena = rl.Arena(256)
    arena.write(0, np.ones(16, np.float32))
    sched = rl.ThunkSchedule([T.ElementwiseRegion(dst=64, len=16, input_offs=(0,), chain=()),
                              T.ElementwiseRegion(dst=64, len=0, input_offs=(0,),
                                                  chain=(S.Activation(Activation.Exp, Inp(0)),))],
                             arena_bytes=256)
    rl.compile(sched, cache=False).run(arena)
    assert not arena.view(64, "f32", 16).any()


ACTS, BINS, CMPS, DTYPES, LANES = list(Activation), list(BinaryOp)[:7], list(CmpOp), list(DType), list(LaneKind)


@st.composite
def random_regions(draw):
    """A random well-formed region: operand graph, lanes, scalar and tiled inputs, data."""
    n_in = draw(st.integers(1, 5))
    n_steps = draw(st.integers(1, 8))
    chain = []
    for s in range(n_steps):
        def operand():
            if s and draw(st.booleans()):
                return Stp(draw(st.integers(0, s - 1)))
            return Inp(draw(st.integers(0, n_in - 1)))
        kind = draw(st.integers(0, 4))
        if kind == 0:
            chain.append(S.Activation(draw(st.sampled_from(ACTS)), operand()))
        elif kind == 1:
            chain.append(S.Binary(draw(st.sampled_from(BINS)), operand(), operand()))
        elif kind == 2:
            chain.append(S.Compare(draw(st.sampled_from(CMPS)), operand(), operand()))
        elif kind == 3:
            chain.append(S.Where(operand(), operand(), operand()))
        else:
            chain.append(S.Cast(draw(st.sampled_from(DTYPES)), operand()))
    m = draw(st.sampled_from([1, 2, 3, W, W + 1]))
    n = m * draw(st.integers(1, 9))
    modulus = tuple(m if draw(st.booleans()) and draw(st.booleans()) else 0 for _ in range(n_in))
    scalar = sum(1 << i for i in range(n_in) if not modulus[i] and draw(st.integers(0, 4)) == 0)
    lanes = tuple(draw(st.sampled_from(LANES)) for _ in range(n_in))
    out_lane = draw(st.sampled_from(LANES))
    seed = draw(st.integers(0, 2**16))
    lay = Suite()
    data = [values(1 if scalar >> i & 1 else (modulus[i] or n), seed + i, scale=2.0) for i in range(n_in)]
    t = region(lay, n, chain, n_in, seed, lanes=lanes, out_lane=out_lane, scalar_mask=scalar,
               modulus=modulus, data=data)
    lay.add("r", t, output(t))
    return t, lay


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_regions())
def test_random_regions_match_reference(case):
    """Random chains over every operand kind, lane, scalar and tiled input match the oracle."""
    t, lay = case
    ran = lay.run()
    got = ran.output("r").astype(np.float64)
    want = ran.output("r", arena=ran.want).astype(np.float64)
    if t.out_lane is LaneKind.Bf16:
        from rlx_llvm.reference.halves import bf16_bits_to_f32
        got, want = bf16_bits_to_f32(got.astype(np.uint16)), bf16_bits_to_f32(want.astype(np.uint16))
    ok = np.isclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True) & (np.isnan(got) == np.isnan(want))
    # One ulp of a transcendental can flip a later Compare/Where/Round/Cast: allow a few such lanes.
    assert ok.mean() >= 0.95, (t, got[~ok][:5], want[~ok][:5])


def test_gelu_region_hot_loop_is_vectorized():
    lay = Suite()
    t = region(lay, 1 << 16, [S.Binary(BinaryOp.Add, Inp(0), Inp(1)), S.Activation(Activation.Gelu, Stp(0))],
                  2, 3, modulus=(0, 4096))
    prog = rl.compile(rl.ThunkSchedule([t], arena_bytes=lay.nbytes), cache=False)
    asm = prog.asm(thunk=0)
    body = asm.split("%i.vec.body")[1] if "%i.vec.body" in asm else asm
    assert "zmm" in asm or "ymm" in asm
    assert "call" not in body.split(".Lfunc_end")[0], "a call inside the region's hot loop"


@pytest.mark.parametrize("chain, kw, field", [
    ([S.Activation(Activation.Exp, Inp(3))], {}, "chain"),
    ([S.Activation(Activation.Exp, Stp(0))], {}, "chain"),
    ([S.Binary(BinaryOp.Add, Inp(0), Inp(0))], {"input_modulus": (3,)}, "input_modulus"),
    ([S.Binary(BinaryOp.Add, Inp(0), Inp(0))], {"scalar_input_mask": 0b10}, "scalar_input_mask"),
    ([S.Binary(BinaryOp.Add, Inp(0), Inp(0))] * 33, {}, "chain"),
])
def test_bad_regions_are_rejected(chain, kw, field):
    t = T.ElementwiseRegion(dst=64, len=16, input_offs=(0,), chain=tuple(chain), **kw)
    with pytest.raises(rl.ValidationError, match=field) as e:
        rl.compile(rl.ThunkSchedule([t], arena_bytes=128), cache=False)
    assert "thunk 0" in str(e.value) and "ElementwiseRegion" in str(e.value)


def test_too_many_inputs_rejected():
    t = T.ElementwiseRegion(dst=0, len=1, input_offs=tuple(range(4, 72, 4)),
                            chain=(S.Activation(Activation.Neg, Inp(0)),))
    with pytest.raises(rl.ValidationError, match="input"):
        rl.compile(rl.ThunkSchedule([t], arena_bytes=128), cache=False)


def test_int_cast_has_no_negative_zero():
    """`-0.5 as i8 as f32` is +0 (integers have no −0): 1 / that is +inf, in the IR and the oracle."""
    arena = rl.Arena(256)
    arena.write(0, np.float32([-0.5, -0.0, 0.7, -1.5]))
    arena.write(64, np.float32([1.0]))
    t = T.ElementwiseRegion(dst=128, len=4, input_offs=(0, 64), scalar_input_mask=0b10,
                            chain=(S.Cast(DType.I8, Inp(0)), S.Binary(BinaryOp.Div, Inp(1), Stp(0))))
    sched = rl.ThunkSchedule([t], arena_bytes=256)
    expected = rl.Arena.from_bytes(arena.bytes)
    ref.run(sched, expected)
    rl.compile(sched, cache=False).run(arena)
    want = np.float32([np.inf, np.inf, np.inf, -1.0])
    np.testing.assert_array_equal(arena.read(128, "f32", 4), want)
    np.testing.assert_array_equal(expected.read(128, "f32", 4), want)
