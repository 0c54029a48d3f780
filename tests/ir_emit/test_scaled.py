"""Scaled low-precision kinds against their NumPy references and against `ml_dtypes`, all in one program.

Every code of every format is decoded; every format encodes a dense grid of f32s over its whole
range plus every representable value, every tie point between neighbours and the f32s one ulp
either side of it, ±0, denormals, ±inf and NaN.  The compiled codecs must agree bit for bit with
`ml_dtypes` (encode: on inputs clipped to ±max, since RLX saturates; NaN → code 0).
"""
from __future__ import annotations

import dataclasses

import ml_dtypes as md
import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import reference as reference_registry
from rlx_llvm import thunks as T
from rlx_llvm.errors import ExecutionError
from rlx_llvm.kernels.blas import Status
from rlx_llvm.ops import ScaledFormat as F, ScaleLayout as L
from rlx_llvm.thunks.quant import scale_bytes
from rlx_llvm.reference.scaled import (FORMATS, Minifloat, block_of, decode, decode_scales, e8m0_decode, e8m0_encode_up,
                                       minifloat)
from tests.harness import NAN_FILL, F32_SPECIALS, W, Suite, assert_close, assert_same, expect_invalid, suite_tests

ML_DTYPES = {"F8E4M3": md.float8_e4m3fn, "F8E5M2": md.float8_e5m2, "F8E4M3Fnuz": md.float8_e4m3fnuz,
             "F8E5M2Fnuz": md.float8_e5m2fnuz, "F6E2M3": md.float6_e2m3fn, "F6E3M2": md.float6_e3m2fn,
             "F4E2M1": md.float4_e2m1fn}
CUSTOM = F.Custom(exp_bits=3, mant_bits=4, bias=3)
LAYOUTS = (L.PerTensor, L.BlockMxE8M0(block=32), L.BlockMxE8M0(block=W + 3), L.Nvfp4(group=16), L.Nvfp4(group=5))
SHAPES = ((1, 1), (3, W - 1), (4, 45), (2, 2 * W + 3), (37, 1031))   # vector tails, short last blocks, threads


def encode_grid(f: Minifloat) -> np.ndarray:
    """Both signs of: 4096 mantissas per binade over the format's range, every value, every tie ± 1 ulp, specials."""
    lo, hi = f.min_normal_exp - f.mant_bits - 2, int(np.log2(f.max_finite)) + 2
    exps = np.arange(lo, hi + 1) + 127
    grid = ((exps[:, None] << 23) | (np.arange(4096) << 11)[None, :]).reshape(-1).astype(np.uint32).view(np.float32)
    mags = f.magnitudes.astype(np.float64)
    ties = ((mags[1:] + mags[:-1]) / 2).astype(np.float32)
    points = np.concatenate([ties, f.magnitudes, [f.max_finite * 1.0625]]).astype(np.float32)
    near = np.concatenate([points, np.nextafter(points, np.float32(np.inf)), np.nextafter(points, np.float32(0))])
    pos = np.concatenate([grid, near, np.float32([0, 1e-45, 1e-40, 3e38, np.inf])]).astype(np.float32)
    return np.concatenate([pos, -pos, np.float32([np.nan, -np.nan])])


def ml_encode(name: str, x: np.ndarray) -> np.ndarray:
    """ml_dtypes' codes of `x` clipped to ±max (RLX saturates), NaN → 0."""
    f = FORMATS[name]
    codes = np.clip(x, -f.max_finite, f.max_finite).astype(ML_DTYPES[name]).view(np.uint8)
    return np.where(np.isnan(x), 0, codes).astype(np.uint8)


def all_codes(f: Minifloat) -> np.ndarray:
    """Every code of the format, as bytes."""
    return np.arange(2 << f.sign_shift, dtype=np.uint8)


def scale_values(s: Suite, layout, rows: int, cols: int) -> np.ndarray:
    """Valid scales of `layout`: an f32, E8M0 bytes near 2^0 (and 0x00, 0xFF), or E4M3 codes (with 0 and NaN)."""
    n = scale_bytes(layout, rows, cols)
    if layout.name == "PerTensor":
        return np.float32([s.rng.uniform(0.1, 3.0)])
    lo, hi, specials = (118, 138, (0, 255)) if layout.name == "BlockMxE8M0" else (0x20, 0x60, (0, 0x7F))
    v = s.rng.integers(lo, hi, n).astype(np.uint8)
    v[: min(n, 2)] = specials[: min(n, 2)] if n > 8 else v[: min(n, 2)]
    return v


