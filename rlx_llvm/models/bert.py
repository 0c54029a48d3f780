"""A BERT sentence encoder as one RLX thunk schedule: embeddings, N `FusedBertLayer`s, masked mean
pooling and L2 normalization (docs/models.md).

The arena holds the packed weights first (the same offsets for every shape), then the per-shape
activations, so one arena serves every (batch, seq) schedule that fits in it:

    ids, type_ids: i64 [b, s]      mask: f32 [b, s] (1 = token, 0 = padding)
    x   = word_emb[ids] + type_emb[type_ids] + pos_emb[:s]   (Gather, Gather, ElementwiseRegion)
    h0  = LayerNorm(x)                                        (LayerNorm)
    hℓ  = FusedBertLayer(hℓ₋₁, mask)   ℓ = 1…N                  (Q/K/V fused to one [H, 3H] weight)
          or, quantized (`quant` "q8_0"/"q4_0"), the same layer as separate thunks whose four
          linear layers are `DequantMatMulGguf` over GGUF-packed [out, in] weights:
          qkv = x·Wqkvᵀ + b; a = Attention(qkv, mask); n1 = LN(a·Woᵀ + bo + x);
          f = GELU(n1·W1ᵀ + b1); hℓ = LN(f·W2ᵀ + b2 + n1)
          AWQ-scaled (`calibration` given, models/awq.py): x, n1 and f are multiplied by a
          per-channel 1/s (ElementwiseRegion) before their GEMM; attention-out's 1/s is in V's rows
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
from typing import TYPE_CHECKING, Literal, get_args

import numpy as np

from .. import thunks as T
from ..ops import Activation, BinaryOp, ChainOperand as In, ChainStep as S, MaskKind, QuantScheme, ReduceOp
from ..schedule import ThunkSchedule
from ..thunks.quant import GGUF_BLOCKS

if TYPE_CHECKING:
    from .awq import ScaledLinear

ALIGN = 64
POOL_EPS = 1e-9   # sentence-transformers' clamp of the token count
NORM_EPS = 1e-24  # ‖v‖² floor of the L2 normalization (F.normalize's eps = 1e-12, squared)

Quant = Literal["f32", "q8_0", "q4_0"]
QUANTS: tuple[str, ...] = get_args(Quant)
"""Weight formats of the linear layers: f32, or a GGUF block type (`gguf.GGMLQuantizationType` name, lower case)."""
LINEARS = ("qkv", "out", "fc1", "fc2")


def quant_scheme(quant: str) -> "QuantScheme | None":
    """The GGUF `QuantScheme` of `quant` (None for f32); anything else is a ValueError naming the choices."""
    if quant not in QUANTS:
        raise ValueError(f"quant {quant!r} is not supported; choose one of {', '.join(QUANTS)}")
    return None if quant == "f32" else getattr(QuantScheme, f"Gguf{quant.upper()}")


def quantize(w: np.ndarray, quant: str) -> np.ndarray:
    """A torch Linear weight `[out, in]` as GGUF blocks of `quant` (uint8 `[out, in/B·bytes]`), by `gguf`'s quantizer."""
    from gguf import GGMLQuantizationType, quants
    elems, _ = GGUF_BLOCKS[quant_scheme(quant).name]
    if w.shape[-1] % elems:
        raise ValueError(f"{quant}: a linear layer's input width {w.shape[-1]} is not a multiple of the "
                         f"{elems}-element block")
    return quants.quantize(np.ascontiguousarray(w, np.float32), GGMLQuantizationType[quant.upper()])


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


