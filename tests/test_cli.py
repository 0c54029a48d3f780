"""The `rlx-llvm` command line."""
from __future__ import annotations

import json

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm.cli import main
from tests.test_program import gelu_schedule


@pytest.fixture()
def sched_path(tmp_path):
    p = tmp_path / "sched.json"
    p.write_text(gelu_schedule().to_json())
    return p


def test_coverage_lists_196(capsys):
    assert main(["coverage"]) == 0
    out = capsys.readouterr().out
    assert "ElementwiseRegion" in out and "196 kinds" in out
    assert main(["coverage", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 196


def test_ir_for_one_thunk(sched_path, capsys):
    assert main(["ir", str(sched_path), "--thunk", "0"]) == 0
    out = capsys.readouterr().out
    assert "t0_elementwise_region" in out and "t1_copy" not in out
    assert main(["ir", str(sched_path), "--optimized"]) == 0
    assert "segment0" in capsys.readouterr().out
    assert main(["ir", str(sched_path), "--asm", "--thunk", "1"]) == 0
    assert capsys.readouterr().out.startswith("t1_copy:")


def test_run_and_report(sched_path, tmp_path, capsys):
    out_file = tmp_path / "arena.bin"
    assert main(["run", str(sched_path), "--repeat", "3", "--out", str(out_file)]) == 0
    assert "median" in capsys.readouterr().out
    assert out_file.stat().st_size == gelu_schedule().arena_bytes
    # run again starting from the saved arena
    assert main(["run", str(sched_path), "--arena", str(out_file), "--repeat", "1"]) == 0
    assert main(["report", str(sched_path)]) == 0
    assert "t1_copy" in capsys.readouterr().out


def test_bad_schedule_is_a_clean_error(tmp_path, capsys):
    p = tmp_path / "bad.json"
    sched = rl.ThunkSchedule([rl.thunks.Copy(src=0, dst=64, len=1000)], arena_bytes=128)
    p.write_text(sched.to_json())
    assert main(["run", str(p)]) == 2
    assert "thunk 0" in capsys.readouterr().err


def test_demo_quick(capsys):
    assert main(["demo", "--quick"]) == 0
    assert "demo: OK" in capsys.readouterr().out
