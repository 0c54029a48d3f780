"""Examples of Lstm, Gru and Rnn: odd sizes (hidden not a multiple of any vector width), several
layers, bidirectional, with and without carried states."""
from __future__ import annotations

from .. import thunks as T
from .layout import Example, example, normal


def recurrent() -> list[Example]:
    """Weights around 1/√hidden so the states stay in tanh's live range over the steps."""
    shape = dict(x=0, w_ih=0, w_hh=0, h0=0, dst=0, batch=3, seq=5, input_size=7, hidden=11)
    cases = [
        ("Lstm/2layers_bidir_carry", T.Lstm(bias=0, c0=0, num_layers=2, bidirectional=True, carry=True, **shape)),
        ("Gru/carry", T.Gru(b_ih=0, b_hh=0, num_layers=1, bidirectional=False, carry=True, **shape)),
        ("Rnn/relu_bidir", T.Rnn(bias=0, num_layers=2, bidirectional=True, carry=False, relu=True, **shape)),
    ]
    weights = {name: normal(scale=0.3) for name in ("w_ih", "w_hh", "bias", "b_ih", "b_hh")}
    return [example(name, t, rtol=1e-4, **{k: v for k, v in weights.items() if hasattr(t, k)})
            for name, t in cases]
