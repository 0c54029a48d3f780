"""ThunkSchedule: construction, strip_nops, the lossless JSON document, save/load, malformed input."""
from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings

from rlx_llvm import thunks as T
from rlx_llvm.dtypes import LaneKind
from rlx_llvm.errors import ValidationError
from rlx_llvm.ops import Activation, BinaryOp, ChainOperand as In, ChainStep as S, MaskKind, RngBackend, RngOptions
from rlx_llvm.schedule import ThunkSchedule
from tests.strategies import schedule_strategy


def body() -> ThunkSchedule:
    return ThunkSchedule([T.Copy(src=0, dst=4, len=1), T.Nop()], arena_bytes=8, score_skip=0.0)


def sample() -> ThunkSchedule:
    """A schedule with a region, floats that are not f32-exact, nested bodies and bytes."""
    region = T.ElementwiseRegion(dst=64, len=4, input_offs=(0, 16), input_modulus=(0, 2),
                                 in_lanes=(LaneKind.F32, LaneKind.Bf16),
                                 chain=(S.Binary(BinaryOp.Add, In.Input(0), In.Input(1)),
                                        S.Activation(Activation.Gelu, In.Step(0))))
    scan = T.Scan(body=body(), body_init=bytes(range(8)), body_input_off=0, body_output_off=4,
                  outer_init_off=0, outer_final_off=128, length=3, carry_bytes=4, save_trajectory=True,
                  xs_inputs=((0, 200, 4),), bcast_inputs=(), num_checkpoints=0)
    grad = T.ScanBackward(body_vjp=body(), body_init=b"\x00\xff", body_carry_in_off=0, body_x_offs=(4,),
                          body_d_output_off=0, body_dcarry_out_off=4, outer_init_off=0, outer_traj_off=128,
                          outer_upstream_off=256, outer_xs_offs=((200, 4),), outer_dinit_off=300, length=3,
                          carry_bytes=4, carry_elem_size=4, save_trajectory=False, num_checkpoints=0,
                          forward_body=body(), forward_body_init=None, forward_body_carry_in_off=0,
                          forward_body_output_off=4, forward_body_x_offs=())
    attn = T.RngNormal(dst=400, len=4, mean=0.1, scale=-0.0, key=2**64 - 1, op_seed=1e-45)
    return ThunkSchedule([T.Nop(), region, scan, T.Nop(), grad, attn], arena_bytes=1024, mask_threshold=0.3,
                         mask_neg_inf=float("-inf"), rng=RngOptions(seed=7, backend=RngBackend.Ort))


def test_construction_defaults_and_coercion():
    s = ThunkSchedule([T.Copy(src=0, dst=64, len=16)], arena_bytes=128)
    assert isinstance(s.thunks, tuple) and s.arena_bytes == 128
    assert (s.mask_threshold, s.mask_neg_inf, s.score_skip) == (0.5, -1e9, 1e-8)
    assert s.rng == RngOptions(seed=42, backend=RngBackend.Philox)
    assert ThunkSchedule(thunks=(t for t in s.thunks), arena_bytes=128) == s
    assert hash(sample()) == hash(sample())


def test_strip_nops_returns_a_new_schedule():
    s = sample()
    stripped = s.strip_nops()
    assert [t.kind_name for t in stripped.thunks] == ["ElementwiseRegion", "Scan", "ScanBackward", "RngNormal"]
    assert len(s.thunks) == 6 and s.thunks[0] == T.Nop()  # the original is unchanged
    assert dataclasses.replace(stripped, thunks=s.thunks) == s
    assert stripped.thunks[1].body.thunks[-1] == T.Nop()  # nested bodies are left alone


def test_json_document_layout():
    doc = json.loads(sample().to_json(indent=2))
    assert list(doc) == ["format", "version", "arena_bytes", "mask_threshold", "mask_neg_inf", "score_skip",
                         "rng", "thunks"]
    assert doc["format"] == "rlx-llvm-schedule" and doc["version"] == 1
    assert doc["rng"] == {"seed": 7, "backend": "Ort"}
    assert doc["thunks"][0] == "Nop"
    scan = doc["thunks"][2]["Scan"]
    assert scan["body"]["format"] == "rlx-llvm-schedule" and scan["body_init"] == {"base64": "AAECAwQFBgc="}
    assert doc["thunks"][1]["ElementwiseRegion"]["chain"][1] == {"Activation": ["Gelu", {"Step": 0}]}


def test_round_trip_is_lossless():
    s = sample()
    text = s.to_json()
    back = ThunkSchedule.from_json(text)
    assert back == s and back.to_json() == text
    rng = back.thunks[-1]
    assert (rng.mean, rng.op_seed, rng.key) == (0.1, 1e-45, 2**64 - 1)
    assert str(rng.scale) == "-0.0" and back.mask_neg_inf == float("-inf")
    assert back.thunks[2].body_init == bytes(range(8)) and back.thunks[4].forward_body == body()


