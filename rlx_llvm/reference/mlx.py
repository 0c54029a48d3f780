"""NumPy references of `DequantMatMulMlx` and `DequantGroupedMatMulMlx` and the MLX decoders (semantics.md
§2.11, §3.8; docs/lowering-mlx.md; choices in docs/semantics-choices.md, "mlx").

An MLX-quantized `[rows, k]` matrix, as `mlx.core.quantize` writes it: each row's codes are one LSB-first
bit stream in little-endian u32 words (element `p` is bits `p·bits … p·bits + bits − 1`, so 3-, 5- and
6-bit codes straddle words); one scale (and for affine one bias) per `group_size` elements of a row.
Affine: `w = scale·q + bias` in f32, two roundings (as `mlx.core.dequantize`).  mxfp4 / mxfp8: E2M1 /
OCP E4M3 codes times an E8M0 scale `2^(s − 127)` (s = 0 → 2^−127, s = 255 → +inf, as MLX decodes it).
"""
from __future__ import annotations

import numpy as np

from .. import thunks as T
from ..ops import QuantScheme
from ..thunks.base import cdiv
from ..thunks.quant import mlx_bytes
from . import reference, view
from .gemm import checked_expert_ids
from .halves import bf16_bits_to_f32
from .scaled import FORMATS, decode

ELEMENT_FORMAT = {"MlxMxfp4": FORMATS["F4E2M1"], "MlxMxfp8": FORMATS["F8E4M3"]}
"""The element code format of each MLX microscaling scheme."""


def code_bits(scheme: QuantScheme) -> int:
    """Bits per code of an MLX scheme."""
    if isinstance(scheme, QuantScheme.MlxAffine):
        return scheme.bits
    return 4 if isinstance(scheme, QuantScheme.MlxMxfp4) else 8


def unpack(words: np.ndarray, bits: int, k: int) -> np.ndarray:
    """Codes `[rows, k]` from u32 words `[rows, words]`: each row an LSB-first bit stream."""
    rows = words.shape[0]
    stream = np.unpackbits(words.astype("<u4").view(np.uint8).reshape(rows, -1), axis=1, bitorder="little")
    return stream[:, :k * bits].reshape(rows, k, bits).astype(np.uint32) @ (1 << np.arange(bits, dtype=np.uint32))


def e8m0(scales: np.ndarray) -> np.ndarray:
    """E8M0 bytes as MLX decodes them: `2^(s − 127)`, 0 → 2^−127, 255 → +inf."""
    s = np.asarray(scales, np.int64)
    with np.errstate(over="ignore"):
        return np.ldexp(np.float32(1.0), s - 127).astype(np.float32)


def dequantize(scheme: QuantScheme, words: np.ndarray, scales: np.ndarray, biases: np.ndarray | None, k: int
               ) -> np.ndarray:
    """f32 `[rows, k]` from u32 `words [rows, ·]` and f32 per-group `scales`/`biases` `[rows, k / group]`
    (`scales` are E8M0 bytes for mxfp)."""
    q = unpack(words, code_bits(scheme), k)
    group = scheme.group_size
    with np.errstate(invalid="ignore", over="ignore"):
        if isinstance(scheme, QuantScheme.MlxAffine):
            s, b = (np.repeat(np.asarray(a, np.float32), group, axis=1) for a in (scales, biases))
            return s * q.astype(np.float32) + b
        values = decode(ELEMENT_FORMAT[type(scheme).__name__], q)
        return values * np.repeat(e8m0(scales), group, axis=1)


def slabs(arena: np.ndarray, t, experts: int, k: int, slab_bytes: int, bf16: bool) -> np.ndarray:
    """The `experts` decoded `[n, k]` weight matrices of thunk `t`, as f32 `[experts, n, k]`."""
    codes, scale_bytes, bias_bytes = mlx_bytes(t, t.n, k, 2 if bf16 else 4)
    groups = cdiv(k, t.scheme.group_size)

    def params(offset: int, nbytes: int) -> np.ndarray:
        if isinstance(t.scheme, QuantScheme.MlxAffine):
            raw = view(arena, offset, np.uint16 if bf16 else np.float32, experts * nbytes // (2 if bf16 else 4))
            return (bf16_bits_to_f32(raw) if bf16 else raw).reshape(experts, t.n, groups)
        return view(arena, offset, np.uint8, experts * nbytes).reshape(experts, t.n, groups)

    affine = isinstance(t.scheme, QuantScheme.MlxAffine)
    scales, biases = params(t.scale, scale_bytes), params(t.zp, bias_bytes) if affine else None
    out = np.empty((experts, t.n, k), np.float32)
    for e in range(experts):
        words = view(arena, t.w_q + e * slab_bytes, np.uint8, codes).view("<u4").reshape(t.n, -1)
        out[e] = dequantize(t.scheme, words, scales[e], None if biases is None else biases[e], k)
    return out


def matmul_rows(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """`out[i] = x[i] @ w[i]ᵀ` summed in f64, rounded once to f32 (`w [m, n, k]`, or `[1, n, k]` for all rows)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.einsum("ik,ink->in", x.astype(np.float64), np.broadcast_to(w, (x.shape[0], *w.shape[1:]))
                         .astype(np.float64)).astype(np.float32)


@reference(T.DequantMatMulMlx)
def dequant_matmul_mlx(arena: np.ndarray, t: T.DequantMatMulMlx) -> None:
    """`dst = x @ Wᵀ` with W `[n, k]` decoded to f32, products summed in f64."""
    w = slabs(arena, t, 1, t.k, 0, bf16=False)
    x = view(arena, t.x, np.float32, t.m * t.k).reshape(t.m, t.k)
    view(arena, t.dst, np.float32, t.m * t.n)[:] = matmul_rows(x, w).reshape(-1)


@reference(T.DequantGroupedMatMulMlx)
def dequant_grouped_matmul_mlx(arena: np.ndarray, t: T.DequantGroupedMatMulMlx) -> None:
    """`dst[i] = input[i] @ W[idx[i]]ᵀ` over `num_experts` decoded `[n, k_dim]` slabs."""
    ids = checked_expert_ids(arena, t)
    w = slabs(arena, t, t.num_experts, t.k_dim, t.slab_bytes, t.scale_bf16)
    x = view(arena, t.input, np.float32, t.m * t.k_dim).reshape(t.m, t.k_dim)
    view(arena, t.dst, np.float32, t.m * t.n)[:] = matmul_rows(x, w[ids]).reshape(-1)
