"""MLX decoders in IR, and `DequantMatMulMlx` / `DequantGroupedMatMulMlx` with the decode fused into the
GEMV/GEMM tiles (semantics.md §2.11, §3.8; docs/lowering-mlx.md).

An MLX `[n, k]` weight (`mlx.core.quantize` layout): each row's codes are one LSB-first bit stream in
little-endian u32 words, one scale (and for affine one bias) per `group_size` elements.  Groups are
multiples of 32 elements, so every group starts on a word and the word and shift of each lane of a
chunk are compile-time constants: `unpack` loads the chunk's words once, spreads them over the lanes by
shuffles and shifts each lane into place (one parametrized unpacker for every width; 3-, 5- and 6-bit
codes that straddle two words take their high bits from the next one).  Affine values are
`scale·q + bias` (two roundings, as `mlx.core.dequantize`); mxfp4 / mxfp8 are E2M1 / E4M3 codes
(`lowp_floats.decode`) times the E8M0 group scale as MLX decodes it (`e8m0`, 255 → +inf).

The tile (`NR` weight rows × `MR` rows of x) decodes each `CW`-lane chunk once into a register and
multiplies it into every row's accumulators, so W is never materialised in f32 and `m = 1` streams the
packed bytes once; weight rows are split across threads.  The grouped kind checks every expert id
(the f32 id `as usize` below `num_experts`, else status `INDEX_OUT_OF_RANGE | (row + 1) << 8`) before writing anything,
then runs each row as a GEMV over its expert's slab.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from llvmlite import ir

from .. import thunks as T
from ..errors import ValidationError
from ..ops import QuantScheme
from ..reference.mlx import code_bits
from ..reference.scaled import FORMATS
from ..registry import lowering
from .context import EmitContext
from .gemm import expert_of, expert_status
from .gguf import by_tiles, horizontal_sum, zero_fill
from .lowp_floats import decode
from .toolkit import F32, FASTMATH, I16, I32, I64, I8, PTR, bf16_bits_to_f32, carried_loop, const, fail_unless, splat

MR = 4              # rows of x sharing one decoded chunk
NR = 2              # weight rows decoded together (their chunks share each load of x)
ACCUMULATORS = 4    # independent accumulator chains a tile should have at least
MAX_CHUNK = 16      # lanes of one decoded chunk (at most a 512-bit register)
PAR_BYTES = 1 << 15  # packed weight bytes a thread should get before weight rows are split
AFFINE_BITS = (2, 3, 4, 5, 6, 8)
AFFINE_GROUPS = (32, 64, 128)
MX_GROUPS = (32,)
MX_FORMATS = {"MlxMxfp4": FORMATS["F4E2M1"], "MlxMxfp8": FORMATS["F8E4M3"]}

Mlx = Union[T.DequantMatMulMlx, T.DequantGroupedMatMulMlx]


# ── validation ───────────────────────────────────────────────────────────────

def check_scheme(t: Mlx, k: int, k_field: str) -> None:
    """An MLX scheme lowered here (affine bits 2/3/4/5/6/8, groups 32/64/128; mxfp4/mxfp8, groups of 32),
    and `k` (field `k_field`) a whole number of groups."""
    s = t.scheme
    if not isinstance(s, (QuantScheme.MlxAffine, QuantScheme.MlxMxfp4, QuantScheme.MlxMxfp8)):
        raise ValidationError(f"scheme {s!r} is not an MLX scheme (MlxAffine, MlxMxfp4, MlxMxfp8)", field="scheme")
    affine = isinstance(s, QuantScheme.MlxAffine)
    if affine and s.bits not in AFFINE_BITS:
        raise ValidationError(f"scheme {s!r}: MlxAffine bits = {s.bits} is not lowered (bits: "
                              f"{', '.join(map(str, AFFINE_BITS))})", field="scheme")
    groups = AFFINE_GROUPS if affine else MX_GROUPS
    if s.group_size not in groups:
        raise ValidationError(f"scheme {s!r}: group_size = {s.group_size} is not lowered for {type(s).__name__} "
                              f"(group sizes: {', '.join(map(str, groups))})", field="scheme")
    if k % s.group_size:
        raise ValidationError(f"{k_field} = {k} is not a multiple of the {type(s).__name__} group size "
                              f"{s.group_size}", field=k_field)


def check_mlx(t: T.DequantMatMulMlx) -> None:
    """A lowered MLX scheme and `k` a whole number of its groups."""
    check_scheme(t, t.k, "k")


def check_grouped_mlx(t: T.DequantGroupedMatMulMlx) -> None:
    """As DequantMatMulMlx (on `k_dim`), an expert for every row, and slabs that hold a whole weight."""
    check_scheme(t, t.k_dim, "k_dim")
    if t.m and t.num_experts == 0:
        raise ValidationError(f"num_experts = 0 but m = {t.m} rows need an expert", field="num_experts")
    need = t.n * t.k_dim * code_bits(t.scheme) // 8
    if t.num_experts and t.slab_bytes < need:
        raise ValidationError(f"slab_bytes = {t.slab_bytes} is less than one expert's codes: n = {t.n} rows × "
                              f"{t.k_dim * code_bits(t.scheme) // 32} u32 words = {need} bytes", field="slab_bytes")


# ── decoding ─────────────────────────────────────────────────────────────────

def chunk_width(lanes: int) -> int:
    """Lanes of one decoded chunk on a host with `lanes` f32 lanes."""
    return min(lanes, MAX_CHUNK)


def unpack(b: ir.IRBuilder, words: ir.Value, first: int, width: int, bits: int) -> ir.Value:
    """`<width x i32>` codes of `bits` bits from bit `first` on of the LSB-first stream of u32 words at
    `words`: the chunk's words loaded once, each lane's word picked by a shuffle and shifted down, and
    a code that straddles two words completed from the next one."""
    starts = [first + lane * bits for lane in range(width)]
    lo, hi = starts[0] // 32, (starts[-1] + bits - 1) // 32
    count = hi - lo + 1
    vty = ir.VectorType(I32, count)
    loaded = b.load(b.gep(words, [I64(4 * lo)], source_etype=I8, inbounds=True), typ=vty, align=1)
    zero = ir.Constant(vty, None)

    def lanes(values: list[int]) -> ir.Constant:
        return ir.Constant(ir.VectorType(I32, width), values)

    word = [s // 32 - lo for s in starts]
    shift = [s % 32 for s in starts]
    codes = b.lshr(b.shuffle_vector(loaded, zero, lanes(word)), lanes(shift))
    straddles = [sh + bits > 32 for sh in shift]
    if any(straddles):   # the next word's low bits, shifted up; `count` picks a zero lane
        nxt = [w + 1 if s else count for w, s in zip(word, straddles)]
        up = [32 - sh if s else 0 for sh, s in zip(shift, straddles)]
        codes = b.or_(codes, b.shl(b.shuffle_vector(loaded, zero, lanes(nxt)), lanes(up)))
    return b.and_(codes, const(I32, (1 << bits) - 1, width))


def e8m0(b: ir.IRBuilder, byte: ir.Value) -> ir.Value:
    """An E8M0 scale byte (i32) as MLX decodes it: `2^(s − 127)`, s = 0 → 2^−127, s = 255 → +inf (the f32
    bits `s << 23`).  Unlike `lowp_floats.e8m0_decode`, 255 is not NaN."""
    is_zero = b.icmp_unsigned("==", byte, I32(0))
    return b.bitcast(b.select(is_zero, I32(1 << 22), b.shl(byte, I32(23))), F32)


@dataclass(frozen=True)
class Params:
    """One group's scale (f32) and, for affine schemes, bias."""

    scale: ir.Value
    bias: ir.Value | None = None


