"""rl.grad: every VJP rule against central finite differences of a float64 NumPy evaluation of the graph.

Each group of ops is one graph (one compile): loss = Σ_terms sum(term · R) with fixed random R, so every
term's gradient reaches every input.  The NumPy evaluator is checked against the compiled forward loss.
"""
from __future__ import annotations

import pathlib
import runpy

import numpy as np
import pytest
from scipy.special import erf

import rlx_llvm as rl
from rlx_llvm.graph.autodiff import VJPS, sgd_momentum
from rlx_llvm.graph.elementwise import ACTIVATIONS
from rlx_llvm.ops import Activation as A, BinaryOp as B, MaskKind, ReduceOp as R
from tests.graph.test_ops_nn import attention_ref, conv_ref, pool_ref, rope_ref

RNG = np.random.default_rng(11)
ROOT = pathlib.Path(__file__).resolve().parents[2]
NAMES = {k: name for name, k in ACTIVATIONS.items()}


# ── a float64 NumPy evaluator of graph nodes (the oracle) ───────────────────

def _softplus(x):
    return np.logaddexp(0.0, x)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


ACT = {A.Gelu: lambda x: 0.5 * x * (1 + erf(x / np.sqrt(2))),
       A.GeluApprox: lambda x: 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3))),
       A.Silu: lambda x: x * _sigmoid(x), A.Relu: lambda x: np.maximum(x, 0), A.Sigmoid: _sigmoid,
       A.Tanh: np.tanh, A.Exp: np.exp, A.Log: np.log, A.Sqrt: np.sqrt, A.Rsqrt: lambda x: 1 / np.sqrt(x),
       A.Neg: np.negative, A.Abs: np.abs, A.Sin: np.sin, A.Cos: np.cos, A.Tan: np.tan, A.Atan: np.arctan,
       A.Recip: lambda x: 1 / x, A.Floor: np.floor, A.Ceil: np.ceil, A.Sign: np.sign, A.Softplus: _softplus,
       A.Elu: lambda x: np.where(x > 0, x, np.expm1(x)), A.Erf: erf,
       A.HardSwish: lambda x: x * np.clip(x + 3, 0, 6) / 6, A.HardSigmoid: lambda x: np.clip(x / 6 + 0.5, 0, 1),
       A.Mish: lambda x: x * np.tanh(_softplus(x)), A.Softsign: lambda x: x / (1 + np.abs(x)),
       A.LogSigmoid: lambda x: -_softplus(-x)}
BIN = {B.Add: np.add, B.Sub: np.subtract, B.Mul: np.multiply, B.Div: np.divide, B.Max: np.maximum,
       B.Min: np.minimum, B.Pow: np.power, B.Atan2: np.arctan2}
RED = {R.Sum: np.sum, R.Mean: np.mean, R.Max: np.max, R.Min: np.min, R.Prod: np.prod}
CMP = {"Gt": np.greater, "Lt": np.less, "Ge": np.greater_equal, "Le": np.less_equal, "Eq": np.equal}


def _norm(x, g, b, eps, layer):
    if layer:
        x = x - x.mean(-1, keepdims=True)
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g + b
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g + b


def _softmax(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _cross_entropy(x, labels):
    lse = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)
    return lse - x[np.arange(len(x)), labels.astype(np.int64)]


def _mask_name(kind) -> str:
    if isinstance(kind, MaskKind.SlidingWindow):
        return f"sliding:{kind.w}"
    return "causal" if kind == MaskKind.Causal else "none"


