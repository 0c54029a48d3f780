"""`rlx-llvm demo`: a transformer-MLP-style epilogue schedule, checked against NumPy and timed.

The schedule is what RLX emits for `h = gelu(x + b1); y = x + 0.5·h; store y as bf16; reload`:
a fused region with a tiled bias, a second region with a scalar and a residual, and the two
bf16 casts around an activation stored at half precision.
"""
from __future__ import annotations

import time

import numpy as np


def build(rows: int, hidden: int):
    """The demo schedule and its slot offsets."""
    from . import thunks as T
    from .ops import Activation, BinaryOp, ChainOperand as In, ChainStep as S
    from .schedule import ThunkSchedule
    n = rows * hidden
    x, b1, half, h, y, ybf, yback = 0, 4 * n, 4 * n + 4 * hidden, 4 * n + 4 * hidden + 64, None, None, None
    y = h + 4 * n
    ybf = y + 4 * n
    yback = ybf + 2 * n
    arena_bytes = yback + 4 * n
    Inp, Stp = In.Input, In.Step
    thunks = [
        T.ElementwiseRegion(dst=h, len=n, input_offs=(x, b1),
                            chain=(S.Binary(BinaryOp.Add, Inp(0), Inp(1)),
                                   S.Activation(Activation.Gelu, Stp(0))),
                            input_modulus=(0, hidden)),
        T.ElementwiseRegion(dst=y, len=n, input_offs=(x, h, half), scalar_input_mask=0b100,
                            chain=(S.Binary(BinaryOp.Mul, Inp(1), Inp(2)),
                                   S.Binary(BinaryOp.Add, Inp(0), Stp(0)))),
        T.CastF32ToBf16(src=y, dst=ybf, len=n),
        T.CastBf16ToF32(src=ybf, dst=yback, len=n),
    ]
    slots = {"x": x, "b1": b1, "half": half, "h": h, "y": y, "ybf": ybf, "yback": yback}
    return ThunkSchedule(thunks, arena_bytes=arena_bytes), slots


def _median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def main(quick: bool = False) -> int:
    """Run the demo; print correctness and timing; return a process exit code."""
    from . import reference
    from .arena import Arena
    from .program import compile
    rows, hidden = (256, 768) if quick else (2048, 3072)
    sched, s = build(rows, hidden)
    n = rows * hidden
    rng = np.random.default_rng(0)
    arena = Arena(sched.arena_bytes)
    xv = rng.standard_normal((rows, hidden), dtype=np.float32)
    bv = rng.standard_normal(hidden, dtype=np.float32) * 0.1
    arena.write(s["x"], xv)
    arena.write(s["b1"], bv)
    arena.write(s["half"], np.float32([0.5]))

    t0 = time.perf_counter()
    prog = compile(sched)
    compile_ms = (time.perf_counter() - t0) * 1e3
    print(f"rlx-llvm demo: {len(sched.thunks)} thunks over [{rows}, {hidden}] f32 "
          f"(arena {sched.arena_bytes / 2**20:.1f} MiB)")
    print(prog.report())
    print(f"compile: {compile_ms:.1f} ms{' (object cache hit)' if prog.report().from_cache else ''}")

    prog.run(arena)
    expected = Arena.from_bytes(arena.bytes)  # same inputs; outputs recomputed by the NumPy oracle
    expected.bytes[s["h"]:] = 0
    reference.run(sched, expected)
    worst = 0.0
    for name in ("h", "y"):
        got = arena.read(s[name], "f32", n)
        want = expected.read(s[name], "f32", n)
        err = float(np.max(np.abs(got - want) / (1 + np.abs(want))))
        worst = max(worst, err / 1e-5)
        print(f"  {name:<6} max error vs NumPy reference (|Δ|/(1+|ref|)): {err:.2e} (bound 1e-5)")
    # The casts are bit-exact: run the reference casts on OUR y and compare the bits.
    from .reference.halves import bf16_bits_to_f32, f32_to_bf16_bits
    ybf_ref = f32_to_bf16_bits(arena.read(s["y"], "f32", n))
    bf_equal = np.array_equal(arena.read(s["ybf"], "bf16", n), ybf_ref) and \
        np.array_equal(arena.read(s["yback"], "f32", n).view(np.uint32), bf16_bits_to_f32(ybf_ref).view(np.uint32))
    print(f"  ybf, yback: bits identical to the reference casts of y: {bf_equal}")

    c1, c2, half_, one = np.float32(0.7978846), np.float32(0.044715), np.float32(0.5), np.float32(1)

    def numpy_version():
        v = xv + bv
        hv = half_ * v * (one + np.tanh(c1 * (v + c2 * v * v * v)))
        yv = xv + hv * half_
        u = yv.view(np.uint32)
        bits = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)

    repeat = 5 if quick else 10
    ours = _median_ms(lambda: prog.run(arena), repeat)
    theirs = _median_ms(numpy_version, max(3, repeat // 2))
    copy_src = np.empty(4 * n, dtype=np.uint8)
    copy_dst = np.empty_like(copy_src)
    copy_ms = _median_ms(lambda: np.copyto(copy_dst, copy_src), repeat)
    print(f"time per run: rlx-llvm {ours:.2f} ms, NumPy {theirs:.2f} ms → {theirs / ours:.1f}× faster "
          f"(one {4 * n / 2**20:.0f} MiB copy takes {copy_ms:.2f} ms)")
    ok = worst <= 1.0 and bf_equal
    print("demo: OK" if ok else "demo: MISMATCH against the reference")
    return 0 if ok else 1
