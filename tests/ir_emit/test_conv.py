"""Pool2D, Pool3D, Conv2D and Conv3d against their float64 NumPy references, all cases in one
compiled schedule (the `Suite` harness of test_norms.py), plus spot checks against PyTorch's
semantics (NaN propagation and −inf windows of max pooling) and one bad-input test per check rule."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rlx_llvm import thunks as T
from rlx_llvm.jit import host
from rlx_llvm.ops import ReduceOp
from tests.ir_emit.test_norms import Outcome, Suite, expect_invalid, suite_tests

W = host().lanes(32)
FAMILIES = ("conv", "gemm")
MAX, MEAN = ReduceOp.Max, ReduceOp.Mean


def out_size(size: int, k: int, s: int, p: int, dil: int = 1) -> int:
    """PyTorch's output size (at least 0)."""
    return max(0, (size + 2 * p - dil * (k - 1) - 1) // s + 1)


def with_specials(s: Suite, count: int) -> np.ndarray:
    """Normals with NaN, +inf and −inf sprinkled in (when there is room)."""
    x = s.normal(count)
    if count >= 40:
        picks = s.rng.choice(count, 6, replace=False)
        x[picks] = [np.nan, np.inf, -np.inf, np.nan, np.inf, -np.inf]
    return x


# ── cases ────────────────────────────────────────────────────────────────────

def add_pool(s: Suite, kind: ReduceOp, n: int, c: int, size: tuple, k: tuple, st: tuple, p: tuple,
             specials: bool = False, tag: str = "") -> str:
    """A Pool2D (2-tuple geometry) or Pool3D (3-tuple) case; returns its name."""
    out = tuple(out_size(*a) for a in zip(size, k, st, p))
    count_in, count_out = n * c * math.prod(size), n * c * math.prod(out)
    src = s.put(with_specials(s, count_in) if specials else s.normal(count_in))
    dst, o = s.out(np.float32, count_out)
    names = ("d", "h", "w")[3 - len(size):]
    geo = {**{a: v for a, v in zip(names, size)}, **{f"{a}_out": v for a, v in zip(names, out)},
           **{f"k{a}": v for a, v in zip(names, k)}, **{f"s{a}": v for a, v in zip(names, st)},
           **{f"p{a}": v for a, v in zip(names, p)}}
    cls = T.Pool3D if len(size) == 3 else T.Pool2D
    name = (f"{cls.__name__}-{kind.value}-{n}x{c}x{'x'.join(map(str, size))}-k{k}-s{st}-p{p}"
            f"{'-nan' if specials else ''}{tag}")
    s.add(name, cls(src=src, dst=dst, n=n, c=c, kind=kind, **geo), [o], atol=1e-6, rtol=1e-6)
    return name


def add_conv(s: Suite, n: int, c_in: int, c_out: int, size: tuple, k: tuple, st: tuple, p: tuple, dil: tuple,
             groups: int = 1, specials: bool = False, tag: str = "") -> str:
    """A Conv2D (2-tuple geometry) or Conv3d (3-tuple) case; returns its name."""
    out = tuple(out_size(*a) for a in zip(size, k, st, p, dil))
    kvol = math.prod(k)
    count_in = n * c_in * math.prod(size)
    src = s.put(with_specials(s, count_in) if specials else s.normal(count_in))
    weight = s.put(s.normal(c_out * (c_in // groups) * kvol, max(1, c_in // groups * kvol) ** -0.5))
    dst, o = s.out(np.float32, n * c_out * math.prod(out))
    names = ("d", "h", "w")[3 - len(size):]
    geo = {**{a: v for a, v in zip(names, size)}, **{f"{a}_out": v for a, v in zip(names, out)},
           **{f"k{a}": v for a, v in zip(names, k)}, **{f"s{a}": v for a, v in zip(names, st)},
           **{f"p{a}": v for a, v in zip(names, p)}, **{f"d{a}": v for a, v in zip(names, dil)}}
    cls = T.Conv3d if len(size) == 3 else T.Conv2D
    name = (f"{cls.__name__}-{n}x{c_in}to{c_out}x{'x'.join(map(str, size))}-k{k}-s{st}-p{p}-d{dil}-g{groups}"
            f"{'-nan' if specials else ''}{tag}")
    s.add(name, cls(src=src, weight=weight, dst=dst, n=n, c_in=c_in, c_out=c_out, groups=groups, **geo), [o],
          atol=1e-4, rtol=1e-4)
    return name


POOL2D = [  # (n, c, (h, w), (kh, kw), (sh, sw), (ph, pw))
    (1, 1, (1, 1), (1, 1), (1, 1), (0, 0)),
    (1, 2, (5, W - 1), (3, 3), (1, 1), (1, 1)),            # output widths W − 1, W, W + 1
    (2, 3, (6, W), (3, 3), (1, 1), (1, 1)),
    (1, 2, (7, W + 1), (3, 3), (1, 1), (1, 1)),
    (2, 3, (8, 2 * W + 6), (2, 2), (2, 2), (0, 0)),         # even kernel, stride 2
    (1, 4, (17, 23), (3, 3), (2, 2), (1, 1)),               # odd sizes, stride 2
    (1, 2, (13, 3 * W + 4), (3, 3), (3, 3), (2, 2)),        # stride 3, padding 2
    (1, 3, (9, 40), (2, 3), (1, 2), (1, 1)),                # rectangular kernel and stride
    (1, 2, (4, 6), (1, 1), (1, 1), (1, 1)),                 # the border ring is all padding
    (1, 2, (5, 2 * W + 1), (2, 2), (1, 1), (2, 2)),         # windows entirely in the padding
    (1, 1, (1, 5), (3, 3), (1, 1), (0, 0)),                 # no output rows at all
    (2, 16, (56, 56), (3, 3), (2, 2), (1, 1)),              # big enough to split across threads
    (1, 2, (11, 4 * W + 2), (5, 4), (1, 1), (2, 2)),        # wide window, even width kernel
]
POOL3D = [  # (n, c, (d, h, w), k, s, p)
    (1, 1, (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0)),
    (2, 3, (4, 4, W + 2), (2, 2, 2), (2, 2, 2), (0, 0, 0)),
    (1, 2, (5, 6, W + 1), (2, 3, 3), (1, 2, 1), (1, 1, 1)),
    (1, 2, (3, 5, 2 * W + 3), (3, 3, 3), (2, 2, 3), (1, 1, 1)),
    (1, 2, (3, 3, 9), (1, 2, 2), (1, 1, 1), (1, 2, 2)),     # windows entirely in the padding
    (2, 8, (16, 24, 24), (3, 3, 3), (2, 2, 2), (1, 1, 1)),  # threads
]
CONV2D = [  # (n, c_in, c_out, (h, w), k, s, p, dil, groups)
    (1, 1, 1, (1, 1), (1, 1), (1, 1), (0, 0), (1, 1), 1),
    (1, 5, 7, (6, W + 1), (1, 1), (1, 1), (0, 0), (1, 1), 1),        # 1×1: the input is the GEMM operand
    (3, 4, 6, (5, 9), (1, 1), (1, 1), (0, 0), (1, 1), 1),
    (6, 4, 6, (5, 9), (1, 1), (1, 1), (0, 0), (1, 1), 1),             # > UNROLL_GEMMS images
    (2, 3, 5, (7, W - 1), (3, 3), (1, 1), (1, 1), (1, 1), 1),         # output widths W − 1, W, W + 1
    (1, 3, 4, (6, W), (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (2, 2, 3, (5, W + 1), (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (1, 3, 4, (17, 23), (3, 3), (2, 2), (1, 1), (1, 1), 1),           # odd sizes, stride 2
    (2, 4, 4, (13, 29), (3, 3), (3, 3), (2, 2), (1, 1), 1),           # stride 3, padding 2
    (1, 3, 2, (8, 10), (2, 2), (2, 2), (0, 0), (1, 1), 1),            # even kernel
    (1, 2, 3, (9, 11), (4, 4), (1, 1), (2, 2), (1, 1), 1),            # even kernel, padding 2
    (1, 4, 3, (9, 7), (1, 1), (2, 2), (0, 0), (1, 1), 1),             # 1×1 stride 2 (im2col)
    (1, 2, 3, (4, 5), (1, 1), (1, 1), (1, 1), (1, 1), 1),             # 1×1 padded: border rows zero
    (2, 3, 4, (12, 15), (3, 3), (1, 1), (2, 2), (2, 2), 1),           # dilation 2
    (1, 2, 2, (11, 20), (3, 2), (2, 1), (1, 3), (1, 3), 1),           # rectangular, dilation (1, 3)
    (2, 4, 6, (7, 9), (3, 3), (1, 1), (1, 1), (1, 1), 2),             # groups 2 (4 GEMMs, unrolled)
    (3, 6, 9, (5, 8), (3, 3), (2, 1), (1, 1), (1, 1), 3),             # groups 3 (9 GEMMs, a loop)
    (2, 8, 8, (9, W + 3), (3, 3), (1, 1), (1, 1), (1, 1), 8),         # depthwise
    (1, 4, 8, (6, 6), (3, 3), (1, 1), (1, 1), (1, 1), 4),             # channel multiplier 2
    (1, 1, 4, (3, 2), (3, 3), (1, 1), (1, 1), (1, 1), 1),             # kernel larger than the input
    (1, 2, 2, (2, 5), (3, 3), (1, 1), (0, 0), (1, 1), 1),             # no output rows
    (1, 0, 3, (4, 4), (3, 3), (1, 1), (1, 1), (1, 1), 1),             # no input channels: zeros
    (1, 32, 32, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1), 1),         # GEMM panels split across threads
    (4, 16, 16, (20, 20), (3, 3), (1, 1), (1, 1), (1, 1), 2),         # 8 GEMMs split across threads
]
CONV3D = [  # (n, c_in, c_out, (d, h, w), k, s, p, dil, groups)
    (1, 1, 1, (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1), 1),
    (2, 3, 4, (5, 6, 7), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 1),
    (1, 4, 6, (6, 5, W + 1), (3, 3, 3), (2, 1, 2), (1, 1, 1), (2, 1, 1), 2),
    (2, 4, 4, (4, 5, 6), (2, 3, 1), (1, 2, 1), (0, 1, 0), (1, 1, 1), 4),      # depthwise
    (3, 5, 3, (3, 4, 5), (1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1), 1),      # 1×1×1 direct
    (1, 2, 3, (2, 3, 3), (3, 3, 3), (1, 1, 1), (2, 1, 1), (1, 1, 1), 1),      # depth taps in the padding
]


def build() -> Suite:
    s = Suite(seed=11)
    for kind in (MAX, MEAN):
        for n, c, size, k, st, p in POOL2D + POOL3D:
            add_pool(s, kind, n, c, size, k, st, p)
        add_pool(s, kind, 2, 3, (9, 2 * W + 5), (3, 3), (2, 1), (1, 1), specials=True)
        add_pool(s, kind, 1, 2, (4, 5, W + 1), (2, 3, 3), (1, 1, 2), (1, 1, 1), specials=True)
    for geo in CONV2D + CONV3D:
        add_conv(s, *geo[:8], groups=geo[8])
    add_conv(s, 2, 3, 4, (9, W + 2), (3, 3), (1, 2), (1, 1), (1, 1), specials=True)
    for tag in REPEATS:  # the same shapes at other offsets: one shared body each (like stacked layers)
        add_pool(s, MAX, *POOL2D[5], tag=tag)
        add_pool(s, MEAN, *POOL3D[2], tag=tag)
        add_conv(s, *CONV2D[8][:8], groups=CONV2D[8][8], tag=tag)     # unrolled GEMMs
        add_conv(s, *CONV2D[16][:8], groups=CONV2D[16][8], tag=tag)   # a loop of GEMMs
        add_conv(s, *CONV3D[2][:8], groups=CONV3D[2][8], tag=tag)
    return s


REPEATS = ("-again", "-thrice")


SUITE = build()
(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE, FAMILIES)


def test_repeated_shapes_share_one_body(outcome: Outcome) -> None:
    """Cases that differ only in buffer offsets call one compiled body (every kind is shared_body)."""
    names = [c.name for c in SUITE.cases]
    report = outcome.prog.report()
    for tag in REPEATS:
        for i, name in enumerate(names):
            if name.endswith(tag):
                first = names.index(name[:-len(tag)])
                assert report[i].body and report[i].body == report[first].body, (name, report[i], report[first])


def _got(outcome: Outcome, name: str) -> np.ndarray:
    off, dtype, count = outcome.case(name).outputs[0]
    return outcome.got[off:off + count * 4].view(np.float32)


def test_max_pool_propagates_nan_and_pads_with_minus_inf(outcome: Outcome) -> None:
    """A NaN in a window gives NaN (PyTorch); a window entirely in the padding gives −inf."""
    t = outcome.case(f"Pool2D-Max-2x3x9x{2 * W + 5}-k(3, 3)-s(2, 1)-p(1, 1)-nan").thunk
    x = outcome.before[t.src:t.src + 4 * t.n * t.c * t.h * t.w].view(np.float32).reshape(t.n * t.c, t.h, t.w)
    y = _got(outcome, f"Pool2D-Max-2x3x9x{2 * W + 5}-k(3, 3)-s(2, 1)-p(1, 1)-nan").reshape(t.n * t.c, t.h_out, t.w_out)
    for plane, i, j in zip(*np.nonzero(np.isnan(x))):
        rows = [r for r in range(t.h_out) if r * t.sh - t.ph <= i < r * t.sh - t.ph + t.kh]
        cols = [c for c in range(t.w_out) if c * t.sw - t.pw <= j < c * t.sw - t.pw + t.kw]
        assert np.isnan(y[plane][np.ix_(rows, cols)]).all()
    ring = _got(outcome, "Pool2D-Max-1x2x4x6-k(1, 1)-s(1, 1)-p(1, 1)").reshape(2, 6, 8)
    assert (ring[:, 0] == -np.inf).all() and (ring[:, :, -1] == -np.inf).all()
    mean_ring = _got(outcome, "Pool2D-Mean-1x2x4x6-k(1, 1)-s(1, 1)-p(1, 1)").reshape(2, 6, 8)
    assert (mean_ring[:, 0] == 0).all()


def _input(outcome: Outcome, offset: int, *shape: int) -> np.ndarray:
    return outcome.before[offset:offset + 4 * math.prod(shape)].view(np.float32).reshape(shape).copy()


def test_pool_matches_torch_where_torch_is_defined(outcome: Outcome) -> None:
    """Max and Mean (count_include_pad) pooling agree with torch on a padded, strided case."""
    torch = pytest.importorskip("torch")
    for kind in ("Max", "Mean"):
        name = f"Pool2D-{kind}-1x4x17x23-k(3, 3)-s(2, 2)-p(1, 1)"
        x = torch.from_numpy(_input(outcome, outcome.case(name).thunk.src, 1, 4, 17, 23))
        f = torch.nn.functional.max_pool2d if kind == "Max" else torch.nn.functional.avg_pool2d
        np.testing.assert_allclose(_got(outcome, name), f(x, 3, 2, 1).numpy().reshape(-1), rtol=1e-6, atol=1e-6)


def test_conv_matches_torch(outcome: Outcome) -> None:
    """Grouped, strided, dilated Conv2D and Conv3d agree with torch."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    for name in ("Conv2D-3x6to9x5x8-k(3, 3)-s(2, 1)-p(1, 1)-d(1, 1)-g3",
                 "Conv2D-1x2to2x11x20-k(3, 2)-s(2, 1)-p(1, 3)-d(1, 3)-g1",
                 f"Conv3d-1x4to6x6x5x{W + 1}-k(3, 3, 3)-s(2, 1, 2)-p(1, 1, 1)-d(2, 1, 1)-g2"):
        t = outcome.case(name).thunk
        three = isinstance(t, T.Conv3d)
        size = (t.d, t.h, t.w) if three else (t.h, t.w)
        k = (t.kd, t.kh, t.kw) if three else (t.kh, t.kw)
        x = torch.from_numpy(_input(outcome, t.src, t.n, t.c_in, *size))
        w = torch.from_numpy(_input(outcome, t.weight, t.c_out, t.c_in // t.groups, *k))
        geo = dict(stride=(t.sd, t.sh, t.sw), padding=(t.pd, t.ph, t.pw), dilation=(t.dd, t.dh, t.dw)) if three \
            else dict(stride=(t.sh, t.sw), padding=(t.ph, t.pw), dilation=(t.dh, t.dw))
        want = (F.conv3d if three else F.conv2d)(x, w, groups=t.groups, **geo).numpy().reshape(-1)
        np.testing.assert_allclose(_got(outcome, name), want, rtol=1e-4, atol=1e-4)


# ── bad inputs: one per check rule ──────────────────────────────────────────

def pool2d(**kw) -> T.Pool2D:
    base = dict(src=0, dst=4096, n=1, c=2, h=6, w=6, h_out=3, w_out=3, kh=2, kw=2, sh=2, sw=2, ph=0, pw=0, kind=MAX)
    return T.Pool2D(**{**base, **kw})


def pool3d(**kw) -> T.Pool3D:
    base = dict(src=0, dst=4096, n=1, c=2, d=4, h=6, w=6, d_out=2, h_out=3, w_out=3, kd=2, kh=2, kw=2, sd=2, sh=2,
                sw=2, pd=0, ph=0, pw=0, kind=MEAN)
    return T.Pool3D(**{**base, **kw})


def conv2d(**kw) -> T.Conv2D:
    base = dict(src=0, weight=4096, dst=8192, n=1, c_in=4, h=6, w=6, c_out=4, h_out=6, w_out=6, kh=3, kw=3, sh=1,
                sw=1, ph=1, pw=1, dh=1, dw=1, groups=2)
    return T.Conv2D(**{**base, **kw})


def conv3d(**kw) -> T.Conv3d:
    base = dict(src=0, weight=4096, dst=8192, n=1, c_in=2, d=3, h=4, w=4, c_out=2, d_out=3, h_out=4, w_out=4, kd=3,
                kh=3, kw=3, sd=1, sh=1, sw=1, pd=1, ph=1, pw=1, dd=1, dh=1, dw=1, groups=1)
    return T.Conv3d(**{**base, **kw})


def test_pool_kind_must_be_max_or_mean() -> None:
    expect_invalid(pool2d(kind=ReduceOp.Sum), 1 << 14, "kind", FAMILIES)


def test_pool_kernel_must_be_positive() -> None:
    expect_invalid(pool2d(kh=0), 1 << 14, "kh", FAMILIES)
    expect_invalid(pool3d(kd=0), 1 << 14, "kd", FAMILIES)


def test_pool_stride_must_be_positive() -> None:
    expect_invalid(pool2d(sw=0), 1 << 14, "sw", FAMILIES)
    expect_invalid(pool3d(sd=0), 1 << 14, "sd", FAMILIES)


def test_pool_output_dims_must_match() -> None:
    expect_invalid(pool2d(h_out=4), 1 << 14, "h_out", FAMILIES)
    expect_invalid(pool2d(w_out=2), 1 << 14, "w_out", FAMILIES)
    expect_invalid(pool3d(d_out=3), 1 << 14, "d_out", FAMILIES)


def test_conv_needs_a_group() -> None:
    expect_invalid(conv2d(groups=0), 1 << 14, "groups", FAMILIES)


def test_conv_groups_must_divide_channels() -> None:
    expect_invalid(conv2d(c_in=3, groups=2), 1 << 14, "groups", FAMILIES)
    expect_invalid(conv2d(c_out=5, groups=2), 1 << 14, "groups", FAMILIES)
    expect_invalid(conv3d(c_in=3, groups=2), 1 << 14, "groups", FAMILIES)


def test_conv_kernel_stride_dilation_must_be_positive() -> None:
    for field in ("kh", "kw", "sh", "sw", "dh", "dw"):
        expect_invalid(conv2d(**{field: 0}), 1 << 14, field, FAMILIES)
    for field in ("kd", "sd", "dd"):
        expect_invalid(conv3d(**{field: 0}), 1 << 14, field, FAMILIES)


def test_conv_output_dims_must_match() -> None:
    expect_invalid(conv2d(h_out=5), 1 << 14, "h_out", FAMILIES)
    expect_invalid(conv2d(w_out=7, dw=2), 1 << 14, "w_out", FAMILIES)
    expect_invalid(conv3d(d_out=2), 1 << 14, "d_out", FAMILIES)


def test_conv_gemm_dims_must_fit_blas_ints() -> None:
    """K = c_in/groups·kh·kw = 2^32 (no images and no output channels, so every extent is empty)."""
    expect_invalid(conv2d(n=0, c_out=0, c_in=1 << 16, groups=1, kh=1 << 8, kw=1 << 8, ph=0, pw=0, h=1 << 8,
                          w=1 << 8, h_out=1, w_out=1), 1 << 14, "c_in", FAMILIES)
