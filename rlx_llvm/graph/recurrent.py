"""Recurrent layers: one LSTM / GRU / Elman-RNN layer (`Lstm`, `Gru`, `Rnn` thunks), PyTorch's conventions.

    y, h_n, c_n = g.lstm(x, w_ih, w_hh, bias, h0=h0, c0=c0, bidirectional=True)
    y, h_n = g.gru(x, w_ih, w_hh, b_ih, b_hh)
    y, h_n = g.rnn(x, w_ih, w_hh, bias, nonlinearity="relu")

`x [batch, seq, input]` (batch first); `w_ih [D·G·H, input]`, `w_hh [D·G·H, H]` with the gate blocks in
PyTorch's order (LSTM i, f, g, o; GRU r, z, n) and directions forward then reverse; `bias [D·G·H]` is
b_ih + b_hh (LSTM, RNN), GRU keeps both (`linear_before_reset`: r multiplies `W_hn h + b_hn`).
`y [batch, seq, D·H]` (forward ‖ reverse), `h_n`/`c_n [D, batch, H]` the final states; `h0`/`c0` default to 0.
The layer runs as one thunk writing `y ‖ h_n ‖ c_n` packed; the three results are views of it.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import thunks as T
from ..dtypes import DType
from .backward import constant_buffer
from .checks import require_f32, require_rank, same_dim
from .core import DYNAMIC, GraphError, Node, Value
from .lower import LowerContext
from .opset import infers, lowers

GATES = {"lstm": 4, "gru": 3, "rnn": 1}
BIASES = {"lstm": 1, "gru": 2, "rnn": 1}
STATES = {"lstm": ("h", "c"), "gru": ("h",), "rnn": ("h",)}


class RecurrentOps:
    """Builders for one recurrent layer (mixed into `Graph`)."""

    def lstm(self, x: Value, w_ih: Value, w_hh: Value, bias: Value, h0: Value | None = None,
             c0: Value | None = None, bidirectional: bool = False) -> tuple[Value, Value, Value]:
        """`(y, h_n, c_n)` of one LSTM layer (gates i, f, g, o; `bias` = b_ih + b_hh)."""
        return self._recurrent("lstm", x, w_ih, w_hh, (bias,), (h0, c0), bidirectional)

    def gru(self, x: Value, w_ih: Value, w_hh: Value, b_ih: Value, b_hh: Value, h0: Value | None = None,
            bidirectional: bool = False) -> tuple[Value, Value]:
        """`(y, h_n)` of one GRU layer (gates r, z, n; PyTorch's reset applied after `W_hn h + b_hn`)."""
        return self._recurrent("gru", x, w_ih, w_hh, (b_ih, b_hh), (h0,), bidirectional)

    def rnn(self, x: Value, w_ih: Value, w_hh: Value, bias: Value, h0: Value | None = None,
            bidirectional: bool = False, nonlinearity: str = "tanh") -> tuple[Value, Value]:
        """`(y, h_n)` of one Elman RNN layer, `h' = tanh|relu(W_ih x + W_hh h + bias)`."""
        if nonlinearity not in ("tanh", "relu"):
            raise GraphError(f"rnn: nonlinearity is 'tanh' or 'relu', got {nonlinearity!r}")
        return self._recurrent("rnn", x, w_ih, w_hh, (bias,), (h0,), bidirectional, relu=nonlinearity == "relu")

    def _recurrent(self, cell: str, x: Value, w_ih: Value, w_hh: Value, biases: tuple, states: tuple,
                   bidirectional: bool, relu: bool = False) -> tuple:
        given = tuple(s is not None for s in states)
        attrs = {"cell": cell, "bidirectional": bool(bidirectional), "relu": relu, "states": given}
        packed = self.add_node("recurrent", (x, w_ih, w_hh, *biases, *(s for s in states if s is not None)), attrs)
        d = 2 if bidirectional else 1
        return tuple(self.add_node("recurrent_part", (packed, x, w_hh), {"part": p, "directions": d})
                     for p in ("y", *STATES[cell]))


def _dims(ins: list[Node], attrs: dict) -> tuple[int, int, int, int, int]:
    """(batch, seq, input, hidden, directions) of a recurrent node, checking every operand."""
    cell, d = attrs["cell"], 2 if attrs["bidirectional"] else 1
    g = GATES[cell]
    x, w_ih, w_hh = ins[:3]
    biases, states = ins[3:3 + BIASES[cell]], ins[3 + BIASES[cell]:]
    require_f32(cell, *ins)
    require_rank(cell, "x [batch, seq, input]", x, 3)
    require_rank(cell, "w_hh [D·G·H, H]", w_hh, 2)
    b, s, i = x.shape
    h = w_hh.shape[1]
    rows = d * g * h
    if len(w_ih.shape) != 2 or w_ih.shape[0] != rows or not same_dim(i, w_ih.shape[1]) or w_hh.shape[0] != rows \
            or any(n.shape != (rows,) for n in biases):
        raise GraphError(f"{cell}: w_ih {list(w_ih.shape)}, w_hh {list(w_hh.shape)} and biases "
                         f"{[list(n.shape) for n in biases]} must be [{d * g}·H, input], [{d * g}·H, H] and "
                         f"[{d * g}·H] for x {list(x.shape)}")
    for n in states:
        if len(n.shape) != 3 or n.shape[0] != d or n.shape[2] != h or not same_dim(n.shape[1], b):
            raise GraphError(f"{cell}: initial state {list(n.shape)} must be [{d}, batch, {h}]")
    return b, s, i, h, d


def _offsets(b: int, s: int, h: int, d: int) -> dict[str, int]:
    """f32 element offsets of y, h_n and c_n in the packed result `y ‖ h_n ‖ c_n`."""
    y, state = b * s * d * h, d * b * h
    return {"y": 0, "h": y, "c": y + state}


def _packed_elems(cell: str, b: int, s: int, h: int, d: int) -> int:
    """f32 elements of the packed result: y and one `[D, batch, H]` block per carried state."""
    return b * s * d * h + d * b * h * len(STATES[cell])


@infers("recurrent")
def _infer_recurrent(ins: list[Node], attrs: dict) -> tuple:
    b, s, _, h, d = _dims(ins, attrs)
    if DYNAMIC in (b, s):
        return (DYNAMIC,), DType.F32
    return (_packed_elems(attrs["cell"], b, s, h, d),), DType.F32


@infers("recurrent_part")
def _infer_recurrent_part(ins: list[Node], attrs: dict) -> tuple:
    _, x, w_hh = ins
    (b, s, _), h, d = x.shape, w_hh.shape[1], attrs["directions"]
    return ((b, s, d * h) if attrs["part"] == "y" else (d, b, h)), DType.F32


@lowers("recurrent")
def lower_recurrent(ctx: LowerContext, node: Node) -> None:
    """Copy the initial states (or zeros) into the packed h_n/c_n slots, then one carrying Lstm/Gru/Rnn thunk."""
    cell, attrs = node.attrs["cell"], node.attrs
    x, w_ih, w_hh, *rest = node.inputs
    biases, given = rest[:BIASES[cell]], iter(rest[BIASES[cell]:])
    b, s, i, h, d = _dims([ctx.node(n) for n in node.inputs], attrs)
    at_elem = _offsets(b, s, h, d)
    out = ctx.view(node.id)
    state_bytes = 4 * d * b * h
    slots = {}
    for name, present in zip(STATES[cell], attrs["states"]):
        slot = dataclasses.replace(out, offset=out.offset + 4 * at_elem[name], nbytes=state_bytes)
        src = next(given) if present else constant_buffer(ctx, np.zeros(d * b * h, np.float32), f"%{node.id} {name}0")
        ctx.emit(lambda at, src=src, slot=slot: T.Copy(src=at(src), dst=at(slot), len=d * b * h),
                 reads=[src], writes=[slot])
        slots[name] = slot
    y = dataclasses.replace(out, nbytes=4 * b * s * d * h)
    common = dict(batch=b, seq=s, input_size=i, hidden=h, num_layers=1, bidirectional=attrs["bidirectional"],
                  carry=True)

    def build(at):
        fields = dict(x=at(x), w_ih=at(w_ih), w_hh=at(w_hh), dst=at(y), h0=at(slots["h"]), **common)
        if cell == "lstm":
            return T.Lstm(bias=at(biases[0]), c0=at(slots["c"]), **fields)
        if cell == "gru":
            return T.Gru(b_ih=at(biases[0]), b_hh=at(biases[1]), **fields)
        return T.Rnn(bias=at(biases[0]), relu=attrs["relu"], **fields)

    ctx.emit(build, reads=[x, w_ih, w_hh, *biases, *slots.values()], writes=[y, *slots.values()])


@lowers("recurrent_part")
def lower_recurrent_part(ctx: LowerContext, node: Node) -> None:
    """A view of one part of the packed result."""
    packed, x, w_hh = node.inputs
    (b, s, _), h = ctx.node(x).shape, ctx.node(w_hh).shape[1]
    ctx.alias(node.id, packed, 4 * _offsets(b, s, h, node.attrs["directions"])[node.attrs["part"]])
