"""Progress of long jobs: the `progress=` callback of `rlx_llvm.compile` and the bars the CLI draws.

`compile(schedule, progress=callback)` calls `callback(Progress(phase, done, total))` on the
calling thread: phase "emit" once per thunk, "compile" as the module's parts finish (and at least
every half second while they compile), "load" before and after the object is loaded.  Within a
phase `done` never decreases, and each phase ends with `done == total`.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable

PLAIN_EVERY_S = 5.0
"""Without tqdm, a plain progress line at most this often (and one at the end)."""

SHOW_AFTER_S = 2.0
"""`PhaseBars` stays silent for jobs shorter than this."""


@dataclass(frozen=True)
class Progress:
    """How far one phase of a compile (or run) has come: `done` of `total` steps."""

    phase: str   # "emit" (thunks), "compile" (module parts), "load" (objects), "run" (CLI runs)
    done: int
    total: int


ProgressCallback = Callable[[Progress], None]


class ProgressBar:
    """Rate and ETA on stderr: a tqdm bar (the `progress` extra), else a line every PLAIN_EVERY_S
    seconds and at the end; nothing when `show` is false or stderr is not a terminal."""

    def __init__(self, total: int, done: int = 0, show: bool = True, unit: str = "steps",
                 desc: str | None = None) -> None:
        self.total, self.done, self.start_done = total, done, done
        self.unit, self.desc = unit, desc
        self.t0 = self.last = time.perf_counter()
        self.bar = None
        self.show = show and sys.stderr.isatty()
        if self.show:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, initial=done, unit=f" {unit}", desc=desc, file=sys.stderr,
                                dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, n: int) -> None:
        """`n` more steps done (0 refreshes the elapsed time)."""
        self.done += n
        if self.bar is not None:
            self.bar.update(n) if n else self.bar.refresh()
        elif self.show and (self.done == self.total or time.perf_counter() - self.last >= PLAIN_EVERY_S):
            self.last = time.perf_counter()
            rate = (self.done - self.start_done) / (self.last - self.t0)
            eta = (self.total - self.done) / rate if rate else float("inf")
            head = f"{self.desc}: " if self.desc else ""
            print(f"{head}{self.done}/{self.total} {self.unit}, {rate:.0f} {self.unit}/s, ETA {eta:.0f} s",
                  file=sys.stderr)

    def close(self) -> None:
        """End the bar (tqdm leaves its last state on the terminal)."""
        if self.bar is not None:
            self.bar.close()


UNITS = {"emit": "thunks", "compile": "parts", "load": "objects", "run": "runs"}


class PhaseBars:
    """A `progress=` callback drawing one `ProgressBar` per phase, once the job has run for
    SHOW_AFTER_S seconds (a shorter job prints nothing); silent when `show` is false."""

    def __init__(self, show: bool = True) -> None:
        self.show = show
        self.t0 = time.perf_counter()
        self.phase: str | None = None
        self.bar: ProgressBar | None = None

    def __call__(self, p: Progress) -> None:
        if not self.show:
            return
        if p.phase != self.phase:
            self.close()
            self.phase = p.phase
        if self.bar is None and time.perf_counter() - self.t0 >= SHOW_AFTER_S:
            self.bar = ProgressBar(p.total, p.done, unit=UNITS.get(p.phase, "steps"), desc=p.phase)
        if self.bar is not None:
            self.bar.update(p.done - self.bar.done)

    def close(self) -> None:
        """End the current phase's bar."""
        if self.bar is not None:
            self.bar.close()
        self.bar, self.phase = None, None

    def __enter__(self) -> "PhaseBars":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
