"""MiniLM through the graph front-end against the hand-built schedule: same process, same inputs,
interleaved rounds, one thread; prints both medians and their ratio (the bar: within 3 %), plus the
graph plan's figures (planned bytes against the peak of live bytes and the unshared sum).

    cd /work/main && PYTHONPATH=. python benchmarks/bench_graph_minilm.py [--batch 1,8] [--seq 16,128]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.pin_threads(1)

import numpy as np  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from rlx_llvm.models import load_minilm  # noqa: E402
from rlx_llvm.models.bert_graph import encoder_graph  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--seq", default="16,128")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    rl.set_num_threads(1)
    common.limit_loaded_pools(1)
    enc = load_minilm()
    g = encoder_graph(enc.config, pooling=enc.pooling)
    cg = rl.Session().compile(g)
    for name in g.params:
        cg.set_param(name, enc.graph.params[name])
    print(f"# {common.cpu_model()} ({common.cpu_name()}), load {common.load_average()}, 1 thread")
    table = common.Table(["batch", "seq", "hand-built ms", "graph ms", "graph ÷ hand", "planned / peak", "planned / unshared"])
    rng = np.random.default_rng(0)
    for b in map(int, args.batch.split(",")):
        for s in map(int, args.seq.split(",")):
            ids = rng.integers(1000, 20000, (b, s)).astype(np.int64)
            mask = np.ones((b, s), np.float32)
            feeds = {"ids": ids, "type_ids": np.zeros_like(ids), "pos_ids": np.broadcast_to(np.arange(s), (b, s)).copy(),
                     "mask": mask}
            np.testing.assert_allclose(cg.run(feeds)[0], enc.embed_tokens(ids, mask), atol=1e-5)
            t = common.interleaved({"hand": lambda: enc.embed_tokens(ids, mask), "graph": lambda: cg.run(feeds)},
                                   rounds=args.rounds)
            p = cg.plan()
            table.add(b, s, common.fmt_ms(t["hand"].median), common.fmt_ms(t["graph"].median),
                       f"{t['graph'].median / t['hand'].median:.3f}",
                       f"{p.activation_bytes / p.activation_lower_bound:.3f}",
                       f"{p.activation_bytes / p.intermediate_bytes:.3f}")
    print(table)


if __name__ == "__main__":
    main()
