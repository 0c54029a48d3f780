"""`rlx-llvm demo`: one transformer MLP block as RLX would schedule it, checked and timed.

    h   = LayerNorm(x)                       (LayerNorm)
    u   = gelu(h @ W1 + b1)                  (FusedMmBiasAct, erf GELU)
    v   = u @ W2                             (Sgemm)
    y   = x + v + b2                         (ElementwiseRegion: residual + tiled bias, one pass)
    ybf = bf16(y); yback = f32(ybf)          (CastF32ToBf16, CastBf16ToF32: bit-exact RNE)

It runs the schedule, checks every output against the NumPy reference (`rlx_llvm.reference`),
and times it against the same block written in NumPy.
"""
from __future__ import annotations

import time

import numpy as np


class _Layout:
    def __init__(self) -> None:
        self.top = 0
        self.slots: dict[str, int] = {}

    def __call__(self, name: str, nbytes: int) -> int:
        self.slots[name] = self.top
        self.top += (nbytes + 63) // 64 * 64
        return self.slots[name]


def build(rows: int, hidden: int):
    """The demo schedule and its slot offsets (`rows` tokens, model width `hidden`, MLP 4·hidden)."""
    from . import thunks as T
    from .ops import Activation, BinaryOp, ChainOperand as In, ChainStep as S
    from .schedule import ThunkSchedule
    inner = 4 * hidden
    at = _Layout()
    x, g, beta = at("x", 4 * rows * hidden), at("g", 4 * hidden), at("beta", 4 * hidden)
    w1, b1, w2, b2 = at("w1", 4 * hidden * inner), at("b1", 4 * inner), at("w2", 4 * inner * hidden), at("b2", 4 * hidden)
    h, u, v = at("h", 4 * rows * hidden), at("u", 4 * rows * inner), at("v", 4 * rows * hidden)
    y, ybf, yback = at("y", 4 * rows * hidden), at("ybf", 2 * rows * hidden), at("yback", 4 * rows * hidden)
    n = rows * hidden
    thunks = [
        T.LayerNorm(src=x, g=g, b=beta, dst=h, rows=rows, h=hidden, eps=1e-5),
        T.FusedMmBiasAct(a=h, w=w1, bias=b1, c=u, m=rows, k=hidden, n=inner, act=Activation.Gelu),
        T.Sgemm(a=u, b=w2, c=v, m=rows, k=inner, n=hidden),
        T.ElementwiseRegion(dst=y, len=n, input_offs=(x, v, b2), input_modulus=(0, 0, hidden),
                            chain=(S.Binary(BinaryOp.Add, In.Input(0), In.Input(1)),
                                   S.Binary(BinaryOp.Add, In.Step(0), In.Input(2)))),
        T.CastF32ToBf16(src=y, dst=ybf, len=n),
        T.CastBf16ToF32(src=ybf, dst=yback, len=n),
    ]
    return ThunkSchedule(thunks, arena_bytes=at.top), at.slots


def median_ms(fn, repeat: int) -> float:
    """Median wall time of `repeat` calls of `fn`, in milliseconds."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def main(quick: bool = False) -> int:
    """Run the demo; print correctness and timing; return a process exit code."""
    from scipy.special import erf

    from . import reference
    from .arena import Arena
    from .program import compile
    from .reference.halves import bf16_bits_to_f32, f32_to_bf16_bits
    rows, hidden = (64, 256) if quick else (512, 768)
    sched, s = build(rows, hidden)
    inner, n = 4 * hidden, rows * hidden
    rng = np.random.default_rng(0)
    arena = Arena(sched.arena_bytes)
    data = {"x": rng.standard_normal((rows, hidden)), "g": 1 + 0.1 * rng.standard_normal(hidden),
            "beta": 0.1 * rng.standard_normal(hidden), "w1": rng.standard_normal((hidden, inner)) / hidden ** 0.5,
            "b1": 0.1 * rng.standard_normal(inner), "w2": rng.standard_normal((inner, hidden)) / inner ** 0.5,
            "b2": 0.1 * rng.standard_normal(hidden)}
    data = {k: v.astype(np.float32) for k, v in data.items()}
    for name, value in data.items():
        arena.write(s[name], value)

    t0 = time.perf_counter()
    prog = compile(sched)
    compile_ms = (time.perf_counter() - t0) * 1e3
    print(f"rlx-llvm demo: a transformer MLP block, {rows} tokens × {hidden} (MLP {inner}), "
          f"{len(sched.thunks)} thunks, arena {sched.arena_bytes / 2**20:.1f} MiB")
    print(prog.report())
    print(f"compile: {compile_ms:.1f} ms{' (warm start from the object cache)' if prog.report().from_cache else ''}")

    prog.run(arena)
    expected = Arena.from_bytes(arena.bytes)
    reference.run(sched, expected)
    worst = 0.0
    for name in ("h", "u", "v", "y"):
        count = rows * inner if name == "u" else n
        got, want = arena.read(s[name], "f32", count), expected.read(s[name], "f32", count)
        err = float(np.max(np.abs(got - want) / (1 + np.abs(want))))
        worst = max(worst, err / 1e-4)
        print(f"  {name:<6} max error vs the NumPy reference (|Δ|/(1+|ref|)): {err:.1e} (bound 1e-4)")
    ybf_ref = f32_to_bf16_bits(arena.read(s["y"], "f32", n))  # the casts are bit-exact on our own y
    casts_ok = np.array_equal(arena.read(s["ybf"], "bf16", n), ybf_ref) and \
        np.array_equal(arena.read(s["yback"], "f32", n).view(np.uint32), bf16_bits_to_f32(ybf_ref).view(np.uint32))
    print(f"  ybf, yback: bits identical to the reference casts of y: {casts_ok}")

    x, g, beta, w1, b1, w2, b2 = (data[k] for k in ("x", "g", "beta", "w1", "b1", "w2", "b2"))
    half, root2 = np.float32(0.5), np.float32(np.sqrt(2.0))

    def numpy_block():
        mu = x.mean(axis=1, keepdims=True)
        hv = (x - mu) / np.sqrt(x.var(axis=1, keepdims=True) + np.float32(1e-5)) * g + beta
        a = hv @ w1 + b1
        uv = half * a * (1 + erf(a / root2).astype(np.float32))
        yv = x + uv @ w2 + b2
        return f32_to_bf16_bits(yv)

    repeat = 5 if quick else 10
    ours = median_ms(lambda: prog.run(arena), repeat)
    theirs = median_ms(numpy_block, max(3, repeat // 2))
    flops = 2 * 2 * rows * hidden * inner
    print(f"time per run: rlx-llvm {ours:.2f} ms ({flops / ours / 1e6:.0f} GFLOP/s), NumPy {theirs:.2f} ms "
          f"→ {theirs / ours:.1f}× faster")
    ok = worst <= 1.0 and casts_ok
    print("demo: OK" if ok else "demo: MISMATCH against the reference")
    return 0 if ok else 1
