"""Convolution fusion: a narrow-output `conv2d` with its per-channel bias and activation → one GEMM.

    act(conv2d(x, W) + b)           W a constant [c_out, c_in, kh, kw], b a constant per channel, act optional
      → transpose(act(im2col(x) @ Wᵀ + b))      im2col: Im2Col thunk; the product: one FusedMmBiasAct

`conv2d` computes `W[c_out, K]·col[K, P]` per image, `P = h_out·w_out` output positions.  When P is small
(a 1-D model's few frames, an encoder's last stages — silero-vad's convolutions have P = 3, 2, 1, 1) that
GEMM is a few columns wide and the bias and activation are two more passes.  Here the positions of every
image are the GEMM's rows instead: `col[n·P, K] @ Wᵀ[K, c_out]`, c_out (the wide dim) across the vector
lanes, bias and activation applied in the GEMM's epilogue, `Wᵀ` packed once at compile time; a Transpose
back to `[n, c_out, P]` (none when P = 1).  Reshapes between the bias add and the activation (what a 1-D
conv imports as) are looked through.  Only grouped-free convolutions of constant weights with
`P ≤ MAX_POSITIONS` are rewritten; wide images keep the Conv2D thunk (its GEMM is already wide).
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..dtypes import DType
from ..ops import BinaryOp
from .core import GraphCore, Node, numel
from .fuse import FUSABLE_ACTS, FusionLog, Rewriter, readers, users
from .lower import LowerContext
from .opset import infers, lowers

MAX_POSITIONS = 64     # output positions per image up to which the positions-as-rows GEMM is used


# ── the im2col op ────────────────────────────────────────────────────────────

@infers("im2col")
def _infer_im2col(ins: list[Node], attrs: dict) -> tuple:
    (n, c, _, _), (kh, kw), (ho, wo) = ins[0].shape, attrs["kernel"], attrs["out"]
    return (n * ho * wo, c * kh * kw), DType.F32


@lowers("im2col")
def lower_im2col(ctx: LowerContext, node: Node) -> None:
    """One Im2Col: `col[(image, oh, ow), (ci, ki, kj)]`, zeros for padded taps."""
    ix, = node.inputs
    n, c, h, w = ctx.node(ix).shape
    a = node.attrs
    (kh, kw), (ho, wo), (sh, sw), (ph, pw), (dh, dw) = a["kernel"], a["out"], a["stride"], a["padding"], a["dilation"]
    ctx.emit(lambda at: T.Im2Col(x=at(ix), col=at(node.id), n=n, c_in=c, h=h, w=w, h_out=ho, w_out=wo, kh=kh, kw=kw,
                                 sh=sh, sw=sw, ph=ph, pw=pw, dh=dh, dw_dil=dw), reads=[ix], writes=[node.id])


# ── the pass ─────────────────────────────────────────────────────────────────

def constant_value(graph: GraphCore, id: int) -> np.ndarray | None:
    """The value of node `id` when it is a constant or a reshape of one (in `id`'s shape), else None."""
    node = graph.nodes[id]
    while node.op == "reshape":
        node = graph.nodes[node.inputs[0]]
    if node.op != "constant":
        return None
    return np.asarray(node.attrs["data"]).reshape(graph.nodes[id].shape)


def channel_bias(graph: GraphCore, add: Node, conv: int) -> np.ndarray | None:
    """`b [c_out]` when `add` is `conv + b` with `b` a constant broadcast per channel (`[c_out, 1, 1]`…)."""
    if add.op != "binary" or add.attrs.get("op") is not BinaryOp.Add:
        return None
    other = add.inputs[1] if add.inputs[0] == conv else add.inputs[0]
    if other == conv or add.shape != graph.nodes[conv].shape:
        return None
    c_out = graph.nodes[conv].shape[1]
    shape = graph.nodes[other].shape
    if len(shape) > 4 or (1,) * (4 - len(shape)) + tuple(shape) != (1, c_out, 1, 1):
        return None
    value = constant_value(graph, other)
    return None if value is None or value.dtype != np.float32 else value.reshape(c_out)


class Chain:
    """`conv [+ bias] [→ reshapes → act]` from one conv2d: the nodes it absorbs, and its last (the root)."""

    def __init__(self, graph: GraphCore, conv: Node, count: dict[int, int], reader: dict[int, list[int]]) -> None:
        self.g, self.count, self.reader = graph, count, reader
        self.conv, self.nodes, self.bias, self.act = conv, [conv.id], None, None
        self.constants = self.private_constant(conv.inputs[1])
        after = self.only_reader(conv.id)
        if after is not None and (bias := channel_bias(graph, after, conv.id)) is not None:
            self.bias = bias
            self.nodes.append(after.id)
            self.constants += self.private_constant(after.inputs[1] if after.inputs[0] == conv.id else after.inputs[0])
        walk, nxt = [], self.only_reader(self.nodes[-1])
        while nxt is not None and nxt.op == "reshape":
            walk.append(nxt.id)
            nxt = self.only_reader(nxt.id)
        if nxt is not None and nxt.op == "activation" and nxt.attrs["act"] in FUSABLE_ACTS:
            self.act = nxt.attrs["act"]
            self.nodes += [*walk, nxt.id]

    def only_reader(self, id: int) -> Node | None:
        """The one node reading `id` (None when it has other readers or is an output)."""
        if self.count[id] != 1 or id in self.g.outputs:
            return None
        return self.g.nodes[self.reader[id][0]]

    def private_constant(self, id: int) -> list[int]:
        """`id` and the reshapes down to its constant when the chain is their only reader (dropped with it)."""
        ids = []
        while self.count[id] == 1 and id not in self.g.outputs:
            ids.append(id)
            if self.g.nodes[id].op != "reshape":
                return ids
            id = self.g.nodes[id].inputs[0]
        return []

    @property
    def root(self) -> Node:
        """The last node of the chain: its result is what the fused form produces."""
        return self.g.nodes[self.nodes[-1]]


def rewritable(graph: GraphCore, node: Node) -> np.ndarray | None:
    """The weight `[c_out, c_in, kh, kw]` of a conv2d this pass rewrites (ungrouped, constant, few positions)."""
    if node.op != "conv2d" or node.attrs["groups"] != 1 or node.dtype != DType.F32 \
            or graph.nodes[node.inputs[0]].dtype != DType.F32 or numel(node.shape[2:]) > MAX_POSITIONS:
        return None
    return constant_value(graph, node.inputs[1])


def fuse_conv_bias_act(graph: GraphCore, log: FusionLog) -> GraphCore:
    """Every rewritable conv2d with its bias and activation → im2col + FusedMmBiasAct (+ Transpose)."""
    count, reader = users(graph), readers(graph)
    chains: dict[int, tuple[Chain, np.ndarray]] = {}
    absorbed: set[int] = set()
    for node in graph.nodes:
        weight = rewritable(graph, node)
        if weight is not None:
            chain = Chain(graph, node, count, reader)
            chains[chain.root.id] = (chain, weight)
            absorbed |= set(chain.nodes[:-1]) | set(chain.constants)
    if not chains:
        return graph
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.id in chains:
            _emit(rw, *chains[node.id])
            chain = chains[node.id][0]
            log.add("conv_bias_act", f"%{node.source_id}: conv2d{' + bias' if chain.bias is not None else ''}"
                                     f"{' + ' + chain.act.name if chain.act else ''} → Im2Col + FusedMmBiasAct")
        elif node.id not in absorbed:
            rw.keep(node)
    return rw.finish()


def _emit(rw: Rewriter, chain: Chain, weight: np.ndarray) -> None:
    """The fused form of `chain`, mapped to its root's id."""
    conv, root = chain.conv, chain.root
    n, c_out, ho, wo = conv.shape
    positions = ho * wo
    a = conv.attrs

    def add(op: str, inputs: tuple, attrs: dict, shape: tuple) -> int:
        new = Node(len(rw.new.nodes), op, inputs, attrs, tuple(shape), DType.F32, origin=root.source_id)
        rw.new.nodes.append(new)
        return new.id

    w_t = np.ascontiguousarray(weight.reshape(c_out, -1).T, np.float32)
    bias = chain.bias if chain.bias is not None else np.zeros(c_out, np.float32)
    col = add("im2col", (rw.map[conv.inputs[0]],), {"kernel": weight.shape[2:], "out": (ho, wo), "stride": a["stride"],
                                                    "padding": a["padding"], "dilation": a["dilation"]},
              (n * positions, w_t.shape[0]))
    w_id = add("constant", (), {"data": w_t}, w_t.shape)
    b_id = add("constant", (), {"data": np.ascontiguousarray(bias, np.float32)}, bias.shape)
    out = add("fused_matmul_bias_act", (col, w_id, b_id), {"act": chain.act}, (n * positions, c_out))
    if positions > 1:
        out = add("reshape", (out,), {"shape": (n, positions, c_out)}, (n, positions, c_out))
        out = add("transpose", (out,), {"perm": (0, 2, 1)}, (n, c_out, positions))
    rw.map[root.id] = add("reshape", (out,), {"shape": root.shape}, root.shape)
