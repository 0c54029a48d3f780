"""A small CNN (conv → relu → max-pool → conv → global average pool → linear) with the graph API, vs NumPy f64."""
import numpy as np
import rlx_llvm as rl

g = rl.Graph("cnn")
x = g.input("x", [-1, 3, 16, 16])                                       # dynamic batch, NCHW
h = g.max_pool2d(g.relu(g.conv2d(x, g.param("c1", [8, 3, 3, 3]), g.param("b1", [8]), padding=1)), 2)
h = g.relu(g.conv2d(h, g.param("c2", [16, 8, 3, 3]), g.param("b2", [16]), stride=2, padding=1))
g.set_outputs([g.global_avg_pool2d(h) @ g.param("w", [16, 10]) + g.param("b", [10])])

rng = np.random.default_rng(0)
shapes = {"c1": (8, 3, 3, 3), "b1": (8,), "c2": (16, 8, 3, 3), "b2": (16,), "w": (16, 10), "b": (10,)}
p = {k: rng.standard_normal(s) / 3 for k, s in shapes.items()}
cg = rl.Session().compile(g)
for k, v in p.items():
    cg.set_param(k, v.astype(np.float32))
xs = rng.standard_normal((4, 3, 16, 16))
got, = cg.run({"x": xs.astype(np.float32)})


def conv(a, w, b, s=1):  # float64 cross-correlation, padding 1: one einsum per kernel tap
    a, n = np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1))), (a.shape[2] - 1) // s + 1
    return sum(np.einsum("nchw,oc->nohw", a[:, :, i:i + s * n:s, j:j + s * n:s], w[:, :, i, j])
               for i in range(3) for j in range(3)) + b[:, None, None]


h = np.maximum(conv(xs, p["c1"], p["b1"]), 0).reshape(4, 8, 8, 2, 8, 2).max((3, 5))
want = np.maximum(conv(h, p["c2"], p["b2"], 2), 0).mean((2, 3)) @ p["w"] + p["b"]
assert np.allclose(got, want, atol=1e-4), np.abs(got - want).max()
print(cg.report(), "\nmax |error| vs float64:", np.abs(got - want).max())
