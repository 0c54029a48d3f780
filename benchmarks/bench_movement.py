"""Data movement and indexing: rlx-llvm against NumPy and PyTorch CPU, single thread, one run.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_movement.py [--rounds 15] [--budget 15]

Kernels (f32): Transpose [4096, 4096] (1, 0); a 4-D permutation [64, 128, 12, 64] → [64, 12, 128, 64];
Concat of 3 × [4096, 1024] on the last axis; Gather of 8192 rows of 768 from a [30522, 768] table;
ScatterAdd of the same shape (output zeroed first); plus Narrow (a column slice of [4096, 4096]) and
KvAppend (one token into 2048 cache rows) for the other contiguous-row kernels.  Each kernel is
timed next to its peers and next to the ceiling — `np.copyto` of half the bytes the kernel must
move (a copy of M bytes reads M and writes M) — in interleaved rounds.  Every output is checked
bit-exactly against NumPy before anything is timed; rlx-llvm must match or the run exits 1.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (sets the thread variables before NumPy loads)

common.pin_threads(1)

import numpy as np  # noqa: E402

MiB = 1 << 20


@dataclass
class Kernel:
    """One benchmarked kernel: implementations (run, output) and the bytes it must move."""

    name: str
    shape: str
    moved: int
    expect: Callable[[], np.ndarray]
    impls: dict[str, tuple[Callable[[], object], Callable[[], np.ndarray] | None]] = field(default_factory=dict)

    def add(self, impl: str, run: Callable[[], object], output: Callable[[], np.ndarray] | None) -> None:
        self.impls[impl] = (run, output)

    def add_copy(self) -> None:
        """The ceiling: np.copyto of moved/2 bytes between preallocated buffers."""
        n = self.moved // 2
        a, b = np.ones(n, np.uint8), np.empty(n, np.uint8)
        self.add(f"copy (np.copyto) {n / MiB:.0f} MiB", lambda: np.copyto(b, a), None)


class Peers:
    """PyTorch, if installed, limited to one thread."""

    def __init__(self) -> None:
        self.versions = {"numpy": np.__version__}
        try:
            import torch
        except Exception as e:  # noqa: BLE001 - a broken install counts as missing
            self.torch, self.missing = None, f"torch not importable ({type(e).__name__})"
        else:
            torch.set_num_threads(1)
            try:
                torch.set_num_interop_threads(1)
            except RuntimeError:
                pass
            self.torch, self.missing = torch, ""
            self.versions["torch"] = torch.__version__
        import llvmlite
        self.versions["llvmlite"] = llvmlite.__version__
        self.pools = common.limit_loaded_pools(1)


class Arena:
    """One rlx arena per kernel, slots handed out 64-byte aligned."""

    def __init__(self) -> None:
        self.end = 0
        self.arena = None

    def slot(self, nbytes: int) -> int:
        off = self.end
        self.end = (off + nbytes + 4095) // 4096 * 4096
        return off

    def allocate(self):
        import rlx_llvm as rl
        self.arena = rl.Arena(self.end)
        return self.arena


def program(thunks, arena: Arena):
    """Compile thunks over `arena` (no object cache: the compile time is reported)."""
    import rlx_llvm as rl
    import rlx_llvm.ir_emit.indexing  # noqa: F401  (until FAMILIES lists the modules)
    import rlx_llvm.ir_emit.movement  # noqa: F401
    t0 = time.perf_counter()
    prog = rl.compile(rl.ThunkSchedule(thunks, arena_bytes=arena.end), cache=False)
    return prog, (time.perf_counter() - t0) * 1e3


COMPILE_MS: dict[str, float] = {}


def with_rlx(kernel: Kernel, thunk, arena: Arena, out: Callable[[], np.ndarray]):
    """Compile `thunk` over `arena` and add it as the kernel's rlx-llvm implementation."""
    prog, ms = program([thunk], arena)
    COMPILE_MS[kernel.name] = ms
    kernel.add("rlx-llvm", lambda: prog.run(arena.arena), out)
    return prog


def transpose_2d(peers: Peers, rng) -> Kernel:
    from rlx_llvm import thunks as T
    n = 4096
    ar = Arena()
    src, dst = ar.slot(4 * n * n), ar.slot(4 * n * n)
    a = ar.allocate()
    x = a.view(src, "f32", (n, n))
    x[...] = rng.standard_normal((n, n), dtype=np.float32)
    k = Kernel("transpose", "[4096, 4096] (1, 0)", 2 * 4 * n * n, lambda: x.T)
    with_rlx(k, T.Transpose(src=src, dst=dst, in_total=n * n, out_dims=(n, n), in_strides=(1, n), elem_bytes=4), ar,
             lambda: a.view(dst, "f32", (n, n)))
    k.add("NumPy transpose().copy()", lambda: np.transpose(x).copy(), lambda: np.transpose(x).copy())
    if peers.torch is not None:
        tx = peers.torch.from_numpy(x)
        k.add("PyTorch .t().contiguous()", lambda: tx.t().contiguous(), lambda: tx.t().contiguous().numpy())
    return k


