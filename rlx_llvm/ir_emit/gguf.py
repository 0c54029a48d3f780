"""GGUF block decoders in IR, and `DequantMatMulGguf` with the decode fused into the GEMV/GEMM
(semantics.md §2.11, §3.8; docs/lowering-gguf.md).

Block layouts are llama.cpp's (ggml-common.h): a block of 32 (legacy) or 256 (K-quant) weights,
f16 scales, packed codes.  Each decoder turns `CW` consecutive elements of one block into a
`<CW x float>` vector, `CW = min(lanes, 16)`: every such chunk lies inside one scale group and one
contiguous run of code bytes, so its codes are one vector load, a shift and a mask, and its scales
are scalars.  The arithmetic is llama.cpp's, operation for operation and without contraction
(`d·q + m` is a multiply then an add), so the values are bit-identical to `gguf.quants.dequantize`.

`DequantMatMulGguf` (`dst[i, j] = Σ_p x[i, p]·W[j, p]`, `W [n, k]` packed row-major) never
materialises W in f32: per tile of `NR` weight rows × `MR` rows of x, each chunk is decoded into a
register and multiplied into the rows' accumulators, so a decode is shared by `MR` rows, an x load
by `NR` weight rows, and `m = 1` is a streaming GEMV over the packed bytes.  Weight rows are split
across threads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..ops import QuantScheme
from ..registry import lowering
from ..kernels.blas import Status
from ..thunks.quant import GGUF_BLOCKS
from .context import EmitContext
from .gemm import expert_of
from .toolkit import F16, F32, FASTMATH, I16, I32, I64, I8, PTR, carried_loop, const, fail_unless, splat, vec

MR = 4              # rows of x sharing one decoded chunk
NR = 2              # weight rows decoded together (their chunks share each load of x)
ACCUMULATORS = 4    # independent accumulator chains a tile should have at least
MAX_CHUNK = 16      # lanes of one decoded chunk: the smallest scale group (Q2_K, Q3_K, Q6_K)
PAR_BYTES = 1 << 15  # packed weight bytes a thread should get before rows of W are split
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

Chunk = Callable[["Block", int], ir.Value]


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
        return self.b.or_(low, self.b.shl(high, const(I32, shift, self.width)))

    def scaled(self, scale: ir.Value, codes: ir.Value, offset: ir.Value | None = None, negate: bool = False
               ) -> ir.Value:
        """`scale·f32(codes)`, then `+ offset` (or `− offset` when `negate`): two roundings, no FMA."""
        b = self.b
        y = b.fmul(splat(b, scale, self.width), b.sitofp(codes, vec(F32, self.width)))
        if offset is None:
            return y
        off = splat(b, offset, self.width)
        return b.fsub(y, off) if negate else b.fadd(y, off)

    def times(self, d: ir.Value, small: ir.Value) -> ir.Value:
        """Scalar `d·f32(small)` (a sub-block scale from its integer code)."""
        return self.b.fmul(d, self.b.sitofp(small, F32))

    def lookup(self, codes: ir.Value) -> ir.Value:
        """IQ4's non-linear table `IQ4_VALUES[code]` lane-wise, as a select tree on the code's bits."""
        b, w = self.b, self.width
        values = [const(I32, v, w) for v in IQ4_VALUES]
        for bit in range(4):
            on = b.icmp_unsigned("!=", b.and_(codes, const(I32, 1 << bit, w)), const(I32, 0, w))
            values = [b.select(on, hi, lo) for lo, hi in zip(values[::2], values[1::2])]
        return values[0]


def nibble(blk: Block, base: int, e: int, run: int = 16) -> ir.Value:
    """The 4-bit codes of elements `e…` stored low nibbles first: `run` bytes hold `2·run` elements."""
    group, lane = divmod(e, 2 * run)
    half, at = divmod(lane, run)
    return blk.codes(base + group * run + at, 4 * half, 15)


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

def q8_0(blk: Block, e: int) -> ir.Value:
    return blk.scaled(blk.half(0), blk.signed_codes(2 + e))


def q4_0(blk: Block, e: int) -> ir.Value:
    return blk.scaled(blk.half(0), blk.plus(nibble(blk, 2, e), -8))


def q4_1(blk: Block, e: int) -> ir.Value:
    return blk.scaled(blk.half(0), nibble(blk, 4, e), blk.half(2))


def q5_0(blk: Block, e: int) -> ir.Value:
    q = blk.or_shl(nibble(blk, 6, e), blk.word_bits(2, e), 4)
    return blk.scaled(blk.half(0), blk.plus(q, -16))


def q5_1(blk: Block, e: int) -> ir.Value:
    q = blk.or_shl(nibble(blk, 8, e), blk.word_bits(4, e), 4)
    return blk.scaled(blk.half(0), q, blk.half(2))


def iq4_nl(blk: Block, e: int) -> ir.Value:
    return blk.scaled(blk.half(0), blk.lookup(nibble(blk, 2, e)))


def q8_k(blk: Block, e: int) -> ir.Value:
    return blk.scaled(blk.f32(0), blk.signed_codes(4 + e))


def q2_k(blk: Block, e: int) -> ir.Value:
    """Scales (low nibble) and mins (high nibble) per 16, then codes, then d and dmin at the end."""
    g = e // 16
    dl = blk.times(blk.half(80), blk.field(g, 0, 15))
    ml = blk.times(blk.half(82), blk.field(g, 4, 15))
    return blk.scaled(dl, crumb(blk, 16, e), ml, negate=True)


def q3_k(blk: Block, e: int) -> ir.Value:
    """hmask, 2-bit codes, twelve bytes of 6-bit scales, d at the end; the code is `q − 4` where the
    mask bit is clear."""
    g = e // 16
    low = blk.field(96 + g % 8, 4 * (g // 8), 15)
    high = blk.field(104 + g % 4, 2 * (g // 4), 3)
    scale = blk.b.sub(blk.b.or_(low, blk.b.shl(high, I32(4))), I32(32))
    q = blk.b.add(crumb(blk, 32, e), blk.b.shl(blk.plus(high_bit(blk, 0, e), -1), const(I32, 2, blk.width)))
    return blk.scaled(blk.times(blk.half(108), scale), q)


def k_scale_min(blk: Block, s: int) -> tuple[ir.Value, ir.Value]:
    """Q4_K/Q5_K's 6-bit (scale, min) of sub-block `s` from the twelve bytes at 4."""
    b = blk.b
    if s < 4:
        return blk.field(4 + s, 0, 63), blk.field(8 + s, 0, 63)
    scale = b.or_(blk.field(12 + s - 4, 0, 15), b.shl(blk.field(4 + s - 4, 6, 3), I32(4)))
    low = b.or_(blk.field(12 + s - 4, 4, 15), b.shl(blk.field(8 + s - 4, 6, 3), I32(4)))
    return scale, low