def test_save_and_load(tmp_path):
    path = tmp_path / "sched.json"
    sample().save(path)
    assert ThunkSchedule.load(path) == sample()
    assert ThunkSchedule.load(str(path)) == sample()


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(schedule_strategy())
def test_random_schedules_round_trip(sched):
    assert ThunkSchedule.from_json(sched.to_json()) == sched


def _doc() -> dict:
    return json.loads(sample().to_json())


def _mutated(edit) -> str:
    doc = _doc()
    edit(doc)
    return json.dumps(doc)


@pytest.mark.parametrize("edit, index, kind, field, words", [
    (lambda d: d["thunks"].__setitem__(1, {"Elementwise": {}}), 1, None, None, "unknown thunk kind"),
    (lambda d: d["thunks"].__setitem__(0, "Sgemm"), 0, "Sgemm", "a", "missing field"),
    (lambda d: d["thunks"][1]["ElementwiseRegion"].pop("len"), 1, "ElementwiseRegion", "len", "missing field"),
    (lambda d: d["thunks"][1]["ElementwiseRegion"].__setitem__("out_lane", "F33"), 1, "ElementwiseRegion",
     "out_lane", "F33"),
    (lambda d: d["thunks"][1]["ElementwiseRegion"]["chain"][1]["Activation"].__setitem__(0, "Gelo"), 1,
     "ElementwiseRegion", "chain", "Gelo"),
    (lambda d: d["thunks"][1]["ElementwiseRegion"].__setitem__("typo", 1), 1, "ElementwiseRegion", "typo",
     "unknown field"),
    (lambda d: d["thunks"][1]["ElementwiseRegion"].__setitem__("len", -4), 1, "ElementwiseRegion", "len", "u32"),
    (lambda d: d["thunks"][1]["ElementwiseRegion"].__setitem__("len", "4"), 1, "ElementwiseRegion", "len", "u32"),
    (lambda d: d["thunks"][5]["RngNormal"].__setitem__("mean", "0.1"), 5, "RngNormal", "mean", "number"),
    (lambda d: d["thunks"][2]["Scan"]["body"]["thunks"][0]["Copy"].pop("src"), 2, "Scan", "body", "src"),
    (lambda d: d["thunks"][2]["Scan"].__setitem__("body_init", {"base64": "@@"}), 2, "Scan", "body_init",
     "base64"),
    (lambda d: d["thunks"].__setitem__(3, ["Nop"]), 3, None, None, "one-key object"),
])
def test_malformed_thunks_name_index_kind_and_field(edit, index, kind, field, words):
    with pytest.raises(ValidationError) as err:
        ThunkSchedule.from_json(_mutated(edit))
    e = err.value
    assert (e.index, e.kind, e.field) == (index, kind, field)
    assert f"thunk {index}" in str(e) and words in str(e)


@pytest.mark.parametrize("text, field", [
    ("{not json", None),
    ("[]", None),
    (_mutated(lambda d: d.__setitem__("format", "other")), "format"),
    (_mutated(lambda d: d.__setitem__("version", 2)), "version"),
    (_mutated(lambda d: d.pop("arena_bytes")), "arena_bytes"),
    (_mutated(lambda d: d.__setitem__("arena_bytes", -1)), "arena_bytes"),
    (_mutated(lambda d: d.__setitem__("mask_threshold", None)), "mask_threshold"),
    (_mutated(lambda d: d.__setitem__("rng", {"seed": 1, "backend": "Mersenne"})), "rng"),
    (_mutated(lambda d: d.__setitem__("rng", {"seed": -1, "backend": "Philox"})), "rng"),
    (_mutated(lambda d: d.__setitem__("thunks", {})), "thunks"),
    (_mutated(lambda d: d.__setitem__("extra", 1)), "extra"),
])
def test_malformed_documents(text, field):
    with pytest.raises(ValidationError) as err:
        ThunkSchedule.from_json(text)
    assert err.value.field == field and err.value.index is None


def test_mask_kinds_and_absent_offsets_survive_json():
    t = T.Attention(q=0, k=0, v=0, mask=T.USIZE_MAX, out=0, batch=1, seq=1, kv_seq=1, heads=1, kv_heads=1,
                    head_dim=1, v_head_dim=1, mask_kind=MaskKind.None_, scale=0.125, softcap=0.0,
                    q_row_stride=1, k_row_stride=1, v_row_stride=1, bhsd=True)
    s = ThunkSchedule([t, dataclasses.replace(t, mask_kind=MaskKind.SlidingWindow(3))], arena_bytes=64)
    assert ThunkSchedule.from_json(s.to_json()) == s
    assert '"mask_kind": "None"' in s.to_json()
