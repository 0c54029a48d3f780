"""Shared helpers for the benchmarks: thread pinning, timing statistics, a plain-text table, machine facts.

Call `pin_threads()` *before* NumPy (or any peer) is imported: the BLAS/OpenMP runtimes read their
thread-count variables once, when they load.  `limit_loaded_pools()` then caps whatever pools did
load (threadpoolctl), as a second line of defence.
"""
from __future__ import annotations

import gc
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "NUMEXPR_MAX_THREADS",
               "NUMBA_NUM_THREADS")


def pin_threads(n: int = 1) -> None:
    """Set every known thread-count variable to `n` (call before importing NumPy or a peer)."""
    for var in THREAD_VARS:
        os.environ[var] = str(n)


_limits = None


def limit_loaded_pools(n: int = 1) -> list[dict]:
    """Cap every native thread pool already loaded (BLAS, OpenMP) to `n` threads via threadpoolctl.

    Returns threadpoolctl's description of the pools (empty when threadpoolctl is absent)."""
    global _limits
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        return []
    _limits = threadpool_limits(limits=n)  # kept alive for the whole process
    return threadpool_info()


def cpu_name() -> str:
    """LLVM's name of the host CPU (what rlx-llvm compiles for)."""
    try:
        import llvmlite.binding as llvm
        return llvm.get_host_cpu_name()
    except Exception:  # noqa: BLE001 - informational only
        return platform.processor() or "unknown"


def cpu_model() -> str:
    """The marketing name from /proc/cpuinfo, if there is one."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cores() -> str:
    """Logical CPUs of the machine and those this process may run on."""
    total = os.cpu_count() or 0
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = total
    return f"{total} logical ({usable} usable by this process)"


def load_average() -> str:
    """The 1/5/15-minute load averages (how busy the shared machine is)."""
    try:
        return " / ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def host_features(wanted: Iterable[str] = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512bf16",
                                           "avx512fp16", "f16c", "fma")) -> str:
    """Which of the interesting ISA extensions LLVM sees on the host."""
    try:
        import llvmlite.binding as llvm
        feats = llvm.get_host_cpu_features()
        return " ".join(f for f in wanted if feats.get(f, False))
    except Exception:  # noqa: BLE001
        return "unknown"


def version_of(module_name: str) -> str | None:
    """`module.__version__` or None when the module cannot be imported."""
    try:
        mod = __import__(module_name)
    except Exception:  # noqa: BLE001 - a broken peer install is "not installed"
        return None
    return str(getattr(mod, "__version__", "?"))


# ---------------------------------------------------------------------------------------------- timing

@dataclass
class Timing:
    """Wall-clock samples of one implementation, in milliseconds."""

    samples: list[float] = field(default_factory=list)

    def _q(self, q: float) -> float:
        s = sorted(self.samples)
        if not s:
            return float("nan")
        pos = q * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    @property
    def median(self) -> float:
        return self._q(0.5)

    @property
    def p10(self) -> float:
        return self._q(0.1)

    @property
    def p90(self) -> float:
        return self._q(0.9)

    @property
    def n(self) -> int:
        return len(self.samples)


def _once(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def measure(fn: Callable[[], object], repeat: int = 20, warmup: int = 2, budget_s: float | None = None,
            min_repeat: int = 5) -> Timing:
    """Call `fn` `warmup` times untimed, then up to `repeat` timed times (stopping early, after at
    least `min_repeat` samples, once `budget_s` seconds have been spent timing)."""
    for _ in range(warmup):
        fn()
    gc_was = gc.isenabled()
    gc.disable()
    try:
        t = Timing()
        start = time.perf_counter()
        for _ in range(repeat):
            t.samples.append(_once(fn))
            if budget_s is not None and t.n >= min_repeat and time.perf_counter() - start > budget_s:
                break
        return t
    finally:
        if gc_was:
            gc.enable()


def median_ms(fn: Callable[[], object], repeat: int = 20, warmup: int = 2) -> float:
    """Median wall time of `fn` in milliseconds over `repeat` calls after `warmup` untimed calls."""
    return measure(fn, repeat=repeat, warmup=warmup).median


def interleaved(fns: dict[str, Callable[[], object]], rounds: int = 15, warmup: int = 1,
                budget_s: float | None = None, min_rounds: int = 5, settle: int = 0,
                before: Callable[[], object] | None = None) -> dict[str, Timing]:
    """Time several implementations in rounds — each round calls every one once, in an order that
    rotates from round to round — so that a noisy neighbour on a shared machine hurts them alike.

    `settle` untimed calls precede each timed one, so the previous implementation's thread pool
    has gone idle (spinning workers yield) and this one's caches are warm when the clock starts;
    `before`, when given, is called ahead of those (e.g. `wait_idle`: the previous one's spinning
    workers have stopped, so they neither share our cores nor count as our CPU time).
    Stops after `rounds` rounds, or earlier (after `min_rounds`) once `budget_s` seconds are spent."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    out = {name: Timing() for name in names}
    gc_was = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for r in range(rounds):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                if before is not None:
                    before()
                for _ in range(settle):
                    fns[name]()
                out[name].samples.append(_once(fns[name]))
            if budget_s is not None and r + 1 >= min_rounds and time.perf_counter() - start > budget_s:
                break
    finally:
        if gc_was:
            gc.enable()
    return out


