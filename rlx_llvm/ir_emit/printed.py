"""Module-wide helper functions emitted once per process: later modules reuse their printed text.

A GEMM register tile or A-panel packer (`gemm.TileShape`, `gemm._micro_panel_packer`) is the same
IR in every module of the process: its body depends only on its parameters and the host.  Building
it with llvmlite and printing it again for every new shape of a model costs ~35 ms of a MiniLM
shape's ~100 ms emission.  `define_once` builds it the first time, keeps its text and the
declarations it needed, and in later modules adds a function that prints that text — byte for byte
the IR the emitter would have printed.
"""
from __future__ import annotations

import re
import threading
from typing import Callable, Hashable

from llvmlite import ir

_printed: dict[Hashable, tuple[str, list[tuple[str, ir.FunctionType]]]] = {}
_lock = threading.Lock()
_GLOBAL_NAME = re.compile(r'@("[^"]*"|[-a-zA-Z$._0-9]+)')


class _PrintedFunction(ir.Function):
    """A function defined by the text printed for it in an earlier module."""

    def __init__(self, module: ir.Module, fnty: ir.FunctionType, name: str, text: str) -> None:
        super().__init__(module, fnty, name=name)
        self._text = text

    def descr(self, buf: list) -> None:
        buf.append(self._text)


def define_once(module: ir.Module, key: Hashable, fnty: ir.FunctionType, name: str, declare,
                emit: Callable[[ir.Function, Callable], None]) -> ir.Function:
    """The function `name` of `module`: defined by `emit(fn, declare)` the first time this process meets
    `key` (which must decide the body entirely), else by the text printed then.  `declare(name, fnty)`
    declares what the body calls (intrinsics); a reused body requests the same declarations in the same
    order, so the module's text is the one emission would have printed."""
    with _lock:
        seen = _printed.get(key)
    if seen is not None:
        text, requests = seen
        fn = _PrintedFunction(module, fnty, name, text)
        for callee, callee_ty in requests:
            declare(callee, callee_ty)
        return fn
    requests: list[tuple[str, ir.FunctionType]] = []

    def recording(callee: str, callee_ty: ir.FunctionType) -> ir.Function:
        requests.append((callee, callee_ty))
        return declare(callee, callee_ty)

    fn = ir.Function(module, fnty, name=name)
    emit(fn, recording)
    text = str(fn)
    names = {n.strip('"') for n in _GLOBAL_NAME.findall(text)}
    if names <= {name} | {callee for callee, _ in requests}:   # self-contained: itself and its declarations
        with _lock:
            _printed.setdefault(key, (text, requests))
    return fn
