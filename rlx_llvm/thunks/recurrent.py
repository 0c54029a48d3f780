"""Recurrences and state-space scans: Mamba-1/2, gated DeltaNet, LSTM / GRU / RNN (semantics.md §3.9).

All tensors are f32.  Recurrent weights are packed per (layer, direction), layer-major;
`D = 2` when bidirectional.
"""
from __future__ import annotations

from typing import ClassVar, Iterable

from .base import F32, Extent, Thunk, u32, usize


class SelectiveScan(Thunk):
    """Mamba-1 selective scan: x, delta `[b,s,hidden]`, a `[hidden,n]`, b, c `[b,s,n]` → y `[b,s,hidden]`."""

    family = "recurrent"

    x: usize
    delta: usize
    a: usize
    b: usize
    c: usize
    dst: usize
    batch: u32
    seq: u32
    hidden: u32
    state_size: u32

    def _reads(self) -> Iterable[Extent]:
        bs = self.batch * self.seq
        yield self.span("x", F32 * bs * self.hidden)
        yield self.span("delta", F32 * bs * self.hidden)
        yield self.span("a", F32 * self.hidden * self.state_size)
        yield self.span("b", F32 * bs * self.state_size)
        yield self.span("c", F32 * bs * self.state_size)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.batch * self.seq * self.hidden)


class Mamba2(Thunk):
    """Mamba-2 / SSD scan: x `[B,S,H,P]`, dt `[B,S,H]`, a `[H]`, b, c `[B,S,H,N]` → y `[B,S,H,P]`."""

    family = "recurrent"

    x: usize
    dt: usize
    a: usize
    b: usize
    c: usize
    dst: usize
    batch: u32
    seq: u32
    heads: u32
    head_dim: u32
    state_size: u32

    def _reads(self) -> Iterable[Extent]:
        bsh = self.batch * self.seq * self.heads
        yield self.span("x", F32 * bsh * self.head_dim)
        yield self.span("dt", F32 * bsh)
        yield self.span("a", F32 * self.heads)
        yield self.span("b", F32 * bsh * self.state_size)
        yield self.span("c", F32 * bsh * self.state_size)

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.batch * self.seq * self.heads * self.head_dim)


class _DeltaNet(Thunk):
    """Operand sizes of the gated DeltaNet thunks: q, k, v `[b,s,h,n]`, g, beta `[b,s,h]`, state `[b,h,n,n]`."""

    family = "recurrent"

    @property
    def qkv_elems(self) -> int:
        """Elements of q, k, v, dy and the output: `[b, s, h, n]`."""
        return self.batch * self.seq * self.heads * self.state_size

    @property
    def beta_elems(self) -> int:
        """Elements of beta: `[b, s, h]`."""
        return self.batch * self.seq * self.heads

    @property
    def gate_elems(self) -> int:
        """Elements of g: `[b, s, h, n]` when per-channel, else `[b, s, h]`."""
        return self.qkv_elems if self.gate_per_channel else self.beta_elems

    @property
    def state_elems(self) -> int:
        """Elements of the carried state `[b, h, n, n]` (0 without `carry_state`)."""
        return self.batch * self.heads * self.state_size ** 2 if self.carry_state else 0

    def _reads(self) -> Iterable[Extent]:
        for name in ("q", "k", "v"):
            yield self.span(name, F32 * self.qkv_elems)
        yield self.span("g", F32 * self.gate_elems)
        yield self.span("beta", F32 * self.beta_elems)
        yield self.span("state", F32 * self.state_elems)


class GatedDeltaNet(_DeltaNet):
    """Gated DeltaNet linear-attention scan; with `carry_state` the state is loaded from and written back to `state`."""

    q: usize
    k: usize
    v: usize
    g: usize
    beta: usize
    state: usize
    dst: usize
    batch: u32
    seq: u32
    heads: u32
    state_size: u32
    gate_per_channel: bool
    carry_state: bool

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.qkv_elems)
        yield self.span("state", F32 * self.state_elems)