def transpose_4d(peers: Peers, rng) -> Kernel:
    from rlx_llvm import thunks as T
    shape, perm = (64, 128, 12, 64), (0, 2, 1, 3)
    count = int(np.prod(shape))
    strides = [int(np.prod(shape[d + 1:])) for d in range(4)]
    ar = Arena()
    src, dst = ar.slot(4 * count), ar.slot(4 * count)
    a = ar.allocate()
    x4 = a.view(src, "f32", shape)
    x4[...] = rng.standard_normal(shape, dtype=np.float32)
    out_shape = tuple(shape[p] for p in perm)
    k = Kernel("transpose 4-D", "[64,128,12,64] → [64,12,128,64]", 2 * 4 * count, lambda: np.transpose(x4, perm))
    with_rlx(k, T.Transpose(src=src, dst=dst, in_total=count, out_dims=out_shape,
                            in_strides=tuple(strides[p] for p in perm), elem_bytes=4), ar,
             lambda: a.view(dst, "f32", out_shape))
    k.add("NumPy transpose().copy()", lambda: np.transpose(x4, perm).copy(), lambda: np.transpose(x4, perm).copy())
    if peers.torch is not None:
        t4 = peers.torch.from_numpy(x4)
        k.add("PyTorch .permute().contiguous()", lambda: t4.permute(*perm).contiguous(),
              lambda: t4.permute(*perm).contiguous().numpy())
    return k


def concat(peers: Peers, rng) -> Kernel:
    from rlx_llvm import thunks as T
    rows, cols = 4096, 1024
    ar = Arena()
    srcs = [ar.slot(4 * rows * cols) for _ in range(3)]
    dst = ar.slot(4 * rows * 3 * cols)
    a = ar.allocate()
    xs = [a.view(o, "f32", (rows, cols)) for o in srcs]
    for v in xs:
        v[...] = rng.standard_normal((rows, cols), dtype=np.float32)
    k = Kernel("concat", "3 × [4096, 1024], axis -1", 2 * 4 * 3 * rows * cols, lambda: np.concatenate(xs, axis=1))
    with_rlx(k, T.Concat(dst=dst, outer=rows, inner=1, total_axis=3 * cols,
                         inputs=tuple((o, cols, rows * cols) for o in srcs)), ar,
             lambda: a.view(dst, "f32", (rows, 3 * cols)))
    o_np = np.empty((rows, 3 * cols), np.float32)
    k.add("NumPy concatenate(out=)", lambda: np.concatenate(xs, axis=1, out=o_np), lambda: o_np)
    k.add("NumPy concatenate", lambda: np.concatenate(xs, axis=1), lambda: np.concatenate(xs, axis=1))
    if peers.torch is not None:
        torch = peers.torch
        txs = [torch.from_numpy(v) for v in xs]
        o_t = torch.empty((rows, 3 * cols))
        k.add("PyTorch cat(out=)", lambda: torch.cat(txs, 1, out=o_t), lambda: o_t.numpy())
    return k


VOCAB, DIM, N_IDX = 30522, 768, 8192


