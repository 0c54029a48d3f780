"""Run ONNX's node test suite against RLX and write the table (`docs/onnx-node-tests.md`).

    python -m rlx_llvm.onnx.conformance [--jobs 2] [--timeout 60] [--only REGEX] [--out docs/onnx-node-tests.md]

Every case (`onnx.backend.test.loader.load_model_tests(kind="node")`) is imported and run through
`RlxBackend` and compared as `onnx.backend.test.runner` does (shape, dtype, `assert_allclose` at the
case's rtol/atol).  Cases run in forked worker processes, one case at a time over a pipe, so a case
that hangs past `--timeout` or kills its process is recorded as such and the run goes on.
"""
from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import re
import sys
import time
from collections import defaultdict
from multiprocessing.connection import wait
from typing import Any, Iterable, Sequence

import numpy as np

# The operators issue 15 §1 lists (the CI subset runs every passing case of these).
ISSUE_OPS = """Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization Cast CastLike
Ceil Celu Clip Concat Conv ConvTranspose Cos Cosh CumSum Div Elu Equal Erf Exp Expand Flatten Floor Gather
GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual GroupNormalization
HardSigmoid HardSwish Identity InstanceNormalization LayerNormalization LeakyRelu Less LessOrEqual Log
LogSoftmax MatMul Max MaxPool Mean Min Mish Mod Mul Neg Not Or Pad Pow PRelu Range Reciprocal ReduceL1
ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu
Reshape Resize RMSNormalization Round ScatterElements ScatterND Selu Shape Sigmoid Sign Sin Sinh Size Slice
Softmax Softplus Softsign Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK Transpose Unsqueeze
Where Xor ConstantOfShape LSTM GRU RNN DFT STFT QuantizeLinear DequantizeLinear QLinearMatMul MatMulInteger
Attention RotaryEmbedding""".split()

RECYCLE_AFTER = 150            # a worker is replaced after this many cases (JIT engines accumulate)

# Failures that are a choice of RLX rather than work left: the reason text (or the case name) matches one of these.
ACCEPTED = [
    (re.compile(r"STRING|dtype <U|dtype object|dtype <S"), "strings are not tensors RLX computes on"),
    (re.compile(r"FLOAT8|FLOAT4|INT4|UINT4|INT2|UINT2|float8|float4|int4|int2"), "sub-byte and 8-bit float dtypes are not lowered"),
    (re.compile(r"UINT16|UINT64|uint16|uint64"), "u16/u64 tensors are not lowered"),
    (re.compile(r"domain 'ai.onnx.(ml|preview.training)'"), "ONNX-ML and training ops are out of scope"),
    (re.compile(r"Optional|Sequence|SequenceProto|sequence_type|optional_type|^test_identity_(sequence|opt)$"),
     "sequence and optional values are not tensors"),
    (re.compile(r"op '(Loop|Scan)' \(domain"), "control flow with a body graph (Loop, Scan) is not lowered: an RLX "
                                             "schedule is straight-line code for fixed shapes"),
    (re.compile(r"training_mode"), "training-mode outputs (running statistics, random dropout masks): RLX imports for inference"),
    (re.compile(r"got f64|, not f64"), "f64 math beyond what RLX lowers in f64 (binary ops, compares, unary math, "
                                       "sums, softmax) is not lowered (docs/onnx.md § Dtypes)"),
    (re.compile(r"^test_attention_4d_causal_fp16_expanded: AssertionError: output 0: [12]/192 elements differ"),
     "half-precision MatMul/Softmax are computed in f32 and rounded once per op; the expected values are NumPy's "
     "f16 arithmetic (2 of 192 outputs differ by 1 f16 ulp, 1.04e-3 relative against the case's rtol 1e-3; "
     "RLX's are the closer to the exact result)"),
    (re.compile(r"^test_dft_inverse"), "the expected values are NumPy's single-precision inverse FFT; RLX's is the "
                                       "correctly rounded transform (they differ by ≤ 2e-7, docs/onnx.md)"),
]


