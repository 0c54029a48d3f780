"""Lstm, Gru and Rnn (tanh and relu).

* Against the float64 references, all in one program: hidden sizes W−1, W, W+1, 4W and several panels
  (W = the host's f32 lanes), seq 0, 1 and several, batch 1, 3 and 7 (full and partial row tiles),
  1 and 2 layers, one and both directions, with and without carried states, no input features,
  saturated gates.
* Against onnx.reference's LSTM / GRU / RNN (weights converted: ONNX gate orders i,o,f,c and z,r,h,
  `linear_before_reset=1` for PyTorch's GRU; layers chained by hand) and, if installed, against
  torch.nn.LSTM / GRU / RNN.
* 1 vs 2 threads identical; nothing outside dst and the carried states changes.
* RLX's Relu for Rnn: a NaN pre-activation gives 0.
* Bad input: no layers, dims past the BLAS integer bound, a weight buffer one byte short.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import thunks as T
from tests.harness import Suite, assert_close, expect_invalid, suite_tests

W = rl.jit.host().lanes(32)
KINDS = {"lstm": T.Lstm, "gru": T.Gru, "rnn_tanh": T.Rnn, "rnn_relu": T.Rnn}
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


class Shape(NamedTuple):
    batch: int
    seq: int
    input_size: int
    hidden: int
    layers: int
    bidir: bool
    carry: bool


def weight_count(cell: str, s: Shape) -> tuple[int, int, int]:
    """Elements of w_ih, w_hh and one bias over every layer and direction (straight from §3.9)."""
    d, g, h = 1 + s.bidir, GATES[cell], s.hidden
    w_ih = sum(d * g * h * (s.input_size if layer == 0 else d * h) for layer in range(s.layers))
    return w_ih, s.layers * d * g * h * h, s.layers * d * g * h


def add_case(suite: Suite, cell: str, s: Shape, x_scale: float = 1.0, tag: str = "", nan_step: int = -1) -> str:
    """A case with weights ~ N(0, 1/H) (states stay in tanh's live range), x of batch row 0 at step
    `nan_step` NaN if given; returns its name."""
    kind, d = KINDS[cell], 1 + s.bidir
    w_ih, w_hh, bias = weight_count(cell, s)
    std = s.hidden ** -0.5
    x = suite.normal(s.batch * s.seq * s.input_size, scale=x_scale)
    if nan_step >= 0:
        x[nan_step * s.input_size] = np.nan
    fields = dict(x=suite.put(x),
                  w_ih=suite.put(suite.normal(w_ih, scale=std)), w_hh=suite.put(suite.normal(w_hh, scale=std)))
    if kind is T.Gru:
        fields |= dict(b_ih=suite.put(suite.normal(bias, scale=0.5)), b_hh=suite.put(suite.normal(bias, scale=0.5)))
    else:
        fields["bias"] = suite.put(suite.normal(bias, scale=0.5))
    state = s.layers * d * s.batch * s.hidden
    carried = ("h0", "c0") if kind is T.Lstm else ("h0",)
    for name in carried:
        fields[name] = suite.put(suite.normal(state, scale=0.5)) if s.carry else 0
    fields["dst"], out = suite.out(np.float32, s.batch * s.seq * d * s.hidden)
    if kind is T.Rnn:
        fields["relu"] = cell == "rnn_relu"
    t = kind(batch=s.batch, seq=s.seq, input_size=s.input_size, hidden=s.hidden, num_layers=s.layers,
             bidirectional=s.bidir, carry=s.carry, **fields)
    outputs = [out] + ([(fields[n], np.dtype(np.float32), state) for n in carried] if s.carry else [])
    name = f"{cell}-b{s.batch}s{s.seq}i{s.input_size}h{s.hidden}-L{s.layers}{'-bidir' if s.bidir else ''}" \
           f"{'-carry' if s.carry else ''}{tag}"
    suite.add(name, t, outputs)
    return name


def build() -> Suite:
    s = Suite(7, rtol=2e-5, atol=2e-5)   # f32 state vs the float64 reference, over the steps
    for cell in KINDS:
        for hidden in (W - 1, W, W + 1):
            add_case(s, cell, Shape(3, 5, 7, hidden, 2, True, True))
        add_case(s, cell, Shape(3, 0, 7, 5, 2, True, True))              # no steps: states kept
        add_case(s, cell, Shape(1, 1, 5, W + 3, 1, False, False))        # one step
        add_case(s, cell, Shape(1, 6, 9, 2 * W + 3, 1, True, False))     # batch 1, several panels
        add_case(s, cell, Shape(7, 4, 3, 6, 2, False, True))             # full and partial row tiles
        add_case(s, cell, Shape(16, 3, 4, 4 * W, 1, True, False))        # W×W weight blocks packed, 6 + 5 + 5 rows
        add_case(s, cell, Shape(1, 4, 5, 2 * W, 2, True, True))          # batch 1, W | H: W_hh rows, unpacked
        add_case(s, cell, Shape(2, 5, 2 * W, W, 2, True, False))         # W | input, W | H: projections tiled over W_ihᵀ (16 lanes)
        add_case(s, cell, Shape(1, W, 2 * W, W, 2, True, False))         # ... and W | batch·seq: outᵀ = W_ih·xᵀ (16 lanes)
        add_case(s, cell, Shape(3, 9, 4, W + 1, 1, True, True), x_scale=30.0, tag="-saturated")
    add_case(s, "lstm", Shape(2, 3, 0, 5, 2, True, False))                # no input features
    add_case(s, "rnn_relu", Shape(1, 3, 4, 5, 1, False, False), tag="-nan", nan_step=1)  # RLX Relu: NaN → 0
    return s


SUITE = build()
(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE, paths=frozenset({"llvm", "blas"}))


def test_cases_cover_the_shapes() -> None:
    """Every cell has seq 0/1/several, batch 1/3, hidden W−1/W/W+1, 1/2 layers, both directions, carry on/off."""
    for cell in KINDS:
        ts = [c.thunk for c in SUITE.cases if c.name.startswith(cell + "-")]
        for field, values in (("seq", {0, 1, 5}), ("batch", {1, 3}), ("hidden", {W - 1, W, W + 1}),
                              ("num_layers", {1, 2}), ("bidirectional", {False, True}), ("carry", {False, True})):
            assert values <= {getattr(t, field) for t in ts}, (cell, field)


def test_no_steps_keeps_the_carried_state(outcome) -> None:
    """seq 0: the carried states come back unchanged (nothing to step)."""
    for case in (c for c in SUITE.cases if c.thunk.seq == 0):
        for k in range(1, len(case.outputs)):
            np.testing.assert_array_equal(outcome.output(case.name, k), outcome.output(case.name, k, outcome.before))


# ── independent oracles ──────────────────────────────────────────────────────

class Unpacked(NamedTuple):
    """The operands of a case, unpacked per (layer, direction) from the arena (semantics.md §3.9)."""

    x: np.ndarray                 # [batch, seq, input]
    w_ih: list[list[np.ndarray]]  # [layer][direction] → [G·H, in_l]
    w_hh: list[list[np.ndarray]]  # → [G·H, H]
    b_ih: list[list[np.ndarray]]  # → [G·H] (the combined bias of Lstm / Rnn)
    b_hh: list[list[np.ndarray]]  # → [G·H] (zeros for Lstm / Rnn)
    h0: np.ndarray                # [L·D, batch, H]
    c0: np.ndarray


def unpack(t, arena: np.ndarray) -> Unpacked:
    """Slice the packed buffers: w_ih blocks `[G·H, in_l]` layer-major then direction, and so on."""
    f32 = lambda off, n: arena[off:off + 4 * n].view(np.float32).astype(np.float64)  # noqa: E731
    g, h, d, layers = t.gates, t.hidden, t.directions, t.num_layers
    w_ih, w_hh, b_ih, b_hh, at = [], [], [], [], 0
    for layer in range(layers):
        n_in = t.input_size if layer == 0 else d * h
        rows = [[], [], [], []]
        for k in range(layer * d, layer * d + d):
            rows[0].append(f32(t.w_ih + 4 * at, g * h * n_in).reshape(g * h, n_in))
            at += g * h * n_in
            rows[1].append(f32(t.w_hh + 4 * k * g * h * h, g * h * h).reshape(g * h, h))
            first = t.b_ih if isinstance(t, T.Gru) else t.bias
            rows[2].append(f32(first + 4 * k * g * h, g * h))
            rows[3].append(f32(t.b_hh + 4 * k * g * h, g * h) if isinstance(t, T.Gru) else np.zeros(g * h))
        for lst, row in zip((w_ih, w_hh, b_ih, b_hh), rows):
            lst.append(row)
    state = (layers * d, t.batch, h)
    h0 = f32(t.h0, np.prod(state)).reshape(state) if t.carry else np.zeros(state)
    c0 = f32(t.c0, np.prod(state)).reshape(state) if t.carry and isinstance(t, T.Lstm) else np.zeros(state)
    return Unpacked(f32(t.x, t.batch * t.seq * t.input_size).reshape(t.batch, t.seq, t.input_size),
                    w_ih, w_hh, b_ih, b_hh, h0, c0)


def onnx_reorder(t, m: np.ndarray) -> np.ndarray:
    """Our gate blocks (i,f,g,o / r,z,n) in ONNX's order (i,o,f,c / z,r,h) along axis 0."""
    order = {T.Lstm: (0, 3, 1, 2), T.Gru: (1, 0, 2), T.Rnn: (0,)}[type(t)]
    blocks = np.split(m, t.gates, axis=0)
    return np.concatenate([blocks[i] for i in order], axis=0)


def onnx_run(t, u: Unpacked) -> tuple[np.ndarray, list[np.ndarray]]:
    """dst `[batch, seq, D·H]` and the final states, one ONNX node per layer (float64)."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    op = {T.Lstm: "LSTM", T.Gru: "GRU", T.Rnn: "RNN"}[type(t)]
    d = t.directions
    attrs = dict(hidden_size=t.hidden, direction="bidirectional" if t.bidirectional else "forward")
    if isinstance(t, T.Gru):
        attrs["linear_before_reset"] = 1
    names = ["X", "W", "R", "B", "", "initial_h"] + (["initial_c"] if isinstance(t, T.Lstm) else [])
    outs = ["Y", "Y_h"] + (["Y_c"] if isinstance(t, T.Lstm) else [])
    node = helper.make_node(op, names, outs, **attrs)
    tensor = lambda n: helper.make_tensor_value_info(n, TensorProto.DOUBLE, None)  # noqa: E731
    graph = helper.make_graph([node], "g", [tensor(n) for n in names if n], [tensor(n) for n in outs])
    model = ReferenceEvaluator(helper.make_model(graph))
    x = u.x.transpose(1, 0, 2)                                   # [seq, batch, in]
    finals: list[list[np.ndarray]] = [[] for _ in outs[1:]]
    for layer in range(t.num_layers):
        k = slice(layer * d, layer * d + d)
        feed = dict(X=x, W=np.stack([onnx_reorder(t, w) for w in u.w_ih[layer]]),
                    R=np.stack([onnx_reorder(t, w) for w in u.w_hh[layer]]),
                    B=np.stack([np.concatenate([onnx_reorder(t, bi), onnx_reorder(t, bh)])
                                for bi, bh in zip(u.b_ih[layer], u.b_hh[layer])]),
                    initial_h=u.h0[k])
        if isinstance(t, T.Lstm):
            feed["initial_c"] = u.c0[k]
        y, *states = model.run(None, feed)                      # y [seq, D, batch, H]
        for acc, st in zip(finals, states):
            acc.append(st)
        x = y.transpose(0, 2, 1, 3).reshape(t.seq, t.batch, d * t.hidden)
    return x.transpose(1, 0, 2), [np.concatenate(f) for f in finals]


def torch_run(t, u: Unpacked) -> tuple[np.ndarray, list[np.ndarray]]:
    """The same through torch.nn.LSTM / GRU / RNN (batch_first, float64)."""
    import torch
    cls = {T.Lstm: torch.nn.LSTM, T.Gru: torch.nn.GRU, T.Rnn: torch.nn.RNN}[type(t)]
    extra = dict(nonlinearity="relu" if t.relu else "tanh") if isinstance(t, T.Rnn) else {}
    net = cls(t.input_size, t.hidden, t.num_layers, batch_first=True, bidirectional=t.bidirectional,
              dtype=torch.float64, **extra)
    with torch.no_grad():
        for layer in range(t.num_layers):
            for d in range(t.directions):
                suffix = f"l{layer}" + ("_reverse" if d else "")
                for name, packed in (("weight_ih", u.w_ih), ("weight_hh", u.w_hh), ("bias_ih", u.b_ih),
                                     ("bias_hh", u.b_hh)):
                    getattr(net, f"{name}_{suffix}").copy_(torch.from_numpy(packed[layer][d]))
        state = torch.from_numpy(u.h0)
        if isinstance(t, T.Lstm):
            state = (state, torch.from_numpy(u.c0))
        y, final = net(torch.from_numpy(u.x), state)
    finals = final if isinstance(final, tuple) else (final,)
    return y.numpy(), [f.numpy() for f in finals]


ORACLE_CASES = [c.name for c in SUITE.cases if c.thunk.seq > 0 and c.thunk.input_size > 0 and "nan" not in c.name]


def test_relu_of_nan_is_zero(outcome) -> None:
    """RLX's Relu is Rust `max(x, 0)`: the step whose input holds a NaN gives h = 0 (torch would give NaN)."""
    out = outcome.output("rnn_relu-b1s3i4h5-L1-nan").reshape(3, 5)
    np.testing.assert_array_equal(out[1], np.zeros(5, np.float32))
    assert np.isfinite(out).all() and out[2].any()


def check_oracle(outcome, name: str, run) -> None:
    """dst and (with carry) the final states match the oracle `run(thunk, unpacked)`."""
    t = outcome.case(name).thunk
    y, finals = run(t, unpack(t, outcome.before))
    tol = dict(rtol=2e-5, atol=2e-5)
    assert_close(outcome.output(name).reshape(y.shape), y, what=f"{name} dst", **tol)
    if t.carry:
        for k, want in enumerate(finals, start=1):
            assert_close(outcome.output(name, k).reshape(want.shape), want, what=f"{name} state {k}", **tol)


@pytest.mark.parametrize("name", [n for n in ORACLE_CASES if "relu" not in n])
def test_matches_onnx_reference(outcome, name: str) -> None:
    """onnx.reference has no Relu activation for RNN: relu cases are checked against torch only."""
    check_oracle(outcome, name, onnx_run)


@pytest.mark.parametrize("name", ORACLE_CASES)
def test_matches_torch(outcome, name: str) -> None:
    pytest.importorskip("torch")
    check_oracle(outcome, name, torch_run)


# ── bad input ────────────────────────────────────────────────────────────────

def lstm(**changes) -> T.Lstm:
    """batch 2, seq 3, input 4, hidden 5, 2 layers, bidirectional: x at 0, w_ih 1024, w_hh 4096,
    bias 8192, h0 9216, c0 10240, dst 11264 (2·3·10 f32)."""
    fields = dict(x=0, w_ih=1024, w_hh=4096, bias=8192, h0=9216, c0=10240, dst=11264, batch=2, seq=3,
                  input_size=4, hidden=5, num_layers=2, bidirectional=True, carry=True)
    return T.Lstm(**(fields | changes))


def test_no_layers_is_refused() -> None:
    expect_invalid(lstm(num_layers=0), 1 << 14, "num_layers", "at least 1")


@pytest.mark.parametrize("field, changes", [
    ("batch", dict(batch=1 << 16, seq=1 << 16, input_size=0, hidden=1, carry=False, dst=1 << 20)),
    ("hidden", dict(hidden=1 << 29, num_layers=1, bidirectional=False, carry=False, batch=0, input_size=0)),
    ("input_size", dict(input_size=1 << 31, batch=0, num_layers=1, bidirectional=False, carry=False, hidden=1)),
])
def test_dims_past_the_blas_bound_are_refused(field: str, changes: dict) -> None:
    t = lstm(**changes)
    end = max(e.offset + e.nbytes for e in (*t.reads(), *t.writes()))
    rl.set_max_memory((1 << 63) - 1)  # the arena is never allocated: the dims, not the memory budget, are refused
    try:
        expect_invalid(t, end, field, "32-bit BLAS")
    finally:
        rl.set_max_memory(None)


def test_w_ih_one_byte_short_is_refused() -> None:
    """Layer 1's blocks take the D·H = 10 outputs of layer 0: w_ih holds 2·20·4 + 2·20·10 f32."""
    t = lstm(w_ih=20000)
    expect_invalid(t, 20000 + 4 * (2 * 20 * 4 + 2 * 20 * 10) - 1, "w_ih")
