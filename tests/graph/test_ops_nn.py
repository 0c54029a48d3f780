"""Graph ops beyond the dense basics — conv/pool, attention/rope, LoRA/solve/FFT/sample/cumsum/arg/top-k —
each against a NumPy float64 reference; one compiled program per family; bad inputs name the op."""
from __future__ import annotations

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import thunks as T
from rlx_llvm.reference.rng import philox_words, sample_row, unit_f32

RNG = np.random.default_rng(14)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def compiled(g: rl.Graph, feeds: dict, params: dict | None = None):
    """Compile `g`, set `params`, run once on `feeds`: (outputs by name, kinds of thunks in the schedule)."""
    cg = rl.Session().compile(g)
    for k, v in (params or {}).items():
        cg.set_param(k, v)
    outs = cg.run(feeds)
    return dict(zip(g.output_names, outs)), {type(t).__name__ for t in cg.schedule.thunks}


def named(g: rl.Graph, **outputs) -> rl.Graph:
    """`set_outputs` in keyword order, remembering the names for `compiled`."""
    g.set_outputs(list(outputs.values()))
    g.output_names = list(outputs)
    return g


# ── conv / pool ───────────────────────────────────────────────────────────────

def conv_ref(x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """Cross-correlation by summing one shifted window slice per kernel tap (float64)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    n, c_in, h, wd = x.shape
    c_out, cg, kh, kw = w.shape
    ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out = np.zeros((n, c_out, ho, wo))
    per = c_out // groups
    for i in range(kh):
        for j in range(kw):
            win = xp[:, :, i * dh: i * dh + sh * (ho - 1) + 1: sh, j * dw: j * dw + sw * (wo - 1) + 1: sw]
            for gi in range(groups):
                out[:, gi * per:(gi + 1) * per] += np.einsum(
                    "nchw,oc->nohw", win[:, gi * cg:(gi + 1) * cg], w[gi * per:(gi + 1) * per, :, i, j])
    return out


def pool_ref(x, k, s, p, kind):
    """Max ignoring padding, or the sum of in-range taps over kh·kw (count_include_pad)."""
    x = x.astype(np.float64)
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=fill)
    ho, wo = (xp.shape[2] - k[0]) // s[0] + 1, (xp.shape[3] - k[1]) // s[1] + 1
    wins = np.stack([xp[:, :, i: i + s[0] * (ho - 1) + 1: s[0], j: j + s[1] * (wo - 1) + 1: s[1]]
                     for i in range(k[0]) for j in range(k[1])])
    return wins.max(0) if kind == "max" else wins.sum(0) / (k[0] * k[1])


CONV_PARAMS = {"w_s2": f32(6, 4, 3, 3), "b_s2": f32(6), "w_grp": f32(6, 2, 3, 3), "w_1x1": f32(5, 4, 1, 1),
               "w_rect": f32(3, 4, 2, 3)}


@pytest.fixture(scope="module")
def conv_run():
    g = rl.Graph("convs")
    x = g.input("x", [2, 4, 9, 9])
    p = {k: g.param(k, v.shape) for k, v in CONV_PARAMS.items()}
    named(g,
          s2=g.conv2d(x, p["w_s2"], p["b_s2"], stride=2, padding=1),
          grp=g.conv2d(x, p["w_grp"], groups=2, dilation=2, padding=2),
          one=g.conv2d(x, p["w_1x1"]),
          rect=g.conv2d(x, p["w_rect"], stride=(1, 2), padding=(0, 1)),
          max=g.max_pool2d(x, 3, stride=2, padding=1),
          avg=g.avg_pool2d(x, 3, stride=2, padding=1),
          avg23=g.avg_pool2d(x, (2, 3)),
          gap=g.global_avg_pool2d(x))
    xv = f32(2, 4, 9, 9)
    return xv, *compiled(g, {"x": xv}, CONV_PARAMS)


def conv_expected(x, p):
    return {"s2": conv_ref(x, p["w_s2"], (2, 2), (1, 1)) + p["b_s2"][:, None, None],
            "grp": conv_ref(x, p["w_grp"], padding=(2, 2), dilation=(2, 2), groups=2),
            "one": conv_ref(x, p["w_1x1"]),
            "rect": conv_ref(x, p["w_rect"], (1, 2), (0, 1)),
            "max": pool_ref(x, (3, 3), (2, 2), (1, 1), "max"),
            "avg": pool_ref(x, (3, 3), (2, 2), (1, 1), "avg"),
            "avg23": pool_ref(x, (2, 3), (2, 3), (0, 0), "avg"),
            "gap": x.astype(np.float64).mean((2, 3))}


@pytest.mark.parametrize("name", list(conv_expected(f32(1, 4, 9, 9), CONV_PARAMS)))
def test_conv_and_pool_match_numpy(conv_run, name):
    x, got, _ = conv_run
    want = conv_expected(x, CONV_PARAMS)[name]
    assert got[name].shape == want.shape
    np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4)


def test_plain_1x1_conv_is_a_gemm(conv_run):
    _, _, kinds = conv_run
    assert {"Conv2D1x1", "Conv2D", "Pool2D"} <= kinds


# ── attention / rope ──────────────────────────────────────────────────────────

B, S, KV, H, KVH, D = 2, 5, 7, 4, 2, 8


def attention_ref(q, k, v, heads, d, mask=None, kind="none", scale=None):
    """softmax(Q·Kᵀ·scale, masked) · V per head, float64; K/V heads repeated for GQA."""
    b, s, kv = q.shape[0], q.shape[1], k.shape[1]
    qh = q.astype(np.float64).reshape(b, s, heads, d).transpose(0, 2, 1, 3)
    kvh = k.shape[2] // d
    kh = np.repeat(k.astype(np.float64).reshape(b, kv, kvh, d).transpose(0, 2, 1, 3), heads // kvh, 1)
    vh = np.repeat(v.astype(np.float64).reshape(b, kv, kvh, -1).transpose(0, 2, 1, 3), heads // kvh, 1)
    sc = qh @ kh.transpose(0, 1, 3, 2) * (d ** -0.5 if scale is None else scale)
    if mask is not None and mask.ndim == 2:
        sc = np.where(mask[:, None, None, :] < 0.5, -1e9, sc)
    if mask is not None and mask.ndim == 4:
        sc = sc + mask
    pos = kv - s + np.arange(s)[:, None]
    keys = np.arange(kv)[None, :]
    if kind == "causal":
        sc = np.where(keys > pos, -1e9, sc)
    if kind.startswith("sliding"):
        w = int(kind.split(":")[1])
        sc = np.where((keys > pos) | (keys < pos - w), -1e9, sc)
    e = np.exp(sc - sc.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True) @ vh).transpose(0, 2, 1, 3).reshape(b, s, -1)


def rope_ref(x, cos, sin, d, n_rot, interleaved=False):
    """NeoX halves or GPT-J pairs of the first n_rot dims of each head, float64; rows of the table per
    position (or per token when it has batch·seq rows)."""
    b, s, hidden = x.shape
    y = x.astype(np.float64).reshape(b, s, hidden // d, d).copy()
    c = cos.astype(np.float64).reshape(-1, s, cos.shape[1])[..., None, :n_rot // 2]
    sn = sin.astype(np.float64).reshape(-1, s, sin.shape[1])[..., None, :n_rot // 2]
    r = n_rot // 2
    a, bb = (y[..., 0:n_rot:2], y[..., 1:n_rot:2]) if interleaved else (y[..., :r], y[..., r:n_rot])
    ra, rb = a * c - bb * sn, bb * c + a * sn
    if interleaved:
        y[..., 0:n_rot:2], y[..., 1:n_rot:2] = ra, rb
    else:
        y[..., :r], y[..., r:n_rot] = ra, rb
    return y.reshape(b, s, hidden)


@pytest.fixture(scope="module")
def attention_run():
    g = rl.Graph("attention")
    ins = {"q": f32(B, S, H * D), "k": f32(B, KV, KVH * D), "v": f32(B, KV, KVH * 6), "qs": f32(1, 11, H * D),
           "keep": (RNG.random((B, KV)) > 0.3).astype(np.float32), "bias": f32(B, H, S, KV),
           "x": f32(B, S, H * D), "cos": f32(S, 4), "sin": f32(S, 4), "cos_t": f32(B * S, 4), "sin_t": f32(B * S, 4)}
    v = {k: g.input(k, a.shape) for k, a in ins.items()}
    q, k, vv = v["q"], v["k"], v["v"]
    named(g,
          none=g.attention_kind(q, k, vv, H, D),
          causal=g.attention_kind(q, k, vv, H, D, "causal"),
          sliding=g.attention_kind(q, k, vv, H, D, "sliding:2"),
          custom=g.attention(q, k, vv, v["keep"], H, D),
          bias=g.attention(q, k, vv, v["bias"], H, D, scale=0.2),
          self_causal=g.attention_kind(v["qs"], v["qs"], v["qs"], H, D, "causal"),
          neox=g.rope(v["x"], v["cos"], v["sin"], D),
          gptj=g.rope(v["x"], v["cos"], v["sin"], D, interleaved=True),
          partial=g.rope(v["x"], v["cos"], v["sin"], D, n_rot=4),
          per_token=g.rope(v["x"], v["cos_t"], v["sin_t"], D))
    return ins, compiled(g, ins)[0]


def attention_expected(i):
    q, k, v = i["q"], i["k"], i["v"]
    return {"none": attention_ref(q, k, v, H, D),
            "causal": attention_ref(q, k, v, H, D, kind="causal"),
            "sliding": attention_ref(q, k, v, H, D, kind="sliding:2"),
            "custom": attention_ref(q, k, v, H, D, mask=i["keep"]),
            "bias": attention_ref(q, k, v, H, D, mask=i["bias"], scale=0.2),
            "self_causal": attention_ref(i["qs"], i["qs"], i["qs"], H, D, kind="causal"),
            "neox": rope_ref(i["x"], i["cos"], i["sin"], D, 8),
            "gptj": rope_ref(i["x"], i["cos"], i["sin"], D, 8, interleaved=True),
            "partial": rope_ref(i["x"], i["cos"], i["sin"], D, 4),
            "per_token": rope_ref(i["x"], i["cos_t"], i["sin_t"], D, 8)}


ATTENTION_OUTPUTS = ["none", "causal", "sliding", "custom", "bias", "self_causal", "neox", "gptj", "partial",
                     "per_token"]


@pytest.mark.parametrize("name", ATTENTION_OUTPUTS)
def test_attention_and_rope_match_numpy(attention_run, name):
    ins, got = attention_run
    want = attention_expected(ins)[name]
    assert got[name].shape == want.shape
    np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5)


def test_masks_change_the_result(attention_run):
    _, got = attention_run
    for name in ("causal", "sliding", "custom", "bias"):
        assert not np.allclose(got[name], got["none"], atol=1e-3), name


# ── LoRA, solves, FFT, sample, cumsum, arg-reductions, top-k ──────────────────

def well_conditioned(*batch, n):
    return (RNG.standard_normal((*batch, n, n)) + 2 * n * np.eye(n)).astype(np.float32)


EXTRA_INPUTS = {
    "x": f32(3, 2, 6), "w": f32(6, 5), "la": f32(6, 2), "lb": f32(2, 5),
    "A": well_conditioned(n=4), "Bm": f32(4, 3), "bv": f32(4), "AA": well_conditioned(2, n=4), "BB": f32(2, 4, 2),
    "logits": f32(4, 10), "c": f32(3, 4, 5), "u": f32(6)}


def custom_body() -> rl.Graph:
    """tanh(a·b) + [0, 1, …, 5]: a sub-graph with a constant, for custom_fn."""
    body = rl.Graph("body")
    a, b = body.input("a", [3, 2, 6]), body.input("b", [6])
    body.set_outputs([body.tanh(a * b) + body.constant(np.arange(6, dtype=np.float32))])
    return body


@pytest.fixture(scope="module")
def extra_run():
    g = rl.Graph("extra")
    v = {k: g.input(k, a.shape, "c64" if a.dtype == np.complex64 else a.dtype) for k, a in EXTRA_INPUTS.items()}
    named(g,
          lora=g.lora_matmul(v["x"], v["w"], v["la"], v["lb"], scale=0.5),
          solve=g.dense_solve(v["A"], v["Bm"]),
          solve_vec=g.dense_solve(v["A"], v["bv"]),
          solve_batch=g.batched_dense_solve(v["AA"], v["BB"]),
          greedy=g.sample(v["logits"], top_k=1, seed=3),
          sampled=g.sample(v["logits"], top_k=4, top_p=0.8, temperature=0.7, seed=11),
          sampled_f32=g.sample(v["logits"], temperature=1.5, seed=0, dtype="f32"),
          cum0=g.cumsum(v["c"], 0),
          cum1_excl=g.cumsum(v["c"], 1, exclusive=True),
          cum_last=g.cumsum(v["c"], -1),
          argmax=g.argmax(v["c"], 1),
          argmin=g.argmin(v["c"], 0, keep_dim=True),
          topk=g.topk(v["logits"], 3),
          custom=g.custom_fn([v["x"] * 2.0, v["u"]], custom_body()) - 1.0)
    return compiled(g, EXTRA_INPUTS)


def sampled(logits, top_k, top_p, temperature, seed):
    """The Sample oracle: one Philox stream, one draw per row (rlx_llvm.reference.rng)."""
    t = T.Sample(logits=0, dst=0, batch=len(logits), vocab=logits.shape[1], top_k=top_k, top_p=top_p,
                 temperature=temperature, seed=seed)
    draws = unit_f32(philox_words(seed or 0xDEADBEEF, len(logits)))
    return np.array([sample_row(row.copy(), t, r) for row, r in zip(logits, draws)])


def extra_expected(i):
    x64 = {k: a.astype(np.float64) for k, a in i.items()}
    c = x64["c"]
    return {
        "lora": x64["x"] @ x64["w"] + 0.5 * (x64["x"] @ x64["la"]) @ x64["lb"],
        "solve": np.linalg.solve(x64["A"], x64["Bm"]),
        "solve_vec": np.linalg.solve(x64["A"], x64["bv"]),
        "solve_batch": np.linalg.solve(x64["AA"], x64["BB"]),
        "greedy": np.argmax(i["logits"], 1),
        "sampled": sampled(i["logits"], 4, 0.8, 0.7, 11),
        "sampled_f32": sampled(i["logits"], 0, 1.0, 1.5, 0),
        "cum0": np.cumsum(c, 0),
        "cum1_excl": np.cumsum(c, 1) - c,
        "cum_last": np.cumsum(c, -1),
        "argmax": np.argmax(c, 1),
        "argmin": np.argmin(c, 0)[None],
        "topk": np.argsort(-i["logits"], 1, kind="stable")[:, :3],
        "custom": np.tanh(2 * x64["x"] * x64["u"]) + np.arange(6) - 1}


EXACT = {"greedy": np.int32, "sampled": np.int32, "sampled_f32": np.float32, "argmax": np.int64,
         "argmin": np.int64, "topk": np.int64}


@pytest.mark.parametrize("name", list(extra_expected(EXTRA_INPUTS)))
def test_extra_ops_match_numpy(extra_run, name):
    got, _ = extra_run
    want = extra_expected(EXTRA_INPUTS)[name]
    assert got[name].shape == want.shape
    if name in EXACT:
        assert got[name].dtype == EXACT[name]
        np.testing.assert_array_equal(got[name], want)
    else:
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4)


def test_extra_ops_lower_to_their_thunks(extra_run):
    _, kinds = extra_run
    assert {"LoraMatMul", "DenseSolveF32", "BatchedDenseSolveF32", "Sample", "Cumsum", "ArgReduce",
            "TopK", "CustomFn"} <= kinds


# ── FFT ───────────────────────────────────────────────────────────────────────

def c64(*shape):
    return (f32(*shape) + 1j * f32(*shape)).astype(np.complex64)


def block(z):
    """complex rows → real-block rows [re… im…]."""
    return np.concatenate([z.real, z.imag], -1)


def from_block(x):
    n = x.shape[-1] // 2
    return x[..., :n].astype(np.float64) + 1j * x[..., n:]


FFT_INPUTS = {"z8": c64(3, 8), "z12": c64(2, 12), "z16": c64(2, 16), "blk": f32(2, 20),
              "blk64": RNG.standard_normal((2, 14)), "r15": f32(2, 15), "r16": f32(3, 16),
              "h9re": f32(3, 9), "h9im": f32(3, 9), "h8re": f32(2, 8), "h8im": f32(2, 8)}


@pytest.fixture(scope="module")
def fft_run():
    g = rl.Graph("fft")
    v = {k: g.input(k, a.shape, "c64" if a.dtype == np.complex64 else a.dtype) for k, a in FFT_INPUTS.items()}
    (re15, im15), (re16, im16) = g.fft_real(v["r15"]), g.rfft(v["r16"], norm="ortho")
    named(g,
          fft=g.fft(v["z8"]),
          ifft_ortho=g.fft(v["z12"], inverse=True, norm="ortho"),
          fft_block=g.fft(v["blk"], norm="forward"),
          ifft_block64=g.fft_norm(v["blk64"], True, "backward"),
          round_trip_backward=g.fft(g.fft(v["z16"]), inverse=True),
          round_trip_forward=g.fft(g.fft(v["z16"], norm="forward"), True, "forward"),
          real=g.real(v["z8"]), imag=g.imag(v["z8"]), complex=g.complex(v["h8re"], v["h8im"]),
          fft_real_re=re15, fft_real_im=im15, rfft_re=re16, rfft_im=im16,
          irfft16=g.irfft(v["h9re"], v["h9im"], norm="forward"),
          irfft10_cropped=g.irfft(v["h9re"], v["h9im"], n=10, norm="ortho"),
          irfft15=g.irfft(v["h8re"], v["h8im"], n=15),
          fftfreq=g.fftfreq(8), rfftfreq=g.rfftfreq(9, 0.5))
    return compiled(g, FFT_INPUTS)


def fft_expected(i):
    x = {k: a.astype(np.complex128 if a.dtype == np.complex64 else np.float64) for k, a in i.items()}
    h9, h8 = x["h9re"] + 1j * x["h9im"], x["h8re"] + 1j * x["h8im"]
    return {"fft": np.fft.fft(x["z8"]),                                             # "backward": no scaling
            "ifft_ortho": np.fft.ifft(x["z12"], norm="ortho"),
            "fft_block": block(np.fft.fft(from_block(i["blk"]))),                   # "forward": 1/n on inverses only
            "ifft_block64": block(np.fft.ifft(from_block(i["blk64"]), norm="forward")),
            "round_trip_backward": 16 * x["z16"], "round_trip_forward": x["z16"],
            "real": x["z8"].real, "imag": x["z8"].imag, "complex": h8,
            "fft_real_re": np.fft.fft(x["r15"]).real, "fft_real_im": np.fft.fft(x["r15"]).imag,
            "rfft_re": np.fft.rfft(x["r16"], norm="ortho").real, "rfft_im": np.fft.rfft(x["r16"], norm="ortho").imag,
            "irfft16": np.fft.irfft(h9), "irfft10_cropped": np.fft.irfft(h9, 10, norm="ortho"),
            "irfft15": 15 * np.fft.irfft(h8, 15),
            "fftfreq": np.fft.fftfreq(8), "rfftfreq": np.fft.rfftfreq(9, 0.5)}


@pytest.mark.parametrize("name", list(fft_expected(FFT_INPUTS)))
def test_fft_ops_match_numpy(fft_run, name):
    got, _ = fft_run
    want = fft_expected(FFT_INPUTS)[name]
    assert got[name].shape == want.shape
    np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4)


# ── dynamic dims: inferred as −1 at build time, specialized per fed shape ──────

@pytest.fixture(scope="module")
def dynamic_graph():
    g = rl.Graph("dynamic")
    x, q = g.input("x", [-1, 2, -1, -1]), g.input("q", [-1, -1, 16])
    w = g.param("w", [3, 2, 3, 3])
    conv, attn = g.max_pool2d(g.conv2d(x, w, stride=2, padding=1), 2), g.attention_kind(q, q, q, 2, 8, "causal")
    assert conv.shape == (-1, 3, -1, -1) and attn.shape == (-1, -1, 16)
    named(g, conv=conv, attn=attn, cum=g.cumsum(q, 1))
    cg = rl.Session().compile(g)
    cg.set_param("w", CONV_PARAMS["w_grp"][:3])
    return cg


@pytest.mark.parametrize("batch, size, seq", [(1, 9, 3), (3, 12, 10)])
def test_dynamic_dims_specialize_per_shape(dynamic_graph, batch, size, seq):
    x, q = f32(batch, 2, size, size), f32(batch, seq, 16)
    conv, attn, cum = dynamic_graph.run({"x": x, "q": q})
    np.testing.assert_allclose(conv, pool_ref(conv_ref(x, CONV_PARAMS["w_grp"][:3], (2, 2), (1, 1)), (2, 2), (2, 2),
                                              (0, 0), "max"), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(attn, attention_ref(q, q, q, 2, 8, kind="causal"), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(cum, np.cumsum(q.astype(np.float64), 1), rtol=1e-4, atol=1e-4)


# ── bad inputs: GraphError at build time, naming the op and the shapes ────────

def ins(g: rl.Graph, *shapes, dtype="f32"):
    """One input per shape."""
    return [g.input(f"in{k}", shape, dtype) for k, shape in enumerate(shapes)]


IMG, W3 = [1, 3, 8, 8], [4, 3, 3, 3]
QR, KR = [1, 4, 32], [1, 5, 32]  # q and k/v rows
BAD = {  # case: (build, op named, detail named)
    "conv2d channels": (lambda g: g.conv2d(*ins(g, IMG, [4, 2, 3, 3])), "conv2d", "[1, 3, 8, 8]"),
    "conv2d rank": (lambda g: g.conv2d(*ins(g, [3, 8, 8], W3)), "conv2d", "[3, 8, 8]"),
    "conv2d window": (lambda g: g.conv2d(*ins(g, [1, 3, 2, 2], W3)), "conv2d", "larger"),
    "conv2d dtype": (lambda g: g.conv2d(*ins(g, IMG, W3, dtype="f64")), "conv2d", "f64"),
    "conv2d bias": (lambda g: g.conv2d(*ins(g, IMG, W3, [3])), "conv2d", "[3]"),
    "conv2d stride": (lambda g: g.conv2d(*ins(g, IMG, W3), stride=0), "conv2d", "stride"),
    "max_pool2d rank": (lambda g: g.max_pool2d(*ins(g, [8, 8]), 2), "max_pool2d", "[8, 8]"),
    "avg_pool2d window": (lambda g: g.avg_pool2d(*ins(g, [1, 1, 2, 2]), 3), "avg_pool2d", "larger"),
    "attention heads": (lambda g: g.attention_kind(*ins(g, [1, 4, 30], KR, KR), 4, 8), "attention", "[1, 4, 30]"),
    "attention gqa": (lambda g: g.attention_kind(*ins(g, QR, [1, 5, 24], [1, 5, 24]), 4, 8), "attention", "[1, 5, 24]"),
    "attention kv_seq": (lambda g: g.attention_kind(*ins(g, QR, KR, [1, 6, 32]), 4, 8), "attention", "[1, 6, 32]"),
    "attention mask": (lambda g: g.attention(*ins(g, QR, KR, KR, [1, 4]), 4, 8), "attention", "[1, 4]"),
    "attention kind": (lambda g: g.attention_kind(*ins(g, QR, KR, KR), 4, 8, "window"), "attention", "window"),
    "rope table": (lambda g: g.rope(*ins(g, [2, 5, 32], [6, 4], [6, 4]), 8), "rope", "[6, 4]"),
    "rope n_rot": (lambda g: g.rope(*ins(g, [2, 5, 32], [5, 8], [5, 8]), 8), "rope", "n_rot 16"),
    "lora": (lambda g: g.lora_matmul(*ins(g, [3, 6], [6, 5], [6, 2], [3, 5])), "lora_matmul", "[3, 5]"),
    "solve square": (lambda g: g.dense_solve(*ins(g, [3, 4], [3, 1])), "dense_solve", "[3, 4]"),
    "solve rhs": (lambda g: g.dense_solve(*ins(g, [4, 4], [3, 1])), "dense_solve", "[3, 1]"),
    "batched solve": (lambda g: g.batched_dense_solve(*ins(g, [4, 4], [4, 1])), "batched_dense_solve", "[4, 4]"),
    "fft odd block": (lambda g: g.fft(*ins(g, [2, 7])), "fft", "[2, 7]"),
    "fft dtype": (lambda g: g.fft(*ins(g, [2, 8], dtype="i32")), "fft", "i32"),
    "fft norm": (lambda g: g.fft(*ins(g, [2, 8], dtype="c64"), norm="half"), "fft", "half"),
    "real dtype": (lambda g: g.real(*ins(g, [2, 8])), "real/imag", "f32"),
    "complex shapes": (lambda g: g.complex(*ins(g, [2, 8], [2, 4])), "complex", "[2, 4]"),
    "irfft n": (lambda g: g.irfft(*ins(g, [2, 5], [2, 5]), n=10), "irfft", "[2, 5]"),
    "rfft dynamic": (lambda g: g.rfft(*ins(g, [2, -1])), "rfft", "[2, -1]"),
    "sample dtype": (lambda g: g.sample(*ins(g, [2, 8], dtype="f64")), "sample", "f64"),
    "sample out": (lambda g: g.sample(*ins(g, [2, 8]), dtype="bool"), "sample", "bool"),
    "cumsum axis": (lambda g: g.cumsum(*ins(g, [2, 8]), 2), "cumsum", "axis 2"),
    "argmax axis": (lambda g: g.argmax(*ins(g, [2, 8]), -3), "argmax", "axis -3"),
    "topk k": (lambda g: g.topk(*ins(g, [2, 8]), 9), "topk", "[2, 8]"),
    "custom_fn shape": (lambda g: g.custom_fn(ins(g, [3, 2, 5], [6]), custom_body()), "custom_fn", "[3, 2, 5]"),
    "custom_fn arity": (lambda g: g.custom_fn(ins(g, [3, 2, 6]), custom_body()), "custom_fn", "has 2 input(s)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_names_op_and_shape(case):
    build, op, detail = BAD[case]
    with pytest.raises(rl.GraphError) as err:
        build(rl.Graph("bad"))
    assert op in str(err.value) and detail in str(err.value), str(err.value)