def evaluate(graph, values: dict) -> np.ndarray:
    """The graph's first output in float64, sources by name from `values`."""
    v = []
    for n in graph.nodes:
        x = [v[i] for i in n.inputs]
        a = n.attrs
        if n.op in ("input", "param"):
            out = np.asarray(values[n.name], np.float64)
        elif n.op == "constant":
            out = a["data"].astype(np.float64)
        elif n.op == "binary":
            out = BIN[a["op"]](x[0], x[1])
        elif n.op == "activation":
            out = ACT[a["act"]](x[0])
        elif n.op == "compare":
            out = CMP[a["op"].name](x[0], x[1])
        elif n.op == "where":
            out = np.where(x[0], x[1], x[2])
        elif n.op == "matmul":
            out = x[0] @ x[1]
        elif n.op == "fused_matmul_bias_act":
            z = x[0] @ x[1] + x[2]
            out = z if a["act"] is None else ACT[a["act"]](z)
        elif n.op == "reduce":
            out = RED[a["op"]](x[0], axis=a["axes"], keepdims=a["keep_dim"])
        elif n.op == "softmax":
            out = _softmax(x[0], a["axis"])
        elif n.op == "cumsum":
            out = np.cumsum(x[0], -1) - (x[0] if a["exclusive"] else 0)
        elif n.op == "reshape":
            out = x[0].reshape(a["shape"])
        elif n.op == "transpose":
            out = x[0].transpose(a["perm"])
        elif n.op == "narrow":
            out = np.take(x[0], range(a["start"], a["start"] + a["length"]), axis=a["axis"])
        elif n.op == "concat":
            out = np.concatenate(x, a["axis"])
        elif n.op == "gather":
            out = np.take(x[0], x[1].astype(np.int64), axis=a["axis"])
        elif n.op == "cast":
            out = x[0]
        elif n.op in ("layer_norm", "rms_norm"):
            out = _norm(*x, a["eps"], n.op == "layer_norm")
        elif n.op == "softmax_cross_entropy":
            out = _cross_entropy(*x)
        elif n.op == "lora_matmul":
            out = x[0] @ x[1] + a["scale"] * (x[0] @ x[2]) @ x[3]
        elif n.op == "dense_solve":
            out = np.linalg.solve(*x)
        elif n.op == "conv2d":
            out = conv_ref(*x, a["stride"], a["padding"], a["dilation"], a["groups"])
        elif n.op in ("max_pool2d", "avg_pool2d"):
            out = pool_ref(x[0], a["kernel"], a["stride"], a["padding"], n.op[:3])
        elif n.op == "rope":
            out = rope_ref(*x, a["head_dim"], a["n_rot"], a["interleaved"])
        elif n.op == "attention":
            out = attention_ref(*x[:3], a["heads"], a["head_dim"], x[3] if len(x) == 4 else None,
                                _mask_name(a["mask_kind"]), a["scale"])
        else:
            raise NotImplementedError(n.op)
        v.append(np.asarray(out, np.float64))
    return v[graph.outputs[0]]


def finite_differences(graph, values: dict, name: str, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the loss with respect to source `name`."""
    base = {k: np.asarray(val, np.float64) for k, val in values.items()}
    out = np.zeros_like(base[name])
    for i in np.ndindex(out.shape):
        up, down = dict(base), dict(base)
        up[name], down[name] = base[name].copy(), base[name].copy()
        up[name][i] += eps
        down[name][i] -= eps
        out[i] = (evaluate(graph, up) - evaluate(graph, down)).item() / (2 * eps)
    return out


def check_grad(graph, inputs: dict, params: dict, wrt: list[str], fusion=True, rtol=2e-3, atol=2e-4):
    """rl.grad's outputs equal the finite differences (and its loss the float64 forward)."""
    cg = rl.Session(fusion=fusion).compile(rl.grad(graph, wrt))
    for k, val in params.items():
        cg.set_param(k, val)
    loss, *grads = cg.run({**inputs, "d_output": np.ones(1, np.float32)})
    values = {**inputs, **params}
    np.testing.assert_allclose(loss, evaluate(graph, values).reshape(loss.shape), rtol=1e-4, atol=1e-5)
    for name, got in zip(wrt, grads):
        want = finite_differences(graph, values, name)
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"d loss / d {name}")
    return cg


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def weighted_sum(g, terms):
    """Σ sum(term · R) with a fixed random R per term (so no gradient is trivially uniform)."""
    parts = [g.reshape(g.sum(t * g.constant(f32(*t.shape))), [1]) for t in terms]
    return g.sum(g.concat(parts, 0))


# ── the checks ──────────────────────────────────────────────────────

