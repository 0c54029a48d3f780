"""GEMM family against float64 NumPy references: every kind, shape class, transpose, batch flag and half mix.

Every case lives in one schedule compiled once; outputs start as a NaN sentinel, so a missing
write (e.g. `k = 0` must write zeros) shows, and bytes outside the declared outputs must not change.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Iterator

import numpy as np
import pytest

import rlx_llvm as rl
import rlx_llvm.ir_emit.gemm  # noqa: F401  (registers the lowerings)
import rlx_llvm.ir_emit.parallel
import rlx_llvm.reference.gemm  # noqa: F401  (registers the references)
from rlx_llvm import reference as ref
from rlx_llvm import thunks as T
from rlx_llvm.dtypes import HalfKind
from rlx_llvm.errors import ExecutionError, ValidationError
from rlx_llvm.ir_emit.gemm import GEMM_MODE_ENV, L2_BYTES, ONE_BLOCK_L2_SHARE, register_tile, row_block
from rlx_llvm.kernels.blas import Status
from rlx_llvm.ops import Activation
from tests.harness import NAN_FILL as SENTINEL  # every output byte starts as a NaN
from tests.harness import Outcome, Suite


# (m, k, n): 1×1, skinny, k = 1, n = 1, wide, odd, and a size past OpenBLAS's small-matrix path
SHAPES = [(1, 1, 1), (1, 17, 1), (37, 1, 5), (3, 7, 5), (33, 9, 1), (1, 64, 300), (67, 45, 29), (130, 70, 90)]
ZERO_SHAPES = [(0, 5, 3), (4, 0, 3), (4, 5, 0)]
F64_KINDS = {"Dgemm", "BatchedDgemmF64"}


def assert_half_close(got_bits: np.ndarray, want_bits: np.ndarray) -> None:
    """Packed halves within one ulp (the f32 GEMM and the f64 reference may round a tie differently)."""
    diff = np.abs(got_bits.astype(np.int32) - want_bits.astype(np.int32))
    assert diff.max(initial=0) <= 1, f"packed halves differ by {diff.max()} ulps"


def how_to_compare(t) -> dict:
    """Packed halves within one ulp; f64 and f32 outputs within a tolerance that grows with √k."""
    k = getattr(t, "k", None) or getattr(t, "k_dim", None) or getattr(t, "c_in", 1) or 1
    if isinstance(t, T.SgemmHalf) and t.c_kind.packed:
        return dict(dtype=np.uint16, compare=assert_half_close)
    if type(t).__name__ in F64_KINDS:
        return dict(dtype=np.float64, rtol=1e-12, atol=1e-12 * np.sqrt(k))
    return dict(dtype=np.float32, rtol=1e-5, atol=3e-6 * max(1.0, np.sqrt(k)))


# ── the big schedule ─────────────────────────────────────────────────────────

REUSED_M = int(L2_BYTES * ONE_BLOCK_L2_SHARE) // (160 * 4) + 62  # rows: two row blocks at k = 160 on this host


def gemm_cases(lay: Suite) -> list[tuple[str, object]]:
    cases = []
    for m, k, n in SHAPES + ZERO_SHAPES:
        tag = f"{m}x{k}x{n}"
        cases.append((f"sgemm {tag}", T.Sgemm(a=lay.put(lay.normal(m, k)), b=lay.put(lay.normal(k, n)),
                                            c=lay.slot(m * n * 4), m=m, k=k, n=n)))
        for ta in (False, True):
            for tb in (False, True):
                a = lay.normal(k, m) if ta else lay.normal(m, k)
                b = lay.normal(n, k) if tb else lay.normal(k, n)
                cases.append((f"sgemm_t {tag} ta={ta} tb={tb}", T.SgemmT(
                    a=lay.put(a), b=lay.put(b), c=lay.slot(m * n * 4), m=m, k=k, n=n, ta=ta, tb=tb)))
        cases.append((f"dgemm {tag}", T.Dgemm(a=lay.put(lay.normal(m, k, dtype=np.float64)),
                                            b=lay.put(lay.normal(k, n, dtype=np.float64)),
                                            c=lay.slot(m * n * 8), m=m, k=k, n=n)))
        cases.append((f"cgemm {tag}", T.CgemmC64(a=lay.put(lay.normal(m, 2 * k)), b=lay.put(lay.normal(k, 2 * n)),
                                               c=lay.slot(m * n * 8), m=m, k=k, n=n)))
        cases.append((f"sgemm_bf16 {tag}", T.SgemmBf16(a=lay.put(lay.normal(m, k)),
                                                     b=lay.put(lay.half(HalfKind.Bf16, k, n)),
                                                     c=lay.slot(m * n * 4), m=m, k=k, n=n)))
        cases.append((f"sgemm_f16 {tag}", T.SgemmF16(a=lay.put(lay.normal(m, k)),
                                                   b=lay.put(lay.half(HalfKind.F16, k, n)),
                                                   c=lay.slot(m * n * 4), m=m, k=k, n=n)))
    for m, k, n in [(3, 7, 5), (1, 1, 1), (19, 33, 17)]:
        for batch in (1, 3):
            for a_bc in (False, True):
                for b_bc in (False, True):
                    for kind, dt, size in (("BatchedSgemm", np.float32, 4), ("BatchedDgemmF64", np.float64, 8)):
                        cases.append((f"{kind} b{batch} {m}x{k}x{n} a_bcast={a_bc} b_bcast={b_bc}", getattr(T, kind)(
                            a=lay.put(lay.normal(1 if a_bc else batch, m, k, dtype=dt)),
                            b=lay.put(lay.normal(1 if b_bc else batch, k, n, dtype=dt)),
                            c=lay.slot(batch * m * n * size), batch=batch, m=m, k=k, n=n, a_bcast=a_bc, b_bcast=b_bc)))
    half_shapes = [(5, 9, 7), (1, 1, 1), (34, 17, 40)]
    combos = [(ak, bk, ck) for ak in HalfKind for bk in HalfKind for ck in HalfKind]
    for i, (ak, bk, ck) in enumerate(combos):  # every mix, the shapes taking turns
        for m, k, n in (half_shapes[i % 3], half_shapes[(i + 1) % 3]):
            cases.append((f"sgemm_half {m}x{k}x{n} {ak.name}/{bk.name}/{ck.name}", T.SgemmHalf(
                a=lay.put(lay.half(ak, m, k)), b=lay.put(lay.half(bk, k, n)), c=lay.slot(m * n * ck.itemsize),
                m=m, k=k, n=n, a_kind=ak, b_kind=bk, c_kind=ck)))
    acts = [None, Activation.Gelu, Activation.Relu, Activation.Silu, Activation.GeluApprox]
    for i, (m, k, n) in enumerate([(1, 1, 1), (7, 13, 37), (16, 32, 48), (3, 1, 17), (2, 0, 5), (70, 40, 130)]):
        for act in (acts[i % 5], acts[(i + 2) % 5]):
            cases.append((f"fused {m}x{k}x{n} {act}", T.FusedMmBiasAct(
                a=lay.put(lay.normal(m, k)), w=lay.put(lay.normal(k, n)), bias=lay.put(lay.normal(n)),
                c=lay.slot(m * n * 4), m=m, k=k, n=n, act=act)))
    for m, k, n, r in [(1, 1, 1, 1), (9, 17, 13, 4), (33, 8, 5, 0), (4, 30, 6, 8)]:
        cases.append((f"lora {m}x{k}x{n} r={r}", T.LoraMatMul(
            x=lay.put(lay.normal(m, k)), w=lay.put(lay.normal(k, n)), a=lay.put(lay.normal(k, r)),
            b=lay.put(lay.normal(r, n)), dst=lay.slot(m * n * 4), m=m, k=k, n=n, r=r, scale=0.37)))
    for n_img, c_in, c_out, hw in [(1, 1, 1, 1), (3, 5, 7, 11), (2, 16, 3, 49)]:
        cases.append((f"conv1x1 {n_img} {c_in}->{c_out} hw={hw}", T.Conv2D1x1(
            src=lay.put(lay.normal(n_img, c_in, hw)), weight=lay.put(lay.normal(c_out, c_in)),
            dst=lay.slot(n_img * c_out * hw * 4), n=n_img, c_in=c_in, c_out=c_out, hw=hw)))
    for m, k, n, e in [(1, 1, 1, 1), (11, 6, 9, 3), (40, 17, 5, 4), (6, 0, 3, 2)]:
        ids = lay.rng.integers(0, e, m).astype(np.float32) + np.float32(0.75)  # 2.75 `as usize` is 2
        ids[ids >= e] = e - 1
        if m >= 6:
            ids[:3] = [np.nan, -3.0, -0.5]  # NaN and negatives `as usize` are 0
        for wt in (False, True):
            cases.append((f"grouped {m}x{k}x{n} E={e} wt={wt}", T.GroupedMatMul(
                input=lay.put(lay.normal(m, k)), weight=lay.put(lay.normal(e, k, n)), expert_idx=lay.put(ids),
                dst=lay.slot(m * n * 4), m=m, k_dim=k, n=n, num_experts=e, w_transposed=wt)))
    for m, k, n, d, entries in [(1, 1, 1, 1, 1), (7, 12, 9, 4, 5), (3, 30, 17, 3, 256)]:
        codes = lay.rng.integers(0, entries, (n, k // d)).astype(np.uint8)
        cases.append((f"synth {m}x{k}x{n} d={d}", T.SynthMatMul(
            x=lay.put(lay.normal(m, k)), indices=lay.put(codes), codebook=lay.put(lay.normal(entries, d)),
            dst=lay.slot(m * n * 4), m=m, k=k, n=n, entry_dim=d, num_entries=entries)))
    cases += parallel_cases(lay) + k_block_cases(lay)
    return cases


def k_block_cases(lay: Suite) -> list[tuple[str, object]]:
    """k beyond one `K_BLOCK` (later blocks accumulate onto C) and packed B panels (more than one row
    tile), with transposes, an epilogue and f64."""
    return [
        ("kblock sgemm 70x1100x200", T.Sgemm(a=lay.put(lay.normal(70, 1100)), b=lay.put(lay.normal(1100, 200)),
                                             c=lay.slot(70 * 200 * 4), m=70, k=1100, n=200)),
        ("kblock sgemm_t 33x1030x40 ta tb", T.SgemmT(a=lay.put(lay.normal(1030, 33)), b=lay.put(lay.normal(40, 1030)),
                                                     c=lay.slot(33 * 40 * 4), m=33, k=1030, n=40, ta=True, tb=True)),
        ("kblock dgemm 9x700x17", T.Dgemm(a=lay.put(lay.normal(9, 700, dtype=np.float64)),
                                          b=lay.put(lay.normal(700, 17, dtype=np.float64)), c=lay.slot(9 * 17 * 8),
                                          m=9, k=700, n=17)),
        ("packed sgemm 520x600x1100", T.Sgemm(a=lay.put(lay.normal(520, 600)), b=lay.put(lay.normal(600, 1100)),
                                              c=lay.slot(520 * 1100 * 4), m=520, k=600, n=1100)),
        ("packed fused 512x1030x1024", T.FusedMmBiasAct(
            a=lay.put(lay.normal(512, 1030)), w=lay.put(lay.normal(1030, 1024) * 0.03), bias=lay.put(lay.normal(1024)),
            c=lay.slot(512 * 1024 * 4), m=512, k=1030, n=1024, act=Activation.Gelu)),
        # packed A micro-panels from a transposed A, a ragged last panel, f64, and a fused epilogue after
        # the last of several k-blocks of one row block
        # (more than gemm.B_IN_PLACE_MAX_ROWS rows, so B is packed too)
        ("packed sgemm_t 300x700x300 ta", T.SgemmT(a=lay.put(lay.normal(700, 300)), b=lay.put(lay.normal(700, 300)),
                                                   c=lay.slot(300 * 300 * 4), m=300, k=700, n=300, ta=True, tb=False)),
        ("packed dgemm 260x600x139", T.Dgemm(a=lay.put(lay.normal(260, 600, dtype=np.float64)),
                                             b=lay.put(lay.normal(600, 139, dtype=np.float64)),
                                             c=lay.slot(260 * 139 * 8), m=260, k=600, n=139)),
        ("packed fused 264x700x256", T.FusedMmBiasAct(
            a=lay.put(lay.normal(264, 700)), w=lay.put(lay.normal(700, 256) * 0.04), bias=lay.put(lay.normal(256)),
            c=lay.slot(264 * 256 * 4), m=264, k=700, n=256, act=Activation.Silu)),
        # either side of the in-place rule: ≤ 256 rows and B rows under 12 KiB read B in place, else packed
        ("in-place sgemm 256x40x3071", T.Sgemm(a=lay.put(lay.normal(256, 40)), b=lay.put(lay.normal(40, 3071)),
                                               c=lay.slot(256 * 3071 * 4), m=256, k=40, n=3071)),
        ("packed sgemm 100x40x3072", T.Sgemm(a=lay.put(lay.normal(100, 40)), b=lay.put(lay.normal(40, 3072)),
                                             c=lay.slot(100 * 3072 * 4), m=100, k=40, n=3072)),
        ("packed sgemm 257x40x200", T.Sgemm(a=lay.put(lay.normal(257, 40)), b=lay.put(lay.normal(40, 200)),
                                            c=lay.slot(257 * 200 * 4), m=257, k=40, n=200)),
        # more rows than one L2-sized row block: the first row block's tiles fill the packed B k-panel
        # that the later row blocks read (a ragged last panel)
        ("packed sgemm reused B", T.Sgemm(a=lay.put(lay.normal(REUSED_M, 160)), b=lay.put(lay.normal(160, 200)),
                                          c=lay.slot(REUSED_M * 200 * 4), m=REUSED_M, k=160, n=200)),
    ]


def parallel_cases(lay: Suite) -> list[tuple[str, object]]:
    """Shapes big enough that the IR tiles split their panels (or slices) across threads."""
    m, k, n = 64, 512, 200  # 4 panels (the last one ragged) of ≥ 2²¹ multiply-adds each
    return [
        ("parallel sgemm", T.Sgemm(a=lay.put(lay.normal(m, k)), b=lay.put(lay.normal(k, n)), c=lay.slot(m * n * 4),
                                   m=m, k=k, n=n)),
        ("parallel sgemm_t ta", T.SgemmT(a=lay.put(lay.normal(k, m)), b=lay.put(lay.normal(k, n)),
                                         c=lay.slot(m * n * 4), m=m, k=k, n=n, ta=True, tb=False)),
        ("parallel dgemm", T.Dgemm(a=lay.put(lay.normal(m, k, dtype=np.float64)),
                                   b=lay.put(lay.normal(k, n, dtype=np.float64)), c=lay.slot(m * n * 8), m=m, k=k, n=n)),
        ("parallel fused gelu", T.FusedMmBiasAct(a=lay.put(lay.normal(m, k)), w=lay.put(lay.normal(k, n) * 0.05),
                                                 bias=lay.put(lay.normal(n)), c=lay.slot(m * n * 4), m=m, k=k, n=n,
                                                 act=Activation.Gelu)),
        ("parallel batched", T.BatchedSgemm(a=lay.put(lay.normal(8, 64, 256)), b=lay.put(lay.normal(8, 256, 64)),
                                            c=lay.slot(8 * 64 * 64 * 4), batch=8, m=64, k=256, n=64,
                                            a_bcast=False, b_bcast=False)),
        ("parallel conv1x1", T.Conv2D1x1(src=lay.put(lay.normal(4, 256, 64)), weight=lay.put(lay.normal(64, 256)),
                                         dst=lay.slot(4 * 64 * 64 * 4), n=4, c_in=256, c_out=64, hw=64)),
    ]


@contextlib.contextmanager
def gemm_mode(mode: str) -> Iterator[None]:
    """Compile with `RLX_LLVM_GEMM=mode` ("auto": IR tiles where faster; "blas": every GEMM calls BLAS)."""
    old = os.environ.get(GEMM_MODE_ENV)
    os.environ[GEMM_MODE_ENV] = mode
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(GEMM_MODE_ENV)
        else:
            os.environ[GEMM_MODE_ENV] = old


def gemm_suite() -> Suite:
    """Every GEMM case in one arena whose outputs start as the NaN sentinel."""
    s = Suite(3, fill=SENTINEL)
    s.add_each(gemm_cases(s), how_to_compare)
    return s


SUITE = gemm_suite()


@pytest.fixture(scope="module", params=["auto", "blas"])
def mode(request) -> str:
    """The GEMM mode ("auto": IR tiles where faster; "blas": every GEMM calls BLAS)."""
    return request.param


@pytest.fixture(scope="module")
def built(mode: str) -> Outcome:
    """The suite compiled once per GEMM mode and run."""
    return SUITE.run(gemm_mode(mode))


@pytest.fixture(scope="module")
def built_blas() -> Outcome:
    return SUITE.run(gemm_mode("blas"))


def test_every_case_matches_the_float64_reference(built: Outcome) -> None:
    for name in SUITE.names:
        built.check(name)


def test_nothing_outside_the_outputs_changes(built: Outcome) -> None:
    built.check_untouched()


def test_thread_count_does_not_change_results(built: Outcome) -> None:
    """rlx_llvm's own GEMM tiles give the same bytes on 1 and 2 threads (OpenBLAS's cgemm, for one, does not)."""
    native = [name for name, row in zip(SUITE.names, built.program.report()) if row.path == "llvm"]
    built.check_thread_independent(native)


def test_k_zero_writes_zeros(built: Outcome) -> None:
    for c in SUITE.cases:
        if getattr(c.thunk, "k", None) == 0 and type(c.thunk).__name__ in ("Sgemm", "SgemmT", "Dgemm"):
            ext = c.thunk.writes()[0]
            assert not built.got[ext.offset:ext.offset + ext.nbytes].any(), c.name


def test_report_says_how_each_gemm_runs(built: Outcome, mode: str) -> None:
    """By default small real GEMMs run as IR tiles ("llvm"); complex and grouped GEMMs call BLAS."""
    paths = [row.path for row in built.program.report()]
    assert set(paths) <= {"llvm", "blas"}
    assert "blas" in {row.path for row in built.program.report() if row.kind == "CgemmC64"}
    if mode == "blas":  # every GEMM with work to do calls BLAS
        dims = ("m", "k", "n", "k_dim", "batch", "hw", "c_in", "c_out", "r")
        for t, row in zip((c.thunk for c in SUITE.cases), built.program.report()):
            if all(getattr(t, d, 1) for d in dims):
                assert row.path == "blas", row
    else:
        assert "llvm" in paths


def test_blas_calls_have_constant_dims(built_blas: Outcome) -> None:
    """The IR calls our prefixed symbols with dims stored as constants in entry-block slots."""
    ir_text = built_blas.thunk_ir("sgemm 1x17x1")
    assert 'call void @"rlx_sgemm"(' in ir_text and "store i32 17" in ir_text
    assert built_blas.program.llvm_ir().count('declare void @"rlx_sgemm"(') == 1


def test_large_ir_gemms_fork_rlx_threads(built: Outcome, mode: str) -> None:
    forks = {name: rlx_llvm.ir_emit.parallel.fork_symbol() in built.thunk_ir(name)
             for name in SUITE.names if name.startswith("parallel")}
    assert set(forks.values()) == {mode == "auto"}, forks


def test_wide_gemms_read_packed_micro_panels(built: Outcome, mode: str) -> None:
    """Once enough column panels reuse it (18 panels of 4 AVX-512 vectors here, 9 per thread when two split them), A is packed into
    register-tile micro-panels and the tiles read both operands packed (constant strides)."""
    ir_text = built.thunk_ir("packed sgemm 520x600x1100")
    assert ("rlx.pack_a.f32" in ir_text and ".packed" in ir_text) == (mode == "auto")


def test_the_reused_b_case_has_several_row_blocks() -> None:
    assert row_block(REUSED_M, 160 * 4, 6) < REUSED_M


def test_b_is_read_in_place_by_few_rows_of_short_b_rows(built: Outcome, mode: str) -> None:
    """At most 256 rows with B rows under 12 KiB read B where it is; more rows or longer rows of B
    pack it (the first row tile of a panel, a `.fillb` tile, writes the packed micro-panel)."""
    if mode != "auto":
        pytest.skip("BLAS mode: no IR tiles")
    packs = {name: ".fillb" in built.thunk_ir(name) for name in
             ("in-place sgemm 256x40x3071", "packed sgemm 100x40x3072", "packed sgemm 257x40x200")}
    assert packs == {"in-place sgemm 256x40x3071": False, "packed sgemm 100x40x3072": True,
                     "packed sgemm 257x40x200": True}


def test_by_default_real_gemms_run_as_ir_tiles() -> None:
    lay = Suite(fill=SENTINEL)
    t = T.Sgemm(a=lay.put(lay.normal(64, 64)), b=lay.put(lay.normal(64, 64)), c=lay.slot(64 * 64 * 4),
                m=64, k=64, n=64)
    c64 = T.CgemmC64(a=lay.put(lay.normal(4, 8)), b=lay.put(lay.normal(4, 8)), c=lay.slot(128), m=4, k=4, n=4)
    with gemm_mode("auto"):
        prog = rl.compile(rl.ThunkSchedule([t, c64], arena_bytes=lay.nbytes), cache=False)
    rows, vectors = register_tile(rl.jit.host().lanes(32))  # 6 × 4 with AVX-512, 6 × 2 with AVX2
    assert f'@"rlx.tile.f32.r{rows}.v{vectors}.whole"' in prog.llvm_ir(thunk=0) and "rlx_sgemm" not in prog.llvm_ir(thunk=0)
    assert 'call void @"rlx_cgemm"(' in prog.llvm_ir(thunk=1)


def test_ir_tiles_up_to_2048_cubed() -> None:
    """`IR_GEMM_MAX_MNK = 2048³`: a 2048³ GEMM runs as tiles, k = 2049 (just above) calls BLAS
    (compiled only: the arena is never allocated)."""
    shapes = [(2048, 2048, 2048), (2048, 2049, 2048)]
    lay = Suite(fill=SENTINEL)
    thunks = [T.Sgemm(a=lay.slot(4 * m * k), b=lay.slot(4 * k * n), c=lay.slot(4 * m * n), m=m, k=k, n=n)
              for m, k, n in shapes]
    with gemm_mode("auto"):
        prog = rl.compile(rl.ThunkSchedule(thunks, arena_bytes=lay.nbytes), cache=False)
    assert [r.path for r in prog.report()] == ["llvm", "blas"]


def test_repeat_runs_are_identical(built: Outcome) -> None:
    again = rl.Arena.from_bytes(built.before)
    built.program.run(again)
    built.program.run(again)
    assert np.array_equal(again.bytes, built.got)


def test_one_program_runs_from_two_threads_at_once(built: Outcome) -> None:
    """Scratch is per calling thread: concurrent runs on separate arenas give the single-run bytes."""
    arenas_ = [rl.Arena.from_bytes(built.before) for _ in range(2)]
    errors: list[BaseException] = []

    def work(a: rl.Arena) -> None:
        try:
            for _ in range(3):
                built.program.run(a)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(a,)) for a in arenas_]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    for a in arenas_:
        assert np.array_equal(a.bytes, built.got)


# ── no Python between native thunks ──────────────────────────────────────────

def _python_calls_during(prog: rl.Program, arena: rl.Arena) -> list[str]:
    calls: list[str] = []

    def profiler(frame, event, arg) -> None:
        if event == "call":
            calls.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(profiler)
    try:
        prog.run(arena)
    finally:
        sys.setprofile(None)
    return calls


def test_no_python_frame_runs_between_native_thunks() -> None:
    lay = Suite(5)
    a, b = lay.put(lay.normal(16, 16)), lay.put(lay.normal(16, 16))
    chain = [T.Sgemm(a=a, b=b, c=lay.slot(1024), m=16, k=16, n=16)]
    chain.append(T.SgemmT(a=chain[0].c, b=b, c=lay.slot(1024), m=16, k=16, n=16, ta=True, tb=False))
    chain.append(T.FusedMmBiasAct(a=chain[1].c, w=b, bias=a, c=lay.slot(1024), m=16, k=16, n=16, act=Activation.Gelu))
    chain.append(T.SgemmBf16(a=chain[2].c, b=lay.put(lay.half(HalfKind.Bf16, 16, 16)), c=lay.slot(1024),
                             m=16, k=16, n=16))
    chain.append(T.BatchedSgemm(a=chain[3].c, b=b, c=lay.slot(1024), batch=1, m=16, k=16, n=16,
                                a_bcast=False, b_bcast=False))
    arena = lay.arena()
    five = rl.compile(rl.ThunkSchedule(chain, arena_bytes=lay.nbytes), cache=False)
    one = rl.compile(rl.ThunkSchedule(chain[3:4], arena_bytes=lay.nbytes), cache=False)  # uses scratch too
    assert len(five.report()) == 5 and {r.path for r in five.report()} <= {"blas", "llvm"}
    five.run(arena)
    one.run(arena)  # first-use allocations (per-thread scratch) happen outside the profiled runs
    calls_five, calls_one = _python_calls_during(five, arena), _python_calls_during(one, arena)
    assert sorted(calls_five) == sorted(calls_one), "five native thunks must cost no more Python than one"
    setup = ("program.py:run", "program.py:_arena_bytes", "program.py:acquire", "program.py:_run_steps",
             "arena.py:nbytes", "arena.py:address")
    # what remains is Program.run's own set-up before the one native segment call: the arena and
    # scratch addresses (NumPy's `ndarray.ctypes` is Python code)
    assert all(c.endswith(setup) or "numpy/_core/_internal.py" in c for c in calls_five), calls_five
    assert sum(c.endswith("program.py:run") for c in calls_five) == 1
    assert sum(c.endswith("program.py:_run_steps") for c in calls_five) == 1


# ── run-time failures and validation ─────────────────────────────────────────

def test_out_of_range_expert_id_is_an_execution_error() -> None:
    lay = Suite(fill=SENTINEL)
    before = T.Sgemm(a=lay.put(lay.normal(2, 2)), b=lay.put(lay.normal(2, 2)), c=lay.slot(16), m=2, k=2, n=2)
    bad = T.GroupedMatMul(input=lay.put(lay.normal(3, 2)), weight=lay.put(lay.normal(2, 2, 2)),
                          expert_idx=lay.put(np.float32([0, 2, 1])), dst=lay.slot(24), m=3, k_dim=2, n=2,
                          num_experts=2, w_transposed=False)
    arena, expected = lay.arena(), lay.initial_bytes()
    ref.run_thunk(expected, before)
    prog = rl.compile(rl.ThunkSchedule([before, bad], arena_bytes=lay.nbytes), cache=False)
    with pytest.raises(ExecutionError) as info:
        prog.run(arena)
    assert (info.value.index, info.value.kind, info.value.status) == (1, "GroupedMatMul",
                                                                      Status.INDEX_OUT_OF_RANGE | 2 << 8)
    assert "index out of range (expert id of row 1)" in str(info.value)
    assert np.array_equal(arena.view(before.c, "f32", 4), expected[before.c:before.c + 16].view(np.float32))
    assert (arena.bytes[bad.dst:bad.dst + 24] == SENTINEL).all(), "the failing thunk writes nothing"


def test_out_of_range_codebook_code_is_an_execution_error() -> None:
    lay = Suite(fill=SENTINEL)
    bad = T.SynthMatMul(x=lay.put(lay.normal(2, 4)), indices=lay.put(np.uint8([0, 1, 3, 0])),
                        codebook=lay.put(lay.normal(3, 2)), dst=lay.slot(16), m=2, k=4, n=2, entry_dim=2,
                        num_entries=3)
    arena = lay.arena()
    with pytest.raises(ExecutionError) as info:
        rl.compile(rl.ThunkSchedule([bad], arena_bytes=lay.nbytes), cache=False).run(arena)
    assert info.value.status == Status.INDEX_OUT_OF_RANGE


@pytest.mark.parametrize("thunk, field, needle", [
    (T.Sgemm(a=0, b=2**40, c=2**42, m=1, k=1, n=2**31), "n", "2147483647"),
    (T.SgemmT(a=0, b=2**40, c=2**42, m=2**31, k=1, n=1, ta=True, tb=False), "m", "2147483647"),
    (T.BatchedSgemm(a=0, b=2**40, c=2**42, batch=2**20, m=2**12, k=1, n=1, a_bcast=False, b_bcast=True),
     "batch", "2147483647"),
    (T.SynthMatMul(x=0, indices=64, codebook=128, dst=192, m=1, k=6, n=1, entry_dim=4, num_entries=2),
     "entry_dim", "does not divide"),
    (T.SynthMatMul(x=0, indices=64, codebook=128, dst=192, m=1, k=4, n=1, entry_dim=0, num_entries=2),
     "entry_dim", "at least 1"),
    (T.GroupedMatMul(input=0, weight=64, expert_idx=128, dst=192, m=2, k_dim=1, n=1, num_experts=0,
                     w_transposed=False), "num_experts", "num_experts = 0"),
])
def test_dims_that_do_not_fit_are_validation_errors(thunk, field: str, needle: str) -> None:
    rl.limits.set_max_memory(2**47)  # the 64 TiB arena is only validated, never allocated
    try:
        with pytest.raises(ValidationError) as info:
            rl.compile(rl.ThunkSchedule([thunk], arena_bytes=2**46), cache=False)
    finally:
        rl.limits.set_max_memory(None)
    assert info.value.field == field and needle in str(info.value) and info.value.index == 0


def test_operands_past_the_arena_name_their_field() -> None:
    with pytest.raises(ValidationError) as info:
        rl.compile(rl.ThunkSchedule([T.Sgemm(a=4096, b=0, c=256, m=4, k=4, n=4)], arena_bytes=4096),
                   cache=False)
    assert info.value.field == "a" and "4096" in str(info.value)


@pytest.mark.parametrize("lanes, tile", [(4, (6, 2)), (8, (6, 2)), (16, (6, 4))])
def test_register_tile_fills_the_register_file(lanes: int, tile: tuple[int, int]) -> None:
    """6 rows × as many vectors as fit beside one B vector each and a broadcast: 16 registers on
    SSE/AVX2, 32 on AVX-512."""
    rows, vectors = register_tile(lanes)
    assert (rows, vectors) == tile
    assert rows * vectors + vectors + 1 <= (32 if lanes == 16 else 16)
