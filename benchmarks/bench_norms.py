"""Norms, softmax, reductions and selection: rlx-llvm against NumPy, numba, JAX, PyTorch and ONNX
Runtime, at 1 and 2 threads, with copy bandwidth as the ceiling — one run, one table.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_norms.py [--rounds 15] [--threads 1,2]

Kernels: LayerNorm, RmsNorm and FusedResidualLN [8192, 768]; Softmax, Reduce-sum (last axis) and
TopK(k=8) [8192, 1024].  Each thread count runs in its own worker process (thread pools — OpenMP,
XLA, OpenBLAS, numba — read their size when they load), which pins every peer to that many
threads, checks every implementation against a float64 NumPy reference, times them interleaved
(rounds rotate the order) and measures the copy ceiling (`np.copyto` of the same number of bytes
moved; at 2 threads also two threads each copying half).  The parent prints medians, % of copy
bandwidth and the ratio to the fastest peer.  rlx-llvm must pass its correctness check or the
run exits 1.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

ROWS, H, COLS, K, EPS = 8192, 768, 1024, 8, 1e-5
TOL = 1e-4  # |Δ| / (1 + |ref|) every implementation must meet


# ──────────────────────────────────────────────────────────────── worker (one thread count) ──

def worker(threads: int, rounds: int) -> dict:
    """Build, check and time every kernel × implementation at `threads` threads."""
    common.pin_threads(threads)
    os.environ["XLA_FLAGS"] = (f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} "
                               f"intra_op_parallelism_threads={threads}")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP workers must not steal the 2nd core
    import numpy as np
    data = make_data(np)
    cases = [layer_norm_case(np, data), rms_norm_case(np, data), softmax_case(np, data),
             fused_residual_case(np, data), reduce_sum_case(np, data), top_k_case(np, data)]
    peers = Peers(threads)
    for case in cases:
        peers.add_all(case, data)
    common.limit_loaded_pools(threads)
    out = {"threads": threads, "cases": {}, "skipped": peers.missing}
    for case in cases:
        errors = {name: case.check(np, impl) for name, impl in case.impls.items()}
        if errors["rlx-llvm"] > TOL:
            raise SystemExit(f"rlx-llvm {case.name}: error {errors['rlx-llvm']:.2e} > {TOL}")
        fns = {name: impl[0] for name, impl in case.impls.items() if errors[name] <= TOL}
        fns.update(copy_fns(np, case.moved, threads))
        t = common.interleaved(fns, rounds=rounds, warmup=2)
        out["cases"][case.name] = {"moved": case.moved, "ms": {k: v.median for k, v in t.items()},
                                   "failed": {k: e for k, e in errors.items() if e > TOL}}
    return out


def make_data(np):
    rng = np.random.default_rng(2024)
    f = lambda *shape, s=1.0: (rng.standard_normal(shape) * s).astype(np.float32)  # noqa: E731
    return {"x": f(ROWS, H), "res": f(ROWS, H), "bias": f(H, s=0.1), "g": f(H), "b": f(H), "s": f(ROWS, COLS, s=3.0)}


class Case:
    """One kernel: bytes moved, float64 reference, implementations {name: (run, output getter)}."""

    def __init__(self, name: str, moved: int, ref, exact: bool = False) -> None:
        self.name, self.moved, self.ref, self.exact = name, moved, ref, exact
        self.impls: dict[str, tuple] = {}
        self.inputs: tuple = ()  # the input arrays every peer reads (views of rlx's arena where possible)

    def add(self, name: str, run, output) -> None:
        self.impls[name] = (run, output)

    def check(self, np, impl) -> float:
        """Max |Δ|/(1+|ref|) of one fresh run (indices: fraction of rows that differ)."""
        run, output = impl
        run()
        got = np.asarray(output())
        if self.exact:
            return float(np.mean(np.any(got.reshape(self.ref.shape) != self.ref, axis=-1)))
        got = got.astype(np.float64).reshape(self.ref.shape)
        return float(np.max(np.abs(got - self.ref) / (1.0 + np.abs(self.ref))))


def rlx_program(thunk, arena_bytes: int):
    """Compile one thunk (importing our families explicitly) and return (program, arena)."""
    import importlib
    import rlx_llvm as rl
    for fam in ("norms", "reductions", "losses"):
        importlib.import_module(f"rlx_llvm.ir_emit.{fam}")
    prog = rl.compile(rl.ThunkSchedule([thunk], arena_bytes=arena_bytes), cache=False)
    return prog, rl.Arena(arena_bytes)


def set_rlx_threads(n: int) -> None:
    import rlx_llvm as rl
    setter = getattr(rl, "set_num_threads", None)
    if setter is None:
        from rlx_llvm.ir_emit import parallel
        setter = parallel.set_threads
    setter(n)


def ln_ref(np, v, g, b, center: bool):
    v = v.astype(np.float64)
    if center:
        mu = v.mean(-1, keepdims=True)
        y = (v - mu) / np.sqrt((v * v).mean(-1, keepdims=True) - mu * mu + EPS)
    else:
        y = v / np.sqrt((v * v).mean(-1, keepdims=True) + EPS)
    return y * g + b


def _norm_case(np, data, name: str, kind: str, center: bool):
    from rlx_llvm import thunks as T
    x, g, b = data["x"], data["g"], data["b"]
    n = x.nbytes
    case = Case(name, 2 * n + 2 * g.nbytes, ln_ref(np, x, g, b, center))
    prog, arena = rlx_program(getattr(T, kind)(src=0, g=n, b=n + 4096, dst=n + 8192, rows=ROWS, h=H, eps=EPS),
                              2 * n + 8192)
    arena.view(0, "f32", (ROWS, H))[:] = x
    arena.view(n, "f32", H)[:] = g
    arena.view(n + 4096, "f32", H)[:] = b
    case.add("rlx-llvm", lambda: prog.run(arena), lambda: arena.view(n + 8192, "f32", (ROWS, H)))
    case.inputs = (arena.view(0, "f32", (ROWS, H)), g, b)
    return case


def layer_norm_case(np, data):
    return _norm_case(np, data, "LayerNorm [8192, 768]", "LayerNorm", True)


def rms_norm_case(np, data):
    return _norm_case(np, data, "RmsNorm [8192, 768]", "RmsNorm", False)


def fused_residual_case(np, data):
    from rlx_llvm import thunks as T
    x, res, bias, g, b = data["x"], data["res"], data["bias"], data["g"], data["b"]
    n = x.nbytes
    v = ((x + res) + bias).astype(np.float32)
    case = Case("FusedResidualLN [8192, 768]", 3 * n + 3 * g.nbytes, ln_ref(np, v, g, b, True))
    offs = dict(x=0, res=n, bias=2 * n, g=2 * n + 4096, b=2 * n + 8192, out=2 * n + 12288)
    prog, arena = rlx_program(T.FusedResidualLN(**offs, rows=ROWS, h=H, eps=EPS, has_bias=True), 3 * n + 12288)
    for key, arr in (("x", x), ("res", res), ("bias", bias), ("g", g), ("b", b)):
        arena.view(offs[key], "f32", arr.shape)[:] = arr
    case.add("rlx-llvm", lambda: prog.run(arena), lambda: arena.view(offs["out"], "f32", (ROWS, H)))
    case.inputs = tuple(arena.view(offs[k], "f32", a.shape) for k, a in (("x", x), ("res", res), ("bias", bias),
                                                                        ("g", g), ("b", b)))
    return case


def softmax_case(np, data):
    from rlx_llvm import thunks as T
    s = data["s"]
    x64 = s.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    case = Case("Softmax [8192, 1024]", 2 * s.nbytes, e / e.sum(-1, keepdims=True))
    prog, arena = rlx_program(T.Softmax(data=0, rows=ROWS, cols=COLS, inner=1), s.nbytes)
    view = arena.view(0, "f32", (ROWS, COLS))
    view[:] = s  # in place: the check is the first run; the timed runs re-normalize the same buffer
    case.add("rlx-llvm", lambda: prog.run(arena), lambda: view)
    case.inputs = (s,)
    return case


def reduce_sum_case(np, data):
    from rlx_llvm import thunks as T
    from rlx_llvm.ops import ReduceOp
    s = data["s"]
    case = Case("Reduce-sum [8192, 1024] → [8192]", s.nbytes + 4 * ROWS, s.astype(np.float64).sum(-1))
    prog, arena = rlx_program(T.Reduce(src=0, dst=s.nbytes, outer=ROWS, reduced=COLS, inner=1, op=ReduceOp.Sum),
                              s.nbytes + 4 * ROWS)
    arena.view(0, "f32", s.shape)[:] = s
    case.add("rlx-llvm", lambda: prog.run(arena), lambda: arena.view(s.nbytes, "f32", ROWS))
    case.inputs = (arena.view(0, "f32", s.shape),)
    return case


def top_k_case(np, data):
    from rlx_llvm import thunks as T
    s = data["s"]
    ref = np.argsort(-s, axis=-1, kind="stable")[:, :K]
    case = Case("TopK k=8 [8192, 1024]", s.nbytes + 8 * ROWS * K, ref, exact=True)
    prog, arena = rlx_program(T.TopK(src=0, dst=s.nbytes, outer=ROWS, axis_dim=COLS, k=K, indices_i64=1),
                              s.nbytes + 8 * ROWS * K)
    arena.view(0, "f32", s.shape)[:] = s
    case.add("rlx-llvm", lambda: prog.run(arena), lambda: arena.view(s.nbytes, "i64", (ROWS, K)))
    case.inputs = (arena.view(0, "f32", s.shape),)
    return case


def copy_fns(np, moved: int, threads: int) -> dict:
    """The ceiling: copy moved/2 bytes (a copy reads M and writes M); at ≥ 2 threads also split."""
    src = np.ones(moved // 2 // 8, dtype=np.float64)
    dst = np.empty_like(src)
    fns = {"copy (np.copyto)": lambda: np.copyto(dst, src)}
    if threads > 1:
        from concurrent.futures import ThreadPoolExecutor
        pool = ThreadPoolExecutor(threads)
        parts = np.array_split(np.arange(src.size), threads)
        bounds = [(p[0], p[-1] + 1) for p in parts]

        def split_copy():
            list(pool.map(lambda be: np.copyto(dst[be[0]:be[1]], src[be[0]:be[1]]), bounds))
        fns[f"copy ({threads} threads)"] = split_copy
    return fns


# ──────────────────────────────────────────────────────────────────────────────── peers ──

class Peers:
    """Every peer implementation of every case, at one thread count."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.missing: dict[str, str] = {}
        set_rlx_threads(threads)
        self.torch = self._load("torch")
        self.numba = self._load("numba")
        self.jax = self._load("jax")
        self.ort = self._load("onnxruntime")
        self.onnx = self._load("onnx")
        if self.torch is not None:
            self.torch.set_num_threads(threads)
        if self.jax is not None:
            self.jax.config.update("jax_platforms", "cpu")

    def _load(self, name: str):
        try:
            return __import__(name)
        except Exception as exc:  # noqa: BLE001 - a broken install counts as missing
            self.missing[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:100]
            return None

    def add_all(self, case: Case, data) -> None:
        import numpy as np
        kind = case.name.split()[0]
        for peer in ("numpy", "numba", "jax", "torch", "ort"):
            if peer != "numpy" and getattr(self, peer) is None:
                continue
            try:
                getattr(self, f"{peer}_impl")(np, kind, case)
            except Exception as exc:  # noqa: BLE001 - report a peer that cannot run this kernel
                self.missing[f"{peer} {kind}"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:120]

    # NumPy: natural expressions (temporaries allocated per call; NumPy is single-threaded here)
    def numpy_impl(self, np, kind: str, case: Case) -> None:
        box = {}
        if kind in ("LayerNorm", "RmsNorm", "FusedResidualLN"):
            xs = case.inputs
            center = kind != "RmsNorm"

            def run():
                v = xs[0] + xs[1] + xs[2] if kind == "FusedResidualLN" else xs[0]
                g, b = xs[-2:] if kind == "FusedResidualLN" else xs[1:]
                if center:
                    mu = v.mean(-1, keepdims=True)
                    c = v - mu
                    box["y"] = c / np.sqrt((c * c).mean(-1, keepdims=True) + np.float32(EPS)) * g + b
                else:
                    box["y"] = v / np.sqrt((v * v).mean(-1, keepdims=True) + np.float32(EPS)) * g + b
        elif kind == "Softmax":
            x = case.inputs[0]

            def run():
                e = np.exp(x - x.max(-1, keepdims=True))
                box["y"] = e / e.sum(-1, keepdims=True)
        elif kind == "Reduce-sum":
            def run():
                box["y"] = case.inputs[0].sum(-1)
        else:
            def run():
                x = case.inputs[0]
                part = np.argpartition(-x, K, axis=-1)[:, :K]
                order = np.argsort(-np.take_along_axis(x, part, -1), axis=-1, kind="stable")
                box["y"] = np.take_along_axis(part, order, -1)
        case.add("NumPy", run, lambda: box["y"])

    def numba_impl(self, np, kind: str, case: Case) -> None:
        fn = numba_kernels(self.numba).get(kind)
        if fn is None:
            return
        self.numba.set_num_threads(self.threads)
        out = np.empty(case.ref.shape, dtype=np.int64 if case.exact else np.float32)
        args = case.inputs
        case.add("numba (prange, fastmath)", lambda: fn(*args, out), lambda: out)

    def jax_impl(self, np, kind: str, case: Case) -> None:
        import jax
        import jax.numpy as jnp

        def norm(v, g, b, center):
            if center:
                mu = jnp.mean(v, -1, keepdims=True)
                c = v - mu
                return c * jax.lax.rsqrt(jnp.mean(c * c, -1, keepdims=True) + EPS) * g + b
            return v * jax.lax.rsqrt(jnp.mean(v * v, -1, keepdims=True) + EPS) * g + b
        f = {"LayerNorm": lambda x, g, b: norm(x, g, b, True), "RmsNorm": lambda x, g, b: norm(x, g, b, False),
             "FusedResidualLN": lambda x, r, bi, g, b: norm(x + r + bi, g, b, True),
             "Softmax": lambda x: jax.nn.softmax(x, axis=-1), "Reduce-sum": lambda x: jnp.sum(x, -1),
             "TopK": lambda x: jax.lax.top_k(x, K)[1]}[kind]
        jf = jax.jit(f)
        args = [jax.device_put(np.asarray(a)) for a in case.inputs]
        box = {}
        case.add("JAX jit", lambda: box.__setitem__("y", jf(*args).block_until_ready()), lambda: np.asarray(box["y"]))

    def torch_impl(self, np, kind: str, case: Case) -> None:
        torch = self.torch
        F = torch.nn.functional
        t = [torch.from_numpy(np.asarray(a)) for a in case.inputs]
        box = {}
        if kind == "LayerNorm":
            f = lambda: F.layer_norm(t[0], (H,), t[1], t[2], EPS)  # noqa: E731
        elif kind == "RmsNorm":
            f = lambda: torch.add(F.rms_norm(t[0], (H,), t[1], EPS), t[2])  # noqa: E731
        elif kind == "FusedResidualLN":
            f = lambda: F.layer_norm(t[0] + t[1] + t[2], (H,), t[3], t[4], EPS)  # noqa: E731
        elif kind == "Softmax":
            f = lambda: torch.softmax(t[0], -1)  # noqa: E731
        elif kind == "Reduce-sum":
            f = lambda: t[0].sum(-1)  # noqa: E731
        else:
            f = lambda: torch.topk(t[0], K, dim=-1).indices  # noqa: E731
        with torch.inference_mode():
            case.add(f"PyTorch {torch.__version__.split('+')[0]}", lambda: box.__setitem__("y", f()),
                     lambda: box["y"].numpy())

    def ort_impl(self, np, kind: str, case: Case) -> None:
        model, names = onnx_model(self.onnx, kind)
        ort = self.ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        feeds = {n: np.ascontiguousarray(a) for n, a in zip(names, case.inputs)}
        if kind == "TopK":
            feeds["K"] = np.array([K], dtype=np.int64)
        if kind == "Reduce-sum":
            feeds["axes"] = np.array([-1], dtype=np.int64)
        out = np.empty(case.ref.shape, dtype=np.int64 if case.exact else np.float32)
        io = sess.io_binding()
        keep = [ort.OrtValue.ortvalue_from_numpy(v) for v in feeds.values()]
        for name, v in zip(feeds, keep):
            io.bind_ortvalue_input(name, v)
        if kind == "TopK":
            vals = np.empty(case.ref.shape, dtype=np.float32)
            keep.append(ort.OrtValue.ortvalue_from_numpy(vals))
            io.bind_ortvalue_output("V", keep[-1])
            keep.append(ort.OrtValue.ortvalue_from_numpy(out))
            io.bind_ortvalue_output("I", keep[-1])
        else:
            keep.append(ort.OrtValue.ortvalue_from_numpy(out))
            io.bind_ortvalue_output("Y", keep[-1])
        run = lambda: sess.run_with_iobinding(io)  # noqa: E731
        run._keep = keep
        label = "ONNX Runtime" + (" (RMSNormalization + Add)" if kind == "RmsNorm" else "")
        case.add(label, run, lambda: out)


