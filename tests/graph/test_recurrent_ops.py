"""Graph lstm / gru / rnn against torch.nn.LSTM / GRU / RNN in float64: outputs and final states, one compile."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rlx_llvm as rl  # noqa: E402

B, S, I, H = 3, 7, 5, 6
# (cell, bidirectional, initial states given): each cell both ways, states given to one of them
CASES = [(cell, bi, bi != (cell == "gru")) for cell in ("lstm", "gru", "rnn") for bi in (False, True)]
MODULES = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn": torch.nn.RNN}


def _weights(m: "torch.nn.Module", bi: bool) -> dict[str, np.ndarray]:
    """PyTorch's per-direction weights stacked forward then reverse (the graph ops' layout)."""
    sfx = ["_l0"] + (["_l0_reverse"] if bi else [])
    return {k: torch.cat([getattr(m, k + s) for s in sfx]).detach().numpy()
            for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}


@pytest.fixture(scope="module")
def results():
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    g = rl.Graph("recurrent")
    x = g.input("x", [B, S, I])
    feeds = {"x": rng.standard_normal((B, S, I))}
    outs, refs = [], []
    for k, (cell, bi, given) in enumerate(CASES):
        d = 2 if bi else 1
        nonlinearity = "relu" if bi and cell == "rnn" else "tanh"
        kw = {"nonlinearity": nonlinearity} if cell == "rnn" else {}
        m = MODULES[cell](I, H, batch_first=True, bidirectional=bi, **kw).double()
        w = _weights(m, bi)
        c = {n: g.constant(a.astype(np.float32)) for n, a in w.items()}
        states = [rng.standard_normal((d, B, H)) if given else np.zeros((d, B, H)) for _ in range(2)]
        h0, c0 = ([g.input(f"h0_{k}", [d, B, H]), g.input(f"c0_{k}", [d, B, H])] if given else [None, None])
        if given:
            feeds.update({f"h0_{k}": states[0], f"c0_{k}": states[1]})
        xt = torch.from_numpy(feeds["x"])
        if cell == "lstm":
            merged = g.constant((w["bias_ih"] + w["bias_hh"]).astype(np.float32))
            outs += g.lstm(x, c["weight_ih"], c["weight_hh"], merged, h0, c0, bidirectional=bi)
            y, (hn, cn) = m(xt, tuple(torch.from_numpy(s) for s in states))
            refs += [y, hn, cn]
        else:
            if cell == "gru":
                outs += g.gru(x, c["weight_ih"], c["weight_hh"], c["bias_ih"], c["bias_hh"], h0, bidirectional=bi)
            else:
                merged = g.constant((w["bias_ih"] + w["bias_hh"]).astype(np.float32))
                outs += g.rnn(x, c["weight_ih"], c["weight_hh"], merged, h0, bidirectional=bi,
                              nonlinearity=nonlinearity)
            y, hn = m(xt, torch.from_numpy(states[0]))
            refs += [y, hn]
    g.set_outputs(outs)
    got = rl.Session().compile(g).run({k: v.astype(np.float32) for k, v in feeds.items()})
    return got, [r.detach().numpy() for r in refs]


def test_every_output_matches_torch_float64(results):
    got, refs = results
    assert len(got) == len(refs) == 2 * 3 + 4 * 2
    for i, (a, r) in enumerate(zip(got, refs)):
        assert a.shape == r.shape, i
        np.testing.assert_allclose(a, r, rtol=0, atol=2e-6 * max(1.0, np.abs(r).max()), err_msg=str(i))


def test_shapes_are_checked():
    g = rl.Graph()
    x = g.input("x", [B, S, I])
    w = g.constant(np.zeros((4 * H, I), np.float32))
    with pytest.raises(rl.GraphError, match="gru"):
        g.gru(x, w, g.constant(np.zeros((3 * H, H), np.float32)), *(g.constant(np.zeros(3 * H, np.float32)),) * 2)
    with pytest.raises(rl.GraphError, match="initial state"):
        g.lstm(x, w, g.constant(np.zeros((4 * H, H), np.float32)), g.constant(np.zeros(4 * H, np.float32)),
               h0=g.input("h", [2, B, H]))
