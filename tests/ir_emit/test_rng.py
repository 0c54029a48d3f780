"""RngUniform / RngNormal (semantics.md §2.14) and Sample (§2.15) against the NumPy model of RLX's generators.

* Bit for bit against `reference.rng` for lengths 0 … 771 and 100 003 (the last Philox block partly used,
  vector tails, a fill split across threads), several keys and global seeds, under each policy of the
  schedule's `RngOptions` (Philox, Ort, Zero), in one program per policy; 1 and 2 threads give the same
  bytes, and a second run of the same program rewrites the same bytes (every run re-seeds).
* The NumPy model's Philox words against a plain-integer, one-word-at-a-time generator (a 4-word buffer and
  a 128-bit counter with carry), written separately here from the same spec text.
* Moments and Kolmogorov–Smirnov tests on 10^5 draws of each generator.
* Bad input: the Bnns policy, an ORT seed whose LCG state is 0 (RLX's polar loop would never end).
"""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

import rlx_llvm as rl
from rlx_llvm import reference as ref
from rlx_llvm import thunks as T
from rlx_llvm.ops import RngBackend, RngOptions
from rlx_llvm.reference import rng as model
from tests.harness import HUGE, W, Suite, expect_invalid, run_on_copy, suite_tests

LENGTHS = (0, 1, 2, 3, 4, 5, W - 1, W, W + 1, 4 * W - 1, 4 * W, 4 * W + 1, 8 * W + 3, 771)
DRAWS = 100_000


class PolicySuite(Suite):
    """A suite compiled under the RNG policy `options`."""

    def __init__(self, options: RngOptions, **kw) -> None:
        super().__init__(**kw)
        self.options = options

    def schedule(self) -> rl.ThunkSchedule:
        return dataclasses.replace(super().schedule(), rng=self.options)


def fill_cases(s: Suite, lengths=LENGTHS, op_seed: "float | None" = None) -> Suite:
    """A uniform and a normal fill of every length, each with its own key (bit-exact outputs)."""
    for n in lengths:
        for kind, a, b in ((T.RngUniform, -1.5, 2.5), (T.RngNormal, 0.25, 3.0)):
            key = 1000 * n + (kind is T.RngNormal)
            dst, out = s.out(np.float32, n)
            fields = dict(mean=a, scale=b) if kind is T.RngNormal else dict(low=a, high=b)
            tag = "" if op_seed is None else f"/op_seed{op_seed}"
            s.add(f"{kind.__name__}/n{n}{tag}", kind(dst=dst, len=n, key=key, op_seed=op_seed, **fields), [out])
    return s


philox = fill_cases(PolicySuite(RngOptions(seed=42, backend=RngBackend.Philox), fill=0xFF),
                    LENGTHS + (HUGE,))
(philox_outcome, test_philox_matches_model, test_philox_writes_only_its_outputs,
 test_philox_thread_count_does_not_change_results, test_philox_is_native) = suite_tests(philox, fixture="philox_outcome")

ort = fill_cases(PolicySuite(RngOptions(seed=2**40 + 5, backend=RngBackend.Ort), fill=0xFF))
fill_cases(ort, (3, 2 * W + 1), op_seed=1234.75)
(ort_outcome, test_ort_matches_model, test_ort_writes_only_its_outputs,
 test_ort_thread_count_does_not_change_results, test_ort_is_native) = suite_tests(ort, fixture="ort_outcome")

zero = fill_cases(PolicySuite(RngOptions(backend=RngBackend.Zero), fill=0xFF), (0, 1, W + 1, 771))
(zero_outcome, test_zero_matches_model, *_) = suite_tests(zero, fixture="zero_outcome")


def test_zero_policy_writes_zeros(zero_outcome) -> None:
    for name in zero.names:
        assert not zero_outcome.output(name).view(np.uint32).any(), name


