"""GGUF block decoders in IR, and `DequantMatMulGguf` with the decode fused into the GEMV/GEMM
(semantics.md §2.11, §3.8; docs/lowering-gguf.md).

Block layouts are llama.cpp's (ggml-common.h): a block of 32 (legacy) or 256 (K-quant) weights,
f16 scales, packed codes.  Each decoder turns `CW` consecutive elements of one block into a `Piece`,
`CW = min(lanes, 16)`: integer codes (one vector load and a mask) and the scale, constant offset and
bias of their scale group, `w = scale·f32(q + offset) + bias`.  `value` applies them with llama.cpp's
arithmetic, operation for operation and without contraction, so `decode_block` (the dequantizing
kinds) is bit-identical to `gguf.quants.dequantize`.

`DequantMatMulGguf` (`dst[i, j] = Σ_p x[i, p]·W[j, p]`, `W [n, k]` packed row-major) never
materialises W in f32.  With one row of x, a GEMV tile (up to `MAX_NR` weight rows, as many as the
vector registers hold) folds each group's scale, offset and bias out of the products, as llama.cpp's
dot products do: `Σ w·x = scale·(Σ q·x + offset·Σ x) + bias·Σ x`, with the groups' `Σ x` summed once
per call (`group_sums`) and a high nibble left in place (`q·16`, the 1/16 folded into the group's
dot) — so the inner loop is a load, a mask, a convert and an FMA per `CW` weights.  With several rows,
each k-block of a few weight rows is decoded once into an f32 panel in L1 and a register-tiled
micro-kernel runs every row of x against it (`panel_gemm`).  Weight rows are split across threads.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Callable

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..jit import l1d_bytes
from ..ops import QuantScheme
from ..registry import lowering
from ..thunks.quant import GGUF_BLOCKS
from .context import EmitContext
from .gemm import expert_of, expert_status
from .toolkit import (F16, F32, FASTMATH, I16, I32, I64, I8, PTR, carried_loop, const, fail_unless, prefetch,
                      scratch_ptr, splat, vec, vector_registers, width_of)

MAX_NR = 4          # weight rows a GEMV tile decodes together at most (their chunks share each load of x)
GEMV_CHAINS = 2     # a group's dot outlasts the FMA latency: two chains of group updates hide it
MAX_CHUNK = 16      # lanes of one decoded chunk: the smallest scale group (Q2_K, Q3_K, Q6_K)
PAR_BYTES = 1 << 15  # packed weight bytes a thread should get before rows of W are split
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

GROUP = {"GgufQ8_0": 32, "GgufQ4_0": 32, "GgufQ4_1": 32, "GgufQ5_0": 32, "GgufQ5_1": 32, "GgufIQ4NL": 32,
         "GgufQ2K": 16, "GgufQ3K": 16, "GgufQ4K": 32, "GgufQ5K": 32, "GgufQ6K": 16, "GgufQ8K": 32, "GgufIQ4XS": 32}
"""Elements sharing one scale (and offset or bias) per scheme: the unit a dot product folds them over."""

OFFSETS = {"GgufQ4_0": -8, "GgufQ5_0": -16, "GgufQ3K": -4, "GgufQ6K": -32}
"""The constant added to the codes of a scheme (`w = scale·f32(q + offset)`): a power of two, so the
GEMV's `offset·Σ x`, summed once per call, is exact."""

SPAN = {"GgufQ4K": 64, "GgufQ5K": 64, "GgufQ2K": 128, "GgufQ3K": 128, "GgufQ6K": 128}
"""Elements whose codes share byte loads (K-quants: low and high nibbles, 2-bit crumbs), decoded
together so each load dies soon; other schemes span one scale group."""

Chunk = Callable[["Block", int], "Piece"]