def test_mlp_mse_gradient_matches_finite_differences():
    g = rl.Graph("mlp")
    x, t = g.input("x", [-1, 4]), g.input("t", [-1, 3])
    h = g.tanh(x @ g.param("w1", [4, 6]) + g.param("b1", [6]))
    g.set_outputs([g.mse(h @ g.param("w2", [6, 3]) + g.param("b2", [3]), t)])
    params = {"w1": f32(4, 6), "b1": f32(6), "w2": f32(6, 3), "b2": f32(3)}
    cg = check_grad(g, {"x": f32(5, 4), "t": f32(5, 3)}, params, ["w1", "b1", "w2", "b2", "x"])
    loss, *_ = cg.run({"x": f32(9, 4), "t": f32(9, 3), "d_output": np.ones(1, np.float32)})   # another batch
    assert loss.shape == () and len(cg._specs) == 2


def test_cross_entropy_gradient_matches_finite_differences():
    g = rl.Graph("classifier")
    x, labels = g.input("x", [-1, 5]), g.input("labels", [-1], "i32")
    logits = g.relu(x @ g.param("w1", [5, 8]) + g.param("b1", [8])) @ g.param("w2", [8, 4])
    g.set_outputs([g.mean(g.softmax_cross_entropy(logits, labels))])
    params = {"w1": f32(5, 8), "b1": f32(8), "w2": f32(8, 4)}
    check_grad(g, {"x": f32(6, 5), "labels": np.array([0, 3, 1, 1, 2, 3], np.int32)}, params, ["w1", "b1", "w2"])


# ── every rule, by group ────────────────────────────────────────────────────

def elementwise_group(g):
    a, b, p, c = g.input("a", [3, 4]), g.input("b", [4]), g.input("p", [3, 4]), g.input("c", [3, 1])
    terms = [g.binary(op, a, b) for op in ("add", "sub", "mul", "max", "min", "atan2")]
    terms += [g.div(a, p), g.pow(p, b), a * c, g.where_(a > 0.0, a, c), g.cast(b, "f32")]
    positive = (A.Log, A.Sqrt, A.Rsqrt, A.Recip)
    real = [k for k in A if k not in positive and k is not A.Round]      # Round's gradient is 1 (straight-through)
    terms += [g.activation(NAMES[k], a) for k in real]
    terms += [g.activation(NAMES[k], p) for k in positive]
    return terms, {"a": f32(3, 4), "b": f32(4), "p": np.abs(f32(3, 4)) + 0.5, "c": f32(3, 1)}


def reduction_group(g):
    x, y = g.input("x", [2, 3, 4]), g.input("y", [3, 5])
    terms = [g.reduce(x, op, axes, keep) for op, axes, keep in
             [("sum", (0, 2), False), ("mean", 1, True), ("max", 2, False), ("min", (0, 1), True),
              ("prod", 0, False), ("mean", None, False)]]
    terms += [g.softmax(y), g.softmax(x, 1), g.cumsum(y), g.cumsum(y, exclusive=True)]
    return terms, {"x": f32(2, 3, 4), "y": f32(3, 5)}


def shape_group(g):
    x, t = g.input("x", [2, 3, 4]), g.input("t", [5, 3])
    i32, i64 = g.input("i32", [4], "i32"), g.input("i64", [2, 2], "i64")
    terms = [g.reshape(x, [6, 4]), g.transpose(x, [2, 0, 1]), g.narrow(x, 1, 1, 2), g.narrow(x, 0, 1, 1),
             g.concat([x, g.narrow(x, 2, 0, 1)], 2), g.gather(t, i32, 0), g.gather(t, i64, 1)]
    return terms, {"x": f32(2, 3, 4), "t": f32(5, 3), "i32": np.array([4, 0, 4, 2], np.int32),
                   "i64": np.array([[2, 0], [0, 1]], np.int64)}


