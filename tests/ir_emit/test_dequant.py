"""The `[k, n]` dequantizing GEMMs: DequantMatMul (Int8Block), DequantMatMulInt4, DequantMatMulFp8,
DequantMatMulNvfp4 and DequantMatMulMxFp4x2, all in one program.

* Decode, bit for bit: 1×1×n GEMMs with x = 1 and unit scales expose every code — all 256 bytes of
  both FP8 decoders, all 16 E2M1 nibbles in both nibble positions (NVFP4 and both MxFp4x2 planes), all
  256 E4M3 block-scale bytes — against `ml_dtypes` (and where RLX's decoder differs from the OCP
  one, exactly which codes differ).
* Against the references (f64 sums) for m ∈ {0, 1, 3, 4, 5, 9}, n ∈ {W − 1, W, W + 1, 2W + 1, 301}, k
  odd (a ragged last block; the nibble of a row straddling bytes), symmetric and asymmetric, blocks of
  1 and larger than k, some NVFP4 scale bytes NaN (→ 0); 1 and 2 threads give the same bytes.
* The decoded panels (m ≥ 2 unless the GEMV folds): slabs of k that split scale blocks, ragged slabs,
  panels plus a tail of columns, register tiles plus a remainder row.
* Against an independent decode written from the spec text with `ml_dtypes`' decoders plus a float64 matmul.
* The f16-conversion decoders (`lowp_floats.decode_via_f16`) equal the integer-bit ones for every code of
  every format they serve, and with them switched off the float cases give the same bytes.
* Bad input: block_size 0, group 0, no NVFP4 global scale, every buffer too short.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import ml_dtypes as md
import numpy as np
import pytest

from rlx_llvm import thunks as T
from rlx_llvm.ir_emit import lowp_floats as lp
from rlx_llvm.reference import dequant as ref
from rlx_llvm.reference.scaled import FORMATS, decode
from rlx_llvm.thunks.base import USIZE_MAX
from tests.harness import W, Kernel, Suite, assert_close, assert_same, expect_invalid, run_on_copy, suite_tests


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def spec_nibbles(packed: np.ndarray, count: int) -> np.ndarray:
    """Nibble `f` of the flat stream: byte `f // 2`, even `f` low, odd `f` high (semantics.md §3.8)."""
    f = np.arange(count)
    return (packed[f // 2].astype(np.int64) >> (4 * (f % 2))) & 15


def e2m1(codes: np.ndarray) -> np.ndarray:
    """ml_dtypes' float4_e2m1fn values of nibble codes, float64."""
    return np.asarray(codes, np.uint8).view(md.float4_e2m1fn).astype(np.float64)


def nvfp4_scale(codes: np.ndarray) -> np.ndarray:
    """OCP E4M3 (ml_dtypes' float8_e4m3fn) with the NaN codes decoded as 0 (semantics.md §2.11)."""
    s = np.asarray(codes, np.uint8).view(md.float8_e4m3fn).astype(np.float64)
    return np.where(np.isnan(s), 0.0, s)