def onnx_model(onnx, kind: str):
    """A (near) single-node opset-23 model of `kind` and its input names."""
    from onnx import TensorProto, helper
    f32 = TensorProto.FLOAT

    def vi(name, shape, ty=f32):
        return helper.make_tensor_value_info(name, ty, shape)
    rows_h, rows_c = [ROWS, H], [ROWS, COLS]
    opset = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    if kind == "LayerNorm":
        nodes = [helper.make_node("LayerNormalization", ["X", "G", "B"], ["Y"], axis=-1, epsilon=EPS)]
        ins, names = [vi("X", rows_h), vi("G", [H]), vi("B", [H])], ["X", "G", "B"]
    elif kind == "RmsNorm":
        nodes = [helper.make_node("RMSNormalization", ["X", "G"], ["N"], axis=-1, epsilon=EPS),
                 helper.make_node("Add", ["N", "B"], ["Y"])]
        ins, names = [vi("X", rows_h), vi("G", [H]), vi("B", [H])], ["X", "G", "B"]
    elif kind == "FusedResidualLN":
        nodes = [helper.make_node("SkipLayerNormalization", ["X", "R", "G", "B", "BI"], ["Y"], domain="com.microsoft",
                                  epsilon=EPS)]
        ins = [vi("X", rows_h), vi("R", rows_h), vi("BI", [H]), vi("G", [H]), vi("B", [H])]
        names = ["X", "R", "BI", "G", "B"]
    elif kind == "Softmax":
        nodes = [helper.make_node("Softmax", ["X"], ["Y"], axis=-1)]
        ins, names = [vi("X", rows_c)], ["X"]
    elif kind == "Reduce-sum":
        nodes = [helper.make_node("ReduceSum", ["X", "axes"], ["Y"], keepdims=0)]
        ins, names = [vi("X", rows_c), vi("axes", [1], TensorProto.INT64)], ["X"]
    else:
        nodes = [helper.make_node("TopK", ["X", "K"], ["V", "I"], axis=-1, largest=1, sorted=1)]
        ins, names = [vi("X", rows_c), vi("K", [1], TensorProto.INT64)], ["X"]
    outs = [vi("V", [ROWS, K]), vi("I", [ROWS, K], TensorProto.INT64)] if kind == "TopK" else \
        [vi("Y", [ROWS] if kind == "Reduce-sum" else (rows_c if kind == "Softmax" else rows_h))]
    model = helper.make_model(helper.make_graph(nodes, kind, ins, outs), opset_imports=opset)
    model.ir_version = 10
    return model, names


