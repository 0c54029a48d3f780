"""NumPy model of RLX's random fills and token sampling (semantics.md §2.14, §2.15; docs/lowering-rng.md).

Written from the spec text alone, in uint32/uint64 arithmetic: RLX's own Philox4x32-10 (multiplier
0xD2561A75, key bumped after every round, counter from 0 with one block per 4 words), the ONNX-Runtime
compatible Lehmer LCG with Marsaglia's polar normals, and the §2.15 sampler.  Transcendentals (ln, cos,
exp) are evaluated in float64 and rounded once to f32 — the correctly rounded f32 value — and everything
else is f32 arithmetic in the order RLX writes it.
"""
from __future__ import annotations

import math

import numpy as np

from .. import thunks as T
from ..ops import RngBackend, RngOptions
from . import reference, view

M0, M1 = 0xD2561A75, 0xCD9E8D57          # RLX's round multipliers (standard Philox: M0 = 0xD2511F53)
BUMP0, BUMP1 = 0x9E3779B9, 0xBB67AE85    # key bump after every round
GOLDEN = 0x9E3779B97F4A7C15              # combine_seed(g, k) = g + k·GOLDEN (mod 2^64)
ROUNDS = 10
F32_MIN_POSITIVE = np.float32(2.0 ** -126)
TWO_PI_F32 = np.float32(2.0) * np.float32(math.pi)   # Rust's `2.0 * f32::consts::PI`
LCG_A, LCG_M = 48271, 2**31 - 1
SAMPLE_DEFAULT_SEED = 0xDEADBEEF
MASK32 = np.uint64(0xFFFFFFFF)


def combine_seed(seed: int, key: int) -> int:
    """The Philox seed of one fill: `seed + key·0x9E3779B97F4A7C15 (mod 2^64)`."""
    return (seed + key * GOLDEN) % 2**64


def philox_words(seed: int, count: int) -> np.ndarray:
    """The first `count` u32 of RLX's Philox4x32-10 stream keyed by `seed` (block b has counter b)."""
    blocks = -(-count // 4)
    c0 = np.arange(blocks, dtype=np.uint64)
    c1 = c2 = c3 = np.zeros(blocks, np.uint64)
    k0, k1 = seed & 0xFFFFFFFF, seed >> 32
    for _ in range(ROUNDS):
        p0, p1 = c0 * np.uint64(M0), c2 * np.uint64(M1)     # < 2^64: exact in uint64
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & MASK32,
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & MASK32)
        k0, k1 = (k0 + BUMP0) & 0xFFFFFFFF, (k1 + BUMP1) & 0xFFFFFFFF
    return np.stack([c0, c1, c2, c3], axis=1).reshape(-1)[:count].astype(np.uint32)


