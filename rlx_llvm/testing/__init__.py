"""Small valid example schedules of every lowered thunk kind, for tests of rlx_llvm and of users' own schedules.

    from rlx_llvm import testing
    for ex in testing.examples("LayerNorm"):
        arena = rl.Arena(ex.schedule.arena_bytes)
        ex.init(arena, np.random.default_rng(0))       # valid inputs; every other byte is yours
        rl.compile(ex.schedule).run(arena)

Each `Example` is one thunk (rarely a few) in its own arena, every buffer in a 64-byte-aligned slot
with guard bytes after it, sizes small and odd so that vector tails run.  `pack` lays many examples
side by side in one schedule (one compile); `shift` moves a thunk's offsets.
"""
from __future__ import annotations

import functools
from typing import Callable

from . import attention, conv, elementwise, matmul, movement, norms, reductions
from . import qgemm
from . import gguf
from . import scaled
from . import quantize
from . import dequant
from . import ssm
from . import control
from . import mlx
from . import recurrent
from . import fft
from . import custom_op
from . import rng
from . import attention_backward
from . import splat
from .compare import assert_close, assert_outputs_match
from .layout import (Buffer, Example, Values, bf16, example, ints, normal, pack, shift, side_by_side, spd, uniform,
                     well_conditioned)

# Registry family name → its examples (the families of `rlx_llvm.registry.FAMILIES`).
FAMILIES: dict[str, Callable[[], list[Example]]] = {
    "nop": elementwise.nop, "region": elementwise.region, "elementwise": elementwise.elementwise,
    "casts": elementwise.casts, "activation_backward": elementwise.activation_backward,
    "movement": movement.movement, "indexing": movement.indexing,
    "norms": norms.norms, "norms_backward": norms.norms_backward,
    "reductions": reductions.reductions, "losses": reductions.losses,
    "gemm": matmul.gemm, "linalg": matmul.linalg, "fallbacks": matmul.fallbacks,
    "attention": attention.attention, "fused_layers": attention.fused_layers, "conv": conv.conv,
    "qgemm": qgemm.qgemm,
    "gguf": gguf.gguf,
    "scaled": scaled.scaled,
    "quantize": quantize.quantize,
    "dequant": dequant.dequant,
    "ssm": ssm.ssm,
    "control": control.control,
    "mlx": mlx.mlx,
    "recurrent": recurrent.recurrent,
    "fft": fft.fft,
    "custom_op": custom_op.custom_op,
    "rng": rng.rng,
    "attention_backward": attention_backward.attention_backward,
    "splat": splat.splat,
}


@functools.cache
def _all() -> tuple[Example, ...]:
    return tuple(ex for make in FAMILIES.values() for ex in make())


def examples(kind: str | None = None, family: str | None = None) -> list[Example]:
    """Every example, or those whose schedule holds thunk `kind`, or those of registry `family`."""
    chosen = FAMILIES[family]() if family is not None else _all()
    return [ex for ex in chosen if kind is None or kind in ex.kinds]


__all__ = ["Buffer", "Example", "FAMILIES", "Values", "assert_close", "assert_outputs_match", "bf16", "example",
           "examples", "ints", "normal", "pack", "shift", "side_by_side", "spd", "uniform", "well_conditioned"]
