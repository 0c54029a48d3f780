"""The `rlx-llvm` command line: its commands, and one clear line for every bad input."""
from __future__ import annotations

import json
import re
import os
import subprocess
import sys

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import cli
from rlx_llvm import thunks as T
from rlx_llvm.cli import main
from rlx_llvm.ops import BinaryOp, ChainOperand as In, ChainStep as S

N = 16  # f32 elements per buffer: x at 0, the scalar b at 64, y at 128, z at 192, w at 256


def small_schedule() -> rl.ThunkSchedule:
    """y = x + b (native region), z = y (native copy), w = sort(z) (a SciPy/NumPy fallback)."""
    region = T.ElementwiseRegion(dst=128, len=N, input_offs=(0, 64), scalar_input_mask=0b10,
                                 chain=(S.Binary(BinaryOp.Add, In.Input(0), In.Input(1)),))
    copy = T.Copy(src=128, dst=192, len=N)
    sort = T.SortF32(src=192, dst=256, outer=1, axis_dim=N, inner=1, descending=False, arg=False)
    return rl.ThunkSchedule([region, copy, sort], arena_bytes=320)


@pytest.fixture()
def sched_path(tmp_path):
    p = tmp_path / "sched.json"
    p.write_text(small_schedule().to_json())
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
    assert capsys.readouterr().out.startswith("t1_copy.body:")   # a Copy runs its shared body from a table


def test_run_starts_from_the_arena_file_and_writes_the_result(sched_path, tmp_path, capsys):
    rng = np.random.default_rng(0)
    start = rl.Arena(small_schedule().arena_bytes)
    start.write(0, rng.standard_normal(N).astype(np.float32))
    start.write(64, np.float32([0.5]))
    start_file, out_file = tmp_path / "start.bin", tmp_path / "out.bin"
    start.bytes.tofile(start_file)
    assert main(["run", str(sched_path), "--arena", str(start_file), "--repeat", "3", "--out", str(out_file)]) == 0
    assert "median" in capsys.readouterr().out
    done = rl.Arena.from_bytes(out_file.read_bytes())
    np.testing.assert_array_equal(done.read(256, "f32", N), np.sort(start.read(0, "f32", N) + np.float32(0.5)))
    assert main(["report", str(sched_path)]) == 0
    assert "t1_copy" in capsys.readouterr().out


@pytest.fixture()
def inputs(tmp_path, sched_path):
    """Paths the bad command lines below refer to by name."""
    files = {"sched": sched_path, "missing": tmp_path / "missing.json", "dir": tmp_path}
    contents = {"not_json": b"{not json", "no_format": b'{"thunks": []}', "not_utf8": b"\xff\xfe",
                "short": bytes(319), "long": bytes(321),
                "out_of_bounds": rl.ThunkSchedule([T.Copy(src=0, dst=64, len=1000)], arena_bytes=128).to_json()}
    for name, data in contents.items():
        files[name] = tmp_path / name
        files[name].write_bytes(data.encode() if isinstance(data, str) else data)
    return {name: str(path) for name, path in files.items()}


CORES = os.cpu_count() or 1
BAD = [  # (command line, exit status, the error line's text after "rlx-llvm: error: ")
    ("run {sched} --repeat 0", 2, r"argument --repeat: 0 is out of range \(allowed: an int ≥ 1\); "
                                  r"see `rlx-llvm run --help`"),
    ("run {sched} --repeat -1", 2, r"argument --repeat: -1 is out of range \(allowed: an int ≥ 1\)"),
    ("run {sched} --repeat 1.5", 2, r"argument --repeat: '1.5' is not an int \(allowed: an int ≥ 1\)"),
    ("embed hi --threads 0", 2, rf"argument --threads: 0 is out of range \(allowed: an int in 1\.\.{CORES}\)"),
    (f"embed hi --threads {CORES + 1}", 2, rf"argument --threads: {CORES + 1} is out of range"),
    ("embed hi --repeat 0", 2, r"argument --repeat: 0 is out of range \(allowed: an int ≥ 1\)"),
    ("embed hi --quant q5_k", 2, r"argument --quant: invalid choice: 'q5_k' \(choose from 'f32', 'q8_0', 'q4_0'\)"),
    ("ir {sched} --thunk 9", 2, r"thunk 9 is out of range \(the schedule has 3 thunks: 0–2\)"),
    ("ir {sched} --asm --thunk 3", 2, r"thunk 3 is out of range \(the schedule has 3 thunks: 0–2\)"),
    ("ir {sched} --thunk -1", 2, r"argument --thunk: -1 is out of range \(allowed: an int ≥ 0\)"),
    ("ir {sched} --thunk 2", 1, r"thunk 2 \(SortF32\) has no native function: it runs as a .*fallback"),
    ("ir {sched} --asm --thunk 2", 1, r"thunk 2 \(SortF32\) has no native function"),
    ("run", 2, r"the following arguments are required: schedule; see `rlx-llvm run --help`"),
    ("frobnicate", 2, r"argument command: invalid choice: 'frobnicate'"),
    ("run {missing}", 2, r"schedule file \S+missing.json does not exist"),
    ("report {dir}", 1, r"cannot read schedule file \S+: Is a directory"),
    ("run {not_json}", 1, r"schedule file \S+not_json: not valid JSON"),
    ("ir {not_utf8}", 1, r"schedule file \S+not_utf8: 'utf-8' codec can't decode"),
    ("run {no_format}", 1, r"schedule file \S+no_format: field 'format'"),
    ("run {out_of_bounds}", 1, r"thunk 0 Copy"),
    ("run {sched} --arena {short}", 1, r"arena file \S+short has 319 bytes but the schedule's arena has 320 bytes"),
    ("run {sched} --arena {long}", 1, r"arena file \S+long has 321 bytes but the schedule's arena has 320 bytes"),
    ("run {sched} --arena {missing}", 2, r"arena file \S+missing.json does not exist"),
]


@pytest.mark.parametrize("command, status, message", BAD, ids=[c for c, _, _ in BAD])
def test_bad_input_is_one_error_line_and_a_status(command, status, message, inputs, capsys):
    assert main(command.format(**inputs).split()) == status
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("rlx-llvm: error: "), err
    assert re.search(message, err), err


def test_an_unexpected_exception_is_still_one_line_with_its_type(monkeypatch, capsys):
    def broken(args):
        raise KeyError("x")
    monkeypatch.setattr(cli, "cmd_coverage", broken)
    assert main(["coverage"]) == 1
    assert capsys.readouterr().err == "rlx-llvm: error: KeyError: 'x'\n"


def test_the_console_script_exits_2_with_one_line_and_no_traceback(sched_path):
    done = subprocess.run([sys.executable, "-m", "rlx_llvm.cli", "run", str(sched_path), "--repeat", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("rlx-llvm: error: argument --repeat: 0 is out of range")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_demo_quick(capsys):
    assert main(["demo", "--quick"]) == 0
    assert "demo: OK" in capsys.readouterr().out
