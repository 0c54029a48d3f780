"""Reverse-mode autodiff: `grad(g, wrt)` → a new graph computing `[loss, d_wrt…]`, as pyrlx's `grad`.

    gg = rl.grad(g, wrt=["w1", "b1"])        # values, node ids or param/input names
    cg = rl.Session().compile(gg)            # inputs: g's inputs + "d_output" (the seed, shape [1])
    loss, dw1, db1 = cg.run({"x": x, "d_output": np.ones(1, np.float32)})

The forward nodes are copied into the new graph, then visited in reverse, each adding its inputs'
adjoints by its vector-Jacobian product: one rule per op in `VJPS`, registered with `@vjp(op)`.
Rules build ordinary graph nodes (plus the gradient ops of `backward` that map onto backward
thunks), so the backward graph is specialized, fused, planned and lowered like any other.  The
source graph is not changed.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from ..ops import Activation, BinaryOp, MaskKind, ReduceOp
from .backward import (THUNK_DERIVATIVES, activation_backward, attention_backward, broadcast_as, conv2d_backward,
                       cumsum_backward, gather_backward, max_pool2d_backward, narrow_backward, norm_backward,
                       reciprocal_count, reshape_as, rope_backward)
from .core import DYNAMIC, GraphCore, GraphError, Node, Value, numel
from .losses import softmax_cross_entropy_backward

SEED = "d_output"


class _NotDifferentiable:
    """A rule's answer for an input it cannot differentiate (an error only if the loss needs that gradient)."""

    def __repr__(self) -> str:
        return "NOT_DIFFERENTIABLE"


NOT_DIFFERENTIABLE = _NotDifferentiable()

# rule(g, node, inputs, output, d_output) → per input an adjoint, None (zero) or NOT_DIFFERENTIABLE
VjpRule = Callable[[GraphCore, Node, list[Value], Value, Value], Sequence["Value | None"]]
VJPS: dict[str, VjpRule] = {}


def vjp(*ops: str) -> Callable[[VjpRule], VjpRule]:
    """Register the vector-Jacobian product of graph ops `ops`."""
    def register(fn: VjpRule) -> VjpRule:
        for op in ops:
            VJPS[op] = fn
        return fn
    return register


# ── the transform ───────────────────────────────────────────────────────────

def grad(graph: GraphCore, wrt: Sequence["Value | int | str"]) -> GraphCore:
    """A new graph with outputs `[loss, d_wrt…]` and the extra input `"d_output"`: the loss's seed, shape `[1]`.

    `graph` must have one output of one element (shape `[]` or `[1]`, f32): the loss."""
    loss = _loss(graph)
    targets = [_resolve(graph, w) for w in wrt]
    g = type(graph)(f"{graph.name}.grad")
    g.nodes, g.inputs, g.params = list(graph.nodes), dict(graph.inputs), dict(graph.params)
    if SEED in g.inputs or SEED in g.params:
        raise GraphError(f"grad: graph {graph.name!r} already has an input or param named {SEED!r}")
    seed = reshape_as(g, g.input(SEED, [1], "f32"), g.value(loss.id))
    adjoint = backpropagate(g, loss, seed, set(targets))
    g.set_outputs([loss.id] + [adjoint.get(t) or zeros_like(g, g.value(t)) for t in targets])
    return g


def backpropagate(g: GraphCore, loss: Node, seed: Value, targets: set[int]) -> dict[int, Value]:
    """Adjoints of every node between `targets` and `loss`, accumulated in reverse build order."""
    needs = _depends_on(g, targets, loss.id)
    adjoint: dict[int, Value] = {loss.id: seed}
    for node in reversed(g.nodes[:loss.id + 1]):
        dy = adjoint.get(node.id)
        if dy is None or not any(i in needs for i in node.inputs):
            continue
        rule = VJPS.get(node.op)
        if rule is None:
            raise GraphError(f"grad: %{node.id} {node.op} has no gradient rule (differentiable ops: "
                             f"{', '.join(sorted(VJPS))})")
        for i, d in zip(node.inputs, rule(g, node, [g.value(i) for i in node.inputs], g.value(node.id), dy)):
            if d is None or i not in needs:
                continue
            if d is NOT_DIFFERENTIABLE:
                raise GraphError(f"grad: %{node.id} {node.op} has no gradient with respect to its input %{i}")
            adjoint[i] = g.add(adjoint[i], d) if i in adjoint else d
    return adjoint


def _loss(graph: GraphCore) -> Node:
    if len(graph.outputs) != 1:
        raise GraphError(f"grad: graph {graph.name!r} must have exactly one output (the loss), "
                         f"it has {len(graph.outputs)}")
    loss = graph.nodes[graph.outputs[0]]
    if DYNAMIC in loss.shape or numel(loss.shape) != 1 or not loss.dtype.is_float:
        raise GraphError(f"grad: the loss %{loss.id} {loss.op} must be one float element, got shape "
                         f"{list(loss.shape)} {loss.dtype.value} (reduce it with sum or mean)")
    return loss