@dataclasses.dataclass
class Outcome:
    """One case's result: passed, or the one-line reason it did not."""
    name: str
    op: str
    passed: bool
    reason: str = ""

    @property
    def accepted(self) -> str | None:
        """Why this failure is accepted (a semantics choice or a dtype RLX does not lower), else None."""
        for pattern, why in ACCEPTED:
            texts = (self.reason, self.name, f"{self.name}: {self.reason}")
            if not self.passed and any(pattern.search(t) for t in texts):
                return why
        return None


def load_cases(only: str | None = None, modules: Iterable[str] | None = None) -> list:
    """ONNX's node test cases (what `load_model_tests(kind="node")` generates), each tagged with `.module`
    (the `onnx.backend.test.case.node` module that makes it); `modules` limits the import to those."""
    import importlib
    import pkgutil
    import warnings
    import onnx.backend.test.case.node as node_cases
    prefix = node_cases.__name__ + "."
    names = list(modules) if modules is not None else \
        [m.name[len(prefix):] for m in pkgutil.walk_packages(node_cases.__path__, prefix) if not m.ispkg]
    cases = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            before = len(node_cases._NodeTestCases)
            importlib.import_module(prefix + name)
            for c in node_cases._NodeTestCases[before:]:
                c.module = name
                cases.append(c)
    return [c for c in cases if not only or re.search(only, c.name)]


def op_of(case) -> str:
    """The op a case tests: its single node's op type (`Op (expanded)` for function-expanded cases)."""
    nodes = case.model.graph.node
    name = nodes[0].op_type if len(nodes) == 1 else None
    if name is None or case.name.endswith("_expanded") or "_expanded_" in case.name:
        base = re.sub(r"_expanded.*$", "", case.name)
        return f"{_EXPANDED_OPS.get(base, name or base)} (expanded)"
    domain = nodes[0].domain
    return f"{domain}.{name}" if domain not in ("", "ai.onnx") else name


_EXPANDED_OPS: dict[str, str] = {}


def one_line(exc: BaseException) -> str:
    """An exception as one short line (the first problem of an OnnxImportError)."""
    problems = getattr(exc, "problems", None)
    text = problems[0] if problems else (str(exc).strip() or type(exc).__name__)
    text = " ".join(text.split())
    if not problems:
        text = f"{type(exc).__name__}: {text}"
    return text[:300]


def compare(expected: Sequence[np.ndarray], actual: Sequence[Any], rtol: float, atol: float) -> None:
    """Raise AssertionError unless `actual` matches `expected` as onnx's backend runner checks it."""
    if len(actual) != len(expected):
        raise AssertionError(f"{len(actual)} outputs, expected {len(expected)}")
    from onnx import TensorProto, numpy_helper
    for i, (want, got) in enumerate(zip(expected, actual)):
        want = numpy_helper.to_array(want) if isinstance(want, TensorProto) else np.asarray(want)
        got = np.asarray(got)
        if got.shape != want.shape:
            raise AssertionError(f"output {i}: shape {list(got.shape)}, expected {list(want.shape)}")
        if got.dtype != want.dtype:
            raise AssertionError(f"output {i}: dtype {got.dtype}, expected {want.dtype}")
        tol = rtol
        if want.dtype.name == "bfloat16":   # as onnx's runner: compared in f32, at two bf16 ulps at least
            got, want, tol = got.astype(np.float32), want.astype(np.float32), max(rtol, 2 ** -6)
        if want.dtype.kind in "fc":
            bad = ~np.isclose(got, want, rtol=tol, atol=atol, equal_nan=True)
        else:
            bad = got != want
        if bad.any():
            err = np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))[bad]) if want.dtype != bool else 1
            raise AssertionError(f"output {i}: {int(bad.sum())}/{want.size} elements differ (max abs error {err:.3g})")


