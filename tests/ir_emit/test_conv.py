"""Pool2D, Pool3D, Conv2D, Conv3d, ConvTranspose2d/3d, Conv2d/3dBackwardInput/Weight and
MaxPool2d/3dBackward against their float64 NumPy references, all cases in one compiled schedule
(tests/harness.py), plus spot checks against PyTorch (NaN propagation and −inf
windows of max pooling, conv_transpose, the conv gradients, the max-pool gradient), the adjoint
identity ⟨conv(x), y⟩ = ⟨x, convT(y)⟩, first-arg-max routing, and one bad-input test per check rule."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rlx_llvm import thunks as T
from rlx_llvm.jit import host
from rlx_llvm.ops import ReduceOp
from tests.harness import Outcome, Suite, expect_invalid, suite_tests

W = host().lanes(32)
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
    weight = s.put(s.normal(c_out * (c_in // groups) * kvol, scale=max(1, c_in // groups * kvol) ** -0.5))
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


def convt_out(size: int, k: int, s: int, p: int, dil: int = 1, op: int = 0) -> int:
    """PyTorch's transposed-conv output size with output padding `op`."""
    return (size - 1) * s - 2 * p + dil * (k - 1) + 1 + op


def _geo(names, **axes) -> dict:
    """`{prefix+name or name+suffix: value}` for each axis name of a 2-D / 3-D kind."""
    out = {}
    for key, values in axes.items():
        for a, v in zip(names, values):
            out[key.replace("_", a)] = v
    return out


