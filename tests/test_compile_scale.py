"""Long schedules of repeated kernels (issue 20, items 2 and 4): what is left per thunk is a table row
and a few bytes — and validation errors, the report, per-thunk IR and warm starts still name each thunk."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import cache as object_cache
from rlx_llvm import thunks as T
from rlx_llvm.codegen import NativeStep, RunMap
from rlx_llvm.errors import ValidationError
from rlx_llvm.dtypes import LaneKind

BLOCK, BLOCKS, N = 256, 512, 50_000  # 64 f32 per block; a chain of N copies cycling over the blocks


def _copies(n: int = N) -> rl.ThunkSchedule:
    """Copy i moves block i % BLOCKS to block (i + 1) % BLOCKS (block 0 is offset 0: another body)."""
    at = lambda i: (i % BLOCKS) * BLOCK  # noqa: E731
    return rl.ThunkSchedule([T.Copy(src=at(i), dst=at(i + 1), len=BLOCK // 4) for i in range(n)],
                            arena_bytes=BLOCKS * BLOCK)


def _expected(initial: np.ndarray, n: int = N) -> np.ndarray:
    """The copy chain in NumPy, one block at a time."""
    blocks = initial.reshape(BLOCKS, BLOCK).copy()
    for i in range(n):
        blocks[(i + 1) % BLOCKS] = blocks[i % BLOCKS]
    return blocks.reshape(-1)


def _initial() -> np.ndarray:
    return np.random.default_rng(3).integers(0, 256, BLOCKS * BLOCK, dtype=np.uint8)


def _run(program: rl.Program) -> np.ndarray:
    arena = rl.Arena(BLOCKS * BLOCK)
    arena.bytes[:] = _initial()
    program.run(arena)
    return arena.bytes.copy()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> tuple[rl.Program, rl.Program, Path]:
    """The 50 000-copy schedule compiled cold into a fresh cache, then started warm from it."""
    directory = tmp_path_factory.mktemp("cache")
    cold = rl.compile(_copies(), cache=directory)
    warm = rl.compile(_copies(), cache=directory)
    return cold, warm, directory


def test_fifty_thousand_copies_compute_the_chain(compiled):
    cold, warm, _ = compiled
    expected = _expected(_initial())
    assert np.array_equal(_run(cold), expected)
    assert warm.report().from_cache and np.array_equal(_run(warm), expected)


def test_the_report_and_ir_still_show_every_thunk(compiled):
    cold, warm, _ = compiled
    for program in (cold, warm):
        rows = program.report().rows
        assert len(rows) == N and [r.index for r in rows[:3]] == [0, 1, 2]
        assert rows[0].body != rows[1].body == rows[N - 1].body   # block 0 at offset 0 keeps its own body
        assert all(r.kind == "Copy" and r.path == "llvm" and r.symbol == r.body for r in rows[1:BLOCKS])
        shown = program.llvm_ir(thunk=12_345)
        assert shown.startswith("; thunk 12345: Copy(src=") and f'define i32 @"{rows[1].body}"(' in shown
    # one flat table per run of rows: [count × 2 i64] written as one array constant, no function per thunk
    text = cold.llvm_ir()
    assert "define i32 @\"t1_copy\"(" not in text and text.count("define") < 10
    assert "segment0.rows1: thunks 1..510, row r = thunk 1 + r" in text
    assert "= private unnamed_addr constant [1020 x i64] [i64 256, i64 512, i64 512, i64 768" in text


def test_the_plan_on_disk_is_runs_not_a_row_per_thunk(compiled):
    cold, _, directory = compiled
    plan_file, = Path(directory).glob("*/*.plan.json")
    plan = json.loads(plan_file.read_text())
    assert plan["plan_version"] == object_cache.PLAN_VERSION
    assert plan["segments"] == [["segment0", 0, N]]
    assert len(plan["symbols"]) <= 3 * (N // BLOCKS + 1)  # three runs per cycle of blocks (two touch offset 0)
    assert plan["paths"] == [[0, N, "llvm"]]
    assert plan_file.stat().st_size < 200_000
    assert RunMap.from_runs(plan["symbols"]).get(7) == cold.report()[7].symbol


def test_a_plan_of_another_version_is_not_read(tmp_path):
    schedule = _copies(40)
    rl.compile(schedule, cache=tmp_path)
    plan_file, = tmp_path.glob("*/*.plan.json")
    plan = json.loads(plan_file.read_text())
    plan_file.write_text(json.dumps({**plan, "plan_version": 1}))
    assert not rl.compile(schedule, cache=tmp_path)._warm  # compiled cold (its object may still come from disk)
    assert rl.compile(schedule, cache=tmp_path)._warm       # … which stored a plan of this version again


def test_warm_start_rebuilds_segments_around_fallbacks(tmp_path):
    copy = lambda i: T.Copy(src=64 * i, dst=64 * (i + 1), len=16)  # noqa: E731
    sort = T.SortF32(src=0, dst=4096, outer=1, axis_dim=16, inner=1, descending=False, arg=False)
    schedule = rl.ThunkSchedule([copy(1), copy(2), sort, copy(3), sort, sort, copy(4)], arena_bytes=8192)
    cold = rl.compile(schedule, cache=tmp_path)
    warm = rl.compile(schedule, cache=tmp_path)
    assert warm._warm

    def shape(program: rl.Program) -> list:
        return [(s.symbol, list(s.indices)) if isinstance(s, NativeStep) else s.index for s in program._steps]
    assert shape(warm) == shape(cold) == [("segment0", [0, 1]), 2, ("segment1", [3]), 4, 5, ("segment2", [6])]
    assert [r.path for r in warm.report()] == [r.path for r in cold.report()]


def test_validation_still_names_thunk_kind_field_and_bound():
    thunks = list(_copies(1000).thunks)
    thunks[777] = T.Copy(src=BLOCK, dst=2 * BLOCK, len=2**32)
    with pytest.raises(ValidationError) as err:
        rl.compile(rl.ThunkSchedule(thunks, arena_bytes=BLOCKS * BLOCK), cache=False)
    assert (err.value.index, err.value.kind, err.value.field) == (777, "Copy", "len")
    assert "u32 (0..=4294967295), got 4294967296" in str(err.value) and str(err.value).startswith("thunk 777 Copy")
    thunks[777] = T.Copy(src=BLOCK, dst=BLOCKS * BLOCK - 4, len=2)
    with pytest.raises(ValidationError, match=r"thunk 777 Copy field 'dst': bytes \[131068, 131076\) lie "
                                              r"outside the arena of 131072 bytes"):
        rl.compile(rl.ThunkSchedule(thunks, arena_bytes=BLOCKS * BLOCK), cache=False)


@pytest.mark.parametrize("value, why", [(True, "got True"), (-1, "got -1"), (2**64, "got 18446744073709551616"),
                                        (1.0, "got 1.0")])
def test_the_fast_field_check_refuses_what_the_full_one_does(value, why):
    with pytest.raises(ValidationError, match=f"field 'src': expected usize .*{why}"):
        T.Copy(src=value, dst=0, len=1).check_fields()


def test_coercion_still_turns_lists_into_tuples():
    region = T.ElementwiseRegion(dst=0, len=4, input_offs=[64, 128], chain=[], scalar_input_mask=0,
                                 input_modulus=[0] * 16, in_lanes=[], out_lane=LaneKind.F32)
    assert region.input_offs == (64, 128) and region.chain == () and region.input_modulus == (0,) * 16


def test_run_map_reads_like_a_dict_and_keeps_runs():
    m = RunMap()
    for i, v in enumerate("aaabba"):
        m[i + 10] = v
    assert m.runs() == [[10, 13, "a"], [13, 15, "b"], [15, 16, "a"]]
    assert (m.get(12), m[13], m.get(9), m.get(16, "-"), 14 in m, 16 in m, len(m)) == ("a", "b", None, "-", True,
                                                                                       False, 6)
    assert list(m.items())[:4] == [(10, "a"), (11, "a"), (12, "a"), (13, "b")]
    assert RunMap.from_runs(json.loads(json.dumps(m.runs()))).runs() == m.runs()
    assert RunMap.of("xxy").runs() == [[0, 2, "x"], [2, 3, "y"]]
    with pytest.raises(KeyError):
        m[3]
    with pytest.raises(ValueError, match="indices must increase"):
        m[12] = "a"