def k_affine(blk: Block, e: int, q: ir.Value) -> ir.Value:
    """`(d·scale)·q − dmin·min` of sub-block `e // 32`."""
    scale, low = k_scale_min(blk, e // 32)
    return blk.scaled(blk.times(blk.half(0), scale), q, blk.times(blk.half(2), low), negate=True)


def q4_k(blk: Block, e: int) -> ir.Value:
    return k_affine(blk, e, nibble(blk, 16, e, run=32))


def q5_k(blk: Block, e: int) -> ir.Value:
    return k_affine(blk, e, blk.or_shl(nibble(blk, 48, e, run=32), high_bit(blk, 16, e), 4))


def q6_k(blk: Block, e: int) -> ir.Value:
    """Low nibbles, 2-bit highs, int8 scales per 16, d at the end; the code is `q − 32`."""
    q = blk.or_shl(nibble(blk, 0, e, run=64), crumb(blk, 128, e), 4)
    return blk.scaled(blk.times(blk.half(208), blk.i8(192 + e // 16)), blk.plus(q, -32))


def iq4_xs(blk: Block, e: int) -> ir.Value:
    """d, 2-bit scale highs (u16), 4-bit scale lows, then IQ4 codes per 32 in runs of 16."""
    b, s = blk.b, e // 32
    high = b.and_(b.lshr(b.zext(blk.load(2, I16), I32), I32(2 * s)), I32(3))
    scale = b.sub(b.or_(blk.field(4 + s // 2, 4 * (s % 2), 15), b.shl(high, I32(4))), I32(32))
    return blk.scaled(blk.times(blk.half(0), scale), blk.lookup(nibble(blk, 8, e)))


DECODERS: dict[str, Chunk] = {
    "GgufQ8_0": q8_0, "GgufQ4_0": q4_0, "GgufQ4_1": q4_1, "GgufQ5_0": q5_0, "GgufQ5_1": q5_1,
    "GgufQ2K": q2_k, "GgufQ3K": q3_k, "GgufQ4K": q4_k, "GgufQ5K": q5_k, "GgufQ6K": q6_k, "GgufQ8K": q8_k,
    "GgufIQ4NL": iq4_nl, "GgufIQ4XS": iq4_xs,
}
"""The GGUF schemes decoded here, by QuantScheme variant name."""


def chunk_width(lanes: int) -> int:
    """Lanes of one decoded chunk on a host with `lanes` f32 lanes."""
    return min(lanes, MAX_CHUNK)


def decode_block(b: ir.IRBuilder, scheme: str, ptr: ir.Value, width: int) -> list[ir.Value]:
    """Every element of the block at `ptr`, as `<width x float>` chunks in order."""
    elems, _ = GGUF_BLOCKS[scheme]
    blk, decode = Block(b, ptr, width), DECODERS[scheme]
    return [decode(blk, e) for e in range(0, elems, width)]


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


def tile(ctx: EmitContext, t: T.DequantMatMulGguf, j: ir.Value, cols: int, row: ir.Value, rows: int,
         w_row: ir.Value | None = None) -> None:
    """`dst[row + r, j + c]` for r < rows, c < cols: every block of weight rows `w_row…w_row + cols`
    (default `j…`) decoded once into registers and multiplied into each x row's accumulators
    (`chains` independent ones per output when the tile alone is too small to hide the FMA latency)."""
    b, name = ctx.b, scheme_name(t)
    elems, nbytes = GGUF_BLOCKS[name]
    width, blocks = chunk_width(ctx.lanes), t.k // elems
    w_row = j if w_row is None else w_row
    w_rows = [ctx.addr(t.w_q, b.mul(b.add(w_row, I64(c)), I64(blocks * nbytes))) for c in range(cols)]
    x_rows = [ctx.addr(t.x, b.mul(b.add(row, I64(r)), I64(t.k)), 4) for r in range(rows)]
    chains = max(1, min(elems // width, ACCUMULATORS // (rows * cols)))
    slots = [(r, c) for r in range(rows) for c in range(cols)]

    def step(blk: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        first, accs = b.mul(blk, I64(elems)), list(accs)
        chunks = [decode_block(b, name, b.gep(w, [b.mul(blk, I64(nbytes))], source_etype=I8, inbounds=True), width)
                  for w in w_rows]
        for e in range(elems // width):
            xs = [ctx.load(0, F32, b.add(first, I64(e * width)), width, base=x) for x in x_rows]
            for s, (r, c) in enumerate(slots):
                at = s * chains + e % chains
                accs[at] = b.fadd(accs[at], b.fmul(xs[r], chunks[c][e], flags=FASTMATH), flags=FASTMATH)
        return accs

    zero = const(F32, 0.0, width)
    accs = carried_loop(ctx, 0, blocks, 1, [zero] * (len(slots) * chains), step, name="blk")
    for s, (r, c) in enumerate(slots):
        total = accs[s * chains]
        for extra in accs[s * chains + 1:(s + 1) * chains]:
            total = b.fadd(total, extra, flags=FASTMATH)
        at = b.add(b.mul(b.add(row, I64(r)), I64(t.n)), b.add(j, I64(c)))
        ctx.store(t.dst, horizontal_sum(ctx, total), at)


def column_tile(ctx: EmitContext, t: T.DequantMatMulGguf, j: ir.Value, cols: int) -> None:
    """Every row of x against weight rows `j…j + cols`: `MR`-row tiles, then single rows."""
    full = t.m - t.m % MR
    if full:
        with ctx.for_range(0, full, MR, name="rows") as row:
            tile(ctx, t, j, cols, row, MR)
    for r in range(full, t.m):
        tile(ctx, t, j, cols, I64(r), 1)


def horizontal_sum(ctx: EmitContext, v: ir.Value) -> ir.Value:
    """The sum of a vector's lanes (reassociated)."""
    fn = ctx.intrinsic(f"llvm.vector.reduce.fadd.v{v.type.count}f32", F32, [F32, v.type])
    return ctx.b.call(fn, [F32(-0.0), v], fastmath=FASTMATH + ("reassoc",))


@lowering(T.DequantMatMulGguf, check=check_gguf)
def dequant_matmul_gguf(ctx: EmitContext, t: T.DequantMatMulGguf) -> None:
    """`dst = x @ Wᵀ` with W decoded block by block in registers; weight rows split across threads."""
    if t.m == 0 or t.n == 0:
        return
    elems, nbytes = GGUF_BLOCKS[scheme_name(t)]
    if t.k == 0:
        zero_fill(ctx, t.dst, t.m * t.n)
        return
    row_bytes = t.k // elems * nbytes

    def columns(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        b = sub.b
        full = b.add(start, b.mul(b.udiv(b.sub(stop, start), I64(NR)), I64(NR)))
        with sub.for_range(start, full, NR, name="j") as j:
            column_tile(sub, t, j, NR)
        with sub.for_range(full, stop, name="j") as j:
            column_tile(sub, t, j, 1)

    ctx.parallel_for(t.n, columns, grain=NR, min_work=max(1, PAR_BYTES // max(1, row_bytes * t.m)))


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
    weight row `j` is row `e·n + j` of the stack); every id is checked (`INDEX_OUT_OF_RANGE`) before
    anything is written, and weight rows are split across threads."""
    if t.m == 0 or t.n == 0:
        return
    b = ctx.b
    with ctx.for_range(0, t.m, name="ids") as i:
        fail_unless(ctx, b.icmp_unsigned("<", expert_of(ctx, t.expert_idx, i), I64(t.num_experts)),
                    Status.INDEX_OUT_OF_RANGE)
    if t.k_dim == 0:
        zero_fill(ctx, t.dst, t.m * t.n)
        return
    flat = T.DequantMatMulGguf(x=t.input, w_q=t.w_q, dst=t.dst, m=t.m, k=t.k_dim, n=t.n, scheme=t.scheme)
    elems, nbytes = GGUF_BLOCKS[scheme_name(t)]

    def columns(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        sb = sub.b
        full = sb.add(start, sb.mul(sb.udiv(sb.sub(stop, start), I64(NR)), I64(NR)))
        with sub.for_range(0, t.m, name="row") as i:
            first = sb.mul(expert_of(sub, t.expert_idx, i), I64(t.n))
            with sub.for_range(start, full, NR, name="j") as j:
                tile(sub, flat, j, NR, i, 1, w_row=sb.add(first, j))
            with sub.for_range(full, stop, name="j") as j:
                tile(sub, flat, j, 1, i, 1, w_row=sb.add(first, j))

    ctx.parallel_for(t.n, columns, grain=NR, min_work=max(1, PAR_BYTES // max(1, t.k_dim // elems * nbytes * t.m)))


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
