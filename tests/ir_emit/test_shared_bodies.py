"""Shared bodies (rlx_llvm.ir_emit.shared_bodies): thunks that differ only in buffer offsets call one
compiled body, and still compute exactly what each would compute alone."""
from __future__ import annotations

import contextlib
import dataclasses
import re

import numpy as np

import rlx_llvm as rl
from rlx_llvm import registry, testing
from rlx_llvm import thunks as T
from rlx_llvm.ir_emit.context import FIELD_STRIDE
from rlx_llvm.ir_emit.shared_bodies import body_key, buffer_fields, canonical
from rlx_llvm.ops import BinaryOp, ChainOperand as In, ChainStep as S, MaskKind
from rlx_llvm.thunks.base import USIZE_MAX
from tests.harness import Suite, bert_inputs


def _block(**offsets) -> T.FusedAttnBlock:
    base = dict(hidden=128, qkv_w=4096, out_w=8192, mask=0, out=12288, qkv_b=16384, out_b=0, cos=0, sin=0)
    return T.FusedAttnBlock(**{**base, **offsets}, mask_kind=MaskKind.None_, cos_len=0, batch=1, seq=4, hs=8,
                            nh=2, dh=4, in_dim=8, out_dim=8, has_bias=True, has_rope=False, interleaved=False)


def test_canonical_form_keeps_aliasing_alignment_and_absent_buffers():
    t = _block(qkv_w=4100, out_w=128, out_b=USIZE_MAX)
    form, bases = canonical(t)
    assert form.hidden == form.out_w == FIELD_STRIDE            # equal offsets stay equal (aliasing kept)
    assert form.qkv_w == 2 * FIELD_STRIDE + 4 and bases[1] == 4096  # the offset within a line is kept
    assert form.mask == form.cos == 0 and form.out_b == USIZE_MAX   # absent buffers keep their meaning
    assert [getattr(t, f) for f in ("batch", "hs", "dh")] == [getattr(form, f) for f in ("batch", "hs", "dh")]
    moved = _block(hidden=64 * 1000, qkv_w=64 * 2000 + 4, out_w=64 * 1000, out_b=USIZE_MAX)
    assert repr(canonical(moved)[0]) == repr(form)                # same shape elsewhere: same body
    assert repr(canonical(_block(qkv_w=4104, out_w=128, out_b=USIZE_MAX))[0]) != repr(form)
    assert "qkv_w" in buffer_fields(t) and "batch" not in buffer_fields(t)


def test_body_key_tells_apart_what_repr_tells_apart():
    """The key of a shared body: the canonical thunk itself where equality is exact (ints, enums,
    sum types of those), its repr where a float could compare equal but emit other code."""
    def region(dst: int, src: int, length: int = 64) -> T.ElementwiseRegion:
        return T.ElementwiseRegion(dst=dst, len=length, input_offs=(src, src), chain=(
            S.Binary(BinaryOp.Mul, In.Input(0), In.Input(1)), S.Binary(BinaryOp.Add, In.Step(0), In.Input(0))))
    a, b = canonical(region(4096, 8192))[0], canonical(region(64 * 500, 64 * 900))[0]
    assert body_key(a) is a and body_key(a) == body_key(b)
    assert body_key(canonical(region(4096, 8192, length=65))[0]) != body_key(a)
    assert body_key(canonical(region(4096, 4096))[0]) != body_key(a)  # aliasing is part of the form

    def sgd(lr: float) -> T.SgdMomentum:
        return T.SgdMomentum(param=0, vel=256, grad=512, p_out=0, v_out=256, lr=lr, mom=0.9, len=64)
    zero, minus_zero = canonical(sgd(0.0))[0], canonical(sgd(-0.0))[0]
    assert zero == minus_zero and body_key(zero) != body_key(minus_zero) == repr(minus_zero)
    assert body_key(canonical(sgd(1))[0]) != body_key(canonical(sgd(1.0))[0])