@pytest.mark.parametrize("fixture", ["philox_outcome", "ort_outcome"])
def test_every_run_reseeds(request, fixture: str) -> None:
    """Running the program again over its own output rewrites the same bytes."""
    outcome = request.getfixturevalue(fixture)
    again = run_on_copy(outcome.program, outcome.got)
    np.testing.assert_array_equal(again, outcome.got)


def test_fills_differ_by_key_and_seed(philox_outcome) -> None:
    """Not a constant stream: two keys, and the same key under another global seed, draw other values."""
    a, b = (philox_outcome.output(f"RngUniform/n{n}")[:W] for n in (W, W + 1))
    assert not np.array_equal(a, b)
    t = philox.cases[philox.names.index(f"RngUniform/n{W}")].thunk
    other = np.zeros(philox.nbytes, np.uint8)
    ref.run(rl.ThunkSchedule([t], arena_bytes=philox.nbytes, rng=RngOptions(seed=43)), other)
    assert not np.array_equal(other[t.dst:t.dst + 4 * W].view(np.float32), a)


# ── the NumPy model against a sequential generator written separately ──────

class SequentialPhilox:
    """RLX's Philox4x32-10 one word at a time, in Python integers (§2.14)."""

    def __init__(self, seed: int) -> None:
        self.key = (seed & 0xFFFFFFFF, seed >> 32)
        self.counter = [0, 0, 0, 0]
        self.buffer: list[int] = []

    def block(self) -> list[int]:
        (c0, c1, c2, c3), (k0, k1) = self.counter, self.key
        for _ in range(10):
            p0, p1 = 0xD2561A75 * c0, 0xCD9E8D57 * c2
            c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c3 ^ k1, p0 & 0xFFFFFFFF
            k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
        for i in range(4):   # increment the 128-bit counter with carry
            self.counter[i] = (self.counter[i] + 1) & 0xFFFFFFFF
            if self.counter[i]:
                break
        return [c0, c1, c2, c3]

    def next_u32(self) -> int:
        if not self.buffer:
            self.buffer = self.block()
        return self.buffer.pop(0)


@pytest.mark.parametrize("seed", [0, 42, 2**32 - 1, 2**63 + 12345, model.combine_seed(42, 7)])
def test_model_words_equal_the_sequential_stream(seed: int) -> None:
    gen = SequentialPhilox(seed)
    want = np.array([gen.next_u32() for _ in range(4 * 9 + 3)], np.uint32)
    np.testing.assert_array_equal(model.philox_words(seed, want.size), want)


# ── distributions: 10^5 draws ───────────────────────────────────────────────

def native_draws(options: RngOptions, kind: type) -> np.ndarray:
    """DRAWS values of U[0, 1) or N(0, 1) from a compiled fill, bit-checked against the model."""
    fields = dict(mean=0.0, scale=1.0) if kind is T.RngNormal else dict(low=0.0, high=1.0)
    sched = rl.ThunkSchedule([kind(dst=0, len=DRAWS, key=3, op_seed=None, **fields)], arena_bytes=4 * DRAWS,
                             rng=options)
    got = rl.Arena(4 * DRAWS)
    rl.compile(sched, cache=False).run(got)
    want = np.zeros(4 * DRAWS, np.uint8)
    ref.run(sched, want)
    np.testing.assert_array_equal(got.bytes, want)
    return got.bytes.view(np.float32).astype(np.float64)


@pytest.mark.parametrize("backend", [RngBackend.Philox, RngBackend.Ort])
def test_uniform_distribution(backend: RngBackend) -> None:
    u = native_draws(RngOptions(seed=7, backend=backend), T.RngUniform)
    assert 0.0 <= u.min() and u.max() <= 1.0
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / DRAWS)
    assert abs(u.var() - 1 / 12) < 5 * np.sqrt(1 / 180 / DRAWS)
    assert stats.kstest(u, "uniform").pvalue > 1e-4


