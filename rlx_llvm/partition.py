"""Split one module's IR text into parts that compile on separate threads and load into one engine.

A part defines its share of the module's functions and declares the others it calls; MCJIT resolves
the calls between the loaded objects.  Nothing the optimizer sees across a function boundary is cut:

* a function with local linkage (`internal`/`private`: GEMM register tiles, parallel bodies, linked
  IR kernels), or one without `noinline` (which the inliner may take), stays in the part of every
  function that uses it — it has the same callers as in the whole module;
* a function that is called (a thunk function, a nested schedule's runner) stays with the functions
  it calls, so what the optimizer infers about a callee (captures, memory effects) reaches it as in
  the whole module;
* local data is copied into every part that reads it (data that names a global goes with its users).

Only the calls of the functions nobody calls — the segment drivers — cross parts.  So each function
but a driver gets the same IR and the same passes as in the whole module; a driver (calls and status
checks) may know less about the functions it calls.  A module with anything else defined outside
local linkage (an external global, an alias, a `linkonce`/`weak` function, module-level asm) is not
split.

`split` cuts a finished module's text; `Streamed` cuts parts while the module is still being emitted
and checks the same ties at the end.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(r'@("[^"]*"|[-a-zA-Z$._0-9]+)')
_LOCAL = re.compile(r'(?:define|@\S+\s*=)\s+(?:private|internal)\s')
_EXTERNAL_GLOBAL = re.compile(r'@\S+\s*=\s*(?:external|extern_weak)\s')
_UNSPLITTABLE = re.compile(r'define\s+(?:linkonce|linkonce_odr|weak|weak_odr|available_externally|common)\s')
_ATTRIBUTES = re.compile(r'attributes (#\d+) = \{(.*)\}')
_NOINLINE = re.compile(r'\bnoinline\b')


@dataclass
class _Item:
    """One top-level entity of the text: a function definition, a global, or a line every part keeps."""

    kind: str            # "define", "global", or "keep" (declarations, header, attributes, metadata)
    name: str | None
    text: str
    refs: tuple[str, ...] = ()

    @property
    def local(self) -> bool:
        return bool(_LOCAL.match(self.text))


@dataclass(frozen=True)
class Parts:
    """A module split for parallel compiles: the parts' texts and every function a part defines for
    the others (not an unresolved external of the part that declares it)."""

    texts: list[str]
    defined: frozenset[str]


def split(ir_text: str, parts: int, min_code_chars: int = 0) -> Parts:
    """`ir_text` as at most `parts` modules balanced by IR size (one, the text itself, when it cannot
    or need not be split: functions of fewer than `min_code_chars` characters in all — data, such as
    a segment's table of rows, is cheap to compile)."""
    if parts < 2:
        return Parts([ir_text], frozenset())
    items = _items(ir_text)
    defs = {it.name: it for it in items if it.kind != "keep"}
    whole = Parts([ir_text], frozenset())
    if sum(len(it.text) for it in defs.values() if it.kind == "define") < min_code_chars \
            or "\nmodule asm" in ir_text or any(_unsplittable(it) for it in defs.values()):
        return whole
    noinline = _noinline_groups(items)
    for it in defs.values():
        names = {_unquote(n) for n in _NAME.findall(it.text)}
        names.discard(it.name)
        it.refs = tuple(sorted(names.intersection(defs)))
    groups = _groups(defs, noinline)
    if len(groups) < 2:
        return whole
    bins = _balance(groups, defs, parts)
    return Parts([_part_text(items, defs, own) for own in bins],
                 frozenset(name for name, it in defs.items() if it.kind == "define" and not it.local))


_LOCAL_DEFINE = re.compile(r'define\s+(?:private|internal)\s')


def split_functions(ir_text: str, parts: int, min_code_chars: int = 0) -> Parts:
    """`ir_text` as at most `parts` modules with every function free to go to any part: for the quick
    tier, which runs no interprocedural pass (SROA, then codegen function by function), so a function
    compiles to the same code whoever its neighbours are.  Local functions become external (their
    names are unique in the module) so that another part can call them; local data is still copied
    into every part that reads it.  One part, the text itself, when `split` would not split either."""
    if parts < 2:
        return Parts([ir_text], frozenset())
    items = [_Item(it.kind, it.name, _LOCAL_DEFINE.sub("define ", it.text, count=1), it.refs)
             if it.kind == "define" else it for it in _items(ir_text)]
    defs = {it.name: it for it in items if it.kind != "keep"}
    whole = Parts([ir_text], frozenset())
    if sum(len(it.text) for it in defs.values() if it.kind == "define") < min_code_chars \
            or "\nmodule asm" in ir_text or any(_unsplittable(it) for it in defs.values()):
        return whole
    for it in defs.values():
        names = {_unquote(n) for n in _NAME.findall(it.text)}
        names.discard(it.name)
        it.refs = tuple(sorted(names.intersection(defs)))
    groups = [[name] for name, it in defs.items() if it.kind == "define"]
    if len(groups) < 2:
        return whole
    bins = _balance(groups, defs, parts)
    return Parts([_part_text(items, defs, own) for own in bins],
                 frozenset(name for name, it in defs.items() if it.kind == "define"))


class Streamed:
    """Parts cut from an `llvmlite.ir.Module` while it is being emitted, so that they compile while
    emission goes on.  `cut` turns the definitions added since the last part into a new part once
    they reach `min_chars` (with `last`, whatever is left): a part only uses what was emitted before
    it, so it is complete when cut.  `text()` is the module's text (as `str(module)`, printed once,
    piece by piece), and `holds()` whether the cuts kept every tie `split` keeps (a later function
    using an earlier part's internal helper breaks one): if not, drop the parts and split `text()`."""

    def __init__(self, module) -> None:
        self.module = module
        self.items: list[_Item] = []
        self.defs: dict[str, _Item] = {}
        self.printed: list[tuple[object, object]] = []   # each global and what decided its text
        self.start = 0                                    # the first item in no part yet
        self.owner: dict[str, int] = {}                   # definition → its part
        self.defined: set[str] = set()                    # external functions of the parts so far
        self.broken = False

    @property
    def parts(self) -> int:
        """Parts cut so far."""
        return len(set(self.owner.values()))

    def cut(self, min_chars: int, last: bool = False) -> "tuple[str, frozenset[str]] | None":
        """A new part's text and the functions earlier parts define for it, or None (not enough new
        definitions yet, or the module turned out not to be splittable)."""
        self._print_new()
        own = [it for it in self.items[self.start:] if it.kind != "keep"]
        size = sum(len(it.text) for it in own if it.kind == "define")
        if self.broken or not size or (size < min_chars and not last):
            return None
        provided = frozenset(self.defined)
        part = self.parts
        for it in own:
            self.owner[it.name] = part
            if it.kind == "define" and not it.local:
                self.defined.add(it.name)
        self.start = len(self.items)
        frame = self._frame()
        return _part_text(frame[0] + self.items + frame[1], self.defs, {it.name for it in own}), provided

    def text(self) -> str:
        """The whole module's text, exactly as `str(module)`."""
        self._print_new()
        head, tail = self._frame()
        return "\n".join(it.text for it in head + self.items + tail)

    def holds(self) -> bool:
        """Whether the parts cut so far, with the rest as one more part, keep every tie and every
        printed global is still as printed."""
        self._print_new()
        if self.broken or any(_changed(value, seen) for value, seen in self.printed):
            return False
        rest = self.parts
        return all(len({self.owner.get(name, rest) for name in group}) == 1
                   for group in _groups(self.defs, _noinline_groups(self.items)))

    def _print_new(self) -> None:
        """Print the globals added since the last call (definitions can only use what exists)."""
        values = list(self.module.globals.values())[len(self.printed):]
        new = []
        for value in values:
            text = str(value)
            kind = "define" if text.startswith("define") else \
                "global" if text.startswith("@") and not _EXTERNAL_GLOBAL.match(text) else "keep"
            it = _Item(kind, value.name if kind != "keep" else None, text)
            self.items.append(it)
            self.printed.append((value, _state(value)))
            if kind != "keep":
                self.defs[it.name] = it
                new.append(it)
                self.broken |= _unsplittable(it)
        for it in new:
            names = {_unquote(n) for n in _NAME.findall(it.text)}
            names.discard(it.name)
            it.refs = tuple(sorted(names.intersection(self.defs)))
            # a tie to an earlier part: the cuts cannot hold (known now, so no more parts are cut);
            # llvmlite prints attributes inline, never as groups
            self.broken |= any(ref in self.owner and _kept_with_users(self.defs[ref], set()) for ref in it.refs)

    def _frame(self) -> tuple[list[_Item], list[_Item]]:
        """The lines `str(module)` puts before the globals (header, named types) and after them (metadata)."""
        m = self.module
        head = [f'; ModuleID = "{m.name}"', f'target triple = "{m.triple}"', f'target datalayout = "{m.data_layout}"',
                ""] + [t.get_declaration() for t in m.get_identified_types().values()]
        return [_Item("keep", None, line) for line in head], \
            [_Item("keep", None, line) for line in m._get_metadata_lines()]


def _state(value) -> object:
    """What decides a global's printed kind: a function's block count, a variable's initializer."""
    return len(value.blocks) if hasattr(value, "blocks") else getattr(value, "initializer", None)


def _changed(value, seen: object) -> bool:
    now = _state(value)
    return now is not seen and now != seen


def _unquote(name: str) -> str:
    return name[1:-1] if name.startswith('"') else name


def _items(text: str) -> list[_Item]:
    """The top-level entities of textual IR as llvmlite or LLVM prints it."""
    out: list[_Item] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("define"):
            end = lines.index("}", i)
            out.append(_Item("define", _unquote(_NAME.search(line).group(1)), "\n".join(lines[i:end + 1])))
            i = end + 1
            continue
        if line.startswith("@") and not _EXTERNAL_GLOBAL.match(line):
            out.append(_Item("global", _unquote(_NAME.match(line).group(1)), line))
        else:
            out.append(_Item("keep", None, line))
        i += 1
    return out


def _unsplittable(it: _Item) -> bool:
    """A definition that cannot live in one part only: a global, alias or weak function seen from outside."""
    return (it.kind == "global" and not it.local) or bool(_UNSPLITTABLE.match(it.text))


def _noinline_groups(items: list[_Item]) -> set[str]:
    """The attribute groups (`#3`) that hold `noinline`."""
    groups = set()
    for it in items:
        m = _ATTRIBUTES.match(it.text) if it.kind == "keep" else None
        if m and _NOINLINE.search(m.group(2)):
            groups.add(m.group(1))
    return groups


def _kept_with_users(it: _Item, noinline: set[str]) -> bool:
    """Whether `it` must sit in the part of every function that names it."""
    if it.kind == "global":
        return it.local and bool(it.refs)
    header = it.text.split("\n", 1)[0]
    return it.local or not (_NOINLINE.search(header) or set(re.findall(r"#\d+", header)) & noinline)


def _groups(defs: dict[str, _Item], noinline: set[str]) -> list[list[str]]:
    """Definitions that must share a part, in text order: each user with what it keeps, and each
    called function (a thunk function, say) with the functions it calls — only the calls of the
    functions nobody calls (the segment drivers) may cross parts."""
    parent = {name: name for name in defs}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    order = {name: i for i, name in enumerate(defs)}
    kept = {name for name, it in defs.items() if _kept_with_users(it, noinline)}
    called = {ref for it in defs.values() for ref in it.refs}
    for name, it in defs.items():
        for ref in it.refs:
            if ref in kept or (name in called and defs[ref].kind == "define"):
                a, b = sorted((root(name), root(ref)), key=order.__getitem__)
                parent[b] = a
    groups: dict[str, list[str]] = {}
    for name, it in defs.items():
        if it.kind == "define" or name in kept:
            groups.setdefault(root(name), []).append(name)
    return list(groups.values())


def _balance(groups: list[list[str]], defs: dict[str, _Item], parts: int) -> list[set[str]]:
    """Largest group first onto the lightest part (by IR characters); empty parts dropped."""
    def weight(group: list[str]) -> int:
        return sum(len(defs[n].text) for n in group)

    bins: list[tuple[int, int, set[str]]] = [(0, k, set()) for k in range(parts)]
    for group in sorted(groups, key=weight, reverse=True):
        load, k, own = min(bins, key=lambda b: b[:2])
        own.update(group)
        bins[k] = (load + weight(group), k, own)
    return [own for _, _, own in bins if own]


def _part_text(items: list[_Item], defs: dict[str, _Item], own: set[str]) -> str:
    """One part: every kept line, its own definitions, the local data they read, and a declaration
    of each function of another part they call."""
    need, todo = set(own), list(own)
    while todo:
        for ref in defs[todo.pop()].refs:
            if ref not in need and defs[ref].local and defs[ref].kind == "global":
                need.add(ref)
                todo.append(ref)
    used = {ref for name in need for ref in defs[name].refs}
    lines = []
    for it in items:
        if it.kind == "keep" or it.name in need:
            lines.append(it.text)
        elif it.name in used and it.kind == "define":
            lines.append(_declaration(it))
    return "\n".join(lines)


def _declaration(it: _Item) -> str:
    """`declare …` for a function defined in another part (its header without the body)."""
    header = it.text.split("\n", 1)[0].rstrip()
    return "declare" + header.removesuffix("{").rstrip()[len("define"):]