def _layer_at(s: Suite, shift: int, **shape) -> tuple[T.FusedBertLayer, tuple]:
    """A BERT layer whose every buffer starts `shift` bytes past a 64-byte line."""
    t = T.FusedBertLayer(out=0, **bert_inputs(s, **shape))
    values = dict(s.inputs)
    moved = {name: s.put(values[getattr(t, name)], skew=shift) for name in buffer_fields(t) if name != "out"}
    n = shape["batch"] * shape["seq"] * shape["hs"]
    out = s.slot(4 * n, skew=shift)
    return dataclasses.replace(t, **moved, out=out), (out, np.dtype(np.float32), n)


def test_identical_layers_share_one_body_and_each_matches_the_reference():
    s = Suite(7, rtol=2e-4, atol=2e-4)
    shape = dict(batch=2, seq=5, hs=32, nh=4, inter=64)
    for k, shp in enumerate([shape, shape, shape, {**shape, "seq": 3}]):
        t, out = _layer_at(s, 4 if k == 2 else 0, **shp)
        s.add(f"layer{k}", t, [out])
    outcome = s.run()
    prog = outcome.program
    bodies = [r.body for r in prog.report()]
    assert bodies[0] == bodies[1] == "t0_fused_bert_layer.body"
    assert len(set(bodies)) == 3  # the misaligned copy and the other shape get their own
    assert len(re.findall(r"^define .*\.body\"?\(", prog.llvm_ir(), re.M)) == 3
    assert "define" in prog.llvm_ir(thunk=1) and "@\"t0_fused_bert_layer.body\"(" in prog.llvm_ir(thunk=1)
    assert "t0_fused_bert_layer.body:" in prog.asm(thunk=1)
    for name in s.names:
        outcome.check(name)
    outcome.check_untouched()


def test_repeated_copies_run_as_rows_of_one_table_and_each_matches_the_reference():
    s = Suite(11)
    n = 64

    def copy(name: str, kind=T.Copy, width: int = 4, skew: int = 0, inplace: bool = False, count: int = n):
        src = s.put(s.rng.integers(0, 256, count * width, dtype=np.uint8), skew=skew)
        s.add(name, kind(src=src, dst=src if inplace else s.slot(count * width, skew=skew), len=count))

    for k in range(5):
        copy(f"copy{k}")
    copy("skewed", skew=8)                       # another line offset: another body
    copy("in_place", inplace=True)               # src == dst: aliasing is part of the shape
    copy("f64", kind=T.CopyF64, width=8)
    copy("copy_again")                           # after another kind: a new run of the first body
    copy("big", count=1 << 17)                   # split across threads by byte ranges
    outcome = s.run()
    prog = outcome.program
    rows = prog.report()
    assert len({r.body for r in rows[:5]} | {rows[8].body}) == 1 and rows[0].body.endswith(".body")
    assert len({r.body for r in rows}) == 5  # copy, skewed, in place, f64, big
    ir_text = prog.llvm_ir()
    assert not re.search(r"^define .*@\"?t[1-9]\d*_copy\"?\(", ir_text, re.M)  # no function per thunk
    assert re.search(r"segment0\.rows0.*= private unnamed_addr constant \[10 x i64\]", ir_text)  # 5 rows of 2
    assert "thunks 0..4, row r = thunk 0 + r" in ir_text
    assert f"@\"{rows[3].body}\"(" in outcome.thunk_ir("copy3") and "; thunk 3: Copy(" in outcome.thunk_ir("copy3")
    for name in s.names:
        outcome.check(name)
    outcome.check_untouched()
    outcome.check_thread_independent()


# ── every shared kind, against its own function per thunk ──────────────────

@contextlib.contextmanager
def functions_per_thunk():
    """Compile as before shared bodies: every lowering emits a function of its own per thunk."""
    saved = dict(registry.LOWERINGS)
    registry.LOWERINGS.update({cls: dataclasses.replace(low, shared_body=False) for cls, low in saved.items()})
    try:
        yield
    finally:
        registry.LOWERINGS.update(saved)


