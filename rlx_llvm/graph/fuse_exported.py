"""Fusion passes for the patterns ONNX exporters write (torch.onnx, tf2onnx, HF Optimum), run as the
`exported` pass of graph/fuse.py before the patterns our own builders make.

Head-split attention — what a BERT/MiniLM export spells out op by op — becomes one `attention` node:

    q4 = transpose(reshape(Q, [B, S, H, D]), (0, 2, 1, 3))        Q, K, V: [B, S, H·D] projections
    kT = transpose(reshape(K, [B, S, H, D]), (0, 2, 3, 1))        (or (0, 2, 1, 3) then (0, 1, 3, 2))
    scores = (q4 @ kT) / c              (· c or / c on the scores or on q4 / kT, any number of them)
    scores += (1 − keep) · NEG          keep: [B, 1, 1, S] 0/1, NEG ≤ −10⁴ (optional)
    out = reshape(transpose(softmax(scores, −1) @ v4, (0, 2, 1, 3)), [B, S, H·D])
      → attention(Q, K, V, reshape(keep, [B, S]), heads=H, head_dim=D, mask=Custom, scale=1/c)

On hosts with 16 f32 lanes (AVX-512) at any number of keys; elsewhere only while the keys per query are
few (≤ `attention_max_keys()`, 32): beyond that, on the 8-lane hosts measured, the exporter's own
sequence (two BatchedSgemms, the mask region, Softmax, transposes) runs faster than the
Attention thunk, whose per-key dot products lose to the GEMM tiles (1 thread, 12 heads of 32, CPU time,
fused ÷ decomposed: 16 keys 0.94–0.97, 32 keys 1.04, 64 keys 1.51, 128 keys 1.41–1.60, 256 keys 1.61).
Re-measured after the Attention kernel's rework (register-transposed Kᵀ, docs/lowering-attention.md), on the
whole packaged MiniLM-L3 with the fusion at 128 keys ÷ without (interleaved, loaded host, docs/onnx.md):
1 thread 1×128 1.03, 8×128 1.01; 2 threads 0.96, 1.00 — still no gain at one thread, so the limit stays.
On a 16-lane Zen 5 (2026-12-07, same A/B, wall, per-round ratio): 1 thread 1×64 0.98, 1×128 1.00, 1×256 0.975,
8×128 0.92–0.97, 2×512 0.86; 2 threads 0.97, 0.99, 0.98, 0.90–0.94, 0.80 — no length where the sequence wins.

The keep-mask reading is exact for 0/1 masks with NEG = finfo(f32).min (what current exporters write): a
masked score is then min + s = min, whose exp underflows to 0 beside any kept key, and a row whose keys are
all masked is uniform — as the Custom mask's −1e9 overwrite makes it.  With NEG = −10⁴ (older exporters) a
fully masked row differs (ONNX Runtime softmaxes the unmasked scores; we average V uniformly); see
docs/onnx.md.  After the passes, the mask arithmetic no attention reads any more is dropped.

LayerNorm decomposed (what opsets before 17 get) becomes one `layer_norm` node:

    d = x − mean(x, −1);  out = d / sqrt(mean(d·d or d², −1) + eps) · γ + β      (γ, β: [E])
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from ..dtypes import DType
from ..ops import Activation, BinaryOp, MaskKind, ReduceOp
from .core import GraphCore, Node
from .fuse import FusionLog, Rewriter, _binary_pair, _scalar_constant, rewrite_matches, users

HEADS = (0, 2, 1, 3)           # [B, S, H, D] → [B, H, S, D]
HEADS_T = (0, 2, 3, 1)         # [B, S, H, D] → [B, H, D, S]
MASK_NEG_LIMIT = -1e4          # an additive mask value at or below this is "masked out"
ATTENTION_MAX_KEYS: int | None = None  # None: the host's limit, attention_max_keys() (module docstring)
NARROW_HOST_MAX_KEYS = 32      # on hosts under 16 f32 lanes longer key sequences stay BatchedSgemm + Softmax


def attention_max_keys() -> int:
    """Most keys per query an exported attention is fused at: ATTENTION_MAX_KEYS if set, else by host width."""
    if ATTENTION_MAX_KEYS is not None:
        return ATTENTION_MAX_KEYS
    from ..jit import host
    return 2**31 - 1 if host().lanes() >= 16 else NARROW_HOST_MAX_KEYS


@dataclasses.dataclass
class Walk:
    """A backward walk over one candidate pattern, collecting the private nodes it crosses."""

    g: GraphCore
    count: dict[int, int]
    inner: set[int] = dataclasses.field(default_factory=set)

    def private(self, id: int, op: str) -> Node | None:
        """Node `id` if it is an `op` read once, by the pattern, and not an output."""
        n = self.g.nodes[id]
        if n.op != op or self.count[id] != 1 or id in self.g.outputs:
            return None
        self.inner.add(id)
        return n

    def unscaled(self, id: int) -> tuple[float, int]:
        """`(k, x)` with node `id` = `k·x`, stripping private `·c` and `/c` by scalar constants."""
        k = 1.0
        while True:
            n = self.g.nodes[id]
            step = _scalar_factor(self.g, n) if self.count[id] == 1 and id not in self.g.outputs else None
            if step is None:
                return k, id
            self.inner.add(id)
            k, id = k * step[0], step[1]

    def heads(self, id: int, perm: tuple[int, ...]) -> tuple[int, int, int] | None:
        """`(x, H, D)` when node `id` is `transpose(reshape(x, [B, S, H, D]), perm)` of a `[B, S, H·D]` x,
        the transpose possibly written as several."""
        composed, n = None, self.private(id, "transpose")
        while n is not None:
            p = n.attrs["perm"]
            composed = p if composed is None else tuple(p[i] for i in composed)
            id = n.inputs[0]
            n = self.private(id, "transpose")
        r = self.private(id, "reshape")
        if composed != perm or r is None:
            return None
        x = self.g.nodes[r.inputs[0]]
        if len(r.shape) != 4 or len(x.shape) != 3 or x.shape != (*r.shape[:2], r.shape[2] * r.shape[3]):
            return None
        return x.id, r.shape[2], r.shape[3]


def _scalar_factor(g: GraphCore, n: Node) -> tuple[float, int] | None:
    """`(k, x)` when `n` is `x·c`, `c·x` or `x/c` with `c` a nonzero scalar constant and x of n's shape."""
    for op in (BinaryOp.Mul, BinaryOp.Div):
        pair = _binary_pair(g, n.id, op)
        for x, c in (pair, pair[::-1]) if pair else ():
            k = _scalar_constant(g, c)
            if k and g.nodes[x].shape == n.shape and (op is BinaryOp.Mul or c == pair[1]):
                return (k if op is BinaryOp.Mul else 1.0 / k), x
    return None