def _resolve(graph: GraphCore, w: "Value | int | str") -> int:
    if isinstance(w, str):
        found = graph.params.get(w, graph.inputs.get(w))
        if found is None:
            raise GraphError(f"grad: {w!r} is neither a param nor an input of graph {graph.name!r}")
        return found
    return graph._id(w, "grad")


def _depends_on(g: GraphCore, targets: set[int], last: int) -> set[int]:
    """Float and complex nodes up to `last` whose value depends on a target (the ones that need adjoints);
    integer and bool results (compare, argmax, sample…) are piecewise constant and carry no gradient."""
    needs = set(targets)
    for node in g.nodes[:last + 1]:
        if (node.dtype.is_float or node.dtype.is_complex) and any(i in needs for i in node.inputs):
            needs.add(node.id)
    return needs


def zeros_like(g: GraphCore, x: Value) -> Value:
    """Zeros of `x`'s shape (the gradient of a value the loss does not depend on)."""
    return broadcast_as(g, g.constant(0.0), x, range(x.ndim))


def unbroadcast(g: GraphCore, d: Value, like: Value) -> Value:
    """`d` summed over the axes along which `like` was broadcast: the adjoint of a broadcast."""
    lead = d.ndim - like.ndim
    if lead:
        d = g.sum(d, list(range(lead)))
    axes = [i for i, (a, b) in enumerate(zip(like.shape, d.shape)) if a == 1 and b != 1]
    return g.sum(d, axes, keep_dim=True) if axes else d


# ── element-wise ────────────────────────────────────────────────────────────

def _binary_partials(g: GraphCore, op: BinaryOp, a: Value, b: Value, y: Value, dy: Value) -> tuple:
    """(∂y/∂a·dy, ∂y/∂b·dy) at the broadcast shape."""
    if op is BinaryOp.Add:
        return dy, dy
    if op is BinaryOp.Sub:
        return dy, -dy
    if op is BinaryOp.Mul:
        return dy * b, dy * a
    if op is BinaryOp.Div:
        return dy / b, -(dy * y) / b
    if op in (BinaryOp.Max, BinaryOp.Min):
        a_wins = a >= b if op is BinaryOp.Max else a <= b            # ties go to a
        zero = g.constant(0.0)
        return g.where_(a_wins, dy, zero), g.where_(a_wins, zero, dy)
    if op is BinaryOp.Pow:
        return dy * b * g.pow(a, b - 1.0), dy * y * g.log(a)
    if op is BinaryOp.Atan2:
        r2 = a * a + b * b
        return dy * b / r2, -(dy * a) / r2
    raise GraphError(f"grad: binary {op.name.lower()} has no gradient rule")


@vjp("binary")
def _vjp_binary(g, node, ins, y, dy):
    a, b = ins
    da, db = _binary_partials(g, node.attrs["op"], a, b, y, dy)
    return unbroadcast(g, da, a), unbroadcast(g, db, b)


def _d_hard_sigmoid(g: GraphCore, x: Value) -> Value:
    return g.where_(g.activation("abs", x) < 3.0, g.constant(1.0 / 6.0), g.constant(0.0))


# Derivatives of the activations ActivationBackward does not compute, composed from forward ops.
COMPOSED_DERIVATIVES: dict[Activation, Callable[[GraphCore, Value], Value]] = {
    Activation.Erf: lambda g, x: g.exp(-(x * x)) * (2.0 / math.sqrt(math.pi)),
    Activation.Softsign: lambda g, x: g.activation("recip", (g.activation("abs", x) + 1.0) ** 2.0),
    Activation.LogSigmoid: lambda g, x: g.sigmoid(-x),
    Activation.HardSigmoid: _d_hard_sigmoid,
    Activation.HardSwish: lambda g, x: g.activation("hard_sigmoid", x) + x * _d_hard_sigmoid(g, x),
    Activation.Mish: lambda g, x: _d_mish(g, x),
}


def _d_mish(g: GraphCore, x: Value) -> Value:
    t = g.tanh(g.activation("softplus", x))
    return t + x * (1.0 - t * t) * g.sigmoid(x)


def activation_grad(g: GraphCore, act: Activation, x: Value, dy: Value) -> Value:
    """`act'(x)·dy`: the backward thunk where there is one, else the composed derivative."""
    if act in THUNK_DERIVATIVES:
        return activation_backward(g, act, x, dy)
    return dy * COMPOSED_DERIVATIVES[act](g, x)


@vjp("activation")
def _vjp_activation(g, node, ins, y, dy):
    return [activation_grad(g, node.attrs["act"], ins[0], dy)]


