"""Quick-tier kernel library: shape-independent helper functions compiled once per process.

Every module that runs a GEMM defines the same register tiles and A-panel packers
(`rlx.tile.*`, `rlx.pack_a.*`: internal functions whose code depends only on their name's
parameters and the host, never on a shape).  A new shape of a model compiles them again — about a
fifth of MiniLM's quick-tier compile time.  At the quick tier (`jit.compile_quick`) `borrow`
gives a module a declaration of each such function the library holds (resolved with
`llvm.add_symbol`); one it does not hold yet the module compiles itself, while the library compiles
it once, in a module of its own kept for the life of the process, on a compile thread.  A function is borrowed
only when its definition is the very text the library compiled (same name, same body): the quick
code is then the same machine code either way.  O3 (tier 2, and everything the object cache holds)
never borrows: there the helpers stay internal, where the optimizer may specialize them.
"""
from __future__ import annotations

import os
import threading

from llvmlite import binding as llvm

from .partition import _NAME, _declaration, _items, _unquote

PREFIXES = ("rlx.tile.", "rlx.pack_a.")
"""Names of the module-wide helpers whose code depends only on the name (and the host)."""

_lock = threading.Lock()
_compiled: dict[str, str] = {}   # name → the definition text compiled into the library
_engines: list = []              # the library's engines, alive for the process (their code is called)
_pending: set[str] = set()       # helpers being compiled into the library on a compile thread


def _shareable(it) -> bool:
    """An internal helper the library can hold: named by its parameters, calling only intrinsics."""
    if it.kind != "define" or not it.name.startswith(PREFIXES) or not it.local or "!" in it.text:
        return False
    refs = {_unquote(n) for n in _NAME.findall(it.text)} - {it.name}
    return all(r.startswith("llvm.") for r in refs)


def _external(text: str) -> str:
    """The definition with external linkage (the library exports it)."""
    header, rest = text.split("\n", 1)
    return header.replace("define internal ", "define ", 1) + "\n" + rest


def borrow(ir_text: str, compile_quick) -> str:
    """`ir_text` with every shareable helper the library holds declared instead of defined.  The
    helpers it does not hold yet stay defined here (this compile waits for nothing) and are compiled
    into the library in the background (`compile_quick` without borrowing, on a compile thread), for
    the modules that follow."""
    items = _items(ir_text)
    helpers = [it for it in items if _shareable(it)]
    if not helpers:
        return ir_text
    with _lock:
        borrowed = {it.name for it in helpers if _compiled.get(it.name) == _external(it.text)}
        new = [it for it in helpers if it.name not in _compiled and it.name not in _pending]
        _pending.update(it.name for it in new)
    if new:
        from .jit import _compile_threads
        _compile_threads(1).submit(_lend, items, new, compile_quick)
    if not borrowed:
        return ir_text
    return "\n".join(_declaration(it).replace("declare internal ", "declare ", 1) if it.name in borrowed
                     else it.text for it in items)


def _lend(items: list, new: list, compile_quick) -> None:
    """Compile `new` helpers into one library module, load it for good and publish their addresses
    (a failure only means they are not lent: every module keeps its own)."""
    from .jit import Engine
    try:
        header = [it.text for it in items if it.kind == "keep" and it.text.startswith(("target ", "source_filename"))]
        intrinsics = [it.text for it in items if it.kind == "keep" and it.text.startswith("declare")
                      and "@llvm." in it.text]
        text = "\n".join(header + intrinsics + [_external(it.text) for it in new]) + "\n"
        engine = Engine()
        engine.load(compile_quick(text, borrow=False))
        addresses = {it.name: engine.address(it.name) for it in new}
        with _lock:
            _engines.append(engine)
            for it in new:
                llvm.add_symbol(it.name, addresses[it.name])
                _compiled[it.name] = _external(it.text)
    finally:
        with _lock:
            _pending.difference_update(it.name for it in new)


def settled(timeout: float = 30.0) -> bool:
    """Wait until no helper is being compiled into the library (tests, benchmarks); False on timeout."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with _lock:
            if not _pending:
                return True
        time.sleep(0.005)
    return False


def _after_fork() -> None:
    """In a forked child: no library compile is in flight there."""
    global _lock
    _lock = threading.Lock()
    _pending.clear()


os.register_at_fork(after_in_child=_after_fork)


def names() -> list[str]:
    """The helpers the library holds (for tests and reports)."""
    with _lock:
        return sorted(_compiled)