def layer_group(g):
    x, w, bw = g.input("x", [2, 3, 4]), g.input("w", [4, 5]), g.input("bw", [2, 4, 3])
    gamma, beta, bias = g.input("gamma", [4]), g.input("beta", [4]), g.input("bias", [5])
    logits, labels = g.input("logits", [3, 5]), g.input("labels", [3])
    la, lb, sa, sb = g.input("la", [4, 2]), g.input("lb", [2, 5]), g.input("sa", [2, 3, 3]), g.input("sb", [3])
    terms = [x @ w, x @ bw, g.fused_matmul_bias_act(x, w, bias, "gelu"), g.fused_matmul_bias_act(x, w, bias),
             g.layer_norm(x, gamma, beta), g.rms_norm(x, gamma, beta, eps=1e-3),
             g.softmax_cross_entropy(logits, labels), g.lora_matmul(x, w, la, lb, 0.5),
             g.dense_solve(sa, g.reshape(x, [2, 3, 4])), g.dense_solve(g.narrow(sa, 0, 0, 1).reshape(3, 3), sb)]
    well_posed = np.eye(3, dtype=np.float32) * 3 + f32(2, 3, 3, scale=0.3)
    return terms, {"x": f32(2, 3, 4), "w": f32(4, 5), "bw": f32(2, 4, 3), "gamma": f32(4), "beta": f32(4),
                   "bias": f32(5), "logits": f32(3, 5), "labels": np.array([4, 0, 2], np.float32),
                   "la": f32(4, 2), "lb": f32(2, 5), "sa": well_posed, "sb": f32(3)}


def conv_attention_group(g):
    x, w, wg = g.input("x", [2, 4, 6, 5]), g.input("w", [3, 4, 3, 2]), g.input("wg", [4, 2, 3, 3])
    q, k, v, keep = g.input("q", [2, 3, 8]), g.input("k", [2, 4, 8]), g.input("v", [2, 4, 8]), g.input("keep", [2, 4])
    r, cos, sin = g.input("r", [2, 3, 8]), g.input("cos", [3, 2]), g.input("sin", [3, 2])
    kg, vg = g.input("kg", [2, 4, 4]), g.input("vg", [2, 4, 4])
    terms = [g.conv2d(x, w, stride=(2, 1), padding=1), g.conv2d(x, wg, padding=(1, 0), dilation=(2, 1), groups=2),
             g.max_pool2d(x, 2), g.avg_pool2d(x, (3, 2), stride=(2, 2), padding=(1, 1)),
             g.rope(r, cos, sin, 4), g.rope(r, cos, sin, 4, interleaved=True),
             g.attention_kind(q, k, v, 2, 4), g.attention_kind(q, k, v, 2, 4, "causal"),
             g.attention_kind(q, k, v, 2, 4, "sliding:1"), g.attention(q, k, v, keep, 2, 4),
             g.attention_kind(q, kg, vg, 2, 4, "causal", scale=0.3)]                  # GQA, 1 K/V head
    return terms, {"x": f32(2, 4, 6, 5), "w": f32(3, 4, 3, 2), "wg": f32(4, 2, 3, 3), "q": f32(2, 3, 8),
                   "k": f32(2, 4, 8), "v": f32(2, 4, 8), "keep": np.array([[1, 0, 1, 1], [1, 1, 1, 0]], np.float32),
                   "r": f32(2, 3, 8), "cos": f32(3, 2), "sin": f32(3, 2), "kg": f32(2, 4, 4), "vg": f32(2, 4, 4)}


GROUPS = {"elementwise": elementwise_group, "reductions": reduction_group, "shape": shape_group,
          "layers": layer_group, "conv_attention": conv_attention_group}


@pytest.mark.parametrize("group", GROUPS)
def test_vjp_rules_match_finite_differences(group):
    g = rl.Graph(group)
    terms, inputs = GROUPS[group](g)
    g.set_outputs([weighted_sum(g, terms)])
    wrt = [k for k, v in inputs.items() if v.dtype == np.float32 and k not in ("labels", "keep", "cos", "sin")]
    check_grad(g, inputs, {}, wrt, fusion=False)   # the rules alone; the MLP, CE and training tests fuse


def test_every_rule_is_exercised():
    ops = {n.op for make in GROUPS.values() for n in _nodes(make)}
    assert set(VJPS) - ops == set(), f"VJP rules without a finite-difference check: {set(VJPS) - ops}"