# ── reading a block ──────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Block:
    """One packed block at `ptr` (unaligned), decoded `width` lanes at a time with builder `b`."""

    b: ir.IRBuilder
    ptr: ir.Value
    width: int

    def load(self, byte: int, ty: ir.Type, width: int = 1) -> ir.Value:
        """`width` elements of `ty` at byte `byte` of the block."""
        at = self.b.gep(self.ptr, [I64(byte)], source_etype=I8, inbounds=True)
        return self.b.load(at, typ=vec(ty, width), align=1)

    def half(self, byte: int) -> ir.Value:
        """The f16 at `byte`, widened exactly to f32."""
        return self.b.fpext(self.b.bitcast(self.load(byte, I16), F16), F32)

    def half_lanes(self, byte: int) -> ir.Value:
        """The f16 at `byte` in every lane, widened exactly to f32 (a broadcast load and one convert)."""
        b = self.b
        halves = b.bitcast(splat(b, self.load(byte, I16), self.width), vec(F16, self.width))
        return b.fpext(halves, vec(F32, self.width))

    def f32(self, byte: int) -> ir.Value:
        """The f32 at `byte`."""
        return self.load(byte, F32)

    def u8(self, byte: int) -> ir.Value:
        """The byte at `byte`, zero-extended to i32."""
        return self.b.zext(self.load(byte, I8), I32)

    def i8(self, byte: int) -> ir.Value:
        """The byte at `byte`, sign-extended to i32."""
        return self.b.sext(self.load(byte, I8), I32)

    def field(self, byte: int, shift: int, mask: int) -> ir.Value:
        """Scalar `(block[byte] >> shift) & mask` as i32."""
        return self.b.and_(self.b.lshr(self.u8(byte), I32(shift)), I32(mask))

    def codes(self, byte: int, shift: int, mask: int) -> ir.Value:
        """Lanes `(block[byte + l] >> shift) & mask`, l < width, as i32."""
        raw = self.b.zext(self.load(byte, I8, self.width), vec(I32, self.width))
        return self.b.and_(self.b.lshr(raw, const(I32, shift, self.width)), const(I32, mask, self.width))

    def signed_codes(self, byte: int) -> ir.Value:
        """Lanes `int8(block[byte + l])` as i32."""
        return self.b.sext(self.load(byte, I8, self.width), vec(I32, self.width))

    def word_bits(self, byte: int, first: int) -> ir.Value:
        """Lanes `(u32 at byte >> (first + l)) & 1`: the fifth bits of Q5_0/Q5_1."""
        word = splat(self.b, self.load(byte, I32), self.width)
        shifts = ir.Constant(vec(I32, self.width), [first + lane for lane in range(self.width)])
        return self.b.and_(self.b.lshr(word, shifts), const(I32, 1, self.width))

    def plus(self, codes: ir.Value, value: int) -> ir.Value:
        """Integer lanes plus a constant."""
        return self.b.add(codes, const(I32, value, self.width)) if value else codes

    def or_shl(self, low: ir.Value, high: ir.Value, shift: int) -> ir.Value:
        """`low | high << shift` lane-wise."""
        return self.b.or_(low, self.b.shl(high, const(I32, shift, width_of(high))))

    def scaled(self, scale: ir.Value, codes: ir.Value, bias: ir.Value | None = None) -> ir.Value:
        """`scale·f32(codes)`, then `+ bias`: two roundings, no FMA."""
        b = self.b
        y = b.fmul(broadcast(b, scale, self.width), b.sitofp(codes, vec(F32, self.width)))
        return y if bias is None else b.fadd(y, broadcast(b, bias, self.width))

    def times(self, d: ir.Value, small: ir.Value) -> ir.Value:
        """`d·f32(small)`: a sub-block scale from its integer code (scalar, or lane-wise for a vector)."""
        b = self.b
        if isinstance(small.type, ir.VectorType):
            return b.fmul(splat(b, d, small.type.count), b.sitofp(small, vec(F32, small.type.count)))
        return b.fmul(d, b.sitofp(small, F32))

    def fields(self, byte: int, picks: list[tuple[int, int, int]]) -> ir.Value:
        """Lanes `(block[byte + i] >> shift) & mask` for each `(i, shift, mask)` of `picks`, as i32."""
        b, n = self.b, len(picks)
        raw = self.load(byte, I8, max(i for i, _, _ in picks) + 1)
        lanes = b.zext(b.shuffle_vector(raw, raw, ir.Constant(vec(I32, n), [i for i, _, _ in picks])), vec(I32, n))
        shifted = b.lshr(lanes, ir.Constant(vec(I32, n), [shift for _, shift, _ in picks]))
        return b.and_(shifted, ir.Constant(vec(I32, n), [mask for _, _, mask in picks]))

    def lookup(self, codes: ir.Value) -> ir.Value:
        """IQ4's non-linear table `IQ4_VALUES[code]` lane-wise, as a select tree on the code's bits."""
        b, w = self.b, self.width
        values = [const(I32, v, w) for v in IQ4_VALUES]
        for bit in range(4):
            on = b.icmp_unsigned("!=", b.and_(codes, const(I32, 1 << bit, w)), const(I32, 0, w))
            values = [b.select(on, hi, lo) for lo, hi in zip(values[::2], values[1::2])]
        return values[0]


def broadcast(b: ir.IRBuilder, x: ir.Value, width: int) -> ir.Value:
    """A scalar splat to `width` lanes; a `width`-lane vector as it is."""
    return x if isinstance(x.type, ir.VectorType) and x.type.count == width else splat(b, x, width)


def lane(b: ir.IRBuilder, v: ir.Value, at: int, width: int) -> ir.Value:
    """Lane `at` of `v` in all `width` lanes (one permute, no trip through a scalar register)."""
    return b.shuffle_vector(v, ir.Constant(v.type, None), ir.Constant(vec(I32, width), [at] * width))


def nibble(blk: Block, base: int, e: int, run: int = 16) -> ir.Value:
    """The 4-bit codes of elements `e…` stored low nibbles first: `run` bytes hold `2·run` elements."""
    codes, shift = nibble_bits(blk, base, e, run)
    return blk.b.lshr(codes, const(I32, shift, blk.width)) if shift else codes


def nibble_bits(blk: Block, base: int, e: int, run: int = 16) -> tuple[ir.Value, int]:
    """`(code << shift, shift)` of elements `e…` (as `nibble`): a high nibble masked in place, unshifted."""
    group, lane = divmod(e, 2 * run)
    half, at = divmod(lane, run)
    return blk.codes(base + group * run + at, 0, 15 << 4 * half), 4 * half


def crumb(blk: Block, base: int, e: int) -> ir.Value:
    """The 2-bit codes of K-quant elements `e…`: 32 bytes hold 128 elements, shifts 0, 2, 4, 6."""
    half, lane = divmod(e, 128)
    shift, at = divmod(lane, 32)
    return blk.codes(base + 32 * half + at, 2 * shift, 3)


def high_bit(blk: Block, base: int, e: int) -> ir.Value:
    """The bit of K-quant elements `e…` in a 32-byte mask: element e is bit e // 32 of byte e % 32."""
    bit, at = divmod(e, 32)
    return blk.codes(base + at, bit, 1)


