"""`plan_batches`: the batches `SentenceEncoder.embed` cuts texts (sorted longest first) into."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_llvm.models.sentence import CALL_TOKENS, SEQ_BUCKET, plan_batches

HIDDEN = 384


def padded_seq(longest: int) -> int:
    return min(-(-longest // SEQ_BUCKET) * SEQ_BUCKET, 512)


def cost(lengths: list[int], plan: list[tuple[int, int]]) -> float:
    """The planner's own cost model, summed over a plan."""
    total = 0.0
    for start, stop in plan:
        seq = padded_seq(lengths[start])
        total += (stop - start) * seq * (1 + seq / (6 * HIDDEN)) + CALL_TOKENS
    return total


def fixed_batches(n: int, batch_size: int) -> list[tuple[int, int]]:
    return [(i, min(n, i + batch_size)) for i in range(0, n, batch_size)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 512), max_size=300), st.sampled_from([1, 2, 5, 8, 32, 64]))
def test_plan_covers_every_text_once_in_allowed_sizes_and_never_costs_more_than_fixed_batches(lengths, batch_size):
    lengths = sorted(lengths, reverse=True)
    plan = plan_batches(lengths, batch_size, padded_seq, HIDDEN)
    starts, stops = [a for a, _ in plan], [b for _, b in plan]
    assert starts == [0] + stops[:-1] if plan else lengths == []
    assert (stops[-1] if plan else 0) == len(lengths)
    allowed = {batch_size, max(1, batch_size // 4), 1}
    for start, stop in plan:
        size = stop - start
        assert 1 <= size <= batch_size
        assert size in allowed or stop == len(lengths), (size, plan)
    assert cost(lengths, plan) <= cost(lengths, fixed_batches(len(lengths), batch_size)) + 1e-6


def test_a_few_long_texts_do_not_pad_the_short_ones():
    lengths = [256, 256] + [16] * 62
    plan = plan_batches(lengths, 32, padded_seq, HIDDEN)
    assert plan[0] == (0, 1) and plan[1] == (1, 2)       # each long text alone …
    assert all(padded_seq(lengths[a]) == 16 for a, _ in plan[2:])   # … and the short ones stay at 16 tokens
    assert sum(b - a for a, b in plan[2:]) == 62


def test_equal_lengths_keep_full_batches():
    assert plan_batches([40] * 70, 32, padded_seq, HIDDEN) == [(0, 32), (32, 64), (64, 70)]
