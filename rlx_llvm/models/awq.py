"""Activation-aware weight quantization (AWQ) of the encoder's linear layers (docs/models.md).

A linear layer `y = x·Wᵀ + b` whose input has a few large channels loses most to 4-bit rounding in
the weights those channels multiply.  With a per-input-channel scale `s > 0` the same layer is
`y = (x/s)·(W·diag s)ᵀ + b`: scaling a channel's weights up before `gguf`'s Q4_0 quantizer gives
them a finer share of their block's range.  The weights stay GGUF blocks from `gguf.quants.quantize`;
only what they are computed from changes:

    s   = mean|x|^α / √(max · min)          α on a grid, the best per linear layer
    Wc  = clip(W·diag s, ±r · block max)     r on a grid, the best per (row, block)
    b'  = b − μₓ·(Q(Wc)/s − W)ᵀ              the quantization error's mean, taken out of the bias

"Best" is the least output error `E‖x·(Q(Wc)/s − W)ᵀ‖²` over calibration activations of the f32
model (the Gram matrix `E[xᵀx]` stands for them).  1/s reaches x exactly: the attention output
projection's s divides the V rows of the Q|K|V weight (attention mixes V's rows with weights
summing to 1, so a per-channel scale passes through); the other three inputs are LayerNorm or GELU
outputs that also feed a residual or nothing scalable, so the schedule multiplies them by 1/s
(one element-wise pass each).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..reference.fused_layers import gelu_erf, layer_norm, mha

ALPHAS = tuple(a / 10 for a in range(11))          # exponents of the activation magnitude
CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)   # fractions of a block's largest weight
BLOCK = 32                                         # Q4_0 / Q8_0 elements per block

CALIBRATION_TEXTS = (
    "What time does the train to Berlin leave tomorrow morning?",
    "She planted tomatoes, basil and peppers in the garden behind the house.",
    "The central bank raised interest rates by a quarter of a percentage point.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Can you recommend a good book about the history of mathematics?",
    "The patient was given antibiotics and recovered within a week.",
    "Our team won the championship after a dramatic penalty shootout.",
    "Please reset your password using the link we sent to your email address.",
    "A binary search tree keeps its keys in sorted order for fast lookup.",
    "The museum opens at nine and closes at five on weekdays.",
    "Heavy rain is expected across the northern region this weekend.",
    "He apologized for the delay and promised to ship the order on Monday.",
    "The recipe calls for two eggs, a cup of flour and a pinch of salt.",
    "Volcanic eruptions can cool the global climate for several years.",
    "thanks!",
    "good morning",
    "Error 404: page not found",
    "import numpy as np; x = np.zeros((3, 4))",
    "The committee will review all applications before the end of March.",
    "Children learn languages faster than most adults do.",
    "I lost my keys somewhere between the office and the parking lot.",
    "The violinist performed a sonata by Beethoven to a full concert hall.",
    "Solar panels on the roof now cover most of the building's electricity needs.",
    "Is it safe to drink tap water in this city?",
    "The novel follows three generations of a family living on a small island.",
    "Stock prices fell sharply after the company reported weaker profits.",
    "Dogs were domesticated from wolves tens of thousands of years ago.",
    "Turn left at the second traffic light and the pharmacy is on your right.",
    "The software update fixes a memory leak and improves battery life.",
    "Mount Everest is the highest mountain above sea level.",
    "Le chat dort sur le canapé depuis ce matin.",
    "Der Zug hat zwanzig Minuten Verspätung.",
    "¿Dónde está la biblioteca más cercana?",
    "東京は日本の首都です。",
    "The protein folds into a three-dimensional shape that determines its function, and a single "
    "mutation can change that shape enough to disable the enzyme. Researchers used cryo-electron "
    "microscopy to image the structure at near-atomic resolution, then compared it with predictions "
    "from a neural network trained on thousands of known structures. The agreement was close for the "
    "core of the protein but poor for the flexible loops on its surface, which move too much to be "
    "captured by a single snapshot. The authors argue that future models should predict ensembles of "
    "conformations rather than one static structure.",
    "Minutes of the meeting: the budget for the next quarter was approved, two new engineers will join "
    "the infrastructure team, the office move is postponed until summer, and the security audit found "
    "no critical issues but recommended rotating all service credentials every ninety days.",
)
"""A small calibration set (none of them a golden sentence of tests/data/minilm_golden.json)."""


@dataclass(frozen=True)
class InputStats:
    """What AWQ needs of one linear layer's input over the calibration tokens."""

    magnitude: np.ndarray   # mean |x| per channel  [k]
    mean: np.ndarray        # mean x per channel    [k]
    root: np.ndarray        # R with RᵀR = E[xᵀx]: x/√tokens, or its QR's R when tokens > k  [≤ k, k]

    @classmethod
    def of(cls, x: np.ndarray, weight: "np.ndarray | None" = None) -> "InputStats":
        """Statistics of the rows of `x` [tokens, k], each row counted with `weight` (default 1)."""
        x = x.astype(np.float32)
        p = np.ones(len(x), np.float32) if weight is None else weight.astype(np.float32)
        p = (p / p.sum())[:, None]
        root = x * np.sqrt(p)
        if len(x) > x.shape[1]:
            root = np.linalg.qr(root, mode="r")
        return cls((np.abs(x) * p).sum(0), (x * p).sum(0), root)

    def scaled(self, s: np.ndarray) -> "InputStats":
        """The statistics of x/s."""
        return InputStats(self.magnitude / s, self.mean / s, self.root / s)