def _nodes(make):
    g = rl.Graph("ops")
    make(g)
    return g.nodes


# ── the transform itself ────────────────────────────────────────────────────

def test_unused_wrt_gets_zeros_and_source_graph_is_unchanged():
    g = rl.Graph("g")
    x, w = g.input("x", [2, 3]), g.param("w", [3])
    unused = g.param("unused", [2, 2])
    g.set_outputs([g.sum(x * w)])
    before = repr(g)
    gg = rl.grad(g, [w, unused.id, "x"])
    assert repr(g) == before and "d_output" in gg.inputs and "d_output" not in g.inputs
    cg = rl.Session().compile(gg)
    for k, v in {"w": np.arange(3, dtype=np.float32), "unused": np.ones((2, 2), np.float32)}.items():
        cg.set_param(k, v)
    xv = f32(2, 3)
    loss, dw, du, dx = cg.run({"x": xv, "d_output": np.full(1, 2.0, np.float32)})   # the seed scales
    np.testing.assert_allclose(dw, 2 * xv.sum(0), rtol=1e-6)
    np.testing.assert_allclose(dx, 2 * np.tile(np.arange(3.0), (2, 1)), rtol=1e-6)
    assert (du == 0).all() and du.shape == (2, 2)


@pytest.mark.parametrize("build, match", [
    (lambda g, x: [x * 2.0], "one float element"),
    (lambda g, x: [g.sum(x), g.sum(x)], "exactly one output"),
    (lambda g, x: [g.sum(g.binary("mod", x, x))], "binary mod has no gradient"),
])
def test_errors_name_the_problem(build, match):
    g = rl.Graph("bad")
    x = g.input("x", [2, 2])
    g.set_outputs(build(g, x))
    with pytest.raises(rl.GraphError, match=match):
        rl.grad(g, ["x"])


def test_gradients_the_thunks_lack_are_refused():
    g = rl.Graph("g")
    q, k, v = g.input("q", [1, 2, 8]), g.input("k", [1, 2, 4]), g.input("v", [1, 2, 6])
    cos, sin = g.input("cos", [2, 2]), g.input("sin", [2, 2])
    g.set_outputs([g.sum(g.attention_kind(q, k, v, 2, 4))])                     # values 6 wide, keys 4
    with pytest.raises(rl.GraphError, match="head_dim of keys"):
        rl.grad(g, ["q"])
    g.set_outputs([g.sum(g.rope(q, cos, sin, 4))])
    assert len(rl.grad(g, ["q"]).outputs) == 2
    with pytest.raises(rl.GraphError, match="no gradient with respect to its input"):
        rl.grad(g, ["cos"])


def test_wrt_must_name_a_source():
    g = rl.Graph("g")
    g.set_outputs([g.sum(g.input("x", [2]))])
    with pytest.raises(rl.GraphError, match="neither a param nor an input"):
        rl.grad(g, ["nope"])


# ── training ────────────────────────────────────────────────────────────────

def test_sgd_momentum_chain_in_the_graph():
    g = rl.Graph("sgd")
    p, v, d = (g.input(k, [7]) for k in ("p", "v", "d"))
    g.set_outputs(list(sgd_momentum(g, p, v, d, lr=0.1, mom=0.9)))
    feeds = {k: f32(7) for k in ("p", "v", "d")}
    p_next, v_next = rl.Session().compile(g).run(feeds)
    want_v = 0.9 * feeds["v"] + feeds["d"]
    np.testing.assert_allclose(v_next, want_v, rtol=1e-6)
    np.testing.assert_allclose(p_next, feeds["p"] - 0.1 * want_v, rtol=1e-6, atol=1e-7)


def test_training_example_reduces_the_loss():
    example = runpy.run_path(str(ROOT / "examples" / "train.py"))
    losses = example["losses"]
    assert len(losses) == 100 and losses[-1] < 0.1 * losses[0]
    kinds = [type(t).__name__ for t in example["train"].schedule.thunks]
    assert kinds.count("SgdMomentum") == 4            # the in-graph update chain, one per param