@vjp("compare")
def _vjp_compare(g, node, ins, y, dy):
    return [None, None]


@vjp("where")
def _vjp_where(g, node, ins, y, dy):
    cond, a, b = ins
    zero = g.constant(0.0)
    return None, unbroadcast(g, g.where_(cond, dy, zero), a), unbroadcast(g, g.where_(cond, zero, dy), b)


@vjp("cast")
def _vjp_cast(g, node, ins, y, dy):
    x = ins[0]
    return [g.cast(dy, x.dtype) if x.dtype.is_float else None]


# ── linear algebra ──────────────────────────────────────────────────────────

def matmul_grads(g: GraphCore, a: Value, b: Value, dy: Value) -> tuple[Value, Value]:
    """(dy·bᵀ, aᵀ·dy), each summed back over the batch axes its operand was broadcast along."""
    return unbroadcast(g, dy @ b.T, a), unbroadcast(g, a.T @ dy, b)


@vjp("matmul")
def _vjp_matmul(g, node, ins, y, dy):
    return matmul_grads(g, ins[0], ins[1], dy)


@vjp("fused_matmul_bias_act")
def _vjp_fused_matmul(g, node, ins, y, dy):
    x, w, b = ins
    act = node.attrs["act"]
    dz = dy if act is None else activation_grad(g, act, x @ w + b, dy)   # recompute the pre-activation
    return (*matmul_grads(g, x, w, dz), unbroadcast(g, dz, b))


@vjp("lora_matmul")
def _vjp_lora(g, node, ins, y, dy):
    x, w, a, b = ins
    dx_w, dw = matmul_grads(g, x, w, dy)
    dt, db = matmul_grads(g, x @ a, b, dy * node.attrs["scale"])       # recompute the low-rank activations
    dx_a, da = matmul_grads(g, x, a, dt)
    return dx_w + dx_a, dw, da, db


@vjp("dense_solve")
def _vjp_dense_solve(g, node, ins, y, dy):
    """X = A⁻¹B: dB = A⁻ᵀ·dX, dA = −dB·Xᵀ."""
    a, b = ins
    db = g.dense_solve(a.T, dy)
    if b.ndim == 1:
        return -(g.reshape(db, [-1, 1]) * g.reshape(y, [1, -1])), db
    return -(db @ y.T), db


# ── reductions ──────────────────────────────────────────────────────────────

@vjp("reduce")
def _vjp_reduce(g, node, ins, y, dy):
    x = ins[0]
    op, axes = node.attrs["op"], node.attrs["axes"]
    spread = broadcast_as(g, dy, x, axes)
    if op is ReduceOp.Sum:
        return [spread]
    if op is ReduceOp.Mean:
        return [spread * reciprocal_count(g, x, axes)]
    if op is ReduceOp.Prod:
        return [broadcast_as(g, dy * y, x, axes) / x]
    hit = g.eq_(x, broadcast_as(g, y, x, axes))                       # max/min: every tie gets dy
    return [g.where_(hit, spread, g.constant(0.0))]


@vjp("softmax")
def _vjp_softmax(g, node, ins, y, dy):
    return [y * (dy - g.sum(dy * y, node.attrs["axis"], keep_dim=True))]


@vjp("cumsum")
def _vjp_cumsum(g, node, ins, y, dy):
    return [cumsum_backward(g, dy, node.attrs["exclusive"])]


# ── shape ───────────────────────────────────────────────────────────────────

@vjp("reshape")
def _vjp_reshape(g, node, ins, y, dy):
    return [reshape_as(g, dy, ins[0])]


@vjp("transpose")
def _vjp_transpose(g, node, ins, y, dy):
    perm = node.attrs["perm"]
    return [g.transpose(dy, sorted(range(len(perm)), key=perm.__getitem__))]


@vjp("narrow")
def _vjp_narrow(g, node, ins, y, dy):
    x = ins[0]
    return [narrow_backward(g, dy, x, node.attrs["axis"] % x.ndim, node.attrs["start"])]


@vjp("concat")
def _vjp_concat(g, node, ins, y, dy):
    axis = node.attrs["axis"] % y.ndim
    sizes = [x.shape[axis] for x in ins]
    if DYNAMIC in sizes:
        raise GraphError(f"grad: %{node.id} concat along a dynamic axis ({sizes}) has no gradient rule")
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    return [g.narrow(dy, axis, s, n) for s, n in zip(starts, sizes)]


@vjp("gather")
def _vjp_gather(g, node, ins, y, dy):
    table, idx = ins
    return gather_backward(g, dy, idx, table, node.attrs["axis"] % table.ndim), None


# ── layers and losses ───────────────────────────────────────────────────────

