"""Examples of CustomOp, on the demo kernel `rlx_demo_scaled_add` registered when this module is imported:
`out = attrs[0] · x + y` as hand-written LLVM IR with an 8-lane vector loop and a scalar tail."""
from __future__ import annotations

from .. import thunks as T
from ..custom_ops import register_custom_op, registered_custom_ops
from ..errors import ValidationError
from .layout import Example, example

DEMO = "rlx_demo_scaled_add"
DEMO_IR = """
define i32 @rlx_demo_scaled_add(ptr %inputs, ptr %lens, i32 %n_inputs, ptr %out, i64 %n, ptr %attrs, i64 %n_attrs) {
entry:
  %two = icmp eq i32 %n_inputs, 2
  %one_attr = icmp eq i64 %n_attrs, 1
  %ok = and i1 %two, %one_attr
  br i1 %ok, label %setup, label %bad
bad:
  ret i32 1
setup:
  %x = load ptr, ptr %inputs
  %y.at = getelementptr ptr, ptr %inputs, i64 1
  %y = load ptr, ptr %y.at
  %a.byte = load i8, ptr %attrs
  %a = uitofp i8 %a.byte to float
  %a.one = insertelement <8 x float> poison, float %a, i64 0
  %a.vec = shufflevector <8 x float> %a.one, <8 x float> poison, <8 x i32> zeroinitializer
  %whole = and i64 %n, -8
  br label %vloop
vloop:
  %i = phi i64 [0, %setup], [%i.next, %vbody]
  %more = icmp ult i64 %i, %whole
  br i1 %more, label %vbody, label %tail
vbody:
  %xv.at = getelementptr float, ptr %x, i64 %i
  %xv = load <8 x float>, ptr %xv.at, align 4
  %yv.at = getelementptr float, ptr %y, i64 %i
  %yv = load <8 x float>, ptr %yv.at, align 4
  %ax = fmul <8 x float> %xv, %a.vec
  %sum = fadd <8 x float> %ax, %yv
  %ov.at = getelementptr float, ptr %out, i64 %i
  store <8 x float> %sum, ptr %ov.at, align 4
  %i.next = add i64 %i, 8
  br label %vloop
tail:
  %j = phi i64 [%i, %vloop], [%j.next, %tbody]
  %tmore = icmp ult i64 %j, %n
  br i1 %tmore, label %tbody, label %done
tbody:
  %xs.at = getelementptr float, ptr %x, i64 %j
  %xs = load float, ptr %xs.at, align 4
  %ys.at = getelementptr float, ptr %y, i64 %j
  %ys = load float, ptr %ys.at, align 4
  %axs = fmul float %xs, %a
  %sums = fadd float %axs, %ys
  %os.at = getelementptr float, ptr %out, i64 %j
  store float %sums, ptr %os.at, align 4
  %j.next = add i64 %j, 1
  br label %tail
done:
  ret i32 0
}
"""
"""`out[i] = attrs[0] · inputs[0][i] + inputs[1][i]` (attrs[0] an unsigned byte), any length."""


def check_scaled_add(t: T.CustomOp) -> None:
    """Two inputs and the output of one length, one attribute byte."""
    if len(t.inputs) != 2 or len(t.attrs) != 1:
        raise ValidationError(f"{DEMO} takes 2 inputs and 1 attribute byte, got {len(t.inputs)} and {len(t.attrs)}",
                              field="inputs")
    if len({t.inputs[0][1], t.inputs[1][1], t.output[1]}) != 1:
        raise ValidationError(f"{DEMO} needs operands of one length", field="inputs")


if DEMO not in registered_custom_ops():
    register_custom_op(DEMO, DEMO_IR, check=check_scaled_add)


def scaled_add(n: int, scale: int) -> T.CustomOp:
    """A CustomOp of the demo kernel over `n` elements (placeholder offsets)."""
    return T.CustomOp(kernel=DEMO, inputs=((0, n, (n,)), (0, n, (n,))), output=(0, n, (n,)), attrs=(scale,))


def custom_op() -> list[Example]:
    """The demo IR kernel over 37 elements (four 8-lane vectors and a tail of 5), bit-exact."""
    return [example("CustomOp/scaled_add_n37", scaled_add(37, 3), rtol=0.0)]
