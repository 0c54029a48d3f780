"""Resource limits (rlx_llvm.limits): every size a schedule or its files name is checked before allocation."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

import rlx_llvm as rl
from rlx_llvm import limits, testing
from rlx_llvm import thunks as T
from rlx_llvm.cli import main


@pytest.fixture
def budget():
    """Set a small budget for one test, restoring the default after it."""
    yield rl.set_max_memory
    rl.set_max_memory(None)


@pytest.mark.parametrize("text, expected", [("1024", 1024), ("512M", 512 << 20), ("8G", 8 << 30), ("1.5K", 1536),
                                            ("2GiB", 2 << 30), ("1T", 1 << 40)])
def test_parse_size(text, expected):
    assert limits.parse_size(text) == expected


def test_parse_size_share_of_ram_and_nonsense():
    assert limits.parse_size("50%") == limits.physical_memory() // 2
    for bad in ("", "lots", "-1G", "1Q"):
        with pytest.raises(ValueError, match="not a size"):
            limits.parse_size(bad)


def test_default_is_a_share_of_physical_memory(monkeypatch):
    monkeypatch.delenv(limits.ENV, raising=False)
    assert limits.max_bytes() == int(limits.physical_memory() * limits.DEFAULT_SHARE)
    monkeypatch.setenv(limits.ENV, "3M")
    assert limits.max_bytes() == 3 << 20 and limits.max_thunks() == (3 << 20) // limits.COMPILE_BYTES_PER_THUNK
    monkeypatch.setenv(limits.ENV, "plenty")
    with pytest.raises(rl.ValidationError, match="RLX_LLVM_MAX_MEMORY"):
        limits.max_bytes()


def test_an_arena_bigger_than_the_machine_is_refused():
    with pytest.raises(rl.LimitError, match=r"field 'nbytes': Arena asks for 4611686018427387904 bytes .* over the "
                                            r"limit of \d+ bytes"):
        rl.Arena(2 ** 62)


def test_the_argument_wins_over_the_environment(monkeypatch, budget):
    monkeypatch.setenv(limits.ENV, "1G")
    budget("1M")
    rl.Arena(1 << 20)
    with pytest.raises(rl.LimitError, match="over the limit of 1048576 bytes"):
        rl.Arena((1 << 20) + 1)
    with pytest.raises(rl.ValidationError, match="must be > 0"):
        budget(0)


def test_schedules_are_checked_before_decoding_or_compiling(budget):
    doc = {"format": "rlx-llvm-schedule", "version": 1, "arena_bytes": 10 ** 13, "thunks": []}
    huge = rl.ThunkSchedule.from_json(json.dumps(doc))     # a document may describe a bigger machine's schedule…
    with pytest.raises(rl.LimitError, match="field 'arena_bytes'.*10000000000000 bytes"):
        rl.compile(huge)                                   # …but nothing is compiled or allocated for it here
    budget("1M")   # 1 MiB / 48 KiB per thunk → 21 thunks at most
    doc = {**doc, "arena_bytes": 64, "thunks": ["Nop"] * 22}
    with pytest.raises(rl.LimitError, match="holds 22 thunks, over the limit of 21"):
        rl.ThunkSchedule.from_json(json.dumps(doc))
    with pytest.raises(rl.LimitError, match="holds 22 thunks"):
        rl.compile(rl.ThunkSchedule([T.Nop()] * 22, arena_bytes=64))
    rl.ThunkSchedule.from_json(json.dumps({**doc, "thunks": ["Nop"] * 21}))


def test_deep_json_is_a_limit_error_not_a_recursion_error():
    text = '{"format": "rlx-llvm-schedule", "version": 1, "arena_bytes": 16, "thunks": ' + \
        "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(rl.LimitError, match="JSON document is nested deeper"):
        rl.ThunkSchedule.from_json(text)


def test_nested_bodies_past_the_format_are_refused():
    scan = testing.examples("Scan")[0].schedule
    inner = scan
    for _ in range(limits.MAX_NESTING):
        inner = dataclasses.replace(scan, thunks=(dataclasses.replace(scan.thunks[0], body=inner),))
    with pytest.raises(rl.LimitError, match=r"^thunk 0: a nested body \(Scan / CustomFn\) is nested deeper than the format can use \(64 levels\)$"):
        rl.ThunkSchedule.from_json(inner.to_json())
    shallow = dataclasses.replace(scan, thunks=(dataclasses.replace(scan.thunks[0], body=scan),))
    assert rl.ThunkSchedule.from_json(shallow.to_json()) == shallow


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlx_llvm.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def _one_line_usage_error(done: subprocess.CompletedProcess, pattern: str) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert pattern in done.stderr, done.stderr


def test_cli_refuses_oversized_and_hostile_inputs(tmp_path):
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"format": "rlx-llvm-schedule", "version": 1, "arena_bytes": 10 ** 13, "thunks": []}))
    _one_line_usage_error(_cli("run", str(big)), "the schedule's arena asks for 10000000000000 bytes (9.09 TiB)")
    deep = tmp_path / "deep.json"
    deep.write_text('{"format": "rlx-llvm-schedule", "version": 1, "arena_bytes": 16, "thunks": ' +
                    "[" * 100_000 + "]" * 100_000 + "}")
    _one_line_usage_error(_cli("run", str(deep)), "is nested deeper than the format can use")
    many = tmp_path / "many.json"
    many.write_text(rl.ThunkSchedule([T.Nop()] * 30, arena_bytes=64).to_json())
    _one_line_usage_error(_cli("--max-memory", "1M", "run", str(many)), "holds 30 thunks, over the limit of 21")
    _one_line_usage_error(_cli("run", str(many), env={limits.ENV: "1M"}), "holds 30 thunks")
    small = tmp_path / "small.json"
    small.write_text(rl.ThunkSchedule([T.Nop()], arena_bytes=64).to_json())
    arena = tmp_path / "arena.bin"
    arena.write_bytes(bytes(4096))
    _one_line_usage_error(_cli("--max-memory", "2K", "run", str(small), "--arena", str(arena)),
                          f"arena file {arena} asks for 4096 bytes")
    _one_line_usage_error(_cli("--max-memory", "lots", "run", str(small)), "'lots' is not a size")


def test_cli_honours_the_cache_switch_of_the_environment(tmp_path):
    sched = tmp_path / "s.json"
    sched.write_text(rl.ThunkSchedule([T.Copy(src=0, dst=256, len=64)], arena_bytes=512).to_json())
    env = {"RLX_LLVM_CACHE_DIR": str(tmp_path / "cache")}
    assert "(cached object)" not in _cli("run", str(sched), "--repeat", "1", env=env).stdout
    assert "(cached object)" in _cli("run", str(sched), "--repeat", "1", env=env).stdout
    off = _cli("run", str(sched), "--repeat", "1", env={**env, "RLX_LLVM_CACHE": "0"})
    assert off.returncode == 0 and "(cached object)" not in off.stdout
