"""Attention on `[batch, seq, heads·head_dim]` rows (one Attention thunk) and rotary embeddings (Rope).

    y = g.attention_kind(q, k, v, num_heads=4, head_dim=16, mask_kind="causal")
    y = g.attention(q, k, v, keep, num_heads=4, head_dim=16)    # keep: [batch, kv_seq], 1 = attend
    q = g.rope(q, cos, sin, head_dim=16)                        # cos/sin: [seq, n_rot/2] half-width tables

Scores are `(q·k)·scale` (`head_dim^−0.5` unless given), masked (semantics.md §2.7: a Custom keep-mask
`< 0.5` or a Causal/Sliding position overwrites the score with −1e9; a Bias `[batch, heads, seq,
kv_seq]` is added), softmaxed per query row, then `Σ p·v`.  Causal queries sit at the end of the
keys (`kv_seq − seq + i`).  K/V may have fewer heads (GQA): `kv_heads = k.shape[-1] // head_dim`.
"""
from __future__ import annotations

from .. import thunks as T
from ..dtypes import DType
from ..ops import MaskKind
from .checks import require_f32, require_rank, shapes_agree
from .core import DYNAMIC, GraphError, Node, Value, numel
from .lower import LowerContext
from .opset import infers, lowers


def mask_kind_of(text: str) -> MaskKind:
    """`"none"`, `"causal"` or `"sliding:N"` (pyrlx's strings) as a MaskKind."""
    name, _, arg = str(text).lower().partition(":")
    if name == "none" and not arg:
        return MaskKind.None_
    if name == "causal" and not arg:
        return MaskKind.Causal
    if name == "sliding" and arg.isdigit():
        return MaskKind.SlidingWindow(int(arg))
    raise GraphError(f"attention_kind: unknown mask kind {text!r} (use \"none\", \"causal\" or \"sliding:N\")")


class AttentionOps:
    """Builders for attention and rotary embeddings (mixed into `Graph`)."""

    def attention(self, q: Value, k: Value, v: Value, mask: "Value | None", num_heads: int, head_dim: int,
                  scale: "float | None" = None) -> Value:
        """Multi-head attention; `mask` is a `[batch, kv_seq]` keep-mask (Custom), a `[batch, heads, seq, kv_seq]`
        additive bias (Bias), or None."""
        if mask is None:
            return self.attention_kind(q, k, v, num_heads, head_dim, "none", scale)
        kind = {2: MaskKind.Custom, 4: MaskKind.Bias}.get(mask.ndim)
        if kind is None:
            raise GraphError(f"attention: mask must be [batch, kv_seq] (keep) or [batch, heads, seq, kv_seq] (bias), "
                             f"got {list(mask.shape)}")
        return self.add_node("attention", (q, k, v, mask), _attrs(num_heads, head_dim, kind, scale))

    def attention_kind(self, q: Value, k: Value, v: Value, num_heads: int, head_dim: int, mask_kind: str = "none",
                       scale: "float | None" = None) -> Value:
        """Multi-head attention with a synthesized mask: "none", "causal" or "sliding:N" (N+1 keys up to the query)."""
        return self.add_node("attention", (q, k, v), _attrs(num_heads, head_dim, mask_kind_of(mask_kind), scale))

    def rope(self, x: Value, cos: Value, sin: Value, head_dim: int, n_rot: "int | None" = None,
             interleaved: bool = False) -> Value:
        """Rotate the first `n_rot` dims (default 2·cos.shape[-1]) of every head of `x [batch, seq, heads·head_dim]`;
        `cos`/`sin` are `[seq, ≥ n_rot/2]` (or `[batch·seq, …]` per token); NeoX halves, or GPT-J pairs."""
        rot = 2 * cos.shape[-1] if n_rot is None and cos.ndim else n_rot
        return self.add_node("rope", (x, cos, sin), {"head_dim": int(head_dim), "n_rot": int(rot or 0),
                                                     "interleaved": bool(interleaved)})


def _attrs(heads: int, head_dim: int, kind: MaskKind, scale: "float | None") -> dict:
    if heads < 1 or head_dim < 1:
        raise GraphError(f"attention: num_heads and head_dim must be ≥ 1, got {heads} and {head_dim}")
    return {"heads": int(heads), "head_dim": int(head_dim), "mask_kind": kind,
            "scale": float(head_dim ** -0.5 if scale is None else scale)}


