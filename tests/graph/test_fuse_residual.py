"""The residual_norm fusion (rlx_llvm.graph.fuse.fuse_residual_norms): `norm(x + res)` becomes one
FusedResidualLN / FusedResidualRmsNorm, and the near misses stay a region plus a norm — same values."""
from __future__ import annotations

import numpy as np
import pytest

import rlx_llvm as rl

from tests.harness import assert_close

B, S, E = 2, 5, 24
EPS = 1e-5
RNG = np.random.default_rng(0)
X, R = (RNG.standard_normal((B, S, E)).astype(np.float32) for _ in range(2))
GAMMA, BETA = (RNG.standard_normal(E).astype(np.float32) for _ in range(2))


def norm_reference(v: np.ndarray, rms: bool) -> np.ndarray:
    """LayerNorm or RmsNorm of `v` over the last axis, then `·γ + β` (f64)."""
    v = v.astype(np.float64)
    d = v if rms else v - v.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + EPS) * GAMMA + BETA


def residual_graph(norm: str, case: str) -> rl.Graph:
    """`norm(x + res)` over `[B, S, E]` in a chosen variant (see CASES)."""
    g = rl.Graph("residual")
    x = g.input("x", [B, S, E])
    res = g.input("res", [E] if case == "broadcast residual" else [B, S, E])
    s = x + res
    y = getattr(g, norm)(s, g.param("gamma", [E], value=GAMMA), g.param("beta", [E], value=BETA), eps=EPS)
    if case == "sum read again":
        y = y + s
    g.set_outputs([y, s] if case == "sum also an output" else [y])
    return g


CASES = {"fused": True, "sum also an output": False, "sum read again": False, "broadcast residual": False}


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("case", CASES)
def test_norm_of_a_residual_sum(norm, case):
    cg = rl.Session().compile(residual_graph(norm, case))
    res = R[0, 0] if case == "broadcast residual" else R
    got = cg.run({"x": X, "res": res})[0]
    kinds = [type(t).__name__ for t in cg.schedule.thunks]
    fused = "FusedResidualLN" if norm == "layer_norm" else "FusedResidualRmsNorm"
    assert (fused in kinds) == CASES[case], cg.report()
    assert ("residual_norm:" in cg.report()) == CASES[case]
    s = X + res
    want = norm_reference(s, norm == "rms_norm") + (s if case == "sum read again" else 0)
    assert_close(got, want.astype(np.float32), rtol=1e-5, atol=1e-5, what=f"{norm} {case}")
