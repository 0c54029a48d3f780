"""FFTs along the last axis (one Fft1d each), complex parts, and pyrlx's real-signal helpers built from them.

    X = g.fft(z)                          # c64 [..., n], or f32/f64 real-block rows [..., 2n]
    re, im = g.rfft(x, norm="ortho")      # real x [..., n] → the n//2 + 1 non-negative frequencies
    y = g.irfft(re, im, n=16)             # back to a real [..., 16] signal

Norms are pyrlx's (semantics.md §2.16), not NumPy's names: "backward"/"none" scales in neither
direction (`ifft(fft(x)) = n·x`), "forward" scales the inverse by 1/n (NumPy's default pair),
"ortho" both by 1/√n.
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..dtypes import DType
from .checks import require_f32
from .core import DYNAMIC, GraphError, Node, Value, numel
from .lower import LowerContext
from .opset import infers, lowers

FFT_NORMS = {"backward": 0, "none": 0, "forward": 1, "ortho": 2, "orthonormal": 2}
FFT_DTYPES = (DType.C64, DType.F32, DType.F64)


class FftOps:
    """Builders for FFTs and complex parts (mixed into `Graph`)."""

    def fft(self, x: Value, inverse: bool = False, norm: str = "backward") -> Value:
        """FFT along the last axis: c64 `[..., n]`, or f32/f64 `[..., 2n]` rows `[re_0 … re_{n−1}, im_0 … im_{n−1}]`."""
        if str(norm).lower() not in FFT_NORMS:
            raise GraphError(f"fft: unknown norm {norm!r} (use backward, forward or ortho)")
        return self.add_node("fft", (x,), {"inverse": bool(inverse), "norm": str(norm).lower()})

    def fft_norm(self, x: Value, inverse: bool, norm: str) -> Value:
        """pyrlx's name for `fft(x, inverse, norm)`."""
        return self.fft(x, inverse, norm)

    def real(self, z: Value) -> Value:
        """Real parts of a c64 tensor, as f32."""
        return self.add_node("complex_part", (z,), {"part": 0})

    def imag(self, z: Value) -> Value:
        """Imaginary parts of a c64 tensor, as f32."""
        return self.add_node("complex_part", (z,), {"part": 1})

    def complex(self, re: Value, im: Value) -> Value:
        """The c64 tensor `re + i·im` of two f32 tensors of one shape."""
        return self.add_node("complex", (re, im))

    def fft_real(self, x: Value, norm: str = "backward") -> tuple[Value, Value]:
        """`(re, im)` of the full spectrum of real f32 rows `x [..., n]`."""
        z = self.fft(self.cast(x, DType.C64), norm=norm)
        return self.real(z), self.imag(z)

    def rfft(self, x: Value, norm: str = "backward") -> tuple[Value, Value]:
        """`(re, im)` of the `n//2 + 1` non-negative frequencies of real f32 rows `x [..., n]` (n static)."""
        n = _static_last(x, "rfft")
        z = self.narrow(self.fft(self.cast(x, DType.C64), norm=norm), -1, 0, n // 2 + 1)
        return self.real(z), self.imag(z)

    def irfft(self, re: Value, im: Value, n: "int | None" = None, norm: str = "backward") -> Value:
        """Real rows `[..., n]` whose spectrum's non-negative half is `re + i·im` (n defaults to 2·(m − 1));
        the negative half is the conjugate mirror, and imaginary parts at 0 and n/2 drop, as NumPy's."""
        m = _static_last(re, "irfft")
        n = 2 * (m - 1) if n is None else int(n)
        half = n // 2 + 1
        if n < 1 or half > m:
            raise GraphError(f"irfft: n = {n} needs {half} frequencies, got re {list(re.shape)}")
        re, im = (v if m == half else self.narrow(v, -1, 0, half) for v in (re, im))
        mirror = np.arange(n - half, 0, -1, dtype=np.int32)        # bins half … n−1 read bins n−k
        if mirror.size:
            idx = self.constant(mirror, "i32")
            re = self.concat([re, self.gather(re, idx, -1)], -1)
            im = self.concat([im, -self.gather(im, idx, -1)], -1)
        return self.real(self.fft(self.complex(re, im), inverse=True, norm=norm))

    def fftfreq(self, n: int, d: float = 1.0) -> Value:
        """Sample frequencies of an n-point FFT (a constant, NumPy's order)."""
        return self.constant(np.fft.fftfreq(n, d).astype(np.float32))

    def rfftfreq(self, n: int, d: float = 1.0) -> Value:
        """The `n//2 + 1` non-negative sample frequencies (a constant)."""
        return self.constant(np.fft.rfftfreq(n, d).astype(np.float32))


def _static_last(x: Value, op: str) -> int:
    if not x.shape or x.shape[-1] == DYNAMIC:
        raise GraphError(f"{op}: the last axis must be static, got {list(x.shape)}")
    return x.shape[-1]


@infers("fft")
def _infer_fft(ins: list[Node], attrs: dict) -> tuple:
    x, = ins
    if x.dtype not in FFT_DTYPES:
        raise GraphError(f"fft: input must be c64 [..., n] or f32/f64 real-block [..., 2n], got {x.dtype.value}")
    if not x.shape:
        raise GraphError("fft: input must have at least one axis, got a scalar")
    if x.dtype != DType.C64 and x.shape[-1] != DYNAMIC and x.shape[-1] % 2:
        raise GraphError(f"fft: real-block rows [re… im…] need an even last axis, got {list(x.shape)}")
    return x.shape, x.dtype


@lowers("fft")
def lower_fft(ctx: LowerContext, node: Node) -> None:
    """One Fft1d over every row of the last axis."""
    ix, = node.inputs
    points = node.shape[-1] if node.dtype == DType.C64 else node.shape[-1] // 2
    outer = numel(node.shape[:-1])
    ctx.emit(lambda at: T.Fft1d(src=at(ix), dst=at(node.id), outer=outer, n_complex=points,
                                inverse=node.attrs["inverse"], norm_tag=FFT_NORMS[node.attrs["norm"]],
                                dtype=node.dtype), reads=[ix], writes=[node.id])


@infers("complex_part")
def _infer_complex_part(ins: list[Node], attrs: dict) -> tuple:
    z, = ins
    if z.dtype != DType.C64:
        raise GraphError(f"real/imag: input must be c64, got {z.dtype.value} {list(z.shape)}")
    return z.shape, DType.F32


@lowers("complex_part")
def lower_complex_part(ctx: LowerContext, node: Node) -> None:
    """A Narrow picking every other f32 of the interleaved pairs (from the real or the imaginary one)."""
    iz, = node.inputs
    count, part = numel(node.shape), node.attrs["part"]
    ctx.emit(lambda at: T.Narrow(src=at(iz) + 4 * part, dst=at(node.id), outer=count, src_stride=2, dst_stride=1,
                                 inner=1, elem_bytes=4), reads=[iz], writes=[node.id])


@infers("complex")
def _infer_complex(ins: list[Node], attrs: dict) -> tuple:
    re, im = ins
    require_f32("complex", re, im)
    if re.shape != im.shape:
        raise GraphError(f"complex: re {list(re.shape)} and im {list(im.shape)} differ")
    return re.shape, DType.C64


@lowers("complex")
def lower_complex(ctx: LowerContext, node: Node) -> None:
    """A Concat along a new innermost axis of 2: the interleaved (re, im) pairs."""
    ire, iim = node.inputs
    count = numel(node.shape)
    ctx.emit(lambda at: T.Concat(dst=at(node.id), outer=count, inner=1, total_axis=2,
                                 inputs=((at(ire), 1, count), (at(iim), 1, count))), reads=[ire, iim], writes=[node.id])