@dataclass(frozen=True)
class ScaledLinear:
    """A linear layer ready for quantization: `y = (x/s)·Q(weight)ᵀ + bias`."""

    weight: np.ndarray      # W·diag s, clipped per block: what `gguf.quants.quantize` is given  [n, k]
    bias: np.ndarray        # bias corrected for the mean quantization error  [n]
    scale: np.ndarray       # s  [k]
    alpha: float


def calibration_stats(layers: list[dict], embed_ln: tuple, token_rows: list[list[int]],
                      tables: tuple[np.ndarray, np.ndarray, np.ndarray], heads: int,
                      eps: float) -> list[dict[str, InputStats]]:
    """Per encoder layer, the input statistics of its four linear layers (`layers[i][name]` =
    (W [out, in], b)), from a float32 NumPy run of the f32 model over `token_rows`, one text at a
    time; each text weighs the same (its tokens 1/length each), as each is one mean-pooled embedding."""
    word, pos, typ = tables
    inputs: list[dict[str, list[np.ndarray]]] = [{n: [] for n in ("qkv", "out", "fc1", "fc2")} for _ in layers]
    lin = lambda x, wb: x @ wb[0].T + wb[1]  # noqa: E731
    for ids in token_rows:
        seq = len(ids)
        x = layer_norm(word[ids] + typ[0] + pos[:seq], *embed_ln, eps)
        for layer, seen in zip(layers, inputs):
            heads_dim = x.shape[1] // heads
            seen["qkv"].append(x)
            ctx = mha(lin(x, layer["qkv"]), None, None, 1, seq, heads, heads_dim)
            seen["out"].append(ctx)
            n1 = layer_norm(lin(ctx, layer["out"]) + x, *layer["ln1"], eps)
            seen["fc1"].append(n1)
            f = gelu_erf(lin(n1, layer["fc1"]))
            seen["fc2"].append(f)
            x = layer_norm(lin(f, layer["fc2"]) + n1, *layer["ln2"], eps)
    weight = np.concatenate([np.full(len(ids), 1 / len(ids)) for ids in token_rows])
    return [{n: InputStats.of(np.concatenate(xs), weight) for n, xs in seen.items()} for seen in inputs]