def quant_input(s: Suite, rows: int, cols: int) -> np.ndarray:
    """Normals of varied magnitude with the f32 specials sprinkled in."""
    x = s.normal(rows * cols) * np.exp2(s.rng.integers(-6, 8, rows * cols)).astype(np.float32)
    x[:: 7][: F32_SPECIALS.size] = F32_SPECIALS[: x[:: 7].size]
    return x


# ── the cases ───────────────────────────────────────────────────────────────

def build() -> Suite:
    s = Suite(11)
    one = s.put(np.float32([1.0]))
    for name, f in FORMATS.items():
        fmt = getattr(F, name)
        codes = all_codes(f)
        dst, o = s.out(np.float32, codes.size)
        s.add(f"exhaustive-decode-{name}", T.ScaledDequantize(codes=s.put(codes), scale=one, dst=dst, rows=1,
                                                              cols=codes.size, fmt=fmt, layout=L.PerTensor), [o])
        x = encode_grid(f)
        dst, o = s.out(np.uint8, x.size)
        s.add(f"exhaustive-encode-{name}", T.ScaledQuantize(x=s.put(x), scale=one, dst=dst, rows=1, cols=x.size,
                                                            fmt=fmt, layout=L.PerTensor), [o])
    formats = (F.F8E4M3, F.F8E5M2Fnuz, F.F4E2M1, CUSTOM)
    for i, layout in enumerate(LAYOUTS):        # every layout with two formats, every format with 2-3 layouts
        for fmt in formats[i % 2::2]:           # (the exhaustive cases above cover every code of every format)
            for rows, cols in SHAPES:
                shape = dict(rows=rows, cols=cols, fmt=fmt, layout=layout)
                tag = f"{fmt!r}-{layout!r}-{rows}x{cols}"
                x = s.put(quant_input(s, rows, cols))
                s.add(f"ScaledQuantScale-{tag}", T.ScaledQuantScale(x=x, dst=s.slot(scale_bytes(layout, rows, cols)),
                                                                    **shape))
                scale = s.put(scale_values(s, layout, rows, cols))
                s.add(f"ScaledQuantize-{tag}", T.ScaledQuantize(x=x, scale=scale, dst=s.slot(rows * cols), **shape))
                codes = s.put(s.rng.integers(0, 256, rows * cols).astype(np.uint8))
                s.add(f"ScaledDequantize-{tag}", T.ScaledDequantize(codes=codes, scale=scale,
                                                                    dst=s.slot(4 * rows * cols), **shape),
                      dtype=np.float32)
    add_matmuls(s)
    add_grouped(s)
    return s


MATMUL_SHAPES = ((1, 64, 37), (5, 45, 19), (13, 300, 70), (1, 1, 1), (4, 0, 5), (7, 1031, 2 * W + 3),
                 (16, 512, 300))   # the last splits its column panels across threads
MATMUL_FORMATS = ((F.F8E4M3, F.F8E4M3), (F.F8E5M2, F.F4E2M1), (CUSTOM, F.F6E2M3), (F.F8E4M3Fnuz, F.F8E5M2Fnuz))


def finite_codes(s: Suite, fmt, count: int) -> np.ndarray:
    """Random finite codes of both signs."""
    f = minifloat(fmt)
    return (s.rng.integers(0, f.max_code + 1, count) | (s.rng.integers(0, 2, count) << f.sign_shift)).astype(np.uint8)


