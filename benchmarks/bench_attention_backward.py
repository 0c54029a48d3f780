"""Attention backward at BERT-base shape (batch 8, seq 128, 12 heads × 64), one thread: rlx-llvm's
AttentionBackwardAll (recomputes scores and softmax) against PyTorch eager autograd of
scaled_dot_product_attention — its backward alone (forward graph kept) and forward + backward.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_attention_backward.py [--rounds 15] [--mask Causal]

Every implementation is checked against the float64 NumPy reference first; medians of interleaved
rounds and the paired ratio to rlx-llvm are printed.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

B, S, H, D = 8, 128, 12, 64
TOL = 1e-3  # |Δ| / (1 + |ref|)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--mask", default="None_", choices=["None_", "Causal"])
    args = ap.parse_args()
    common.pin_threads(1)
    import numpy as np
    import torch
    import rlx_llvm as rl
    from rlx_llvm import reference as ref
    from rlx_llvm import thunks as T
    from rlx_llvm.ops import MaskKind
    common.limit_loaded_pools(1)
    torch.set_num_threads(1)
    rl.set_num_threads(1)
    kind = getattr(MaskKind, args.mask)

    n = B * S * H * D
    rng = np.random.default_rng(0)
    x = [rng.standard_normal(n).astype(np.float32) for _ in range(4)]  # q, k, v, dy as [B, S, H, D]
    offs = [4 * n * i for i in range(7)]
    t = T.AttentionBackwardAll(q=offs[0], k=offs[1], v=offs[2], dy=offs[3], mask=0, out_q=offs[4], out_k=offs[5],
                               out_v=offs[6], batch=B, seq=S, kv_seq=S, heads=H, head_dim=D, mask_kind=kind,
                               bhsd=False)
    prog = rl.compile(rl.ThunkSchedule([t], arena_bytes=7 * 4 * n))
    arena = rl.Arena(7 * 4 * n)
    for off, a in zip(offs, x):
        arena.bytes[off:off + a.nbytes] = a.view(np.uint8)
    want = arena.bytes.copy()
    ref.load_all()
    ref.REFERENCES[T.AttentionBackwardAll](want, t)
    wants = [want[o:o + 4 * n].view(np.float32) for o in offs[4:]]

    heads = lambda a: torch.from_numpy(a.reshape(B, S, H, D)).transpose(1, 2)  # noqa: E731 (BHSD view)
    tq, tk, tv = (heads(a).clone().requires_grad_(True) for a in x[:3])
    tdy = heads(x[3]).contiguous()
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
    times = common.interleaved({"rlx-llvm": lambda: prog.run(arena), "torch backward": torch_backward,
                                "torch fwd+bwd": torch_both}, rounds=args.rounds, warmup=2)
    print(f"attention backward, B={B} S={S} H={H} D={D}, mask {args.mask}, 1 thread, torch {torch.__version__}, "
          f"{common.cpu_model()}, load {common.load_average()}")
    for name, tm in times.items():
        ratio = common.paired_ratio(tm, times["rlx-llvm"])
        print(f"  {name:15s} median {tm.median:8.2f} ms  (p10 {tm.p10:7.2f}, p90 {tm.p90:7.2f})  "
              f"÷ rlx-llvm {ratio:5.2f}")


if __name__ == "__main__":
    main()
