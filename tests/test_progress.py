"""Progress: `compile(progress=…)` reports each phase in order, monotone and ending at its total; the
CLI draws bars on a terminal (here a pty) once a job passes 2 s, and nothing under --quiet or off a
terminal."""
from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import sys
import termios

import pytest

import rlx_llvm as rl
from rlx_llvm import progress, thunks as T
from rlx_llvm.cli import main
from rlx_llvm.progress import PhaseBars, Progress


def schedule(n: int = 3) -> rl.ThunkSchedule:
    """n copies of 16 f32 and a SciPy fallback (a sort) in the middle."""
    copies = [T.Copy(src=64 * i, dst=64 * (i + 1), len=16) for i in range(n)]
    sort = T.SortF32(src=0, dst=64 * (n + 1), outer=1, axis_dim=16, inner=1, descending=False, arg=False)
    return rl.ThunkSchedule(copies[:1] + [sort] + copies[1:], arena_bytes=64 * (n + 2))


def phases(events: list[Progress]) -> list[str]:
    """The phases in the order they came, each once."""
    return [p for i, p in enumerate(e.phase for e in events) if i == 0 or events[i - 1].phase != p]


def assert_monotone_to_total(events: list[Progress]) -> None:
    for phase in set(e.phase for e in events):
        seen = [(e.done, e.total) for e in events if e.phase == phase]
        assert [d for d, _ in seen] == sorted(d for d, _ in seen), phase
        assert len({t for _, t in seen}) == 1 and seen[-1][0] == seen[-1][1], phase


def test_compile_reports_emit_compile_load(tmp_path):
    events: list[Progress] = []
    rl.compile(schedule(), cache=str(tmp_path), progress=events.append)
    assert phases(events) == ["emit", "compile", "load"]
    assert_monotone_to_total(events)
    assert events[0] == Progress("emit", 0, 3) and events[-1] == Progress("load", 1, 1)   # the 3 native thunks
    warm: list[Progress] = []
    rl.compile(schedule(), cache=str(tmp_path), progress=warm.append)
    assert warm == [Progress("load", 0, 1), Progress("load", 1, 1)]   # a warm start only loads


# ── the CLI's bars ──
@pytest.fixture()
def terminal(monkeypatch):
    """`terminal()` puts stderr on a pty (a real terminal) and returns a function reading what was
    written to it; called in the test body, as pytest sets its own stderr after the fixtures."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))   # 100 columns, as a terminal has
    tty = os.fdopen(slave, "w", buffering=1)

    def written() -> str:
        tty.flush()
        out = b""
        while select.select([master], [], [], 0.2)[0]:
            out += os.read(master, 1 << 16)
        return out.decode(errors="replace")

    def attach():
        monkeypatch.setattr(sys, "stderr", tty)
        return written

    yield attach
    tty.close()
    os.close(master)


@pytest.fixture()
def sched_path(tmp_path):
    path = tmp_path / "sched.json"
    path.write_text(schedule().to_json())
    return str(path)


@pytest.mark.parametrize("bar", ["tqdm", "plain"])
def test_cli_bars_on_a_terminal_past_the_delay(sched_path, terminal, monkeypatch, bar):
    if bar == "tqdm":
        pytest.importorskip("tqdm")
    else:
        monkeypatch.setitem(sys.modules, "tqdm", None)   # the plain line instead
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    written = terminal()
    assert main(["run", sched_path, "--no-cache", "--repeat", "2"]) == 0
    shown = written()
    for phase in ("emit", "compile", "load", "run"):
        assert f"{phase}:" in shown, shown
    assert "2/2" in shown and "rlx-llvm" not in shown
    if bar == "plain":
        assert "emit: 3/3 thunks" in shown and "run: 2/2 runs" in shown


def test_cli_quiet_or_quick_prints_nothing_extra(sched_path, terminal, monkeypatch):
    written = terminal()
    assert main(["run", sched_path, "--no-cache"]) == 0        # well under 2 s: no bar
    assert written() == ""
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    for command in (["run", sched_path], ["report", sched_path], ["ir", sched_path, "--thunk", "0"]):
        assert main([*command, "--no-cache", "--quiet"]) == 0
        assert written() == "", command


def test_no_bar_off_a_terminal(sched_path, monkeypatch, capsys):
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    assert main(["run", sched_path, "--no-cache"]) == 0
    assert capsys.readouterr().err == ""                       # pytest's stderr is not a terminal
    with PhaseBars() as bars:
        bars(Progress("emit", 0, 1))
        bars(Progress("emit", 1, 1))
    assert capsys.readouterr().err == ""
