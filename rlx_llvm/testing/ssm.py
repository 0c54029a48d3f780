"""Examples of the state-space scans: SelectiveScan, Mamba2 (state sizes that leave a vector tail, odd widths)."""
from __future__ import annotations

from .. import thunks as T
from .layout import Example, example, uniform

STEP = uniform(0.01, 0.5)       # Δ / dt: positive (a softplus output)
DECAY = uniform(-2.0, -0.2)     # A / a: negative, so the state decays


def ssm() -> list[Example]:
    """One small case per kind, rtol 1e-5 of the largest output (f32 recurrences against float64)."""
    return [
        example("SelectiveScan/b2_s7_d5_n11",
                T.SelectiveScan(x=0, delta=0, a=0, b=0, c=0, dst=0, batch=2, seq=7, hidden=5, state_size=11),
                rtol=1e-5, delta=STEP, a=DECAY),
        example("Mamba2/b2_s6_h3_p5_n9",
                T.Mamba2(x=0, dt=0, a=0, b=0, c=0, dst=0, batch=2, seq=6, heads=3, head_dim=5, state_size=9),
                rtol=1e-5, dt=STEP, a=DECAY),
    ]