# ── one decoder per scheme: elements [e, e + width) of a block ──────────────

@dataclass(frozen=True)
class Piece:
    """Elements `[e, e + width)` of a block as llama.cpp computes them: `scale·f32(q + offset) + bias`
    with `q = codes >> shift`.

    `codes` are i32 lanes (a nibble may be left in place, `shift` = 4, which spares the shift where
    the scale can absorb it), `scale` and `bias` f32 scalars (or already broadcast to the lanes)
    shared by the element's scale group,
    `offset` a constant; a dot product folds the shift, offset and bias out of its products."""

    codes: ir.Value
    scale: ir.Value
    offset: int = 0
    bias: ir.Value | None = None
    shift: int = 0


def value(blk: Block, p: Piece) -> ir.Value:
    """The piece's f32 lanes, bit-identical to llama.cpp's."""
    codes = blk.b.lshr(p.codes, const(I32, p.shift, blk.width)) if p.shift else p.codes
    return blk.scaled(p.scale, blk.plus(codes, p.offset), p.bias)


def q8_0(blk: Block, e: int) -> Piece:
    return Piece(blk.signed_codes(2 + e), blk.half_lanes(0))


def q4_0(blk: Block, e: int) -> Piece:
    codes, shift = nibble_bits(blk, 2, e)
    return Piece(codes, blk.half_lanes(0), OFFSETS["GgufQ4_0"], shift=shift)


def q4_1(blk: Block, e: int) -> Piece:
    codes, shift = nibble_bits(blk, 4, e)
    return Piece(codes, blk.half_lanes(0), bias=blk.half_lanes(2), shift=shift)


def q5_0(blk: Block, e: int) -> Piece:
    codes, shift = nibble_bits(blk, 6, e)
    return Piece(blk.or_shl(codes, blk.word_bits(2, e), 4 + shift), blk.half_lanes(0), OFFSETS["GgufQ5_0"],
                 shift=shift)


def q5_1(blk: Block, e: int) -> Piece:
    codes, shift = nibble_bits(blk, 8, e)
    return Piece(blk.or_shl(codes, blk.word_bits(4, e), 4 + shift), blk.half_lanes(0), bias=blk.half_lanes(2),
                 shift=shift)


def iq4_nl(blk: Block, e: int) -> Piece:
    return Piece(blk.lookup(nibble(blk, 2, e)), blk.half_lanes(0))


def q8_k(blk: Block, e: int) -> Piece:
    return Piece(blk.signed_codes(4 + e), blk.f32(0))


def q2_k(blk: Block, e: int) -> Piece:
    """Scales (low nibble) and mins (high nibble) per 16, then codes, then d and dmin at the end."""
    g = e // 16
    dl = blk.times(blk.half(80), blk.field(g, 0, 15))
    ml = blk.times(blk.half(82), blk.field(g, 4, 15))
    return Piece(crumb(blk, 16, e), dl, bias=blk.b.fneg(ml))


