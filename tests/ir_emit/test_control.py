"""Nested schedules: Scan, ScanBackward, ScanBackwardXs, CustomFn (semantics.md §3.10).

* Against the references, in one program: scans of 0, 1, 2 and 7 steps; trajectory, the final carry
  only, checkpoint rows (K = 1, 2, 3, 6, and K ≥ length meaning every row); a body updating its carry
  in place; two xs streams plus a broadcast input; a Scan nested in a Scan's body; the backward kinds
  with a full trajectory, a single upstream row, checkpoints recomputed by a forward body, f64 carries.
* Against the body itself run step by step through `rl.compile` from Python (bit-identical), and the
  checkpointed backward against the full-trajectory one (bit-identical), and against finite differences.
* Inspection (nested functions in `report()`, `llvm_ir(thunk=)`, `rlx-llvm ir`), JSON round trip, a
  failing body reported at the outer thunk, and bad input (each a ValidationError naming the path).
"""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import thunks as T
from rlx_llvm.ops import Activation, BinaryOp
from rlx_llvm.testing.control import CARRY, D_AT, H, H_AT, INIT, OUT_AT, W_AT, WEIGHTS, X_AT, cell, cell_vjp
from tests.harness import Suite, expect_invalid, suite_tests

RTOL = 2e-6   # tanh in native code vs NumPy; every other case is bit-exact


def add(lhs: int, rhs: int, dst: int, n: int = H, op: BinaryOp = BinaryOp.Add, f64: bool = False) -> T.Thunk:
    """`dst = lhs op rhs` over `n` equal-length elements (f32, or f64)."""
    kind = T.BinaryFullF64 if f64 else T.BinaryFull
    extra = {} if f64 else {"elem_bytes": 4}
    return kind(lhs=lhs, rhs=rhs, dst=dst, len=n, lhs_len=n, rhs_len=n, op=op, out_dims_bcast=(),
                bcast_lhs_strides=(), bcast_rhs_strides=(), **extra)


def scan(s: Suite, length: int, trajectory: bool = True, checkpoints: int = 0, body: rl.ThunkSchedule | None = None,
         out: int = OUT_AT, xs: int = 1, bcast: bool = False) -> T.Scan:
    """A scan over fresh slots: init carry, `xs` streams of `[length, H]`, optional broadcast at W_AT."""
    init = s.put(s.normal(H))
    streams = tuple((slot, s.put(s.normal(length, H)), CARRY) for slot in (X_AT, D_AT)[:xs])
    shared = ((W_AT, s.put(s.normal(H)), CARRY),) if bcast else ()
    rows = (checkpoints if 0 < checkpoints < length else length) if trajectory else 1
    final = s.slot(rows * CARRY)
    return T.Scan(body=body or cell(), body_init=INIT, body_input_off=H_AT, body_output_off=out, outer_init_off=init,
                  outer_final_off=final, length=length, carry_bytes=CARRY, save_trajectory=trajectory,
                  xs_inputs=streams, bcast_inputs=shared, num_checkpoints=checkpoints)


def two_stream_body() -> rl.ThunkSchedule:
    """`out = (h·w + x) + d` with w broadcast at W_AT, xs at X_AT and D_AT; the carry lands at 128+32."""
    return rl.ThunkSchedule([T.Fma(a=H_AT, b=W_AT, c=X_AT, dst=OUT_AT, len=H, elem_bytes=4),
                             add(OUT_AT, D_AT, 160)], arena_bytes=192)


def nested_body() -> rl.ThunkSchedule:
    """A body that itself scans the tanh cell 3 times over a broadcast x (its carry in and out at 0/96)."""
    inner = T.Scan(body=cell(), body_init=INIT, body_input_off=H_AT, body_output_off=OUT_AT, outer_init_off=0,
                   outer_final_off=32, length=3, carry_bytes=CARRY, save_trajectory=False,
                   xs_inputs=(), bcast_inputs=((X_AT, 64, CARRY),), num_checkpoints=0)
    return rl.ThunkSchedule([inner], arena_bytes=96)


