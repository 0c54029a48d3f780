"""The IR toolkit's primitives, each JIT-compiled alone into `i32 kernel(ptr arena, ptr scratch)` and
run on a NumPy arena: loops with and without carried values, vector loops with scalar and masked
tails around the vector width, splat, fail_unless's status, memory helpers, folding index arithmetic."""
from __future__ import annotations

import ctypes
from typing import Callable

import numpy as np
import pytest
from llvmlite import ir

from rlx_llvm import jit
from rlx_llvm.ir_emit import toolkit as tk
from rlx_llvm.ir_emit.context import EmitContext
from rlx_llvm.ir_emit.toolkit import F32, I32, I64, PTR

W = 8             # vector width the tests emit (f32 lanes of the context)
SENTINEL = -7.0   # what bytes outside a kernel's output hold, and must still hold afterwards
KERNEL = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p)


def build(emit: Callable[[EmitContext], None]) -> Callable[[np.ndarray], int]:
    """JIT `emit(ctx)` as the body of `i32 kernel(ptr arena, ptr scratch)`; returns `run(arena) → status`."""
    module = ir.Module("toolkit_test")
    module.triple = jit.host().triple
    fn = ir.Function(module, ir.FunctionType(I32, [PTR, PTR]), name="kernel")

    def declare(name: str, fnty: ir.FunctionType) -> ir.Function:
        return module.globals.get(name) or ir.Function(module, fnty, name=name)

    ctx = EmitContext(module, fn, 0, None, None, W, declare)
    emit(ctx)
    ctx.finish()
    engine = jit.Engine()
    engine.load(jit.compile_ir(str(module)))
    kernel = KERNEL(engine.address("kernel"))
    scratch = np.zeros(max(64, ctx.scratch_bytes), np.uint8)

    def run(arena: np.ndarray) -> int:
        run.engine = engine  # keeps the code alive as long as `run`
        return kernel(arena.ctypes.data, scratch.ctypes.data)
    return run