@pytest.mark.parametrize("backend", [RngBackend.Philox, RngBackend.Ort])
def test_normal_distribution(backend: RngBackend) -> None:
    z = native_draws(RngOptions(seed=7, backend=backend), T.RngNormal)
    assert abs(z.mean()) < 5 / np.sqrt(DRAWS)
    assert abs(z.var() - 1) < 5 * np.sqrt(2 / DRAWS)
    assert abs(stats.skew(z)) < 5 * np.sqrt(6 / DRAWS) and abs(stats.kurtosis(z)) < 5 * np.sqrt(24 / DRAWS)
    assert stats.kstest(z, "norm").pvalue > 1e-4


# ── bad input ───────────────────────────────────────────────────────────────

def compile_one(thunk, options: RngOptions):
    return rl.compile(rl.ThunkSchedule([thunk], arena_bytes=4 * thunk.len + 64, rng=options), cache=False)


def test_bnns_policy_is_refused() -> None:
    with pytest.raises(rl.ValidationError, match="Bnns") as info:
        compile_one(T.RngUniform(dst=0, len=4, low=0.0, high=1.0, key=0, op_seed=None),
                    RngOptions(backend=RngBackend.Bnns))
    assert info.value.field == "rng"


@pytest.mark.parametrize("op_seed, field", [(0.0, "op_seed"), (-3.0, "op_seed"), (float("nan"), "op_seed"), (None, "key")])
def test_ort_normal_with_a_zero_state_is_refused(op_seed, field: str) -> None:
    key = 2**31 - 1 - 5 if op_seed is None else 0
    with pytest.raises(rl.ValidationError, match="never ends") as info:
        compile_one(T.RngNormal(dst=0, len=4, mean=0.0, scale=1.0, key=key, op_seed=op_seed),
                    RngOptions(seed=5, backend=RngBackend.Ort))
    assert info.value.field == field


# ── Sample ──────────────────────────────────────────────────────────────────

def sample_case(s: Suite, name: str, logits: np.ndarray, top_k: int = 0, top_p: float = 1.0,
                temperature: float = 1.0, seed: int = 1) -> None:
    """A Sample over `logits[batch, vocab]`, its f32 indices compared bit for bit."""
    batch, vocab = logits.shape
    src = s.put(logits.astype(np.float32))
    dst, out = s.out(np.float32, batch)
    s.add(name, T.Sample(logits=src, dst=dst, batch=batch, vocab=vocab, top_k=top_k, top_p=top_p,
                         temperature=temperature, seed=seed), [out])


TIES = np.array([5.0, 3.0, 3.0, 3.0, 1.0, 0.0])              # top-k 2: the cutoff 3 is shared by three tokens
CROSSING = np.log(np.array([0.5, 0.3, 0.2]))                  # top-p 0.6: 0.5 < 0.6, then 0.8 ≥ 0.6
REPEATS = 300

samples = Suite(seed=3)
for vocab in (1, W + 1, 37, 1000):
    for top_k, top_p, temperature in ((0, 1.0, 1.0), (5, 0.9, 0.7), (0, 0.8, 1.3), (20, 1.0, 0.0)):
        sample_case(samples, f"Sample/v{vocab}_k{top_k}_p{top_p}_t{temperature}",
                    samples.normal(9, vocab, scale=3.0), min(top_k, vocab), top_p, temperature, seed=vocab + top_k)
sample_case(samples, "Sample/batch0", samples.normal(0, 5))
sample_case(samples, "Sample/many_rows", samples.normal(200, 300, scale=2.0), top_k=40, top_p=0.95, seed=0)
sample_case(samples, "Sample/argmax", samples.normal(50, 77), temperature=0.0, seed=5)
for seed in (1, 2):
    sample_case(samples, f"Sample/top_k1_seed{seed}", samples.normal(50, 77, scale=0.1), top_k=1, seed=seed)
