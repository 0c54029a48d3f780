"""The exported-pattern fusions (rlx_llvm.graph.fuse_exported): head-split attention as ONNX exporters
write it becomes one Attention thunk, and a decomposed LayerNorm one LayerNorm — on hand-built graphs in
the exporters' variants, with near misses that must stay unfused, and on the packaged MiniLM export against
ONNX Runtime."""
from __future__ import annotations

import numpy as np
import pytest

import rlx_llvm as rl

from tests.harness import assert_close

B, S, H, D = 2, 6, 2, 4
E = H * D
F32_MIN = float(np.finfo(np.float32).min)


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Q/K/V projection weights and biases, and the layer input."""
    rng = np.random.default_rng(seed)
    out = {f"{p}_{s}": (0.5 * rng.standard_normal((E, E) if s == "w" else (E,))).astype(np.float32)
           for p in "qkv" for s in "wb"}
    out["x"] = rng.standard_normal((B, S, E)).astype(np.float32)
    return out


def keep_mask(all_masked_row: bool) -> np.ndarray:
    """0/1 keep-mask `[B, S]`: row 1 padded after 4 tokens (or, with `all_masked_row`, entirely masked)."""
    keep = np.ones((B, S), np.int64)
    keep[1, 4:] = 0
    if all_masked_row:
        keep[1] = 0
    return keep


def exported_graph(w: dict, *, neg: float | None = F32_MIN, one: float = 1.0, scale_on: str = "scores",
                   k_steps: int = 1, axis: int = -1, probs_out: bool = False) -> rl.Graph:
    """Attention as torch.onnx writes it for BERT, in a chosen variant (see the parametrizations)."""
    g = rl.Graph("exported")
    x = g.input("x", [B, S, E])
    proj = {p: x @ g.param(f"{p}_w", [E, E], value=w[f"{p}_w"]) + g.param(f"{p}_b", [E], value=w[f"{p}_b"])
            for p in "qkv"}

    def heads(t):
        return g.transpose(g.reshape(t, [B, S, H, D]), [0, 2, 1, 3])

    q, v = heads(proj["q"]), heads(proj["v"])
    kt = g.transpose(g.reshape(proj["k"], [B, S, H, D]), [0, 2, 3, 1]) if k_steps == 1 else \
        g.transpose(heads(proj["k"]), [0, 1, 3, 2])
    root_d = float(np.sqrt(D))
    if scale_on == "q":
        q = q * (1.0 / root_d)
    scores = q @ kt
    if scale_on == "scores":
        scores = scores / root_d
    if neg is not None:
        keep = g.input("mask", [B, S], "i64")
        bias = (one - g.cast(g.reshape(keep, [B, 1, 1, S]), "f32")) * neg
        scores = scores + bias
    probs = g.softmax(scores, axis)
    ctx = g.reshape(g.transpose(probs @ v, [0, 2, 1, 3]), [B, S, E])
    g.set_outputs([ctx, probs] if probs_out else [ctx])
    return g


def exported_reference(w: dict, keep: np.ndarray | None, neg: float | None, one: float = 1.0,
                       axis: int = -1) -> np.ndarray:
    """The exporter's arithmetic in NumPy (additive mask, f64)."""
    x = w["x"].astype(np.float64)
    q, k, v = (x @ w[f"{p}_w"] + w[f"{p}_b"] for p in "qkv")
    heads = lambda t: t.reshape(B, S, H, D).transpose(0, 2, 1, 3)  # noqa: E731
    scores = heads(q) @ heads(k).transpose(0, 1, 3, 2) / np.sqrt(D)
    if keep is not None:
        scores = scores + (one - keep[:, None, None, :]) * neg
    scores = scores - scores.max(axis, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis, keepdims=True)
    return (p @ heads(v)).transpose(0, 2, 1, 3).reshape(B, S, E)


def run(g: rl.Graph, w: dict, keep: np.ndarray | None) -> tuple[np.ndarray, list[str], str]:
    """Compile and run `g`: its first output, the schedule's thunk kinds, and the report."""
    cg = rl.Session().compile(g)
    feeds = {"x": w["x"], **({"mask": keep} if keep is not None else {})}
    out = cg.run(feeds)[0]
    return out, [type(t).__name__ for t in cg.schedule.thunks], cg.report()


FUSED = {                                     # variant → (exported_graph keywords, a fully masked row)
    "finfo.min mask, a fully masked row": (dict(), True),
    "-1e4 mask": (dict(neg=-1e4), False),
    "no mask": (dict(neg=None), False),
    "scale on q": (dict(scale_on="q"), False),
    "kᵀ as two transposes": (dict(k_steps=2), False),
}


@pytest.mark.parametrize("case", FUSED)
def test_exported_attention_becomes_one_attention(case):
    (kw, all_masked), w = FUSED[case], weights()
    neg = kw.get("neg", F32_MIN)
    keep = None if neg is None else keep_mask(all_masked)
    got, kinds, report = run(exported_graph(w, **kw), w, keep)
    assert kinds.count("Attention") == 1, report
    assert not {"Softmax", "BatchedSgemm", "Transpose"} & set(kinds), report
    assert "exported_attention:" in report
    assert_close(got, exported_reference(w, keep, neg).astype(np.float32), rtol=1e-5, atol=1e-5, what=case)


NEAR_MISSES = {
    "softmax over the query axis": dict(axis=2),
    "mask (2 − keep)·NEG": dict(one=2.0),
    "mask too weak (NEG = −100)": dict(neg=-100.0),
    "probabilities also an output": dict(probs_out=True),
}


