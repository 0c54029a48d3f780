"""A BERT sentence encoder as one RLX thunk schedule: embeddings, N `FusedBertLayer`s, masked mean
pooling and L2 normalization (docs/models.md).

The arena holds the packed weights first (the same offsets for every shape), then the per-shape
activations, so one arena serves every (batch, seq) schedule that fits in it:

    ids, type_ids: i64 [b, s]      mask: f32 [b, s] (1 = token, 0 = padding)
    x   = word_emb[ids] + type_emb[type_ids] + pos_emb[:s]   (Gather, Gather, ElementwiseRegion)
    h0  = LayerNorm(x)                                        (LayerNorm)
    hℓ  = FusedBertLayer(hℓ₋₁, mask)   ℓ = 1…N                  (Q/K/V fused to one [H, 3H] weight)
    mean pooling:  sum = mask[b, 1, s] · hN[b, s, H]          (BatchedSgemm)
                   cnt = max(Σₛ mask, 1e-9)                   (Reduce Sum, ElementwiseRegion Max)
                   v   = sum / cnt                            (BinaryFull Div)
    cls pooling:   v   = hN[b, 0, :]                          (Narrow)
    normalize:     emb = RmsNorm(v; g = 1/√H) = v / √(Σv² + 1e-24)   (else emb = v)

The last line is `torch.nn.functional.normalize(v, p=2, eps=1e-12)` up to the eps rule
(`max(‖v‖, 1e-12)` there, `√(‖v‖² + 1e-24)` here: equal unless ‖v‖ < 1e-11).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import thunks as T
from ..ops import BinaryOp, ChainOperand as In, ChainStep as S, ReduceOp
from ..schedule import ThunkSchedule

ALIGN = 64
POOL_EPS = 1e-9   # sentence-transformers' clamp of the token count
NORM_EPS = 1e-24  # ‖v‖² floor of the L2 normalization (F.normalize's eps = 1e-12, squared)


@dataclass(frozen=True)
class BertConfig:
    """The fields of a Hugging Face `config.json` that the encoder needs."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_json(cls, path: "str | Path") -> "BertConfig":
        """Read a BERT `config.json`; only absolute positions and erf GELU are supported."""
        raw = json.loads(Path(path).read_text())
        if raw.get("model_type", "bert") != "bert":
            raise ValueError(f"{path}: model_type {raw.get('model_type')!r} is not 'bert'")
        if raw.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"{path}: hidden_act {raw['hidden_act']!r}; FusedBertLayer computes erf GELU")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: only absolute position embeddings are supported")
        return cls(**{f: raw[f] for f in cls.__dataclass_fields__})

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class Pooling:
    """How token states become one vector: `mode` "mean" (over unmasked tokens) or "cls" (the
    first token), then L2 `normalize` or not — sentence-transformers' Pooling and Normalize."""

    mode: str = "mean"
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.mode not in POOLING_MODES:
            raise ValueError(f"pooling mode {self.mode!r}; supported: {', '.join(POOLING_MODES)}")


POOLING_MODES = ("mean", "cls")


