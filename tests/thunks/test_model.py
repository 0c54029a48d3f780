"""The thunk model: names and fields against the seed, JSON round trips of all 196 kinds, extents,
field checks."""
from __future__ import annotations

import dataclasses
import json
import re
import typing
from pathlib import Path
from typing import Annotated, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlx_llvm import thunks as T
from rlx_llvm.dtypes import DType, HalfKind, LaneKind
from rlx_llvm.errors import ValidationError
from rlx_llvm.ops import (Activation, AttentionBwdWrt, BinaryOp, ChainOperand as In, ChainStep as S, MaskKind,
                          QuantScheme, ReduceOp, ScaledFormat, ScaleLayout, ScaleMode, SteKind)
from rlx_llvm.schedule import ThunkSchedule
from rlx_llvm.thunks.base import FixedLen, RustInt
from tests.data.make_seed_thunks import parse_seed
from tests.strategies import hints, thunk_strategy

SEED_THUNKS = Path(__file__).resolve().parents[1] / "data" / "seed_thunks.json"  # tests/data/make_seed_thunks.py
MAX = T.USIZE_MAX


# ── the seed ────────────────────────────────────────────────────────────────

@pytest.fixture(scope="module")
def seed() -> list[tuple[str, list[tuple[str, str]]]]:
    """[(variant, [(field, rust type)])] of the seed's `pub enum Thunk` in declaration order."""
    kinds = json.loads(SEED_THUNKS.read_text())["kinds"]
    return [(name, [(f, t) for f, t in fields]) for name, fields in kinds.items()]


def test_seed_parser_keeps_order_and_types_and_drops_comments():
    text = """pub enum Other { A }
    pub enum Thunk {
        /// doc { with braces }
        Nop,
        Sgemm {
            a: usize, // the lhs
            w: Arc<Vec<u8>>,
        },
        Copy {
            m: [u32; 16],
        },
    }"""
    assert parse_seed(text) == [("Nop", []), ("Sgemm", [("a", "usize"), ("w", "Arc<Vec<u8>>")]),
                                ("Copy", [("m", "[u32; 16]")])]


def _unwrap_arc(t: str) -> str:
    while "Arc<" in t:
        i = t.index("Arc<")
        depth, j = 0, i + 3
        for j in range(i + 3, len(t)):
            depth += {"<": 1, ">": -1}.get(t[j], 0)
            if depth == 0:
                break
        t = t[:i] + t[i + 4:j] + t[j + 1:]
    return t


def rust_spelling(t: str) -> str:
    """A seed type in the spelling `python_spelling` produces (Arc and module paths dropped)."""
    t = t.replace("Arc<Vec<u8>>", "bytes").replace("Arc<dyn CpuKernel>", "str")
    t = re.sub(r"rlx_ir::(op::|quant::)?", "", _unwrap_arc(t))
    return t.replace("Shape", "Vec<usize>").replace(" ", "")


def python_spelling(hint: Any) -> str:
    """A field's type hint spelled as the Rust type it stands for."""
    if typing.get_origin(hint) is Annotated:
        base, meta = hint.__origin__, hint.__metadata__
        for m in meta:
            if isinstance(m, RustInt):
                return m.name
            if m == "f32":
                return "f32"
            if isinstance(m, FixedLen):
                return f"[{python_spelling(typing.get_args(base)[0])};{m.n}]"
        return python_spelling(base)
    args = typing.get_args(hint)
    if type(None) in args:
        return f"Option<{python_spelling(next(a for a in args if a is not type(None)))}>"
    if typing.get_origin(hint) is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"Vec<{python_spelling(args[0])}>"
        return "(" + ",".join(python_spelling(a) for a in args) + ")"
    return hint.__name__


def test_kind_names_in_seed_order(seed):
    assert list(T.ALL_THUNKS) == [name for name, _ in seed]
    assert len(T.ALL_THUNKS) == 196


def test_field_names_and_order(seed):
    for name, fields in seed:
        assert [f.name for f in dataclasses.fields(T.ALL_THUNKS[name])] == [f for f, _ in fields], name


