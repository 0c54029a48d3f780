"""MiniLM-L6 with f32 against GGUF Q8_0 / Q4_0 linear layers (`rlx_llvm.models`, `quant=`): the
cosine of the quantized embeddings against the f32 ones on the golden sentences, and the run time
of the encoders, by default at batch 1 on each golden sentence's own tokens (its exact length), in one run.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_minilm_quant.py [--threads 1,2]
        [--shapes golden | 1x16,1x128,8x16,8x128] [--rounds 20] [--profile 1x16,1x128]

Encoders: f32, q8_0, q4_0 (AWQ-scaled, the default for "q4_0") and q4_0 plain (`awq=False`).
Each thread count runs in its own worker process (thread pools pinned before NumPy loads).  Per
shape the encoders are interleaved round by round, each timed call preceded by one untimed
call; medians in ms and ratios f32 ÷ quantized (> 1: the quantized encoder is faster), of wall
time and, for a machine shared with other jobs, of this process's CPU time (at one thread the
CPU time does not count the time the process waits for a core).
`--profile` times (CPU time) layer 0 thunk by thunk (each compiled alone, run on the arena of a real run)
for each quantized format, next to the f32 `FusedBertLayer` and an f32 `Sgemm` of each GEMM's shape.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

VARIANTS = {"f32": {"quant": "f32"}, "q8_0": {"quant": "q8_0"}, "q4_0": {"quant": "q4_0"},
            "q4_0 plain": {"quant": "q4_0", "awq": False}}
QUANTS = tuple(VARIANTS)
GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "data" / "minilm_golden.json"
FIRST_LAYER_THUNK = 4  # after Gather, Gather, ElementwiseRegion, LayerNorm (models.bert.encoder_schedule)


def shapes_of(text: str, enc=None) -> list[tuple[int, int]]:
    """'1x16,8x128' → [(1, 16), (8, 128)]; 'golden' → (1, n) for each golden sentence's token count n."""
    if text == "golden":
        return [(1, n) for n in sorted({len(r) for r in enc.tokenize_rows(golden_sentences())})]
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]  # type: ignore[misc]


def golden_sentences() -> list[str]:
    return json.loads(GOLDEN.read_text())["sentences"]