def keep_mask_of(g: GraphCore, id: int) -> tuple[int, float] | None:
    """`(keep, NEG)` when node `id` is `(1 − keep)·NEG` (either operand order) with NEG ≤ −10⁴."""
    n = g.nodes[id]
    step = _scalar_factor(g, n) if _binary_pair(g, id, BinaryOp.Mul) else None
    if step is None or step[0] > MASK_NEG_LIMIT:
        return None
    diff = _binary_pair(g, step[1], BinaryOp.Sub)
    if not diff or _scalar_constant(g, diff[0]) != 1.0:
        return None
    return diff[1], step[0]


def match_head_split_attention(g: GraphCore, root: Node, count: dict[int, int]) -> dict | None:
    """The head-split attention ending at reshape `root` (module docstring), or None."""
    if root.op != "reshape" or len(root.shape) != 3 or root.dtype != DType.F32:
        return None
    w = Walk(g, count)
    back = w.private(root.inputs[0], "transpose")
    pv = w.private(back.inputs[0], "matmul") if back is not None and back.attrs["perm"] == HEADS else None
    soft = w.private(pv.inputs[0], "softmax") if pv is not None else None
    if soft is None or soft.attrs["axis"] % 4 != 3:
        return None
    scores, keep = soft.inputs[0], None
    added = _binary_pair(g, scores, BinaryOp.Add) if count[scores] == 1 and scores not in g.outputs else None
    for s, bias in (added, added[::-1]) if added else ():
        keep = keep_mask_of(g, bias)
        if keep is not None:
            w.inner.add(scores)
            scores = s
            break
    k_scores, qk_id = w.unscaled(scores)
    qk = w.private(qk_id, "matmul")
    if qk is None:
        return None
    k_q, q4 = w.unscaled(qk.inputs[0])
    k_k, kt = w.unscaled(qk.inputs[1])
    q, k, v = w.heads(q4, HEADS), w.heads(kt, HEADS_T), w.heads(pv.inputs[1], HEADS)
    if None in (q, k, v) or q[1:] != k[1:] or q[1] != v[1]:
        return None
    b, s, _ = g.nodes[q[0]].shape
    kv_seq = g.nodes[k[0]].shape[1]
    if root.shape != (b, s, v[1] * v[2]) or kv_seq > attention_max_keys():
        return None
    if keep is not None and g.nodes[keep[0]].shape != (b, 1, 1, kv_seq):
        return None
    return {"q": q[0], "k": k[0], "v": v[0], "keep": keep and keep[0], "heads": q[1], "head_dim": q[2],
            "scale": k_scores * k_q * k_k, "inner": w.inner - {root.id}}