def test_field_types_follow_the_rust_types(seed):
    for name, fields in seed:
        got = {f: python_spelling(h) for f, h in hints(T.ALL_THUNKS[name]).items()}
        assert got == {f: rust_spelling(t) for f, t in fields}, name


def test_every_class_is_a_frozen_kw_only_dataclass_with_a_docstring():
    for name, cls in T.ALL_THUNKS.items():
        assert cls.__name__ == name and issubclass(cls, T.Thunk) and getattr(T, name) is cls
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
        assert all(f.kw_only for f in dataclasses.fields(cls)), name
        assert cls.__doc__ and "\n" not in cls.__doc__.strip() and len(cls.__doc__) < 120, name
        assert cls.family and cls.__module__ == f"rlx_llvm.thunks.{cls.family}", name
    t = T.Copy(src=0, dst=8, len=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.len = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        T.Copy(0, 8, 2)  # type: ignore[misc]


def test_kind_is_the_class_name_unless_a_field_is_called_kind():
    assert T.Sgemm(a=0, b=0, c=0, m=1, k=1, n=1).kind == "Sgemm" and T.Nop().kind == "Nop"
    act = T.ActivationF64(src=0, dst=8, len=1, kind=Activation.Exp)
    assert act.kind is Activation.Exp and act.kind_name == "ActivationF64" and T.ActivationF64.kind == "ActivationF64"
    pool = T.Pool2D(src=0, dst=0, n=1, c=1, h=1, w=1, h_out=1, w_out=1, kh=1, kw=1, sh=1, sw=1, ph=0, pw=0,
                    kind=ReduceOp.Max)
    assert pool.kind is ReduceOp.Max and pool.to_jsonable()["Pool2D"]["kind"] == "Max"


def json_round_trip(t: T.Thunk) -> T.Thunk:
    return T.Thunk.from_jsonable(json.loads(json.dumps(t.to_jsonable())))


KINDS = list(T.ALL_THUNKS)
CHUNKS = [KINDS[i:i + 14] for i in range(0, len(KINDS), 14)]  # 14 draws per example keeps Hypothesis fast


def check_extents(t: T.Thunk) -> None:
    """Extents are non-empty, present, and named after one of the thunk's fields."""
    try:
        extents = (*t.reads(), *t.writes())
    except ValidationError as exc:  # a quantization scheme the thunk cannot hold
        assert exc.field == "scheme"
        return
    names = {f.name for f in dataclasses.fields(t)}
    for e in extents:
        assert e.nbytes > 0 and e.offset != MAX and e.field.split("[")[0] in names


@pytest.mark.parametrize("kinds", CHUNKS, ids=lambda kinds: f"{kinds[0]}..{kinds[-1]}")
@settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_json_round_trip_and_extents_of_every_kind(kinds, data):
    for kind in kinds:
        t = data.draw(thunk_strategy(kind), label=kind)
        t.check_fields()
        back = json_round_trip(t)
        assert type(back) is type(t) and back == t
        assert json.dumps(back.to_jsonable()) == json.dumps(t.to_jsonable())  # bit-exact floats, -0.0 too
        assert type(t).from_jsonable(t.to_jsonable()) == t
        check_extents(t)


def test_json_shape_is_serde_externally_tagged():
    assert T.Nop().to_jsonable() == "Nop"
    assert T.Sgemm(a=0, b=64, c=128, m=4, k=4, n=4).to_jsonable() == {
        "Sgemm": {"a": 0, "b": 64, "c": 128, "m": 4, "k": 4, "n": 4}}
    t = T.Attention(q=0, k=0, v=0, mask=MAX, out=0, batch=1, seq=1, kv_seq=1, heads=1, kv_heads=1, head_dim=1,
                    v_head_dim=1, mask_kind=MaskKind.SlidingWindow(128), scale=0.125, softcap=0.0, q_row_stride=1,
                    k_row_stride=1, v_row_stride=1, bhsd=False)
    assert t.to_jsonable()["Attention"]["mask_kind"] == {"SlidingWindow": 128}
    assert t.to_jsonable()["Attention"]["mask"] == 2**64 - 1
    assert T.Thunk.from_jsonable({"Nop": None}) == T.Nop() == T.Thunk.from_jsonable("Nop")


# ── coercion and defaults ───────────────────────────────────────────────────

def test_lists_become_tuples_and_region_defaults_normalize():
    r = T.ElementwiseRegion(dst=0, len=4, input_offs=[16, 32], chain=[S.Binary(BinaryOp.Add, In.Input(0), In.Input(1))],
                            input_modulus=[0, 2])
    assert r.input_offs == (16, 32) and isinstance(r.chain, tuple)
    assert r.input_modulus == (0, 2) + (0,) * 14 and r.scalar_input_mask == 0
    assert r.in_lanes == (LaneKind.F32, LaneKind.F32) and r.out_lane is LaneKind.F32
    c = T.Concat(dst=0, outer=1, inner=1, total_axis=2, inputs=[[0, 1, 1], [4, 1, 1]])
    assert c.inputs == ((0, 1, 1), (4, 1, 1))
    op = T.CustomOp(kernel="k", inputs=[(0, 2, [2])], output=[8, 2, [2]], attrs=b"\x01\x02")
    assert op.inputs == ((0, 2, (2,)),) and op.output == (8, 2, (2,)) and op.attrs == (1, 2)
    assert hash(r) == hash(dataclasses.replace(r))


# ── extents ─────────────────────────────────────────────────────────────────

def ext(*triples: tuple[str, int, int]) -> tuple[T.Extent, ...]:
    return tuple(T.Extent(*t) for t in triples)


def test_gemm_extents():
    t = T.Sgemm(a=0, b=1000, c=5000, m=3, k=5, n=7)
    assert t.reads() == ext(("a", 0, 60), ("b", 1000, 140)) and t.writes() == ext(("c", 5000, 84))
    h = T.SgemmHalf(a=0, b=100, c=200, m=2, k=3, n=4, a_kind=HalfKind.F32, b_kind=HalfKind.Bf16, c_kind=HalfKind.F16)
    assert h.reads() == ext(("a", 0, 24), ("b", 100, 24)) and h.writes() == ext(("c", 200, 16))
    b = T.BatchedSgemm(a=0, b=100, c=200, batch=5, m=2, k=3, n=4, a_bcast=False, b_bcast=True)
    assert b.reads() == ext(("a", 0, 5 * 24), ("b", 100, 48)) and b.writes() == ext(("c", 200, 5 * 32))
    d = T.BatchedDgemmF64(a=0, b=100, c=200, batch=2, m=1, k=1, n=1, a_bcast=True, b_bcast=False)
    assert d.reads() == ext(("a", 0, 8), ("b", 100, 16))


def test_region_extents_use_scalar_bits_moduli_and_lanes():
    r = T.ElementwiseRegion(dst=900, len=12, input_offs=(0, 100, 200), scalar_input_mask=0b010,
                            input_modulus=(0, 0, 4), in_lanes=(LaneKind.Bf16, LaneKind.F32, LaneKind.F64),
                            out_lane=LaneKind.F16, chain=(S.Binary(BinaryOp.Add, In.Input(0), In.Input(1)),))
    assert r.reads() == ext(("input_offs[0]", 0, 24), ("input_offs[1]", 100, 4), ("input_offs[2]", 200, 32))
    assert r.writes() == ext(("dst", 900, 24))
    assert dataclasses.replace(r, chain=()).reads() == () == dataclasses.replace(r, chain=()).writes()


def test_binary_full_paths():
    base = dict(lhs=0, rhs=1000, dst=2000, op=BinaryOp.Sub, out_dims_bcast=(), bcast_lhs_strides=(),
                bcast_rhs_strides=(), elem_bytes=4)
    same = T.BinaryFull(len=6, lhs_len=6, rhs_len=6, **base)
    assert same.reads() == ext(("lhs", 0, 24), ("rhs", 1000, 24)) and same.writes() == ext(("dst", 2000, 24))
    walk = T.BinaryFull(**{**base, "len": 12, "lhs_len": 4, "rhs_len": 3, "out_dims_bcast": (4, 3),
                           "bcast_lhs_strides": (1, 0), "bcast_rhs_strides": (0, 1), "elem_bytes": 8})
    assert walk.reads() == ext(("lhs", 0, 32), ("rhs", 1000, 24)) and walk.writes() == ext(("dst", 2000, 96))
    legacy = T.BinaryFull(**{**base, "len": 10, "lhs_len": 10, "rhs_len": 0})
    assert legacy.reads() == ext(("lhs", 0, 40), ("rhs", 1000, 4))
    c64 = T.BinaryFullC64(lhs=0, rhs=100, dst=200, len=3, lhs_len=3, rhs_len=1, op=BinaryOp.Mul, out_dims_bcast=(),
                          bcast_lhs_strides=(), bcast_rhs_strides=())
    assert c64.reads() == ext(("lhs", 0, 24), ("rhs", 100, 8))


def test_casts_and_in_place_activation():
    assert T.CastF64ToBool(src=0, dst=100, len=5).reads() == ext(("src", 0, 40))
    assert T.CastF64ToBool(src=0, dst=100, len=5).writes() == ext(("dst", 100, 5))
    g = T.CastGeneric(src=0, dst=64, len=3, src_dtype=DType.C128, dst_dtype=DType.I16)
    assert g.reads() == ext(("src", 0, 48)) and g.writes() == ext(("dst", 64, 6))
    a = T.ActivationInPlace(data=32, len=8, act=Activation.Gelu)
    assert a.reads() == a.writes() == ext(("data", 32, 32))


def test_movement_extents():
    c = T.Concat(dst=500, outer=2, inner=3, total_axis=5, inputs=((0, 2, 12), (100, 1, 1), (200, 2, 6)))
    assert c.reads() == ext(("inputs[0]", 0, 48), ("inputs[1]", 100, 4), ("inputs[2]", 200, 24))
    assert c.writes() == ext(("dst", 500, 120))
    kv = T.KvAppend(src=0, dst=1000, outer=3, seq_cap=10, pos=4, inner_bytes=16)
    assert kv.reads() == ext(("src", 0, 48)) and kv.writes() == ext(("dst", 1000 + 64, 2 * 160 + 16))
    n = T.Narrow(src=0, dst=500, outer=3, src_stride=10, dst_stride=4, inner=4, elem_bytes=8)
    assert n.reads() == ext(("src", 0, 8 * 24)) and n.writes() == ext(("dst", 500, 8 * 12))
    g = T.Gather(table=0, table_len=20, idx=100, dst=200, num_idx=3, trailing=5, idx_i64=1, table_bytes=8)
    assert g.reads() == ext(("table", 0, 160), ("idx", 100, 24)) and g.writes() == ext(("dst", 200, 120))


def test_attention_extents_and_absent_masks():
    a = T.Attention(q=0, k=10_000, v=20_000, mask=30_000, out=40_000, batch=2, seq=3, kv_seq=5, heads=4, kv_heads=2,
                    head_dim=8, v_head_dim=6, mask_kind=MaskKind.Custom, scale=0.5, softcap=0.0,
                    q_row_stride=96, k_row_stride=96, v_row_stride=96, bhsd=False)
    assert a.reads() == ext(("q", 0, 4 * (5 * 96 + 32)), ("k", 10_000, 4 * (9 * 96 + 16)),
                            ("v", 20_000, 4 * (9 * 96 + 12)), ("mask", 30_000, 4 * 10))
    assert a.writes() == ext(("out", 40_000, 4 * 2 * 3 * 4 * 6))
    assert [e.field for e in dataclasses.replace(a, mask_kind=MaskKind.Causal).reads()] == ["q", "k", "v"]
    bias = dataclasses.replace(a, mask_kind=MaskKind.Bias, bhsd=True)
    assert bias.reads()[0] == T.Extent("q", 0, 4 * 2 * 4 * 3 * 8) and bias.reads()[-1].nbytes == 4 * 2 * 4 * 3 * 5
    bwd = T.AttentionBackward(q=0, k=0, v=0, dy=0, mask=0, out=64, batch=1, seq=2, kv_seq=3, heads=1, head_dim=4,
                              mask_kind=MaskKind.Custom, wrt=AttentionBwdWrt.Key, bhsd=False)
    assert "mask" not in {e.field for e in bwd.reads()} and bwd.writes() == ext(("out", 64, 48))
    blk = T.FusedAttnBlock(hidden=0, qkv_w=0, out_w=0, mask=MAX, mask_kind=MaskKind.None_, out=0, qkv_b=8, out_b=0,
                           cos=0, sin=0, cos_len=0, batch=1, seq=2, hs=4, nh=1, dh=4, in_dim=4, out_dim=4,
                           has_bias=True, has_rope=False, interleaved=False)
    assert {e.field for e in blk.reads()} == {"hidden", "qkv_w", "out_w", "qkv_b"}


def test_control_flow_reports_outer_arena_only():
    body = ThunkSchedule([T.Copy(src=0, dst=4, len=1)], arena_bytes=8)
    scan = T.Scan(body=body, body_init=bytes(8), body_input_off=0, body_output_off=4, outer_init_off=100,
                  outer_final_off=200, length=10, carry_bytes=4, save_trajectory=True, xs_inputs=((0, 300, 8),),
                  bcast_inputs=((4, 400, 12),), num_checkpoints=3)
    assert scan.reads() == ext(("outer_init_off", 100, 4), ("xs_inputs[0]", 300, 80), ("bcast_inputs[0]", 400, 12))
    assert scan.writes() == ext(("outer_final_off", 200, 12))
    assert dataclasses.replace(scan, save_trajectory=False).writes() == ext(("outer_final_off", 200, 4))
    fn = T.CustomFn(body=body, body_init=bytes(8), inputs=((0, 64, 4), (4, MAX, 4)), body_output_off=4,
                    outer_output_off=128, out_bytes=4)
    assert fn.reads() == ext(("inputs[0]", 64, 4)) and fn.writes() == ext(("outer_output_off", 128, 4))


def test_recurrent_and_quant_extents():
    lstm = T.Lstm(x=0, w_ih=1, w_hh=2, bias=3, h0=4, c0=5, dst=6, batch=2, seq=3, input_size=5, hidden=4,
                  num_layers=2, bidirectional=True, carry=True)
    sizes = {e.field: e.nbytes // 4 for e in lstm.reads()}
    assert sizes == {"x": 30, "w_ih": 2 * 16 * (5 + 8), "w_hh": 2 * 2 * 16 * 4, "bias": 2 * 2 * 16,
                     "h0": 2 * 2 * 2 * 4, "c0": 16 * 2}
    assert {e.field: e.nbytes // 4 for e in lstm.writes()} == {"dst": 2 * 3 * 8, "h0": 32, "c0": 32}
    gdn = T.GatedDeltaNetBackward(q=0, k=0, v=0, g=0, beta=0, state=0, dy=0, dst=0, batch=2, seq=3, heads=4,
                                  state_size=8, gate_per_channel=False, carry_state=True)
    assert gdn.writes()[0].nbytes == 4 * (3 * 192 + 24 + 24 + 2 * 4 * 64)
    fq = T.FakeQuantize(x=0, out=100, len=8, chan_axis=0, chan_dim=2, inner=4, bits=8, ste=SteKind.Identity,
                        scale_mode=ScaleMode.EMA(decay=0.9), state_off=200)
    assert fq.reads()[-1] == fq.writes()[-1] == T.Extent("state_off", 200, 8)
    assert "state_off" not in {e.field for e in dataclasses.replace(fq, scale_mode=ScaleMode.PerBatch).reads()}
    gguf = T.DequantMatMulGguf(x=0, w_q=1000, dst=5000, m=2, k=512, n=3, scheme=QuantScheme.GgufQ4K)
    assert gguf.reads()[1][:3] == ("w_q", 1000, 3 * 2 * 144)
    with pytest.raises(ValidationError) as err:
        dataclasses.replace(gguf, scheme=QuantScheme.Int8Block(block_size=32)).reads()
    assert err.value.field == "scheme"
    mm = T.ScaledMatMul(lhs=0, rhs=100, lhs_scale=200, rhs_scale=300, bias=400, dst=500, m=2, k=64, n=3,
                        lhs_fmt=ScaledFormat.F8E4M3, rhs_fmt=ScaledFormat.F4E2M1,
                        layout=ScaleLayout.BlockMxE8M0(block=32), has_bias=False)
    assert [e[:3] for e in mm.reads()] == [("lhs", 0, 128), ("rhs", 100, 192), ("lhs_scale", 200, 4),
                                           ("rhs_scale", 300, 6)]


def test_absent_buffers_and_empty_ranges_are_omitted():
    t = T.FusedMmBiasAct(a=0, w=100, bias=MAX, c=200, m=2, k=3, n=4, act=None)
    assert [e.field for e in t.reads()] == ["a", "w"]
    assert T.Copy(src=0, dst=64, len=0).reads() == () == T.Copy(src=0, dst=64, len=0).writes()
    assert T.Nop().reads() == () == T.Nop().writes()
    assert T.RngNormal(dst=0, len=4, mean=0.0, scale=1.0, key=1, op_seed=None).reads() == ()
    f = T.Fft1d(src=0, dst=256, outer=2, n_complex=8, inverse=False, norm_tag=0, dtype=DType.F64)
    assert f.reads() == ext(("src", 0, 256)) and f.writes() == ext(("dst", 256, 256))


# ── check_fields ────────────────────────────────────────────────────────────

def region(**kw: Any) -> T.ElementwiseRegion:
    base = dict(dst=0, len=4, input_offs=(0,), chain=(S.Activation(Activation.Relu, In.Input(0)),))
    return T.ElementwiseRegion(**{**base, **kw})


SGEMM = T.Sgemm(a=0, b=0, c=0, m=1, k=1, n=1)
GATHER = T.Gather(table=0, table_len=1, idx=0, dst=0, num_idx=1, trailing=1, idx_i64=0, table_bytes=4)
QMM = T.QMatMul(x=0, w=0, bias=0, out=0, m=1, k=1, n=1, x_zp=0, w_zp=0, out_zp=0, mult=1.0)


@pytest.mark.parametrize("thunk, field", [
    (dataclasses.replace(SGEMM, a=-1), "a"),
    (dataclasses.replace(SGEMM, a=2**64), "a"),
    (dataclasses.replace(SGEMM, m=2**32), "m"),
    (dataclasses.replace(SGEMM, n=1.0), "n"),
    (dataclasses.replace(SGEMM, k=True), "k"),
    (dataclasses.replace(GATHER, table_bytes=256), "table_bytes"),
    (dataclasses.replace(QMM, x_zp=2**31), "x_zp"),
    (dataclasses.replace(QMM, out_zp=-2**31 - 1), "out_zp"),
    (dataclasses.replace(QMM, mult=1e39), "mult"),
    (dataclasses.replace(QMM, mult="1"), "mult"),
    (T.SgemmT(a=0, b=0, c=0, m=1, k=1, n=1, ta=1, tb=False), "ta"),
    (T.Compare(lhs=0, rhs=0, dst=0, len=1, op=BinaryOp.Add, inputs_i64=0, inputs_elem_bytes=4, dst_elem_bytes=1,
               lhs_scalar=False, rhs_scalar=False, lhs_len=1, rhs_len=1, out_dims_bcast=(), bcast_lhs_strides=(),
               bcast_rhs_strides=()), "op"),
    (T.ActivationF64(src=0, dst=0, len=1, kind="Exp"), "kind"),
    (T.DequantMatMulGguf(x=0, w_q=0, dst=0, m=1, k=1, n=1, scheme=MaskKind.Causal), "scheme"),
    (region(input_offs=(0, -1), in_lanes=(LaneKind.F32, LaneKind.F32)), "input_offs"),
    (region(input_modulus=(0,) * 17), "input_modulus"),
    (region(in_lanes=(LaneKind.F32, LaneKind.F16)), "in_lanes"),
    (region(chain=(S.Binary(BinaryOp.Add, In.Input(0), "x"),)), "chain"),
    (region(out_lane=DType.F32), "out_lane"),
    (T.RngNormal(dst=0, len=1, mean=0.0, scale=1.0, key=-1, op_seed=None), "key"),
    (T.RngNormal(dst=0, len=1, mean=0.0, scale=1.0, key=0, op_seed="s"), "op_seed"),
    (T.CustomOp(kernel=3, inputs=(), output=(0, 0, ()), attrs=()), "kernel"),
    (T.CustomOp(kernel="k", inputs=(), output=(0, 0), attrs=()), "output"),
    (T.CustomOp(kernel="k", inputs=(), output=(0, 0, ()), attrs=(300,)), "attrs"),
    (T.CustomFn(body="nope", body_init=b"", inputs=(), body_output_off=0, outer_output_off=0, out_bytes=0), "body"),
    (T.CustomFn(body=ThunkSchedule([dataclasses.replace(SGEMM, m=-1)], arena_bytes=0), body_init=b"", inputs=(),
                body_output_off=0, outer_output_off=0, out_bytes=0), "body"),
    (T.CustomFn(body=ThunkSchedule([], arena_bytes=0), body_init="", inputs=(), body_output_off=0,
                outer_output_off=0, out_bytes=0), "body_init"),
    (T.Attention(q=0, k=0, v=0, mask=0, out=0, batch=1, seq=1, kv_seq=1, heads=1, kv_heads=1, head_dim=1,
                 v_head_dim=1, mask_kind=MaskKind.SlidingWindow(-3), scale=1.0, softcap=0.0, q_row_stride=1,
                 k_row_stride=1, v_row_stride=1, bhsd=False), "mask_kind"),
])
def test_check_fields_rejects_and_names_the_field(thunk, field):
    with pytest.raises(ValidationError) as err:
        thunk.check_fields()
    assert err.value.field == field and err.value.kind == type(thunk).__name__
    assert field in str(err.value) and type(thunk).__name__ in str(err.value)


def test_check_fields_accepts_edge_values():
    dataclasses.replace(SGEMM, a=2**64 - 1, m=2**32 - 1).check_fields()
    dataclasses.replace(QMM, x_zp=-2**31, mult=3.4028234663852886e38).check_fields()
    dataclasses.replace(QMM, mult=float("inf")).check_fields()
    dataclasses.replace(GATHER, table_bytes=255).check_fields()
    region(input_modulus=(3,), scalar_input_mask=2**32 - 1).check_fields()


# A value of every shape a field may be given, right or wrong (the predicates are built per hint).
PROBES = [None, True, False, 0, 1, -1, 255, 256, 2**31, -2**31 - 1, 2**32, 2**64 - 1, 2**64, 0.0, -0.0, 1.5,
          3.4028234663852886e38, 1e39, float("inf"), float("nan"), "x", b"x", (), (0,), (1, 2), (True,),
          (-1,), (0,) * 16, (0,) * 17, (0, 0, ()), (0.5,), BinaryOp.Add, LaneKind.F32, DType.F32, MaskKind.Causal,
          MaskKind.SlidingWindow(-3), MaskKind.SlidingWindow(3), S.Binary(BinaryOp.Add, In.Input(0), In.Step(1)),
          (S.Binary(BinaryOp.Add, In.Input(0), "x"),), (S.Activation(Activation.Relu, In.Input(0)),),
          QuantScheme.Int8Block(block_size=32), ScaleMode.EMA(decay=0.5), ThunkSchedule([], arena_bytes=0)]


def test_field_predicates_accept_only_what_check_accepts():
    """check_fields' per-class predicates (built once per hint) are a fast path: where one says a
    value fits, the full check must agree — so errors always come from `_check`, worded as before."""
    from rlx_llvm.thunks.base import _check, _field_fits
    accepted = 0
    for cls in set(T.Thunk._registry.values()):
        for name, fits, hint in _field_fits(cls):
            for value in PROBES:
                if fits(value):
                    _check(value, hint, name, name, cls.__name__)  # must not raise
                    accepted += 1
    assert accepted > 1000  # the probes reach the fast path of most fields