@pytest.mark.parametrize("case", NEAR_MISSES)
def test_near_misses_stay_unfused_and_right(case):
    w, kw = weights(1), NEAR_MISSES[case]
    keep = keep_mask(False)
    got, kinds, report = run(exported_graph(w, **kw), w, keep)
    assert "Attention" not in kinds and "exported_attention:" not in report, report
    want = exported_reference(w, keep, kw.get("neg", F32_MIN), kw.get("one", 1.0), kw.get("axis", -1))
    assert_close(got, want.astype(np.float32), rtol=1e-5, atol=1e-5, what=case)


def test_more_keys_than_the_limit_stay_batched_gemms(monkeypatch):
    from rlx_llvm.graph import fuse_exported
    monkeypatch.setattr(fuse_exported, "ATTENTION_MAX_KEYS", S - 1)     # S keys: one too many
    w, keep = weights(), keep_mask(False)
    got, kinds, report = run(exported_graph(w), w, keep)
    assert "Attention" not in kinds and kinds.count("BatchedSgemm") == 2, report
    assert_close(got, exported_reference(w, keep, F32_MIN).astype(np.float32), rtol=1e-5, atol=1e-5)


def test_the_mask_arithmetic_no_attention_reads_is_dropped():
    w = weights()
    _, kinds, report = run(exported_graph(w), w, keep_mask(False))
    assert kinds == ["FusedMmBiasAct"] * 3 + ["CastGeneric", "Attention"], report   # the i64 mask cast, no Sub/Mul


def decomposed_layer_norm(*, square: str = "mul", eps: float = 1e-12, gamma_first: bool = False,
                          d_out: bool = False) -> tuple[rl.Graph, dict]:
    """LayerNorm as opsets before 17 export it, over `[B, S, E]`; also its params."""
    rng = np.random.default_rng(2)
    vals = {"gamma": rng.standard_normal(E).astype(np.float32), "beta": rng.standard_normal(E).astype(np.float32)}
    g = rl.Graph("ln")
    x = g.input("x", [B, S, E])
    gamma, beta = (g.param(n, [E], value=v) for n, v in vals.items())
    d = x - g.mean(x, -1, keep_dim=True)
    sq = d * d if square == "mul" else g.pow(d, g.constant(2.0 if square == "pow2" else 4.0))
    n = d / g.sqrt(g.mean(sq, -1, keep_dim=True) + eps)
    y = (gamma * n if gamma_first else n * gamma) + beta
    g.set_outputs([y, d] if d_out else [y])
    return g, vals


def layer_norm_reference(x: np.ndarray, vals: dict, eps: float, power: int = 2) -> np.ndarray:
    """The decomposed arithmetic in f64."""
    d = x.astype(np.float64) - x.mean(-1, keepdims=True)
    return d / np.sqrt((d ** power).mean(-1, keepdims=True) + eps) * vals["gamma"] + vals["beta"]


LAYER_NORMS = {
    "d·d": (dict(), True),
    "Pow(d, 2), γ first, eps 1e-5": (dict(square="pow2", gamma_first=True, eps=1e-5), True),
    "Pow(d, 4) (not a variance)": (dict(square="pow4"), False),
    "d also an output": (dict(d_out=True), False),
}


@pytest.mark.parametrize("case", LAYER_NORMS)
def test_decomposed_layer_norm_becomes_one_layer_norm(case):
    kw, fuses = LAYER_NORMS[case]
    g, vals = decomposed_layer_norm(**kw)
    x = np.random.default_rng(3).standard_normal((B, S, E)).astype(np.float32) * 3 + 1
    cg = rl.Session().compile(g)
    got = cg.run({"x": x})[0]
    kinds = [type(t).__name__ for t in cg.schedule.thunks]
    assert (kinds == ["LayerNorm"]) == fuses, cg.report()
    assert ("exported_layer_norm:" in cg.report()) == fuses
    want = layer_norm_reference(x, vals, kw.get("eps", 1e-12), 4 if kw.get("square") == "pow4" else 2)
    assert_close(got, want.astype(np.float32), rtol=1e-4, atol=1e-4, what=case)


def test_packaged_minilm_runs_fused_and_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    from rlx_llvm.onnx.ops_models import packaged_model
    path = packaged_model("paraphrase-minilm-l3")
    if path is None:
        pytest.skip("paraphrase-minilm-l3 is not installed (pip install '.[models]')")
    ids = np.random.default_rng(0).integers(1000, 20000, (2, 16)).astype(np.int64)
    ids[:, 0] = 101
    mask = np.ones_like(ids)
    mask[1, 9:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    model = rl.onnx.OnnxModel(path)
    got = model.run(feeds)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    want = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"]).run(None, feeds)
    for g_, w_ in zip(got, want):
        assert_close(np.asarray(g_), w_, rtol=0.0, atol=1e-4 * float(np.abs(w_).max() or 1.0))
    cg = model.compiled({k: v.shape for k, v in feeds.items()})
    kinds = [type(t).__name__ for t in cg.schedule.thunks]
    assert kinds.count("Attention") == 3, cg.report()
    assert kinds.count("FusedResidualLN") == 6, cg.report()   # 2 per layer: no separate residual add
    assert kinds.count("LayerNorm") == 1, cg.report()         # the embeddings' (positions broadcast over batch)
    assert not {"Softmax", "BatchedSgemm"} & set(kinds), cg.report()