def per_row(table: np.ndarray, k: int, rows_per_block: int) -> np.ndarray:
    """A `[blocks, n]` table repeated to one row per row of W."""
    return table[np.arange(k) // rows_per_block]


# ── the variants: draw a weight, return the thunk and W decoded from the spec text ──

@dataclass(frozen=True)
class Variant:
    """A kind with fixed options; `make(s, m, k, n, block, x, dst)` → (thunk, W as float64 `[k, n]`)."""

    name: str
    kind: type
    make: Callable


def int_variant(kind: type, asym: bool) -> Variant:
    def make(s: Suite, m: int, k: int, n: int, block: int, x: int, dst: int):
        blocks = cdiv(k, block)
        codes = (s.rng.integers(-128, 128, k * n).astype(np.int8) if kind is T.DequantMatMul
                 else s.rng.integers(0, 256, cdiv(k * n, 2)).astype(np.uint8))
        scale = s.rng.uniform(0.01, 0.1, (blocks, n)).astype(np.float32)
        zp = s.normal(blocks, n, scale=4.0, shift=0.0 if kind is T.DequantMatMul else 8.0)
        t = kind(x=x, w_q=s.put(codes, skew=1), scale=s.put(scale), zp=s.put(zp) if asym else 0, dst=dst,
                 m=m, k=k, n=n, block_size=block, is_asymmetric=asym)
        q = codes.astype(np.float64) if kind is T.DequantMatMul else spec_nibbles(codes, k * n)
        z = per_row(zp, k, block) if asym else 0.0
        return t, (q.reshape(k, n) - z) * per_row(scale, k, block)
    return Variant(f"{kind.__name__}-{'asym' if asym else 'sym'}", kind, make)


FP8_ML = {False: md.float8_e4m3, True: md.float8_e5m2}   # IEEE-like E4M3 (inf at S.1111.000) and E5M2
FINITE_BELOW = {False: 0x78, True: 0x7C}                 # the first magnitude code with an all-ones exponent


def fp8_variant(e5m2: bool) -> Variant:
    def make(s: Suite, m: int, k: int, n: int, block: int, x: int, dst: int):
        codes = (s.rng.integers(0, FINITE_BELOW[e5m2], k * n) | s.rng.integers(0, 2, k * n) << 7).astype(np.uint8)
        scale = s.rng.uniform(0.01, 0.1, n).astype(np.float32)
        t = T.DequantMatMulFp8(x=x, w_q=s.put(codes, skew=1), scale=s.put(scale), dst=dst, m=m, k=k, n=n, e5m2=e5m2)
        return t, codes.view(FP8_ML[e5m2]).astype(np.float64).reshape(k, n) * scale
    return Variant(f"Fp8-{'e5m2' if e5m2 else 'e4m3'}", T.DequantMatMulFp8, make)


def nvfp4_variant() -> Variant:
    def make(s: Suite, m: int, k: int, n: int, block: int, x: int, dst: int):
        codes = s.rng.integers(0, 256, cdiv(k * n, 2)).astype(np.uint8)
        scales = s.rng.integers(0x18, 0x50, (cdiv(k, 16), n)).astype(np.uint8)   # 2^−4 … 2^3
        scales.reshape(-1)[::17] = 0x7F                                           # some NaN codes: 0
        g = np.float32(0.37)
        t = T.DequantMatMulNvfp4(x=x, w_q=s.put(codes, skew=1), scale=s.put(scales, skew=3),
                                 global_scale=s.put(np.array([g])), dst=dst, m=m, k=k, n=n)
        return t, e2m1(spec_nibbles(codes, k * n)).reshape(k, n) * per_row(nvfp4_scale(scales), k, 16) * float(g)
    return Variant("Nvfp4", T.DequantMatMulNvfp4, make)


def mxfp4x2_variant() -> Variant:
    def make(s: Suite, m: int, k: int, n: int, block: int, x: int, dst: int):
        half = cdiv(k * n, 2)
        codes = s.rng.integers(0, 256, 2 * half).astype(np.uint8)
        scales = np.concatenate([s.rng.uniform(0.5, 1.0, (cdiv(k, block), n)),
                                 s.rng.uniform(0.01, 0.1, (cdiv(k, block), n))]).astype(np.float32)
        t = T.DequantMatMulMxFp4x2(x=x, w_q=s.put(codes, skew=1), scale=s.put(scales), dst=dst, m=m, k=k, n=n,
                                   group=block)
        s0, s1 = scales[:cdiv(k, block)], scales[cdiv(k, block):]
        q0, q1 = (e2m1(spec_nibbles(plane, k * n)).reshape(k, n) for plane in (codes[:half], codes[half:]))
        return t, q0 * per_row(s0, k, block) + q1 * per_row(s1, k, block)
    return Variant("MxFp4x2", T.DequantMatMulMxFp4x2, make)


VARIANTS = [int_variant(kind, asym) for kind in (T.DequantMatMul, T.DequantMatMulInt4) for asym in (False, True)]
VARIANTS += [fp8_variant(False), fp8_variant(True), nvfp4_variant(), mxfp4x2_variant()]
BLOCKED = [v for v in VARIANTS if v.kind in (T.DequantMatMul, T.DequantMatMulInt4, T.DequantMatMulMxFp4x2)]

SHAPES = [(1, 37, W - 1), (3, 37, W), (4, 37, W + 1), (5, 37, 2 * W + 1), (0, 37, W), (9, 131, 301)]
"""(m, k, n), blocks of 16: k = 37 leaves a ragged last block; 9×131×301 splits columns across threads."""

PANEL_SHAPES = [(7, 150, 4 * W + 3, 48), (6, 150, 8 * W + 2, 48)]
"""(m, k, n, block) for the decoded panels (m ≥ 2 where the folded GEMV does not serve): 150 rows are
slabs of 128 (AVX2) or 64 (AVX-512) with a ragged last one, blocks of 48 straddle slab boundaries (FP8's
one block spans them all, NVFP4's 16-row groups end ragged); a whole panel and a tail of columns, n odd
and even; 7 rows are AVX2's 6-row register tile and one row."""

GEMV_SHAPES = [(1, 131, 1030, 16), (3, 37, 8 * W + 6, 16), (4, 20, 4 * W + 2, 64), (2, 37, 6 * W + 2, 16)]
"""(m, k, n, block) for the folded GEMV (Int8, Int4 with n even; m ≤ 4): whole panels and a tail of
columns on AVX2 and AVX-512; 1×131×1030 splits its panels across threads."""

SPEC: dict[str, tuple[np.ndarray, np.ndarray]] = {}   # case → (x, W decoded from the spec text), float64


def add_gemm(s: Suite, v: Variant, m: int, k: int, n: int, block: int = 16) -> None:
    """A GEMM case of normal x; its tolerance is 1e-6 relative plus 1e-5·Σ|x·w| per output."""
    x = s.normal(m, k)
    dst, o = s.out(np.float32, m * n)
    t, w = v.make(s, m, k, n, block, s.put(x), dst)
    name = f"{v.name}-{m}x{k}x{n}-b{block}"
    SPEC[name] = x.astype(np.float64), w
    s.add(name, t, [o], atol=1e-5 * (np.abs(x.astype(np.float64)) @ np.abs(w)).reshape(-1))


# ── every code through a 1×1×n GEMM: x = 1, unit scales ─────────────────────

BOTH_POSITIONS = np.array([i | (15 - i) << 4 for i in range(16)], np.uint8)   # nibbles 0, 15, 1, 14, …
"""16 bytes whose 32 nibbles hold every code once in the low and once in the high position."""


def decode_cases(s: Suite) -> dict[str, np.ndarray]:
    """Add the decode cases; returns each one's expected output from ml_dtypes."""
    one = s.put(np.ones(1, np.float32))
    want = {}

    def add(name: str, thunk_of: Callable[[int], object], expected: np.ndarray) -> None:
        dst, o = s.out(np.float32, expected.size)
        s.add(name, thunk_of(dst), [o], exact=True, zero_sign=False)   # the sum starts at +0: −0 shows as +0
        want[name] = expected.astype(np.float32)

    every_byte = np.arange(256, dtype=np.uint8)
    for e5m2, ml in FP8_ML.items():
        w_q, scale = s.put(every_byte), s.put(np.ones(256, np.float32))
        add(f"decode-fp8-{'e5m2' if e5m2 else 'e4m3'}",
            lambda dst: T.DequantMatMulFp8(x=one, w_q=w_q, scale=scale, dst=dst, m=1, k=1, n=256, e5m2=e5m2),
            every_byte.view(ml).astype(np.float32))
    w_q, scale = s.put(BOTH_POSITIONS), s.put(np.full(32, 0x38, np.uint8))    # E4M3 0x38 = 1
    add("decode-nvfp4-nibbles",
        lambda dst: T.DequantMatMulNvfp4(x=one, w_q=w_q, scale=scale, global_scale=one, dst=dst, m=1, k=1, n=32),
        e2m1(spec_nibbles(BOTH_POSITIONS, 32)))
    w_q, scale = s.put(np.full(128, 0x22, np.uint8)), s.put(every_byte)        # E2M1 2 = 1
    add("decode-nvfp4-scales",
        lambda dst: T.DequantMatMulNvfp4(x=one, w_q=w_q, scale=scale, global_scale=one, dst=dst, m=1, k=1, n=256),
        nvfp4_scale(every_byte))
    planes = np.concatenate([BOTH_POSITIONS, BOTH_POSITIONS[::-1]])
    w_q, scale = s.put(planes), s.put(np.concatenate([np.ones(32), np.full(32, 2.0 ** -8)]).astype(np.float32))
    add("decode-mxfp4x2-planes",   # q0 + q1/256: both planes recoverable, the sum exact
        lambda dst: T.DequantMatMulMxFp4x2(x=one, w_q=w_q, scale=scale, dst=dst, m=1, k=1, n=32, group=1),
        e2m1(spec_nibbles(planes[:16], 32)) + e2m1(spec_nibbles(planes[16:], 32)) / 256)
    return want


def build() -> tuple[Suite, dict[str, np.ndarray]]:
    s = Suite(12, rtol=1e-6)
    decoded = decode_cases(s)
    for v in VARIANTS:
        for m, k, n in SHAPES if not v.name.endswith("-sym") else SHAPES[1:2]:   # sym: asym without zp
            add_gemm(s, v, m, k, n)
    for v in BLOCKED:
        if not v.name.endswith("-sym"):
            add_gemm(s, v, 2, 5, 9, block=1)          # one row per block
            add_gemm(s, v, 4, 20, 3, block=64)        # one partial block, n below a vector
    add_gemm(s, fp8_variant(False), 2, 1, 5)      # k = 1
    for v in VARIANTS:
        if not v.name.endswith("-sym"):
            for m, k, n, block in PANEL_SHAPES:
                add_gemm(s, v, m, k, n, block)
    for v in VARIANTS[:4]:                        # Int8 and Int4, sym and asym
        for m, k, n, block in GEMV_SHAPES if v.name.endswith("-asym") else GEMV_SHAPES[-1:]:
            add_gemm(s, v, m, k, n, block)
    return s, decoded


SUITE, DECODED = build()
(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


def folds(t) -> bool:
    """Whether the folded GEMV serves `t`: Int8, or Int4 with n even, at 1 ≤ m ≤ 4."""
    int8, int4 = isinstance(t, T.DequantMatMul), isinstance(t, T.DequantMatMulInt4)
    return (int8 or int4 and t.n % 2 == 0) and 1 <= t.m <= 4


def cases_with(outcome, label: str) -> set[str]:
    """The cases whose IR has a loop block named `label`."""
    return {c.name for i, c in enumerate(SUITE.cases) if f"{label}.header:" in outcome.program.llvm_ir(thunk=i)}


def test_gemv_cases_take_the_folded_path(outcome) -> None:
    """The folded GEMV (its block-outer panel loop) serves exactly Int8 and even-n Int4 with 1 ≤ m ≤ 4,
    the GEMV cases among them."""
    assert cases_with(outcome, "panel") == {c.name for c in SUITE.cases if folds(c.thunk)}


def test_other_cases_from_two_rows_take_the_decoded_panels(outcome) -> None:
    """The decoded panels (their slab loop) serve exactly the cases with m ≥ 2 and k ≥ 1 that do not fold,
    the panel cases among them."""
    panels = {c.name for c in SUITE.cases if c.thunk.m >= 2 and c.thunk.k >= 1 and not folds(c.thunk)}
    shapes = [f"-{m}x{k}x{n}-b{block}" for m, k, n, block in PANEL_SHAPES]
    panel_cases = {c.name for c in SUITE.cases if any(c.name.endswith(shape) for shape in shapes)}
    assert cases_with(outcome, "slab") == panels and len(panel_cases) == 12 and panel_cases <= panels


@pytest.mark.parametrize("case", sorted(DECODED))
def test_decode_matches_ml_dtypes(outcome, case: str) -> None:
    """Every code decodes to ml_dtypes' value bit for bit (any NaN for NaN; ±0 alike, see decode_cases)."""
    assert_same(outcome.output(case), DECODED[case], zero_sign=False, what=case)


def test_rlx_e4m3_differs_from_ocp_only_at_exponent_15(outcome) -> None:
    """DequantMatMulFp8's IEEE-like E4M3 is OCP E4M3FN except S.1111.mmm: ±inf at mmm = 0, NaN otherwise."""
    got = outcome.output("decode-fp8-e4m3")
    ocp = np.arange(256, dtype=np.uint8).view(md.float8_e4m3fn).astype(np.float32)
    differ = np.flatnonzero(~((got == ocp) | (np.isnan(got) & np.isnan(ocp))))
    assert differ.tolist() == [*range(0x78, 0x7F), *range(0xF8, 0xFF)]
    assert got[0x78] == np.inf and got[0xF8] == -np.inf and np.isnan(got[[0x79, 0x7F, 0xF9, 0xFF]]).all()


def test_nvfp4_scale_nan_codes_decode_to_zero(outcome) -> None:
    """The block scale is OCP E4M3 except its two NaN codes, which scale by 0."""
    got = outcome.output("decode-nvfp4-scales")
    ocp = np.arange(256, dtype=np.uint8).view(md.float8_e4m3fn).astype(np.float32)
    assert np.flatnonzero(np.isnan(ocp)).tolist() == [0x7F, 0xFF]
    assert got[0x7F] == 0 and got[0xFF] == 0
    assert_same(np.delete(got, [0x7F, 0xFF]), np.delete(ocp, [0x7F, 0xFF]), what="finite scale bytes")


@pytest.mark.parametrize("case", sorted(SPEC))
def test_matches_spec_decode(outcome, case: str) -> None:
    """The output against W decoded element by element from the spec text (ml_dtypes' decoders), float64 matmul."""
    x, w = SPEC[case]
    t = outcome.case(case).thunk
    got = outcome.output(case).reshape(t.m, t.n)
    assert_close(got, x @ w, rtol=1e-5, atol=1e-5 * np.abs(x) @ np.abs(w), what=case)


def test_integer_decoders_give_the_same_bytes(outcome, monkeypatch) -> None:
    """With the f16 conversion path switched off (hosts without F16C), the integer-bit decoders give
    byte-identical outputs: every decode case and the threaded case of each float kind."""
    host_converts = lp.f16_decodes(FORMATS["F4E2M1"])
    monkeypatch.setattr(lp, "f16_decodes", lambda f: False)
    keep = [c.name for c in SUITE.cases if c.name.startswith("decode") or
            c.name.split("-9x131x301")[0] in ("Fp8-e4m3", "Fp8-e5m2", "Nvfp4", "MxFp4x2")]
    assert len(keep) == 9
    program = SUITE.subset(lambda c: c.name in keep).compile()
    assert " half" not in program.llvm_ir() and (" half" in outcome.program.llvm_ir()) == host_converts
    got = run_on_copy(program, outcome.before)
    for name in keep:
        assert_same(outcome.output(name, arena=got), outcome.output(name), what=name)


class Builder:
    """What `lowp_floats` needs of an EmitContext in a bare kernel: the builder."""

    def __init__(self, b) -> None:
        self.b = b


@pytest.mark.parametrize("name", [*FORMATS, "RLX-E4M3"])
def test_decode_via_f16_matches_decode(jit, name: str) -> None:
    """`decode_via_f16` gives `decode`'s value for every code of every format it serves (E5M2 FNUZ, whose
    exponent 31 is finite, is not served), in vectors and in scalars."""
    f = ref.RLX_E4M3 if name == "RLX-E4M3" else FORMATS[name]
    if not lp.f16_decodes(f):
        assert name == "F8E5M2Fnuz" or "+f16c" not in lp.jit.host().features.split(",")
        return
    kernel = Kernel(f"via_f16_{name}", lambda b, code: lp.decode_via_f16(Builder(b), f, code), ins=("bool",))
    every_byte = np.arange(256, dtype=np.uint8)
    got = jit.build(f"dequant_via_f16_{name}", [kernel])[kernel.name](every_byte)
    assert_same(got, decode(f, every_byte), what=name)


def test_nibble_order_hand_example() -> None:
    """Byte 0x21 holds element 0 = 1 (low nibble) and element 1 = 2; 0xF0 holds 0 then 15."""
    t = T.DequantMatMulInt4(x=0, w_q=0, scale=0, zp=0, dst=0, m=1, k=2, n=2, block_size=2, is_asymmetric=False)
    assert ref.int4_codes(np.array([0x21, 0xF0], np.uint8), t).tolist() == [1, 2, 0, 15]


def test_threaded_cases_hold_every_code_value() -> None:
    """The 131·301 codes of the threaded cases hold every i8 value, every nibble, every finite FP8 code."""
    arena = SUITE.initial_bytes()
    expected = {"DequantMatMul-asym": 256, "DequantMatMulInt4-asym": 16, "Fp8-e4m3": 240, "Fp8-e5m2": 248,
                "Nvfp4": 16, "MxFp4x2": 16}
    for prefix, values in expected.items():
        t = next(c.thunk for c in SUITE.cases if c.name.startswith(f"{prefix}-9x131x301"))
        if isinstance(t, T.DequantMatMul):
            codes = ref.int8_codes(arena, t)
        elif isinstance(t, T.DequantMatMulFp8):
            codes = arena[t.w_q:t.w_q + t.k * t.n]
        else:   # nibbles (plane 0 of MxFp4x2)
            codes = ref.nibbles(arena, t.w_q, t.k * t.n)
        assert len(np.unique(codes)) == values, prefix


# ── bad input ────────────────────────────────────────────────────────────────

FIELDS = {   # m = 2, k = 10, n = 3, blocks of 4 (3 block rows); x at 0, w_q 1024, scale 2048, third 3072, dst 4096
    T.DequantMatMul: dict(zp=3072, block_size=4, is_asymmetric=True),
    T.DequantMatMulInt4: dict(zp=3072, block_size=4, is_asymmetric=True),
    T.DequantMatMulFp8: dict(e5m2=False),
    T.DequantMatMulNvfp4: dict(global_scale=3072),
    T.DequantMatMulMxFp4x2: dict(group=4),
}
NEEDED = {   # bytes each buffer needs, from the spec's layouts
    T.DequantMatMul: {"w_q": 30, "scale": 36, "zp": 36},
    T.DequantMatMulInt4: {"w_q": 15, "scale": 36, "zp": 36},
    T.DequantMatMulFp8: {"w_q": 30, "scale": 12},
    T.DequantMatMulNvfp4: {"w_q": 15, "scale": 3, "global_scale": 4},   # one 16-row group of E4M3 bytes
    T.DequantMatMulMxFp4x2: {"w_q": 30, "scale": 72},                   # two planes each
}


def thunk(kind: type, **changes):
    """The FIELDS layout of `kind`, with `changes`."""
    fields = dict(x=0, w_q=1024, scale=2048, dst=4096, m=2, k=10, n=3) | FIELDS[kind]
    return kind(**(fields | changes))


@pytest.mark.parametrize("kind", [T.DequantMatMul, T.DequantMatMulInt4])
def test_block_size_zero_is_refused(kind: type) -> None:
    expect_invalid(thunk(kind, block_size=0), 8192, "block_size", "at least 1")


def test_absent_global_scale_is_refused() -> None:
    """NVFP4's global scale is a buffer the thunk always reads (a model without one stores 1.0)."""
    expect_invalid(thunk(T.DequantMatMulNvfp4, global_scale=USIZE_MAX), 8192, "global_scale", "usize::MAX")


def test_group_zero_is_refused() -> None:
    expect_invalid(thunk(T.DequantMatMulMxFp4x2, group=0), 8192, "group", "at least 1")


@pytest.mark.parametrize("kind, field", [(kind, field) for kind, needs in NEEDED.items() for field in needs],
                         ids=lambda v: getattr(v, "__name__", v))
def test_buffer_too_short_is_refused(kind: type, field: str) -> None:
    """The buffer placed last, at 6000, with an arena one byte short of what it needs."""
    moved = dict(dst=0, x=1024, w_q=2048, scale=3072) | {f: 4096 for f in ("zp", "global_scale") if f in FIELDS[kind]}
    expect_invalid(thunk(kind, **(moved | {field: 6000})), 6000 + NEEDED[kind][field] - 1, field)