class GatedDeltaNetBackward(_DeltaNet):
    """Fused backward of GatedDeltaNet into the packed `[dq ‖ dk ‖ dv ‖ dg ‖ dbeta ‖ dstate]` bundle."""

    q: usize
    k: usize
    v: usize
    g: usize
    beta: usize
    state: usize
    dy: usize
    dst: usize
    batch: u32
    seq: u32
    heads: u32
    state_size: u32
    gate_per_channel: bool
    carry_state: bool

    def _reads(self) -> Iterable[Extent]:
        yield from super()._reads()
        yield self.span("dy", F32 * self.qkv_elems)

    def parts(self) -> list[tuple[str, int]]:
        """The packed dst in order: (input whose gradient it holds, f32 elements), dstate empty without carry."""
        return [("q", self.qkv_elems), ("k", self.qkv_elems), ("v", self.qkv_elems), ("g", self.gate_elems),
                ("beta", self.beta_elems), ("state", self.state_elems)]

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * sum(count for _, count in self.parts()))


class _Recurrent(Thunk):
    """Packed multi-layer, optionally bidirectional recurrence over x `[batch, seq, input_size]`."""

    family = "recurrent"
    gates: ClassVar[int]
    carried: ClassVar[tuple[str, ...]]  # initial-state buffers, read and written back with `carry`
    biases: ClassVar[tuple[str, ...]]

    @property
    def directions(self) -> int:
        """2 when bidirectional, else 1."""
        return 2 if self.bidirectional else 1

    def weight_elems(self) -> tuple[int, int, int]:
        """Elements of (w_ih, w_hh, one bias vector) over every layer and direction."""
        d, h, g, layers = self.directions, self.hidden, self.gates, self.num_layers
        w_ih = d * g * h * (self.input_size + (layers - 1) * d * h) if layers else 0
        return w_ih, layers * d * g * h * h, layers * d * g * h

    def _state(self) -> Iterable[Extent]:
        if self.carry:
            for name in self.carried:
                yield self.span(name, F32 * self.num_layers * self.directions * self.batch * self.hidden)

    def _reads(self) -> Iterable[Extent]:
        w_ih, w_hh, bias = self.weight_elems()
        yield self.span("x", F32 * self.batch * self.seq * self.input_size)
        yield self.span("w_ih", F32 * w_ih)
        yield self.span("w_hh", F32 * w_hh)
        for name in self.biases:
            yield self.span(name, F32 * bias)
        yield from self._state()

    def _writes(self) -> Iterable[Extent]:
        yield self.span("dst", F32 * self.batch * self.seq * self.directions * self.hidden)
        yield from self._state()


class Lstm(_Recurrent):
    """LSTM (gates i, f, g, o; one combined bias); `dst` is `[batch, seq, D·hidden]`, `h0`/`c0` `[L·D, batch, hidden]`."""

    gates, carried, biases = 4, ("h0", "c0"), ("bias",)

    x: usize
    w_ih: usize
    w_hh: usize
    bias: usize
    h0: usize
    c0: usize
    dst: usize
    batch: u32
    seq: u32
    input_size: u32
    hidden: u32
    num_layers: u32
    bidirectional: bool
    carry: bool


class Gru(_Recurrent):
    """GRU (gates r, z, n; separate `b_ih`, `b_hh`); `dst` is `[batch, seq, D·hidden]`, `h0` `[L·D, batch, hidden]`."""

    gates, carried, biases = 3, ("h0",), ("b_ih", "b_hh")

    x: usize
    w_ih: usize
    w_hh: usize
    b_ih: usize
    b_hh: usize
    h0: usize
    dst: usize
    batch: u32
    seq: u32
    input_size: u32
    hidden: u32
    num_layers: u32
    bidirectional: bool
    carry: bool


class Rnn(_Recurrent):
    """Elman RNN (tanh, or relu with `relu`; one merged bias); `h0` `[L·D, batch, hidden]`."""

    gates, carried, biases = 1, ("h0",), ("bias",)

    x: usize
    w_ih: usize
    w_hh: usize
    bias: usize
    h0: usize
    dst: usize
    batch: u32
    seq: u32
    input_size: u32
    hidden: u32
    num_layers: u32
    bidirectional: bool
    carry: bool
    relu: bool