def fuse_head_split_attention(graph: GraphCore, log: FusionLog) -> GraphCore:
    """Head-split attention as exporters write it → one `attention` node (Custom keep-mask, or none)."""
    keeps: dict[int, int] = {}

    def emit(rw: Rewriter, node: Node, hit: dict) -> None:
        masked = hit["keep"] is not None
        inputs = [rw.map[hit[k]] for k in ("q", "k", "v")] + ([_keep_rows(rw, graph.nodes[hit["keep"]], keeps)]
                                                               if masked else [])
        kind = MaskKind.Custom if masked else MaskKind.None_
        attrs = {"heads": hit["heads"], "head_dim": hit["head_dim"], "mask_kind": kind, "scale": hit["scale"]}
        _append(rw, "attention", tuple(inputs), attrs, node.shape, DType.F32, node.source_id, old=node.id)
        log.add("exported_attention", f"%{node.source_id}: {len(hit['inner']) + 1} nodes of head-split attention "
                                      f"→ Attention ({hit['heads']} heads, {'keep-mask' if masked else 'no mask'})")

    return drop_unread(rewrite_matches(graph, match_head_split_attention, emit))


def _keep_rows(rw: Rewriter, keep: Node, keeps: dict[int, int]) -> int:
    """The f32 `[B, 1, 1, kv_seq]` keep-mask as `[B, kv_seq]` rows (a reshape view) in the new graph, once per mask."""
    if keep.id not in keeps:
        rows = (keep.shape[0], keep.shape[-1])
        keeps[keep.id] = _append(rw, "reshape", (rw.map[keep.id],), {"shape": rows}, rows, DType.F32, keep.source_id)
    return keeps[keep.id]


def _append(rw: Rewriter, op: str, inputs: tuple[int, ...], attrs: dict, shape: tuple, dtype: DType, origin: int,
            old: int | None = None) -> int:
    """Append a new node (inputs already in the new graph's ids); `old`, when given, now maps to it."""
    new = Node(len(rw.new.nodes), op, tuple(inputs), attrs, tuple(shape), dtype, origin=origin)
    rw.new.nodes.append(new)
    if old is not None:
        rw.map[old] = new.id
    return new.id


def drop_unread(graph: GraphCore) -> GraphCore:
    """`graph` without the computed nodes nothing reads (inputs, params and outputs stay)."""
    count = users(graph)
    dead: set[int] = set()
    for node in reversed(graph.nodes):
        if count[node.id] == 0 and node.op not in ("input", "param"):
            dead.add(node.id)
            for i in node.inputs:
                count[i] -= 1
    if not dead:
        return graph
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.id not in dead:
            rw.keep(node)
    return rw.finish()


def _row_mean(w: Walk, id: int) -> Node | None:
    """Node `id` if it is a private mean over the last axis that keeps it (`[…, 1]`)."""
    n = w.private(id, "reduce")
    last = len(n.shape) - 1 if n is not None else -1
    return n if n is not None and n.attrs["op"] is ReduceOp.Mean and n.attrs["axes"] == (last,) \
        and n.attrs["keep_dim"] else None