@vjp("layer_norm", "rms_norm")
def _vjp_norm(g, node, ins, y, dy):
    x, gamma, beta = ins
    eps = node.attrs["eps"]
    return (norm_backward(g, node.op, "input", x, gamma, dy, eps), norm_backward(g, node.op, "gamma", x, gamma, dy, eps),
            unbroadcast(g, dy, beta))


@vjp("softmax_cross_entropy")
def _vjp_sce(g, node, ins, y, dy):
    logits, labels = ins
    return softmax_cross_entropy_backward(g, logits, labels, dy), None


# ── convolution, pooling, attention ─────────────────────────────────────────

@vjp("conv2d")
def _vjp_conv2d(g, node, ins, y, dy):
    x, w = ins
    return conv2d_backward(g, "input", dy, w, x, node.attrs), conv2d_backward(g, "weight", x, dy, w, node.attrs)


@vjp("max_pool2d")
def _vjp_max_pool2d(g, node, ins, y, dy):
    return [max_pool2d_backward(g, ins[0], dy, node.attrs)]


@vjp("avg_pool2d")
def _vjp_avg_pool2d(g, node, ins, y, dy):
    """The transposed depthwise convolution of dy with a kernel of 1/(kh·kw) (padding taps drop)."""
    x = ins[0]
    c, (kh, kw) = x.shape[1], node.attrs["kernel"]
    if c == DYNAMIC:
        raise GraphError(f"grad: %{node.id} avg_pool2d needs a static channel count, got {list(x.shape)}")
    ones = g.constant(np.full((c, 1, kh, kw), 1.0 / (kh * kw), np.float32))
    conv = {"stride": node.attrs["stride"], "padding": node.attrs["padding"], "dilation": (1, 1), "groups": c}
    return [conv2d_backward(g, "input", dy, ones, x, conv)]


@vjp("rope")
def _vjp_rope(g, node, ins, y, dy):
    x, cos, sin = ins
    return rope_backward(g, dy, cos, sin, node.attrs), NOT_DIFFERENTIABLE, NOT_DIFFERENTIABLE


@vjp("attention")
def _vjp_attention(g, node, ins, y, dy):
    """AttentionBackwardAll (one recompute for dQ, dK, dV), which takes K/V heads = heads and scale 1/√D: a
    scale s is folded into q (q·s√D), grouped K/V heads are repeated per query head and summed back."""
    q, k, v, *mask = ins
    a = node.attrs
    d, heads = a["head_dim"], a["heads"]
    kv_heads = k.shape[-1] // d
    if v.shape[-1] != k.shape[-1]:
        raise GraphError(f"grad: %{node.id} attention has a gradient when values have the head_dim of keys "
                         f"only, got k {list(k.shape)} and v {list(v.shape)}")
    fold = a["scale"] * math.sqrt(d)
    scaled = not math.isclose(fold, 1.0)
    kr, vr = (_repeat_heads(g, node, x, kv_heads, heads // kv_heads, d) for x in (k, v))
    dq, dk, dv = attention_backward(g, (q * fold if scaled else q, kr, vr, *mask), dy, a)
    grads = [dq * fold if scaled else dq] + [_sum_heads(g, dx, x, kv_heads, heads // kv_heads, d)
                                             for dx, x in ((dk, k), (dv, v))]
    return grads + [None if a["mask_kind"] == MaskKind.Custom else NOT_DIFFERENTIABLE for _ in mask]


def _repeat_heads(g: GraphCore, node: Node, x: Value, kv_heads: int, rep: int, d: int) -> Value:
    """`[b, kv, kv_heads·d]` → `[b, kv, kv_heads·rep·d]`: each K/V head repeated for its `rep` query heads."""
    if rep == 1:
        return x
    if x.shape[1] == DYNAMIC:
        raise GraphError(f"grad: %{node.id} attention with grouped K/V heads needs a static kv_seq, got {list(x.shape)}")
    ones = g.constant(np.ones((1, 1, rep, 1), np.float32))
    return g.reshape(g.reshape(x, [-1, kv_heads, 1, d]) * ones, [-1, x.shape[1], kv_heads * rep * d])


def _sum_heads(g: GraphCore, dx: Value, like: Value, kv_heads: int, rep: int, d: int) -> Value:
    """The adjoint of `_repeat_heads`: the `rep` copies of each head summed."""
    return dx if rep == 1 else reshape_as(g, g.sum(g.reshape(dx, [-1, kv_heads, rep, d]), 2), like)


# ── optimizers ──────────────────────────────────────────────────────────────

def sgd_momentum(g: GraphCore, p: Value, v: Value, d: Value, lr: float, mom: float) -> tuple[Value, Value]:
    """One SGD-with-momentum step in the graph: `v' = mom·v + d`, `p' = p − lr·v'` (RLX's SgdMomentum)."""
    v_next = v * mom + d
    return p - v_next * lr, v_next