def backward(s: Suite, kind: type, length: int, checkpoints: int, trajectory: bool = True,
             f64: bool = False) -> T.Thunk:
    """The linear cell's scan backward over fresh slots (f64: the same cell on f64 carries)."""
    elem = 8 if f64 else 4
    n = H * elem
    dtype = np.float64 if f64 else np.float32
    w_at, x_at, out_at, d_at = (2 * a for a in (W_AT, X_AT, OUT_AT, D_AT)) if f64 else (W_AT, X_AT, OUT_AT, D_AT)
    init = bytes(w_at) + WEIGHTS.astype(dtype).tobytes()
    copy = T.CopyF64(src=d_at, dst=x_at, len=H) if f64 else T.Copy(src=d_at, dst=x_at, len=H)
    vjp = rl.ThunkSchedule([add(d_at, w_at, out_at, op=BinaryOp.Mul, f64=f64), copy], arena_bytes=2 * 160)
    fma = T.Fma(a=H_AT, b=w_at, c=x_at, dst=out_at, len=H, elem_bytes=elem)
    rows = checkpoints if 0 < checkpoints < length else length
    common = dict(body_vjp=vjp, body_init=init, body_carry_in_off=H_AT, body_x_offs=(x_at,), body_d_output_off=d_at,
                  body_dcarry_out_off=out_at, outer_init_off=s.put(s.normal(H, dtype=dtype)),
                  outer_traj_off=s.put(s.normal(rows, H, dtype=dtype)),
                  outer_upstream_off=s.put(s.normal(length if trajectory else 1, H, dtype=dtype)),
                  outer_xs_offs=((s.put(s.normal(length, H, dtype=dtype)), n),), length=length, carry_bytes=n,
                  carry_elem_size=elem, save_trajectory=trajectory, num_checkpoints=checkpoints,
                  forward_body=rl.ThunkSchedule([fma], arena_bytes=2 * 160), forward_body_init=init,
                  forward_body_carry_in_off=H_AT, forward_body_output_off=out_at, forward_body_x_offs=(x_at,))
    if kind is T.ScanBackwardXs:
        return T.ScanBackwardXs(**common, body_dxs_out_off=x_at, outer_dxs_off=s.slot(length * n), per_step_bytes=n)
    return T.ScanBackward(**common, outer_dinit_off=s.slot(n))


def build() -> Suite:
    s = Suite(seed=12)
    for length in (0, 1, 2, 7):
        s.add(f"scan/L{length}/trajectory", scan(s, length), dtype=np.float32, rtol=RTOL)
        s.add(f"scan/L{length}/final", scan(s, length, trajectory=False), dtype=np.float32, rtol=RTOL)
    for k in (1, 2, 3, 6, 7, 9):
        s.add(f"scan/L7/checkpoints{k}", scan(s, 7, checkpoints=k), dtype=np.float32, rtol=RTOL)
    in_place = rl.ThunkSchedule([T.ActivationInPlace(data=H_AT, len=H, act=Activation.Tanh)], arena_bytes=64)
    s.add("scan/in_place_body", scan(s, 5, body=in_place, out=H_AT, xs=0), dtype=np.float32, rtol=RTOL)
    s.add("scan/two_xs_and_bcast", scan(s, 6, body=two_stream_body(), out=160, xs=2, bcast=True), dtype=np.float32)
    s.add("scan/nested_scan", scan(s, 4, body=nested_body(), out=OUT_AT - 64, xs=1), dtype=np.float32, rtol=1e-5)
    for kind in (T.ScanBackward, T.ScanBackwardXs):
        name = kind.__name__
        s.add(f"{name}/trajectory", backward(s, kind, 6, 0), dtype=np.float32)
        s.add(f"{name}/one_upstream_row", backward(s, kind, 5, 0, trajectory=False), dtype=np.float32)
        s.add(f"{name}/L0", backward(s, kind, 0, 0), dtype=np.float32)
        for k in (1, 2, 3, 7):
            s.add(f"{name}/L8/checkpoints{k}", backward(s, kind, 8, k), dtype=np.float32)
        s.add(f"{name}/f64/checkpoints2", backward(s, kind, 5, 2, f64=True), dtype=np.float64)
    fn = T.CustomFn(body=cell(), body_init=INIT, inputs=((H_AT, s.put(s.normal(H)), CARRY),
                                                          (X_AT, s.put(s.normal(H)), CARRY)),
                    body_output_off=OUT_AT, outer_output_off=s.slot(CARRY), out_bytes=CARRY)
    s.add("CustomFn/cell", fn, dtype=np.float32, rtol=RTOL)
    return s


