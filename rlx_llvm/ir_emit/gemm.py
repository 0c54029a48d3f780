"""GEMM-family thunks as native code: inline IR register tiles, or SciPy's OpenBLAS called from
JIT code (semantics.md §3.2, §3.7, §3.8; docs/lowering-blas.md).

`gemm()` is the one entry point; every dim is a compile-time constant:

* **IR tiles** (`tile_gemm`) for real GEMMs up to 2048³ multiply-adds: on this Zen 5 they run at
  up to ~2× SciPy's OpenBLAS (SkylakeX kernel), tie it at 2048³, and split column panels across
  rlx_llvm's threads.
  `RLX_LLVM_GEMM=blas` sends every GEMM to BLAS instead.
* **BLAS** (`blas_gemm`) for complex GEMMs, run-time row counts and larger sizes.  Row-major via
  the operand swap: a row-major `X[r, c]` read as column-major is `Xᵀ`, so `C = op(A)·op(B)` is
  `Cᵀ = op(B)ᵀ·op(A)ᵀ`: `?gemm(tb, ta, n, m, k, α, B, ldb, A, lda, β, C, n)`.  Transposed
  operands (`SgemmT`, `GroupedMatMul.w_transposed`, SynthMatMul's codebook weight) only flip a
  trans flag and a leading dimension — nothing is materialized.
* **Packed halves** are widened to f32 by a vector loop into Program-owned scratch (one buffer per
  calling thread); a packed `c` is computed in scratch and rounded back RNE (`narrow_from_f32`).
* **Epilogues** (`FusedMmBiasAct`) are one vector pass over C: per column panel right after its
  tiles, or over the whole of C after a BLAS call.
* **Zero dims** never reach either: `m = 0` or `n = 0` writes nothing, `k = 0` writes zeros.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from typing import Callable, Iterator

from llvmlite import ir

from .. import jit
from .. import thunks as T
from ..dtypes import DType, HalfKind
from ..errors import ValidationError
from ..kernels.blas import BLAS_INT_MAX, Status
from ..kernels.pool import MAX_THREADS
from .blas_calls import FortranArgs
from .context import ArenaRef, EmitContext, MovableRef, Operand, pointer
from .printed import define_once
from .toolkit import (F32, F64, I8, I32, I64, PTR, STORAGE, copy_bytes, entry_alloca, fail_unless, lane_ids, load_lanes,
                      narrow_from_f32, scratch_ptr, splat, store_lanes, suffix, vector_registers, widen_to_f32,
                      zero_bytes)
from . import elementmath as em
from ..registry import lowering

ITEMSIZE = {"s": 4, "d": 8, "c": 8}  # bytes per element of ?gemm's precision


# ── validation ───────────────────────────────────────────────────────────────

def check_blas_ints(*fields: str) -> Callable:
    """A `check(thunk)` that every named dim fits SciPy's 32-bit BLAS integers."""
    def check(t) -> None:
        for name in fields:
            value = getattr(t, name)
            if value > BLAS_INT_MAX:
                raise ValidationError(f"{name} = {value} exceeds the 32-bit BLAS integer bound {BLAS_INT_MAX}",
                                      field=name)
    return check


# ── matrix copies ────────────────────────────────────────────────────────────

def copy_matrix(ctx: EmitContext, src: ir.Value, dst: ir.Value, rows: int, cols: int, src_ty: ir.Type,
                dst_ty: ir.Type, transpose: bool) -> None:
    """`dst = convert(src)` for a row-major `[rows, cols]` matrix; `transpose` stores it `[cols, rows]`."""
    b = ctx.b
    convert = _converter(b, src_ty, dst_ty)
    with ctx.for_range(0, rows, name="r") as r:
        with ctx.for_range(0, cols, name="c") as c:
            x = convert(ctx.load(0, src_ty, b.add(b.mul(r, I64(cols)), c), base=src))
            at = b.add(b.mul(c, I64(rows)), r) if transpose else b.add(b.mul(r, I64(cols)), c)
            ctx.store(0, x, at, base=dst)


def _converter(b: ir.IRBuilder, src_ty: ir.Type, dst_ty: ir.Type) -> Callable[[ir.Value], ir.Value]:
    if src_ty == dst_ty:
        return lambda x: x
    if src_ty == F32 and dst_ty == F64:
        return lambda x: b.fpext(x, F64)
    if src_ty == F64 and dst_ty == F32:
        return lambda x: b.fptrunc(x, F32)
    raise TypeError(f"no conversion {src_ty} → {dst_ty}")


# ── the GEMM: inline IR tiles or a BLAS call ─────────────────────────────────

# Called after the product is in C, for the columns [col0, col0 + width) of every row.
Epilogue = Callable[[EmitContext, ir.Value, int], None]

GEMM_MODE_ENV = "RLX_LLVM_GEMM"  # "blas": every GEMM calls ?gemm (for comparisons); default "auto"
# 2048³: the tiles win clearly below (BERT-base FFN 1024×3072×768: 33 vs 42 ms), tie at 2048³
# (147 vs 149 ms) and 4096³; beyond, cache blocking matters (docs/lowering-blas.md).
IR_GEMM_MAX_MNK = 1 << 33


def ir_tiles_win(m: "int | ir.Value", prec: str, n: int, k: int) -> bool:
    """Whether this GEMM runs as inline IR tiles (measured faster than SciPy's OpenBLAS, see docs)."""
    if os.environ.get(GEMM_MODE_ENV, "auto").lower() == "blas":
        return False
    return isinstance(m, int) and prec in TILE_TYPES and m * n * k <= IR_GEMM_MAX_MNK


def gemm(ctx: EmitContext, fa: FortranArgs, prec: str, m: "int | ir.Value", n: int, k: int,
         a: "Operand", b: "Operand", c: "Operand", *, ta: bool = False, tb: bool = False,
         alpha: float = 1.0, beta: float = 0.0, epilogue: Epilogue | None = None) -> None:
    """Row-major `C[m,n] = α·op(A)·op(B) + β·C` (`prec` 's', 'd' or 'c'), then `epilogue`.

    `op(A)` is `A[m,k]`, or `A` stored `[k,m]` when `ta`; `op(B)` is `B[k,n]`, or stored `[n,k]`
    when `tb`.  `m` may be a run-time i64 (rows of one expert) when `ta` is false.  Real GEMMs of
    constant size run as inline IR tiles (`tile_gemm`); the rest call `?gemm` (`blas_gemm`).
    """
    if n == 0 or (isinstance(m, int) and m == 0) or k == 0:
        ctx.note_path("llvm")  # nothing to multiply: no BLAS call is emitted
    if n == 0 or (isinstance(m, int) and m == 0):
        return
    if k == 0:
        if beta == 0.0:
            if not isinstance(m, int):
                raise NotImplementedError("k = 0 with run-time rows is handled by the caller")
            zero_bytes(ctx, pointer(ctx, c), m * n * ITEMSIZE[prec])
        if epilogue is not None:
            epilogue(ctx, I64(0), n)
        return
    if ir_tiles_win(m, prec, n, k):
        if tb:  # the tiles stream rows of B: transpose the stored [n, k] into scratch once
            b = transpose_to_scratch(ctx, pointer(ctx, b), n, k, TILE_TYPES[prec])
        tile_gemm(ctx, prec, m, n, k, a, b, c, ta=ta, alpha=alpha, beta=beta, epilogue=epilogue)
        ctx.note_path("llvm")
        return
    blas_gemm(ctx, fa, prec, m, n, k, a, b, c, ta=ta, tb=tb, alpha=alpha, beta=beta)
    ctx.note_path("blas")
    if epilogue is not None:
        epilogue(ctx, I64(0), n)