def run_both_ways(schedule: rl.ThunkSchedule, init) -> tuple[rl.Program, np.ndarray, np.ndarray]:
    """(shared-body program, its arena after a run, the arena of the function-per-thunk program)."""
    prog = rl.compile(schedule, cache=False)
    with functions_per_thunk():
        alone = rl.compile(schedule, cache=False)
    arenas = []
    for p in (prog, alone):
        arena = rl.Arena(schedule.arena_bytes)
        init(arena)
        p.run(arena)
        arenas.append(arena.bytes.copy())
    return prog, arenas[0], arenas[1]


def bodies_defined(prog: rl.Program) -> int:
    """How many shared bodies the program's IR defines."""
    return len(re.findall(r"^define .*\.body\"?\(", prog.llvm_ir(), re.M))


def _region(dst: int, inputs: tuple[int, ...], n: int = 37) -> T.ElementwiseRegion:
    return T.ElementwiseRegion(dst=dst, len=n, input_offs=inputs, chain=(
        S.Binary(BinaryOp.Mul, In.Input(0), In.Input(1)), S.Binary(BinaryOp.Add, In.Step(0), In.Input(0))))


def test_repeated_regions_share_one_body_bit_for_bit_with_a_function_each():
    block, blocks = 256, 64
    at = lambda i: (1 + i % 60) * block  # noqa: E731  (offset 0 keeps its meaning "absent": another body)
    thunks = [_region(at(i + 1), (at(i),) * 2) for i in range(150)]
    thunks += [_region(at(i) + 160, (at(i) + 4, at(i) + 8)) for i in range(8)]  # overlapping inputs
    thunks += [_region(at(i), (at(i), at(i) + 160)) for i in range(8)]          # in place
    schedule = rl.ThunkSchedule(thunks, arena_bytes=blocks * block)
    values = (np.arange(blocks * block // 4) % 13 * 0.375 - 2).astype(np.float32)
    prog, shared, alone = run_both_ways(schedule, lambda arena: arena.write(0, values))
    assert np.array_equal(shared, alone) and not np.array_equal(shared[:4 * values.size], values.view(np.uint8))
    rows = prog.report()
    assert len({r.body for r in rows[:150]}) == 1 and rows[0].body == "t0_elementwise_region.body"
    assert bodies_defined(prog) == 3  # the run, overlapping inputs (another alignment), in place
    assert not re.search(r"^define .*@\"?t[1-9]\d*_elementwise_region\"?\(", prog.llvm_ir(), re.M)
    shown = prog.llvm_ir(thunk=77)
    assert "; thunk 77: ElementwiseRegion(" in shown and '@"t0_elementwise_region.body"(' in shown


# Attention's GQA decode reassociates its sums (`reassoc`): even two functions of one thunk at different
# offsets can round differently in the last bit, so "what its own function computes" is no fixed target.
LAST_BIT_KINDS = {"Attention"}


def test_every_shared_kind_computes_what_its_own_function_computes():
    """Each example of a shared-body kind twice (the second 64·k bytes on: the same body), bit for bit
    against the function-per-thunk program, on arenas of random bytes with valid inputs."""
    chosen = [ex for ex in testing.examples() if not ex.kinds & LAST_BIT_KINDS
              and all(registry.lowering_of(t).shared_body for t in ex.schedule.thunks)]
    whole = testing.pack(chosen + chosen).shifted(64)  # (a buffer at offset 0 would keep a body of its own)
    rng_seed = 5

    def init(arena: rl.Arena) -> None:
        rng = np.random.default_rng(rng_seed)
        arena.bytes[:] = rng.integers(0, 256, arena.nbytes, dtype=np.uint8)
        whole.init(arena, rng)
    prog, shared, alone = run_both_ways(whole.schedule, init)
    kinds = {type(t).__name__ for t in whole.schedule.thunks}
    assert {"ElementwiseRegion", "Copy", "FusedBertLayer"} <= kinds
    assert np.array_equal(shared, alone)
    bodies, half = [r.body for r in prog.report()], len(whole.schedule.thunks) // 2
    assert bodies[:half] == bodies[half:] and len(set(bodies)) <= half