def q3_k(blk: Block, e: int) -> Piece:
    """hmask, 2-bit codes, twelve bytes of 6-bit scales, d at the end; the code is `q − 4` where the
    mask bit is clear."""
    g = e // 16
    low = blk.field(96 + g % 8, 4 * (g // 8), 15)
    high = blk.field(104 + g % 4, 2 * (g // 4), 3)
    scale = blk.b.sub(blk.b.or_(low, blk.b.shl(high, I32(4))), I32(32))
    return Piece(blk.or_shl(crumb(blk, 32, e), high_bit(blk, 0, e), 2), blk.times(blk.half(108), scale),
                 OFFSETS["GgufQ3K"])


K_SCALE_LOW = [(j, 0, 63) if j < 4 else (j + 4, 0, 15) for j in range(8)]
K_SCALE_HIGH = [(0, 0, 0) if j < 4 else (j - 4, 6, 3) for j in range(8)]
K_MIN_LOW = [(j + 4, 0, 63) if j < 4 else (j + 4, 4, 15) for j in range(8)]
K_MIN_HIGH = [(0, 0, 0) if j < 4 else (j, 6, 3) for j in range(8)]
"""Q4_K/Q5_K's 6-bit scale and min of sub-block j from the twelve bytes q at 4 (llama.cpp's
get_scale_min_k4): `low | high << 4`, each `(q[i] >> shift) & mask` as listed (mask 0: none)."""


def k_biases(blk: Block) -> ir.Value:
    """`−dmin·min` of Q4_K/Q5_K's eight sub-blocks, one per lane."""
    mins = blk.or_shl(blk.fields(4, K_MIN_LOW), blk.fields(4, K_MIN_HIGH), 4)
    return blk.b.fneg(blk.times(blk.half(2), mins))


def k_affine(blk: Block, e: int, codes: ir.Value, shift: int) -> Piece:
    """`(d·scale)·q − dmin·min` of sub-block `e // 32`: all eight scales and mins unpacked in vector
    lanes (once per block after CSE), this sub-block's lane taken."""
    b = blk.b
    scales = blk.or_shl(blk.fields(4, K_SCALE_LOW), blk.fields(4, K_SCALE_HIGH), 4)
    at = e // 32
    return Piece(codes, lane(b, blk.times(blk.half(0), scales), at, blk.width),
                 bias=lane(b, k_biases(blk), at, blk.width), shift=shift)


def q4_k(blk: Block, e: int) -> Piece:
    return k_affine(blk, e, *nibble_bits(blk, 16, e, run=32))


def q5_k(blk: Block, e: int) -> Piece:
    codes, shift = nibble_bits(blk, 48, e, run=32)
    return k_affine(blk, e, blk.or_shl(codes, high_bit(blk, 16, e), 4 + shift), shift)


def q6_k(blk: Block, e: int) -> Piece:
    """Low nibbles, 2-bit highs, int8 scales per 16, d at the end; the code is `q − 32`."""
    q = blk.or_shl(nibble(blk, 0, e, run=64), crumb(blk, 128, e), 4)
    return Piece(q, blk.times(blk.half(208), blk.i8(192 + e // 16)), OFFSETS["GgufQ6K"])


def iq4_xs(blk: Block, e: int) -> Piece:
    """d, 2-bit scale highs (u16), 4-bit scale lows, then IQ4 codes per 32 in runs of 16."""
    b, s = blk.b, e // 32
    high = b.and_(b.lshr(b.zext(blk.load(2, I16), I32), I32(2 * s)), I32(3))
    scale = b.sub(b.or_(blk.field(4 + s // 2, 4 * (s % 2), 15), b.shl(high, I32(4))), I32(32))
    return Piece(blk.lookup(nibble(blk, 8, e)), blk.times(blk.half(0), scale))


DECODERS: dict[str, Chunk] = {
    "GgufQ8_0": q8_0, "GgufQ4_0": q4_0, "GgufQ4_1": q4_1, "GgufQ5_0": q5_0, "GgufQ5_1": q5_1,
    "GgufQ2K": q2_k, "GgufQ3K": q3_k, "GgufQ4K": q4_k, "GgufQ5K": q5_k, "GgufQ6K": q6_k, "GgufQ8K": q8_k,
    "GgufIQ4NL": iq4_nl, "GgufIQ4XS": iq4_xs,
}
"""The GGUF schemes decoded here, by QuantScheme variant name."""

BLOCK_BIASES: dict[str, Callable[[Block], ir.Value]] = {"GgufQ4K": k_biases, "GgufQ5K": k_biases}
"""Schemes whose GEMV folds the biases per block rather than per group: `Σ_g bias_g·Σ x_g` is one
FMA of the block's bias lanes (one per group) with the groups' `Σ x` totals."""


def chunk_width(lanes: int) -> int:
    """Lanes of one decoded chunk on a host with `lanes` f32 lanes."""
    return min(lanes, MAX_CHUNK)


def decode_block(b: ir.IRBuilder, scheme: str, ptr: ir.Value, width: int) -> list[ir.Value]:
    """Every element of the block at `ptr`, as `<width x float>` chunks in order."""
    elems, _ = GGUF_BLOCKS[scheme]
    blk, decode = Block(b, ptr, width), DECODERS[scheme]
    return [value(blk, decode(blk, e)) for e in range(0, elems, width)]


def define_dequantize(module: ir.Module, scheme: str, width: int, name: str) -> ir.Function:
    """`void name(ptr blocks, ptr out, i64 count)`: `count` blocks decoded to f32 (tests, Dequantize)."""
    elems, nbytes = GGUF_BLOCKS[scheme]
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64]), name)
    src, out, count = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    head, body, done = (fn.append_basic_block(n) for n in ("head", "body", "done"))
    entry = b.block
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64)
    i.add_incoming(I64(0), entry)
    b.cbranch(b.icmp_signed("<", i, count), body, done)
    b.position_at_end(body)
    ptr = b.gep(src, [b.mul(i, I64(nbytes))], source_etype=I8)
    for c, values in enumerate(decode_block(b, scheme, ptr, width)):
        at = b.add(b.mul(i, I64(elems)), I64(c * width))
        b.store(values, b.gep(out, [at], source_etype=F32), align=4)
    i.add_incoming(b.add(i, I64(1)), b.block)
    b.branch(head)
    b.position_at_end(done)
    b.ret_void()
    return fn


# ── DequantMatMulGguf ────────────────────────────────────────────────────────

def scheme_name(t: T.DequantMatMulGguf) -> str:
    """The thunk's scheme as a QuantScheme variant name."""
    return type(t.scheme).__name__ if isinstance(t.scheme, QuantScheme) else repr(t.scheme)


def check_gguf(t: T.DequantMatMulGguf, k_field: str = "k") -> None:
    """A GGUF scheme this module decodes, and `k` (field `k_field`) a whole number of its blocks."""
    name = scheme_name(t)
    if name not in DECODERS:
        raise ValidationError(f"scheme {name} is not decoded by {type(t).__name__} (decoded: "
                              f"{', '.join(DECODERS)})", field="scheme")
    elems, nbytes = GGUF_BLOCKS[name]
    k = getattr(t, k_field)
    if k % elems:
        raise ValidationError(f"{k_field} = {k} is not a multiple of the {name} block size {elems} "
                              f"({nbytes} bytes per block)", field=k_field)


def gemv_tile(ctx: EmitContext, t: T.DequantMatMulGguf, sums: "GroupSums", j: ir.Value, cols: int, row: ir.Value,
              w_row: ir.Value | None = None) -> None:
    """`dst[row, j + c]` for c < cols over every block of weight rows `w_row…w_row + cols` (default
    `j…`), in registers.  Per scale group the codes are folded like llama.cpp's dot products,
    `Σ w·x = scale·(Σ q·x + offset·Σ x) + bias·Σ x`, so the scale, offset and bias cost one FMA per
    group rather than per element (the groups' `Σ x` read from `sums`), and for `BLOCK_BIASES`
    schemes the biases one FMA per block.  `GEMV_CHAINS` accumulators per output hide the FMA
    latency; codes of one `SPAN` are decoded together so each byte load dies soon, and the x chunks
    and group sums of a span are loaded once for all `cols` weight rows."""
    b, name = ctx.b, scheme_name(t)
    elems, nbytes = GGUF_BLOCKS[name]
    width, blocks, group, decode = chunk_width(ctx.lanes), t.k // elems, GROUP[name], DECODERS[name]
    span, fold = SPAN.get(name, group), BLOCK_BIASES.get(name)
    w_row = j if w_row is None else w_row
    w_rows = [ctx.addr(t.w_q, b.mul(b.add(w_row, I64(c)), I64(blocks * nbytes))) for c in range(cols)]
    x_row = ctx.addr(t.x, b.mul(row, I64(t.k)), 4)
    chains = max(1, min(elems // group, GEMV_CHAINS))
    main = cols * chains  # the accumulators of the group dots; then, with `fold`, one of biases per weight row

    def step(blk: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        packed, accs = [Block(b, b.gep(w, [b.mul(blk, I64(nbytes))], source_etype=I8, inbounds=True), width)
                        for w in w_rows], list(accs)
        first_sum = b.add(b.mul(row, I64(t.k // group)), b.mul(blk, I64(elems // group)))
        for start in range(0, elems, span):
            groups = [range(g, g + group, width) for g in range(start, start + span, group)]
            xs = {e: ctx.load(0, F32, b.add(b.mul(blk, I64(elems)), I64(e)), width, base=x_row) for g in groups for e in g}
            x_sums = {g[0]: ctx.load(sums.vectors, F32, b.mul(b.add(first_sum, I64(g[0] // group)), I64(width)), width,
                                     base=ctx.shared) for g in groups}
            for c, block in enumerate(packed):
                pieces = {e: decode(block, e) for g in groups for e in g}
                for g in groups:
                    at = c * chains + g[0] // group % chains
                    dot = [dataclasses.replace(pieces[e], bias=None) if fold else pieces[e] for e in g]
                    accs[at] = group_dot(b, dot, [xs[e] for e in g], x_sums[g[0]], accs[at])
        if fold:
            totals = ctx.load(sums.totals, F32, first_sum, elems // group, base=ctx.shared)
            for c, block in enumerate(packed):
                accs[main + c] = b.fadd(accs[main + c], b.fmul(fold(block), totals, flags=FASTMATH), flags=FASTMATH)
        return accs

    zeros = [const(F32, 0.0, width)] * main + ([const(F32, 0.0, elems // group)] * cols if fold else [])
    accs = carried_loop(ctx, 0, blocks, 1, zeros, step, name="blk")
    for c in range(cols):
        at = b.add(b.mul(row, I64(t.n)), b.add(j, I64(c)))
        total = horizontal_sum(ctx, pairwise(b, accs[c * chains:(c + 1) * chains]))
        if fold:
            total = b.fadd(total, horizontal_sum(ctx, accs[main + c]), flags=FASTMATH)
        ctx.store(t.dst, total, at)


def group_dot(b: ir.IRBuilder, pieces: list[Piece], xs: list[ir.Value], x_sum: ir.Value, acc: ir.Value) -> ir.Value:
    """`acc + Σ w·x` over one scale group: `scale·(Σ_s 2⁻ˢ·Σ (q << s)·x + offset·Σ x) + bias·Σ x` (FMAs),
    with `x_sum` the group's `Σ x` times the scheme's offset where it has one (`group_sums`)."""
    head, width = pieces[0], width_of(xs[0])
    dots: dict[int, ir.Value] = {}
    if head.offset:
        dots[0] = x_sum
    for p, x in zip(pieces, xs):
        q_x = b.fmul(b.sitofp(p.codes, vec(F32, width)), x, flags=FASTMATH)
        dots[p.shift] = b.fadd(dots[p.shift], q_x, flags=FASTMATH) if p.shift in dots else q_x
    dot = dots.pop(0, None)
    for shift, part in dots.items():
        scaled = b.fmul(part, const(F32, 2.0 ** -shift, width), flags=FASTMATH)
        dot = scaled if dot is None else b.fadd(dot, scaled, flags=FASTMATH)
    acc = multiply_add(b, head.scale, dot, acc)
    return acc if head.bias is None else multiply_add(b, head.bias, x_sum, acc)


@dataclass(frozen=True)
class GroupSums:
    """Scratch offsets of `Σ x` over every scale group of each row of x: `vectors` chunk-wide (lane l
    sums the group's elements ≡ l mod width), times the scheme's offset where it has one (`OFFSETS`);
    `totals` one f32 per group (for `BLOCK_BIASES` schemes)."""

    vectors: int
    totals: int | None = None


def group_sums(ctx: EmitContext, x: int, rows: int, k: int, scheme: str) -> GroupSums:
    """`Σ x` over every scale group of each row of `x [rows, k]`, written once per call to scratch and
    read by every weight row's tile."""
    b, width, group = ctx.b, chunk_width(ctx.lanes), GROUP[scheme]
    count = rows * k // group
    vectors = ctx.scratch_alloc(count * width * 4)
    totals = ctx.scratch_alloc(count * 4) if scheme in BLOCK_BIASES else None
    with ctx.for_range(0, count, name="sums") as g:
        first = b.mul(g, I64(group))
        partial = pairwise(b, [ctx.load(x, F32, b.add(first, I64(e)), width) for e in range(0, group, width)])
        offset = OFFSETS.get(scheme)
        scaled = b.fmul(partial, const(F32, float(offset), width), flags=FASTMATH) if offset else partial
        ctx.store(vectors, scaled, b.mul(g, I64(width)), base=ctx.scratch)
        if totals is not None:
            ctx.store(totals, horizontal_sum(ctx, partial), g, base=ctx.scratch)
    return GroupSums(vectors, totals)


def pairwise(b: ir.IRBuilder, values: list[ir.Value]) -> ir.Value:
    """The sum of `values` as a balanced tree (short dependency chains)."""
    while len(values) > 1:
        values = [b.fadd(x, y, flags=FASTMATH) for x, y in zip(values[::2], values[1::2])] + values[len(values) & ~1:]
    return values[0]


def multiply_add(b: ir.IRBuilder, scalar: ir.Value, v: ir.Value, acc: ir.Value) -> ir.Value:
    """`acc + scalar·v` lane-wise (an FMA)."""
    return b.fadd(acc, b.fmul(broadcast(b, scalar, width_of(v)), v, flags=FASTMATH), flags=FASTMATH)


def horizontal_sum(ctx: EmitContext, v: ir.Value) -> ir.Value:
    """The sum of a vector's lanes (reassociated)."""
    fn = ctx.intrinsic(f"llvm.vector.reduce.fadd.v{v.type.count}f32", F32, [F32, v.type])
    return ctx.b.call(fn, [F32(-0.0), v], fastmath=FASTMATH + ("reassoc",))


@lowering(T.DequantMatMulGguf, check=check_gguf)
def dequant_matmul_gguf(ctx: EmitContext, t: T.DequantMatMulGguf) -> None:
    """`dst = x @ Wᵀ` with W decoded block by block in registers (few rows of x) or into a cache-sized
    f32 panel shared by every row (`panel_gemm`); weight rows split across threads."""
    if t.m == 0 or t.n == 0:
        return
    elems, nbytes = GGUF_BLOCKS[scheme_name(t)]
    if t.k == 0:
        zero_fill(ctx, t.dst, t.m * t.n)
        return
    if t.m >= PANEL_MIN_ROWS:
        panel_gemm(ctx, t, PanelPlan.of(ctx.lanes, scheme_name(t), t.k, t.m))
        return
    sums = group_sums(ctx, t.x, t.m, t.k, scheme_name(t))
    nr = weight_rows(ctx, scheme_name(t))

    def columns(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        by_tiles(sub, start, stop, nr, lambda j, cols: gemv_tile(sub, t, sums, j, cols, I64(0)))

    ctx.parallel_for(t.n, columns, grain=nr, min_work=max(1, PAR_BYTES // (t.k // elems * nbytes)))


def weight_rows(ctx: EmitContext, scheme: str) -> int:
    """Weight rows a GEMV tile decodes together (1…MAX_NR): as many spans of decoded chunks as the
    host's vector registers hold beside one span of x chunks."""
    chunks = SPAN.get(scheme, GROUP[scheme]) // chunk_width(ctx.lanes)
    return max(1, min(MAX_NR, (vector_registers(ctx.lanes) - chunks) // chunks))


def by_tiles(ctx: EmitContext, start: ir.Value, stop: ir.Value, nr: int, emit: Callable[[ir.Value, int], None]
             ) -> None:
    """`emit(j, nr)` over whole tiles of `nr` weight rows from `start`, then `emit(j, 1)` up to `stop`."""
    b = ctx.b
    full = b.add(start, b.mul(b.udiv(b.sub(stop, start), I64(nr)), I64(nr)))
    with ctx.for_range(start, full, nr, name="j") as j:
        emit(j, nr)
    with ctx.for_range(full, stop, name="j") as j:
        emit(j, 1)


# ── decoded panels: many rows of x ───────────────────────────────────────────

PANEL_STEP = 32         # elements of k per micro-kernel step: every block size is a multiple of it
PANEL_PAD = 16          # f32 padding after each panel row: rows a power of two apart would share L1 sets
X_SLICE_L1 = 8          # x's rows of one k-block fit in 8 L1 sizes: half an L2 of 16 (Zen 3) to 40 L1s
PANEL_MIN_ROWS = 2      # from two rows of x on, decoding W once into panels beats a folded GEMV per row


@dataclass(frozen=True)
class PanelPlan:
    """How `panel_gemm` tiles the product: `rows` rows of x × `cols` weight rows of register
    accumulators, against a panel of `cols` weight rows × `blocks` blocks of k decoded to f32, for
    `row_block` rows of x at a time."""

    rows: int
    cols: int
    blocks: int
    row_block: int

    @staticmethod
    def tile(registers: int) -> tuple[int, int]:
        """(rows of x, weight rows) of the micro-kernel: the most accumulators that fit beside one
        vector per row of x and one weight vector, then the fewest loads per FMA."""
        shapes = [(r, c) for r in range(1, 9) for c in range(1, 9) if r * c + r + 1 <= registers]
        return max(shapes, key=lambda rc: (rc[0] * rc[1], -rc[0] - rc[1]))

    @classmethod
    def of(cls, lanes: int, scheme: str, k: int, m: int) -> "PanelPlan":
        """The plan on a host with `lanes` f32 lanes: the panel fills half of L1 (the rest holds x's
        rows), k-blocks near equal; x's slice of a k-block stays within `X_SLICE_L1` L1 sizes (in L2),
        the rows split into near-equal blocks where it would not."""
        rows, cols = cls.tile(vector_registers(lanes))
        elems, _ = GGUF_BLOCKS[scheme]
        l1 = l1d_bytes()
        fit = max(1, l1 // 2 // (cols * elems * 4))
        count = -(-(k // elems) // fit)
        blocks = -(-(k // elems) // count)
        row_blocks = -(-m // max(rows, X_SLICE_L1 * l1 // (blocks * elems * 4)))
        return cls(rows, cols, blocks, -(-m // row_blocks))


def panel_gemm(ctx: EmitContext, t: T.DequantMatMulGguf, plan: PanelPlan) -> None:
    """For each block of rows of x and each k-block, each tile of `plan.cols` weight rows is decoded
    once (exact values, as `decode_block`) into an f32 panel in L1, then every row of the block runs
    against it in register tiles; the first k-block stores `dst`, later ones add to it.  Weight rows
    are split across threads."""
    name = scheme_name(t)
    elems, nbytes = GGUF_BLOCKS[name]
    blocks = t.k // elems
    stride = plan.blocks * elems + PANEL_PAD  # f32 elements of one panel row

    def columns(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b, panel = sub.b, sub.scratch_alloc(plan.cols * stride * 4)

        def row_block(r0: ir.Value, count: int) -> None:
            """Rows `r0…r0 + count` of x against weight rows `start…stop`."""
            with sub.for_range(0, blocks, plan.blocks, name="kb") as b0:
                b1 = b.select(b.icmp_signed("<", b.add(b0, I64(plan.blocks)), I64(blocks)),
                              b.add(b0, I64(plan.blocks)), I64(blocks))
                first = b.icmp_signed("==", b0, I64(0))
                p0, p1 = b.mul(b0, I64(elems)), b.mul(b1, I64(elems))

                def panel_tile(j: ir.Value, cols: int) -> None:
                    decode_panel(sub, t, panel, stride, j, cols, b0, b1)
                    full, last = row_tiles(count, plan.rows)
                    if full:
                        with sub.for_range(r0, b.add(r0, I64(full)), plan.rows, name="rows") as row:
                            micro_tile(sub, t, panel, stride, row, plan.rows, j, cols, p0, p1, first)
                    for at, rows in zip(itertools.accumulate([full] + last), last):
                        micro_tile(sub, t, panel, stride, b.add(r0, I64(at)), rows, j, cols, p0, p1, first)

                by_tiles(sub, start, stop, plan.cols, panel_tile)

        whole = t.m - t.m % plan.row_block
        if whole:
            with sub.for_range(0, whole, plan.row_block, name="rblk") as r0:
                row_block(r0, plan.row_block)
        if t.m % plan.row_block:
            row_block(I64(whole), t.m % plan.row_block)

    ctx.parallel_for(t.n, columns, grain=plan.cols, min_work=max(1, PAR_BYTES // max(1, blocks * nbytes * t.m)))


def row_tiles(count: int, rows: int) -> tuple[int, list[int]]:
    """`count` rows of x as whole tiles of `rows` (how many rows they cover), then the sizes of the
    last tiles: a remainder and the last whole tile split near equally, since a tile of one row
    has too few accumulators to hide the FMA latency."""
    tail = count % rows + (rows if count > rows and count % rows else 0)
    last = [-(-tail // 2), tail // 2] if tail > rows else [tail] if tail else []
    return count - tail, last


def decode_panel(ctx: EmitContext, t: T.DequantMatMulGguf, panel: int, stride: int, j: ir.Value, cols: int,
                 b0: ir.Value, b1: ir.Value) -> None:
    """Blocks `b0…b1` of weight rows `j…j + cols` as f32 rows of `stride` at scratch offset `panel`."""
    b, name, width = ctx.b, scheme_name(t), chunk_width(ctx.lanes)
    elems, nbytes = GGUF_BLOCKS[name]
    row_bytes = t.k // elems * nbytes
    with ctx.for_range(0, cols, name="prow") as c:
        row = b.add(j, c)
        ahead = b.add(row, I64(cols))  # the same row of the next tile, fetched while this one is decoded
        ahead = b.select(b.icmp_signed("<", ahead, I64(t.n)), ahead, row)
        first, first_ahead = (b.add(b.mul(r, I64(row_bytes)), b.mul(b0, I64(nbytes))) for r in (row, ahead))
        out = b.mul(c, I64(stride))
        with ctx.for_range(b0, b1, name="pblk") as blk:
            at = b.sub(blk, b0)
            byte = b.mul(at, I64(nbytes))
            for line in range(0, nbytes, 64):
                prefetch(ctx, t.w_q, b.add(b.add(first_ahead, byte), I64(line)))
            ptr = ctx.addr(t.w_q, b.add(first, byte))
            for e, values in enumerate(decode_block(b, name, ptr, width)):
                index = b.add(out, b.add(b.mul(at, I64(elems)), I64(e * width)))
                ctx.store(panel, values, index, base=ctx.scratch)


def micro_tile(ctx: EmitContext, t: T.DequantMatMulGguf, panel: int, stride: int, row: ir.Value, rows: int,
               j: ir.Value, cols: int, p0: ir.Value, p1: ir.Value, first: ir.Value) -> None:
    """`dst[row + r, j + c] (+)= Σ_{p0 ≤ p < p1} x[row + r, p]·panel[c, p − p0]`: `rows × cols` vector
    accumulators along k, summed across lanes at the end (stored on the first k-block, added after)."""
    b, width = ctx.b, chunk_width(ctx.lanes)
    x_rows = [ctx.addr(t.x, b.add(b.mul(b.add(row, I64(r)), I64(t.k)), p0), 4) for r in range(rows)]
    w_rows = [scratch_ptr(ctx, panel, I64(c * stride), 4) for c in range(cols)]

    def step(q: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        accs = list(accs)
        for u in range(0, PANEL_STEP, width):
            at = b.add(q, I64(u))
            xs = [ctx.load(0, F32, at, width, base=x) for x in x_rows]
            for c, w in enumerate(w_rows):
                wv = ctx.load(0, F32, at, width, base=w)
                for r, xv in enumerate(xs):
                    s = r * cols + c
                    accs[s] = b.fadd(accs[s], b.fmul(xv, wv, flags=FASTMATH), flags=FASTMATH)
        return accs

    zero = const(F32, 0.0, width)
    accs = carried_loop(ctx, 0, b.sub(p1, p0), PANEL_STEP, [zero] * (rows * cols), step, name="p")
    for r in range(rows):
        for c in range(cols):
            at = b.add(b.mul(b.add(row, I64(r)), I64(t.n)), b.add(j, I64(c)))
            total = horizontal_sum(ctx, accs[r * cols + c])
            ctx.store(t.dst, b.select(first, total, b.fadd(total, ctx.load(t.dst, F32, at))), at)


# ── DequantGroupedMatMulGguf ─────────────────────────────────────────────────

def check_grouped_gguf(t: T.DequantGroupedMatMulGguf) -> None:
    """As DequantMatMulGguf (on `k_dim`), and an expert for every row."""
    check_gguf(t, "k_dim")
    if t.m and t.num_experts == 0:
        raise ValidationError(f"num_experts = 0 but m = {t.m} rows need an expert", field="num_experts")


def zero_fill(ctx: EmitContext, dst: int, count: int) -> None:
    """`count` f32 zeros at `dst` (a product over k = 0)."""
    with ctx.for_range(0, count, name="z") as i:
        ctx.store(dst, F32(0.0), i)


@lowering(T.DequantGroupedMatMulGguf, check=check_grouped_gguf)
def dequant_grouped_matmul_gguf(ctx: EmitContext, t: T.DequantGroupedMatMulGguf) -> None:
    """`dst[i] = input[i] @ W[idx[i]]ᵀ`, each row a GEMV over its expert's packed slab (expert `e`'s
    weight row `j` is row `e·n + j` of the stack); every id is checked (gemm's `expert_status`, naming the
    row) before anything is written, and weight rows are split across threads."""
    if t.m == 0 or t.n == 0:
        return
    with ctx.for_range(0, t.m, name="ids") as i:
        fail_unless(ctx, *expert_status(ctx, t, i))
    if t.k_dim == 0:
        zero_fill(ctx, t.dst, t.m * t.n)
        return
    flat = T.DequantMatMulGguf(x=t.input, w_q=t.w_q, dst=t.dst, m=t.m, k=t.k_dim, n=t.n, scheme=t.scheme)
    elems, nbytes = GGUF_BLOCKS[scheme_name(t)]
    sums = group_sums(ctx, t.input, t.m, t.k_dim, scheme_name(t))
    nr = weight_rows(ctx, scheme_name(t))

    def columns(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(0, t.m, name="row") as i:
            first = sub.b.mul(expert_of(sub, t.expert_idx, i), I64(t.n))
            by_tiles(sub, start, stop, nr, lambda j, cols: gemv_tile(sub, flat, sums, j, cols, i, w_row=sub.b.add(first, j)))

    ctx.parallel_for(t.n, columns, grain=nr, min_work=max(1, PAR_BYTES // max(1, t.k_dim // elems * nbytes * t.m)))


# ── DequantMoEWeightsGguf ────────────────────────────────────────────────────

def check_moe_gguf(t: T.DequantMoEWeightsGguf) -> None:
    """As DequantMatMulGguf, on `k_dim`."""
    check_gguf(t, "k_dim")


@lowering(T.DequantMoEWeightsGguf, check=check_moe_gguf)
def dequant_moe_weights_gguf(ctx: EmitContext, t: T.DequantMoEWeightsGguf) -> None:
    """`dst[e, p, j] = W_e[j, p]`: each weight row of the `[E·n, k]` stack decoded block by block and
    its lanes stored down a column of its expert's `[k, n]` output; weight rows split across threads."""
    rows, k, n, name = t.num_experts * t.n, t.k_dim, t.n, scheme_name(t)
    if rows == 0 or k == 0:
        return
    elems, nbytes = GGUF_BLOCKS[name]
    width, blocks = chunk_width(ctx.lanes), k // elems

    def weight_rows(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        with sub.for_range(start, stop, name="row") as r:
            expert, j = b.udiv(r, I64(n)), b.urem(r, I64(n))
            column = b.add(b.mul(expert, I64(k * n)), j)
            with sub.for_range(0, blocks, name="blk") as blk:
                ptr = sub.addr(t.w_q, b.mul(b.add(b.mul(r, I64(blocks)), blk), I64(nbytes)))
                top = b.add(column, b.mul(blk, I64(elems * n)))
                for c, values in enumerate(decode_block(b, name, ptr, width)):
                    for lane in range(width):
                        sub.store(t.dst, b.extract_element(values, I32(lane)), b.add(top, I64((c * width + lane) * n)))

    ctx.parallel_for(rows, weight_rows, min_work=max(1, PAR_BYTES // (blocks * nbytes)))