def blas_gemm(ctx: EmitContext, fa: FortranArgs, prec: str, m: "int | ir.Value", n: int, k: int,
              a: "Operand", b: "Operand", c: "Operand", *, ta: bool, tb: bool, alpha: float, beta: float) -> None:
    """`?gemm` with the row-major operand swap: `Cᵀ = op(B)ᵀ·op(A)ᵀ` in column-major terms."""
    if isinstance(m, int):
        m_arg = fa.int(m)
        lda = max(1, m if ta else k)
    else:
        assert not ta, "run-time rows need a row-major A"
        m_arg = fa.mutable_int()
        ctx.b.store(ctx.b.trunc(m, I32), m_arg)
        lda = max(1, k)
    ldb = max(1, k if tb else n)
    scalar = {"s": fa.f32, "d": fa.f64, "c": fa.c64}[prec]
    fa.call(f"{prec}gemm", fa.char("T" if tb else "N"), fa.char("T" if ta else "N"),
            fa.int(n), m_arg, fa.int(k), scalar(alpha), pointer(ctx, b), fa.int(ldb),
            pointer(ctx, a), fa.int(lda), scalar(beta), pointer(ctx, c), fa.int(max(1, n)))


# ── inline IR tiles ──────────────────────────────────────────────────────────

TILE_TYPES = {"s": F32, "d": F64}
# A register tile is TILE_ROWS rows of C by as many vectors as the register file holds beside one B
# vector per column and one broadcast of A (BLIS's rule): 6·nv + nv + 1 ≤ registers, so 6 × 2 with
# AVX2's 16 registers, 6 × 4 with AVX-512's 32.  6·nv ≥ 12 independent FMA chains cover the FMA
# latency × ports of current cores.
TILE_ROWS = 6


def register_tile(lanes: int) -> tuple[int, int]:
    """(rows, vectors) of the C register tile on a host whose f32 vectors have `lanes` lanes."""
    return TILE_ROWS, (vector_registers(lanes) - 1) // (TILE_ROWS + 1)