def gather_and_scatter_add(peers: Peers, rng) -> list[Kernel]:
    from rlx_llvm import thunks as T
    ids = rng.integers(0, VOCAB, N_IDX)
    ar = Arena()
    table, idx, rows, out = (ar.slot(4 * VOCAB * DIM), ar.slot(4 * N_IDX), ar.slot(4 * N_IDX * DIM),
                             ar.slot(4 * VOCAB * DIM))
    a = ar.allocate()
    tbl = a.view(table, "f32", (VOCAB, DIM))
    tbl[...] = rng.standard_normal((VOCAB, DIM), dtype=np.float32)
    a.view(idx, "f32", N_IDX)[...] = ids  # RLX ids are f32
    g = Kernel("gather", "8192 rows × 768 of [30522, 768]", 2 * 4 * N_IDX * DIM + 4 * N_IDX, lambda: tbl[ids])
    gather = with_rlx(g, T.Gather(table=table, table_len=VOCAB * DIM, idx=idx, dst=rows, num_idx=N_IDX, trailing=DIM,
                                  idx_i64=0, table_bytes=4), ar, lambda: a.view(rows, "f32", (N_IDX, DIM)))
    o_take = np.empty((N_IDX, DIM), np.float32)
    g.add("NumPy take(out=)", lambda: np.take(tbl, ids, axis=0, out=o_take), lambda: o_take)
    if peers.torch is not None:
        torch = peers.torch
        tt, ti = torch.from_numpy(tbl), torch.from_numpy(ids)
        o_sel = torch.empty((N_IDX, DIM))
        g.add("PyTorch index_select(out=)", lambda: torch.index_select(tt, 0, ti, out=o_sel), lambda: o_sel.numpy())

    gather.run(a)  # ScatterAdd's updates are the gathered rows (the same bytes every time Gather reruns)
    updates = a.view(rows, "f32", (N_IDX, DIM)).copy()
    s = Kernel("scatter_add", "8192 × 768 into [30522, 768]", 4 * VOCAB * DIM + 3 * 4 * N_IDX * DIM,
               lambda: scatter_add_reference(ids, updates))
    with_rlx(s, T.ScatterAdd(updates=rows, indices=idx, dst=out, num_updates=N_IDX, out_dim=VOCAB, trailing=DIM), ar,
             lambda: a.view(out, "f32", (VOCAB, DIM)))
    o_at = np.zeros((VOCAB, DIM), np.float32)

    def np_add_at():
        o_at.fill(0)
        np.add.at(o_at, ids, updates)
    s.add("NumPy fill(0) + add.at", np_add_at, lambda: o_at)
    if peers.torch is not None:
        tu, ti = peers.torch.from_numpy(updates), peers.torch.from_numpy(ids)
        o_ia = peers.torch.zeros((VOCAB, DIM))

        def torch_index_add():
            o_ia.zero_()
            o_ia.index_add_(0, ti, tu)
        s.add("PyTorch zero_() + index_add_", torch_index_add, lambda: o_ia.numpy())
    return [g, s]


