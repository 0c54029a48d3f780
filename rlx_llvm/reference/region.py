"""NumPy reference of ElementwiseRegion (semantics.md §2.10)."""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..dtypes import DType, LaneKind
from ..ops import ChainOperand, ChainStep
from . import elementmath as em
from . import reference, view
from .halves import bf16_bits_to_f32, f32_to_bf16_bits

_LANE_NP = {LaneKind.F32: np.float32, LaneKind.F16: np.float16, LaneKind.Bf16: np.uint16,
            LaneKind.F64: np.float64}


def load_lane(arena: np.ndarray, lane: LaneKind, offset: int, count: int) -> np.ndarray:
    """Read `count` lanes and widen them to f32."""
    raw = view(arena, offset, _LANE_NP[lane], count)
    if lane is LaneKind.Bf16:
        return bf16_bits_to_f32(raw)
    return raw.astype(np.float32)


def store_lane(arena: np.ndarray, lane: LaneKind, offset: int, values: np.ndarray) -> None:
    """Narrow f32 values to the lane (halves RNE) and write them."""
    out = view(arena, offset, _LANE_NP[lane], values.size)
    out[:] = f32_to_bf16_bits(values) if lane is LaneKind.Bf16 else values.astype(_LANE_NP[lane])


_INT_RANGE = {DType.I8: (-2**7, 2**7 - 1), DType.I16: (-2**15, 2**15 - 1), DType.I32: (-2**31, 2**31 - 1),
              DType.I64: (-2**63, 2**63 - 1), DType.U8: (0, 255), DType.U32: (0, 2**32 - 1)}


def region_cast(dtype: DType, x: np.ndarray) -> np.ndarray:
    """Mid-chain Cast: halves round-trip RNE, ints truncate + saturate (NaN → 0), Bool → 0/1."""
    if dtype in (DType.F32, DType.F64, DType.C64, DType.C128):
        return x
    if dtype is DType.F16:
        return x.astype(np.float16).astype(np.float32)
    if dtype is DType.BF16:
        return bf16_bits_to_f32(f32_to_bf16_bits(x))
    if dtype is DType.Bool:
        return (x != 0).astype(np.float32)
    lo, hi = _INT_RANGE[dtype]
    t = np.trunc(np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=hi, neginf=lo))
    return (np.clip(t, lo, hi) + 0.0).astype(np.float32)  # + 0.0: an integer has no −0 (−0.5 → +0)


@reference(T.ElementwiseRegion)
def elementwise_region(arena: np.ndarray, t) -> None:
    """Evaluate the chain over all `len` output elements at once."""
    n = t.len
    if n == 0 or not t.chain:
        return
    gid = np.arange(n)
    inputs = {}
    for i, off in enumerate(t.input_offs):
        lane = t.in_lanes[i]
        if t.scalar_input_mask >> i & 1:
            inputs[i] = np.broadcast_to(load_lane(arena, lane, off, 1), (n,))
        elif t.input_modulus[i]:
            m = t.input_modulus[i]
            inputs[i] = load_lane(arena, lane, off, m)[gid % m]
        else:
            inputs[i] = load_lane(arena, lane, off, n)
    regs: list[np.ndarray] = []

    def read(op):
        return regs[op.index] if isinstance(op, ChainOperand.Step) else inputs[op.index]

    with np.errstate(all="ignore"):
        for step in t.chain:
            if isinstance(step, ChainStep.Activation):
                r = em.activation(step.act, read(step.x), region=True)
            elif isinstance(step, ChainStep.Cast):
                r = region_cast(step.dtype, read(step.x))
            elif isinstance(step, ChainStep.Binary):
                r = em.binary(step.op, read(step.lhs), read(step.rhs))
            elif isinstance(step, ChainStep.Compare):
                r = em.compare(step.op, read(step.lhs), read(step.rhs)).astype(np.float32)
            else:
                c = read(step.cond)
                r = np.where(c != 0, read(step.on_true), read(step.on_false))  # NaN != 0 is truthy
            regs.append(np.asarray(r, dtype=np.float32))
    store_lane(arena, t.out_lane, t.dst, regs[-1])
