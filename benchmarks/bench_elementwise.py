"""Element-wise kernels: rlx-llvm against NumPy, numexpr, numba, PyTorch and ONNX Runtime, single thread.

    cd /work/main && PYTHONPATH=. python benchmarks/bench_elementwise.py [--rounds 25] [--budget 20]

Four kernels over 16M f32 elements, each measured side by side in the same process, plus the
ceiling — a plain `np.copyto` of the same number of bytes:

1. gelu_tanh(x + bias), x [4096, 4096], bias [4096] tiled over the rows;
2. a 6-step chain of 4 inputs: relu(sigmoid(x*s + bias) * x + r), s a scalar, r a residual;
3. f32 → bf16 and 4. f32 → f16 casts.

Every implementation is checked against a float64 NumPy reference before it is timed; rlx-llvm
must pass (|Δ|/(1+|ref|) < 1e-5 for the float kernels, bit-exact for the casts) or the run exits 1.
See benchmarks/README.md for what each column means.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (must set the thread variables before NumPy loads)

common.pin_threads(1)

import numpy as np  # noqa: E402

ROWS = COLS = 4096
N = ROWS * COLS                      # 16M elements
GELU_K, GELU_A = 0.7978846, 0.044715
SCALE = 0.5                          # the chain's scalar input s
REL_TOL = 1e-5

F32 = np.float32


# ------------------------------------------------------------------------------------------ peers

class Peers:
    """Import each optional peer once; remember why one is missing."""

    def __init__(self) -> None:
        self.missing: dict[str, str] = {}
        self.versions: dict[str, str] = {"numpy": np.__version__}
        self.numexpr = self._load("numexpr")
        self.numba = self._load("numba")
        self.torch = self._load("torch")
        self.onnx = self._load("onnx")
        self.ort = self._load("onnxruntime")
        self.ml_dtypes = self._load("ml_dtypes")
        import llvmlite
        self.versions["llvmlite"] = llvmlite.__version__
        if self.numexpr is not None:
            self.numexpr.set_num_threads(1)
            self.versions["numexpr"] += f" (VML: {'yes' if self.numexpr.use_vml else 'no'})"
        if self.torch is not None:
            self.torch.set_num_threads(1)
            try:
                self.torch.set_num_interop_threads(1)
            except RuntimeError:
                pass
        if self.ort is None or self.onnx is None:
            self.ort = self.onnx = None
            self.missing.setdefault("onnxruntime", "needs onnx too, which is missing")
        self.pools = common.limit_loaded_pools(1)

    def _load(self, name: str):
        try:
            mod = __import__(name)
        except ImportError:
            self.missing[name] = "not installed"
            return None
        except Exception as e:  # noqa: BLE001 - a broken install counts as missing
            self.missing[name] = f"import failed ({type(e).__name__}: {e})".splitlines()[0][:80]
            return None
        self.versions[name] = str(getattr(mod, "__version__", "?"))
        return mod

    def ort_session(self, model):
        ort = self.ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])

    def ort_bound(self, sess, inputs: dict, outputs: dict):
        """A zero-copy IOBinding run: inputs and the preallocated outputs are NumPy buffers."""
        ort = self.ort
        io = sess.io_binding()
        keep = []
        for name, arr in inputs.items():
            v = ort.OrtValue.ortvalue_from_numpy(arr)
            keep.append(v)
            io.bind_ortvalue_input(name, v)
        for name, (arr, onnx_type) in outputs.items():
            # Wrap the preallocated NumPy buffer (bf16 as its uint16 bits) so ORT writes into it.
            v = (ort.OrtValue.ortvalue_from_numpy(arr) if onnx_type is None
                 else ort.OrtValue.ortvalue_from_numpy_with_onnx_type(arr, onnx_type))
            keep.append(v)
            io.bind_ortvalue_output(name, v)

        def run():
            sess.run_with_iobinding(io)
        run._keep = (keep, io)  # keep the OrtValues alive
        return run


def onnx_model(peers: Peers, nodes, inputs, outputs):
    from onnx import helper
    graph = helper.make_graph(nodes, "bench", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    return model


# ----------------------------------------------------------------------------------------- arena

class Layout:
    def __init__(self) -> None:
        self.top = 0

    def slot(self, nbytes: int) -> int:
        off = self.top
        self.top += -(-nbytes // 4096) * 4096
        return off


def make_data():
    rng = np.random.default_rng(2024)
    x = rng.standard_normal((ROWS, COLS), dtype=F32)
    bias = (rng.standard_normal(COLS, dtype=F32) * F32(0.1)).astype(F32)
    r = rng.standard_normal((ROWS, COLS), dtype=F32)
    # Cast source that is timed: activation-like N(0, 1) values, with exact rounding ties for bf16
    # and for f16 planted in the first 4096 elements.
    c = rng.standard_normal(N, dtype=F32)
    _plant_ties(c)
    # Cast source that is only checked: a wide exponent range (f16 overflow to inf, f16 subnormals
    # and underflow to 0), the same ties, ±0 and ±inf.  (NumPy's f16 cast is 10-20x slower on such
    # values, which is why they are not the timed data.)
    edge = (rng.standard_normal(N, dtype=F32) * np.exp2(rng.integers(-30, 20, N)).astype(F32)).astype(F32)
    _plant_ties(edge)
    edge[4096:4100] = [0.0, -0.0, np.inf, -np.inf]
    return x, bias, r, c, edge


def _plant_ties(c: np.ndarray) -> None:
    u = c.view(np.uint32)
    u[:2048] = (u[:2048] & 0xFFFF0000) | 0x8000          # halfway between two bf16 values
    u[2048:4096] = (u[2048:4096] & 0xFFFFE000) | 0x1000  # halfway between two f16 values (normal range)


def gelu_ref64(x, b):
    v = x.astype(np.float64) + b.astype(np.float64)
    return 0.5 * v * (1.0 + np.tanh(GELU_K * (v + GELU_A * v * v * v)))


def chain_ref64(x, s, b, r):
    x64 = x.astype(np.float64)
    s1 = x64 * float(s) + b.astype(np.float64)
    with np.errstate(over="ignore"):
        s2 = 1.0 / (1.0 + np.exp(-s1))
    return np.maximum(s2 * x64 + r, 0.0)


def bf16_ref(c, peers: Peers):
    if peers.ml_dtypes is not None:
        return c.astype(peers.ml_dtypes.bfloat16).view(np.uint16)
    from rlx_llvm.reference.halves import f32_to_bf16_bits
    return f32_to_bf16_bits(c)


def rel_err(got, ref) -> float:
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    ref = np.asarray(ref, dtype=np.float64).reshape(-1)
    return float(np.max(np.abs(got - ref) / (1.0 + np.abs(ref))))


# ---------------------------------------------------------------------------------------- cases

class Case:
    """One kernel: its bytes moved and {implementation: (run, output-getter)}."""

    def __init__(self, name: str, label: str, moved: int, exact: bool, ref) -> None:
        self.name, self.label, self.moved, self.exact, self.ref = name, label, moved, exact, ref
        self.datasets: list[tuple[str, object]] = [("timed", None)]  # (label, loader or None)
        self.impls: dict[str, tuple] = {}
        self.skipped: list[str] = []

    def add(self, impl: str, run, output) -> None:
        self.impls[impl] = (run, output)


def build_cases(peers: Peers, args):
    import rlx_llvm as rl
    from rlx_llvm import thunks as T
    from rlx_llvm.ops import Activation, BinaryOp, ChainOperand as In, ChainStep as S

    x, bias, r, c, edge = make_data()
    lay = Layout()
    X, R, B, SC = lay.slot(4 * N), lay.slot(4 * N), lay.slot(4 * COLS), lay.slot(64)
    C = lay.slot(4 * N)
    OG, OC, OBF, OF16 = lay.slot(4 * N), lay.slot(4 * N), lay.slot(2 * N), lay.slot(2 * N)
    arena = rl.Arena(lay.top)
    arena.write(X, x)
    arena.write(R, r)
    arena.write(B, bias)
    arena.write(SC, np.float32([SCALE]))
    arena.write(C, c)
    c_timed = c
    # The peers read the very same (64-byte aligned) arena memory as rlx-llvm.
    x = arena.view(X, "f32", (ROWS, COLS))
    r = arena.view(R, "f32", (ROWS, COLS))
    b = arena.view(B, "f32", COLS)
    c = arena.view(C, "f32", N)
    s = F32(SCALE)

    Inp, Stp = In.Input, In.Step
    thunks = {
        "gelu": T.ElementwiseRegion(dst=OG, len=N, input_offs=(X, B),
                                    chain=(S.Binary(BinaryOp.Add, Inp(0), Inp(1)),
                                           S.Activation(Activation.Gelu, Stp(0))),
                                    input_modulus=(0, COLS)),
        "chain": T.ElementwiseRegion(dst=OC, len=N, input_offs=(X, SC, B, R), scalar_input_mask=0b0010,
                                     input_modulus=(0, 0, COLS, 0),
                                     chain=(S.Binary(BinaryOp.Mul, Inp(0), Inp(1)),
                                            S.Binary(BinaryOp.Add, Stp(0), Inp(2)),
                                            S.Activation(Activation.Sigmoid, Stp(1)),
                                            S.Binary(BinaryOp.Mul, Stp(2), Inp(0)),
                                            S.Binary(BinaryOp.Add, Stp(3), Inp(3)),
                                            S.Activation(Activation.Relu, Stp(4)))),
        "bf16": T.CastF32ToBf16(src=C, dst=OBF, len=N),
        "f16": T.CastF32ToF16(src=C, dst=OF16, len=N),
    }
    progs, compile_ms = {}, {}
    for k, t in thunks.items():
        t0 = time.perf_counter()
        progs[k] = rl.compile(rl.ThunkSchedule([t], arena_bytes=arena.nbytes))
        compile_ms[k] = (time.perf_counter() - t0) * 1e3
        if getattr(progs[k].report(), "from_cache", False):
            compile_ms[k] = -compile_ms[k]  # negative: the object came from rlx-llvm's on-disk cache

    def run_prog(p):
        return lambda: p.run(arena)

    # Bytes each kernel must move: every input read once, the output written once.
    gelu = Case("gelu", "gelu_tanh(x + bias)  [4096,4096] f32, bias [4096] tiled",
                4 * N + 4 * COLS + 4 * N, False, lambda: gelu_ref64(x, b))
    chain = Case("chain", "relu(sigmoid(x*s + bias)*x + r)  16M f32, 4 inputs, 6 steps",
                 4 * N + 4 + 4 * COLS + 4 * N + 4 * N, False, lambda: chain_ref64(x, s, b, r))
    bf16 = Case("bf16", "cast f32 -> bf16  16M", 4 * N + 2 * N, True, lambda: bf16_ref(c, peers))
    f16 = Case("f16", "cast f32 -> f16  16M", 4 * N + 2 * N, True,
               lambda: c.astype(np.float16).view(np.uint16))
    cases = [gelu, chain, bf16, f16]
    for cs in (bf16, f16):  # the edge values first, then the timed values stay in the arena
        cs.datasets = [("edge values", lambda: arena.write(C, edge)), ("timed", lambda: arena.write(C, c_timed))]

    gelu.add("rlx-llvm", run_prog(progs["gelu"]), lambda: arena.view(OG, "f32", (ROWS, COLS)))
    chain.add("rlx-llvm", run_prog(progs["chain"]), lambda: arena.view(OC, "f32", (ROWS, COLS)))
    bf16.add("rlx-llvm", run_prog(progs["bf16"]), lambda: arena.view(OBF, "bf16", N))
    f16.add("rlx-llvm", run_prog(progs["f16"]), lambda: arena.view(OF16, "f16", N).view(np.uint16))

    # ---- NumPy, natural expressions (allocate their temporaries and result every call)
    box: dict[str, np.ndarray] = {}

    def np_gelu():
        h = x + b
        box["gelu"] = 0.5 * h * (1 + np.tanh(GELU_K * (h + GELU_A * (h * h * h))))

    def np_chain():
        box["chain"] = np.maximum(1 / (1 + np.exp(-(x * s + b))) * x + r, 0)

    def np_f16():
        box["f16"] = c.astype(np.float16)

    def np_bf16_rne():
        u = c.view(np.uint32)
        box["bf16_rne"] = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

    gelu.add("NumPy", np_gelu, lambda: box["gelu"])
    chain.add("NumPy", np_chain, lambda: box["chain"])
    f16.add("NumPy astype", np_f16, lambda: box["f16"].view(np.uint16))
    bf16.add("NumPy int RNE", np_bf16_rne, lambda: box["bf16_rne"])
    if peers.ml_dtypes is not None:
        bfl = peers.ml_dtypes.bfloat16

        def np_bf16_ml():
            box["bf16_ml"] = c.astype(bfl)
        bf16.add("ml_dtypes astype", np_bf16_ml, lambda: box["bf16_ml"].view(np.uint16))
    else:
        bf16.skipped.append("ml_dtypes astype: not installed")

    # ---- NumPy with preallocated out= buffers
    h_buf, t_buf = np.empty_like(x), np.empty_like(x)
    o_gelu, o_chain = np.empty_like(x), np.empty_like(x)
    o16 = np.empty(N, np.float16)
    kf, af, one, half, zero = F32(GELU_K), F32(GELU_A), F32(1), F32(0.5), F32(0)

    def np_gelu_out():
        np.add(x, b, out=h_buf)
        np.multiply(h_buf, h_buf, out=t_buf)
        np.multiply(t_buf, h_buf, out=t_buf)
        np.multiply(t_buf, af, out=t_buf)
        np.add(t_buf, h_buf, out=t_buf)
        np.multiply(t_buf, kf, out=t_buf)
        np.tanh(t_buf, out=t_buf)
        np.add(t_buf, one, out=t_buf)
        np.multiply(t_buf, h_buf, out=t_buf)
        np.multiply(t_buf, half, out=o_gelu)

    def np_chain_out():
        np.multiply(x, s, out=t_buf)
        np.add(t_buf, b, out=t_buf)
        np.negative(t_buf, out=t_buf)
        np.exp(t_buf, out=t_buf)
        np.add(t_buf, one, out=t_buf)
        np.reciprocal(t_buf, out=t_buf)
        np.multiply(t_buf, x, out=t_buf)
        np.add(t_buf, r, out=t_buf)
        np.maximum(t_buf, zero, out=o_chain)

    def np_f16_out():
        np.copyto(o16, c, casting="same_kind")

    gelu.add("NumPy out=", np_gelu_out, lambda: o_gelu)
    chain.add("NumPy out=", np_chain_out, lambda: o_chain)
    f16.add("NumPy copyto(f16 buf)", np_f16_out, lambda: o16.view(np.uint16))

    # ---- numexpr (out= preallocated, float32 constants so nothing is upcast to float64)
    if peers.numexpr is not None:
        ne = peers.numexpr
        o_ne_g, o_ne_c = np.empty_like(x), np.empty_like(x)
        consts = dict(k=kf, a=af, one=one, half=half, zero=zero, s=s)
        ex_g = "half*(x+b)*(one+tanh(k*((x+b)+a*((x+b)*(x+b)*(x+b)))))"
        ex_c = "maximum(one/(one+exp(-(x*s+b)))*x+r, zero)"
        ld_g, ld_c = dict(x=x, b=b, **consts), dict(x=x, b=b, r=r, **consts)
        gelu.add("numexpr", lambda: ne.evaluate(ex_g, local_dict=ld_g, out=o_ne_g), lambda: o_ne_g)
        chain.add("numexpr", lambda: ne.evaluate(ex_c, local_dict=ld_c, out=o_ne_c), lambda: o_ne_c)
    else:
        for cs in (gelu, chain):
            cs.skipped.append(f"numexpr: {peers.missing['numexpr']}")

    # ---- numba: plain @njit loops (no parallel, no fastmath), compiled and warmed here
    if peers.numba is not None:
        try:
            add_numba(peers, gelu, chain, f16, x, b, r, s, c)
        except Exception as e:  # noqa: BLE001
            for cs in (gelu, chain):
                cs.skipped.append(f"numba: failed ({type(e).__name__}: {e})"[:120])
    else:
        for cs in (gelu, chain):
            cs.skipped.append(f"numba: {peers.missing['numba']}")

    # ---- PyTorch CPU (natural expressions; the result is allocated every call like NumPy's)
    if peers.torch is not None:
        torch = peers.torch
        F = torch.nn.functional
        tx, tb, tr, tc = (torch.from_numpy(a) for a in (x, b, r, c))
        ts = float(s)
        gelu.add("PyTorch", lambda: box.__setitem__("t_gelu", F.gelu(tx + tb, approximate="tanh")),
                 lambda: box["t_gelu"].numpy())
        chain.add("PyTorch", lambda: box.__setitem__("t_chain",
                                                     torch.relu(torch.sigmoid(tx * ts + tb) * tx + tr)),
                  lambda: box["t_chain"].numpy())
        bf16.add("PyTorch .to(bf16)", lambda: box.__setitem__("t_bf", tc.to(torch.bfloat16)),
                 lambda: box["t_bf"].view(torch.int16).numpy().view(np.uint16))
        f16.add("PyTorch .to(f16)", lambda: box.__setitem__("t_f16", tc.to(torch.float16)),
                lambda: box["t_f16"].view(torch.int16).numpy().view(np.uint16))
    else:
        for cs in cases:
            cs.skipped.append(f"PyTorch: {peers.missing['torch']}")

    # ---- ONNX Runtime (IOBinding: inputs and preallocated outputs are NumPy buffers, no copies)
    if peers.ort is not None:
        try:
            add_ort(peers, gelu, chain, bf16, f16, x, b, r, s, c)
        except Exception as e:  # noqa: BLE001
            for cs in cases:
                cs.skipped.append(f"ONNX Runtime: failed ({type(e).__name__}: {e})"[:160])
    else:
        for cs in cases:
            cs.skipped.append(f"ONNX Runtime: {peers.missing['onnxruntime']}")

    # ---- the ceiling: np.copyto of half the bytes moved (a copy of M bytes moves 2M)
    biggest = max(cs.moved for cs in cases) // 2 + 64
    src, dst = np.ones(biggest, np.uint8), np.zeros(biggest, np.uint8)
    for cs in cases:
        m = cs.moved // 2
        cs.copy_bytes = m
        s_, d_ = src[:m], dst[:m]
        cs.add("copy (np.copyto)", (lambda s_=s_, d_=d_: np.copyto(d_, s_)), None)
    return cases, compile_ms, arena


def add_numba(peers, gelu, chain, f16, x, b, r, s, c):
    from numba import njit

    @njit
    def nb_gelu(x, b, out):
        rows, cols = x.shape
        half, k, a, one = np.float32(0.5), np.float32(GELU_K), np.float32(GELU_A), np.float32(1.0)
        for i in range(rows):
            for j in range(cols):
                v = x[i, j] + b[j]
                out[i, j] = half * v * (one + np.tanh(k * (v + a * v * v * v)))

    @njit
    def nb_chain(x, s, b, r, out):
        rows, cols = x.shape
        one, zero = np.float32(1.0), np.float32(0.0)
        for i in range(rows):
            for j in range(cols):
                xv = x[i, j]
                v = one / (one + np.exp(-(xv * s + b[j]))) * xv + r[i, j]
                out[i, j] = v if v > zero else zero

    o_g, o_c = np.empty_like(x), np.empty_like(x)
    t0 = time.perf_counter()
    nb_gelu(x, b, o_g)
    nb_chain(x, s, b, r, o_c)
    peers.numba_compile_ms = (time.perf_counter() - t0) * 1e3
    gelu.add("numba @njit", lambda: nb_gelu(x, b, o_g), lambda: o_g)
    chain.add("numba @njit", lambda: nb_chain(x, s, b, r, o_c), lambda: o_c)


def add_ort(peers, gelu, chain, bf16, f16, x, b, r, s, c):
    from onnx import TensorProto as TP, helper
    V = helper.make_tensor_value_info
    shp = [ROWS, COLS]

    m = onnx_model(peers, [helper.make_node("Add", ["X", "B"], ["H"]),
                           helper.make_node("Gelu", ["H"], ["Y"], approximate="tanh")],
                   [V("X", TP.FLOAT, shp), V("B", TP.FLOAT, [COLS])], [V("Y", TP.FLOAT, shp)])
    o_g = np.empty_like(x)
    gelu.add("ONNX Runtime", peers.ort_bound(peers.ort_session(m), {"X": x, "B": b}, {"Y": (o_g, None)}),
             lambda: o_g)

    m = onnx_model(peers, [helper.make_node("Mul", ["X", "S"], ["s0"]),
                           helper.make_node("Add", ["s0", "B"], ["s1"]),
                           helper.make_node("Sigmoid", ["s1"], ["s2"]),
                           helper.make_node("Mul", ["s2", "X"], ["s3"]),
                           helper.make_node("Add", ["s3", "R"], ["s4"]),
                           helper.make_node("Relu", ["s4"], ["Y"])],
                   [V("X", TP.FLOAT, shp), V("S", TP.FLOAT, []), V("B", TP.FLOAT, [COLS]),
                    V("R", TP.FLOAT, shp)], [V("Y", TP.FLOAT, shp)])
    o_c = np.empty_like(x)
    chain.add("ONNX Runtime", peers.ort_bound(peers.ort_session(m),
                                              {"X": x, "S": np.array(s, np.float32), "B": b, "R": r},
                                              {"Y": (o_c, None)}), lambda: o_c)

    o_16 = np.empty(N, np.float16)
    m = onnx_model(peers, [helper.make_node("Cast", ["X"], ["Y"], to=TP.FLOAT16)],
                   [V("X", TP.FLOAT, [N])], [V("Y", TP.FLOAT16, [N])])
    f16.add("ONNX Runtime Cast", peers.ort_bound(peers.ort_session(m), {"X": c}, {"Y": (o_16, None)}),
            lambda: o_16.view(np.uint16))

    m = onnx_model(peers, [helper.make_node("Cast", ["X"], ["Y"], to=TP.BFLOAT16)],
                   [V("X", TP.FLOAT, [N])], [V("Y", TP.BFLOAT16, [N])])
    o_bf = np.empty(N, np.uint16)
    try:
        run = peers.ort_bound(peers.ort_session(m), {"X": c}, {"Y": (o_bf, TP.BFLOAT16)})
        run()
    except Exception as e:  # noqa: BLE001
        bf16.skipped.append(f"ONNX Runtime Cast: bf16 output not bindable ({type(e).__name__}: {e})"[:160])
    else:
        bf16.add("ONNX Runtime Cast", run, lambda: o_bf)


# ------------------------------------------------------------------------------------------- main

def check(cases) -> bool:
    """Run every implementation once and compare it with the reference; True if rlx-llvm passed."""
    cols = ["kernel", "data", "implementation", "check vs float64 NumPy reference", "verdict"]
    table = common.Table(cols, left=set(cols), title="Correctness (each output computed once, before timing)")
    ok = True
    for cs in cases:
        for data, load in cs.datasets:
            if load is not None:
                load()
            ref = cs.ref()
            for name, (run, output) in cs.impls.items():
                if output is None:
                    continue
                run()
                got = output()
                if cs.exact:
                    diff = int(np.count_nonzero(np.asarray(got).reshape(-1) != ref.reshape(-1)))
                    text = "bit-exact" if diff == 0 else f"{diff} of {ref.size} bit patterns differ"
                    good = diff == 0
                else:
                    err = rel_err(got, ref)
                    text = f"max |d|/(1+|ref|) = {err:.2e}"
                    good = err < REL_TOL
                if name == "rlx-llvm":
                    ok &= good
                    verdict = "PASS" if good else "FAIL"
                else:
                    verdict = "ok" if good else "differs (peer; informational)"
                table.add(cs.name, data, name, text, verdict)
            table.rule()
    table.rows.pop()
    print(table)
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=25, help="timing rounds per kernel (default 25)")
    ap.add_argument("--budget", type=float, default=20.0,
                    help="seconds of timing per kernel before stopping early (default 20; at least 7 rounds)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()

    peers = Peers()
    import rlx_llvm
    peers.versions = {"rlx_llvm": rlx_llvm.__version__, **peers.versions}

    print("rlx-llvm element-wise benchmark — single thread, every peer in the same process")
    print(f"  date      {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"  CPU       {common.cpu_name()} (LLVM host name), {common.cpu_model()}")
    print(f"  ISA       {common.host_features()}")
    print(f"  cores     {common.cores()}; all peers limited to 1 thread")
    print(f"  {common.python_facts()}")
    print("  versions  " + ", ".join(f"{k} {v}" for k, v in peers.versions.items()))
    for name, why in peers.missing.items():
        print(f"  missing   {name}: {why}")
    print(f"  load avg  {common.load_average()} at start (other processes share this machine)")
    pools = ", ".join(f"{p.get('internal_api')}={p.get('num_threads')}" for p in peers.pools)
    if pools:
        print(f"  pools     {pools} (threadpoolctl)")

    cases, compile_ms, _arena = build_cases(peers, args)
    print("  compile   rlx-llvm " + ", ".join(f"{k} {abs(v):.0f} ms" + (" (cache hit)" if v < 0 else "")
                                              for k, v in compile_ms.items())
          + (f"; numba both kernels {peers.numba_compile_ms:.0f} ms" if hasattr(peers, "numba_compile_ms") else ""))
    print()
    with np.errstate(over="ignore", under="ignore"):  # the edge data overflows f16 on purpose
        ok = check(cases)
    print()
    if not ok:
        print("rlx-llvm output does not match the reference: not timing.")
        return 1

    cols = ["kernel", "implementation", "median ms", "p10-p90 ms", "GB/s", "% copy BW", "x rlx time"]
    table = common.Table(cols, left={"kernel", "implementation"},
                         title="Timing: interleaved rounds (each round runs every implementation once, "
                               "rotating the order); GB/s = bytes the kernel must move / median")
    summary = []
    for cs in cases:
        times = common.interleaved({k: v[0] for k, v in cs.impls.items()}, rounds=args.rounds, warmup=2,
                                   budget_s=args.budget, min_rounds=7)
        rlx_t, copy_t = times["rlx-llvm"], times["copy (np.copyto)"]
        for name, t in times.items():
            g = common.gbps(cs.moved, t.median)
            # Ratios are paired: the median over rounds of this round's time ratio, so a round
            # slowed by a neighbour moves both sides of the ratio.
            ratio = common.paired_ratio(t, rlx_t)
            of_copy = common.paired_ratio(copy_t, t)
            label = name if not name.startswith("copy") else f"{name} {cs.copy_bytes / 2**20:.0f} MiB"
            table.add(cs.name, label, common.fmt_ms(t.median),
                      f"{common.fmt_ms(t.p10)}-{common.fmt_ms(t.p90)}", f"{g:.1f}",
                      f"{100 * of_copy:.0f}%", "1.00 (ref)" if name == "rlx-llvm" else f"{ratio:.2f}")
        for why in cs.skipped:
            table.add(cs.name, f"(skipped) {why}", "", "", "", "", "")
        summary.append((cs, rlx_t.median, common.gbps(cs.moved, rlx_t.median),
                        common.gbps(cs.moved, copy_t.median), common.paired_ratio(copy_t, rlx_t), rlx_t.n))
        table.rule()
    table.rows.pop()
    table.note("x rlx time = implementation time / rlx-llvm time, median over rounds of the per-round ratio "
               "(above 1: rlx-llvm is faster).")
    table.note("% copy BW = GB/s relative to np.copyto moving the same bytes in the same round (a copy of M bytes "
               "moves 2M), median over rounds.")
    print(table)
    print()
    print("rlx-llvm as % of copy bandwidth (same bytes moved, same run):")
    for cs, ms, g, cg, frac, rounds in summary:
        print(f"  {cs.label:<62} {ms:6.2f} ms {g:5.1f} GB/s; copy {cg:5.1f} GB/s; {100 * frac:4.0f}% of copy"
              f"   ({cs.moved / 2**20:.0f} MiB moved, {rounds} rounds)")
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"\ntotal wall time {time.perf_counter() - t_start:.0f} s, peak RSS {peak:.1f} GiB, "
          f"load avg {common.load_average()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