@infers("attention")
def _infer_attention(ins: list[Node], attrs: dict) -> tuple:
    q, k, v = ins[:3]
    for what, n in (("q", q), ("k", k), ("v", v)):
        require_rank("attention", f"{what} ([batch, seq, heads·head_dim])", n, 3)
    require_f32("attention", *ins)
    h, d = attrs["heads"], attrs["head_dim"]
    if q.shape[2] != h * d:
        raise GraphError(f"attention: q {list(q.shape)} must end in num_heads·head_dim = {h}·{d}")
    kv_heads = k.shape[2] // d
    if k.shape[2] % d or kv_heads < 1 or h % kv_heads or v.shape[2] % kv_heads:
        raise GraphError(f"attention: k {list(k.shape)} and v {list(v.shape)} must end in kv_heads·head_dim with "
                         f"kv_heads dividing num_heads = {h} (head_dim {d})")
    if not (shapes_agree(q.shape[:1], k.shape[:1]) and shapes_agree(k.shape[:2], v.shape[:2])):
        raise GraphError(f"attention: q {list(q.shape)}, k {list(k.shape)} and v {list(v.shape)} disagree on "
                         f"batch or kv_seq")
    if len(ins) == 4:
        mask = ins[3]
        want = (q.shape[0], k.shape[1]) if attrs["mask_kind"] == MaskKind.Custom else \
            (q.shape[0], h, q.shape[1], k.shape[1])
        if not shapes_agree(mask.shape, want):
            raise GraphError(f"attention: mask {list(mask.shape)} does not match {list(want)} for q {list(q.shape)} "
                             f"and k {list(k.shape)}")
    return (q.shape[0], q.shape[1], h * (v.shape[2] // kv_heads)), DType.F32


@lowers("attention")
def lower_attention(ctx: LowerContext, node: Node) -> None:
    """One Attention thunk over contiguous `[B, S, H·D]` rows (mask offset unused without a mask buffer)."""
    q, k, v = (ctx.node(i) for i in node.inputs[:3])
    h, d = node.attrs["heads"], node.attrs["head_dim"]
    (q_col, _, q_row), (k_col, k_width, k_row), (v_col, v_width, v_row) = (
        strided_read(node, i, ctx.node(node.inputs[i])) for i in range(3))
    kv_heads = k_width // d
    dv = v_width // kv_heads
    iq, ik, iv = node.inputs[:3]
    im = node.inputs[3] if len(node.inputs) == 4 else None
    ctx.emit(lambda at: T.Attention(
        q=at(iq) + 4 * q_col, k=at(ik) + 4 * k_col, v=at(iv) + 4 * v_col, mask=0 if im is None else at(im),
        out=at(node.id), batch=q.shape[0], seq=q.shape[1], kv_seq=k.shape[1], heads=h, kv_heads=kv_heads,
        head_dim=d, v_head_dim=dv, mask_kind=node.attrs["mask_kind"], scale=node.attrs["scale"], softcap=0.0,
        q_row_stride=q_row, k_row_stride=k_row, v_row_stride=v_row, bhsd=False),
        reads=list(node.inputs), writes=[node.id])


def strided_read(node: Node, i: int, src: Node) -> tuple[int, int, int]:
    """`(start column, width, row stride)` of input `i`: the whole rows, or the columns a `strided_reads`
    fusion recorded when the input is a last-axis narrow read in place."""
    return node.attrs.get("strided", {}).get(i, (0, src.shape[-1], src.shape[-1]))


@infers("rope")
def _infer_rope(ins: list[Node], attrs: dict) -> tuple:
    x, cos, sin = ins
    require_rank("rope", "x ([batch, seq, heads·head_dim])", x, 3)
    require_rank("rope", "cos ([seq, n_rot/2])", cos, 2)
    require_f32("rope", x, cos, sin)
    d, rot = attrs["head_dim"], attrs["n_rot"]
    if d < 1 or x.shape[2] % d:
        raise GraphError(f"rope: x {list(x.shape)} must end in a multiple of head_dim {d}")
    if sin.shape != cos.shape or rot % 2 or not 0 < rot <= d or 2 * cos.shape[1] < rot:
        raise GraphError(f"rope: cos {list(cos.shape)} and sin {list(sin.shape)} must be equal [rows, ≥ n_rot/2] "
                         f"tables with n_rot {rot} even and ≤ head_dim {d}")
    b, s, rows = x.shape[0], x.shape[1], cos.shape[0]
    if DYNAMIC not in (b, s) and rows not in (s, b * s):
        raise GraphError(f"rope: cos {list(cos.shape)} needs seq = {s} rows (or batch·seq = {b * s}) for "
                         f"x {list(x.shape)}")
    return x.shape, DType.F32


@lowers("rope")
def lower_rope(ctx: LowerContext, node: Node) -> None:
    """One Rope thunk (table row per position, or per token when the tables have batch·seq rows)."""
    ix, ic, isin = node.inputs
    b, s, hidden = node.shape
    cos = ctx.node(ic)
    col, _, row = strided_read(node, 0, ctx.node(ix))
    ctx.emit(lambda at: T.Rope(src=at(ix) + 4 * col, cos=at(ic), sin=at(isin), dst=at(node.id), batch=b, seq=s,
                               hidden=hidden, head_dim=node.attrs["head_dim"], n_rot=node.attrs["n_rot"],
                               cos_len=numel(cos.shape), cos_row_stride=cos.shape[1], src_row_stride=row,
                               interleaved=node.attrs["interleaved"]), reads=[ix, ic, isin], writes=[node.id])
