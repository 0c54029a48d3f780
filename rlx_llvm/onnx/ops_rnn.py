"""ONNX recurrent layers: LSTM, GRU, RNN → `Graph.lstm` / `gru` / `rnn` (one Lstm / Gru / Rnn thunk), or
the cell written out step by step in graph ops (`unrolled`).

The weights must be import-time constants.  For the thunks their gate blocks are reordered from ONNX's
(LSTM i, o, f, c; GRU z, r, h) to PyTorch's order (i, f, g, o; r, z, n), and the directions stacked; a
`reverse` layer runs forward over the time-reversed sequence.

Unrolled (one matmul projects every step's input, then per step `h·Rᵀ`, the gate narrows and their
element-wise math, which the fusion passes turn into FusedMmBiasAct + ElementwiseRegion): a single step
(`seq = 1`, what a streaming model such as silero-vad runs per chunk — no recurrence, so no thunk and no
per-call packing of `R`), and the forms the thunks do not express, up to `MAX_UNROLL` steps: LSTM
peepholes `P`, GRU with `linear_before_reset = 0` (the reset multiplies `h` before `R_h`).

Refused by name: activations other than the defaults (RNN may pick Relu), `clip`, `input_forget`,
`sequence_lens` that are not all the full sequence, and the unrolled forms beyond `MAX_UNROLL` steps.
"""
from __future__ import annotations

import numpy as np

from ..graph import Value
from .importer import Convert, Unsupported, converts

MAX_UNROLL = 64                # steps the unrolled form is written out for (graph size grows with seq)
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
    if node.op_type == "LSTM" and cx.attr(node, "input_forget", 0):
        raise Unsupported("LSTM input_forget is not supported")
    if _needs_unrolling(cx, node) and seq > MAX_UNROLL:
        raise Unsupported(f"{'LSTM peepholes (input P)' if node.op_type == 'LSTM' else 'GRU with linear_before_reset = 0'}"
                          f" run unrolled, up to {MAX_UNROLL} steps; this sequence has {seq}")
    if cx.has(node, 4):
        lens = cx.need_const(node, 4, "sequence_lens")
        if np.any(lens != seq):
            raise Unsupported(f"sequence_lens {lens.tolist()} shorter than the sequence ({seq}) are not supported")


def _time_reversed(cx: Convert, x: Value) -> Value:
    """`x [batch, seq, …]` with the seq axis reversed."""
    return cx.g.gather(x, cx.g.constant(np.arange(x.shape[1] - 1, -1, -1, dtype=np.int64)), axis=1)


def _needs_unrolling(cx: Convert, node) -> bool:
    """True for the forms no thunk expresses: LSTM peepholes, GRU with linear_before_reset = 0."""
    if node.op_type == "LSTM":
        return cx.has(node, 7)
    return node.op_type == "GRU" and not cx.attr(node, "linear_before_reset", 0)


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
    if seq == 1 or _needs_unrolling(cx, node):
        y, states = _unrolled(cx, node, x, w, r, bias, nonlinearity)
        return _onnx_layout(g, y, states, layout)
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
    return _onnx_layout(g, g.reshape(y, [batch, seq, d, hidden]), states, layout)


def _onnx_layout(g, y: Value, states: list, layout: int) -> list:
    """`y [batch, seq, D, H]` and states `[D, batch, H]` in the node's layout (0: `[seq, D, batch, H]`)."""
    if layout == 0:
        return [g.transpose(y, [1, 2, 0, 3]), *states]
    return [y, *(g.transpose(s, [1, 0, 2]) for s in states)]                   # [batch, D, H]


# ── the cell written out step by step ────────────────────────────────────────

def _unrolled(cx: Convert, node, x: Value, w: np.ndarray, r: np.ndarray, bias: np.ndarray,
              nonlinearity: str) -> tuple[Value, list]:
    """`(y [batch, seq, D, H], [h_n, (c_n)] each [D, batch, H])` of the layer, its steps written out."""
    g, op = cx.g, node.op_type
    batch, seq, width = x.shape
    d, gh, hidden = r.shape
    peep = cx.need_const(node, 7, "P") if cx.has(node, 7) else None
    directions = ("forward", "reverse") if d == 2 else (cx.attr(node, "direction", "forward"),)
    ys, finals = [], []
    for k, direction in enumerate(directions):
        cell = Cell(g, op, hidden, r[k], bias[k, gh:], None if peep is None else peep[k], nonlinearity,
                    bool(cx.attr(node, "linear_before_reset", 0)))
        zx = g.matmul(g.reshape(x, [batch * seq, width]), g.constant(np.ascontiguousarray(w[k].T, np.float32)))
        zx = g.reshape(g.add(zx, g.constant(np.asarray(bias[k, :gh], np.float32))), [batch, seq, gh])
        h, c = (_initial(cx, node, i, k, batch, hidden) for i in (5, 6))
        steps = [None] * seq
        for t in (range(seq) if direction == "forward" else range(seq - 1, -1, -1)):
            h, c = cell.step(g.reshape(g.narrow(zx, 1, t, 1), [batch, gh]), h, c)
            steps[t] = g.reshape(h, [batch, 1, 1, hidden])
        ys.append(steps[0] if seq == 1 else g.concat(steps, 1))
        finals.append([h, c] if op == "LSTM" else [h])
    y = ys[0] if d == 1 else g.concat(ys, 2)
    states = [g.concat([g.reshape(f[j], [1, batch, hidden]) for f in finals], 0) if d == 2
              else g.reshape(finals[0][j], [1, batch, hidden]) for j in range(len(finals[0]))]
    return y, states


