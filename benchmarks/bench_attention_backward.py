"""Attention backward at BERT-base shape (batch 8, seq 128, 12 heads × 64): rlx-llvm's
AttentionBackwardAll (recomputes scores and softmax) against PyTorch eager autograd of
scaled_dot_product_attention — its backward alone (forward graph kept) and forward + backward —
without a mask and Causal, at 1 thread (or `--threads N`, rlx_llvm and torch alike).

    cd /work/main && PYTHONPATH=. python benchmarks/bench_attention_backward.py [--rounds 15] [--threads 2]

Every implementation is checked against the float64 NumPy reference first.  Rounds interleave the
implementations; printed are medians of wall time and of CPU time (`time.thread_time` at one
thread, `time.process_time` — every thread of the process — otherwise) and the median paired
ratio to rlx-llvm of the same round.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

B, S, H, D = 8, 128, 12, 64
TOL = 1e-3  # |Δ| / (1 + |ref|)


def timed_rounds(fns: dict, rounds: int, cpu_clock) -> dict[str, tuple[list[float], list[float]]]:
    """(wall ms, CPU ms) per round of each implementation, in an order rotating from round to round."""
    names = list(fns)
    for fn in fns.values():
        fn(), fn()
    out = {name: ([], []) for name in names}
    gc.disable()
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            w0, c0 = time.perf_counter(), cpu_clock()
            fns[name]()
            out[name][0].append((time.perf_counter() - w0) * 1e3)
            out[name][1].append((cpu_clock() - c0) * 1e3)
    gc.enable()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mask", nargs="*", default=["None_", "Causal"], choices=["None_", "Causal"])
    args = ap.parse_args()
    common.pin_threads(args.threads)
    import numpy as np
    import torch
    import rlx_llvm as rl
    from rlx_llvm import reference as ref
    from rlx_llvm import thunks as T
    from rlx_llvm.ops import MaskKind
    common.limit_loaded_pools(args.threads)
    torch.set_num_threads(args.threads)
    rl.set_num_threads(args.threads)
    ref.load_all()
    cpu_clock = time.thread_time if args.threads == 1 else time.process_time

    n = B * S * H * D
    rng = np.random.default_rng(0)
    x = [rng.standard_normal(n).astype(np.float32) for _ in range(4)]  # q, k, v, dy as [B, S, H, D]
    offs = [4 * n * i for i in range(7)]
    heads = lambda a: torch.from_numpy(a.reshape(B, S, H, D)).transpose(1, 2)  # noqa: E731 (BHSD view)
    tq, tk, tv = (heads(a).clone().requires_grad_(True) for a in x[:3])
    tdy = heads(x[3]).contiguous()
    print(f"attention backward, B={B} S={S} H={H} D={D}, {args.threads} thread(s), torch {torch.__version__}, "
          f"{common.cpu_model()}, load {common.load_average()}")
    print(f"  {'mask':7s} {'implementation':15s} {'wall ms':>8s} {'CPU ms':>8s}  ÷ rlx-llvm (wall, CPU)")
    for mask in args.mask:
        kind = getattr(MaskKind, mask)
        t = T.AttentionBackwardAll(q=offs[0], k=offs[1], v=offs[2], dy=offs[3], mask=0, out_q=offs[4],
                                   out_k=offs[5], out_v=offs[6], batch=B, seq=S, kv_seq=S, heads=H, head_dim=D,
                                   mask_kind=kind, bhsd=False)
        prog = rl.compile(rl.ThunkSchedule([t], arena_bytes=7 * 4 * n))
        arena = rl.Arena(7 * 4 * n)
        for off, a in zip(offs, x):
            arena.bytes[off:off + a.nbytes] = a.view(np.uint8)
        want = arena.bytes.copy()
        ref.REFERENCES[T.AttentionBackwardAll](want, t)
        wants = [want[o:o + 4 * n].view(np.float32) for o in offs[4:]]
        causal = kind == MaskKind.Causal

        def torch_forward():
            return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

        def torch_both():
            tq.grad = tk.grad = tv.grad = None
            torch_forward().backward(tdy)

        y = torch_forward()

        def torch_backward():
            tq.grad = tk.grad = tv.grad = None
            y.backward(tdy, retain_graph=True)

        prog.run(arena)
        torch_both()
        for name, got in (("rlx-llvm", [arena.bytes[o:o + 4 * n].view(np.float32) for o in offs[4:]]),
                          ("torch", [g.transpose(1, 2).reshape(-1).numpy() for g in (tq.grad, tk.grad, tv.grad)])):
            for g, w in zip(got, wants):
                err = float(np.max(np.abs(g - w) / (1 + np.abs(w))))
                if err > TOL:
                    sys.exit(f"{name}: max relative error {err:.2e} > {TOL}")
        times = timed_rounds({"rlx-llvm": lambda: prog.run(arena), "torch backward": torch_backward,
                              "torch fwd+bwd": torch_both}, args.rounds, cpu_clock)
        ours = times["rlx-llvm"]
        for name, (wall, cpu) in times.items():
            ratio = [float(np.median(np.divide(s, o))) for s, o in zip((wall, cpu), ours)]
            print(f"  {mask:7s} {name:15s} {np.median(wall):8.2f} {np.median(cpu):8.2f}  "
                  f"{ratio[0]:5.2f} {ratio[1]:5.2f}")


if __name__ == "__main__":
    main()
