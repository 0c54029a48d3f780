"""DequantMatMul (Int8Block) and DequantMatMulInt4.

* Against the references (f64 sums) for m in {1, 3, 17}, k not a multiple of the block (a partial last
  block), odd n (a vector tail and, for Int4, an odd element count so the last byte is half used),
  symmetric and asymmetric, blocks of 1 and larger than k, every code value; all in one program.
* Against an independent element-by-element decode of the spec's rule plus a float64 matmul.
* Bad input: block_size 0, a scale / zp / w_q buffer too short.
"""
from __future__ import annotations

import numpy as np
import pytest

from rlx_llvm import thunks as T
from rlx_llvm.reference import dequant as ref
from tests.harness import Suite, assert_close, expect_invalid, suite_tests

KINDS = (T.DequantMatMul, T.DequantMatMulInt4)


def random_codes(kind: type, k: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Every i8 value, or every byte (so every nibble in both positions)."""
    if kind is T.DequantMatMul:
        return rng.integers(-128, 128, k * n).astype(np.int8)
    return rng.integers(0, 256, -(-k * n // 2)).astype(np.uint8)


def spec_weights(t, codes: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    """`w[p, j] = (q − z)·s` element by element, straight from semantics.md §3.8 (float64)."""
    w = np.empty((t.k, t.n))
    for p in range(t.k):
        for j in range(t.n):
            f = p * t.n + j
            if isinstance(t, T.DequantMatMul):
                q = int(codes[f])
            else:
                q = (int(codes[f // 2]) >> (4 * (f % 2))) & 15
            s, z = float(scale[p // t.block_size, j]), float(zp[p // t.block_size, j]) if t.is_asymmetric else 0.0
            w[p, j] = (q - z) * s
    return w


def add_case(s: Suite, kind: type, m: int, k: int, n: int, block: int, asym: bool) -> str:
    """A case with normal x, positive scales and zero points around the codes' middle; returns its name."""
    blocks = -(-k // block)
    x, codes = s.normal(m, k), random_codes(kind, k, n, s.rng)
    scale = s.rng.uniform(0.01, 0.1, (blocks, n)).astype(np.float32)
    zp = s.normal(blocks, n, scale=4.0, shift=0.0 if kind is T.DequantMatMul else 8.0)
    dst, o = s.out(np.float32, m * n)
    t = kind(x=s.put(x), w_q=s.put(codes, skew=1), scale=s.put(scale), zp=s.put(zp) if asym else 0, dst=dst,
             m=m, k=k, n=n, block_size=block, is_asymmetric=asym)
    magnitude = np.abs(x.astype(np.float64)) @ np.abs(spec_weights(t, codes, scale, zp))
    name = f"{kind.__name__}-{'asym' if asym else 'sym'}-{m}x{k}x{n}-b{block}"
    s.add(name, t, [o], atol=1e-5 * magnitude.reshape(-1))
    return name


def build() -> Suite:
    s = Suite(12, rtol=1e-6)   # plus 1e-5·Σ|x·w| per output: f32 sums in another order
    for kind in KINDS:
        for asym in (False, True):
            for m in (1, 3, 17):
                add_case(s, kind, m, 37, 7, 16, asym)
            add_case(s, kind, 2, 5, 9, 1, asym)          # one row per block
            add_case(s, kind, 4, 20, 3, 64, asym)        # one partial block, n below a vector
        add_case(s, kind, 5, 33, 301, 8, True)           # column panels split across threads
    return s


SUITE = build()
(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


@pytest.mark.parametrize("case", [c.name for c in SUITE.cases if "x7-" in c.name or "x301" in c.name])
def test_matches_element_by_element_decode(outcome, case: str) -> None:
    t = outcome.case(case).thunk
    arena = outcome.before
    blocks = -(-t.k // t.block_size)

    def f32s(offset: int, count: int) -> np.ndarray:
        return arena[offset:offset + 4 * count].view(np.float32)

    nbytes = t.k * t.n if isinstance(t, T.DequantMatMul) else -(-t.k * t.n // 2)
    codes = arena[t.w_q:t.w_q + nbytes].view(np.int8 if isinstance(t, T.DequantMatMul) else np.uint8)
    scale = f32s(t.scale, blocks * t.n).reshape(blocks, t.n)
    zp = f32s(t.zp, blocks * t.n).reshape(blocks, t.n) if t.is_asymmetric else None
    w = spec_weights(t, codes, scale, zp)
    x = f32s(t.x, t.m * t.k).reshape(t.m, t.k).astype(np.float64)
    got = outcome.output(case).reshape(t.m, t.n)
    assert_close(got, x @ w, rtol=1e-5, atol=1e-5 * np.abs(x) @ np.abs(w), what=case)


def test_nibble_order_hand_example() -> None:
    """Byte 0x21 holds element 0 = 1 (low nibble) and element 1 = 2; 0xF0 holds 0 then 15."""
    t = T.DequantMatMulInt4(x=0, w_q=0, scale=0, zp=0, dst=0, m=1, k=2, n=2, block_size=2, is_asymmetric=False)
    assert ref.int4_codes(np.array([0x21, 0xF0], np.uint8), t).tolist() == [1, 2, 0, 15]


def test_cases_hold_every_code_value() -> None:
    """The threaded case's 33·301 codes hold every i8 value, and every nibble (low and high)."""
    for kind, values in ((T.DequantMatMul, 256), (T.DequantMatMulInt4, 16)):
        case = next(c for c in SUITE.cases if c.name.startswith(f"{kind.__name__}-asym-5x33x301"))
        t = case.thunk
        arena = SUITE.initial_bytes()
        codes = (ref.int8_codes(arena, t) if kind is T.DequantMatMul else ref.int4_codes(arena, t))
        assert len(np.unique(codes)) == values


# ── bad input ────────────────────────────────────────────────────────────────

def thunk(kind: type, **changes):
    """m = 2, k = 10, n = 3, blocks of 4 (3 block rows): x at 0, w_q at 1024, scale 2048, zp 3072, dst 4096."""
    fields = dict(x=0, w_q=1024, scale=2048, zp=3072, dst=4096, m=2, k=10, n=3, block_size=4, is_asymmetric=True)
    return kind(**(fields | changes))


@pytest.mark.parametrize("kind", KINDS)
def test_block_size_zero_is_refused(kind: type) -> None:
    expect_invalid(thunk(kind, block_size=0), 8192, "block_size", "at least 1")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("field", ["scale", "zp", "w_q"])
def test_buffer_too_short_is_refused(kind: type, field: str) -> None:
    """scale and zp need 3·3 f32 = 36 bytes: the buffer placed last, with an arena one byte short."""
    t = thunk(kind, **(dict(dst=0, x=1024, w_q=2048, scale=3072, zp=4096) | {field: 6000}))
    needed = {"scale": 36, "zp": 36, "w_q": 30 if kind is T.DequantMatMul else 15}[field]
    expect_invalid(t, 6000 + needed - 1, field)
