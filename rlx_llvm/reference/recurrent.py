"""NumPy references of `Lstm`, `Gru` and `Rnn` (semantics.md §3.9; docs/lowering-recurrent.md).

Float64 throughout, rounded to f32 once when stored.  Every layer and direction projects the whole
sequence at once (`zx = x·W_ihᵀ + b`), then steps the cell over time: forward t = 0…S−1, reverse
t = S−1…0 (PyTorch's convention); a layer's output is `[fwd ‖ rev]` on the feature axis and the
next layer's input.  With `carry` the initial states come from `h0` (`c0`) `[L·D, batch, H]` and the
final ones are written back there.
"""
from __future__ import annotations

from typing import Callable, Iterator, NamedTuple

import numpy as np

from .. import thunks as T
from . import read_f64, reference, write_f32

# cell(zx, zh, h, c) → (h', c'): zx = x·W_ihᵀ + input-side bias, zh = h·W_hhᵀ + hidden-side bias.
Cell = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1/(1 + e^−x) (e^−x may overflow to inf: the result is then 0)."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def lstm_cell(zx: np.ndarray, zh: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gates i, f, g, o: `c' = σ(f)·c + σ(i)·tanh(g)`, `h' = σ(o)·tanh(c')`."""
    i, f, g, o = np.split(zx + zh, 4, axis=-1)
    c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
    return sigmoid(o) * np.tanh(c), c


def gru_cell(zx: np.ndarray, zh: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gates r, z, n: `n = tanh(x_n + r·(W_hn h + b_hn))`, `h' = (1 − z)·n + z·h`."""
    xr, xz, xn = np.split(zx, 3, axis=-1)
    hr, hz, hn = np.split(zh, 3, axis=-1)
    r, z = sigmoid(xr + hr), sigmoid(xz + hz)
    n = np.tanh(xn + r * hn)
    return (1.0 - z) * n + z * h, c


def rnn_cell(relu: bool) -> Cell:
    """`h' = act(zx + zh)`, act = tanh or RLX's Relu (Rust `max(x, 0)`: NaN → 0, −0 → +0)."""
    def cell(zx: np.ndarray, zh: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        z = zx + zh
        return (np.where(z > 0.0, z, 0.0) if relu else np.tanh(z)), c
    return cell


class Weights(NamedTuple):
    """One (layer, direction) of packed weights, as float64."""

    w_ih: np.ndarray  # [G·H, in_l]
    w_hh: np.ndarray  # [G·H, H]
    b_x: np.ndarray   # input-side bias [G·H] (the combined bias of Lstm/Rnn, b_ih of Gru)
    b_h: np.ndarray   # hidden-side bias [G·H] (b_hh of Gru, else zeros)


def layer_inputs(t: T._Recurrent, layer: int) -> int:
    """`in_l`: input_size for layer 0, D·H after."""
    return t.input_size if layer == 0 else t.directions * t.hidden


def weights(arena: np.ndarray, t: T._Recurrent) -> Iterator[Weights]:
    """Every (layer, direction)'s weights, layer-major then direction."""
    gh, h = t.gates * t.hidden, t.hidden
    w_ih_at = 0
    for layer in range(t.num_layers):
        n_in = layer_inputs(t, layer)
        for d in range(t.directions):
            k = layer * t.directions + d
            biases = [read_f64(arena, getattr(t, name) + 4 * k * gh, gh) for name in t.biases]
            yield Weights(read_f64(arena, t.w_ih + 4 * w_ih_at, gh * n_in).reshape(gh, n_in),
                          read_f64(arena, t.w_hh + 4 * k * gh * h, gh * h).reshape(gh, h),
                          biases[0], biases[1] if len(biases) > 1 else np.zeros(gh))
            w_ih_at += gh * n_in


def initial_state(arena: np.ndarray, t: T._Recurrent, name: str) -> np.ndarray:
    """`[L·D, batch, H]`: read from `name` with `carry`, else zeros."""
    shape = (t.num_layers * t.directions, t.batch, t.hidden)
    if t.carry and name in t.carried:
        return read_f64(arena, getattr(t, name), int(np.prod(shape))).reshape(shape)
    return np.zeros(shape)


def run_recurrent(arena: np.ndarray, t: T._Recurrent, cell: Cell) -> None:
    """Every layer and direction in order; writes dst (and the final states with `carry`)."""
    b, s, hidden, dirs = t.batch, t.seq, t.hidden, t.directions
    inp = read_f64(arena, t.x, b * s * t.input_size).reshape(b, s, t.input_size)
    h_all, c_all = initial_state(arena, t, "h0"), initial_state(arena, t, "c0")
    packed = weights(arena, t)
    for layer in range(t.num_layers):
        outs = []
        for d in range(dirs):
            w, k = next(packed), layer * dirs + d
            zx = inp @ w.w_ih.T + w.b_x
            h, c = h_all[k], c_all[k]
            y = np.zeros((b, s, hidden))
            for step in (range(s) if d == 0 else range(s - 1, -1, -1)):
                h, c = cell(zx[:, step], h @ w.w_hh.T + w.b_h, h, c)
                y[:, step] = h
            h_all[k], c_all[k] = h, c
            outs.append(y)
        inp = np.concatenate(outs, axis=-1)
    write_f32(arena, t.dst, inp)
    if t.carry:
        for name, state in zip(("h0", "c0"), (h_all, c_all)):
            if name in t.carried:
                write_f32(arena, getattr(t, name), state)


@reference(T.Lstm)
def lstm(arena: np.ndarray, t: T.Lstm) -> None:
    """LSTM, gates i, f, g, o; one combined bias."""
    run_recurrent(arena, t, lstm_cell)


@reference(T.Gru)
def gru(arena: np.ndarray, t: T.Gru) -> None:
    """GRU, gates r, z, n; b_hh inside the reset product for n."""
    run_recurrent(arena, t, gru_cell)


@reference(T.Rnn)
def rnn(arena: np.ndarray, t: T.Rnn) -> None:
    """Elman RNN, tanh or relu."""
    run_recurrent(arena, t, rnn_cell(t.relu))