# Vector accumulators per tile (rows × vectors): 24 of AVX-512's 32 registers, 12 of AVX2's 16.
ACCUMULATORS = {lanes: rows * nv for lanes in (16, 8, 4) for rows, nv in [register_tile(lanes)]}
PANEL_VECTORS = register_tile(16)[1]  # the widest panel (AVX-512); `register_tile` gives the host's
K_BLOCK = 512           # rows of B per k-block at most (BLIS's kc: a tile's C traffic per k stays small)
K_BLOCK_MIN = 128       # ... and at least (a wide AVX-512 panel would otherwise get a short k-block)
L1_BYTES = jit.l1d_bytes()  # the host's per-core L1d: sizes the k-blocks (B micro-panel + A micro-panels)
L2_BYTES = jit.l2_bytes()  # the host's per-core L2: sizes the row blocks
PACK_A_MIN_PANELS = 8   # pack A once more than this many column panels (per thread) read it
ROW_SPLIT_BLOCKS = 16   # row blocks to aim for when threads split the rows (a few per thread: balance)...
ROW_SPLIT_MIN_TILES = 8  # ... of at least this many row tiles (each block packs its own B micro-panels)
# A packed B k-panel (kc × a group of column panels, BLIS's kc × nc) is reused by every row block:
# a quarter of the shared L3 holds it (4 MiB where the L3 size cannot be read)
B_PANEL_BYTES = max(L2_BYTES, jit.cache_bytes(3, 16 << 20) // 4)
PARALLEL_MIN_FMAS = 1 << 21  # ≈ 10 µs of tile work per thread before a fork/join pays off
COL_SPLIT_PANELS = 4  # column panels per thread (of the host's cores) for a balanced column split
# all of A as one row block (B packed once per panel, hot in L1; the epilogue fused per panel; threads
# split columns) is worth a fuller L2 than the half a block of a larger A gets
ONE_BLOCK_L2_SHARE = 0.7
# B is read in place, not packed, when at most this many rows re-read each block of it and its rows
# are shorter than this many bytes: packing a panel stalls on B's cache misses right before its tiles,
# while tiles reading in place overlap them with their FMAs (docs/lowering-blas.md, "Packing B")
# (both measured on one Zen 5 only; the row bound counts the host's pages: 12 KiB with 4 KiB pages)
B_IN_PLACE_MAX_ROWS = 256
B_IN_PLACE_MAX_ROW_BYTES = 3 * os.sysconf("SC_PAGE_SIZE")


def b_in_place(m: int, b_row_bytes: int) -> bool:
    """Whether the tiles read B where it is (few row tiles re-read it, its rows short) instead of packed."""
    return m <= B_IN_PLACE_MAX_ROWS and b_row_bytes < B_IN_PLACE_MAX_ROW_BYTES


def transpose_to_scratch(ctx: EmitContext, src: ir.Value, rows: int, cols: int, ty: ir.Type) -> ir.Value:
    """Copy a row-major `[rows, cols]` matrix to scratch as `[cols, rows]`; returns the scratch pointer."""
    dst = scratch_ptr(ctx, ctx.scratch_alloc(rows * cols * (4 if ty == F32 else 8)))
    copy_matrix(ctx, src, dst, rows, cols, ty, ty, transpose=True)
    return dst


def tile_gemm(ctx: EmitContext, prec: str, m: int, n: int, k: int, a: "Operand", b: "Operand", c: "Operand",
              *, ta: bool, alpha: float, beta: float, epilogue: Epilogue | None = None) -> None:
    """`C = α·op(A)·B + β·C` by register tiles: `MR` rows × `NV` vectors of C stay in registers
    while the loop over k streams rows of B and broadcasts elements of A.

    Blocked BLIS-style for the host's caches (loops k-block / row block / column panel / row tile):
    k in blocks whose `kc × NR` micro-panel of B stays in L1 (`k_blocks`; later blocks accumulate
    onto C), rows in blocks whose `mc × kc` slice of A stays in L2 (`row_block`, balanced so no
    sliver block is left), and within those, column panels of `NR = NV·W` columns (the last one
    narrower, its last vector masked).  The row block of A is packed once into `MR`-row micro-panels
    (`pack_a`: each tile's broadcasts read one contiguous stream) when enough panels reuse it; each
    panel's block of B is packed contiguous by the first row tile of the first row block (which reads
    B in place and writes the packed micro-panel as it goes) and every row tile of
    every row block runs over it.  Row blocks (when there are more row tiles than panels and no
    epilogue) or column panels (each thread packing its own A) are split across rlx_llvm's threads
    (`ctx.parallel_for`) when each thread gets enough work and every operand is an `ArenaRef` or
    `ScratchRef` (a raw pointer cannot be re-derived inside the outlined body).  The epilogue runs
    per panel right after its last k-block's tiles when there is one row block, else over the
    thread's panels at the end.
    """
    ty, size = TILE_TYPES[prec], ITEMSIZE[prec]
    w = ctx.lanes * 4 // size
    rows, vectors = register_tile(ctx.lanes)
    panel = min(vectors, -(-n // w)) * w
    panels = -(-n // panel)
    in_place_b = m > rows and b_in_place(m, n * size)
    # B read in place streams from L2 into every row tile anyway: its k-blocks need not fit L1, and
    # longer ones save passes over C (measured 3–8 % on 64–256-row GEMMs at k = 768–3072)
    kblocks = k_blocks(k, 0 if in_place_b else panel * size, rows * size)
    kc_max = kblocks[0][1]
    mc = row_block(m, kc_max * size, rows)
    movable = all(isinstance(x, MovableRef) for x in (a, b, c))
    # threads split the longer side: row blocks when there are more row tiles than column panels (each
    # row block's A is packed once, only B's cheap row copies repeat per block), else column panels —
    # and columns too when all of A is one row block and each thread gets COL_SPLIT_PANELS panels: then
    # each thread packs only its own panels of B, hot in L1, while A's block stays in its L2
    one_block = mc == m and panels >= COL_SPLIT_PANELS * MAX_THREADS
    by_rows = movable and epilogue is None and m // rows >= panels and not one_block
    if by_rows:
        mc = min(mc, max(ROW_SPLIT_MIN_TILES * rows, -(-m // ROW_SPLIT_BLOCKS // rows) * rows))
    items, per_item = (-(-m // mc), mc * n * k) if by_rows else (panels, m * k * panel)
    min_items = max(1, -(-PARALLEL_MIN_FMAS // per_item))
    threaded = movable and items >= 2 * min_items
    packs = m > rows and not in_place_b  # several row tiles re-read each block of B: copy it once
    fused = epilogue is not None and mc == m
    packs_a = packs and panels > PACK_A_MIN_PANELS * (2 if threaded and not by_rows else 1)
    # column panels per packed B k-panel, reused by every row block of the sweep; with one row block,
    # each panel is packed right before its tiles into one buffer (hot in L1)
    reuse_b = packs and mc < m
    group = max(1, min(panels, B_PANEL_BYTES // (kc_max * panel * size))) if reuse_b else panels

    def each_panel(sub: EmitContext, start: ir.Value, stop: ir.Value, body: Callable[[ir.Value, int], None]) -> None:
        _each(sub, start, stop, n, panel, body, "panel")

    def sweep(sub: EmitContext, p_start: ir.Value, p_stop: ir.Value, r_start: ir.Value, r_stop: ir.Value) -> None:
        """Column panels [p_start, p_stop) × row blocks [r_start, r_stop), loops jc / k-block / row block / panel."""
        ops = [pointer(sub, x) for x in (a, b, c)]
        # this thread's packed B k-panel (micro-panels of `group` column panels) and A block
        b_pack = scratch_ptr(sub, sub.scratch_alloc(kc_max * panel * size * (group if reuse_b else 1))) if packs else None
        a_pack = scratch_ptr(sub, sub.scratch_alloc(kc_max * mc * size)) if packs_a else None
        with sub.for_range(p_start, p_stop, group, name="jc") as jc:
            after = sub.b.add(jc, I64(group))
            jc_stop = sub.b.select(sub.b.icmp_signed("<", after, p_stop), after, p_stop)
            for first, kc, kcount in kblocks:
                block_beta = beta if first == 0 else 1.0  # later blocks add onto the partial C
                last = first + kc * kcount == k
                with _maybe_loop(sub, kcount, "kblock") as kb:
                    k0 = sub.b.add(I64(first), sub.b.mul(kb, I64(kc)))

                    def row_block(t: ir.Value, mrows: int) -> None:
                        row0 = sub.b.mul(t, I64(mc))
                        if a_pack is not None:
                            pack_a(sub, ty, ops[0], a_pack, (m, k), (row0, mrows), (k0, kc), ta, rows)

                        def tiles(j: ir.Value, width: int) -> None:
                            b_micro, fill = None, None
                            if reuse_b:  # packed by the sweep's first row block
                                b_micro = _micro_panel(sub, b_pack, j, jc, kc * panel * size)
                                fill = sub.b.icmp_unsigned("==", t, r_start)
                            elif b_pack is not None:  # one buffer, packed by the panel's first tile
                                b_micro, fill = b_pack, True
                            _block(sub, ty, w, (m, n, k), panel, width, ops, j, (row0, mrows), (k0, kc), ta,
                                   alpha, block_beta, b_micro, a_pack, fill)
                            if fused and last:
                                epilogue(sub, sub.b.mul(j, I64(panel)), width)

                        each_panel(sub, jc, jc_stop, tiles)

                    _each(sub, r_start, r_stop, m, mc, row_block, "mblock")
        if epilogue is not None and not fused:
            each_panel(sub, p_start, p_stop, lambda j, width: epilogue(sub, sub.b.mul(j, I64(panel)), width))

    all_panels, all_rows = (I64(0), I64(panels)), (I64(0), I64(-(-m // mc)))
    if threaded and by_rows:
        ctx.parallel_for(items, lambda sub, start, stop: sweep(sub, *all_panels, start, stop), grain=1,
                         min_work=min_items)
    elif threaded:
        ctx.parallel_for(items, lambda sub, start, stop: sweep(sub, start, stop, *all_rows), grain=1,
                         min_work=min_items)
    else:
        sweep(ctx, *all_panels, *all_rows)


def _each(ctx: EmitContext, start: ir.Value, stop: ir.Value, total: int, step: int,
          body: Callable[[ir.Value, int], None], name: str) -> None:
    """`body(t, size)` for the blocks `t` in [start, stop) of `total` split into blocks of `step`
    (the last one `total mod step` when that is not zero); a single block needs no loop."""
    whole, rest = divmod(total, step)
    if isinstance(start, ir.Constant) and isinstance(stop, ir.Constant) and stop.constant - start.constant == 1:
        body(start, step if start.constant < whole else rest)
        return
    with ctx.for_range(start, stop, name=name) as t:
        if rest and whole:
            with ctx.b.if_else(ctx.b.icmp_signed("<", t, I64(whole))) as (then, otherwise):
                with then:
                    body(t, step)
                with otherwise:
                    body(t, rest)
        else:
            body(t, step if whole else rest)


def _micro_panel(ctx: EmitContext, b_pack: ir.Value, j: ir.Value, jc: ir.Value, nbytes: int) -> ir.Value:
    """Pointer to column panel `j`'s packed micro-panel in the k-panel of panels from `jc`."""
    return ctx.addr(0, ctx.b.sub(j, jc), nbytes, base=b_pack)


def pack_a(ctx: EmitContext, ty: ir.Type, a: ir.Value, dst: ir.Value, dims: tuple[int, int],
           row_span: tuple[ir.Value, int], k_span: tuple[ir.Value, int], ta: bool, tile_rows: int) -> None:
    """Copy `op(A)[rows, k-block]` to `dst` as register-tile micro-panels: the tile of block rows
    `f … f + r` is `[kc][r]` at element `f·kc` (every tile has `tile_rows` rows but the last), so a
    tile's broadcasts walk one contiguous stream instead of `r` rows of A."""
    b = ctx.b
    m, k = dims
    (row0, mrows), (k0, kc) = row_span, k_span
    size = 4 if ty == F32 else 8
    a_row, a_col = (1, m) if ta else (k, 1)
    for i0, r, count in _runs(mrows, tile_rows):
        fn = _micro_panel_packer(ctx, ty, r)
        with _maybe_loop(ctx, count, "apanel") as t:
            first = b.add(I64(i0), b.mul(t, I64(r)))
            src = ctx.addr(0, b.add(b.mul(b.add(row0, first), I64(a_row)), b.mul(k0, I64(a_col))), size, base=a)
            b.call(fn, [src, ctx.addr(0, b.mul(first, I64(kc)), size, base=dst), I64(a_row), I64(a_col), I64(kc)])


def _micro_panel_packer(ctx: EmitContext, ty: ir.Type, rows: int) -> ir.Function:
    """`void (ptr src, ptr dst, i64 row_stride, i64 k_stride, i64 kc)`: `dst[p·rows + i] =
    src[i·row_stride + p·k_stride]` — one module-wide function per (type, rows)."""
    name = f"rlx.pack_a.{'f32' if ty == F32 else 'f64'}.r{rows}"
    existing = ctx.module.globals.get(name)
    if existing is not None:
        return existing
    fnty = ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64, I64])
    return define_once(ctx.module, (name, ctx.lanes), fnty, name, ctx.declare,
                       lambda fn, declare: _define_packer(ctx, fn, declare, ty, rows))


def _define_packer(ctx: EmitContext, fn: ir.Function, declare, ty: ir.Type, rows: int) -> None:
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    for arg in fn.args[:2]:
        arg.add_attribute("noalias")
    src, dst, row_stride, k_stride, kc = fn.args
    body = EmitContext(ctx.module, fn, ctx.index, ctx.thunk, ctx.schedule, ctx.lanes, declare,
                       arena=src, scratch=src)
    b = body.b
    with body.for_range(0, kc, name="p") as p:
        at = b.mul(p, k_stride)
        for i in range(rows):
            x = body.load(0, ty, b.add(at, b.mul(I64(i), row_stride)), base=src)
            body.store(0, x, b.add(b.mul(p, I64(rows)), I64(i)), base=dst)
    b.ret_void()


def _block(ctx: EmitContext, ty: ir.Type, w: int, dims: tuple[int, int, int], panel: int, width: int,
           ops: list[ir.Value], j: ir.Value, row_span: tuple[ir.Value, int], k_span: tuple[int, int], ta: bool,
           alpha: float, beta: float, pack: ir.Value | None, a_pack: ir.Value | None,
           fill: "ir.Value | bool | None" = None) -> None:
    """Rows `row_span` (first row, count) × column panel `j` (`width` columns from `j·panel`) ×
    `k_span` (first k, length): every row tile of it.  B is read from `pack` (the panel's packed
    `[kc][NV·W]` micro-panel) when given, else in place; when `fill` (True, or an i1) holds, the first row
    tile reads B in place and writes that micro-panel as it goes (B's cache misses overlap its FMAs
    instead of stalling a copy before the tiles).  A from its packed micro-panels (`pack_a`) when
    `a_pack` is given, else in place."""
    b = ctx.b
    m, n, k = dims
    (row0, mrows), (k0, kc) = row_span, k_span
    nv = -(-width // w)
    tile_rows, tile_vectors = register_tile(ctx.lanes)
    mr = tile_rows if a_pack is not None else max(1, min(mrows, tile_rows * tile_vectors // nv))
    size = 4 if ty == F32 else 8
    a, bm, c = ops
    col = b.mul(j, I64(panel))
    a_row, a_col = (1, m) if ta else (k, 1)  # element strides of op(A) along rows and along k
    in_place = ctx.addr(0, b.add(col, b.mul(k0, I64(n))), size, base=bm)
    b_at, ldb = (in_place, n) if pack is None else (pack, nv * w)
    for run, (i0, rows, count) in enumerate(_runs(mrows, mr)):
        shape = TileShape(ty, w, rows, nv, beta != 0.0, ragged=width % w != 0, packed=a_pack is not None,
                          b_packed=pack is not None)

        def call(tile: "TileShape", first: ir.Value, b_args: list[ir.Value], extra: list[ir.Value]) -> None:
            r0 = b.add(row0, first)
            if a_pack is not None:
                a_at, strides = ctx.addr(0, b.mul(first, I64(kc)), size, base=a_pack), (1, rows)
            else:
                a_at = ctx.addr(0, b.add(b.mul(r0, I64(a_row)), b.mul(k0, I64(a_col))), size, base=a)
                strides = (a_row, a_col)
            b.call(tile.function(ctx), [a_at, b_args[0], ctx.addr(0, b.add(b.mul(r0, I64(n)), col), size, base=c),
                                        I64(strides[0]), I64(strides[1]), I64(b_args[1]), I64(n), I64(kc),
                                        I64(width - (nv - 1) * w), ir.Constant(ty, alpha), ir.Constant(ty, beta)]
                   + extra)

        skip = 0
        if run == 0 and fill is not None:  # the block's first tile: fills the pack, or reads it
            filler = dataclasses.replace(shape, b_packed=False, fills_b=True)
            if fill is True:
                call(filler, I64(i0), [in_place, n], [pack])
            else:
                with b.if_else(fill) as (then, otherwise):
                    with then:
                        call(filler, I64(i0), [in_place, n], [pack])
                    with otherwise:
                        call(shape, I64(i0), [b_at, ldb], [])
            skip = 1
        if count > skip:
            with _maybe_loop(ctx, count - skip, "rtile") as tr:
                call(shape, b.add(I64(i0), b.mul(b.add(tr, I64(skip)), I64(rows))), [b_at, ldb], [])


def k_blocks(k: int, row_bytes: int, a_bytes: int) -> list[tuple[int, int, int]]:
    """(first k, length, count) runs of near-equal k-blocks: each block's B micro-panel (`row_bytes`
    per k; 0: B is not kept in L1) and two A micro-panels (`a_bytes` per k: the tile's and the next)
    fit L1, at most `K_BLOCK` long.  The first block (β) and the last (the fused epilogue follows it)
    are runs of their own; the blocks between are one run-time loop, so the code does not grow with k."""
    limit = max(K_BLOCK_MIN, min(K_BLOCK, L1_BYTES // (row_bytes + 2 * a_bytes) if row_bytes else K_BLOCK))
    size = -(-k // -(-k // limit))
    blocks = -(-k // size)
    last = k - (blocks - 1) * size
    runs = [(0, size, 1)] + ([(size, size, blocks - 2)] if blocks > 2 else [])
    return runs + ([(k - last, last, 1)] if blocks > 1 else [])


def row_block(m: int, a_row_bytes: int, tile_rows: int) -> int:
    """Rows of A per block: whole register tiles keeping the block (`a_row_bytes` per row) within
    half of L2, where it stays while every panel of B passes over it; all of `m` if it fits within
    `ONE_BLOCK_L2_SHARE` of L2, else near-equal blocks (no sliver block at the end)."""
    if m * a_row_bytes <= L2_BYTES * ONE_BLOCK_L2_SHARE:
        return m
    limit = max(tile_rows, L2_BYTES // 2 // a_row_bytes // tile_rows * tile_rows)
    per_block = -(-m // -(-m // limit))  # near-equal rows per block, for as few blocks as fit
    return min(m, -(-per_block // tile_rows) * tile_rows)


def _runs(total: int, step: int) -> list[tuple[int, int, int]]:
    """(first index, tile size, tile count): full tiles of `step`, then the remainder."""
    runs = [(0, step, total // step)] if total // step else []
    if total % step:
        runs.append((total - total % step, total % step, 1))
    return runs


@contextlib.contextmanager
def _maybe_loop(ctx: EmitContext, count: int, name: str) -> Iterator[ir.Value]:
    """A run-time loop over `count` tiles, or just index 0 for a single tile."""
    if count == 1:
        yield I64(0)
        return
    with ctx.for_range(0, count, name=name) as t:
        yield t


@dataclass(frozen=True)
class TileShape:
    """A register tile: `rows × vectors` vectors of C held in registers across the k loop.

    Each shape is one internal function per module, shared by every GEMM that needs it:
    `void (ptr a, ptr b, ptr c, i64 a_row, i64 a_col, i64 ldb, i64 ldc, i64 k, i64 tail, T α, T β)`
    with `a`, `b`, `c` at the tile's corner, element strides for op(A), B and C, and `tail` lanes
    of the last vector inside C (a run-time mask, so ragged edges share the function; `ragged =
    False` tiles ignore it and load and store whole vectors).
    `accumulate` tiles compute `α·AB + β·C`; the others `α·AB` and never read C (it may hold NaN).
    `packed` tiles read A as `[k][rows]`, `b_packed` tiles B as `[k][vectors·W]` (packed micro-panels:
    constant strides, the `a_row`, `a_col` / `ldb` arguments are ignored).  `fills_b` tiles read B in
    place and store each row they load to a trailing `b_out` argument as `[k][vectors·W]`: the first
    row tile of a panel packs B for the others while its FMAs hide B's cache misses.
    """

    ty: ir.Type
    w: int
    rows: int
    vectors: int
    accumulate: bool
    ragged: bool = True  # the last vector may be partly outside C (masked loads and stores)
    packed: bool = False  # A is a packed micro-panel (constant strides)
    b_packed: bool = False  # B is a packed micro-panel (constant stride)
    fills_b: bool = False  # B is read in place and written to the extra `b_out` argument, packed

    @property
    def name(self) -> str:
        """The function's symbol, e.g. `rlx.tile.f32.r6.v4`."""
        packing = {(True, True): ".packed", (True, False): ".packed.a", (False, True): ".packed.b", (False, False): ""}
        return (f"rlx.tile.{'f32' if self.ty == F32 else 'f64'}.r{self.rows}.v{self.vectors}"
                + (".acc" if self.accumulate else "") + ("" if self.ragged else ".whole")
                + packing[self.packed, self.b_packed] + (".fillb" if self.fills_b else ""))

    def function(self, ctx: EmitContext) -> ir.Function:
        """The tile function in `ctx`'s module, defined on first use."""
        existing = ctx.module.globals.get(self.name)
        if existing is not None:
            return existing
        fnty = ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, I64, I64, I64, I64, I64, I64, self.ty, self.ty]
                               + ([PTR] if self.fills_b else []))
        return define_once(ctx.module, (self, ctx.lanes), fnty, self.name, ctx.declare,
                           lambda fn, declare: self._define(ctx, fn, declare))

    def _define(self, ctx: EmitContext, fn: ir.Function, declare) -> None:
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        fn.attributes.add("noinline")
        for arg in fn.args[:3] + fn.args[11:]:
            arg.add_attribute("noalias")
        body = EmitContext(ctx.module, fn, ctx.index, ctx.thunk, ctx.schedule, ctx.lanes, declare,
                           arena=fn.args[0], scratch=fn.args[0])
        self._body(body, *fn.args)
        body.b.ret_void()

    def _body(self, ctx: EmitContext, a, b, c, a_row, a_col, ldb, ldc, k, tail, alpha, beta, b_out=None) -> None:
        bld, w, nv = ctx.b, self.w, self.vectors
        if self.packed:
            a_row, a_col = I64(1), I64(self.rows)
        if self.b_packed:
            ldb = I64(nv * w)
        vty = ir.VectorType(self.ty, w)
        last = bld.icmp_signed("<", lane_ids(w), splat(bld, tail, w))  # lanes of the last vector inside C
        masks = [None] * (nv - 1) + [last if self.ragged else None]
        fma = ctx.intrinsic(f"llvm.fma.{suffix(vty)}", vty, [vty, vty, vty])
        acc = [[entry_alloca(ctx, vty) for _ in range(nv)] for _ in range(self.rows)]
        size = 4 if self.ty == F32 else 8
        _prefetch_tile(ctx, c, bld.mul(ldc, I64(size)), self.rows, nv * w * size)
        for slot in (s for row in acc for s in row):
            bld.store(ir.Constant(vty, None), slot)
        with ctx.for_range(0, k, name="p") as p:
            b_row = bld.mul(p, ldb)
            bvec = [load_lanes(ctx, 0, self.ty, bld.add(b_row, I64(v * w)), w, masks[v], base=b) for v in range(nv)]
            if b_out is not None:  # the packed micro-panel row (masked lanes stored as the zeros loaded)
                for v in range(nv):
                    ctx.store(0, bvec[v], bld.add(bld.mul(p, I64(nv * w)), I64(v * w)), base=b_out)
            a_at = bld.mul(p, a_col)
            for r in range(self.rows):
                x = splat(bld, ctx.load(0, self.ty, bld.add(a_at, bld.mul(I64(r), a_row)), base=a), w)
                for v in range(nv):
                    bld.store(bld.call(fma, [x, bvec[v], bld.load(acc[r][v])]), acc[r][v])
        va, vb = splat(bld, alpha, w), splat(bld, beta, w)
        for r in range(self.rows):
            for v in range(nv):
                at = bld.add(bld.mul(I64(r), ldc), I64(v * w))
                x = bld.fmul(bld.load(acc[r][v]), va)
                if self.accumulate:
                    x = bld.fadd(x, bld.fmul(load_lanes(ctx, 0, self.ty, at, w, masks[v], base=c), vb))
                store_lanes(ctx, 0, x, at, masks[v], base=c)


def _prefetch_tile(ctx: EmitContext, c: ir.Value, ldc_bytes: ir.Value, rows: int, row_bytes: int) -> None:
    """Prefetch (for writing) every cache line of a `rows × row_bytes` tile of C whose rows are
    `ldc_bytes` apart: the lines arrive while the k loop runs, before the tile is loaded or stored."""
    b = ctx.b
    fn = ctx.intrinsic("llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
    for r in range(rows):
        for byte in sorted({0, row_bytes - 1} | set(range(64, row_bytes, 64))):
            at = b.add(b.mul(I64(r), ldc_bytes), I64(byte))
            b.call(fn, [b.gep(c, [at], source_etype=I8), I32(1), I32(3), I32(1)])  # may pass a ragged edge


# ── packed half operands ─────────────────────────────────────────────────────

_HALF_DTYPE = {HalfKind.Bf16: DType.BF16, HalfKind.F16: DType.F16}


def widen_to_scratch(ctx: EmitContext, src: int, kind: HalfKind, count: int) -> int:
    """Widen `count` packed halves at arena offset `src` to f32 scratch; returns the scratch offset."""
    dst = ctx.scratch_alloc(count * 4)
    dtype = _HALF_DTYPE[kind]

    def body(i: ir.Value, w: int) -> None:
        raw = ctx.load(src, STORAGE[dtype], i, w)
        ctx.store(dst, widen_to_f32(ctx.b, dtype, raw), i, base=ctx.scratch)

    ctx.vector_loop(count, body, name="widen")
    return dst


def narrow_from_scratch(ctx: EmitContext, src: int, dst: int, kind: HalfKind, count: int) -> None:
    """Round `count` f32 of scratch at `src` to packed halves (RNE) at arena offset `dst`."""
    dtype = _HALF_DTYPE[kind]

    def body(i: ir.Value, w: int) -> None:
        x = ctx.load(src, F32, i, w, base=ctx.scratch)
        ctx.store(dst, narrow_from_f32(ctx.b, dtype, x), i)

    ctx.vector_loop(count, body, name="narrow")


def f32_operand(ctx: EmitContext, offset: int, kind: HalfKind, count: int) -> Operand:
    """Pointer to an f32 view of an operand: the arena itself, or a widened scratch copy."""
    if not kind.packed:
        return ArenaRef(offset)
    return scratch_ptr(ctx, widen_to_scratch(ctx, offset, kind, count))


# ── plain GEMMs ──────────────────────────────────────────────────────────────

@lowering(T.Sgemm, path="llvm|blas", check=check_blas_ints("m", "k", "n"))
def sgemm(ctx: EmitContext, t) -> None:
    """`C = A·B` in f32."""
    gemm(ctx, FortranArgs(ctx), "s", t.m, t.n, t.k, ArenaRef(t.a), ArenaRef(t.b), ArenaRef(t.c))


@lowering(T.SgemmT, path="llvm|blas", check=check_blas_ints("m", "k", "n"))
def sgemm_t(ctx: EmitContext, t) -> None:
    """`C = op(A)·op(B)`: transposes are BLAS trans flags."""
    gemm(ctx, FortranArgs(ctx), "s", t.m, t.n, t.k, ArenaRef(t.a), ArenaRef(t.b), ArenaRef(t.c),
         ta=bool(t.ta), tb=bool(t.tb))


@lowering(T.Dgemm, path="llvm|blas", check=check_blas_ints("m", "k", "n"))
def dgemm(ctx: EmitContext, t) -> None:
    """`C = A·B` in f64."""
    gemm(ctx, FortranArgs(ctx), "d", t.m, t.n, t.k, ArenaRef(t.a), ArenaRef(t.b), ArenaRef(t.c))


@lowering(T.CgemmC64, path="blas", check=check_blas_ints("m", "k", "n"))
def cgemm_c64(ctx: EmitContext, t) -> None:
    """`C = A·B` on interleaved complex64 (no conjugation)."""
    gemm(ctx, FortranArgs(ctx), "c", t.m, t.n, t.k, ArenaRef(t.a), ArenaRef(t.b), ArenaRef(t.c))


def _batched(ctx: EmitContext, t, prec: str) -> None:
    """Per batch `C[i] = A[i]·B[i]`; a broadcast operand (`*_bcast`) reuses matrix 0."""
    fa, size = FortranArgs(ctx), ITEMSIZE[prec]
    m, k, n, batch = t.m, t.k, t.n, t.batch
    if batch == 0:
        return
    if t.b_bcast and not t.a_bcast:
        # Every A[i] meets the same B: one GEMM over the stacked rows of A.
        gemm(ctx, fa, prec, batch * m, n, k, ArenaRef(t.a), ArenaRef(t.b), ArenaRef(t.c))
        return
    if batch == 1:
        gemm(ctx, fa, prec, m, n, k, ArenaRef(t.a), ArenaRef(t.b), ArenaRef(t.c))
        return

    def slices(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        fa_ = FortranArgs(sub)
        with sub.for_range(start, stop, name="batch") as i:
            a = sub.addr(t.a) if t.a_bcast else sub.addr(t.a, i, m * k * size)
            b = sub.addr(t.b) if t.b_bcast else sub.addr(t.b, i, k * n * size)
            gemm(sub, fa_, prec, m, n, k, a, b, sub.addr(t.c, i, m * n * size))

    independent_gemms(ctx, prec, batch, m, n, k, slices)


def independent_gemms(ctx: EmitContext, prec: str, count: int, m: int, n: int, k: int,
                      body: Callable[[EmitContext, ir.Value, ir.Value], None]) -> None:
    """Run `body(ctx, start, stop)` over `count` independent GEMMs of one shape; split across
    threads when they run as IR tiles and each thread gets enough work (BLAS threads itself)."""
    min_items = max(1, -(-PARALLEL_MIN_FMAS // max(1, m * n * k)))
    if ir_tiles_win(m, prec, n, k) and count >= 2 * min_items:
        ctx.parallel_for(count, body, grain=1, min_work=min_items)
    else:
        body(ctx, I64(0), I64(count))


def _check_batched(t) -> None:
    check_blas_ints("m", "k", "n")(t)
    if t.b_bcast and not t.a_bcast and t.batch * t.m > BLAS_INT_MAX:
        raise ValidationError(f"batch·m = {t.batch * t.m} exceeds the 32-bit BLAS integer bound "
                              f"{BLAS_INT_MAX}", field="batch")


@lowering(T.BatchedSgemm, path="llvm|blas", check=_check_batched)
def batched_sgemm(ctx: EmitContext, t) -> None:
    """Batched f32 GEMM with broadcast flags."""
    _batched(ctx, t, "s")


@lowering(T.BatchedDgemmF64, path="llvm|blas", check=_check_batched)
def batched_dgemm_f64(ctx: EmitContext, t) -> None:
    """Batched f64 GEMM with broadcast flags."""
    _batched(ctx, t, "d")


# ── half-precision operands ──────────────────────────────────────────────────

def _half_gemm(ctx: EmitContext, t, a_kind: HalfKind, b_kind: HalfKind, c_kind: HalfKind) -> None:
    """Widen packed operands, f32 GEMM, round a packed C back (RNE)."""
    m, k, n = t.m, t.k, t.n
    a = f32_operand(ctx, t.a, a_kind, m * k)
    b = f32_operand(ctx, t.b, b_kind, k * n)
    if not c_kind.packed:
        gemm(ctx, FortranArgs(ctx), "s", m, n, k, a, b, ArenaRef(t.c))
        return
    c_tmp = ctx.scratch_alloc(m * n * 4)
    gemm(ctx, FortranArgs(ctx), "s", m, n, k, a, b, scratch_ptr(ctx, c_tmp))
    narrow_from_scratch(ctx, c_tmp, t.c, c_kind, m * n)


@lowering(T.SgemmBf16, path="llvm|blas", check=check_blas_ints("m", "k", "n"))
def sgemm_bf16(ctx: EmitContext, t) -> None:
    """`C = A·B` with B packed bf16."""
    _half_gemm(ctx, t, HalfKind.F32, HalfKind.Bf16, HalfKind.F32)


@lowering(T.SgemmF16, path="llvm|blas", check=check_blas_ints("m", "k", "n"))
def sgemm_f16(ctx: EmitContext, t) -> None:
    """`C = A·B` with B packed f16."""
    _half_gemm(ctx, t, HalfKind.F32, HalfKind.F16, HalfKind.F32)


@lowering(T.SgemmHalf, path="llvm|blas", check=check_blas_ints("m", "k", "n"))
def sgemm_half(ctx: EmitContext, t) -> None:
    """`C = A·B` where any operand may be packed (HalfKind)."""
    _half_gemm(ctx, t, t.a_kind, t.b_kind, t.c_kind)


# ── fused and composite GEMMs ────────────────────────────────────────────────

@lowering(T.FusedMmBiasAct, path="llvm|blas", check=check_blas_ints("m", "k", "n"))
def fused_mm_bias_act(ctx: EmitContext, t) -> None:
    """`C = act(A·W + bias)`: the GEMM, then one vector pass for bias and activation (erf Gelu).

    With IR tiles the pass runs per column panel, right after the panel's tiles (cache-hot, and
    on the panel's thread); after a BLAS call it is one pass over the whole of C.
    """
    gemm(ctx, FortranArgs(ctx), "s", t.m, t.n, t.k, ArenaRef(t.a), ArenaRef(t.w), ArenaRef(t.c),
         epilogue=lambda sub, col0, width: bias_act_pass(sub, t, col0, width))


def bias_act_pass(ctx: EmitContext, t, col0: ir.Value, width: int) -> None:
    """`C[r, j] = act(C[r, j] + bias[j])` for every row and the columns [col0, col0 + width)."""
    b = ctx.b
    with ctx.for_range(0, t.m, name="row") as r:
        row = b.add(b.mul(r, I64(t.n), flags=("nuw", "nsw")), col0, flags=("nuw", "nsw"))

        def body(j: ir.Value, w: int) -> None:
            at = b.add(row, j, flags=("nuw", "nsw"))
            x = b.fadd(ctx.load(t.c, F32, at, w), ctx.load(t.bias, F32, b.add(col0, j), w))
            if t.act is not None:
                x = em.activation(b, t.act, x, region=False)
            ctx.store(t.c, x, at)

        ctx.vector_loop(width, body, name="col")


@lowering(T.LoraMatMul, path="llvm|blas", check=check_blas_ints("m", "k", "n", "r"))
def lora_mat_mul(ctx: EmitContext, t) -> None:
    """`out = X·W + scale·(X·A)·B`; the rank-r intermediate `X·A` lives in scratch."""
    fa = FortranArgs(ctx)
    m, k, n, r = t.m, t.k, t.n, t.r
    gemm(ctx, fa, "s", m, n, k, ArenaRef(t.x), ArenaRef(t.w), ArenaRef(t.dst))
    if r == 0 or m == 0 or n == 0:
        return
    xa = scratch_ptr(ctx, ctx.scratch_alloc(m * r * 4))
    gemm(ctx, fa, "s", m, r, k, ArenaRef(t.x), ArenaRef(t.a), xa)
    gemm(ctx, fa, "s", m, n, r, xa, ArenaRef(t.b), ArenaRef(t.dst), alpha=t.scale, beta=1.0)


@lowering(T.Conv2D1x1, path="llvm|blas", check=check_blas_ints("c_in", "c_out", "hw"))
def conv2d_1x1(ctx: EmitContext, t) -> None:
    """Per image `out[c_out, hw] = W[c_out, c_in]·X[c_in, hw]`."""
    if t.n == 0:
        return
    if t.n == 1:
        gemm(ctx, FortranArgs(ctx), "s", t.c_out, t.hw, t.c_in, ArenaRef(t.weight), ArenaRef(t.src), ArenaRef(t.dst))
        return

    def images(sub: EmitContext, start: ir.Value, stop: ir.Value) -> None:
        fa_ = FortranArgs(sub)
        with sub.for_range(start, stop, name="image") as i:
            gemm(sub, fa_, "s", t.c_out, t.hw, t.c_in, sub.addr(t.weight), sub.addr(t.src, i, t.c_in * t.hw * 4),
                 sub.addr(t.dst, i, t.c_out * t.hw * 4))

    independent_gemms(ctx, "s", t.n, t.c_out, t.hw, t.c_in, images)


def _check_grouped(t) -> None:
    check_blas_ints("m", "k_dim", "n")(t)
    if t.m and t.num_experts == 0:
        raise ValidationError(f"num_experts = 0 but m = {t.m} rows need an expert", field="num_experts")


def expert_of(ctx: EmitContext, offset: int, row: ir.Value) -> ir.Value:
    """Expert id of a row: the f32-encoded id `as usize` (truncating, NaN/negative → 0, saturating)."""
    x = ctx.load(offset, F32, row)
    return ctx.b.call(ctx.intrinsic("llvm.fptoui.sat.i64.f32", I64, [F32]), [x])


def expert_status(ctx: EmitContext, t: T.Thunk, i: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(whether row `i`'s expert id, converted `as usize`, is below `t.num_experts`; the status
    `INDEX_OUT_OF_RANGE | (i + 1) << 8` naming the row) — for `fail_unless`, in every grouped kind."""
    b = ctx.b
    ok = b.icmp_unsigned("<", expert_of(ctx, t.expert_idx, i), I64(t.num_experts))
    return ok, b.or_(I32(int(Status.INDEX_OUT_OF_RANGE)), b.shl(b.trunc(b.add(i, I64(1)), I32), I32(8)))


@lowering(T.GroupedMatMul, path="blas", check=_check_grouped)
def grouped_mat_mul(ctx: EmitContext, t) -> None:
    """`out[i] = input[i]·W[idx[i]]`: rows counting-sorted by expert, one GEMM per expert.

    Scratch holds the per-expert counts and cursors, each row's expert, the permutation, and the
    gathered input and output rows.  An expert id ≥ num_experts returns `Status.INDEX_OUT_OF_RANGE`
    before anything is written.
    """
    m, k, n, e_count = t.m, t.k_dim, t.n, t.num_experts
    if m == 0 or n == 0:
        return
    b = ctx.b
    counts, cursor = ctx.scratch_alloc(e_count * 8), ctx.scratch_alloc(e_count * 8)
    expert, perm = ctx.scratch_alloc(m * 8), ctx.scratch_alloc(m * 8)
    rows_in, rows_out = ctx.scratch_alloc(m * k * 4), ctx.scratch_alloc(m * n * 4)
    zero_bytes(ctx, scratch_ptr(ctx, counts), e_count * 8)
    with ctx.for_range(0, m, name="count") as i:
        fail_unless(ctx, *expert_status(ctx, t, i))
        e = expert_of(ctx, t.expert_idx, i)
        ctx.store(expert, e, i, base=ctx.scratch)
        ctx.store(counts, b.add(ctx.load(counts, I64, e, base=ctx.scratch), I64(1)), e, base=ctx.scratch)
    if k == 0:
        zero_bytes(ctx, ctx.addr(t.dst), m * n * 4)
        return
    total = entry_alloca(ctx, I64)
    b.store(I64(0), total)
    with ctx.for_range(0, e_count, name="scan") as e:
        start = b.load(total)
        ctx.store(cursor, start, e, base=ctx.scratch)
        b.store(b.add(start, ctx.load(counts, I64, e, base=ctx.scratch)), total)
    with ctx.for_range(0, m, name="gather") as i:
        e = ctx.load(expert, I64, i, base=ctx.scratch)
        pos = ctx.load(cursor, I64, e, base=ctx.scratch)
        ctx.store(cursor, b.add(pos, I64(1)), e, base=ctx.scratch)
        ctx.store(perm, i, pos, base=ctx.scratch)
        copy_bytes(ctx, scratch_ptr(ctx, rows_in, pos, k * 4), ctx.addr(t.input, i, k * 4), k * 4)
    fa = FortranArgs(ctx)
    with ctx.for_range(0, e_count, name="expert") as e:
        cnt = ctx.load(counts, I64, e, base=ctx.scratch)
        with b.if_then(b.icmp_unsigned(">", cnt, I64(0))):
            start = b.sub(ctx.load(cursor, I64, e, base=ctx.scratch), cnt)
            gemm(ctx, fa, "s", cnt, n, k, scratch_ptr(ctx, rows_in, start, k * 4),
                 ctx.addr(t.weight, e, k * n * 4), scratch_ptr(ctx, rows_out, start, n * 4), tb=bool(t.w_transposed))
    with ctx.for_range(0, m, name="scatter") as pos:
        i = ctx.load(perm, I64, pos, base=ctx.scratch)
        copy_bytes(ctx, ctx.addr(t.dst, i, n * 4), scratch_ptr(ctx, rows_out, pos, n * 4), n * 4)


def _check_synth(t) -> None:
    check_blas_ints("m", "k", "n")(t)
    if t.entry_dim == 0:
        raise ValidationError("entry_dim must be at least 1", field="entry_dim")
    if t.k % t.entry_dim:
        raise ValidationError(f"entry_dim = {t.entry_dim} does not divide k = {t.k}", field="entry_dim")
    if t.n and t.k and t.num_entries == 0:
        raise ValidationError("num_entries = 0: the codebook is empty but the weight needs entries",
                              field="num_entries")


@lowering(T.SynthMatMul, path="llvm|blas", check=_check_synth)
def synth_mat_mul(ctx: EmitContext, t) -> None:
    """`out = X·W`, `W[p, j] = codebook[indices[j, p / d], p mod d]`.

    The weight is rebuilt in scratch in its stored `[n, k]` orientation (one `memcpy` of `d`
    floats per code) and fed to sgemm with the B-transpose flag.  A code ≥ num_entries returns
    `Status.INDEX_OUT_OF_RANGE` before anything is written.
    """
    m, k, n, d = t.m, t.k, t.n, t.entry_dim
    if m == 0 or n == 0:
        return
    if k == 0:
        zero_bytes(ctx, ctx.addr(t.dst), m * n * 4)
        return
    b, groups = ctx.b, k // d
    wt = ctx.scratch_alloc(n * k * 4)
    with ctx.for_range(0, n * groups, name="code") as g:
        code = b.zext(ctx.load(t.indices, I8, g), I64)
        fail_unless(ctx, b.icmp_unsigned("<", code, I64(t.num_entries)), Status.INDEX_OUT_OF_RANGE)
        copy_bytes(ctx, scratch_ptr(ctx, wt, g, d * 4), ctx.addr(t.codebook, code, d * 4), d * 4)
    gemm(ctx, FortranArgs(ctx), "s", m, n, k, ArenaRef(t.x), scratch_ptr(ctx, wt), ArenaRef(t.dst), tb=True)