def _affine(g: GraphCore, id: int, op: BinaryOp) -> tuple[int, int] | None:
    """`(x, p)` when node `id` is `x <op> p` (either order) with `p` a `[E]` vector of x's last dim E."""
    pair = _binary_pair(g, id, op)
    for x, p in (pair, pair[::-1]) if pair else ():
        if g.nodes[p].shape == g.nodes[id].shape[-1:] and g.nodes[x].shape == g.nodes[id].shape:
            return x, p
    return None


def _plus_constant(g: GraphCore, id: int) -> tuple[int, float] | None:
    """`(x, c)` when node `id` is `x + c` (either order) with `c` a scalar constant."""
    pair = _binary_pair(g, id, BinaryOp.Add)
    for x, c in (pair, pair[::-1]) if pair else ():
        if _scalar_constant(g, c) is not None:
            return x, _scalar_constant(g, c)
    return None


def _squared(g: GraphCore, id: int) -> int | None:
    """`d` when node `id` is `d·d` or `d²` (Pow by the constant 2)."""
    mul = _binary_pair(g, id, BinaryOp.Mul)
    if mul and mul[0] == mul[1]:
        return mul[0]
    pow_ = _binary_pair(g, id, BinaryOp.Pow)
    return pow_[0] if pow_ and _scalar_constant(g, pow_[1]) == 2.0 else None


def match_decomposed_layer_norm(g: GraphCore, root: Node, count: dict[int, int]) -> dict | None:
    """The decomposed LayerNorm ending at the `+ β` node `root` (module docstring), or None."""
    w = Walk(g, count)
    shifted = _affine(g, root.id, BinaryOp.Add)                                   # (n·γ, β)
    scaled = _affine(g, shifted[0], BinaryOp.Mul) if shifted and w.private(shifted[0], "binary") else None
    ratio = _binary_pair(g, scaled[0], BinaryOp.Div) if scaled and w.private(scaled[0], "binary") else None
    sqrt = w.private(ratio[1], "activation") if ratio else None                  # n = d / sqrt(var + eps)
    if sqrt is None or sqrt.attrs["act"] is not Activation.Sqrt:
        return None
    plus = _plus_constant(g, sqrt.inputs[0]) if w.private(sqrt.inputs[0], "binary") else None
    var = _row_mean(w, plus[0]) if plus and plus[1] >= 0 else None
    square = w.private(var.inputs[0], "binary") if var is not None else None
    d = ratio[0]
    diff = _binary_pair(g, d, BinaryOp.Sub)
    if square is None or _squared(g, square.id) != d or not diff or d in g.outputs \
            or count[d] != 1 + square.inputs.count(d):
        return None
    mean = _row_mean(w, diff[1])
    if mean is None or mean.inputs[0] != diff[0]:
        return None
    return {"inputs": (diff[0], scaled[1], shifted[1]), "eps": plus[1], "inner": w.inner | {d}}


def fuse_decomposed_layer_norm(graph: GraphCore, log: FusionLog) -> GraphCore:
    """LayerNorm written as mean, difference, variance, sqrt, divide, ·γ + β → one `layer_norm` node."""
    def emit(rw: Rewriter, node: Node, hit: dict) -> None:
        rw.keep(node, op="layer_norm", inputs=hit["inputs"], attrs={"eps": hit["eps"]})
        log.add("exported_layer_norm", f"%{node.source_id}: {len(hit['inner']) + 1} nodes of a decomposed "
                                       f"LayerNorm → LayerNorm (eps {hit['eps']:g})")

    return rewrite_matches(graph, match_decomposed_layer_norm, emit)


ExportedPass = Callable[[GraphCore, FusionLog], GraphCore]
EXPORTED_PASSES: list[ExportedPass] = [fuse_decomposed_layer_norm, fuse_head_split_attention]


def fuse_exported_patterns(graph: GraphCore, log: FusionLog) -> GraphCore:
    """Every exporter-pattern pass, in order."""
    for p in EXPORTED_PASSES:
        graph = p(graph, log)
    return graph
