"""Examples of the random fills (RLX's Philox stream under the default `RngOptions`) — odd lengths, so the
last Philox block is partly used — and of Sample."""
from __future__ import annotations

from .. import thunks as T
from .layout import Example, example


def rng() -> list[Example]:
    """RngUniform and RngNormal of 37 values (bit-exact: the draws are integer arithmetic plus one rounding
    of ln/cos), and Sample."""
    return [*sample(), example("RngUniform/len37", T.RngUniform(dst=0, len=37, low=-1.0, high=2.0, key=11, op_seed=None),
                    rtol=0.0),
            example("RngNormal/len37", T.RngNormal(dst=0, len=37, mean=0.5, scale=2.0, key=12, op_seed=None),
                    rtol=0.0)]


def sample() -> list[Example]:
    """Sample with top-k and top-p over 5 rows of 37 logits."""
    return [example("Sample/top_k5_top_p0.9", T.Sample(logits=0, dst=0, batch=5, vocab=37, top_k=5, top_p=0.9,
                                                       temperature=0.8, seed=3), rtol=0.0)]