sample_case(samples, "Sample/ties", np.tile(TIES, (REPEATS, 1)), top_k=2)
sample_case(samples, "Sample/crossing", np.tile(CROSSING, (REPEATS, 1)), top_p=0.6)
sample_case(samples, "Sample/flat", np.zeros((REPEATS, 1000)), seed=0)
sample_case(samples, "Sample/flat_deadbeef", np.zeros((REPEATS, 1000)), seed=0xDEADBEEF)
(sample_outcome, test_sample_matches_model, test_sample_writes_only_its_outputs,
 test_sample_thread_count_does_not_change_results, test_sample_is_native) = suite_tests(samples, fixture="sample_outcome")


def sample_input(name: str) -> np.ndarray:
    t = samples.cases[samples.names.index(name)].thunk
    return next(v for off, v in samples.inputs if off == t.logits)


def test_temperature_zero_is_argmax(sample_outcome) -> None:
    np.testing.assert_array_equal(sample_outcome.output("Sample/argmax"), sample_input("Sample/argmax").argmax(1))


def test_top_k_one_is_deterministic(sample_outcome) -> None:
    """Whatever the seed, top-k 1 picks the largest logit."""
    for seed in (1, 2):
        name = f"Sample/top_k1_seed{seed}"
        np.testing.assert_array_equal(sample_outcome.output(name), sample_input(name).argmax(1))


def test_ties_at_the_top_k_cutoff_survive(sample_outcome) -> None:
    assert set(sample_outcome.output("Sample/ties").astype(int)) == {0, 1, 2, 3}


def test_top_p_keeps_the_crossing_token(sample_outcome) -> None:
    assert set(sample_outcome.output("Sample/crossing").astype(int)) == {0, 1}


def test_rows_draw_one_shared_stream(sample_outcome) -> None:
    """Uniform logits: row b returns ⌈r_b·vocab⌉ − 1 (± 1 for rounding) with r_b = word b of the stream
    keyed 0xDEADBEEF — also what seed 0 uses."""
    got = sample_outcome.output("Sample/flat")
    np.testing.assert_array_equal(got, sample_outcome.output("Sample/flat_deadbeef"))
    r = model.unit_f32(model.philox_words(0xDEADBEEF, REPEATS)).astype(np.float64)
    assert np.all(np.abs(got - np.maximum(np.ceil(r * 1000) - 1, 0)) <= 1)
    assert len(set(got)) > REPEATS // 2


@pytest.mark.parametrize("fields, field", [
    (dict(top_k=8), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=-0.5), "top_p"),
    (dict(top_p=1.5), "top_p"), (dict(top_p=float("nan")), "top_p"), (dict(vocab=0), "vocab")])
def test_sample_bad_input(fields: dict, field: str) -> None:
    t = dict(logits=0, dst=256, batch=2, vocab=7, top_k=0, top_p=1.0, temperature=1.0, seed=0) | fields
    expect_invalid(T.Sample(**t), 512, field)


SWEEP = r"""
import rlx_llvm as rl
from rlx_llvm import thunks as T
batch, thunks, top = 3, [], 0
for vocab in range(1, 129):
    top_k, top_p, temperature = ((0, 1.0, 1.0), (min(5, vocab), 0.9, 0.7), (0, 1.0, 0.0))[vocab % 3]
    thunks.append(T.Sample(logits=top, dst=top + 4 * batch * vocab, batch=batch, vocab=vocab, top_k=top_k,
                           top_p=top_p, temperature=temperature, seed=vocab))
    top += 4 * batch * (vocab + 1)
rl.compile(rl.ThunkSchedule(thunks, arena_bytes=top), cache=False)
"""


def test_sample_compiles_at_every_small_vocab() -> None:
    """Every vocabulary of 1–128 tokens compiles (in a child process: LLVM's loop vectorizer, built
    with assertions, aborted the process on znver5 for the sequential scans at 76–78 tokens)."""
    done = subprocess.run([sys.executable, "-c", SWEEP], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