def run_case(case) -> Outcome:
    """Import, compile and run one case on each of its data sets; never raises."""
    from .backend import RlxBackend
    op = op_of(case)
    try:
        rep = RlxBackend.prepare(case.model)
        for inputs, expected in case.data_sets:
            compare(expected, rep.run(list(inputs)), case.rtol, case.atol)
    except BaseException as exc:  # noqa: BLE001 - every failure is recorded, none stops the run
        if isinstance(exc, KeyboardInterrupt):
            raise
        return Outcome(case.name, op, False, one_line(exc))
    return Outcome(case.name, op, True)


# ── workers ─────────────────────────────────────────────────────────────────

def _worker(cases: list, conn) -> None:
    while True:
        i = conn.recv()
        if i is None:
            return
        out = run_case(cases[i])
        conn.send((i, out.passed, out.reason))


class _Pool:
    """Forked workers fed one case index at a time; a hung or dead worker is replaced."""

    def __init__(self, cases: list, jobs: int, timeout: float) -> None:
        self.cases, self.timeout = cases, timeout
        self.ctx = mp.get_context("fork")
        self.slots: list[dict] = [self._spawn() for _ in range(jobs)]

    def _spawn(self) -> dict:
        parent, child = self.ctx.Pipe()
        p = self.ctx.Process(target=_worker, args=(self.cases, child), daemon=True)
        p.start()
        child.close()
        return {"proc": p, "conn": parent, "case": None, "t0": 0.0, "done": 0}

    def _replace(self, k: int) -> None:
        old = self.slots[k]
        if old["proc"].is_alive():
            old["proc"].kill()
        old["proc"].join()
        old["conn"].close()
        self.slots[k] = self._spawn()

    def run(self, order: Iterable[int], report) -> None:
        """Run every index in `order`, calling `report(i, passed, reason)` as each finishes."""
        todo = list(order)[::-1]
        while todo or any(s["case"] is not None for s in self.slots):
            for k, s in enumerate(self.slots):
                if s["case"] is None and todo:
                    if s["done"] >= RECYCLE_AFTER:
                        self._replace(k)
                        s = self.slots[k]
                    s["case"], s["t0"] = todo.pop(), time.monotonic()
                    s["conn"].send(s["case"])
            busy = [s for s in self.slots if s["case"] is not None]
            ready = wait([s["conn"] for s in busy] + [s["proc"].sentinel for s in busy], timeout=1.0)
            for k, s in enumerate(self.slots):
                if s["case"] is None:
                    continue
                if s["conn"] in ready and s["conn"].poll():
                    try:
                        i, passed, reason = s["conn"].recv()
                    except EOFError:
                        i, passed, reason = s["case"], False, "worker process died (crash)"
                        self._finish(k, report, i, passed, reason, replace=True)
                        continue
                    self._finish(k, report, i, passed, reason)
                elif not s["proc"].is_alive():
                    self._finish(k, report, s["case"], False,
                                 f"worker process died (exit code {s['proc'].exitcode})", replace=True)
                elif time.monotonic() - s["t0"] > self.timeout:
                    self._finish(k, report, s["case"], False, f"timed out after {self.timeout:.0f} s", replace=True)

    def _finish(self, k: int, report, i: int, passed: bool, reason: str, replace: bool = False) -> None:
        report(i, passed, reason)
        if replace:
            self._replace(k)
        else:
            self.slots[k]["case"] = None
            self.slots[k]["done"] += 1

    def close(self) -> None:
        """Stop every worker."""
        for s in self.slots:
            try:
                s["conn"].send(None)
            except OSError:
                pass
            s["proc"].join(timeout=5)
            if s["proc"].is_alive():
                s["proc"].kill()


