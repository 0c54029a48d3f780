"""The graph core: inference errors, specialization, region fusion, planning, feeding."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import rlx_llvm as rl
from rlx_llvm import thunks as T
from rlx_llvm.ops import Activation
from rlx_llvm.graph.lower import lower
from rlx_llvm.graph.plan import plan
from rlx_llvm.graph.specialize import specialize

RNG = np.random.default_rng(7)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def mlp():
    """relu(x @ w1 + b1) @ w2 with a dynamic batch, plus a softmax and a sum of the hidden layer."""
    g = rl.Graph("mlp")
    x = g.input("x", [-1, 5])
    h = g.relu(x @ g.param("w1", [5, 9]) + g.param("b1", [9]))
    y = h @ g.param("w2", [9, 3])
    g.set_outputs([y, g.softmax(y), g.sum(h, 1, keep_dim=True)])
    params = {"w1": f32(5, 9), "b1": f32(9), "w2": f32(9, 3)}
    cg = rl.Session().compile(g)
    for k, v in params.items():
        cg.set_param(k, v)
    return g, cg, params


def mlp_ref(x, p):
    h = np.maximum(x.astype(np.float64) @ p["w1"] + p["b1"], 0)
    y = h @ p["w2"]
    e = np.exp(y - y.max(1, keepdims=True))
    return [y, e / e.sum(1, keepdims=True), h.sum(1, keepdims=True)]


@pytest.mark.parametrize("rows", [0, 1, 7, 8, 9, 64])
def test_dynamic_batch_matches_numpy(mlp, rows):
    g, cg, p = mlp
    x = f32(rows, 5)
    for got, want in zip(cg.run({"x": x}), mlp_ref(x, p)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_one_compile_per_shape(mlp):
    _, cg, _ = mlp
    cg.run({"x": f32(3, 5)})
    n = len(cg._specs)
    cg.run({"x": f32(3, 5)})
    assert len(cg._specs) == n
    cg.run({"x": f32(11, 5)})
    assert len(cg._specs) == n + 1


def test_schedule_round_trips_and_report_names_nodes(mlp):
    _, cg, _ = mlp
    cg.run({"x": f32(4, 5)})
    sched = cg.schedule
    assert rl.ThunkSchedule.from_json(sched.to_json()) == sched
    report = cg.report()
    assert "FusedMmBiasAct" in report and "matmul_bias_act:" in report and "← %" in report
    table = cg.plan().table()
    assert "lower bound" in table and "w1" in table


def test_set_param_after_run_takes_effect(mlp):
    g, cg, p = mlp
    x = f32(2, 5)
    before = cg.run({"x": x})[0]
    cg.set_param("w2", 2 * p["w2"])
    after = cg.run({"x": x})[0]
    np.testing.assert_allclose(after, 2 * before, rtol=1e-5, atol=1e-6)
    cg.set_param("w2", p["w2"])


def test_fusion_makes_one_region():
    g = rl.Graph("chain")
    x, s, b, r = (g.input(n, [4, 33]) for n in "xsbr")
    g.set_outputs([g.relu(g.sigmoid(x * s + b) * x + r)])
    cg = rl.Session().compile(g)
    kinds = [type(t).__name__ for t in cg.schedule.thunks]
    assert kinds == ["ElementwiseRegion"], kinds
    assert len(cg.schedule.thunks[0].chain) == 6
    v = {n: f32(4, 33) for n in "xsbr"}
    sig = 1 / (1 + np.exp(-(v["x"] * v["s"] + v["b"])))
    want = np.maximum(sig * v["x"] + v["r"], 0)
    np.testing.assert_allclose(cg.run(v)[0], want, rtol=1e-5, atol=1e-6)


def test_broadcasts_tile_scalar_and_expand():
    g = rl.Graph("bcast")
    x = g.input("x", [2, 3, 4])
    row, col, one = g.input("row", [4]), g.input("col", [2, 1, 4]), g.input("one", [1])
    g.set_outputs([x + row, x * col, x - one, g.where_(x > 0.0, x, col)])
    cg = rl.Session().compile(g)
    v = {"x": f32(2, 3, 4), "row": f32(4), "col": f32(2, 1, 4), "one": f32(1)}
    want = [v["x"] + v["row"], v["x"] * v["col"], v["x"] - v["one"], np.where(v["x"] > 0, v["x"], v["col"])]
    for got, w in zip(cg.run(v), want):
        np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-6)
    assert any(isinstance(t, T.Transpose) for t in cg.schedule.thunks)   # the [2,1,4] operand is expanded


def test_views_and_movement():
    g = rl.Graph("move")
    x = g.input("x", [2, 3, 4])
    flat = g.reshape(x, [6, -1])
    parts = [g.narrow(x, 1, 0, 2), g.narrow(x, 0, 1, 1), g.transpose(x, [2, 0, 1]),
             g.concat([x, x * 2.0], 2), flat, x.T]
    idx = g.input("idx", [5], "i32")
    g.set_outputs(parts + [g.gather(flat, idx, 0), g.cast(x, "f16")])
    cg = rl.Session().compile(g)
    xv, iv = f32(2, 3, 4), np.array([5, 0, 3, 3, 1], np.int32)
    got = cg.run({"x": xv, "idx": iv})
    want = [xv[:, 0:2], xv[1:2], xv.transpose(2, 0, 1), np.concatenate([xv, 2 * xv], 2), xv.reshape(6, 4),
            xv.swapaxes(-1, -2), xv.reshape(6, 4)[iv], xv.astype(np.float16)]
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_reductions_and_norms():
    g = rl.Graph("red")
    x = g.input("x", [3, 4, 5])
    gam, bet = g.input("g", [5]), g.input("b", [5])
    outs = [g.sum(x), g.mean(x, [0, 2]), g.reduce(x, "max", 1, keep_dim=True), g.reduce(x, "min", (0, 1)),
            g.softmax(x, 1), g.cumsum(x), g.layer_norm(x, gam, bet, eps=1e-5), g.rms_norm(x, gam, bet)]
    g.set_outputs(outs)
    cg = rl.Session().compile(g)
    v = {"x": f32(3, 4, 5), "g": f32(5), "b": f32(5)}
    x64 = v["x"].astype(np.float64)
    e = np.exp(x64 - x64.max(1, keepdims=True))
    ln = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5) * v["g"] + v["b"]
    rms = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5) * v["g"] + v["b"]
    want = [x64.sum(), x64.mean((0, 2)), x64.max(1, keepdims=True), x64.min((0, 1)), e / e.sum(1, keepdims=True),
            np.cumsum(x64, -1), ln, rms]
    for a, b in zip(cg.run(v), want):
        assert a.shape == np.shape(b)
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


# ── errors ──────────────────────────────────────────────────────────────────

def test_build_errors_name_the_op_and_shapes():
    g = rl.Graph("bad")
    a, b = g.input("a", [2, 3]), g.input("b", [4, 5])
    with pytest.raises(rl.GraphError, match=r"matmul: inner dims differ: \[2, 3\] @ \[4, 5\]"):
        a @ b
    with pytest.raises(rl.GraphError, match=r"binary add: shapes \[2, 3\] and \[4, 5\] do not broadcast"):
        a + b
    with pytest.raises(rl.GraphError, match="unknown dtype 'f31'"):
        g.input("c", [1], "f31")
    with pytest.raises(rl.GraphError, match="already an input"):
        g.input("a", [1])
    with pytest.raises(rl.GraphError, match="reshape"):
        g.reshape(a, [5, -1])
    with pytest.raises(rl.GraphError, match="transpose: perm"):
        g.transpose(a, [0, 0])
    with pytest.raises(rl.GraphError, match="narrow"):
        g.narrow(a, 1, 2, 2)
    with pytest.raises(rl.GraphError, match="activation: unknown kind 'relu6'"):
        g.activation("relu6", a)
    with pytest.raises(rl.GraphError, match="static"):
        g.param("p", [-1, 2])
    other = rl.Graph("other")
    with pytest.raises(rl.GraphError, match="belongs to graph 'other'"):
        a + other.input("z", [2, 3])


def test_run_errors_name_the_input(mlp):
    g, cg, _ = mlp
    with pytest.raises(rl.GraphError, match="missing input"):
        cg.run({})
    with pytest.raises(rl.GraphError, match=r"input 'x' has shape \[2, 4\].*\[-1, 5\]"):
        cg.run({"x": f32(2, 4)})
    with pytest.raises(rl.GraphError, match="input 'x' has dtype int32"):
        cg.run({"x": np.zeros((2, 5), np.int32)})
    with pytest.raises(rl.GraphError, match="'y' is not an input"):
        cg.run({"x": f32(2, 5), "y": f32(1)})
    with pytest.raises(rl.GraphError, match="no param 'w9'"):
        cg.set_param("w9", f32(1))
    with pytest.raises(rl.GraphError, match=r"shape \[9, 5\] does not match the declared \[5, 9\]"):
        cg.set_param("w1", f32(9, 5))


def test_missing_param_is_an_error_before_running():
    g = rl.Graph("p")
    g.set_outputs([g.input("x", [2]) * g.param("w", [2])])
    cg = rl.Session().compile(g)
    with pytest.raises(rl.GraphError, match="param 'w' of graph 'p' was never set"):
        cg.run({"x": f32(2)})


def test_session_rejects_other_devices():
    with pytest.raises(rl.GraphError, match="CPU only"):
        rl.Session("cuda")
    with pytest.raises(rl.GraphError, match="no outputs"):
        rl.Session().compile(rl.Graph("empty"))


# ── planning ────────────────────────────────────────────────────────────────

@st.composite
def random_graphs(draw):
    """A random DAG of element-wise ops, matmuls and reductions over a few inputs."""
    g = rl.Graph("random")
    n = draw(st.integers(2, 24))
    vals = [g.input(f"x{i}", [n, n]) for i in range(draw(st.integers(1, 3)))]
    for _ in range(draw(st.integers(1, 25))):
        a, b = draw(st.sampled_from(vals)), draw(st.sampled_from(vals))
        op = draw(st.sampled_from(["add", "mul", "matmul", "relu", "softmax", "sum"]))
        vals.append({"add": lambda: a + b, "mul": lambda: a * b, "matmul": lambda: a @ b,
                     "relu": lambda: g.relu(a), "softmax": lambda: g.softmax(a),
                     "sum": lambda: g.sum(a, 1, keep_dim=True) + b}[op]())
    outs = draw(st.lists(st.sampled_from(vals[1:] or vals), min_size=1, max_size=3, unique_by=id))
    g.set_outputs(outs)
    return g


@settings(max_examples=60, deadline=None)
@given(random_graphs())
def test_plan_never_overlaps_live_buffers(g):
    lowered = lower(specialize(g, {k: g.nodes[v].shape for k, v in g.inputs.items()}))
    p = plan(lowered)
    bufs = p.buffers
    for i, a in enumerate(bufs):
        assert p.offsets[a.id] % 64 == 0
        assert p.offsets[a.id] + a.nbytes <= p.arena_bytes
        for b in bufs[i + 1:]:
            if a.nbytes and b.nbytes and (a.pinned or b.pinned or (a.first <= b.last and b.first <= a.last)):
                assert (p.offsets[a.id] + a.nbytes <= p.offsets[b.id] or
                        p.offsets[b.id] + b.nbytes <= p.offsets[a.id]), (a, b)
    assert p.lower_bound <= p.arena_bytes


def test_plan_reuses_dead_buffers():
    g = rl.Graph("deep")
    x = g.input("x", [64, 64])
    y = x
    for _ in range(12):
        y = g.softmax(y @ x)
    g.set_outputs([y])
    p = rl.Session().compile(g).plan()
    assert p.arena_bytes <= 1.10 * p.lower_bound
    assert p.activation_bytes <= 1.10 * p.activation_lower_bound
    assert p.activation_bytes <= 0.5 * p.intermediate_bytes


def test_graph_listing_and_shape_of():
    g = rl.Graph("show")
    x = g.input("x", [-1, 3])
    y = g.relu(x)
    g.set_outputs([y])
    assert g.shape_of(y) == ([-1, 3], "f32")
    text = repr(g)
    assert text.startswith("graph @show (2 nodes, 1 outputs)") and "← output" in text and '"x"' in text
    assert len(g) == 2 and json.dumps(g.shape_of(int(y.id)))


# ── the pattern passes ──────────────────────────────────────────────────────

def kinds_of(cg) -> list[str]:
    return [type(t).__name__ for t in cg.schedule.thunks]


def test_matmul_of_a_transpose_reads_it_in_place():
    g = rl.Graph("mt")
    a, b, c = g.input("a", [3, 5]), g.input("b", [4, 5]), g.input("c", [5, 3])
    g.set_outputs([a @ b.T, c.T @ b.T, g.transpose(c, [1, 0]) @ c])
    cg = rl.Session().compile(g)
    assert kinds_of(cg) == ["SgemmT"] * 3 and cg.report().count("matmul_t:") == 3
    v = {"a": f32(3, 5), "b": f32(4, 5), "c": f32(5, 3)}
    want = [v["a"] @ v["b"].T, v["c"].T @ v["b"].T, v["c"].T @ v["c"]]
    for got, w in zip(cg.run(v), want):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)


def test_matmul_bias_act_and_bias_add():
    g = rl.Graph("mba")
    x, w, b = g.input("x", [2, 3, 8]), g.input("w", [8, 6]), g.input("b", [6])
    y = g.input("y", [5, 6])
    g.set_outputs([g.silu(x @ w + b), x @ w + b, y + b])
    cg = rl.Session().compile(g)
    assert kinds_of(cg) == ["FusedMmBiasAct", "FusedMmBiasAct", "BiasAdd"], kinds_of(cg)
    v = {"x": f32(2, 3, 8), "w": f32(8, 6), "b": f32(6), "y": f32(5, 6)}
    z = v["x"].astype(np.float64) @ v["w"] + v["b"]
    for got, want in zip(cg.run(v), [z / (1 + np.exp(-z)), z, v["y"] + v["b"]]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_sgd_chain_becomes_sgd_momentum():
    g = rl.Graph("sgd")
    p, v, grad = (g.input(n, [37]) for n in ("p", "v", "g"))
    v_new = v * 0.9 + grad
    p_new = p - 0.01 * v_new
    g.set_outputs([p_new, v_new])
    cg = rl.Session().compile(g)
    assert kinds_of(cg) == ["SgdMomentum"] and "sgd_momentum:" in cg.report()
    vals = {"p": f32(37), "v": f32(37), "g": f32(37)}
    pn, vn = cg.run(vals)
    want_v = np.float32(0.9) * vals["v"] + vals["g"]
    np.testing.assert_allclose(vn, want_v, rtol=1e-6)
    np.testing.assert_allclose(pn, vals["p"] - np.float32(0.01) * want_v, rtol=1e-6, atol=1e-7)


def test_fusion_off_gives_the_same_numbers():
    g = rl.Graph("off")
    x, w, b = g.input("x", [4, 8]), g.input("w", [8, 8]), g.input("b", [8])
    g.set_outputs([g.softmax(g.relu(x @ w.T + b) * 2.0 + 1.0)])
    v = {"x": f32(4, 8), "w": f32(8, 8), "b": f32(8)}
    fused, plain = rl.Session().compile(g), rl.Session(fusion=False).compile(g)
    np.testing.assert_allclose(fused.run(v)[0], plain.run(v)[0], rtol=1e-5, atol=1e-6)
    assert len(fused.schedule.thunks) < len(plain.schedule.thunks)


def test_cli_inspects_a_graph_schedule(tmp_path, capsys):
    from rlx_llvm.cli import main
    g = rl.Graph("cli")
    x = g.input("x", [4, 8])
    g.set_outputs([g.softmax(g.relu(x) * 3.0)])
    path = tmp_path / "graph.json"
    path.write_text(rl.Session().compile(g).schedule.to_json())
    assert main(["report", str(path)]) == 0
    assert "ElementwiseRegion" in capsys.readouterr().out
    assert main(["ir", str(path), "--thunk", "0"]) == 0
    assert '@"t0_elementwise_region.body"(' in capsys.readouterr().out


def test_shapes_share_one_arena_and_the_weights_are_written_once():
    g = rl.Graph("shared")
    x = g.input("x", [-1, 8])
    g.set_outputs([g.softmax(x @ g.param("w", [8, 8]) + g.constant(np.arange(8, dtype=np.float32)))])
    cg = rl.Session().compile(g)
    w = f32(8, 8)
    cg.set_param("w", w)
    small, big = f32(2, 8), f32(300, 8)
    cg.run({"x": small})
    arena = cg._last.arena
    got_big = cg.run({"x": big})[0]
    assert len(cg._storages) == 1 and cg._last.arena.nbytes >= cg.plan().arena_bytes
    assert cg._last.arena is not arena                       # grown for the larger shape, weights kept
    got_small = cg.run({"x": small})[0]
    for x, got in ((small, got_small), (big, got_big)):
        z = x.astype(np.float64) @ w + np.arange(8)
        e = np.exp(z - z.max(1, keepdims=True))
        np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_narrowed_attention_and_rope_inputs_are_read_by_row_stride():
    g = rl.Graph("strided")
    H, heads = 16, 2
    x = g.input("x", [2, 5, H])
    keep = g.input("keep", [2, 5])
    cos, sin = g.input("cos", [5, 4]), g.input("sin", [5, 4])
    qkv = x @ g.param("w", [H, 3 * H], value=f32(H, 3 * H) * 0.3)
    q, k, v = (g.narrow(qkv, 2, j * H, H) for j in range(3))
    q = g.rope(q, cos, sin, head_dim=H // heads)
    g.set_outputs([g.attention(q, k, v, keep, num_heads=heads, head_dim=H // heads) + x])
    feeds = {"x": f32(2, 5, H), "keep": np.array([[1, 1, 1, 0, 0], [1] * 5], np.float32),
             "cos": f32(5, 4), "sin": f32(5, 4)}
    fused, plain = rl.Session().compile(g), rl.Session(fusion=False).compile(g)
    np.testing.assert_allclose(fused.run(feeds)[0], plain.run(feeds)[0], rtol=1e-5, atol=1e-5)
    assert "Narrow" not in kinds_of(fused) and "Narrow" in kinds_of(plain)
    assert fused.report().count("strided_reads:") == 2


def test_exported_erf_gelu_becomes_one_gelu():
    g = rl.Graph("gelu")
    x, w, b = g.input("x", [4, 8]), g.input("w", [8, 8]), g.input("b", [8])
    h = [x @ w + b for _ in range(4)]
    forms = [h[0] * 0.5 * (1.0 + g.activation("erf", h[0] / 2 ** 0.5)),                  # torch's export
             0.5 * h[1] * (g.activation("erf", h[1] * 2 ** -0.5) + 1.0),
             h[2] * (1.0 + g.activation("erf", h[2] / 2 ** 0.5)) * 0.5,
             (1.0 + g.activation("erf", h[3] / 2 ** 0.5)) * 0.5 * h[3]]
    near_miss = (1.0 + g.activation("erf", x / 2 ** 0.5)) * 0.5 * 0.5      # no factor x: not a GELU
    g.set_outputs(forms + [near_miss])
    cg = rl.Session().compile(g)
    assert cg.report().count("erf_gelu:") == 4
    fused = [t for t in cg.schedule.thunks if isinstance(t, T.FusedMmBiasAct)]
    assert len(fused) == 4 and all(t.act is Activation.Gelu for t in fused)
    v = {"x": f32(4, 8), "w": f32(8, 8), "b": f32(8)}
    from scipy.special import erf
    z = v["x"].astype(np.float64) @ v["w"] + v["b"]
    *got, miss = cg.run(v)
    for y in got:
        np.testing.assert_allclose(y, 0.5 * z * (1 + erf(z / np.sqrt(2))), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(miss, 0.25 * (1 + erf(v["x"] / np.sqrt(2))), rtol=1e-5, atol=1e-6)