def numba_kernels(numba) -> dict:
    """numba versions: rows in `prange`, fastmath (its best shot), one pass for the statistics."""
    import math

    import numpy as np
    nj = numba.njit(parallel=True, fastmath=True, cache=False)

    @nj
    def layer_norm(x, g, b, out):
        for r in numba.prange(x.shape[0]):
            s = np.float32(0.0)
            s2 = np.float32(0.0)
            for j in range(x.shape[1]):
                s += x[r, j]
                s2 += x[r, j] * x[r, j]
            mu = s / x.shape[1]
            inv = np.float32(1.0) / math.sqrt(s2 / x.shape[1] - mu * mu + np.float32(EPS))
            for j in range(x.shape[1]):
                out[r, j] = (x[r, j] - mu) * inv * g[j] + b[j]

    @nj
    def rms_norm(x, g, b, out):
        for r in numba.prange(x.shape[0]):
            s2 = np.float32(0.0)
            for j in range(x.shape[1]):
                s2 += x[r, j] * x[r, j]
            inv = np.float32(1.0) / math.sqrt(s2 / x.shape[1] + np.float32(EPS))
            for j in range(x.shape[1]):
                out[r, j] = x[r, j] * inv * g[j] + b[j]

    @nj
    def fused(x, res, bias, g, b, out):
        for r in numba.prange(x.shape[0]):
            s = np.float32(0.0)
            s2 = np.float32(0.0)
            for j in range(x.shape[1]):
                v = x[r, j] + res[r, j] + bias[j]
                s += v
                s2 += v * v
            mu = s / x.shape[1]
            inv = np.float32(1.0) / math.sqrt(s2 / x.shape[1] - mu * mu + np.float32(EPS))
            for j in range(x.shape[1]):
                out[r, j] = (x[r, j] + res[r, j] + bias[j] - mu) * inv * g[j] + b[j]

    @nj
    def softmax(x, out):
        for r in numba.prange(x.shape[0]):
            m = x[r, 0]
            for j in range(x.shape[1]):
                m = max(m, x[r, j])
            s = np.float32(0.0)
            for j in range(x.shape[1]):
                e = math.exp(x[r, j] - m)
                out[r, j] = e
                s += e
            inv = np.float32(1.0) / s
            for j in range(x.shape[1]):
                out[r, j] *= inv

    @nj
    def reduce_sum(x, out):
        for r in numba.prange(x.shape[0]):
            s = np.float32(0.0)
            for j in range(x.shape[1]):
                s += x[r, j]
            out[r] = s

    @nj
    def top_k(x, out):
        k = out.shape[1]
        for r in numba.prange(x.shape[0]):
            vals = np.full(k, -np.inf, dtype=np.float32)
            idx = np.zeros(k, dtype=np.int64)
            for j in range(x.shape[1]):
                v = x[r, j]
                if v > vals[k - 1]:
                    p = k - 1
                    while p > 0 and vals[p - 1] < v:
                        vals[p] = vals[p - 1]
                        idx[p] = idx[p - 1]
                        p -= 1
                    vals[p] = v
                    idx[p] = j
            out[r, :] = idx
    return {"LayerNorm": layer_norm, "RmsNorm": rms_norm, "FusedResidualLN": fused, "Softmax": softmax,
            "Reduce-sum": reduce_sum, "TopK": top_k}


