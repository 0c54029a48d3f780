"""The f32 SentenceEncoder plans its shapes itself (models.sentence.ShapePlan) and keeps the plans on
disk (PlanStore): a shape runs on the same schedule and bits as the graph session would run it, a new
encoder finds the plans (and lays its weights out at construction), and RLX_LLVM_CACHE=0 writes none."""
from __future__ import annotations

import numpy as np

from .test_sentence import GOLDEN, model_or_skip


def feeds(encoder, texts, pad_to=None):
    ids, mask = encoder.tokenize(texts, pad_to=pad_to)
    pos_ids = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int64), ids.shape)
    return {"ids": ids, "type_ids": np.zeros_like(ids), "pos_ids": pos_ids, "mask": mask}


def test_planned_shapes_run_the_graph_sessions_bits_and_a_new_encoder_starts_from_them(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_LLVM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("RLX_LLVM_CACHE", "1")
    encoder = model_or_skip()
    small, large = feeds(encoder, GOLDEN["sentences"][:2]), feeds(encoder, GOLDEN["sentences"][:2] * 4, pad_to=96)
    first = encoder.embed_tokens(small["ids"], small["mask"])
    before = encoder.cache_info().arena_bytes                   # room for 2 rows of max_length tokens
    encoder.embed_tokens(large["ids"], large["mask"])           # 8 rows: the arena grows, weights kept
    assert encoder.cache_info().arena_bytes > before
    np.testing.assert_array_equal(encoder.embed_tokens(small["ids"], small["mask"]), first)
    for f in (small, large):
        want, = encoder.graph.run(f)                           # the graph session, its own arena
        np.testing.assert_array_equal(encoder.embed_tokens(f["ids"], f["mask"]), want)
        assert encoder.graph.schedule == encoder.compiled(*f["ids"].shape).program.schedule
    assert len(list((tmp_path / "encoder-plans").glob("*.json"))) == 3   # two shapes and the model's front

    again = model_or_skip()                                     # a new encoder (as in a new process)
    front = again._plans.front()
    assert front is not None and front.arena_bytes == encoder.compiled(*large["ids"].shape).program.schedule.arena_bytes
    assert again.cache_info().arena_bytes >= front.arena_bytes   # weights laid out at construction
    np.testing.assert_array_equal(again.embed_tokens(large["ids"], large["mask"]),
                                  encoder.embed_tokens(large["ids"], large["mask"]))
    assert again.compiled(*large["ids"].shape).program.report().from_cache


def test_no_plans_are_written_with_the_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_LLVM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("RLX_LLVM_CACHE", "0")
    encoder = model_or_skip()
    assert encoder.cache_info().arena_bytes == 0                # nothing laid out before a shape is asked for
    encoder.embed(["one text"])
    assert not (tmp_path / "encoder-plans").exists()


def test_cover_runs_a_new_shape_padded_on_a_compiled_larger_one_while_its_own_compiles():
    from rlx_llvm.models import SentenceEncoder
    model_or_skip()
    encoder = SentenceEncoder(cover=True)
    big = encoder.tokenize(GOLDEN["sentences"][:4], pad_to=64)
    encoder.embed_tokens(*big)                                  # (4, 64) compiled in the caller
    small = encoder.tokenize(GOLDEN["sentences"][:2], pad_to=32)
    covered = encoder.embed_tokens(*small)                      # (2, 32): runs on (4, 64) at once
    assert encoder.cache_info().misses == 1
    assert encoder.wait_compiled(timeout=600)
    assert (2, 32) in encoder._compiled
    exact = encoder.embed_tokens(*small)                        # its own program now
    assert encoder.cache_info().misses == 1
    np.testing.assert_allclose(covered, exact, rtol=0, atol=1e-6)
    assert (covered * exact).sum(1).min() >= 1 - 1e-6           # unit rows: the cosine
    wider = encoder.tokenize(GOLDEN["sentences"][:1], pad_to=96)
    encoder.embed_tokens(*wider)                                # nothing covers (1, 96): compiled in the caller
    assert encoder.cache_info().misses == 2 and (1, 96) in encoder._compiled


def test_tier0_runs_a_new_shape_in_numpy_while_its_own_compiles():
    from rlx_llvm.models import SentenceEncoder
    model_or_skip()
    encoder = SentenceEncoder(tier0=True)
    tokens = encoder.tokenize(GOLDEN["sentences"][:3], pad_to=48)
    first = encoder.embed_tokens(*tokens)                       # NumPy now; its program compiles after it
    assert encoder.wait_compiled(timeout=600)
    assert (3, 48) in encoder._compiled
    native = encoder.embed_tokens(*tokens)
    np.testing.assert_allclose(first, native, rtol=0, atol=1e-6)
    assert (first * native).sum(1).min() >= 1 - 1e-6
    np.testing.assert_array_equal(native, SentenceEncoder(tier0=False).embed_tokens(*tokens))
    big = encoder.tokenize(GOLDEN["sentences"][:3], pad_to=192)   # 576 tokens > TIER0_MAX_TOKENS
    encoder.embed_tokens(*big)                                  # compiled in the caller
    assert big[0].shape in encoder._compiled and not encoder._pending


def test_tier0_follows_rlx_llvm_tiered(monkeypatch):
    from rlx_llvm.models import SentenceEncoder
    model_or_skip()
    monkeypatch.setenv("RLX_LLVM_TIERED", "1")
    assert SentenceEncoder().tier0
    monkeypatch.setenv("RLX_LLVM_TIERED", "0")
    assert not SentenceEncoder().tier0
