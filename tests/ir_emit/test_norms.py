"""Normalization thunks against their float64 NumPy references, all cases in one compiled schedule.

The program and the references run on copies of the same arena (tests/harness.py): every declared
output must match within its tolerance and no byte outside the declared outputs may change.
"""
from __future__ import annotations

import numpy as np

from rlx_llvm import thunks as T
from tests.harness import HUGE, WIDTHS, W, Outcome, Suite, expect_invalid, special_rows, suite_tests

# ── the cases ───────────────────────────────────────────────────────────────

def build() -> Suite:
    s = Suite(4, rtol=2e-5, atol=2e-5)
    for h in (*WIDTHS, HUGE):
        rows = 1 if h == HUGE else 7
        for kind in ("LayerNorm", "RmsNorm"):
            x = s.put(special_rows(s, rows, h))
            g, b = s.put(s.normal(h)), s.put(s.normal(h))
            dst, o = s.out(np.float32, rows * h)
            s.add(f"{kind}-{rows}x{h}", getattr(T, kind)(src=x, g=g, b=b, dst=dst, rows=rows, h=h, eps=1e-5), [o])
        for kind in ("FusedResidualLN", "FusedResidualRmsNorm"):
            for has_bias in (True, False):
                x, res = s.put(special_rows(s, rows, h)), s.put(s.normal(rows * h))
                bias, g, b = s.put(s.normal(h)), s.put(s.normal(h)), s.put(s.normal(h))
                dst, o = s.out(np.float32, rows * h)
                s.add(f"{kind}-{rows}x{h}-bias{int(has_bias)}",
                      getattr(T, kind)(x=x, res=res, bias=bias, g=g, b=b, out=dst, rows=rows, h=h, eps=1e-5,
                                       has_bias=has_bias), [o])
    # big enough to split across threads (≥ 256 KiB moved), odd row counts so chunks are uneven
    for kind in ("LayerNorm", "RmsNorm", "FusedResidualLN"):
        rows, h = 97, 771
        if kind == "FusedResidualLN":
            x, res, bias = s.put(s.normal(rows * h)), s.put(s.normal(rows * h)), s.put(s.normal(h))
            dst, o = s.out(np.float32, rows * h)
            t = T.FusedResidualLN(x=x, res=res, bias=bias, g=s.put(s.normal(h)), b=s.put(s.normal(h)), out=dst,
                                  rows=rows, h=h, eps=1e-5, has_bias=True)
        else:
            dst, o = s.out(np.float32, rows * h)
            t = getattr(T, kind)(src=s.put(s.normal(rows * h)), g=s.put(s.normal(h)), b=s.put(s.normal(h)), dst=dst,
                                 rows=rows, h=h, eps=1e-5)
        s.add(f"{kind}-threads-{rows}x{h}", t, [o])
    # in place (dst aliases src exactly)
    for kind in ("LayerNorm", "RmsNorm"):
        x = s.put(s.normal(5 * 40))
        s.add(f"{kind}-inplace", getattr(T, kind)(src=x, g=s.put(s.normal(40)), b=s.put(s.normal(40)), dst=x,
                                                  rows=5, h=40, eps=1e-6), [(x, np.dtype(np.float32), 200)])
    add_modulated(s)
    add_spatial(s)
    add_batch_norm(s)
    return s


