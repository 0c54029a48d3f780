"""Reading what a Program became: the per-thunk report, and one thunk's IR or assembly.

`function_ir(text, symbol)` and `function_asm(text, symbol)` cut one thunk's function out of a
module's IR or assembly, following calls into the functions it owns: its parallel bodies
(`t3_x.par1`) and a shared body (`t2_x.body`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterator


@dataclass
class ThunkReport:
    """One row of `Program.report()`."""

    index: int
    kind: str
    path: str
    symbol: str
    emit_ms: float
    body: str = ""
    """The shared body this thunk's function calls ("" when it has its own code)."""
    within: str = ""
    """For a thunk of a nested schedule (a Scan/CustomFn body): the body's function, e.g. `t3_scan.body`;
    `index` is then its index in that body."""


@dataclass
class Report:
    """Per-thunk lowering paths plus module-level compile timings."""

    rows: list[ThunkReport]
    timings_ms: dict[str, float]
    from_cache: bool
    nested: dict[int, list[ThunkReport]] = field(default_factory=dict)
    """Top-level index → the thunks of its nested schedules (Scan/CustomFn bodies), in emission order."""

    def __iter__(self) -> Iterator[ThunkReport]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> ThunkReport:
        return self.rows[i]

    def __str__(self) -> str:
        lines = [f"{'#':>4}  {'kind':<28} {'path':<6} {'symbol':<40} emit ms"]
        for r in self.rows:
            lines.append(f"{r.index:>4}  {r.kind:<28} {r.path:<6} {r.symbol:<40} {r.emit_ms:7.2f}"
                         + (f"  → {r.body}" if r.body else ""))
            lines += [f"{'↳':>6} {n.index:<3}{n.kind:<24} {n.path:<6} {n.symbol}" for n in self.nested.get(r.index, ())]
        t = ", ".join(f"{k} {v:.1f} ms" for k, v in self.timings_ms.items())
        lines.append(f"module: {t}" + (" (object loaded from cache)" if self.from_cache else ""))
        return "\n".join(lines)


def function_ir(text: str, symbol: str, header: str = "") -> str:
    """The definition of `symbol` and of the thunk functions it calls, transitively: its parallel
    bodies (`t3_x.par1`) and a shared body (`t2_x.body`), each once."""
    defs = _definitions(text)
    out, todo, seen = [], [symbol], set()
    while todo:
        name = todo.pop(0)
        if name in seen or name not in defs:
            continue
        seen.add(name)
        out.append(defs[name])
        todo += [m for m in _CALLED.findall(defs[name]) if m not in seen]
    return "\n".join(([header] if header else []) + ["\n\n".join(out)])


_DEFINE = re.compile(r'^define [^@]*@"?([^"(]+)"?\(', re.M)
_CALLED = re.compile(r'@"?(t\d+_[\w.]+)"?')


def _definitions(text: str) -> dict[str, str]:
    """Function name → its `define … { … }` text."""
    defs, lines, name = {}, [], None
    for line in text.splitlines():
        if name is None:
            m = _DEFINE.match(line)
            if m:
                name, lines = m.group(1), [line]
                if line.rstrip().endswith("}"):
                    defs[name], name = line, None
            continue
        lines.append(line)
        if line.startswith("}"):
            defs[name], name = "\n".join(lines), None
    return defs


def function_asm(text: str, symbol: str) -> str:
    """The assembly of `symbol` and of the thunk functions it calls (as `function_ir`)."""
    out, todo, seen = [], [symbol], set()
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        block = _asm_function(text, name)
        if block:
            out.append(block)
            todo += [m for m in re.findall(r"\b(t\d+_[\w.]+)\b", block) if m not in seen]
    return "\n\n".join(out)


def _asm_function(text: str, symbol: str) -> str:
    lines, out, inside = text.splitlines(), [], False
    for line in lines:
        if line.startswith(f"{symbol}:"):
            inside = True
        if inside:
            out.append(line)
            if line.strip().startswith(".Lfunc_end") or line.strip().startswith(f".size\t{symbol}"):
                break
    return "\n".join(out)