def dequantized(fmt, layout, codes: np.ndarray, scales: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """`decode(code)·scale` of test inputs (for the error bound)."""
    sc = decode_scales(layout, scales.reshape(-1).view(np.uint8))
    block = block_of(layout, cols)
    per = np.repeat(sc.reshape(rows, -(-cols // block)), block, axis=1)[:, :cols] if layout.name != "PerTensor" \
        else sc[0]
    return decode(minifloat(fmt), codes).reshape(rows, cols).astype(np.float64) * per


def add_matmul(s: Suite, lf, rf, layout, m: int, k: int, n: int, has_bias: bool) -> None:
    """One ScaledMatMul case on random finite codes, compared within f32 rounding of Σ|a·b|."""
    lhs, rhs = finite_codes(s, lf, m * k), finite_codes(s, rf, n * k)
    ls, rs = scale_values(s, layout, m, k), scale_values(s, layout, n, k)
    if layout.name != "PerTensor":
        ls[(ls == 0xFF) | (ls == 0x7F)], rs[(rs == 0xFF) | (rs == 0x7F)] = 127, 0x38
    bias = s.normal(n)
    a, w = dequantized(lf, layout, lhs, ls, m, k), dequantized(rf, layout, rhs, rs, n, k)
    bound = 1e-6 * (k + 2) * (np.abs(a) @ np.abs(w).T + np.abs(bias)).reshape(-1) + 1e-30
    dst, o = s.out(np.float32, m * n)
    t = T.ScaledMatMul(lhs=s.put(lhs), rhs=s.put(rhs), lhs_scale=s.put(ls), rhs_scale=s.put(rs), bias=s.put(bias),
                       dst=dst, m=m, k=k, n=n, lhs_fmt=lf, rhs_fmt=rf, layout=layout, has_bias=has_bias)
    s.add(f"ScaledMatMul-{lf!r}-{rf!r}-{layout!r}-{m}x{k}x{n}-bias{int(has_bias)}", t, [o],
          compare=lambda g, w_, bound=bound: assert_close(g, w_, 0.0, bound))


def add_matmuls(s: Suite) -> None:
    """ScaledMatMul per format pair, layout and shape (tails, short blocks, several k-chunks; bias on alternate
    pairs), and an m = 1 product big enough to split its weight rows across threads."""
    for i, ((lf, rf), layout) in enumerate(zip(MATMUL_FORMATS * 2, LAYOUTS + (L.BlockMxE8M0(block=7),) * 3)):
        for j, (m, k, n) in enumerate(MATMUL_SHAPES):
            if (i + j) % 2 == 0:                # each shape under four of the eight format/layout pairs
                add_matmul(s, lf, rf, layout, m, k, n, has_bias=i % 2 == 0)
    add_matmul(s, F.F8E4M3, F.F8E5M2, L.BlockMxE8M0(block=32), 1, 2048, 2051, has_bias=True)


GROUPED = (   # m, k, n, experts, ids (None: interleaved, each row's id ≡ its row mod experts), per-expert twins
    (0, 45, 19, 3, None, False),                      # no rows
    (1, 64, 37, 4, [2.0], False),                     # one row, three experts unused
    (3, 45, 19, 3, [1.0, 1.0, 1.0], False),           # every row one expert
    (5, W + 3, 2 * W + 3, 2, [1.0, -0.0, 1.0, 0.0, 1.0], False),     # −0.0 is expert 0
    (7, 300, 70, 3, None, True),                      # several k-chunks, a ragged column panel
    (13, 2 * W + 3, W - 1, 4, None, True),            # every remainder tile size
    (3, 0, 5, 2, [1.0, 0.0, 1.0], False),             # k = 0: dst is the bias
    (4, 300, 70, 4, [3.0, 0.0, 3.0, 1.0], True),      # experts of one row (a GEMV per panel) and of two
    (16, 512, 300, 3, [0, 0, 1] + [0] * 10 + [2, 0, 0], False),  # threads; two experts of one row
)
GROUPED_TYPES = ((F.F8E4M3, F.F8E5M2, L.BlockMxE8M0(block=32)), (F.F8E5M2Fnuz, F.F4E2M1, L.PerTensor),
                 (CUSTOM, F.F8E4M3Fnuz, L.Nvfp4(group=5)), (F.F8E4M3, F.F6E3M2, L.BlockMxE8M0(block=W + 3)))


def add_grouped(s: Suite) -> None:
    """ScaledGroupedMatMul per shape (formats and layout cycling), within f32 rounding of Σ|a·b| of the reference;
    three cases also as ScaledMatMuls per expert over the same bytes (`add_twins`), which their rows must equal
    bit for bit."""
    for j, (m, k, n, experts, ids, twins) in enumerate(GROUPED):
        lf, rf, layout = GROUPED_TYPES[j % len(GROUPED_TYPES)]
        ids = np.float32(np.arange(m) % experts if ids is None else ids)
        lhs, rhs = finite_codes(s, lf, m * k), finite_codes(s, rf, experts * n * k)
        ls = scale_values(s, layout, m, k)
        rs = np.concatenate([scale_values(s, layout, n, k) for _ in range(experts)])
        if layout.name != "PerTensor":
            ls[(ls == 0xFF) | (ls == 0x7F)], rs[(rs == 0xFF) | (rs == 0x7F)] = 127, 0x38
        bias, has_bias = s.normal(experts * n), j % 2 == 0
        a = dequantized(lf, layout, lhs, ls, m, k)
        w = np.stack([dequantized(rf, layout, rhs[e * n * k:(e + 1) * n * k], rs.reshape(experts, -1)[e], n, k)
                      for e in range(experts)])
        rows = ids.astype(int)
        magnitude = np.einsum("ik,ink->in", np.abs(a), np.abs(w[rows])) + np.abs(bias.reshape(experts, n)[rows])
        bound = 1e-6 * (k + 2) * magnitude.reshape(-1) + 1e-30
        dst, o = s.out(np.float32, m * n)
        at = dict(input=s.put(lhs), weight=s.put(rhs), input_scale=s.put(ls), weight_scale=s.put(rs),
                  bias=s.put(bias))
        name = f"ScaledGroupedMatMul-{lf!r}-{rf!r}-{layout!r}-{m}x{k}x{n}-E{experts}-bias{int(has_bias)}"
        s.add(name, T.ScaledGroupedMatMul(expert_idx=s.put(ids), dst=dst, m=m, k=k, n=n, num_experts=experts,
                                          lhs_fmt=lf, rhs_fmt=rf, layout=layout, has_bias=has_bias, **at),
              [o], compare=lambda g, w_, bound=bound: assert_close(g, w_, 0.0, bound))
        if twins:
            add_twins(s, at, rows, T.ScaledMatMul(lhs=0, rhs=0, lhs_scale=0, rhs_scale=0, bias=0, dst=0, m=m, k=k, n=n,
                                                  lhs_fmt=lf, rhs_fmt=rf, layout=layout, has_bias=has_bias), name)


def add_twins(s: Suite, at: dict, ids: np.ndarray, like: T.ScaledMatMul, name: str) -> None:
    """Per used expert e, a ScaledMatMul (`per-expert-e-<name>`) on the same bytes as the grouped case: over all
    m rows when e has several, over its one row (m = 1, the GEMV path) when it has one."""
    slab, slab_scales = like.n * like.k, scale_bytes(like.layout, like.n, like.k)
    row_scales = 0 if like.layout.name == "PerTensor" else scale_bytes(like.layout, 1, like.k)
    for e in sorted(set(ids.tolist())):
        rows = np.flatnonzero(ids == e)
        first = int(rows[0]) if rows.size == 1 else 0
        m = 1 if rows.size == 1 else like.m
        dst, o = s.out(np.float32, m * like.n)
        s.add(f"per-expert-{e}-{name}", dataclasses.replace(
            like, lhs=at["input"] + first * like.k, lhs_scale=at["input_scale"] + first * row_scales,
            rhs=at["weight"] + e * slab, rhs_scale=at["weight_scale"] + e * slab_scales, bias=at["bias"] + 4 * e * like.n,
            dst=dst, m=m), [o], compare=lambda g, w_: None)


SUITE = build()
outcome, test_matches_reference, test_nothing_outside_the_outputs_changes, \
    test_thread_count_does_not_change_results, test_every_kind_is_native = suite_tests(SUITE)


# ── the independent oracle: ml_dtypes ───────────────────────────────────────

@pytest.mark.parametrize("name", FORMATS)
def test_decode_matches_ml_dtypes(outcome, name: str) -> None:
    """All codes decode to ml_dtypes' value, bit for bit (any NaN for a NaN)."""
    want = all_codes(FORMATS[name]).view(ML_DTYPES[name]).astype(np.float32)
    got = outcome.output(f"exhaustive-decode-{name}")
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got.view(np.int32)[~np.isnan(got)], want.view(np.int32)[~np.isnan(want)])


@pytest.mark.parametrize("name", FORMATS)
def test_encode_matches_ml_dtypes(outcome, name: str) -> None:
    """The dense grid, values, ties ± 1 ulp and specials encode as ml_dtypes does (saturating, NaN → 0)."""
    x = encode_grid(FORMATS[name])
    got, want = outcome.output(f"exhaustive-encode-{name}"), ml_encode(name, x)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} differ, first {x[bad[:5]]}: got {got[bad[:5]]}, want {want[bad[:5]]}"


def test_e8m0_matches_ml_dtypes() -> None:
    """E8M0 decode is ml_dtypes' float8_e8m0fnu; encoding rounds up to the next power of two."""
    b = np.arange(256, dtype=np.uint8)
    want = b.view(md.float8_e8m0fnu).astype(np.float32)
    assert np.array_equal(e8m0_decode(b), want, equal_nan=True)
    assert np.array_equal(e8m0_encode_up(want[:255]), b[:255])
    assert np.array_equal(e8m0_encode_up(np.float32([3.0, 0.75, 1e-45, 0.0, -1.0, np.inf, np.nan, 3e38])),
                          np.uint8([129, 127, 0, 0, 0, 0, 0, 254]))


def grouped_cases() -> list:
    """The grouped cases with per-expert ScaledMatMul twins."""
    return [c for c in SUITE.cases if c.name.startswith("ScaledGroupedMatMul-")
            and any(n.endswith(f"-{c.name}") and n.startswith("per-expert-") for n in SUITE.names)]


@pytest.mark.parametrize("name", [c.name for c in grouped_cases()])
def test_grouped_rows_equal_their_experts_matmul(outcome, name: str) -> None:
    """Row i of a grouped product is bit for bit row i of the ScaledMatMul with expert idx[i]'s slab (the panel
    path), or that ScaledMatMul's one row when i is its expert's only row (the GEMV path)."""
    t = outcome.case(name).thunk
    ids = outcome.before[t.expert_idx:t.expert_idx + 4 * t.m].view(np.float32).astype(int)
    twins = {e: outcome.output(f"per-expert-{e}-{name}").reshape(-1, t.n) for e in set(ids.tolist())}
    want = np.stack([twins[e][i if len(twins[e]) > 1 else 0] for i, e in enumerate(ids)])
    assert_same(outcome.output(name).reshape(t.m, t.n), want, what=name)


def bad_grouped(lay: Suite, ids: list[float], experts: int = 2, m: int = 3, k: int = 40, n: int = 5):
    """A ScaledGroupedMatMul on `lay`'s arena with the given f32 ids."""
    layout = L.BlockMxE8M0(block=32)
    return T.ScaledGroupedMatMul(
        input=lay.put(finite_codes(lay, F.F8E4M3, m * k)), weight=lay.put(finite_codes(lay, F.F8E4M3, experts * n * k)),
        input_scale=lay.put(np.full(scale_bytes(layout, m, k), 127, np.uint8)),
        weight_scale=lay.put(np.full(experts * scale_bytes(layout, n, k), 127, np.uint8)),
        expert_idx=lay.put(np.float32(ids)), bias=lay.put(lay.normal(experts * n)), dst=lay.slot(4 * m * n), m=m, k=k,
        n=n, num_experts=experts, lhs_fmt=F.F8E4M3, rhs_fmt=F.F8E4M3, layout=layout, has_bias=True)


@pytest.mark.parametrize("ids, row", [([0, 1, 2], 2), ([1, 7, 0], 1), ([2, 0, 3e9], 0), ([1, 0, np.inf], 2),
                                     ([1, 2.5, 1], 1)])
def test_bad_expert_id_names_its_row(ids: list[float], row: int) -> None:
    """An id ≥ num_experts `as usize` (too big, inf, 2.5 → 2): ExecutionError, INDEX_OUT_OF_RANGE with the first bad
    row + 1 above the low byte and the row in the message, nothing written; the reference raises IndexError
    naming the row."""
    lay = Suite(5, fill=NAN_FILL)
    bad = bad_grouped(lay, ids)
    arena = lay.arena()
    with pytest.raises(ExecutionError) as info:
        rl.compile(rl.ThunkSchedule([bad], arena_bytes=lay.nbytes), cache=False).run(arena)
    assert info.value.kind == "ScaledGroupedMatMul"
    assert (info.value.status & 0xFF, info.value.status >> 8) == (Status.INDEX_OUT_OF_RANGE, row + 1)
    assert f"expert id of row {row}" in str(info.value)
    assert (arena.bytes[bad.dst:bad.dst + 4 * bad.m * bad.n] == NAN_FILL).all(), "the failing thunk writes nothing"
    with pytest.raises(IndexError, match=f"row {row}: .* num_experts 2"):
        reference_registry.run_thunk(lay.initial_bytes(), bad)


# ── bad input ───────────────────────────────────────────────────────────────

def test_custom_format_too_wide_is_refused() -> None:
    t = T.ScaledDequantize(codes=0, scale=64, dst=128, rows=1, cols=8, fmt=F.Custom(exp_bits=5, mant_bits=3, bias=15),
                           layout=L.PerTensor)
    expect_invalid(t, 4096, "fmt", "≤ 8")


def test_zero_block_is_refused() -> None:
    t = T.ScaledQuantize(x=0, scale=64, dst=128, rows=1, cols=8, fmt=F.F8E4M3, layout=L.BlockMxE8M0(block=0))
    expect_invalid(t, 4096, "layout", "block size")


def test_minifloat_describes_the_spec_maxima() -> None:
    """The largest finite values of semantics.md §2.12."""
    got = {name: float(f.max_finite) for name, f in FORMATS.items()}
    assert got == {"F8E4M3": 448, "F8E5M2": 57344, "F8E4M3Fnuz": 240, "F8E5M2Fnuz": 57344, "F6E2M3": 7.5,
                   "F6E3M2": 28, "F4E2M1": 6}
    assert float(minifloat(CUSTOM).max_finite) == 1.9375 * 16


WIDE = F.Custom(exp_bits=5, mant_bits=3, bias=15)
CHECK_RULES = [("lhs_fmt", dict(lhs_fmt=WIDE), "≤ 8"), ("rhs_fmt", dict(rhs_fmt=WIDE), "≤ 8"),
               ("layout", dict(layout=L.Nvfp4(group=0)), "block size"), ("num_experts", dict(num_experts=0), "m = 3")]


@pytest.mark.parametrize("kind, field_name, change, match",
                         [(kind, *rule) for kind in ("ScaledMatMul", "ScaledGroupedMatMul") for rule in CHECK_RULES
                          if kind == "ScaledGroupedMatMul" or rule[0] != "num_experts"])
def test_bad_matmul_is_refused(kind: str, field_name: str, change: dict, match: str) -> None:
    """Each check rule of the two matmuls is a ValidationError naming its field."""
    lay = Suite(6)
    t = bad_grouped(lay, [0, 1, 0])
    if kind == "ScaledMatMul":
        t = T.ScaledMatMul(lhs=t.input, rhs=t.weight, lhs_scale=t.input_scale, rhs_scale=t.weight_scale, bias=t.bias,
                           dst=t.dst, m=t.m, k=t.k, n=t.n, lhs_fmt=t.lhs_fmt, rhs_fmt=t.rhs_fmt, layout=t.layout,
                           has_bias=True)
    expect_invalid(dataclasses.replace(t, **change), lay.nbytes, field_name, match)


@pytest.mark.parametrize("ids, same", [([1, 0.5, 1.9], [1, 0, 1]), ([-1, 0, 1], [0, 0, 1]), ([0, 1, np.nan], [0, 1, 0]),
                                       ([-np.inf, 1.0001, -0.0], [0, 1, 0])])
def test_ids_convert_as_usize(ids: list[float], same: list[int]) -> None:
    """Ids truncate toward zero; negative and NaN ids are expert 0 (semantics.md §1): the same bytes as the
    integer ids."""
    outs = []
    for chosen in (ids, same):
        lay = Suite(5, fill=NAN_FILL)
        t = bad_grouped(lay, chosen)
        arena = lay.arena()
        rl.compile(rl.ThunkSchedule([t], arena_bytes=lay.nbytes), cache=False).run(arena)
        outs.append(arena.bytes[t.dst:t.dst + 4 * t.m * t.n].copy())
    assert np.array_equal(*outs)