def unit_f32(words: np.ndarray) -> np.ndarray:
    """`next_f32`: `(u32 >> 8) / 2^24` ∈ [0, 1)."""
    return (words >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


def rounded(fn, x: np.ndarray) -> np.ndarray:
    """`fn` of f32 values evaluated in float64, rounded once to f32."""
    return fn(x.astype(np.float64)).astype(np.float32)


def philox_normals(seed: int, n: int) -> np.ndarray:
    """Box–Muller cosine branch from two fresh uniforms per draw (`u1` floored at f32::MIN_POSITIVE)."""
    u = unit_f32(philox_words(seed, 2 * n))
    u1, u2 = np.maximum(u[0::2], F32_MIN_POSITIVE), u[1::2]
    radius = np.sqrt(np.float32(-2.0) * rounded(np.log, u1))
    return radius * rounded(np.cos, TWO_PI_F32 * u2)


def saturating_u32(x: float) -> int:
    """Rust's `x as u32`: truncate toward zero, saturate, NaN → 0."""
    return 0 if math.isnan(x) else int(min(max(x, 0.0), 2.0**32 - 1))


def ort_seed(t: "T.RngNormal | T.RngUniform", rng: RngOptions) -> int:
    """The engine seed: `op_seed as u32` if present, else `(seed + key) as u32`."""
    return (rng.seed + t.key) % 2**32 if t.op_seed is None else saturating_u32(float(np.float32(t.op_seed)))


class Lehmer:
    """RLX's ORT-compatible engine: `state ← state·48271 mod (2^31 − 1)`, `unit = next/(M − 1)` as f32."""

    def __init__(self, seed: int) -> None:
        self.state = seed % LCG_M

    def unit(self) -> np.float32:
        """The next unit ∈ (0, 1] (0 forever from a zero state)."""
        self.state = self.state * LCG_A % LCG_M
        return np.float32(self.state / (LCG_M - 1))


def ort_uniforms(seed: int, n: int) -> np.ndarray:
    """The first `n` units of the engine."""
    g = Lehmer(seed)
    return np.array([g.unit() for _ in range(n)], np.float32)


def ort_normals(seed: int, n: int, mean: np.float32, scale: np.float32) -> np.ndarray:
    """Marsaglia's polar method, pairs: `u1·f·scale + mean`, then the cached `u2·f·scale + mean`."""
    g, out = Lehmer(seed), np.empty(n, np.float32)
    if n and g.state == 0:
        raise ValueError("a zero LCG state never leaves the polar method's rejection loop")
    two, one = np.float32(2.0), np.float32(1.0)
    i = 0
    while i < n:
        u1, u2 = two * g.unit() - one, two * g.unit() - one
        s = u1 * u1 + u2 * u2
        if s >= one or s == 0:
            continue
        f = np.sqrt(np.float32(-2.0) * rounded(np.log, np.array([s]))[0] / s)
        for u in (u1, u2):
            if i < n:
                out[i] = u * f * scale + mean
                i += 1
    return out


def fill(arena: np.ndarray, t: "T.RngNormal | T.RngUniform", rng: RngOptions) -> None:
    """One RngNormal / RngUniform under the policy `rng`."""
    dst = view(arena, t.dst, np.float32, t.len)
    normal = isinstance(t, T.RngNormal)
    a, b = (np.float32(t.mean), np.float32(t.scale)) if normal else (np.float32(t.low), np.float32(t.high))
    if rng.backend is RngBackend.Zero:
        dst[:] = 0.0
    elif rng.backend is RngBackend.Philox:
        seed = combine_seed(rng.seed, t.key)
        dst[:] = a + b * philox_normals(seed, t.len) if normal else a + unit_f32(philox_words(seed, t.len)) * (b - a)
    elif rng.backend is RngBackend.Ort:
        seed = ort_seed(t, rng)
        dst[:] = ort_normals(seed, t.len, a, b) if normal else a + (b - a) * ort_uniforms(seed, t.len)
    else:
        raise NotImplementedError(f"RngBackend.{rng.backend.name} is not reproduced")


@reference(T.RngNormal, T.RngUniform)
def rng_fill(arena: np.ndarray, t: "T.RngNormal | T.RngUniform", rng: RngOptions = RngOptions()) -> None:
    """The fill under the schedule's policy (`reference.run` passes it)."""
    fill(arena, t, rng)


rng_fill.reads_rng_policy = True


# ── Sample (§2.15) ──────────────────────────────────────────────────────────

def sample_row(logits: np.ndarray, t: T.Sample, r: np.float32) -> int:
    """One row: temperature, top-k (ties at the cutoff survive), stable softmax, top-p (the crossing
    token kept, then renormalized), then the first index whose cumulative probability reaches `r`."""
    v = logits.size
    z = logits / max(np.float32(t.temperature), np.float32(1e-6))      # Rust's f32::max: NaN → 1e-6
    if 0 < t.top_k < v:
        cutoff = np.sort(z)[::-1][t.top_k - 1]
        z = np.where(z < cutoff, np.float32(-np.inf), z)
    m = np.float32(np.nanmax(z)) if not np.isnan(z).all() else np.float32(-np.inf)
    e = rounded(np.exp, z - m)
    p = e / max(np.cumsum(e, dtype=np.float32)[-1], F32_MIN_POSITIVE)
    if np.float32(t.top_p) < 1:
        order = np.argsort(-p, kind="stable")
        reached = np.flatnonzero(np.cumsum(p[order], dtype=np.float32) >= np.float32(t.top_p))
        if reached.size:
            p[order[reached[0] + 1:]] = 0
        p = p / np.cumsum(p, dtype=np.float32)[-1]
    hit = np.flatnonzero(np.cumsum(p, dtype=np.float32) >= r)
    return int(hit[0]) if hit.size else v - 1


@reference(T.Sample)
def sample(arena: np.ndarray, t: T.Sample) -> None:
    """One Philox stream (key `seed`, or 0xDEADBEEF for 0) shared by the rows: row b draws word b."""
    logits = view(arena, t.logits, np.float32, t.batch * t.vocab).reshape(t.batch, t.vocab)
    draws = unit_f32(philox_words(t.seed or SAMPLE_DEFAULT_SEED, t.batch))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        picked = [sample_row(row.copy(), t, r) for row, r in zip(logits, draws)]
    view(arena, t.dst, np.float32, t.batch)[:] = np.array(picked, np.float32)