def add_convt(s: Suite, n: int, c_in: int, c_out: int, size: tuple, k: tuple, st: tuple, p: tuple, dil: tuple,
              op: tuple, groups: int = 1, specials: bool = False, tag: str = "") -> str:
    """A ConvTranspose2d (2-tuple geometry) or ConvTranspose3d (3-tuple) case; returns its name."""
    out = tuple(convt_out(*a) for a in zip(size, k, st, p, dil, op))
    kvol = math.prod(k)
    count_in = n * c_in * math.prod(size)
    x = with_specials(s, count_in) if specials else s.normal(count_in)
    if specials and count_in >= 40:
        x[s.rng.choice(count_in, 4, replace=False)] = 0.0
    src = s.put(x)
    weight = s.put(s.normal(c_in * (c_out // groups) * kvol, scale=max(1, c_in // groups) ** -0.5))
    dst, o = s.out(np.float32, n * c_out * math.prod(out))
    names = ("d", "h", "w")[3 - len(size):]
    geo = {**_geo(names, k_=k, s_=st, p_=p, d_=dil), **{f"{a}_out": v for a, v in zip(names, out)},
           **{("w_in" if a == "w" else a): v for a, v in zip(names, size)}}
    cls = T.ConvTranspose3d if len(size) == 3 else T.ConvTranspose2d
    name = (f"{cls.__name__}-{n}x{c_in}to{c_out}x{'x'.join(map(str, size))}-k{k}-s{st}-p{p}-d{dil}-op{op}-g{groups}"
            f"{'-nan' if specials else ''}{tag}")
    s.add(name, cls(src=src, weight=weight, dst=dst, n=n, c_in=c_in, c_out=c_out, groups=groups, **geo), [o],
          atol=1e-4, rtol=1e-4)
    return name


def add_conv_bwd_input(s: Suite, n: int, c_in: int, c_out: int, size: tuple, k: tuple, st: tuple, p: tuple,
                       dil: tuple, groups: int = 1) -> str:
    """A Conv2dBackwardInput / Conv3dBackwardInput case (forward geometry); returns its name."""
    out = tuple(out_size(*a) for a in zip(size, k, st, p, dil))
    kvol = math.prod(k)
    dy = s.put(s.normal(n * c_out * math.prod(out)))
    w = s.put(s.normal(c_out * (c_in // groups) * kvol, scale=max(1, c_out // groups * kvol) ** -0.5))
    dx, o = s.out(np.float32, n * c_in * math.prod(size))
    names = ("d", "h", "w")[3 - len(size):]
    geo = {**_geo(names, k_=k, s_=st, p_=p, d_=dil), **{f"{a}_out": v for a, v in zip(names, out)},
           **{("w_in" if a == "w" else a): v for a, v in zip(names, size)}}
    cls = T.Conv3dBackwardInput if len(size) == 3 else T.Conv2dBackwardInput
    name = f"{cls.__name__}-{n}x{c_in}to{c_out}x{'x'.join(map(str, size))}-k{k}-s{st}-p{p}-d{dil}-g{groups}"
    s.add(name, cls(dy=dy, w=w, dx=dx, n=n, c_in=c_in, c_out=c_out, groups=groups, **geo), [o],
          atol=1e-4, rtol=1e-4)
    return name


def add_conv_bwd_weight(s: Suite, n: int, c_in: int, c_out: int, size: tuple, k: tuple, st: tuple, p: tuple,
                        dil: tuple, groups: int = 1) -> str:
    """A Conv2dBackwardWeight / Conv3dBackwardWeight case (forward geometry); returns its name."""
    out = tuple(out_size(*a) for a in zip(size, k, st, p, dil))
    x = s.put(s.normal(n * c_in * math.prod(size)))
    dy = s.put(s.normal(n * c_out * math.prod(out)))
    dw, o = s.out(np.float32, c_out * (c_in // groups) * math.prod(k))
    names = ("d", "h", "w")[3 - len(size):]
    geo = {**_geo(names, k_=k, s_=st, p_=p), **{f"{a}_out": v for a, v in zip(names, out)},
           **{a: v for a, v in zip(names, size)},
           **{("dw_dil" if a == "w" else f"d{a}"): v for a, v in zip(names, dil)}}
    cls = T.Conv3dBackwardWeight if len(size) == 3 else T.Conv2dBackwardWeight
    name = f"{cls.__name__}-{n}x{c_in}to{c_out}x{'x'.join(map(str, size))}-k{k}-s{st}-p{p}-d{dil}-g{groups}"
    s.add(name, cls(x=x, dy=dy, dw=dw, n=n, c_in=c_in, c_out=c_out, groups=groups, **geo), [o],
          atol=2e-4, rtol=2e-4)
    return name


def add_max_pool_bwd(s: Suite, n: int, c: int, size: tuple, k: tuple, st: tuple, p: tuple, x=None,
                     tag: str = "") -> str:
    """A MaxPool2dBackward (2-tuple) or MaxPool3dBackward (3-tuple) case; `x` overrides the input."""
    out = tuple(out_size(*a) for a in zip(size, k, st, p))
    count_in, count_out = n * c * math.prod(size), n * c * math.prod(out)
    src = s.put(s.normal(count_in) if x is None else np.asarray(x, np.float32).reshape(-1))
    dy = s.put(s.normal(count_out))
    dx, o = s.out(np.float32, count_in)
    names = ("d", "h", "w")[3 - len(size):]
    geo = {**{a: v for a, v in zip(names, size)}, **{f"{a}_out": v for a, v in zip(names, out)},
           **_geo(names, k_=k, s_=st, p_=p)}
    cls = T.MaxPool3dBackward if len(size) == 3 else T.MaxPool2dBackward
    name = f"{cls.__name__}-{n}x{c}x{'x'.join(map(str, size))}-k{k}-s{st}-p{p}{tag}"
    s.add(name, cls(x=src, dy=dy, dx=dx, n=n, c=c, **geo), [o], atol=1e-5, rtol=1e-5)
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

CONVT2D = [  # (n, c_in, c_out, (h, w), k, s, p, dil, output_padding, groups)
    (1, 1, 1, (1, 1), (1, 1), (1, 1), (0, 0), (1, 1), (0, 0), 1),
    (1, 5, 7, (6, W + 1), (1, 1), (1, 1), (0, 0), (1, 1), (0, 0), 1),          # 1×1: the GEMM writes the output
    (2, 3, 5, (7, W - 1), (3, 3), (1, 1), (1, 1), (1, 1), (0, 0), 1),          # output widths W − 1, W, W + 1
    (1, 3, 4, (6, W), (3, 3), (1, 1), (1, 1), (1, 1), (0, 0), 1),
    (2, 2, 3, (5, W + 1), (3, 3), (1, 1), (1, 1), (1, 1), (0, 0), 1),
    (1, 4, 3, (9, 11), (4, 4), (2, 2), (1, 1), (1, 1), (0, 0), 1),            # the DCGAN k4 s2 p1 upsampler
    (1, 3, 4, (8, 13), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), 1),            # stride 2, output padding 1
    (2, 4, 4, (5, 2 * W + 1), (3, 3), (3, 3), (2, 2), (1, 1), (2, 1), 1),     # stride 3, padding 2
    (1, 2, 3, (7, 9), (3, 2), (2, 3), (0, 1), (2, 2), (1, 2), 1),             # dilation 2, op < max(s, dil)
    (1, 2, 2, (4, 5), (1, 1), (2, 2), (0, 0), (1, 1), (1, 1), 1),             # 1×1 stride 2: gaps stay zero
    (1, 2, 2, (3, 4), (3, 3), (1, 1), (2, 2), (1, 1), (0, 0), 1),             # padding eats most taps
    (2, 4, 6, (5, 7), (3, 3), (1, 1), (1, 1), (1, 1), (0, 0), 2),             # groups 2 (4 items, unrolled)
    (3, 6, 9, (5, 8), (3, 3), (2, 1), (1, 1), (1, 1), (1, 0), 3),             # 9 items: a loop
    (2, 8, 8, (6, W + 3), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), 8),         # depthwise
    (1, 0, 3, (4, 4), (3, 3), (1, 1), (1, 1), (1, 1), (0, 0), 1),             # no input channels: zeros
    (1, 16, 16, (14, 14), (4, 4), (2, 2), (1, 1), (1, 1), (0, 0), 1),         # col2im split across threads
    (4, 16, 8, (12, 12), (4, 4), (2, 2), (1, 1), (1, 1), (0, 0), 1),          # items split across threads
    (1, 2, 2, (0, 3), (3, 3), (1, 1), (0, 0), (1, 1), (0, 0), 1),             # no input rows: zeros
]
CONVT3D = [  # (n, c_in, c_out, (d, h, w), k, s, p, dil, output_padding, groups)
    (1, 1, 1, (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1), (0, 0, 0), 1),
    (2, 3, 4, (3, 4, 5), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (0, 0, 0), 1),
    (1, 4, 6, (3, 4, W + 1), (2, 3, 3), (2, 1, 2), (1, 1, 1), (1, 1, 2), (1, 0, 1), 2),
    (2, 4, 4, (3, 3, 4), (2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1), (0, 0, 0), 4),  # depthwise, stride 2
]
CONVBI2D = [  # (n, c_in, c_out, (h, w), k, s, p, dil, groups): the forward geometry
    (2, 3, 5, (7, W + 1), (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (1, 3, 4, (17, 23), (3, 3), (2, 2), (1, 1), (1, 1), 1),            # rows/cols no window reaches get 0
    (2, 4, 4, (13, 29), (3, 3), (3, 3), (2, 2), (1, 1), 1),
    (2, 3, 4, (12, 15), (3, 3), (1, 1), (2, 2), (2, 2), 1),
    (3, 6, 9, (5, 8), (3, 3), (2, 1), (1, 1), (1, 1), 3),
    (1, 5, 7, (6, 9), (1, 1), (1, 1), (0, 0), (1, 1), 1),
]
CONVBW2D = CONVBI2D + [  # plus: depthwise, 1×1 direct with batch, no output pixels, a big one for threads
    (2, 8, 8, (9, W + 3), (3, 3), (1, 1), (1, 1), (1, 1), 8),
    (3, 5, 7, (6, W - 1), (1, 1), (1, 1), (0, 0), (1, 1), 1),
    (1, 2, 2, (2, 5), (3, 3), (1, 1), (0, 0), (1, 1), 1),
    (2, 32, 32, (20, 20), (3, 3), (1, 1), (1, 1), (1, 1), 4),
]
CONVBI3D = [
    (1, 4, 6, (6, 5, W + 1), (3, 3, 3), (2, 1, 2), (1, 1, 1), (2, 1, 1), 2),
]
MAXPOOL_BWD = [  # (n, c, size, k, s, p)
    (1, 1, (1, 1), (1, 1), (1, 1), (0, 0)),
    (1, 2, (5, W - 1), (3, 3), (1, 1), (1, 1)),              # overlapping windows: dy accumulates
    (2, 3, (6, W), (3, 3), (1, 1), (1, 1)),
    (1, 2, (7, W + 1), (3, 3), (1, 1), (1, 1)),
    (2, 3, (8, 2 * W + 6), (2, 2), (2, 2), (0, 0)),
    (1, 4, (17, 23), (3, 3), (2, 2), (1, 1)),
    (1, 2, (13, 3 * W + 4), (3, 3), (3, 3), (2, 2)),
    (1, 2, (5, 2 * W + 1), (2, 2), (1, 1), (2, 2)),          # windows entirely in the padding: dropped
    (1, 1, (1, 5), (3, 3), (1, 1), (0, 0)),                  # no outputs: dx all zero
    (2, 16, (40, 40), (3, 3), (2, 2), (1, 1)),               # planes split across threads
    (2, 3, (4, 4, W + 2), (2, 2, 2), (2, 2, 2), (0, 0, 0)),
    (1, 2, (5, 6, W + 1), (2, 3, 3), (1, 2, 1), (1, 1, 1)),
    (1, 2, (3, 3, 9), (1, 2, 2), (1, 1, 1), (1, 2, 2)),
]

HAND_WINDOWS = {  # one 1×4 window each: (input row, the tap its dy must reach)
    "-first-nan": [1.0, np.nan, 3.0, np.nan],
    "-signed-zero-tie": [-0.0, 0.0, -np.inf, 0.0],
    "-all-minus-inf": [-np.inf] * 4,
    "-inf-after-nan": [np.nan, np.inf, 2.0, np.inf],
    "-tie-not-first": [-1.0, 4.0, 4.0, 3.0],
}
HAND_TAPS = {"-first-nan": 1, "-signed-zero-tie": 0, "-all-minus-inf": 0, "-inf-after-nan": 0, "-tie-not-first": 1}


def tie_input(shape: tuple) -> np.ndarray:
    """Small integers (many ties, ±0 ties), with NaN pairs and ±inf planted."""
    rng = np.random.default_rng(5)
    x = rng.integers(-2, 3, size=shape).astype(np.float32)
    x[x == 0] = np.where(rng.random(int((x == 0).sum())) < 0.5, 0.0, -0.0)
    flat = x.reshape(-1)
    flat[[3, 4, 20, 41, 42, 60]] = [np.nan, np.nan, np.inf, -np.inf, -np.inf, np.nan]
    x.reshape(-1)[-12:] = -np.inf                                        # a window of −∞ only
    return x


def build() -> Suite:
    s = Suite(11, rtol=2e-5, atol=2e-5)
    for kind in (MAX, MEAN):
        for n, c, size, k, st, p in POOL2D + POOL3D:
            add_pool(s, kind, n, c, size, k, st, p)
        add_pool(s, kind, 2, 3, (9, 2 * W + 5), (3, 3), (2, 1), (1, 1), specials=True)
        add_pool(s, kind, 1, 2, (4, 5, W + 1), (2, 3, 3), (1, 1, 2), (1, 1, 1), specials=True)
    for geo in CONV2D + CONV3D:
        add_conv(s, *geo[:8], groups=geo[8])
    add_conv(s, 2, 3, 4, (9, W + 2), (3, 3), (1, 2), (1, 1), (1, 1), specials=True)
    for geo in CONVT2D + CONVT3D:
        add_convt(s, *geo[:9], groups=geo[9])
    add_convt(s, 2, 3, 4, (6, W + 2), (3, 3), (2, 1), (1, 1), (1, 1), (1, 0), specials=True)
    for geo in CONVBI2D + CONVBI3D:
        add_conv_bwd_input(s, *geo[:8], groups=geo[8])
    for geo in CONVBW2D + CONVBI3D:
        add_conv_bwd_weight(s, *geo[:8], groups=geo[8])
    add_conv_bwd_weight(s, 2, 3, 4, (3, 4, 5), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    for geo in MAXPOOL_BWD:
        add_max_pool_bwd(s, *geo)
    add_max_pool_bwd(s, 1, 2, (6, 11), (3, 3), (2, 2), (1, 1), x=tie_input((1, 2, 6, 11)), tag="-ties")
    add_max_pool_bwd(s, 1, 2, (4, 5, 7), (2, 3, 3), (1, 2, 2), (1, 1, 1), x=tie_input((1, 2, 4, 5, 7)),
                     tag="-ties")
    for tag, row in HAND_WINDOWS.items():
        add_max_pool_bwd(s, 1, 1, (1, 4), (1, 4), (1, 1), (0, 0), x=row, tag=tag)
    for tag in REPEATS:  # the same shapes at other offsets: one shared body each (like stacked layers)
        add_pool(s, MAX, *POOL2D[5], tag=tag)
        add_pool(s, MEAN, *POOL3D[2], tag=tag)
        add_conv(s, *CONV2D[8][:8], groups=CONV2D[8][8], tag=tag)     # unrolled GEMMs
        add_conv(s, *CONV2D[16][:8], groups=CONV2D[16][8], tag=tag)   # a loop of GEMMs
        add_conv(s, *CONV3D[2][:8], groups=CONV3D[2][8], tag=tag)
        add_convt(s, *CONVT2D[5][:9], groups=CONVT2D[5][9], tag=tag)
        add_convt(s, *CONVT2D[12][:9], groups=CONVT2D[12][9], tag=tag)
        add_max_pool_bwd(s, *MAXPOOL_BWD[5], tag=tag)
    return s


REPEATS = ("-again", "-thrice")


SUITE = build()
(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


def test_repeated_shapes_share_one_body(outcome: Outcome) -> None:
    """Cases that differ only in buffer offsets call one compiled body (every kind is shared_body)."""
    names = [c.name for c in SUITE.cases]
    report = outcome.program.report()
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
    expect_invalid(pool2d(kind=ReduceOp.Sum), 1 << 14, "kind")


def test_pool_kernel_must_be_positive() -> None:
    expect_invalid(pool2d(kh=0), 1 << 14, "kh")
    expect_invalid(pool3d(kd=0), 1 << 14, "kd")


def test_pool_stride_must_be_positive() -> None:
    expect_invalid(pool2d(sw=0), 1 << 14, "sw")
    expect_invalid(pool3d(sd=0), 1 << 14, "sd")


def test_pool_output_dims_must_match() -> None:
    expect_invalid(pool2d(h_out=4), 1 << 14, "h_out")
    expect_invalid(pool2d(w_out=2), 1 << 14, "w_out")
    expect_invalid(pool3d(d_out=3), 1 << 14, "d_out")


def test_conv_needs_a_group() -> None:
    expect_invalid(conv2d(groups=0), 1 << 14, "groups")


def test_conv_groups_must_divide_channels() -> None:
    expect_invalid(conv2d(c_in=3, groups=2), 1 << 14, "groups")
    expect_invalid(conv2d(c_out=5, groups=2), 1 << 14, "groups")
    expect_invalid(conv3d(c_in=3, groups=2), 1 << 14, "groups")


def test_conv_kernel_stride_dilation_must_be_positive() -> None:
    for field in ("kh", "kw", "sh", "sw", "dh", "dw"):
        expect_invalid(conv2d(**{field: 0}), 1 << 14, field)
    for field in ("kd", "sd", "dd"):
        expect_invalid(conv3d(**{field: 0}), 1 << 14, field)


def test_conv_output_dims_must_match() -> None:
    expect_invalid(conv2d(h_out=5), 1 << 14, "h_out")
    expect_invalid(conv2d(w_out=7, dw=2), 1 << 14, "w_out")
    expect_invalid(conv3d(d_out=2), 1 << 14, "d_out")


def test_conv_gemm_dims_must_fit_blas_ints() -> None:
    """K = c_in/groups·kh·kw = 2^32 (no images and no output channels, so every extent is empty)."""
    expect_invalid(conv2d(n=0, c_out=0, c_in=1 << 16, groups=1, kh=1 << 8, kw=1 << 8, ph=0, pw=0, h=1 << 8,
                          w=1 << 8, h_out=1, w_out=1), 1 << 14, "c_in")


# ── transposed convolution, conv input gradient, max-pool backward ─────────

def test_conv_transpose_matches_torch(outcome: Outcome) -> None:
    """ConvTranspose2d/3d (strides, padding, dilation, output padding, groups) agree with torch."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    picks = [CONVT2D[5], CONVT2D[7], CONVT2D[8], CONVT2D[12], CONVT2D[13], CONVT3D[2], CONVT3D[3]]
    for geo in picks:
        n, c_in, c_out, size, k, st, p, dil, op, groups = geo
        three = len(size) == 3
        cls = "ConvTranspose3d" if three else "ConvTranspose2d"
        name = f"{cls}-{n}x{c_in}to{c_out}x{'x'.join(map(str, size))}-k{k}-s{st}-p{p}-d{dil}-op{op}-g{groups}"
        t = outcome.case(name).thunk
        x = torch.from_numpy(_input(outcome, t.src, n, c_in, *size))
        w = torch.from_numpy(_input(outcome, t.weight, c_in, c_out // groups, *k))
        f = F.conv_transpose3d if three else F.conv_transpose2d
        want = f(x, w, stride=st, padding=p, dilation=dil, output_padding=op, groups=groups).numpy().reshape(-1)
        np.testing.assert_allclose(_got(outcome, name), want, rtol=1e-4, atol=1e-4, err_msg=name)


def test_conv_backward_input_matches_torch(outcome: Outcome) -> None:
    """Conv2dBackwardInput / Conv3dBackwardInput are torch's conv input gradient."""
    torch = pytest.importorskip("torch")
    for geo in (CONVBI2D[1], CONVBI2D[3], CONVBI2D[4], CONVBI3D[0]):
        n, c_in, c_out, size, k, st, p, dil, groups = geo
        three = len(size) == 3
        cls = "Conv3dBackwardInput" if three else "Conv2dBackwardInput"
        name = f"{cls}-{n}x{c_in}to{c_out}x{'x'.join(map(str, size))}-k{k}-s{st}-p{p}-d{dil}-g{groups}"
        t = outcome.case(name).thunk
        out = tuple(out_size(*a) for a in zip(size, k, st, p, dil))
        dy = torch.from_numpy(_input(outcome, t.dy, n, c_out, *out))
        w = torch.from_numpy(_input(outcome, t.w, c_out, c_in // groups, *k))
        f = torch.nn.grad.conv3d_input if three else torch.nn.grad.conv2d_input
        want = f((n, c_in, *size), w, dy, stride=st, padding=p, dilation=dil, groups=groups).numpy().reshape(-1)
        np.testing.assert_allclose(_got(outcome, name), want, rtol=1e-4, atol=1e-4, err_msg=name)


def test_conv_backward_weight_matches_torch(outcome: Outcome) -> None:
    """Conv2dBackwardWeight / Conv3dBackwardWeight are torch's conv weight gradient."""
    torch = pytest.importorskip("torch")
    for geo in (CONVBW2D[1], CONVBW2D[3], CONVBW2D[4], CONVBW2D[6], CONVBI3D[0]):
        n, c_in, c_out, size, k, st, p, dil, groups = geo
        three = len(size) == 3
        cls = "Conv3dBackwardWeight" if three else "Conv2dBackwardWeight"
        name = f"{cls}-{n}x{c_in}to{c_out}x{'x'.join(map(str, size))}-k{k}-s{st}-p{p}-d{dil}-g{groups}"
        t = outcome.case(name).thunk
        out = tuple(out_size(*a) for a in zip(size, k, st, p, dil))
        x = torch.from_numpy(_input(outcome, t.x, n, c_in, *size))
        dy = torch.from_numpy(_input(outcome, t.dy, n, c_out, *out))
        f = torch.nn.grad.conv3d_weight if three else torch.nn.grad.conv2d_weight
        want = f(x, (c_out, c_in // groups, *k), dy, stride=st, padding=p, dilation=dil, groups=groups)
        np.testing.assert_allclose(_got(outcome, name), want.numpy().reshape(-1), rtol=2e-4, atol=2e-4, err_msg=name)


def test_conv_transpose_is_the_adjoint_of_conv(outcome: Outcome) -> None:
    """⟨conv(x), y⟩ = ⟨x, convT(y)⟩, with conv the Conv2D / Conv3d float64 reference on the same weight."""
    from rlx_llvm.reference.conv import conv as conv_ref
    rng = np.random.default_rng(3)
    for geo in CONVT2D[2:14] + CONVT3D:
        n, c_in, c_out, size, k, st, p, dil, op, groups = geo
        if any(o >= s_ for o, s_ in zip(op, st)) or c_in == 0:
            continue  # output padding ≥ stride: the forward conv of the output has a different size
        three = len(size) == 3
        cls = "ConvTranspose3d" if three else "ConvTranspose2d"
        name = f"{cls}-{n}x{c_in}to{c_out}x{'x'.join(map(str, size))}-k{k}-s{st}-p{p}-d{dil}-op{op}-g{groups}"
        t = outcome.case(name).thunk
        out = tuple(convt_out(*a) for a in zip(size, k, st, p, dil, op))
        y = _input(outcome, t.src, n, c_in, *size).astype(np.float64)
        w = _input(outcome, t.weight, c_in, c_out // groups, *k)
        x = rng.standard_normal((n, c_out, *out)).astype(np.float32)
        # the forward conv c_out → c_in on the output geometry, weight [c_in, c_out/groups, k…]
        arena = np.zeros(4 * (x.size + w.size + y.size), np.uint8)
        arena[:4 * x.size] = x.reshape(-1).view(np.uint8)
        arena[4 * x.size:4 * (x.size + w.size)] = w.reshape(-1).view(np.uint8)
        names = ("d", "h", "w")[3 - len(size):]
        geo_kw = {**_geo(names, k_=k, s_=st, p_=p, d_=dil), **{a: v for a, v in zip(names, out)},
                  **{f"{a}_out": v for a, v in zip(names, size)}}
        fwd = (T.Conv3d if three else T.Conv2D)(src=0, weight=4 * x.size, dst=4 * (x.size + w.size), n=n,
                                                 c_in=c_out, c_out=c_in, groups=groups, **geo_kw)
        conv_ref(arena, fwd)
        cx = arena[4 * (x.size + w.size):].view(np.float32).astype(np.float64)
        lhs = float(cx @ y.reshape(-1))
        rhs = float(x.reshape(-1).astype(np.float64) @ _got(outcome, name).astype(np.float64))
        assert abs(lhs - rhs) <= 1e-4 * (1 + abs(lhs)), (name, lhs, rhs)


def test_conv_transpose_nan_and_inf_inputs_propagate(outcome: Outcome) -> None:
    """A NaN or ±inf input reaches every output its taps land on (x·w with finite nonzero w)."""
    name = f"ConvTranspose2d-2x3to4x6x{W + 2}-k(3, 3)-s(2, 1)-p(1, 1)-d(1, 1)-op(1, 0)-g1-nan"
    t = outcome.case(name).thunk
    x = _input(outcome, t.src, t.n, t.c_in, t.h, t.w_in)
    y = _got(outcome, name).reshape(t.n, t.c_out, t.h_out, t.w_out)
    for img, _, i, j in zip(*np.nonzero(~np.isfinite(x))):
        for ki in range(t.kh):
            for kj in range(t.kw):
                oy, ox = i * t.sh + ki - t.ph, j * t.sw + kj - t.pw
                if 0 <= oy < t.h_out and 0 <= ox < t.w_out:
                    assert not np.isfinite(y[img, :, oy, ox]).any(), (img, oy, ox)


def test_max_pool_backward_matches_torch(outcome: Outcome) -> None:
    """Without ties, the routed gradient is torch's max_pool2d / max_pool3d gradient."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    for geo in (MAXPOOL_BWD[2], MAXPOOL_BWD[4], MAXPOOL_BWD[5], MAXPOOL_BWD[9], MAXPOOL_BWD[11]):
        n, c, size, k, st, p = geo
        three = len(size) == 3
        cls = "MaxPool3dBackward" if three else "MaxPool2dBackward"
        name = f"{cls}-{n}x{c}x{'x'.join(map(str, size))}-k{k}-s{st}-p{p}"
        t = outcome.case(name).thunk
        out = tuple(out_size(*a) for a in zip(size, k, st, p))
        x = torch.from_numpy(_input(outcome, t.x, n, c, *size)).requires_grad_()
        dy = torch.from_numpy(_input(outcome, t.dy, n, c, *out))
        (F.max_pool3d if three else F.max_pool2d)(x, k, st, p).backward(dy)
        np.testing.assert_allclose(_got(outcome, name), x.grad.numpy().reshape(-1), rtol=1e-6, atol=1e-6,
                                   err_msg=name)


@pytest.mark.parametrize("tag", list(HAND_WINDOWS))
def test_max_pool_backward_routes_to_the_first_arg_max(outcome: Outcome, tag: str) -> None:
    """NaN wins (the first NaN, as the forward Max propagates NaN); ties → the lowest tap; −∞ windows → the first."""
    name = f"MaxPool2dBackward-1x1x1x4-k(1, 4)-s(1, 1)-p(0, 0){tag}"
    t = outcome.case(name).thunk
    dy = _input(outcome, t.dy, 1)[0]
    want = np.zeros(4, np.float32)
    want[HAND_TAPS[tag]] = dy
    np.testing.assert_array_equal(_got(outcome, name), want)


def test_max_pool_backward_drops_all_padding_windows(outcome: Outcome) -> None:
    """dy of a window entirely in the padding goes nowhere: dx sums only the reachable dy."""
    name = f"MaxPool2dBackward-1x2x5x{2 * W + 1}-k(2, 2)-s(1, 1)-p(2, 2)"
    t = outcome.case(name).thunk
    dy = _input(outcome, t.dy, 2, t.h_out, t.w_out)
    inner = dy[:, 1:-1, 1:-1].sum(axis=(1, 2))
    got = _got(outcome, name).reshape(2, -1).astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(got, inner, rtol=1e-4, atol=1e-4)


def convt2d(**kw) -> T.ConvTranspose2d:
    base = dict(src=0, weight=4096, dst=8192, n=1, c_in=4, h=4, w_in=4, c_out=4, h_out=8, w_out=8, kh=4, kw=4,
                sh=2, sw=2, ph=1, pw=1, dh=1, dw=1, groups=2)
    return T.ConvTranspose2d(**{**base, **kw})


def convt3d(**kw) -> T.ConvTranspose3d:
    base = dict(src=0, weight=4096, dst=8192, n=1, c_in=2, d=2, h=3, w_in=3, c_out=2, d_out=4, h_out=5, w_out=5,
                kd=2, kh=3, kw=3, sd=2, sh=2, sw=2, pd=0, ph=1, pw=1, dd=1, dh=1, dw=1, groups=1)
    return T.ConvTranspose3d(**{**base, **kw})


def conv2d_bi(**kw) -> T.Conv2dBackwardInput:
    base = dict(dy=0, w=4096, dx=8192, n=1, c_in=4, h=6, w_in=6, c_out=4, h_out=3, w_out=3, kh=3, kw=3, sh=2,
                sw=2, ph=1, pw=1, dh=1, dw=1, groups=2)
    return T.Conv2dBackwardInput(**{**base, **kw})


def conv3d_bi(**kw) -> T.Conv3dBackwardInput:
    base = dict(dy=0, w=4096, dx=8192, n=1, c_in=2, d=3, h=4, w_in=4, c_out=2, d_out=3, h_out=4, w_out=4, kd=3,
                kh=3, kw=3, sd=1, sh=1, sw=1, pd=1, ph=1, pw=1, dd=1, dh=1, dw=1, groups=1)
    return T.Conv3dBackwardInput(**{**base, **kw})


def conv2d_bw(**kw) -> T.Conv2dBackwardWeight:
    base = dict(x=0, dy=4096, dw=8192, n=1, c_in=4, h=6, w=6, c_out=4, h_out=3, w_out=3, kh=3, kw=3, sh=2,
                sw=2, ph=1, pw=1, dh=1, dw_dil=1, groups=2)
    return T.Conv2dBackwardWeight(**{**base, **kw})


def conv3d_bw(**kw) -> T.Conv3dBackwardWeight:
    base = dict(x=0, dy=4096, dw=8192, n=1, c_in=2, d=3, h=4, w=4, c_out=2, d_out=3, h_out=4, w_out=4, kd=3,
                kh=3, kw=3, sd=1, sh=1, sw=1, pd=1, ph=1, pw=1, dd=1, dh=1, dw_dil=1, groups=1)
    return T.Conv3dBackwardWeight(**{**base, **kw})


def maxpool2d_bwd(**kw) -> T.MaxPool2dBackward:
    base = dict(x=0, dy=4096, dx=8192, n=1, c=2, h=6, w=6, h_out=3, w_out=3, kh=2, kw=2, sh=2, sw=2, ph=0, pw=0)
    return T.MaxPool2dBackward(**{**base, **kw})


def maxpool3d_bwd(**kw) -> T.MaxPool3dBackward:
    base = dict(x=0, dy=4096, dx=8192, n=1, c=2, d=4, h=6, w=6, d_out=2, h_out=3, w_out=3, kd=2, kh=2, kw=2, sd=2,
                sh=2, sw=2, pd=0, ph=0, pw=0)
    return T.MaxPool3dBackward(**{**base, **kw})


def test_convt_validation_is_valid_baseline() -> None:
    """The bad-input bases themselves compile (so each failure below is the one rule)."""
    import rlx_llvm as rl
    for thunk in (convt2d(), convt3d(), conv2d_bi(), conv3d_bi(), conv2d_bw(), conv3d_bw(), maxpool2d_bwd(),
                  maxpool3d_bwd(),
                  convt2d(h_out=9, w_out=9)):   # output padding 1 < stride 2
        rl.compile(rl.ThunkSchedule([thunk], arena_bytes=1 << 14), cache=False)


def test_convt_needs_a_group_dividing_channels() -> None:
    expect_invalid(convt2d(groups=0), 1 << 14, "groups")
    expect_invalid(convt2d(c_in=3, groups=2), 1 << 14, "groups")
    expect_invalid(convt2d(c_out=5, groups=2), 1 << 14, "groups")
    expect_invalid(convt3d(c_out=3, groups=2), 1 << 14, "groups")


def test_convt_kernel_stride_dilation_must_be_positive() -> None:
    for field in ("kh", "kw", "sh", "sw", "dh", "dw"):
        expect_invalid(convt2d(**{field: 0}), 1 << 14, field)
    for field in ("kd", "sd", "dd"):
        expect_invalid(convt3d(**{field: 0}), 1 << 14, field)


def test_convt_output_dims_must_match() -> None:
    """Below the formula, or output padding ≥ max(stride, dilation)."""
    expect_invalid(convt2d(h_out=7), 1 << 14, "h_out")
    expect_invalid(convt2d(h_out=10), 1 << 14, "h_out")       # output padding 2 = stride
    expect_invalid(convt2d(w_out=10), 1 << 14, "w_out")
    expect_invalid(convt3d(d_out=6), 1 << 14, "d_out")
    expect_invalid(convt3d(d_out=3), 1 << 14, "d_out")


def test_convt_gemm_dims_must_fit_blas_ints() -> None:
    """m = c_out/groups·kh·kw = 2^32 (no images, no input channels: every extent is empty)."""
    expect_invalid(convt2d(n=0, c_in=0, c_out=1 << 16, groups=1, h=1, w_in=1, kh=256, kw=256, sh=1, sw=1, ph=0,
                           pw=0, h_out=256, w_out=256), 1 << 14, "c_out")


def test_conv_backward_input_checks_the_forward_geometry() -> None:
    expect_invalid(conv2d_bi(groups=0), 1 << 14, "groups")
    expect_invalid(conv2d_bi(c_in=3, groups=2), 1 << 14, "groups")
    expect_invalid(conv2d_bi(c_out=5, groups=2), 1 << 14, "groups")
    for field in ("kh", "kw", "sh", "sw", "dh", "dw"):
        expect_invalid(conv2d_bi(**{field: 0}), 1 << 14, field)
    for field in ("kd", "sd", "dd"):
        expect_invalid(conv3d_bi(**{field: 0}), 1 << 14, field)
    expect_invalid(conv2d_bi(h_out=4), 1 << 14, "h_out")
    expect_invalid(conv2d_bi(w_out=2), 1 << 14, "w_out")
    expect_invalid(conv3d_bi(d_out=2), 1 << 14, "d_out")


def test_conv_backward_input_gemm_dims_must_fit_blas_ints() -> None:
    """m = c_in/groups·kh·kw = 2^32 with no images and no dy channels."""
    expect_invalid(conv2d_bi(n=0, c_out=0, c_in=1 << 16, groups=1, kh=256, kw=256, ph=0, pw=0, sh=1, sw=1,
                             h=256, w_in=256, h_out=1, w_out=1), 1 << 14, "c_in")


def test_max_pool_backward_checks_the_forward_geometry() -> None:
    expect_invalid(maxpool2d_bwd(kh=0), 1 << 14, "kh")
    expect_invalid(maxpool3d_bwd(kd=0), 1 << 14, "kd")
    expect_invalid(maxpool2d_bwd(sw=0), 1 << 14, "sw")
    expect_invalid(maxpool3d_bwd(sd=0), 1 << 14, "sd")
    expect_invalid(maxpool2d_bwd(h_out=4), 1 << 14, "h_out")
    expect_invalid(maxpool2d_bwd(w_out=2), 1 << 14, "w_out")
    expect_invalid(maxpool3d_bwd(d_out=3), 1 << 14, "d_out")


def test_conv_backward_weight_checks_the_forward_geometry() -> None:
    expect_invalid(conv2d_bw(groups=0), 1 << 14, "groups")
    expect_invalid(conv2d_bw(c_in=3, groups=2), 1 << 14, "groups")
    expect_invalid(conv2d_bw(c_out=5, groups=2), 1 << 14, "groups")
    for field in ("kh", "kw", "sh", "sw", "dh", "dw_dil"):
        expect_invalid(conv2d_bw(**{field: 0}), 1 << 14, field)
    for field in ("kd", "sd", "dd", "dw_dil"):
        expect_invalid(conv3d_bw(**{field: 0}), 1 << 14, field)
    expect_invalid(conv2d_bw(h_out=4), 1 << 14, "h_out")
    expect_invalid(conv2d_bw(w_out=2), 1 << 14, "w_out")
    expect_invalid(conv3d_bw(d_out=2), 1 << 14, "d_out")


def test_conv_backward_weight_gemm_dims_must_fit_blas_ints() -> None:
    """K = c_in/groups·kh·kw = 2^32 (no images, no output channels: every extent is empty)."""
    expect_invalid(conv2d_bw(n=0, c_out=0, c_in=1 << 16, groups=1, kh=256, kw=256, ph=0, pw=0, sh=1, sw=1,
                             h=256, w=256, h_out=1, w_out=1), 1 << 14, "c_in")