def add_modulated(s: Suite) -> None:
    """AdaLayerNorm / GatedResidual with the three kinds of broadcast maps."""
    for rows, h in ((6, W + 1), (4, 64), (1, 1), (9, 33)):
        maps = {"batch": (2 * h, tuple((r * 2 // rows) * h for r in range(rows))),   # [B, 1, D], B = 2
                "rows": (rows * h, tuple(r * h for r in range(rows))),              # no broadcast
                "table": (3 * h, tuple(int(v) for v in s.rng.integers(0, 2 * h + 1, rows)))}  # arbitrary
        for mname, (mod_len, offs) in maps.items():
            for ln in (True, False):
                x = s.put(special_rows(s, rows, h))
                scale, shift = s.put(s.normal(mod_len, scale=0.5)), s.put(s.normal(mod_len))
                dst, o = s.out(np.float32, rows * h)
                s.add(f"AdaLayerNorm-{rows}x{h}-{mname}-ln{int(ln)}",
                      T.AdaLayerNorm(src=x, scale=scale, shift=shift, dst=dst, rows=rows, h=h, eps=1e-6,
                                     layer_norm=ln, mod_len=mod_len, mod_off=offs), [o])
            x, y, gate = s.put(s.normal(rows * h)), s.put(s.normal(rows * h)), s.put(s.normal(mod_len))
            dst, o = s.out(np.float32, rows * h)
            s.add(f"GatedResidual-{rows}x{h}-{mname}",
                  T.GatedResidual(x=x, y=y, gate=gate, dst=dst, rows=rows, h=h, gate_len=mod_len, gate_off=offs), [o])


def add_spatial(s: Suite) -> None:
    """GroupNorm and LayerNorm2d on NCHW shapes: H·W of 1, below W, W-multiples and odd."""
    for n, c, hh, ww, groups in ((2, 6, 3, 5, 3), (1, 64, 1, 1, 4), (2, 32, 8, 8, 8), (1, 3, 17, 1, 1),
                                 (3, 4, 1, W + 1, 2), (1, 16, 40, 40, 16), (3, 64, 9, 21, 8)):
        count = n * c * hh * ww
        x = s.put(s.normal(count, scale=1.5, shift=1.0))
        dst, o = s.out(np.float32, count)
        s.add(f"GroupNorm-{n}x{c}x{hh}x{ww}-g{groups}",
              T.GroupNorm(src=x, g=s.put(s.normal(c)), b=s.put(s.normal(c)), dst=dst, n=n, c=c, h=hh, w=ww,
                          num_groups=groups, eps=1e-5), [o])
        x = s.put(s.normal(count, scale=1.5, shift=1.0))
        dst, o = s.out(np.float32, count)
        s.add(f"LayerNorm2d-{n}x{c}x{hh}x{ww}",
              T.LayerNorm2d(src=x, g=s.put(s.normal(c)), b=s.put(s.normal(c)), dst=dst, n=n, c=c, h=hh, w=ww,
                            eps=1e-5), [o])


def add_batch_norm(s: Suite) -> None:
    """BatchNormInference with channel counts below, at and around W, and a long row."""
    for count, ch in ((7, 3), (5, W), (9, W + 1), (3, 768), (1000, 5), (2, 1001), (1, 1), (20001, 3), (97, 1001)):
        x = s.put(s.normal(count * ch, scale=2.0))
        var = s.put((np.abs(s.normal(ch)) + 0.1).astype(np.float32))
        dst, o = s.out(np.float32, count * ch)
        s.add(f"BatchNormInference-{count}x{ch}",
              T.BatchNormInference(src=x, g=s.put(s.normal(ch)), b=s.put(s.normal(ch)), mean=s.put(s.normal(ch)),
                                   var=var, dst=dst, count=count, channels=ch, eps=1e-5), [o], atol=1e-4)



SUITE = build()


(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


def test_special_rows_behave_like_rlx(outcome: Outcome) -> None:
    """Constant rows normalize to exactly `b`; a NaN or ±inf anywhere makes the whole row NaN."""
    c = outcome.case(f"LayerNorm-7x{W + 1}")
    h = W + 1
    off, dtype, count = c.outputs[0]
    y = outcome.got[off:off + count * 4].view(np.float32).reshape(7, h)
    bias = outcome.got[c.thunk.b:c.thunk.b + 4 * h].view(np.float32)
    np.testing.assert_array_equal(y[1], bias)   # constant 2.0 row: var = 0 exactly
    np.testing.assert_array_equal(y[2], bias)   # zeros
    assert np.isnan(y[3:6]).all()


# ── bad inputs: one per check rule ──────────────────────────────────────────

def test_group_norm_groups_must_divide_channels() -> None:
    expect_invalid(T.GroupNorm(src=0, g=256, b=512, dst=1024, n=1, c=6, h=2, w=2, num_groups=4, eps=1e-5),
                   4096, "num_groups")


def test_group_norm_needs_a_group() -> None:
    expect_invalid(T.GroupNorm(src=0, g=256, b=512, dst=1024, n=1, c=6, h=2, w=2, num_groups=0, eps=1e-5),
                   4096, "num_groups")


def test_ada_layer_norm_offsets_per_row() -> None:
    expect_invalid(T.AdaLayerNorm(src=0, scale=1024, shift=2048, dst=3072, rows=4, h=8, eps=1e-6, layer_norm=True,
                                  mod_len=16, mod_off=(0, 8, 0)), 4096, "mod_off")


def test_ada_layer_norm_offsets_inside_mod_len() -> None:
    expect_invalid(T.AdaLayerNorm(src=0, scale=1024, shift=2048, dst=3072, rows=2, h=8, eps=1e-6, layer_norm=False,
                                  mod_len=16, mod_off=(0, 9)), 4096, "mod_off")


def test_gated_residual_offsets_inside_gate_len() -> None:
    expect_invalid(T.GatedResidual(x=0, y=1024, gate=2048, dst=3072, rows=2, h=8, gate_len=8, gate_off=(0, 8)),
                   4096, "gate_off")


def test_gated_residual_offsets_per_row() -> None:
    expect_invalid(T.GatedResidual(x=0, y=1024, gate=2048, dst=3072, rows=2, h=8, gate_len=16, gate_off=(0,)),
                   4096, "gate_off")