def _initial(cx: Convert, node, i: int, k: int, batch: int, hidden: int) -> Value:
    """Direction `k`'s initial state from input `i` (h0: 5, c0: 6) as `[batch, H]`, zeros when omitted."""
    g = cx.g
    if not cx.has(node, i):
        return g.constant(np.zeros((batch, hidden), np.float32))
    s = cx.tensor(node.input[i])
    s = g.transpose(s, [1, 0, 2]) if cx.attr(node, "layout", 0) == 1 else s
    return g.reshape(g.narrow(s, 0, k, 1), [batch, hidden])


class Cell:
    """One direction's step in ONNX's equations: `step(zx, h, c) → (h', c')`, `zx = x·Wᵀ + Wb` (all gates)."""

    def __init__(self, g, op: str, hidden: int, r: np.ndarray, r_bias: np.ndarray, peep: np.ndarray | None,
                 nonlinearity: str, linear_before_reset: bool) -> None:
        self.g, self.op, self.hidden, self.nonlinearity, self.lbr = g, op, hidden, nonlinearity, linear_before_reset
        self.r, self.r_bias = np.asarray(r, np.float32), np.asarray(r_bias, np.float32)
        self.peep = None if peep is None else [g.constant(p) for p in np.asarray(peep, np.float32).reshape(3, hidden)]
        self._weights: dict[tuple[int, int], tuple[Value, Value]] = {}

    def gate(self, z: Value, k: int) -> Value:
        """Gate block `k` (ONNX order) of `z [batch, G·H]`."""
        return self.g.narrow(z, 1, k * self.hidden, self.hidden)

    def recurrent(self, h: Value, lo: int, hi: int) -> Value:
        """`h·R[lo:hi]ᵀ + Rb[lo:hi]` (gate blocks lo…hi−1)."""
        H, g = self.hidden, self.g
        if (lo, hi) not in self._weights:     # constants made once, shared by every step
            self._weights[lo, hi] = (g.constant(np.ascontiguousarray(self.r[lo * H:hi * H].T)),
                                     g.constant(self.r_bias[lo * H:hi * H]))
        r_t, rb = self._weights[lo, hi]
        return g.add(g.matmul(h, r_t), rb)

    def step(self, zx: Value, h: Value, c: Value) -> tuple[Value, Value]:
        """`(h', c')`; `c` passes through unchanged for GRU and RNN."""
        g = self.g
        if self.op == "RNN":
            return g.activation(self.nonlinearity, g.add(zx, self.recurrent(h, 0, 1))), c
        if self.op == "LSTM":
            return self._lstm(g.add(zx, self.recurrent(h, 0, 4)), c)
        return self._gru(zx, h), c

    def _peephole(self, z: Value, k: int, c: Value) -> Value:
        """`z + P_k ⊙ c` (P's blocks: i, o, f), or `z` without peepholes."""
        if self.peep is None:
            return z
        return self.g.add(z, self.g.mul(self.peep[k], c))

    def _lstm(self, z: Value, c: Value) -> tuple[Value, Value]:
        """ONNX gate blocks i, o, f, c: `c' = σ(f)·c + σ(i)·tanh(c̃)`, `h' = σ(o)·tanh(c')`."""
        g = self.g
        i = g.sigmoid(self._peephole(self.gate(z, 0), 0, c))
        f = g.sigmoid(self._peephole(self.gate(z, 2), 2, c))
        c = g.add(g.mul(f, c), g.mul(i, g.tanh(self.gate(z, 3))))
        o = g.sigmoid(self._peephole(self.gate(z, 1), 1, c))
        return g.mul(o, g.tanh(c)), c

    def _gru(self, zx: Value, h: Value) -> Value:
        """ONNX gate blocks z, r, h: `h' = (1 − z)·ĥ + z·h`, the reset before or after `R_h` (linear_before_reset)."""
        g = self.g
        zr = g.add(g.narrow(zx, 1, 0, 2 * self.hidden), self.recurrent(h, 0, 2))
        update, reset = g.sigmoid(self.gate(zr, 0)), g.sigmoid(self.gate(zr, 1))
        if self.lbr:
            hh = g.mul(reset, self.recurrent(h, 2, 3))
        else:
            hh = self.recurrent(g.mul(reset, h), 2, 3)
        cand = g.tanh(g.add(self.gate(zx, 2), hh))
        return g.add(cand, g.mul(update, g.sub(h, cand)))
