"""A 2-layer post-LN transformer encoder with the graph API (the compiler fuses each layer), vs NumPy f64."""
import numpy as np
import rlx_llvm as rl
from scipy.special import erf, softmax

H, HEADS, FF, LAYERS = 32, 4, 64, 2
rng = np.random.default_rng(0)
P = {}
g = rl.Graph("encoder")
x = g.input("x", [-1, -1, H])
keep = g.input("keep", [-1, -1])                              # 1 = attend to this token
def p(name, *shape):
    P[name] = rng.standard_normal(shape) * (0.2 if len(shape) > 1 else 0.1) + (1.0 if name.endswith("g") else 0)
    return g.param(name, shape)
for i in range(LAYERS):
    qkv = x @ p(f"{i}qkv", H, 3 * H) + p(f"{i}qkv_b", 3 * H)
    q, k, v = (g.narrow(qkv, 2, j * H, H) for j in range(3))
    a = g.attention(q, k, v, keep, num_heads=HEADS, head_dim=H // HEADS) @ p(f"{i}o", H, H) + p(f"{i}o_b", H)
    x = g.layer_norm(a + x, p(f"{i}ln1g", H), p(f"{i}ln1b", H), eps=1e-12)
    f = g.gelu(x @ p(f"{i}f1", H, FF) + p(f"{i}f1b", FF)) @ p(f"{i}f2", FF, H) + p(f"{i}f2b", H)
    x = g.layer_norm(f + x, p(f"{i}ln2g", H), p(f"{i}ln2b", H), eps=1e-12)
g.set_outputs([x])
cg = rl.Session().compile(g)
for name, value in P.items():
    cg.set_param(name, value.astype(np.float32))
xs, ks = rng.standard_normal((2, 5, H)), np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], float)
got, = cg.run({"x": xs.astype(np.float32), "keep": ks.astype(np.float32)})

ln = lambda t, gg, bb: (t - t.mean(-1, keepdims=True)) / np.sqrt(t.var(-1, keepdims=True) + 1e-12) * gg + bb
heads = lambda t: t.reshape(2, 5, HEADS, H // HEADS).transpose(0, 2, 1, 3)
for i in range(LAYERS):
    q, k, v = np.split(xs @ P[f"{i}qkv"] + P[f"{i}qkv_b"], 3, axis=-1)
    s = heads(q) @ heads(k).swapaxes(-1, -2) / np.sqrt(H // HEADS) + np.where(ks[:, None, None] < 0.5, -1e9, 0)
    a = (softmax(s, -1) @ heads(v)).transpose(0, 2, 1, 3).reshape(2, 5, H) @ P[f"{i}o"] + P[f"{i}o_b"]
    xs = ln(a + xs, P[f"{i}ln1g"], P[f"{i}ln1b"])
    f = xs @ P[f"{i}f1"] + P[f"{i}f1b"]
    xs = ln(0.5 * f * (1 + erf(f / np.sqrt(2))) @ P[f"{i}f2"] + P[f"{i}f2b"] + xs, P[f"{i}ln2g"], P[f"{i}ln2b"])
assert np.allclose(got, xs, atol=2e-4), np.abs(got - xs).max()
print(cg.report().splitlines()[:4], "\nmax |error| vs float64:", np.abs(got - xs).max())
print(cg.plan().table().splitlines()[0])