def arena_of(*values: np.ndarray, size: int = 512) -> np.ndarray:
    """A byte arena holding `values` one after another from offset 0, SENTINEL (f32) elsewhere."""
    arena = np.full(size // 4, SENTINEL, np.float32).view(np.uint8)
    at = 0
    for v in values:
        raw = np.ascontiguousarray(v).view(np.uint8)
        arena[at:at + raw.size] = raw
        at += raw.size
    return arena


# ── loops ───────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("start, stop, step", [(3, 17, 2), (0, 1, 1), (5, 5, 1), (9, 2, 3)])
def test_for_range_and_carried_loop_agree_with_range(start: int, stop: int, step: int) -> None:
    """`for_range` (no carried values, the sum kept in memory) and `carried_loop` (the sum in a phi)
    both compute Σ range(start, stop, step); an empty range runs no iteration."""
    def emit(ctx: EmitContext) -> None:
        b = ctx.b
        ctx.store(0, I64(0), 0)
        with tk.for_range(ctx, start, stop, step) as i:
            ctx.store(0, b.add(ctx.load(0, I64, 0), i), 0)
        (total,) = tk.carried_loop(ctx, start, stop, step, [I64(0)], lambda i, acc: [b.add(acc[0], i)])
        ctx.store(8, total, 0)
        (count,) = tk.carried_loop(ctx, start, stop, step, [I64(0)], lambda i, acc: [b.add(acc[0], I64(1))])
        ctx.store(16, count, 0)

    arena = arena_of()
    assert build(emit)(arena) == 0
    want = sum(range(start, stop, step))
    assert list(arena[:24].view(np.int64)) == [want, want, len(range(start, stop, step))]


def test_a_carried_loop_with_run_time_bounds_carries_several_values() -> None:
    """Two values carried at once (Σi and Π(i+1)) over a range whose stop is read at run time."""
    def emit(ctx: EmitContext) -> None:
        b = ctx.b
        stop = ctx.load(0, I64, 0)
        s, p = tk.carried_loop(ctx, 1, stop, 1, [I64(0), I64(1)],
                               lambda i, acc: [b.add(acc[0], i), b.mul(acc[1], b.add(i, I64(1)))])
        ctx.store(8, s, 0)
        ctx.store(16, p, 0)

    run = build(emit)
    for n in (1, 2, 6):
        arena = arena_of(np.array([n], np.int64))
        assert run(arena) == 0
        assert list(arena[8:24].view(np.int64)) == [sum(range(1, n)), int(np.prod(np.arange(2, n + 1)))]


def test_counted_loop_refuses_a_wrong_number_of_next_values() -> None:
    def emit(ctx: EmitContext) -> None:
        with tk.counted_loop(ctx, 0, 4, carried=[I64(0), I64(1)]) as loop:
            loop.carry([loop.values[0]])

    with pytest.raises(ValueError, match="carrying 2 values got 1"):
        build(emit)


# ── vector loops: scalar tail and masked tail at n = W−1, W, W+1 ────────────

@pytest.mark.parametrize("n", [W - 1, W, W + 1, 2 * W + 3])
def test_vector_loop_covers_exactly_n_elements(n: int) -> None:
    """`dst = src + 1` over [0, n) with a compile-time n: whole vectors, then a scalar tail; nothing after n."""
    def emit(ctx: EmitContext) -> None:
        b = ctx.b
        tk.vector_loop(ctx, n, lambda i, w: ctx.store(128, b.fadd(ctx.load(0, F32, i, w), tk.const(F32, 1.0, w)), i))

    src = np.arange(32, dtype=np.float32)
    arena = arena_of(src)
    assert build(emit)(arena) == 0
    dst = arena[128:256].view(np.float32)
    np.testing.assert_array_equal(dst[:n], src[:n] + 1)
    assert (dst[n:] == SENTINEL).all()


@pytest.mark.parametrize("n", [W - 1, W, W + 1])
def test_span_loop_masks_the_tail(n: int) -> None:
    """`dst = src · 2` over the run-time range [3, 3 + n): whole vectors, then one masked vector
    (`load_lanes`/`store_lanes`) — the lanes past the end are neither read into dst nor written."""
    def emit(ctx: EmitContext) -> None:
        b = ctx.b
        stop = b.add(ctx.load(0, I64, 0), I64(3))

        def body(i: ir.Value, w: int, mask: tk.Lanes) -> None:
            x = tk.load_lanes(ctx, 64, F32, i, w, mask)
            tk.store_lanes(ctx, 256, b.fmul(x, tk.const(F32, 2.0, w)), i, mask)
        tk.span_loop(ctx, 3, stop, body, width=W)

    run = build(emit)
    src = np.arange(1, 49, dtype=np.float32)
    arena = arena_of(np.array([n], np.int64), np.zeros(14, np.float32), src, size=640)
    assert run(arena) == 0
    dst = arena[256:448].view(np.float32)
    np.testing.assert_array_equal(dst[3:3 + n], 2 * src[3:3 + n])
    assert (dst[:3] == SENTINEL).all() and (dst[3 + n:] == SENTINEL).all()


# ── values and memory ───────────────────────────────────────────────────────

def test_splat_broadcasts_a_run_time_scalar() -> None:
    def emit(ctx: EmitContext) -> None:
        x = ctx.load(0, F32, 0)
        assert tk.splat(ctx.b, x, 1) is x
        v = tk.splat(ctx.b, x, W)
        assert v.type == ir.VectorType(F32, W)
        ctx.store(64, v, 0)
        ctx.store(128, tk.lane_index(ctx.b, ctx.load(8, I64, 0), 4), 0)

    arena = arena_of(np.array([2.5, 0], np.float32), np.array([40], np.int64))
    assert build(emit)(arena) == 0
    np.testing.assert_array_equal(arena[64:64 + 4 * W].view(np.float32), np.full(W, 2.5, np.float32))
    np.testing.assert_array_equal(arena[128:160].view(np.int64), [40, 41, 42, 43])


def test_copy_and_zero_bytes() -> None:
    def emit(ctx: EmitContext) -> None:
        tk.copy_bytes(ctx, ctx.addr(64), ctx.addr(0), 20)
        tk.zero_bytes(ctx, ctx.addr(128), 12)
        tk.zero_bytes(ctx, ctx.addr(192), 0)  # nothing at all

    src = np.arange(8, dtype=np.float32)
    arena = arena_of(src)
    assert build(emit)(arena) == 0
    f = arena.view(np.float32)
    np.testing.assert_array_equal(f[16:21], src[:5])
    assert f[21] == SENTINEL and (f[32:35] == 0).all() and f[35] == SENTINEL and f[48] == SENTINEL


@pytest.mark.parametrize("value, status", [(3, 0), (9, 7)])
def test_fail_unless_returns_its_status(value: int, status: int) -> None:
    """The thunk returns `status` when the condition fails (and stops there); else it goes on."""
    def emit(ctx: EmitContext) -> None:
        tk.fail_unless(ctx, ctx.b.icmp_signed("<", ctx.load(0, I64, 0), I64(5)), 7)
        ctx.store(8, I64(1), 0)  # reached only on the ok path

    arena = arena_of(np.array([value, 0], np.int64))
    assert build(emit)(arena) == status
    assert arena[8:16].view(np.int64)[0] == (1 if status == 0 else 0)


def test_index_arithmetic_folds_python_ints() -> None:
    """Compile-time indices stay Python ints; a run-time one meets a 0 or 1 unchanged."""
    b = ir.IRBuilder(ir.Function(ir.Module(), ir.FunctionType(I64, [I64]), "f").append_basic_block())
    x = b.function.args[0]
    assert tk.iadd(b, 2, 3) == 5 and tk.imul(b, 4, 3) == 12
    assert tk.iadd(b, x, 0) is x and tk.iadd(b, 0, x) is x and tk.imul(b, x, 1) is x
    assert tk.linear(b, [2, 3], [10, 1]) == 23
    assert "nsw" in str(tk.iadd(b, x, 4)) and "nsw" not in str(tk.iadd(b, x, 4, flags=()))


@pytest.mark.parametrize("w", [1, 2, 4, 8, 16])
def test_transpose_vectors_rounds_transpose_a_tile(w):
    """The shuffle plan of `transpose_vectors`, followed in Python on labelled lanes."""
    tile = [[(r, c) for c in range(w)] for r in range(w)]
    for _ in range(w.bit_length() - 1):
        lo, hi = tk.transpose_masks(w)
        tile = [[(tile[i] + tile[i + w // 2])[m] for m in mask] for i in range(w // 2) for mask in (lo, hi)]
    assert tile == [[(r, c) for r in range(w)] for c in range(w)]


def test_transpose_vectors_compiled_transposes_f32_and_i64_tiles():
    """`transpose_vectors` in a JIT function: a 16×16 f32 tile and an 8×8 i64 tile, exact."""
    module = ir.Module("transpose_vectors")
    module.triple = jit.host().triple
    for name, ty, w in (("t_f32", F32, 16), ("t_i64", I64, 8)):
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR]), name)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        vt = ir.VectorType(ty, w)
        size = tk.sizeof(ty)   # element-aligned accesses: NumPy's buffers are not vector-aligned
        rows = [b.load(b.gep(fn.args[0], [I64(r * w)], source_etype=ty), typ=vt, align=size) for r in range(w)]
        for c, col in enumerate(tk.transpose_vectors(b, rows)):
            b.store(col, b.gep(fn.args[1], [I64(c * w)], source_etype=ty), align=size)
        b.ret_void()
    engine = jit.Engine()
    engine.load(jit.compile_ir(str(module)))
    for name, dtype, w in (("t_f32", np.float32, 16), ("t_i64", np.int64, 8)):
        src = np.arange(w * w).astype(dtype).reshape(w, w)
        dst = np.zeros_like(src)
        ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(engine.address(name))(src.ctypes.data, dst.ctypes.data)
        assert (dst == src.T).all(), name
