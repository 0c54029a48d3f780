"""ONNX recurrent layers: LSTM, GRU, RNN → `Graph.lstm` / `gru` / `rnn` (one Lstm / Gru / Rnn thunk).

The weights must be import-time constants: their gate blocks are reordered from ONNX's (LSTM i, o, f, c;
GRU z, r, h) to the thunks' PyTorch order (i, f, g, o; r, z, n), and the directions stacked.  A `reverse`
layer runs forward over the time-reversed sequence.  Not expressible, so refused by name: activations
other than the defaults (RNN may pick Relu), `clip`, LSTM peepholes `P` and `input_forget`, GRU with
`linear_before_reset = 0` (the thunk resets after the recurrent matmul, as PyTorch), and
`sequence_lens` that are not all the full sequence.
"""
from __future__ import annotations

import numpy as np

from ..graph import Value
from .importer import Convert, Unsupported, converts

GATE_ORDER = {"LSTM": [0, 2, 3, 1], "GRU": [1, 0, 2], "RNN": [0]}     # PyTorch's gate k is ONNX's block ORDER[k]
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}


def _reordered(w: np.ndarray, op: str) -> np.ndarray:
    """`[D, G·H, …]` ONNX blocks → `[D·G·H, …]` in PyTorch's gate order, directions stacked."""
    d, gh = w.shape[:2]
    order = GATE_ORDER[op]
    blocks = w.reshape(d, len(order), gh // len(order), *w.shape[2:])[:, order]
    return np.ascontiguousarray(blocks.reshape(d * gh, *w.shape[2:]), np.float32)


def _nonlinearity(cx: Convert, node, directions: int) -> str:
    """"tanh" or "relu" (RNN only); Unsupported for any other activation list."""
    acts = cx.attr(node, "activations")
    default = DEFAULT_ACTIVATIONS[node.op_type]
    if acts is None or [a.lower() for a in acts] == [a.lower() for a in default * directions]:
        return "tanh"
    if node.op_type == "RNN" and [a.lower() for a in acts] == ["relu"] * directions:
        return "relu"
    raise Unsupported(f"activations {acts} (only the defaults {default}"
                      f"{' or Relu' if node.op_type == 'RNN' else ''} are lowered)")


def _check_supported(cx: Convert, node, seq: int) -> None:
    if cx.attr(node, "clip") is not None:
        raise Unsupported("clip is not supported (the thunks do not clip gate inputs)")
    if node.op_type == "LSTM" and (cx.attr(node, "input_forget", 0) or cx.has(node, 7)):
        raise Unsupported("LSTM peepholes (input P) and input_forget are not supported")
    if node.op_type == "GRU" and not cx.attr(node, "linear_before_reset", 0):
        raise Unsupported("GRU with linear_before_reset = 0 is not supported (the Gru thunk applies the reset "
                          "after the recurrent matmul: linear_before_reset = 1, PyTorch's convention)")
    if cx.has(node, 4):
        lens = cx.need_const(node, 4, "sequence_lens")
        if np.any(lens != seq):
            raise Unsupported(f"sequence_lens {lens.tolist()} shorter than the sequence ({seq}) are not supported")


def _time_reversed(cx: Convert, x: Value) -> Value:
    """`x [batch, seq, …]` with the seq axis reversed."""
    return cx.g.gather(x, cx.g.constant(np.arange(x.shape[1] - 1, -1, -1, dtype=np.int64)), axis=1)


@converts("LSTM", "GRU", "RNN")
def _recurrent(cx: Convert, node) -> list:
    op, g = node.op_type, cx.g
    layout = cx.attr(node, "layout", 0)
    direction = cx.attr(node, "direction", "forward")
    x = cx.tensor(node.input[0])
    if layout == 0:
        x = g.transpose(x, [1, 0, 2])
    batch, seq, _ = x.shape
    _check_supported(cx, node, seq)
    w = cx.need_const(node, 1, "W")
    r = cx.need_const(node, 2, "R")
    d, gh, hidden = r.shape
    nonlinearity = _nonlinearity(cx, node, d)
    bias = cx.need_const(node, 3, "B") if cx.has(node, 3) else np.zeros((d, 2 * gh), np.float32)
    w_ih, w_hh = g.constant(_reordered(w, op)), g.constant(_reordered(r, op))
    b_ih, b_hh = _reordered(bias[:, :gh], op), _reordered(bias[:, gh:], op)

    def state(i: int) -> Value | None:
        if not cx.has(node, i):
            return None
        s = cx.tensor(node.input[i])
        return g.transpose(s, [1, 0, 2]) if layout == 1 else s

    h0 = state(5)
    if direction == "reverse":
        x = _time_reversed(cx, x)
    bidirectional = direction == "bidirectional"
    if op == "LSTM":
        y, *states = g.lstm(x, w_ih, w_hh, g.constant(b_ih + b_hh), h0, state(6), bidirectional)
    elif op == "GRU":
        y, *states = g.gru(x, w_ih, w_hh, g.constant(b_ih), g.constant(b_hh), h0, bidirectional)
    else:
        y, *states = g.rnn(x, w_ih, w_hh, g.constant(b_ih + b_hh), h0, bidirectional, nonlinearity)
    if direction == "reverse":
        y = _time_reversed(cx, y)
    y = g.reshape(y, [batch, seq, d, hidden])                                  # layout 1: [batch, seq, D, H]
    if layout == 0:
        return [g.transpose(y, [1, 2, 0, 3]), *states]                         # [seq, D, batch, H], [D, batch, H]
    return [y, *(g.transpose(s, [1, 0, 2]) for s in states)]                   # [batch, D, H]
