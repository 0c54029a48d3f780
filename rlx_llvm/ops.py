"""The enums and small value types the thunks reference (rlx_ir::op and friends).

Plain Rust enums are `enum.Enum`s with the Rust variant names; enums whose variants carry data
are `SumType`s: `MaskKind.Causal`, `MaskKind.SlidingWindow(128)`, `ChainOperand.Input(0)`,
`ChainStep.Binary(BinaryOp.Add, ChainOperand.Input(0), ChainOperand.Step(1))`,
`QuantScheme.Int8Block(block_size=32)`.  A Rust variant named `None` is spelled `None_`.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from ._sumtype import SumType
from .dtypes import DType


def _plain(name: str, variants: str, doc: str) -> type[enum.Enum]:
    members = [(v, v) for v in variants.split()]
    cls = enum.Enum(name, members, module=__name__)
    cls.__doc__ = doc
    return cls


class Activation(enum.Enum):
    """Element-wise activation kinds, in RLX's variant order."""

    Gelu = "Gelu"
    GeluApprox = "GeluApprox"
    Silu = "Silu"
    Relu = "Relu"
    Sigmoid = "Sigmoid"
    Tanh = "Tanh"
    Exp = "Exp"
    Log = "Log"
    Sqrt = "Sqrt"
    Rsqrt = "Rsqrt"
    Neg = "Neg"
    Abs = "Abs"
    Sin = "Sin"
    Cos = "Cos"
    Tan = "Tan"
    Atan = "Atan"
    Recip = "Recip"
    Round = "Round"
    Floor = "Floor"
    Ceil = "Ceil"
    Sign = "Sign"
    Softplus = "Softplus"
    Elu = "Elu"
    Erf = "Erf"
    HardSwish = "HardSwish"
    HardSigmoid = "HardSigmoid"
    Mish = "Mish"
    Softsign = "Softsign"
    LogSigmoid = "LogSigmoid"


class BinaryOp(enum.Enum):
    """Element-wise binary operators (f32 semantics in semantics.md §2.4)."""

    Add = "Add"
    Sub = "Sub"
    Mul = "Mul"
    Div = "Div"
    Max = "Max"
    Min = "Min"
    Pow = "Pow"
    Mod = "Mod"
    BitAnd = "BitAnd"
    BitOr = "BitOr"
    BitXor = "BitXor"
    Shl = "Shl"
    Shr = "Shr"
    Atan2 = "Atan2"


class CmpOp(enum.Enum):
    """Comparisons; IEEE: every comparison with NaN is false except Ne."""

    Eq = "Eq"
    Ne = "Ne"
    Lt = "Lt"
    Le = "Le"
    Gt = "Gt"
    Ge = "Ge"


class ReduceOp(enum.Enum):
    """Reduction kinds; Max/Min ignore NaN."""

    Sum = "Sum"
    Mean = "Mean"
    Max = "Max"
    Min = "Min"
    Prod = "Prod"


class ScatterNdReduction(enum.Enum):
    """How a scatter combines an update with the existing value (`None_` overwrites)."""

    None_ = "None"
    Add = "Add"
    Mul = "Mul"
    Max = "Max"
    Min = "Min"

    @classmethod
    def _missing_(cls, value: object) -> "ScatterNdReduction | None":
        return cls.None_ if value == "None" else None


class SteKind(enum.Enum):
    """Straight-through estimator variant of FakeQuantize's backward."""

    Identity = "Identity"
    ClippedIdentity = "ClippedIdentity"
    Tanh = "Tanh"
    HardTanh = "HardTanh"


class AttentionBwdWrt(enum.Enum):
    """Which gradient an AttentionBackward emits."""

    Query = "Query"
    Key = "Key"
    Value = "Value"


class RngBackend(enum.Enum):
    """Random-number policy of RngNormal / RngUniform."""

    Philox = "Philox"
    Ort = "Ort"
    Bnns = "Bnns"
    Zero = "Zero"


@dataclass(frozen=True)
class RngOptions:
    """The schedule's RNG policy (read at execution time)."""

    seed: int = 42
    backend: RngBackend = RngBackend.Philox


# ── sum types ────────────────────────────────────────────────────────────────

class MaskKind(SumType):
    """How attention scores are masked."""


MaskKind.unit("None")
MaskKind.unit("Causal")
MaskKind.unit("Custom")
MaskKind.unit("Bias")


@MaskKind.variant
@dataclass(frozen=True, repr=False)
class SlidingWindow(MaskKind):
    """Query at absolute position a sees keys [max(a-w, 0), a] (w+1 keys)."""

    w: int


SlidingWindow._tuple = True


class ChainOperand(SumType):
    """An operand of a region step: an external input or an earlier step's result."""