def _linears(w: dict, prefix: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A layer's four torch Linears (weight `[out, in]`, bias), Q|K|V stacked along `out`, by LINEARS name."""
    lin = lambda name: (w[f"{prefix}{name}.weight"], w[f"{prefix}{name}.bias"])  # noqa: E731
    qkv = [lin(f"attention.self.{n}") for n in ("query", "key", "value")]
    return {"qkv": (np.concatenate([q[0] for q in qkv]), np.concatenate([q[1] for q in qkv])),
            "out": lin("attention.output.dense"), "fc1": lin("intermediate.dense"), "fc2": lin("output.dense")}


def _layer(w: dict, i: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Layer `i`'s linears (by LINEARS name) and LayerNorms (`ln1`, `ln2`: gamma, beta)."""
    p = f"encoder.layer.{i}."
    return {**_linears(w, p),
            "ln1": (w[f"{p}attention.output.LayerNorm.weight"], w[f"{p}attention.output.LayerNorm.bias"]),
            "ln2": (w[f"{p}output.LayerNorm.weight"], w[f"{p}output.LayerNorm.bias"])}


SCALED_INPUTS = ("qkv", "fc1", "fc2")
"""The AWQ linears whose input the schedule multiplies by 1/s (attention-out's 1/s is in the V rows)."""


def pack_weights(config: BertConfig, weights: dict[str, np.ndarray], quant: Quant = "f32",
                 calibration: "list[list[int]] | None" = None) -> dict[str, np.ndarray]:
    """Hugging Face BertModel tensors → the encoder's arrays, by slot name (Q|K|V fused): linear weights
    f32 `[in, out]` (FusedBertLayer's layout) or, quantized, GGUF blocks of the `[out, in]` rows
    (DequantMatMulGguf's); everything else f32.  With `calibration` token rows (quantized only), the
    linears are AWQ-scaled first (`models.awq`) and slots `l{i}.{qkv,fc1,fc2}_in` hold their input's 1/s."""
    quant_scheme(quant)
    if calibration is not None and quant == "f32":
        raise ValueError("calibration (AWQ) applies to quantized weights; quant is f32")
    w = {k.removeprefix("bert."): v for k, v in weights.items()}
    packed = {"word_emb": w["embeddings.word_embeddings.weight"],
              "pos_emb": w["embeddings.position_embeddings.weight"],
              "type_emb": w["embeddings.token_type_embeddings.weight"],
              "emb_ln_g": w["embeddings.LayerNorm.weight"], "emb_ln_b": w["embeddings.LayerNorm.bias"],
              "pool_eps": np.array([POOL_EPS]),
              "l2_g": np.full(config.hidden_size, config.hidden_size ** -0.5),
              "zeros": np.zeros(config.hidden_size)}
    layers = [_layer(w, i) for i in range(config.num_hidden_layers)]
    scaled = awq_layers(config, weights, calibration, quant) if calibration is not None else None
    for i, layer in enumerate(layers):
        for name in LINEARS:
            weight, bias = layer[name]
            if scaled is not None:
                weight, bias = scaled[i][name].weight, scaled[i][name].bias
            packed[f"l{i}.{name}_w"] = weight.T if quant == "f32" else quantize(weight, quant)
            packed[f"l{i}.{name}_b"] = bias
        if scaled is not None:
            packed.update({f"l{i}.{name}_in": 1 / scaled[i][name].scale for name in SCALED_INPUTS})
        packed[f"l{i}.ln1_g"], packed[f"l{i}.ln1_b"] = layer["ln1"]
        packed[f"l{i}.ln2_g"], packed[f"l{i}.ln2_b"] = layer["ln2"]
    return {name: np.ascontiguousarray(a, dtype=a.dtype if a.dtype == np.uint8 else np.float32)
            for name, a in packed.items()}


def awq_layers(config: BertConfig, weights: dict[str, np.ndarray], calibration: list[list[int]],
               quant: Quant) -> "list[dict[str, ScaledLinear]]":
    """Every layer's four linears AWQ-scaled for `quant` (`models.awq`), from the f32 model's
    activations over the `calibration` token rows.  NumPy's BLAS runs on one thread meanwhile: its
    many mid-size products took 7× the CPU time (and 4× the wall time) on two threads of a busy host."""
    from ..kernels.threads import blas_threads_at_most
    from .awq import calibration_stats, scale_layer
    w = {k.removeprefix("bert."): v for k, v in weights.items()}
    layers = [_layer(w, i) for i in range(config.num_hidden_layers)]
    embeddings = (w["embeddings.word_embeddings.weight"], w["embeddings.position_embeddings.weight"],
                  w["embeddings.token_type_embeddings.weight"])
    with blas_threads_at_most(1):
        stats = calibration_stats(layers, (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"]),
                                  calibration, embeddings, config.num_attention_heads, config.layer_norm_eps)
        return [scale_layer(layer, st, quant) for layer, st in zip(layers, stats)]


def weight_layout(packed: dict[str, np.ndarray]) -> Layout:
    """Slots for the packed weights, in order, from offset 0."""
    at = Layout()
    for name, array in packed.items():
        at(name, array.nbytes)
    return at


def encoder_schedule(config: BertConfig, weights: Layout, batch: int, seq: int,
                     pooling: Pooling = Pooling(), quant: Quant = "f32") -> tuple[ThunkSchedule, dict]:
    """The encoder for `batch` sequences of `seq` tokens over weights packed with the same `quant`;
    returns the schedule and the activation slots (`ids`, `type_ids`, `mask` inputs; `embeddings`
    [batch, H] output) after the weights."""
    scheme = quant_scheme(quant)
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
    if scheme is not None:
        steps = {name: at(name, 4 * m * width) for name, width in
                 (("qkv", 3 * hs), ("attn", hs), ("proj", hs), ("n1", hs), ("ffn", c.intermediate_size), ("xs", hs))}
    for i in range(c.num_hidden_layers):
        layer = {f: w[f"l{i}.{f}"] for f in ("qkv_w", "qkv_b", "out_w", "out_b", "ln1_g", "ln1_b",
                                             "fc1_w", "fc1_b", "fc2_w", "fc2_b", "ln2_g", "ln2_b")}
        layer.update({f"{f}_in": w[f"l{i}.{f}_in"] for f in SCALED_INPUTS if f"l{i}.{f}_in" in w})
        src, dst = hidden[i % 2], hidden[(i + 1) % 2]
        if scheme is None:
            thunks.append(T.FusedBertLayer(hidden=src, mask=mask, out=dst, eps1=c.layer_norm_eps,
                                           eps2=c.layer_norm_eps, batch=batch, seq=seq, hs=hs,
                                           nh=c.num_attention_heads, dh=c.head_dim, int_dim=c.intermediate_size,
                                           **layer))
        else:
            thunks += quantized_layer(c, layer, scheme, src, mask, dst, steps, batch, seq)
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


def quantized_layer(c: BertConfig, w: dict[str, int], scheme: QuantScheme, src: int, mask: int, dst: int,
                    steps: dict[str, int], batch: int, seq: int) -> list[T.Thunk]:
    """One post-LN BERT layer (FusedBertLayer's math) as separate thunks, its four linear layers
    `DequantMatMulGguf` over GGUF-packed weights; `steps` are the scratch slots shared by every layer.
    AWQ-scaled weights (slots `qkv_in`, `fc1_in`, `fc2_in`: 1/s) get their input multiplied by 1/s first."""
    hs, inter, m, nh, eps = c.hidden_size, c.intermediate_size, batch * seq, c.num_attention_heads, c.layer_norm_eps
    qkv, attn, proj, n1, ffn, xs = (steps[k] for k in ("qkv", "attn", "proj", "n1", "ffn", "xs"))

    def linear(x: int, name: str, out: int, k: int, n: int, scaled: int) -> list[T.Thunk]:
        """`out = x·Wᵀ`; AWQ-scaled, `scaled = x ⊙ (1/s)` (per column of x) first and `out = scaled·Wᵀ`."""
        thunks: list[T.Thunk] = []
        if f"{name}_in" in w:
            thunks.append(T.ElementwiseRegion(dst=scaled, len=m * k, input_offs=(x, w[f"{name}_in"]),
                                              input_modulus=(0, k),
                                              chain=(S.Binary(BinaryOp.Mul, In.Input(0), In.Input(1)),)))
            x = scaled
        return thunks + [T.DequantMatMulGguf(x=x, w_q=w[f"{name}_w"], dst=out, m=m, k=k, n=n, scheme=scheme)]

    def residual_ln(x: int, res: int, bias: str, ln: str, out: int) -> T.FusedResidualLN:
        return T.FusedResidualLN(x=x, res=res, bias=w[bias], g=w[f"{ln}_g"], b=w[f"{ln}_b"], out=out, rows=m, h=hs,
                                 eps=eps, has_bias=True)

    return [
        *linear(src, "qkv", qkv, hs, 3 * hs, xs),
        T.BiasAdd(src=qkv, bias=w["qkv_b"], dst=qkv, m=m, n=3 * hs),
        T.Attention(q=qkv, k=qkv + 4 * hs, v=qkv + 8 * hs, mask=mask, out=attn, batch=batch, seq=seq, kv_seq=seq,
                    heads=nh, kv_heads=nh, head_dim=c.head_dim, v_head_dim=c.head_dim, mask_kind=MaskKind.Custom,
                    scale=float(np.float32(c.head_dim ** -0.5)), softcap=0.0, q_row_stride=3 * hs,
                    k_row_stride=3 * hs, v_row_stride=3 * hs, bhsd=False),
        *linear(attn, "out", proj, hs, hs, attn),
        residual_ln(proj, src, "out_b", "ln1", n1),
        *linear(n1, "fc1", ffn, hs, inter, xs),
        T.BiasAdd(src=ffn, bias=w["fc1_b"], dst=ffn, m=m, n=inter),
        T.ActivationInPlace(data=ffn, len=m * inter, act=Activation.Gelu),
        *linear(ffn, "fc2", proj, inter, hs, ffn),
        residual_ln(proj, n1, "fc2_b", "ln2", dst),
    ]