SUITE = build()
(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


# ── against the body run step by step, and the backward's own consistency ──

def test_scan_equals_the_body_run_step_by_step() -> None:
    """Scan's trajectory is, byte for byte, the body compiled alone and driven from Python."""
    s = Suite(seed=3)
    t = scan(s, 9, body=two_stream_body(), out=160, xs=2, bcast=True)
    program = rl.compile(rl.ThunkSchedule([t], arena_bytes=s.nbytes), cache=False)
    arena = s.arena()
    program.run(arena)
    outer = s.initial_bytes()
    body = rl.compile(t.body, cache=False)
    inner = rl.Arena(t.body.arena_bytes)
    inner.bytes[:len(INIT)] = np.frombuffer(INIT, np.uint8)
    inner.bytes[H_AT:H_AT + CARRY] = outer[t.outer_init_off:t.outer_init_off + CARRY]
    (slot, at, n), = t.bcast_inputs
    inner.bytes[slot:slot + n] = outer[at:at + n]
    rows = []
    for step in range(t.length):
        for slot, at, n in t.xs_inputs:
            inner.bytes[slot:slot + n] = outer[at + step * n:at + (step + 1) * n]
        body.run(inner)
        rows.append(inner.bytes[160:160 + CARRY].copy())
        inner.bytes[H_AT:H_AT + CARRY] = rows[-1]
    got = arena.bytes[t.outer_final_off:t.outer_final_off + t.length * CARRY]
    assert np.array_equal(got, np.concatenate(rows))


def linear_forward(h0: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """The linear cell's trajectory in float64: h ← h·w + x."""
    rows, h = [], h0.astype(np.float64)
    for x in xs:
        h = h * WEIGHTS + x
        rows.append(h)
    return np.array(rows)


@pytest.mark.parametrize("checkpoints", [1, 2, 3, 5])
def test_checkpointed_backward_equals_full_trajectory(checkpoints: int) -> None:
    """With real forward carries, recomputing between K checkpoints gives the very bytes of the full
    trajectory; and dinit matches central finite differences of Σ upstream·trajectory."""
    length, rng = 11, np.random.default_rng(checkpoints)
    h0, xs, up = (rng.standard_normal(shape).astype(np.float32) for shape in ((H,), (length, H), (length, H)))
    forward = rl.compile(rl.ThunkSchedule([scan_at(length, 0)], arena_bytes=4096), cache=False)
    arena = rl.Arena(4096)
    arena.write(0, h0)
    arena.write(64, xs)
    forward.run(arena)
    traj = arena.read(1024, np.float32, length * H).reshape(length, H)
    picks = [min(-(-(k + 1) * length // checkpoints) - 1, length - 1) for k in range(checkpoints)]
    results = []
    for k, rows in ((0, traj), (checkpoints, traj[picks])):
        s = Suite(seed=0)
        t = backward(s, T.ScanBackward, length, k)
        for off, values in ((t.outer_init_off, h0), (t.outer_traj_off, rows), (t.outer_upstream_off, up),
                            (t.outer_xs_offs[0][0], xs)):
            s.inputs = [(o, v if o != off else values.astype(np.float32)) for o, v in s.inputs]
        out = s.arena()
        rl.compile(rl.ThunkSchedule([t], arena_bytes=s.nbytes), cache=False).run(out)
        results.append(out.read(t.outer_dinit_off, np.float32, H))
    assert np.array_equal(results[0], results[1])
    eps, numeric = 1e-3, np.empty(H)
    for i in range(H):
        bump = np.eye(H)[i] * eps
        numeric[i] = (np.sum(up * linear_forward(h0 + bump, xs)) - np.sum(up * linear_forward(h0 - bump, xs))) / (2 * eps)
    np.testing.assert_allclose(results[0], numeric, rtol=1e-4, atol=1e-5)


def scan_at(length: int, checkpoints: int) -> T.Scan:
    """The linear cell scanned from h0 at 0 over xs at 64; trajectory at 1024."""
    return T.Scan(body=cell(tanh=False), body_init=INIT, body_input_off=H_AT, body_output_off=OUT_AT, outer_init_off=0,
                  outer_final_off=1024, length=length, carry_bytes=CARRY, save_trajectory=True,
                  xs_inputs=((X_AT, 64, CARRY),), bcast_inputs=(), num_checkpoints=checkpoints)


# ── inspection, JSON, failures ───────────────────────────────────────────────

def test_nested_bodies_are_inspectable(outcome) -> None:
    """`report()` lists each body's thunks under its Scan; `llvm_ir(thunk=)` includes the body functions."""
    i = outcome.index("scan/nested_scan")
    report = outcome.program.report()
    symbols = [r.symbol for r in report.nested[i]]
    assert f"t{i}_scan.body.t0_scan" in symbols and f"t{i}_scan.body.t0_scan.body.t0_fma" in symbols
    assert all(r.path == "llvm" for r in report.nested[i])
    assert f"↳ 0  Scan" in str(report)
    text = outcome.thunk_ir("scan/nested_scan")
    for name in (f"t{i}_scan.body", f"t{i}_scan.body.t0_scan.body.t1_activation_in_place"):
        assert f'define i32 @"{name}"' in text


def test_cli_ir_shows_the_body(tmp_path) -> None:
    """`rlx-llvm ir --thunk 0` prints the Scan and the functions of its body."""
    path = tmp_path / "scan.json"
    rl.ThunkSchedule([scan_at(4, 0)], arena_bytes=4096).save(path)
    out = subprocess.run([sys.executable, "-m", "rlx_llvm.cli", "ir", str(path), "--thunk", "0"],
                         capture_output=True, text=True, check=True).stdout
    assert 'define i32 @"t0_scan.body.t0_fma"' in out and 'define i32 @"t0_scan"' in out


def test_json_round_trip_keeps_nested_bodies() -> None:
    schedule = SUITE.schedule()
    assert rl.ThunkSchedule.from_json(schedule.to_json()) == schedule


def test_a_failing_body_fails_the_outer_thunk() -> None:
    """A body whose Cholesky meets a non-SPD matrix: the Scan (thunk 1) raises ExecutionError."""
    body = rl.ThunkSchedule([T.CholeskyF32(a=0, l=64, n=2)], arena_bytes=128)
    t = T.Scan(body=body, body_init=b"", body_input_off=0, body_output_off=0, outer_init_off=0, outer_final_off=64,
               length=3, carry_bytes=16, save_trajectory=False, xs_inputs=(), bcast_inputs=(), num_checkpoints=0)
    program = rl.compile(rl.ThunkSchedule([T.Nop(), t], arena_bytes=128), cache=False)
    arena = rl.Arena(128)
    arena.write(0, np.array([-1.0, 0.0, 0.0, -1.0], np.float32))
    with pytest.raises(rl.ExecutionError) as err:
        program.run(arena)
    assert err.value.index == 1 and err.value.kind == "Scan"


# ── bad input ────────────────────────────────────────────────────────────────

BASE = scan_at(4, 0)


@pytest.mark.parametrize("change, field, match", [
    (dict(body=rl.ThunkSchedule([T.Fma(a=0, b=32, c=64, dst=150, len=H, elem_bytes=4)], arena_bytes=160)),
     "body", "body thunk 0 Fma field 'dst': bytes [150, 170) lie outside the arena of 160 bytes"),
    (dict(carry_bytes=200), "body_input_off", "the carry [0, 200) lies outside the body arena of 160 bytes"),
    (dict(body_output_off=150), "body_output_off", "lies outside the body arena"),
    (dict(xs_inputs=((150, 64, CARRY),)), "xs_inputs[0]", "the slice [150, 170)"),
    (dict(xs_inputs=((X_AT, 4050, CARRY),)), "xs_inputs[0]", "bytes [4050, 4130) lie outside the arena of 4096"),
    (dict(body_init=bytes(161)), "body_init", "161 bytes do not fit the body arena of 160 bytes"),
    (dict(body=rl.ThunkSchedule([T.SortF32(src=0, dst=32, outer=1, axis_dim=4, inner=1, descending=False, arg=False)], arena_bytes=64)),
     "body", "body thunk 0 SortF32 runs as a scipy fallback"),
])
def test_bad_scan_is_refused(change: dict, field: str, match: str) -> None:
    err = expect_invalid(dataclasses.replace(BASE, **change), 4096, field, match)
    assert str(err).startswith("thunk 0 Scan")


def test_bad_backward_is_refused() -> None:
    s = Suite(seed=1)
    t = backward(s, T.ScanBackward, 6, 2)
    expect_invalid(dataclasses.replace(t, forward_body=None), s.nbytes, "forward_body", "needs a forward_body")
    expect_invalid(dataclasses.replace(t, carry_elem_size=2), s.nbytes, "carry_elem_size", "4 (f32) or 8 (f64)")
    expect_invalid(dataclasses.replace(t, body_x_offs=()), s.nbytes, "body_x_offs", "0 body slots for 1 outer xs")
    expect_invalid(dataclasses.replace(t, body_dcarry_out_off=310), s.nbytes, "body_dcarry_out_off",
                   "outside the body arena")


def test_bad_custom_fn_is_refused() -> None:
    fn = T.CustomFn(body=cell(), body_init=INIT, inputs=((150, 0, CARRY),), body_output_off=OUT_AT,
                    outer_output_off=64, out_bytes=CARRY)
    expect_invalid(fn, 4096, "inputs[0]", "the input [150, 170) lies outside the body arena")
    expect_invalid(dataclasses.replace(fn, inputs=(), out_bytes=100), 4096, "body_output_off", "the output")