def wait_idle(limit_s: float = 1.0, quiet_polls: int = 3, poll_s: float = 0.001) -> None:
    """Sleep until no other thread of this process is running (at most `limit_s`): a runtime's pool that
    just ran may spin on (ONNX Runtime's intra-op workers keep spinning for ~45 ms of CPU after a call).

    Reads each thread's state in /proc (`R` = on a CPU or queued for one) — `quiet_polls` polls in a
    row with none running.  Not the process's CPU time over a short window: the kernel adds a thread's
    time on another CPU only at that CPU's scheduler tick (every 1–10 ms), so a 2 ms window can read
    0 while a worker spins (it did here, and ORT's spin then shared our cores during the timed call)."""
    me = str(threading.get_native_id())
    end = time.perf_counter() + limit_s
    quiet = 0
    while time.perf_counter() < end and quiet < quiet_polls:
        time.sleep(poll_s)
        quiet = 0 if _others_running(me) else quiet + 1
    if quiet < quiet_polls and not os.path.isdir("/proc/self/task"):
        time.sleep(0.05)  # no /proc: outlast a typical spin instead


def _others_running(me: str) -> bool:
    """Whether a thread of this process other than `me` is running or runnable (Linux /proc)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return False
    for tid in tids:
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == "R":
            return True
    return False


def paired_ratio(a: Timing, b: Timing) -> float:
    """Median over rounds of a's sample / b's sample of the same round (both from `interleaved`)."""
    ratios = [x / y for x, y in zip(a.samples, b.samples) if y > 0]
    return Timing(ratios).median


def gbps(nbytes: float, ms: float) -> float:
    """Decimal GB/s (1 GB = 1e9 bytes) of moving `nbytes` in `ms` milliseconds."""
    return nbytes / (ms * 1e-3) / 1e9 if ms > 0 else float("nan")


# ----------------------------------------------------------------------------------------------- table

class Table:
    """A plain-text table: `add(row...)`, `rule()`, `note(text)`, then `print(table)`.

    Columns are right-aligned unless their name is listed in `left`."""

    def __init__(self, columns: Sequence[str], left: Iterable[str] = (), title: str | None = None) -> None:
        self.columns = list(columns)
        self.left = set(left)
        self.title = title
        self.rows: list[list[str] | None] = []   # None is a horizontal rule
        self.notes: list[str] = []

    def add(self, *cells: object) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"row has {len(cells)} cells, table has {len(self.columns)} columns")
        self.rows.append(["" if c is None else str(c) for c in cells])

    def rule(self) -> None:
        self.rows.append(None)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def render(self) -> str:
        widths = [len(c) for c in self.columns]
        for row in self.rows:
            if row is not None:
                widths = [max(w, len(c)) for w, c in zip(widths, row)]

        def line(cells: Sequence[str]) -> str:
            parts = [(c.ljust(w) if name in self.left else c.rjust(w))
                     for c, w, name in zip(cells, widths, self.columns)]
            return "  ".join(parts).rstrip()

        sep = "  ".join("-" * w for w in widths)
        out = []
        if self.title:
            out.append(self.title)
        out += [line(self.columns), sep]
        for row in self.rows:
            out.append(sep if row is None else line(row))
        out += [f"  {n}" for n in self.notes]
        return "\n".join(out)

    def __str__(self) -> str:
        return self.render()


def fmt_ms(ms: float) -> str:
    """Milliseconds with three significant figures, at most two decimals."""
    if ms != ms:
        return "-"
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    return f"{ms:.2f}"


def python_facts() -> str:
    return f"Python {platform.python_version()} ({sys.implementation.name}), {platform.system()} {platform.release()}"