def run_suite(cases: list, jobs: int = 2, timeout: float = 60.0, progress: bool = True) -> list[Outcome]:
    """Every case's Outcome, run in `jobs` forked workers with a per-case `timeout`."""
    for c in cases:
        if len(c.model.graph.node) == 1 and not c.name.endswith("_expanded"):
            _EXPANDED_OPS[c.name] = c.model.graph.node[0].op_type
    ops = [op_of(c) for c in cases]
    results: dict[int, Outcome] = {}
    t0 = time.monotonic()

    def report(i: int, passed: bool, reason: str) -> None:
        results[i] = Outcome(cases[i].name, ops[i], passed, reason)
        if progress and len(results) % 100 == 0:
            ok = sum(r.passed for r in results.values())
            print(f"  {len(results)}/{len(cases)} run, {ok} passed, {time.monotonic() - t0:.0f} s", file=sys.stderr)

    pool = _Pool(cases, jobs, timeout)
    try:
        pool.run(range(len(cases)), report)
    finally:
        pool.close()
    return [results[i] for i in range(len(cases))]


# ── the table ───────────────────────────────────────────────────────────────

def table(outcomes: list[Outcome], seconds: float, jobs: int) -> str:
    """The markdown report: totals, a per-op table, and every failure grouped by op."""
    import onnx
    by_op: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by_op[o.op].append(o)
    passed = sum(o.passed for o in outcomes)
    accepted = [o for o in outcomes if not o.passed and o.accepted]
    lines = [
        "# ONNX node tests against RLX",
        "",
        "Generated by `python -m rlx_llvm.onnx.conformance` — do not edit by hand.  What the numbers mean:",
        "`docs/onnx.md` (§ The node-test table).",
        "",
        f"- onnx {onnx.__version__}; {len(outcomes)} node test cases; run in {seconds:.0f} s with {jobs} workers",
        f"- **passed: {passed} / {len(outcomes)}**",
        f"- failed and accepted (a dtype RLX does not lower, or a choice of RLX): {len(accepted)}",
        f"- failed, work left: {len(outcomes) - passed - len(accepted)}",
        "",
        "## Per op",
        "",
        "| op | passed / total |",
        "|---|---|",
    ]
    for op in sorted(by_op, key=str.lower):
        rs = by_op[op]
        lines.append(f"| {op} | {sum(r.passed for r in rs)} / {len(rs)} |")
    lines += ["", "## Failures by op", "",
              "Each failing case with its one-line reason; `accepted:` marks a failure that is a choice of RLX.", ""]
    for op in sorted(by_op, key=str.lower):
        bad = [r for r in by_op[op] if not r.passed]
        if not bad:
            continue
        lines.append(f"### {op}")
        lines.append("")
        for r in bad:
            why = f" — accepted: {r.accepted}" if r.accepted else ""
            lines.append(f"- `{r.name}`: {r.reason.replace('|', '/')}{why}")
        lines.append("")
    return "\n".join(lines)


def passing_names(cases: list, outcomes: list[Outcome], ops: Iterable[str]) -> list[str]:
    """`module case` lines for the passing cases of `ops` (the CI subset in tests/onnx/test_node_suite.py)."""
    keep = set(ops)
    return sorted(f"{c.module} {o.name}" for c, o in zip(cases, outcomes)
                  if o.passed and o.op.replace(" (expanded)", "") in keep)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run the suite and write the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    ap.add_argument("--only", help="regex on case names")
    ap.add_argument("--out", default="docs/onnx-node-tests.md")
    ap.add_argument("--passing", help="also write the passing cases of ISSUE_OPS to this file (the CI list)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    cases = load_cases(args.only)
    print(f"{len(cases)} cases loaded in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    t1 = time.monotonic()
    outcomes = run_suite(cases, args.jobs, args.timeout)
    seconds = time.monotonic() - t1
    with open(args.out, "w") as f:
        f.write(table(outcomes, seconds, args.jobs) + "\n")
    if args.passing:
        with open(args.passing, "w") as f:
            f.write("\n".join(passing_names(cases, outcomes, ISSUE_OPS)) + "\n")
    print(f"passed {sum(o.passed for o in outcomes)} / {len(outcomes)} in {seconds:.0f} s → {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