def narrow(peers: Peers, rng) -> Kernel:
    from rlx_llvm import thunks as T
    n = 4096
    ar = Arena()
    src, dst = ar.slot(4 * n * n), ar.slot(4 * n * n // 2)
    a = ar.allocate()
    xn = a.view(src, "f32", (n, n))
    xn[...] = rng.standard_normal((n, n), dtype=np.float32)
    k = Kernel("narrow", "[4096, 4096][:, 1024:3072]", 2 * 4 * n * n // 2, lambda: xn[:, 1024:3072])
    with_rlx(k, T.Narrow(src=src + 4 * 1024, dst=dst, outer=n, src_stride=n, dst_stride=n // 2, inner=n // 2,
                         elem_bytes=4), ar, lambda: a.view(dst, "f32", (n, n // 2)))
    o_nr = np.empty((n, n // 2), np.float32)
    k.add("NumPy copyto(slice)", lambda: np.copyto(o_nr, xn[:, 1024:3072]), lambda: o_nr)
    if peers.torch is not None:
        tn = peers.torch.from_numpy(xn)
        o_tn = peers.torch.empty((n, n // 2))
        k.add("PyTorch copy_(slice)", lambda: o_tn.copy_(tn[:, 1024:3072]), lambda: o_tn.numpy())
    return k


def kv_append(peers: Peers, rng) -> Kernel:
    from rlx_llvm import thunks as T
    heads, cap, pos, row = 2048, 8, 5, 8192
    ar = Arena()
    src, dst = ar.slot(heads * row), ar.slot(heads * cap * row)
    a = ar.allocate()
    tok = a.view(src, "u1", (heads, row))
    tok[...] = rng.integers(0, 256, (heads, row), dtype=np.uint8)
    cache = a.view(dst, "u1", (heads, cap, row))
    k = Kernel("kv_append", "2048 rows × 8 KiB into a [2048, 8, 8 KiB] cache", 2 * heads * row, lambda: tok)
    with_rlx(k, T.KvAppend(src=src, dst=dst, outer=heads, seq_cap=cap, pos=pos, inner_bytes=row), ar,
             lambda: cache[:, pos])
    np_cache = np.zeros((heads, cap, row), np.uint8)

    def np_append():
        np_cache[:, pos] = tok
    k.add("NumPy cache[:, pos] = x", np_append, lambda: np_cache[:, pos])
    if peers.torch is not None:
        t_cache, t_tok = peers.torch.from_numpy(np_cache.copy()), peers.torch.from_numpy(tok)
        k.add("PyTorch cache[:, pos].copy_(x)", lambda: t_cache[:, pos].copy_(t_tok),
              lambda: t_cache[:, pos].numpy())
    return k


def build(peers: Peers, rng) -> tuple[list[Kernel], dict[str, float]]:
    """Every kernel with its implementations and its copy ceiling."""
    kernels = [transpose_2d(peers, rng), transpose_4d(peers, rng), concat(peers, rng),
               *gather_and_scatter_add(peers, rng), narrow(peers, rng), kv_append(peers, rng)]
    for k in kernels:
        k.add_copy()
    return kernels, COMPILE_MS


def scatter_add_reference(ids: np.ndarray, updates: np.ndarray) -> np.ndarray:
    """Sequential f32 accumulation in update order (np.add.at is unbuffered and in order)."""
    out = np.zeros((VOCAB, DIM), np.float32)
    np.add.at(out, ids, updates)
    return out


def check(kernels: list[Kernel]) -> bool:
    """Run every implementation once, compare bit-exactly with NumPy; True if rlx-llvm matched."""
    table = common.Table(["kernel", "implementation", "check", "verdict"], left={"kernel", "implementation", "check"},
                         title="Correctness (bit-exact against NumPy, each output computed once before timing)")
    ok = True
    for k in kernels:
        want = np.asarray(k.expect())
        for name, (run, output) in k.impls.items():
            if output is None:
                continue
            run()
            got = np.ascontiguousarray(output())
            diff = int(np.count_nonzero(got.reshape(-1).view(np.uint8) != np.ascontiguousarray(want).reshape(-1)
                                        .view(np.uint8))) if got.shape == want.shape else want.nbytes
            good = diff == 0
            ok &= good or name != "rlx-llvm"
            table.add(k.name, name, "bit-exact" if good else f"{diff} bytes differ",
                      ("PASS" if good else "FAIL") if name == "rlx-llvm" else ("ok" if good else "differs"))
        table.rule()
    table.rows.pop()
    print(table)
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15, help="timing rounds per kernel (default 15)")
    ap.add_argument("--budget", type=float, default=15.0, help="seconds of timing per kernel (default 15)")
    args = ap.parse_args(argv)
    peers = Peers()
    import rlx_llvm
    print("rlx-llvm data-movement benchmark — single thread, every peer in the same process")
    print(f"  date      {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"  CPU       {common.cpu_name()} (LLVM host name), {common.cpu_model()}")
    print(f"  ISA       {common.host_features()}")
    print(f"  cores     {common.cores()}; every implementation runs on 1 thread")
    print(f"  {common.python_facts()}")
    print("  versions  rlx_llvm " + rlx_llvm.__version__ + ", " + ", ".join(f"{k} {v}" for k, v in peers.versions.items()))
    if peers.missing:
        print(f"  missing   {peers.missing}")
    print(f"  load avg  {common.load_average()} at start (other processes share this machine)")
    kernels, compile_ms = build(peers, np.random.default_rng(0))
    print("  compile   rlx-llvm " + ", ".join(f"{k} {v:.0f} ms" for k, v in compile_ms.items()))
    print()
    if not check(kernels):
        print("rlx-llvm output does not match NumPy: not timing.")
        return 1
    print()
    cols = ["kernel", "implementation", "median ms", "p10-p90 ms", "GB/s", "% copy BW", "x rlx time"]
    table = common.Table(cols, left={"kernel", "implementation"},
                         title="Timing: interleaved rounds; GB/s = bytes the kernel must move / median; "
                               "% copy BW = that rate / the copy's rate in the same rounds")
    for k in kernels:
        times = common.interleaved({n: v[0] for n, v in k.impls.items()}, rounds=args.rounds, warmup=2,
                                   budget_s=args.budget, min_rounds=7)
        rlx = times["rlx-llvm"].median
        copy = next(t for n, t in times.items() if n.startswith("copy"))
        copy_gbps = common.gbps(k.moved, copy.median)
        for name, t in times.items():
            g = common.gbps(k.moved, t.median)
            table.add(k.name, name, common.fmt_ms(t.median), f"{common.fmt_ms(t.p10)}-{common.fmt_ms(t.p90)}",
                      f"{g:.1f}", f"{100 * g / copy_gbps:.0f} %", "1.00" if name == "rlx-llvm" else
                      f"{t.median / rlx:.2f}")
        table.rule()
    table.rows.pop()
    table.note("moved: transpose/concat/narrow/kv_append 2 × output; gather 2 × output + ids; scatter_add "
               "output (zeroed) + 3 × updates (read, and the touched rows read and written)")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
