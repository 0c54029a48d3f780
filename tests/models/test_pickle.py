"""Pickling a Program and a SentenceEncoder, and the encoder's bounded per-shape Program cache."""
from __future__ import annotations

import multiprocessing
import pickle

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm import testing
from rlx_llvm.models import SentenceEncoder

from .scaleout_texts import texts
from .test_sentence import model_or_skip


def test_program_pickles_as_its_schedule_and_runs_the_same():
    ex = testing.examples("LayerNorm")[0]
    program = rl.compile(ex.schedule)
    again = pickle.loads(pickle.dumps(program))
    assert again is not program and again.schedule.to_json() == ex.schedule.to_json()
    arenas = []
    for p in (program, again):
        arena = rl.Arena(ex.schedule.arena_bytes)
        ex.init(arena, np.random.default_rng(0))
        p.run(arena)
        arenas.append(arena.bytes.copy())
    assert arenas[0].any() and np.array_equal(arenas[0], arenas[1])


def test_program_without_cache_pickles_without_cache(tmp_path):
    ex = testing.examples("LayerNorm")[0]
    assert pickle.loads(pickle.dumps(rl.compile(ex.schedule, cache=False)))._cache is None
    custom = pickle.loads(pickle.dumps(rl.compile(ex.schedule, cache=tmp_path)))
    assert custom._cache.directory == tmp_path and custom.report().from_cache


def _embed_in_child(blob: bytes, items: list[str]) -> np.ndarray:
    return pickle.loads(blob).embed(items)


def test_encoder_pickles_as_its_load_arguments_and_embeds_the_same_in_a_spawned_process():
    encoder = model_or_skip()
    blob = pickle.dumps(encoder)
    assert len(blob) < 1000    # the arguments, not the weights
    items = texts(24)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        got = pool.apply(_embed_in_child, (blob, items))
    np.testing.assert_array_equal(got, encoder.embed(items))


def test_shape_cache_keeps_the_most_recently_used_and_reports_its_memory():
    model_or_skip()
    encoder = SentenceEncoder(max_shapes=2)
    assert pickle.loads(pickle.dumps(encoder)).load_args == encoder.load_args == {
        "path": None, "max_length": None, "pooling": None, "quant": "f32", "awq": None, "max_shapes": 2,
        "cover": False, "tier0": None}
    for shape in [(1, 16), (2, 16), (1, 16), (3, 16)]:
        encoder.compiled(*shape)
    info = encoder.cache_info()
    assert (info.entries, info.max_entries, info.hits, info.misses) == (2, 2, 1, 3)
    assert list(encoder._compiled) == [(1, 16), (3, 16)]   # (2, 16) was least recently used
    encoder.compiled(2, 16)                                 # …so it compiles again (a warm start)
    assert encoder.cache_info().misses == 4 and list(encoder._compiled) == [(3, 16), (2, 16)]
    assert info.code_bytes > 0 and info.arena_bytes > 80 << 20   # the weights live in the arena
    assert info.nbytes == info.code_bytes + info.scratch_bytes + info.arena_bytes


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_shape_cache_bound_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="max_shapes"):
        SentenceEncoder(max_shapes=bad)