class Layout:
    """Bump allocator of 64-byte-aligned arena slots, remembered by name."""

    def __init__(self, start: int = 0) -> None:
        self.top = start
        self.slots: dict[str, int] = {}

    def __call__(self, name: str, nbytes: int) -> int:
        """Reserve `nbytes` for `name`; returns its offset."""
        self.slots[name] = self.top
        self.top += -(-nbytes // ALIGN) * ALIGN
        return self.slots[name]


def _linear(w: dict, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A torch Linear's weight as [in, out] (FusedBertLayer's layout) and its bias."""
    return np.ascontiguousarray(w[f"{name}.weight"].T), w[f"{name}.bias"]


def pack_weights(config: BertConfig, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Hugging Face BertModel tensors → the encoder's f32 arrays, by slot name (Q|K|V fused)."""
    w = {k.removeprefix("bert."): v for k, v in weights.items()}
    packed = {"word_emb": w["embeddings.word_embeddings.weight"],
              "pos_emb": w["embeddings.position_embeddings.weight"],
              "type_emb": w["embeddings.token_type_embeddings.weight"],
              "emb_ln_g": w["embeddings.LayerNorm.weight"], "emb_ln_b": w["embeddings.LayerNorm.bias"],
              "pool_eps": np.array([POOL_EPS]),
              "l2_g": np.full(config.hidden_size, config.hidden_size ** -0.5),
              "zeros": np.zeros(config.hidden_size)}
    for i in range(config.num_hidden_layers):
        p = f"encoder.layer.{i}."
        q, k, v = (_linear(w, f"{p}attention.self.{n}") for n in ("query", "key", "value"))
        packed[f"l{i}.qkv_w"] = np.concatenate([q[0], k[0], v[0]], axis=1)
        packed[f"l{i}.qkv_b"] = np.concatenate([q[1], k[1], v[1]])
        packed[f"l{i}.out_w"], packed[f"l{i}.out_b"] = _linear(w, f"{p}attention.output.dense")
        packed[f"l{i}.ln1_g"] = w[f"{p}attention.output.LayerNorm.weight"]
        packed[f"l{i}.ln1_b"] = w[f"{p}attention.output.LayerNorm.bias"]
        packed[f"l{i}.fc1_w"], packed[f"l{i}.fc1_b"] = _linear(w, f"{p}intermediate.dense")
        packed[f"l{i}.fc2_w"], packed[f"l{i}.fc2_b"] = _linear(w, f"{p}output.dense")
        packed[f"l{i}.ln2_g"] = w[f"{p}output.LayerNorm.weight"]
        packed[f"l{i}.ln2_b"] = w[f"{p}output.LayerNorm.bias"]
    return {name: np.ascontiguousarray(a, dtype=np.float32) for name, a in packed.items()}


def weight_layout(packed: dict[str, np.ndarray]) -> Layout:
    """Slots for the packed weights, in order, from offset 0."""
    at = Layout()
    for name, array in packed.items():
        at(name, array.nbytes)
    return at


def encoder_schedule(config: BertConfig, weights: Layout, batch: int, seq: int,
                     pooling: Pooling = Pooling()) -> tuple[ThunkSchedule, dict]:
    """The encoder for `batch` sequences of `seq` tokens; returns the schedule and the activation
    slots (`ids`, `type_ids`, `mask` inputs; `embeddings` [batch, H] output) after the weights."""
    if not 0 < seq <= config.max_position_embeddings:
        raise ValueError(f"seq = {seq} must be in 1..{config.max_position_embeddings} (the position table)")
    c, w = config, weights.slots
    hs, m = c.hidden_size, batch * seq
    at = Layout(weights.top)
    ids, type_ids, mask = at("ids", 8 * m), at("type_ids", 8 * m), at("mask", 4 * m)
    word, typ = at("word", 4 * m * hs), at("type", 4 * m * hs)
    hidden = [at("h_even", 4 * m * hs), at("h_odd", 4 * m * hs)]
    sums, count = at("sums", 4 * batch * hs), at("count", 4 * batch)
    pooled, emb = at("pooled", 4 * batch * hs), at("embeddings", 4 * batch * hs)
    gather = dict(idx_i64=1, table_bytes=4, num_idx=m, trailing=hs)
    thunks = [
        T.Gather(table=w["word_emb"], table_len=c.vocab_size * hs, idx=ids, dst=word, **gather),
        T.Gather(table=w["type_emb"], table_len=c.type_vocab_size * hs, idx=type_ids, dst=typ, **gather),
        T.ElementwiseRegion(dst=hidden[1], len=m * hs, input_offs=(word, typ, w["pos_emb"]),
                            input_modulus=(0, 0, seq * hs),
                            chain=(S.Binary(BinaryOp.Add, In.Input(0), In.Input(1)),
                                   S.Binary(BinaryOp.Add, In.Step(0), In.Input(2)))),
        T.LayerNorm(src=hidden[1], g=w["emb_ln_g"], b=w["emb_ln_b"], dst=hidden[0], rows=m, h=hs,
                    eps=c.layer_norm_eps),
    ]
    for i in range(c.num_hidden_layers):
        layer = {f: w[f"l{i}.{f}"] for f in ("qkv_w", "qkv_b", "out_w", "out_b", "ln1_g", "ln1_b",
                                             "fc1_w", "fc1_b", "fc2_w", "fc2_b", "ln2_g", "ln2_b")}
        thunks.append(T.FusedBertLayer(hidden=hidden[i % 2], mask=mask, out=hidden[(i + 1) % 2],
                                       eps1=c.layer_norm_eps, eps2=c.layer_norm_eps, batch=batch, seq=seq,
                                       hs=hs, nh=c.num_attention_heads, dh=c.head_dim,
                                       int_dim=c.intermediate_size, **layer))
    last = hidden[c.num_hidden_layers % 2]
    v = pooled if pooling.normalize else emb
    if pooling.mode == "cls":
        thunks.append(T.Narrow(src=last, dst=v, outer=batch, src_stride=seq * hs, dst_stride=hs, inner=hs,
                               elem_bytes=4))
    else:
        thunks += [
            T.BatchedSgemm(a=mask, b=last, c=sums, batch=batch, m=1, k=seq, n=hs, a_bcast=False, b_bcast=False),
            T.Reduce(src=mask, dst=count, outer=batch, reduced=seq, inner=1, op=ReduceOp.Sum),
            T.ElementwiseRegion(dst=count, len=batch, input_offs=(count, w["pool_eps"]), scalar_input_mask=0b10,
                                chain=(S.Binary(BinaryOp.Max, In.Input(0), In.Input(1)),)),
            T.BinaryFull(lhs=sums, rhs=count, dst=v, len=batch * hs, lhs_len=batch * hs, rhs_len=batch,
                         op=BinaryOp.Div, out_dims_bcast=(batch, hs), bcast_lhs_strides=(hs, 1),
                         bcast_rhs_strides=(1, 0), elem_bytes=4),
        ]
    if pooling.normalize:
        thunks.append(T.RmsNorm(src=pooled, g=w["l2_g"], b=w["zeros"], dst=emb, rows=batch, h=hs, eps=NORM_EPS / hs))
    return ThunkSchedule(thunks, arena_bytes=at.top), dict(at.slots)
