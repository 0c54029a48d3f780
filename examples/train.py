"""Fit sin(x) with a 2-layer MLP: rl.grad + an in-graph SGD-with-momentum step, 100 steps."""
import numpy as np
import rlx_llvm as rl
from rlx_llvm.graph.autodiff import sgd_momentum

rng = np.random.default_rng(0)
X = rng.uniform(-2, 2, (64, 1)).astype(np.float32)
shapes = {"w1": (1, 16), "b1": (16,), "w2": (16, 1), "b2": (1,)}
g = rl.Graph("mlp")
x, y = g.input("x", [-1, 1]), g.input("y", [-1, 1])
p = {k: g.param(k, s) for k, s in shapes.items()}
g.set_outputs([g.mse(g.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"], y)])
step = rl.grad(g, wrt=list(shapes))                      # outputs: loss, d_w1, d_b1, d_w2, d_b2
loss, *grads = step.outputs                              # extend it with the update of every param
updates = [sgd_momentum(step, step.value(step.params[k]), step.input("v_" + k, s), step.value(d), lr=0.1, mom=0.9)
           for (k, s), d in zip(shapes.items(), grads)]
step.set_outputs([loss] + [u for pv in updates for u in pv])   # loss, then (p', v') per param
train = rl.Session().compile(step)
params = {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in shapes.items()}
feeds = {"x": X, "y": np.sin(X), "d_output": np.ones(1, np.float32)}
feeds.update({"v_" + k: np.zeros(s, np.float32) for k, s in shapes.items()})
losses = []
for _ in range(100):
    for k, v in params.items():
        train.set_param(k, v)
    out = train.run(feeds)
    losses.append(float(out[0]))
    for i, k in enumerate(shapes):
        params[k], feeds["v_" + k] = out[1 + 2 * i], out[2 + 2 * i]
print(f"loss {losses[0]:.4f} → {losses[-1]:.4f} after {len(losses)} steps")
