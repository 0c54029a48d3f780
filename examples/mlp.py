"""A 2-layer MLP with the graph API, checked against NumPy float64."""
import numpy as np
import rlx_llvm as rl

g = rl.Graph("mlp")
x = g.input("x", [-1, 16])                                   # dynamic batch
h = g.gelu(x @ g.param("w1", [16, 32]) + g.param("b1", [32]))
y = g.softmax(h @ g.param("w2", [32, 4]) + g.param("b2", [4]))
g.set_outputs([y])

rng = np.random.default_rng(0)
params = {"w1": rng.standard_normal((16, 32)) / 4, "b1": rng.standard_normal(32),
          "w2": rng.standard_normal((32, 4)) / 6, "b2": rng.standard_normal(4)}
cg = rl.Session().compile(g)
for name, value in params.items():
    cg.set_param(name, value.astype(np.float32))
xs = rng.standard_normal((5, 16))
got, = cg.run({"x": xs.astype(np.float32)})

from scipy.special import erf, softmax  # noqa: E402
h64 = xs @ params["w1"] + params["b1"]
h64 = 0.5 * h64 * (1 + erf(h64 / np.sqrt(2)))
want = softmax(h64 @ params["w2"] + params["b2"], axis=-1)
assert np.allclose(got, want, atol=1e-5), np.abs(got - want).max()
print(cg.report())
print("max |error| vs float64:", np.abs(got - want).max())