def median_ms(samples: list[float]) -> float:
    s = sorted(samples)
    return s[len(s) // 2]


def inputs(enc, batch: int, seq: int):
    """At batch 1, the tokens of the golden sentence of `seq` tokens if there is one; else ids of
    random in-vocabulary tokens between [CLS] and [SEP]; every token unmasked."""
    import numpy as np
    rows = [r for r in enc.tokenize_rows(golden_sentences()) if len(r) == seq]
    if batch == 1 and rows:
        ids = np.array(rows[:1])
    else:
        ids = np.random.default_rng(seq).integers(1000, 20000, (batch, seq))
        ids[:, 0], ids[:, -1] = 101, 102
    return ids, np.ones((batch, seq), np.float32)


def time_shapes(encoders: dict, shapes, rounds: int, threads: int) -> None:
    """One table row per shape: the median of each encoder, interleaved round by round."""
    ratios = [f"{'f32/' + q:>14}" for q in QUANTS[1:]]
    print(f"{'threads':>7} {'shape':>7} " + " ".join(f"{q + ' ms':>13}" for q in QUANTS) + " " + " ".join(ratios)
          + "  CPU time: " + " ".join(f"{q + ' ms':>13}" for q in QUANTS) + " " + " ".join(ratios))
    for batch, seq in shapes:
        ids, mask = inputs(encoders["f32"], batch, seq)
        wall: dict[str, list[float]] = {q: [] for q in QUANTS}
        cpu: dict[str, list[float]] = {q: [] for q in QUANTS}
        for enc in encoders.values():
            enc.embed_tokens(ids, mask)  # compile (or load from the object cache)
        for _ in range(rounds):
            for q, enc in encoders.items():
                enc.embed_tokens(ids, mask)
                t0, c0 = time.perf_counter(), time.process_time()
                enc.embed_tokens(ids, mask)
                wall[q].append((time.perf_counter() - t0) * 1e3)
                cpu[q].append((time.process_time() - c0) * 1e3)
        columns = []
        for times in (wall, cpu):
            med = {q: median_ms(times[q]) for q in QUANTS}
            columns.append(" ".join(f"{med[q]:13.2f}" for q in QUANTS) + " "
                           + " ".join(f"{med['f32'] / med[q]:14.2f}" for q in QUANTS[1:]))
        print(f"{threads:>7} {f'{batch}x{seq}':>7} " + columns[0] + "            " + columns[1], flush=True)
    print(f"(load + AWQ calibration of q4_0: {encoders['q4_0'].load_s:.1f} s wall)")


def thunk_ms(thunk, arena, rounds: int) -> float:
    """Median CPU ms of one thunk compiled alone, run on `arena` (whose bytes it reads and writes)."""
    import rlx_llvm as rl
    prog = rl.compile(rl.ThunkSchedule([thunk], arena_bytes=arena.nbytes))
    prog.run(arena)
    samples = []
    for _ in range(rounds):
        t0 = time.process_time()
        prog.run(arena)
        samples.append((time.process_time() - t0) * 1e3)
    return median_ms(samples)


def sgemm_ms(w, m: int, rounds: int) -> float:
    """Median ms of an f32 `Sgemm` `[m, k] @ w` (w the f32 `[k, n]` weight) on an arena of its own."""
    import numpy as np
    import rlx_llvm as rl
    import rlx_llvm.thunks as T
    k, n = w.shape
    at = lambda nbytes: -(-nbytes // 64) * 64  # noqa: E731
    b, c = at(4 * m * k), at(4 * m * k) + at(4 * k * n)
    arena = rl.Arena(c + at(4 * m * n))
    arena.write(0, np.random.default_rng(0).standard_normal((m, k)).astype(np.float32))
    arena.write(b, w)
    return thunk_ms(T.Sgemm(a=0, b=b, c=c, m=m, k=k, n=n), arena, rounds)


def profile(encoders: dict, batch: int, seq: int, rounds: int) -> None:
    """Layer 0 thunk by thunk for each quantized format, beside f32 Sgemm of each GEMM shape."""
    from rlx_llvm.models.bert import LINEARS, encoder_schedule
    ids, mask = inputs(encoders["f32"], batch, seq)
    m = batch * seq
    print(f"\nprofile, layer 0 of 6 at {batch}x{seq} (m = {m}), one thread, CPU time:")
    f32 = encoders["f32"]
    f32.embed_tokens(ids, mask)
    sched, _ = encoder_schedule(f32.config, f32.weights, batch, seq, f32.pooling, "f32")
    layer = next(t for t in sched.thunks if type(t).__name__ == "FusedBertLayer")
    print(f"  f32   FusedBertLayer     {thunk_ms(layer, f32._arena, rounds):8.3f} ms")
    sgemm = {name: sgemm_ms(f32.graph.params[f"l0.{name}_w"], m, rounds) for name in LINEARS}
    for q in QUANTS[1:]:
        enc = encoders[q]
        enc.embed_tokens(ids, mask)  # the arena holds this shape's real activations
        sched, _ = encoder_schedule(enc.config, enc.weights, batch, seq, enc.pooling, enc.quant)
        ends = [i for i, t in enumerate(sched.thunks) if type(t).__name__ == "FusedResidualLN"]
        gemms = iter(LINEARS)
        total = 0.0
        for t in sched.thunks[FIRST_LAYER_THUNK:ends[1] + 1]:  # layer 0 ends with its second residual LN
            ms = thunk_ms(t, enc._arena, rounds)
            total += ms
            line = f"  {q:<10} {type(t).__name__:<18} {ms:8.3f} ms"
            if type(t).__name__ == "DequantMatMulGguf":
                name = next(gemms)
                line += (f"  {name:<3} m,k,n = {t.m},{t.k},{t.n}: {2 * t.m * t.k * t.n / ms / 1e6:6.1f} GFLOP/s;"
                         f" f32 Sgemm {sgemm[name]:.3f} ms")
            print(line, flush=True)
        print(f"  {q:<10} layer total        {total:8.3f} ms")


def load(name: str):
    """The encoder of VARIANTS[name], with its load time (s, wall) as `load_s`."""
    from rlx_llvm.models import load_minilm
    t0 = time.perf_counter()
    enc = load_minilm(**VARIANTS[name])
    enc.load_s = time.perf_counter() - t0
    enc.tokenize_rows = lambda texts: enc._token_rows(texts, None)
    return enc


def worker(args) -> int:
    common.pin_threads(args.worker)
    import rlx_llvm as rl
    rl.set_num_threads(args.worker)
    encoders = {q: load(q) for q in QUANTS}
    time_shapes(encoders, shapes_of(args.shapes, encoders["f32"]), args.rounds, args.worker)
    if args.worker == 1:
        for batch, seq in shapes_of(args.profile):
            profile(encoders, batch, seq, args.rounds)
    return 0


HELD_OUT = ("Where can I buy fresh bread around here?", "The contract expires at the end of the year.",
            "Neural networks learn representations from data.", "My grandmother grew up on a farm in Ireland.",
            "The flight was cancelled because of fog.", "Add the onions and cook until golden brown.",
            "ok", "yes please", "Why is the sky blue?", "The defendant pleaded not guilty to all charges.",
            "Saturn has more than eighty known moons.", "Click the button below to confirm your subscription.",
            "He scored twice in the second half.", "La réunion commence à dix heures.", "我喜欢喝绿茶。",
            "SELECT name FROM users WHERE age > 30;",
            "The bridge was closed for repairs after the storm damaged its supports.",
            "Economists expect inflation to ease slowly over the next two years, although energy prices remain "
            "volatile and wage growth is still strong in several sectors of the economy.", "Happy birthday!", "404")
"""Sentences that are neither golden nor AWQ calibration texts: a check that AWQ was not fitted to the golden set."""


def cosines() -> None:
    """Cosine of each quantized encoder's embeddings against the f32 encoder's: golden and held-out sentences."""
    sets = {"golden": golden_sentences(), "held-out": list(HELD_OUT)}
    f32 = load("f32")
    want = {name: f32.embed(texts) for name, texts in sets.items()}
    for q in QUANTS[1:]:
        enc = load(q)
        for name, texts in sets.items():
            cos = (enc.embed(texts) * want[name]).sum(1)
            detail = f"  ({' '.join(f'{c:.4f}' for c in cos)})" if name == "golden" else ""
            print(f"cosine vs f32 on the {len(texts)} {name} sentences, {q}: min {cos.min():.5f}, "
                  f"mean {cos.mean():.5f}{detail}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1", help="thread counts, one worker process each")
    ap.add_argument("--shapes", default="golden",
                    help="batch x seq shapes to time, or 'golden': batch 1 at each golden sentence's token count")
    ap.add_argument("--rounds", type=int, default=20, help="timed calls per encoder and shape")
    ap.add_argument("--profile", default="", help="shapes to profile thunk by thunk, e.g. 1x16,1x128")
    ap.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    print(f"machine: {common.cpu_model()} ({common.cpu_name()}), {common.cores()}, load {common.load_average()}")
    cosines()
    for n in (int(t) for t in args.threads.split(",")):
        cmd = [sys.executable, __file__, "--worker", str(n), "--shapes", args.shapes, "--rounds", str(args.rounds),
               "--profile", args.profile]
        subprocess.run(cmd, check=True)
    print(f"load at the end {common.load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