def scale_type(scheme: QuantScheme, bf16: bool) -> ir.Type:
    """Storage of the per-group scales and biases: E8M0 bytes (mxfp), bf16 bits or f32."""
    if not isinstance(scheme, QuantScheme.MlxAffine):
        return I8
    return I16 if bf16 else F32


def group_params(b: ir.IRBuilder, scheme: QuantScheme, storage: ir.Type, scales: ir.Value, biases: ir.Value,
                 index: ir.Value) -> Params:
    """Scale (and bias) of group `index` of the `scales` / `biases` arrays of element type `storage`."""
    def load(base: ir.Value) -> ir.Value:
        raw = b.load(b.gep(base, [index], source_etype=storage, inbounds=True), typ=storage, align=1)
        if storage is I8:
            return e8m0(b, b.zext(raw, I32))
        return bf16_bits_to_f32(b, raw) if storage is I16 else raw

    if isinstance(scheme, QuantScheme.MlxAffine):
        return Params(load(scales), load(biases))
    return Params(load(scales))


def element_values(ctx: EmitContext, scheme: QuantScheme, group: ir.Value, first: int, width: int) -> ir.Value:
    """`<width x float>` of elements `first…` of the group whose codes start at `group`, before the group's
    parameters: the codes (affine) or the E2M1 / E4M3 values (mxfp)."""
    b = ctx.b
    q = unpack(b, group, first * code_bits(scheme), width, code_bits(scheme))
    if isinstance(scheme, QuantScheme.MlxAffine):
        return b.sitofp(q, ir.VectorType(F32, width))
    return decode(ctx, MX_FORMATS[type(scheme).__name__], b.trunc(q, ir.VectorType(I8, width)))


