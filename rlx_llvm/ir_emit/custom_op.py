"""CustomOp: a call of a registered kernel (`rlx_llvm.custom_ops`, docs/custom-ops.md) through its C ABI.

    i32 kernel(ptr inputs, ptr lens, i32 n_inputs, ptr out, i64 out_len, ptr attrs, i64 n_attrs)

The operand pointers go in an entry-block table; lens and attrs are private constants of the module.
An IR kernel is linked into the module (`custom_ops.link_ir_kernels`) and guarded by its marker
symbol; C and Python kernels are external symbols resolved from the registry when the object loads.
A non-zero kernel status s becomes the thunk status `FAILED | s << 8`.
"""
from __future__ import annotations

import math

from llvmlite import ir

from .. import custom_ops
from .. import thunks as T
from ..errors import ValidationError
from ..registry import lowering
from .context import EmitContext
from .toolkit import I32, I64, I8, PTR, fail_unless

KERNEL_TYPE = ir.FunctionType(I32, [PTR, PTR, I32, PTR, I64, PTR, I64])


def check_custom_op(t: T.CustomOp) -> None:
    """A registered kernel; every operand's `len` equals the product of its shape; the kernel's own check."""
    kernel = custom_ops.lookup(t.kernel)
    operands = [(f"inputs[{i}]", op) for i, op in enumerate(t.inputs)] + [("output", t.output)]
    for field, (_, count, shape) in operands:
        if count != math.prod(shape):
            raise ValidationError(f"len {count} is not the product of shape {tuple(shape)} "
                                  f"({math.prod(shape)})", field=field)
    if kernel.check is not None:
        try:
            kernel.check(t)
        except ValidationError:
            raise
        except Exception as exc:
            raise ValidationError(f"custom op {t.kernel!r} refused its operands: {exc}", field="kernel") from exc


def constant(ctx: EmitContext, name: str, ty: ir.Type, values: list[int]) -> ir.Value:
    """A private constant array `@<thunk>.<name>` of this module (one element at least)."""
    array = ir.ArrayType(ty, max(len(values), 1))
    g = ir.GlobalVariable(ctx.module, array, name=f"{ctx.fn.name}.{name}")
    g.linkage, g.global_constant, g.unnamed_addr = "private", True, True
    g.initializer = ir.Constant(array, [ty(v) for v in values] or [ty(0)])
    return g


def external_byte(ctx: EmitContext, name: str) -> ir.Value:
    """The external `i8` global `name`, declared once per module."""
    existing = ctx.module.globals.get(name)
    return existing if existing is not None else ir.GlobalVariable(ctx.module, I8, name=name)


@lowering(T.CustomOp, path="llvm|c|python", check=check_custom_op)
def custom_op(ctx: EmitContext, t: T.CustomOp) -> None:
    kernel = custom_ops.lookup(t.kernel)
    b = ctx.b
    if kernel.kind == "llvm":   # refuse to run if this IR is no longer the registered one
        registered = b.load(external_byte(ctx, kernel.marker), typ=I8)
        fail_unless(ctx, b.icmp_unsigned("!=", registered, I8(0)), I32(custom_ops.thunk_status(-1) - (1 << 32)))
    with b.goto_entry_block():
        table = b.alloca(ir.ArrayType(PTR, max(len(t.inputs), 1)), name="inputs")
    for i, (offset, _, _) in enumerate(t.inputs):
        b.store(ctx.addr(offset), b.gep(table, [I32(0), I32(i)], inbounds=True))
    lens = constant(ctx, "lens", I64, [count for _, count, _ in t.inputs])
    attrs = constant(ctx, "attrs", I8, list(t.attrs))
    out, out_len, _ = t.output
    status = b.call(ctx.declare(kernel.symbol, KERNEL_TYPE),
                    [table, lens, I32(len(t.inputs)), ctx.addr(out), I64(out_len), attrs, I64(len(t.attrs))])
    failed = b.or_(b.shl(status, I32(8)), I32(custom_ops.FAILED))
    fail_unless(ctx, b.icmp_unsigned("==", status, I32(0)), failed)
    ctx.note_path(kernel.kind)