def roundtrip(w: np.ndarray, quant: str) -> np.ndarray:
    """`gguf`'s dequantize(quantize(w)) — the weights the GEMM will see — by its block functions
    (equal to `gguf.quants.quantize`/`dequantize`, without their row-group loop)."""
    from gguf import quants
    blocks = getattr(quants, quant.upper())
    packed = blocks.quantize_blocks(np.ascontiguousarray(w, np.float32).reshape(-1, BLOCK))
    return blocks.dequantize_blocks(packed).reshape(w.shape)


def output_error(dw: np.ndarray, stats: InputStats) -> float:
    """E‖x·dwᵀ‖² = ‖R·dwᵀ‖² over the calibration inputs."""
    return float(np.square(stats.root @ dw.T).sum())


def channel_scale(magnitude: np.ndarray, alpha: float) -> np.ndarray:
    """s = m^α / √(max · min): AWQ's scale, centred so that it grows some weights and shrinks others."""
    s = np.maximum(magnitude, 1e-8) ** alpha
    return s / np.sqrt(s.max() * s.min())


def clip_blocks(w: np.ndarray, stats: InputStats, quant: str) -> np.ndarray:
    """`w` with each (row, block) clipped to the ratio of its largest |weight| in CLIP_RATIOS whose
    rounding error, alone in its row, gives the least output error."""
    n, k = w.shape
    blocks = w.reshape(n, k // BLOCK, BLOCK)
    roots = stats.root.reshape(-1, k // BLOCK, BLOCK).transpose(1, 0, 2)  # [blocks, ≤ k, BLOCK]
    grams = roots.transpose(0, 2, 1) @ roots                               # [blocks, BLOCK, BLOCK]
    limit = np.abs(blocks).max(-1, keepdims=True)
    best, best_err = blocks, np.full(blocks.shape[:2], np.inf)
    for r in CLIP_RATIOS:
        clipped = np.clip(blocks, -r * limit, r * limit)
        d = (roundtrip(clipped.reshape(n, k), quant).reshape(blocks.shape) - blocks).transpose(1, 0, 2)
        err = ((d @ grams) * d).sum(-1).T  # dᵀ·G·d per (row, block)
        better = err < best_err
        best, best_err = np.where(better[..., None], clipped, best), np.where(better, err, best_err)
    return best.reshape(n, k)


def scale_linear(w: np.ndarray, b: np.ndarray, stats: InputStats, quant: str) -> ScaledLinear:
    """AWQ for one linear layer: the α whose scaled weights round with the least output error, then
    the per-block clip, then the bias correction."""
    def error(alpha: float) -> float:
        s = channel_scale(stats.magnitude, alpha)
        return output_error(roundtrip(w * s, quant) / s - w, stats)

    alpha = min(ALPHAS, key=error)
    s = channel_scale(stats.magnitude, alpha)
    clipped = clip_blocks(w * s, stats.scaled(s), quant)
    bias = b - stats.mean @ (roundtrip(clipped, quant) / s - w).T
    return ScaledLinear(clipped.astype(np.float32), bias.astype(np.float32), s.astype(np.float32), alpha)


def scale_layer(layer: dict, stats: dict[str, InputStats], quant: str) -> dict[str, ScaledLinear]:
    """AWQ for one encoder layer's four linear layers; the attention output's 1/s is folded into the
    V rows (and V bias) of Q|K|V before Q|K|V itself is scaled."""
    hs = layer["out"][0].shape[1]
    out = scale_linear(*layer["out"], stats["out"], quant)
    w, b = layer["qkv"]
    fold = np.concatenate([np.ones(2 * hs), 1 / out.scale]).astype(np.float32)
    return {"qkv": scale_linear(w * fold[:, None], b * fold, stats["qkv"], quant), "out": out,
            "fc1": scale_linear(*layer["fc1"], stats["fc1"], quant),
            "fc2": scale_linear(*layer["fc2"], stats["fc2"], quant)}