def chunk_values(ctx: EmitContext, scheme: QuantScheme, group: ir.Value, first: int, width: int, p: Params
                 ) -> ir.Value:
    """`<width x float>` weights of elements `first…` of the group: `scale·q + bias` (two roundings) or
    `value·scale`, as `mlx.core.dequantize`."""
    b = ctx.b
    scaled = b.fmul(element_values(ctx, scheme, group, first, width), splat(b, p.scale, width))
    return scaled if p.bias is None else b.fadd(scaled, splat(b, p.bias, width))


def group_bytes(scheme: QuantScheme) -> int:
    """Packed code bytes of one group (a whole number of u32 words)."""
    return scheme.group_size * code_bits(scheme) // 8


def define_dequantize(module: ir.Module, scheme: QuantScheme, bf16: bool, width: int, name: str) -> ir.Function:
    """`void name(ptr codes, ptr scales, ptr biases, ptr out, i64 groups)`: `groups` consecutive groups
    decoded to f32 with `width`-lane chunks (for tests)."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, PTR, I64]), name)
    codes, scales, biases, out, count = fn.args

    def declare(sym: str, fnty: ir.FunctionType) -> ir.Function:
        return module.globals.get(sym) or ir.Function(module, fnty, sym)

    ctx = EmitContext(module, fn, 0, None, None, width, declare)
    storage, size = scale_type(scheme, bf16), scheme.group_size
    with ctx.for_range(0, count, name="g") as g:
        b = ctx.b
        p = group_params(b, scheme, storage, scales, biases, g)
        start = b.gep(codes, [b.mul(g, I64(group_bytes(scheme)))], source_etype=I8)
        for first in range(0, size, width):
            at = b.add(b.mul(g, I64(size)), I64(first))
            b.store(chunk_values(ctx, scheme, start, first, width, p), b.gep(out, [at], source_etype=F32), align=4)
    ctx.b.ret_void()
    return fn


# ── the fused tile ───────────────────────────────────────────────────────────

@dataclass(frozen=True)
class Weights:
    """A stack of MLX-quantized `[n, k]` weights in the arena: expert `e`'s codes at `codes + e·slab_bytes`,
    its scales / biases the `e`-th `[n, k / group]` block of `scales` / `biases`."""

    scheme: QuantScheme
    codes: int
    scales: int
    biases: int
    n: int
    k: int
    slab_bytes: int
    storage: ir.Type

    @property
    def groups(self) -> int:
        """Groups per weight row."""
        return self.k // self.scheme.group_size

    @property
    def row_bytes(self) -> int:
        """Code bytes of one weight row."""
        return self.groups * group_bytes(self.scheme)

    def row(self, ctx: EmitContext, expert: ir.Value, j: ir.Value) -> tuple[ir.Value, ir.Value]:
        """(pointer to the codes, index of the first group's parameters) of weight row `j` of `expert`."""
        b = ctx.b
        byte = b.add(b.mul(expert, I64(self.slab_bytes)), b.mul(j, I64(self.row_bytes)))
        return ctx.addr(self.codes, byte), b.mul(b.add(b.mul(expert, I64(self.n)), j), I64(self.groups))


def tile(ctx: EmitContext, w: Weights, x: int, dst: int, expert: ir.Value, j: ir.Value, cols: int,
         row: ir.Value, rows: int) -> None:
    """`dst[row + r, j + c] = Σ_p x[row + r, p]·W_expert[j + c, p]` for r < rows, c < cols, in MLX's order:
    per group, each chunk of codes (or mxfp values) is decoded once into a register and multiplied into
    every row's group sums `Σ x·q` (`chains` independent ones when the tile alone is too small to hide
    the FMA latency); then the group's parameters are applied once, `acc += scale·Σ x·q + bias·Σ x`."""
    b, scheme = ctx.b, w.scheme
    size, width = scheme.group_size, chunk_width(ctx.lanes)
    affine = isinstance(scheme, QuantScheme.MlxAffine)
    w_rows = [w.row(ctx, expert, b.add(j, I64(c))) for c in range(cols)]
    x_rows = [ctx.addr(x, b.mul(b.add(row, I64(r)), I64(w.k)), 4) for r in range(rows)]
    scales = ctx.addr(w.scales)
    biases = ctx.addr(w.biases) if affine else scales   # mxfp: no biases
    chunks = size // width
    slots = [(r, c) for r in range(rows) for c in range(cols)]
    chains = max(1, min(chunks, ACCUMULATORS // len(slots)))
    zero = const(F32, 0.0, width)

    def step(g: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        first = b.mul(g, I64(size))
        starts = [b.gep(codes, [b.mul(g, I64(group_bytes(scheme)))], source_etype=I8, inbounds=True)
                  for codes, _ in w_rows]
        sums, x_sums = [zero] * (len(slots) * chains), [zero] * rows
        for e in range(chunks):
            values = [element_values(ctx, scheme, start, e * width, width) for start in starts]
            xs = [ctx.load(0, F32, b.add(first, I64(e * width)), width, base=x_row) for x_row in x_rows]
            if affine:
                x_sums = [b.fadd(total, v, flags=FASTMATH) for total, v in zip(x_sums, xs)]
            for s, (r, c) in enumerate(slots):
                at = s * chains + e % chains
                sums[at] = b.fadd(sums[at], b.fmul(xs[r], values[c], flags=FASTMATH), flags=FASTMATH)
        params = [group_params(b, scheme, w.storage, scales, biases, b.add(index, g)) for _, index in w_rows]
        accs = list(accs)
        for s, (r, c) in enumerate(slots):
            total = sums[s * chains]
            for extra in sums[s * chains + 1:(s + 1) * chains]:
                total = b.fadd(total, extra, flags=FASTMATH)
            p = params[c]
            acc = b.fadd(accs[s], b.fmul(splat(b, p.scale, width), total, flags=FASTMATH), flags=FASTMATH)
            if p.bias is not None:
                acc = b.fadd(acc, b.fmul(splat(b, p.bias, width), x_sums[r], flags=FASTMATH), flags=FASTMATH)
            accs[s] = acc
        return accs

    accs = carried_loop(ctx, 0, w.groups, 1, [zero] * len(slots), step, name="grp")
    for s, (r, c) in enumerate(slots):
        at = b.add(b.mul(b.add(row, I64(r)), I64(w.n)), b.add(j, I64(c)))
        ctx.store(dst, horizontal_sum(ctx, accs[s]), at)


def min_work(w: Weights, m: int) -> int:
    """Weight rows a thread should get at least."""
    return max(1, PAR_BYTES // max(1, w.row_bytes * m))


@lowering(T.DequantMatMulMlx, check=check_mlx)
def dequant_matmul_mlx(ctx: EmitContext, t: T.DequantMatMulMlx) -> None:
    """`dst = x @ Wᵀ` with W decoded chunk by chunk in registers; weight rows split across threads."""
    if t.m == 0 or t.n == 0:
        return
    if t.k == 0:
        zero_fill(ctx, t.dst, t.m * t.n)
        return
    w = Weights(t.scheme, t.w_q, t.scale, t.zp, t.n, t.k, 0, scale_type(t.scheme, False))
    full = t.m - t.m % MR

    def columns(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        def rows_against(j: ir.Value, cols: int) -> None:
            if full:
                with sub.for_range(0, full, MR, name="rows") as row:
                    tile(sub, w, t.x, t.dst, I64(0), j, cols, row, MR)
            if full < t.m:
                with sub.for_range(full, t.m, name="row") as row:
                    tile(sub, w, t.x, t.dst, I64(0), j, cols, row, 1)

        by_tiles(sub, start, stop, NR, rows_against)

    ctx.parallel_for(t.n, columns, grain=NR, min_work=min_work(w, t.m))


@lowering(T.DequantGroupedMatMulMlx, check=check_grouped_mlx)
def dequant_grouped_matmul_mlx(ctx: EmitContext, t: T.DequantGroupedMatMulMlx) -> None:
    """`dst[i] = input[i] @ W[idx[i]]ᵀ`, each row a GEMV over its expert's slab; every id is checked before
    anything is written, and weight rows are split across threads."""
    if t.m == 0:
        return
    with ctx.for_range(0, t.m, name="ids") as i:
        fail_unless(ctx, *expert_status(ctx, t, i))
    if t.n == 0:
        return
    if t.k_dim == 0:
        zero_fill(ctx, t.dst, t.m * t.n)
        return
    w = Weights(t.scheme, t.w_q, t.scale, t.zp, t.n, t.k_dim, t.slab_bytes, scale_type(t.scheme, t.scale_bf16))

    def columns(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        with sub.for_range(0, t.m, name="row") as i:
            expert = expert_of(sub, t.expert_idx, i)
            by_tiles(sub, start, stop, NR, lambda j, cols: tile(sub, w, t.input, t.dst, expert, j, cols, i, 1))

    ctx.parallel_for(t.n, columns, grain=NR, min_work=min_work(w, t.m))
