"""A tiny JIT harness for element-op tests: `jit.build(key, [Kernel(...), ...])`.

Each `Kernel(name, emit, ins, outs)` becomes `void name(ptr in0, …, ptr out0, …, i64 n)` with an
explicit `<W x T>` main loop and a scalar tail that run the *same* emitter (`emit(b, *values)` →
one value or a tuple, one per output).  All kernels of one `build` call share one module (one
O3 + codegen), cached per `key` for the whole session; the result maps names to NumPy callables
and keeps the optimized IR and assembly for inspection.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from llvmlite import binding as llvm
from llvmlite import ir

_TYPES = {"f32": (ir.FloatType(), np.float32), "f64": (ir.DoubleType(), np.float64),
          "i64": (ir.IntType(64), np.int64), "i32": (ir.IntType(32), np.int32),
          "bool": (ir.IntType(8), np.uint8)}
PTR = ir.PointerType()
I64 = ir.IntType(64)


@dataclass(frozen=True)
class Kernel:
    """One element-wise kernel: `emit(builder, *inputs)` on scalars and on `<width x T>` vectors."""

    name: str
    emit: Callable
    ins: tuple = ("f32", "f32")
    outs: tuple = ("f32",)
    width: int = 16


class Compiled:
    """The kernels of one module as NumPy callables (`fns[name](*arrays)`), plus IR / asm text."""

    def __init__(self, fns: dict, ir_text: str, asm: str, owner: "JitHarness") -> None:
        self.fns, self.ir, self.asm = fns, ir_text, asm
        self._owner = owner  # keeps the engine (and so the machine code) alive

    def __getitem__(self, name: str) -> Callable:
        return self.fns[name]

    def function_asm(self, name: str) -> str:
        """The assembly of one function (from its label to the next `.size`)."""
        start = self.asm.index(f"\n{name}:")
        end = self.asm.index(".size", start)
        return self.asm[start:end]


def _vec(ty: ir.Type, w: int) -> ir.Type:
    return ty if w == 1 else ir.VectorType(ty, w)


def _emit_body(b: ir.IRBuilder, k: Kernel, args, index, w: int) -> None:
    ins, outs = args[:len(k.ins)], args[len(k.ins):len(k.ins) + len(k.outs)]
    vals = []
    for ptr, name in zip(ins, k.ins):
        ety = _TYPES[name][0]
        p = b.gep(ptr, [index], inbounds=True, source_etype=ety)
        ld = b.load(p, typ=_vec(ety, w))
        ld.align = _size(ety)
        vals.append(ld)
    res = k.emit(b, *vals)
    res = res if isinstance(res, tuple) else (res,)
    assert len(res) == len(outs), f"{k.name}: emitter gave {len(res)} results for {len(outs)} outputs"
    for ptr, name, v in zip(outs, k.outs, res):
        ety = _TYPES[name][0]
        if str(v.type).endswith("i1>") or str(v.type) == "i1":
            v = b.zext(v, _vec(ety, w))
        p = b.gep(ptr, [index], inbounds=True, source_etype=ety)
        st = b.store(v, p)
        st.align = _size(ety)


def _size(ety: ir.Type) -> int:
    return {"float": 4, "double": 8}.get(str(ety)) or ety.width // 8


def _define(module: ir.Module, k: Kernel) -> None:
    fnty = ir.FunctionType(ir.VoidType(), [PTR] * (len(k.ins) + len(k.outs)) + [I64])
    fn = ir.Function(module, fnty, k.name)
    n = fn.args[-1]
    entry, vhead, vbody, shead, sbody, done = (fn.append_basic_block(s) for s in
                                               ("entry", "vhead", "vbody", "shead", "sbody", "done"))
    b = ir.IRBuilder(entry)
    nvec = b.and_(n, I64(~(k.width - 1)))
    b.branch(vhead)
    b.position_at_end(vhead)
    i = b.phi(I64)
    i.add_incoming(I64(0), entry)
    b.cbranch(b.icmp_signed("<", i, nvec), vbody, shead)
    b.position_at_end(vbody)
    _emit_body(b, k, fn.args, i, k.width)
    i.add_incoming(b.add(i, I64(k.width)), b.block)
    b.branch(vhead)
    b.position_at_end(shead)
    j = b.phi(I64)
    j.add_incoming(i, vhead)
    b.cbranch(b.icmp_signed("<", j, n), sbody, done)
    b.position_at_end(sbody)
    _emit_body(b, k, fn.args, j, 1)
    j.add_incoming(b.add(j, I64(1)), b.block)
    b.branch(shead)
    b.position_at_end(done)
    b.ret_void()


class JitHarness:
    """One MCJIT engine for the session; `build` compiles a list of kernels into one module."""

    def __init__(self) -> None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self._cache: dict = {}
        self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self._machine())
        self._opt_tm = self._machine()
        self._lib = False

    @staticmethod
    def _machine():
        target = llvm.Target.from_triple(llvm.get_process_triple())
        return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                            features=llvm.get_host_cpu_features().flatten(),
                                            opt=3, codemodel="jitdefault", jit=True)

    def build(self, key: str, kernels: list[Kernel]) -> Compiled:
        if key in self._cache:
            return self._cache[key]
        module = ir.Module(name=key)
        module.triple = llvm.get_process_triple()
        module.data_layout = str(self._opt_tm.target_data)
        for k in kernels:
            _define(module, k)
        mod = llvm.parse_assembly(str(module))
        mod.verify()
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        # the kernels are explicitly vectorized: skip the loop vectorizer / unroller (compile time ÷3)
        pto.loop_vectorization = False
        pto.slp_vectorization = False
        pto.loop_unrolling = False
        pb = llvm.create_pass_builder(self._opt_tm, pto)
        pb.getModulePassManager().run(mod, pb)
        asm = self._opt_tm.emit_assembly(mod)
        ir_text = str(mod)
        for f in mod.functions:
            if f.is_declaration and not f.name.startswith("llvm."):
                if not self._lib:
                    llvm.load_library_permanently("libm.so.6")
                    self._lib = True
                assert llvm.address_of_symbol(f.name), f"unresolved external {f.name}"
        self._engine.add_module(mod)
        self._engine.finalize_object()
        fns = {k.name: self._wrap(k, self._engine.get_function_address(k.name)) for k in kernels}
        compiled = Compiled(fns, ir_text, asm, self)
        self._cache[key] = compiled
        return compiled

    @staticmethod
    def _wrap(k: Kernel, addr: int) -> Callable:
        assert addr, k.name
        cfn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * (len(k.ins) + len(k.outs))), ctypes.c_int64)(addr)

        def call(*arrays):
            assert len(arrays) == len(k.ins), f"{k.name} takes {len(k.ins)} arrays"
            n = np.broadcast_shapes(*(np.shape(a) for a in arrays)) if arrays else ()
            ins = [np.ascontiguousarray(np.broadcast_to(np.asarray(a, _TYPES[t][1]), n)).reshape(-1)
                   for a, t in zip(arrays, k.ins)]
            count = ins[0].size if ins else 0
            outs = [np.empty(count, _TYPES[t][1]) for t in k.outs]
            cfn(*[a.ctypes.data for a in ins + outs], count)
            outs = [o.reshape(n) for o in outs]
            return outs[0] if len(outs) == 1 else tuple(outs)
        call.kernel = k
        return call


@pytest.fixture(scope="session")
def jit() -> JitHarness:
    """The session's JIT harness (one engine, modules cached by key)."""
    return JitHarness()