# ──────────────────────────────────────────────────────────────────────── parent / table ──

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.rounds)))
        return
    results = []
    for n in (int(v) for v in args.threads.split(",")):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                           os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", str(n), "--rounds",
                               str(args.rounds)], env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(proc.returncode)
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(render(results))


def render(results: list[dict]) -> str:
    """Kernel × implementation rows; per thread count: median ms, % of copy bandwidth, ×fastest peer."""
    cols = ["kernel", "implementation"]
    for r in results:
        t = r["threads"]
        cols += [f"{t}t ms", f"{t}t %copy", f"{t}t ×best peer"]
    table = common.Table(cols, left=("kernel", "implementation"),
                         title=f"rlx-llvm norms/softmax/reductions — {common.cpu_model()} ({common.cpu_name()}), "
                               f"{common.cores()}; median of interleaved rounds")
    for name in results[0]["cases"]:
        impls = list(dict.fromkeys(k for r in results for k in r["cases"][name]["ms"]))
        for impl in impls:
            row = [name, impl]
            for r in results:
                c = r["cases"][name]
                ms = c["ms"].get(impl, float("nan"))
                ceiling = min(v for k, v in c["ms"].items() if k.startswith("copy"))
                peers = [v for k, v in c["ms"].items() if not k.startswith("copy") and k != "rlx-llvm"]
                row += [common.fmt_ms(ms), f"{100 * ceiling / ms:.0f}%" if ms == ms else "-",
                        f"{min(peers) / ms:.2f}" if peers and ms == ms else "-"]
            table.add(*row)
        table.rule()
    for r in results:
        for name, c in r["cases"].items():
            for impl, err in c["failed"].items():
                table.note(f"{r['threads']}t {name}: {impl} failed the correctness check (error {err:.2e}), not timed")
        for what, why in r["skipped"].items():
            table.note(f"{r['threads']}t skipped {what}: {why}")
    table.note("%copy = the copy ceiling's time for the same bytes moved ÷ this time; ×best peer = fastest "
               "non-rlx implementation's time ÷ this time (>1: faster than every peer).")
    return table.render()


if __name__ == "__main__":
    main()
