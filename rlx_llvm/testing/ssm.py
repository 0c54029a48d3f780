"""Examples of the state-space scans: SelectiveScan, Mamba2, GatedDeltaNet (state sizes that leave a vector tail)."""
from __future__ import annotations

from .. import thunks as T
from .layout import Example, example, normal, uniform

STEP = uniform(0.01, 0.5)       # Δ / dt: positive (a softplus output)
DECAY = uniform(-2.0, -0.2)     # A / a: negative, so the state decays
LOG_GATE = uniform(-1.0, 0.0)   # g of DeltaNet: e^g in (0.37, 1]
KEYS = normal(scale=0.3)        # q, k near unit length for n ≈ 10 (the caller L2-normalizes them)


def deltanet(kind: type, n: int, per_channel: bool, carry: bool) -> "T._DeltaNet":
    """A GatedDeltaNet (or its backward, dy normal) of 2 batches, 5 tokens, 3 heads, state n × n."""
    grad = {"dy": 0} if kind is T.GatedDeltaNetBackward else {}
    return kind(q=0, k=0, v=0, g=0, beta=0, state=0, dst=0, batch=2, seq=5, heads=3, state_size=n,
                gate_per_channel=per_channel, carry_state=carry, **grad)


def ssm() -> list[Example]:
    """One small case per kind, rtol 1e-5 of the largest output (f32 recurrences against float64)."""
    return [
        example("SelectiveScan/b2_s7_d5_n11",
                T.SelectiveScan(x=0, delta=0, a=0, b=0, c=0, dst=0, batch=2, seq=7, hidden=5, state_size=11),
                rtol=1e-5, delta=STEP, a=DECAY),
        example("Mamba2/b2_s6_h3_p5_n9",
                T.Mamba2(x=0, dt=0, a=0, b=0, c=0, dst=0, batch=2, seq=6, heads=3, head_dim=5, state_size=9),
                rtol=1e-5, dt=STEP, a=DECAY),
    ] + [example(f"{kind.__name__}/{name}", deltanet(kind, n, per_channel, carry), rtol=1e-5, q=KEYS, k=KEYS,
                 g=LOG_GATE, beta=uniform(0.0, 1.0))
         for kind in (T.GatedDeltaNet, T.GatedDeltaNetBackward)
         for name, n, per_channel, carry in (("scalar_gate_n11", 11, False, False),
                                             ("per_channel_gate_carry_n9", 9, True, True))]