@dataclass(frozen=True, repr=False)
class Input(ChainOperand):
    """External input `index` (0 ≤ index < 16)."""

    index: int


@dataclass(frozen=True, repr=False)
class Step(ChainOperand):
    """Result of the earlier step `index`."""

    index: int


ChainOperand.variant(Input, tuple_like=True)
ChainOperand.variant(Step, tuple_like=True)


class ChainStep(SumType):
    """One scalar step of an ElementwiseRegion chain."""


@dataclass(frozen=True, repr=False)
class ActivationStep(ChainStep):
    """Apply an activation (inside a region Gelu is the tanh form)."""

    act: Activation
    x: ChainOperand


@dataclass(frozen=True, repr=False)
class Cast(ChainStep):
    """Round-trip the value through `dtype` (halves RNE, ints truncate and saturate, Bool)."""

    dtype: DType
    x: ChainOperand


@dataclass(frozen=True, repr=False)
class Binary(ChainStep):
    """op(lhs, rhs)."""

    op: BinaryOp
    lhs: ChainOperand
    rhs: ChainOperand


@dataclass(frozen=True, repr=False)
class Compare(ChainStep):
    """1.0 if cmp(lhs, rhs) else 0.0."""

    op: CmpOp
    lhs: ChainOperand
    rhs: ChainOperand


@dataclass(frozen=True, repr=False)
class Where(ChainStep):
    """on_true if cond != 0.0 else on_false (a NaN condition is truthy)."""

    cond: ChainOperand
    on_true: ChainOperand
    on_false: ChainOperand


ActivationStep.__name__ = "Activation"
for _cls in (ActivationStep, Cast, Binary, Compare, Where):
    ChainStep.variant(_cls, tuple_like=True)
del _cls


class QuantScheme(SumType):
    """Weight quantization scheme (rlx_ir::quant::QuantScheme)."""


def _struct_variant(base: type, name: str, fields: dict[str, type], doc: str = "") -> type:
    ns = {"__annotations__": dict(fields), "__doc__": doc or f"{base.__name__}::{name}"}
    sub = dataclass(frozen=True, repr=False)(type(name, (base,), ns))
    return base.variant(sub)


for _n in ("Int8Block", "Int8BlockAsym", "Int4Block"):
    _struct_variant(QuantScheme, _n, {"block_size": int})
for _n in ("Fp8E4m3 Fp8E5m2 GgufQ4K GgufQ5K GgufQ6K GgufQ8K GgufQ2K GgufQ3K GgufQ4_0 GgufQ8_0 "
           "Nvfp4Block GgufQ4_1 GgufQ5_0 GgufQ5_1").split():
    QuantScheme.unit(_n)
_struct_variant(QuantScheme, "MlxAffine", {"bits": int, "group_size": int})
for _n in ("MlxMxfp4", "MlxMxfp8", "MxFp4x2Block"):
    _struct_variant(QuantScheme, _n, {"group_size": int})
for _n in ("GgufIQ4NL GgufIQ4XS GgufIQ2XXS GgufIQ2XS GgufIQ2S GgufIQ3XXS GgufIQ3S GgufIQ1S GgufIQ1M "
           "GgufTQ1_0 GgufTQ2_0 GgufMXFP4 GgufNVFP4 GgufQ1_0 GgufQ2_0").split():
    QuantScheme.unit(_n)


class ScaledFormat(SumType):
    """Low-precision code format of the native scaled GEMM (FP8/FP6/FP4 and custom minifloats)."""


for _n in "F8E4M3 F8E5M2 F8E4M3Fnuz F8E5M2Fnuz F6E2M3 F6E3M2 F4E2M1".split():
    ScaledFormat.unit(_n)
_struct_variant(ScaledFormat, "Custom", {"exp_bits": int, "mant_bits": int, "bias": int})


class ScaleLayout(SumType):
    """How scales are laid out along K for the scaled GEMM."""


ScaleLayout.unit("PerTensor")
_struct_variant(ScaleLayout, "BlockMxE8M0", {"block": int})
_struct_variant(ScaleLayout, "Nvfp4", {"group": int})


class ScaleMode(SumType):
    """FakeQuantize scale tracking."""


ScaleMode.unit("PerBatch")
_struct_variant(ScaleMode, "EMA", {"decay": float})
ScaleMode.unit("Fixed")
del _n

__all__ = ["Activation", "BinaryOp", "CmpOp", "ReduceOp", "ScatterNdReduction", "SteKind",
           "AttentionBwdWrt", "RngBackend", "RngOptions", "MaskKind", "ChainOperand", "ChainStep",
           "QuantScheme", "ScaledFormat", "ScaleLayout", "ScaleMode"]
