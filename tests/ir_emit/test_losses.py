"""SoftmaxCrossEntropy, …Dense and …Backward against the NumPy references (tests/harness.py).

Labels include every out-of-range form — NaN and negatives (→ class 0, Rust's `as usize`),
exactly c, c − 0.5 (truncates into range), 1e30 and +inf — in a sentinel-filled arena: a label
≥ c is ignored (loss 0, gradient row 0) and no byte outside the outputs changes.
"""
from __future__ import annotations

import numpy as np
import pytest

from rlx_llvm import thunks as T
from tests.harness import HUGE, W, Outcome, Suite, expect_invalid, suite_tests



def labels(s: Suite, n: int, c: int) -> np.ndarray:
    """Valid class ids with the awkward encodings planted at the front."""
    lab = s.rng.integers(0, c, n).astype(np.float32)
    odd = np.array([np.nan, -3.5, c, c - 0.5, 1e30, np.inf, -np.inf, 2**31], dtype=np.float32)
    lab[:min(n, odd.size)] = odd[:min(n, odd.size)]
    return lab


def build() -> Suite:
    s = Suite(8, rtol=2e-5, atol=2e-5)
    for n, c in ((1, 1), (9, W - 1), (4, W), (9, W + 1), (11, 1000), (2, HUGE), (3, 3), (97, 1001)):
        x = s.normal(n * c, scale=3.0).reshape(n, c)
        if c > 4:
            x[-1, 1] = -np.inf
        x = x.reshape(-1)
        lab = labels(s, n, c)
        dst, o = s.out(np.float32, n)
        s.add(f"SCE-{n}x{c}", T.SoftmaxCrossEntropy(logits=s.put(x), labels=s.put(lab), dst=dst, n=n, c=c), [o],
              rtol=1e-5, atol=1e-5)
        tgt = s.rng.random(n * c).astype(np.float32)
        dst, o = s.out(np.float32, n)
        s.add(f"SCEDense-{n}x{c}", T.SoftmaxCrossEntropyDense(logits=s.put(x), targets=s.put(tgt), dst=dst, n=n, c=c),
              [o], rtol=1e-5, atol=1e-5 * (1 + np.sqrt(c)))
        dst, o = s.out(np.float32, n * c)
        s.add(f"SCEBackward-{n}x{c}",
              T.SoftmaxCrossEntropyBackward(logits=s.put(x), labels=s.put(lab), d_loss=s.put(s.normal(n)),
                                            dlogits=dst, n=n, c=c), [o], rtol=1e-5, atol=1e-6)
    return s


SUITE = build()


(outcome, test_matches_reference, test_nothing_outside_the_outputs_changes,
 test_thread_count_does_not_change_results, test_every_kind_is_native) = suite_tests(SUITE)


def test_out_of_range_labels_are_ignored(outcome: Outcome) -> None:
    """Labels c, 1e30, +inf, 2³¹ give loss 0 and a zero gradient row; NaN/−3.5/−inf/c−0.5 do not."""
    n, c = 9, W + 1
    off, _, _ = outcome.case(f"SCE-{n}x{c}").outputs[0]
    loss = outcome.got[off:off + 4 * n].view(np.float32)
    assert (loss[[2, 4, 5, 7]] == 0).all() and (loss[[0, 1, 3, 6]] != 0).all()
    off, _, _ = outcome.case(f"SCEBackward-{n}x{c}").outputs[0]
    grad = outcome.got[off:off + 4 * n * c].view(np.float32).reshape(n, c)
    assert not grad[[2, 4, 5, 7]].any() and grad[[0, 1, 3, 6]].any(axis=1).all()


@pytest.mark.parametrize("kind", ["SoftmaxCrossEntropy", "SoftmaxCrossEntropyBackward"])
def test_classes_must_exist(kind: str) -> None:
    fields = dict(logits=0, labels=1024, n=2, c=0)
    fields.update(dst=2048) if kind == "SoftmaxCrossEntropy" else fields.update(d_loss=2048, dlogits=3072)
    expect_invalid(getattr(T, kind)(**fields), 4096, "c")


def test_dense_classes_must_exist() -> None:
    expect_invalid(T.SoftmaxCrossEntropyDense(logits=0, targets=1024, dst=2048, n=2, c=0), 4096, "c")
