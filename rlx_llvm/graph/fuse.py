"""Fusion passes over a specialized graph; each rewrites nodes and logs what fired.

Passes run in `PASSES` order.  A pass is `fn(graph, log) -> graph`; it builds a new graph with
`Rewriter` (which renumbers ids and keeps inputs, params and outputs pointing at the right nodes).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from ..ops import Input, Step
from .core import GraphCore, Node
from .elementwise import ELEMENTWISE, REGION_DTYPES, chain_of
from ..dtypes import DType
from ..ops import Activation, BinaryOp, MaskKind

MAX_REGION_INPUTS = 16
MAX_REGION_STEPS = 32


@dataclasses.dataclass
class FusionLog:
    """What each pass did: `(pass name, description)` in order."""

    entries: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def add(self, name: str, text: str) -> None:
        """Record one rewrite."""
        self.entries.append((name, text))

    def count(self, name: str) -> int:
        """How many times pass `name` fired."""
        return sum(1 for n, _ in self.entries if n == name)

    def __str__(self) -> str:
        if not self.entries:
            return "fusions: none"
        return "fusions:\n" + "\n".join(f"  {n}: {t}" for n, t in self.entries)


def users(graph: GraphCore) -> dict[int, int]:
    """How many times each node is read (an output counts as a reader)."""
    count = {n.id: 0 for n in graph.nodes}
    for n in graph.nodes:
        for i in n.inputs:
            count[i] += 1
    for o in graph.outputs:
        count[o] += 1
    return count


class Rewriter:
    """Builds the rewritten graph: `keep(node)` copies a node (remapping inputs), `drop(id, into)` forwards."""

    def __init__(self, graph: GraphCore) -> None:
        self.old = graph
        self.new = type(graph).__new__(type(graph))
        GraphCore.__init__(self.new, graph.name)
        self.map: dict[int, int] = {}

    def keep(self, node: Node, **changes) -> int:
        """Append `node` (with `changes`) to the new graph; its inputs are remapped."""
        inputs = tuple(self.map[i] for i in changes.pop("inputs", node.inputs))
        new = dataclasses.replace(node, id=len(self.new.nodes), inputs=inputs, origin=node.source_id, **changes)
        self.new.nodes.append(new)
        self.map[node.id] = new.id
        return new.id

    def finish(self) -> GraphCore:
        """The new graph, its inputs/params/outputs remapped."""
        g = self.new
        g.inputs = {k: self.map[v] for k, v in self.old.inputs.items() if v in self.map}
        g.params = {k: self.map[v] for k, v in self.old.params.items() if v in self.map}
        g.outputs = [self.map[o] for o in self.old.outputs]
        g.param_values = self.old.param_values
        return g


def _fusible(node: Node) -> bool:
    if node.op not in ELEMENTWISE and node.op != "region":
        return False
    if node.op == "activation" and node.attrs["act"] is Activation.Gelu:
        return False
    return node.dtype in REGION_DTYPES or node.dtype == DType.Bool


def fuse_regions(graph: GraphCore, log: FusionLog) -> GraphCore:
    """Chains of element-wise ops → one `region` node per chain (≤ 16 inputs, ≤ 32 steps).

    A producer joins its consumer's region when it is element-wise, read only by that consumer, not an
    output, and of the consumer's shape (so it is computed once per output element)."""
    count = users(graph)
    regions: dict[int, tuple[list[int], list]] = {}    # node → (external inputs, chain)
    absorbed: set[int] = set()
    for node in graph.nodes:
        if not _fusible(node):
            continue
        ext: list[int] = []
        chain: list = []
        operands = []
        one = chain_of(node)[0] if node.op != "region" else None
        for j, src in enumerate(node.inputs):
            p = graph.nodes[src]
            sub = regions.get(src)
            if (sub and count[src] == 1 and p.shape == node.shape and node.op != "region"
                    and len(set(ext) | set(sub[0]) | set(node.inputs[j + 1:])) <= MAX_REGION_INPUTS
                    and len(chain) + len(sub[1]) + 1 <= MAX_REGION_STEPS):
                operands.append(_splice(sub, ext, chain))
                absorbed.add(src)
            else:
                operands.append(Input(_index(ext, src)))
        if node.op == "region":
            regions[node.id] = (list(node.inputs), list(node.attrs["chain"]))
            continue
        chain.append(_with_operands(one, operands))
        regions[node.id] = (ext, chain)
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.id in absorbed:
            continue
        ext, chain = regions.get(node.id, (None, None))
        if chain is not None and len(chain) > 1:
            rw.keep(node, op="region", inputs=tuple(ext),
                    attrs={"chain": tuple(chain), "dtype": node.dtype, "shape": node.shape})
            log.add("region", f"%{node.source_id}: {len(chain)} element-wise ops → one ElementwiseRegion over "
                              f"{len(ext)} input(s)")
        else:
            rw.keep(node)
    return rw.finish()


def _index(ext: list[int], src: int) -> int:
    if src not in ext:
        ext.append(src)
    return ext.index(src)


def _splice(sub: tuple[list[int], list], ext: list[int], chain: list):
    """Append a producer's chain to `chain` (its inputs re-indexed into `ext`); the operand of its result."""
    sub_ext, sub_chain = sub
    base = len(chain)

    def remap(op):
        return Input(_index(ext, sub_ext[op.index])) if isinstance(op, Input) else Step(op.index + base)

    for step in sub_chain:
        chain.append(_with_operands(step, [remap(o) for o in _operands(step)]))
    return Step(len(chain) - 1)


_OPERAND_FIELDS = ("x", "lhs", "rhs", "cond", "on_true", "on_false")


def _operands(step) -> list:
    return [getattr(step, f) for f in _OPERAND_FIELDS if hasattr(step, f)]


def _with_operands(step, operands: list):
    names = [f for f in _OPERAND_FIELDS if hasattr(step, f)]
    return dataclasses.replace(step, **dict(zip(names, operands)))


# ── pattern passes ─────────────────────────────────────────────────────────


class Match:
    """Walks a candidate pattern backwards from its root; `ok` turns False at the first mismatch."""

    def __init__(self, graph: GraphCore, count: dict[int, int]) -> None:
        self.g, self.count, self.ok, self.inner = graph, count, True, set()

    def node(self, id: int, kind: str, private: bool = True, **attrs) -> Node | None:
        """Node `id` if it is op `kind` with `attrs` (and, when `private`, read only inside the pattern)."""
        n = self.g.nodes[id]
        if not self.ok or n.op != kind or any(n.attrs.get(k) != v for k, v in attrs.items()) \
                or (private and (self.count[id] != 1 or id in self.g.outputs)):
            self.ok = False
            return None
        self.inner.add(id)
        return n

    def add(self, id: int, private: bool = True) -> tuple[int, int] | None:
        """The operands of a binary add."""
        n = self.node(id, "binary", private, op=BinaryOp.Add)
        return n.inputs if n else None

    def bias_of(self, id: int, private: bool = True) -> tuple[int, int] | None:
        """`(matmul node, bias)` of `matmul(·) + bias` with a 1-D bias of the output's last dim."""
        pair = self.add(id, private)
        if not pair:
            return None
        for mm, b in (pair, pair[::-1]):
            m, bias = self.g.nodes[mm], self.g.nodes[b]
            if m.op == "matmul" and self.count[mm] == 1 and mm not in self.g.outputs \
                    and bias.shape == m.shape[-1:] and len(self.g.nodes[m.inputs[1]].shape) == 2:
                self.inner.add(mm)
                return mm, b
        self.ok = False
        return None


def _residual(m: Match, id: int, res: int) -> int | None:
    """The non-residual operand of the private add `id` whose other operand is `res`."""
    pair = m.add(id)
    if pair and res in pair:
        return pair[1] if pair[0] == res else pair[0]
    m.ok = False
    return None


def match_bert_layer(g: GraphCore, root: Node, count: dict[int, int]) -> dict | None:
    """The post-LN BERT layer ending at layer_norm `root` (FusedBertLayer's math), or None."""
    if root.op != "layer_norm":
        return None
    r2, g2, b2 = root.inputs
    # r2 = (gelu(n1 @ W1 + c1) @ W2 + c2) + n1; n1 = layer_norm((attn @ Wo + co) + x)
    for n1_id in g.nodes[r2].inputs if g.nodes[r2].op == "binary" else ():
        n1 = g.nodes[n1_id]
        if n1.op != "layer_norm":
            continue
        m = Match(g, count)
        fc2 = _residual(m, r2, n1_id)
        fc2_mm, c2 = (m.bias_of(fc2) if m.ok else None) or (None, None)
        gelu = m.node(g.nodes[fc2_mm].inputs[0], "activation", act=Activation.Gelu) if m.ok else None
        fc1_mm, c1 = (m.bias_of(gelu.inputs[0]) if gelu else None) or (None, None)
        if not m.ok or g.nodes[fc1_mm].inputs[0] != n1_id:
            continue
        r1, g1, b1 = n1.inputs
        m.inner.add(n1_id)
        pair = m.add(r1)
        if not pair:
            continue
        for proj, x in (pair, pair[::-1]):
            sub = Match(g, count)
            sub.inner = set(m.inner)
            out_mm, co = sub.bias_of(proj) or (None, None)
            attn = sub.node(g.nodes[out_mm].inputs[0], "attention", mask_kind=MaskKind.Custom) if sub.ok else None
            if attn is None or len(attn.inputs) != 4:
                continue
            qkv = [sub.node(i, "narrow", private=True) for i in attn.inputs[:3]]
            if not sub.ok or len({q.inputs[0] for q in qkv}) != 1:
                continue
            hs = g.nodes[x].shape[-1]
            if [(q.attrs["axis"] % 3, q.attrs["start"], q.attrs["length"]) for q in qkv] != \
                    [(2, 0, hs), (2, hs, hs), (2, 2 * hs, hs)]:
                continue
            qkv_mm, cqkv = sub.bias_of(qkv[0].inputs[0], private=False) or (None, None)
            if not sub.ok or g.nodes[qkv_mm].inputs[0] != x or count[qkv[0].inputs[0]] != 3:
                continue
            nh, dh = attn.attrs["heads"], attn.attrs["head_dim"]
            if nh * dh != hs or abs(attn.attrs["scale"] - dh ** -0.5) > 1e-7 * dh ** -0.5:
                continue
            w = lambda mm: g.nodes[mm].inputs[1]  # noqa: E731
            inputs = (x, w(qkv_mm), cqkv, w(out_mm), co, attn.inputs[3], g1, b1, w(fc1_mm), c1, w(fc2_mm), c2, g2, b2)
            return {"inputs": inputs, "attrs": {"eps1": n1.attrs["eps"], "eps2": root.attrs["eps"], "heads": nh,
                                                "head_dim": dh, "int_dim": g.nodes[w(fc1_mm)].shape[1]},
                    "inner": sub.inner | {qkv[0].inputs[0], r2, r1}}
    return None


def rewrite_matches(graph: GraphCore, match: Callable[[GraphCore, Node, dict[int, int]], dict | None],
                    emit: Callable[[Rewriter, Node, dict], None]) -> GraphCore:
    """`graph` with every node `match` takes (a dict holding the pattern's `inner` nodes) replaced by `emit`'s
    node(s) and the inner nodes dropped; a match that overlaps an earlier one is left as it is."""
    count = users(graph)
    found, taken = {}, set()
    for node in graph.nodes:
        hit = match(graph, node, count)
        if hit and not hit["inner"] & taken:
            found[node.id] = hit
            taken |= hit["inner"]
    if not found:
        return graph
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.id in found:
            emit(rw, node, found[node.id])
        elif node.id not in taken:
            rw.keep(node)
    return rw.finish()


def fuse_bert_layers(graph: GraphCore, log: FusionLog) -> GraphCore:
    """Post-LN BERT layers (QKV matmul, narrows, attention, projection, residual LN, GELU FFN, residual LN)
    → one `fused_bert_layer` node each (FusedBertLayer)."""
    def emit(rw: Rewriter, node: Node, hit: dict) -> None:
        rw.keep(node, op="fused_bert_layer", inputs=hit["inputs"], attrs=hit["attrs"])
        log.add("bert_layer", f"%{node.source_id}: {len(hit['inner']) + 1} nodes → FusedBertLayer")

    return rewrite_matches(graph, match_bert_layer, emit)


NORMS = ("layer_norm", "rms_norm")


def match_residual_norm(g: GraphCore, root: Node, count: dict[int, int]) -> dict | None:
    """`norm(x + res, γ, β)` (LayerNorm or RmsNorm; the add private, x and res of the norm's shape), or None."""
    if root.op not in NORMS:
        return None
    m = Match(g, count)
    pair = m.add(root.inputs[0])
    if not m.ok or any(g.nodes[i].shape != root.shape or g.nodes[i].dtype != DType.F32 for i in pair):
        return None
    return {"inputs": (*pair, *root.inputs[1:]), "inner": m.inner}


def fuse_residual_norms(graph: GraphCore, log: FusionLog) -> GraphCore:
    """`norm(x + res)` → one `residual_norm` node (FusedResidualLN / FusedResidualRmsNorm): the sum is
    recomputed in the norm's passes, never written."""
    def emit(rw: Rewriter, node: Node, hit: dict) -> None:
        rw.keep(node, op="residual_norm", inputs=hit["inputs"], attrs={**node.attrs, "norm": node.op})
        log.add("residual_norm", f"%{node.source_id}: {node.op}(x + residual) → FusedResidual"
                                 f"{'LN' if node.op == 'layer_norm' else 'RmsNorm'}")

    return rewrite_matches(graph, match_residual_norm, emit)


FUSABLE_ACTS = {Activation.Gelu, Activation.GeluApprox, Activation.Relu, Activation.Silu, Activation.Sigmoid,
                Activation.Tanh}


def fuse_matmul_bias_act(graph: GraphCore, log: FusionLog) -> GraphCore:
    """`act(x @ W + b)` (W 2-D, b its last dim, act optional) → one `fused_matmul_bias_act` node."""
    count = users(graph)
    found: dict[int, tuple] = {}
    dead: set[int] = set()
    for node in graph.nodes:
        m = Match(graph, count)
        act, add = None, node.id
        if node.op == "activation" and node.attrs["act"] in FUSABLE_ACTS and node.dtype == DType.F32:
            act, add = node.attrs["act"], node.inputs[0]
            if graph.nodes[add].op != "binary" or count[add] != 1 or add in graph.outputs:
                continue
        elif node.op != "binary":
            continue
        hit = m.bias_of(add, private=act is not None)
        if not m.ok or not hit or (m.inner & dead) or node.id in dead:
            continue
        mm, bias = hit
        if act is None and any(graph.nodes[u].op == "activation" and graph.nodes[u].attrs["act"] in FUSABLE_ACTS
                               and add in graph.nodes[u].inputs for u in range(node.id + 1, len(graph.nodes))):
            continue   # its activation will take the whole chain
        found[node.id] = (graph.nodes[mm].inputs[0], graph.nodes[mm].inputs[1], bias, act)
        dead |= m.inner - {node.id}
    if not found:
        return graph
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.id in found:
            x, w, b, act = found[node.id]
            rw.keep(node, op="fused_matmul_bias_act", inputs=(x, w, b), attrs={"act": act})
            log.add("matmul_bias_act", f"%{node.source_id}: matmul + bias{' + ' + act.name if act else ''} → FusedMmBiasAct")
        elif node.id not in dead:
            rw.keep(node)
    return rw.finish()


def _swaps_last_two(node: Node) -> bool:
    perm = node.attrs.get("perm", ())
    return node.op == "transpose" and len(perm) >= 2 and \
        tuple(perm) == (*range(len(perm) - 2), len(perm) - 1, len(perm) - 2)


def fuse_transposed_matmul(graph: GraphCore, log: FusionLog) -> GraphCore:
    """`matmul(a, transpose(b))` (last two axes swapped, 2-D) → `matmul_t` (SgemmT reads b as stored);
    likewise a transposed 2-D `a`."""
    count = users(graph)
    found: dict[int, tuple] = {}
    dead: set[int] = set()
    for node in graph.nodes:
        if node.op != "matmul":
            continue
        a, b = (graph.nodes[i] for i in node.inputs)
        flags, inputs = [], list(node.inputs)
        for k, (x, rank_ok) in enumerate(((a, len(a.shape) == 2), (b, len(b.shape) == 2))):
            private = count[x.id] == 1 and x.id not in graph.outputs and x.id not in dead
            take = _swaps_last_two(x) and rank_ok and private
            flags.append(take)
            if take:
                inputs[k] = x.inputs[0]
        if any(flags) and len(graph.nodes[node.inputs[1]].shape) == 2:
            found[node.id] = (tuple(inputs), {"ta": flags[0], "tb": flags[1]})
            dead |= {x.id for x, f in zip((a, b), flags) if f}
    if not found:
        return graph
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.id in found:
            inputs, attrs = found[node.id]
            rw.keep(node, op="matmul_t", inputs=inputs, attrs=attrs)
            log.add("matmul_t", f"%{node.source_id}: matmul of a transposed operand → SgemmT "
                                f"(ta={attrs['ta']}, tb={attrs['tb']})")
        elif node.id not in dead:
            rw.keep(node)
    return rw.finish()


def _scalar_constant(graph: GraphCore, id: int) -> float | None:
    n = graph.nodes[id]
    return float(n.attrs["data"].reshape(-1)[0]) if n.op == "constant" and n.attrs["data"].size == 1 else None


def _binary_pair(graph: GraphCore, id: int, op: BinaryOp) -> tuple[int, int] | None:
    n = graph.nodes[id]
    return n.inputs if n.op == "binary" and n.attrs["op"] is op and n.dtype == DType.F32 else None


def _scaled(graph: GraphCore, id: int) -> tuple[float, int] | None:
    """`(c, x)` when node `id` is `c · x` with `c` a scalar constant (either order)."""
    pair = _binary_pair(graph, id, BinaryOp.Mul)
    for c, x in (pair, pair[::-1]) if pair else ():
        if _scalar_constant(graph, c) is not None and graph.nodes[x].shape == graph.nodes[id].shape:
            return _scalar_constant(graph, c), x
    return None


def fuse_sgd_momentum(graph: GraphCore, log: FusionLog) -> GraphCore:
    """`v' = mom·v + g; p' = p − lr·v'` (lr, mom scalar constants; v' read only there or as an output)
    → `sgd_momentum` writing p' and v' in one SgdMomentum."""
    count = users(graph)
    found: dict[int, dict] = {}
    for node in graph.nodes:
        pair = _binary_pair(graph, node.id, BinaryOp.Sub)
        step = _scaled(graph, pair[1]) if pair else None
        if not step or count[pair[1]] != 1 or pair[1] in graph.outputs:
            continue
        lr, v_new = step
        velocity = _binary_pair(graph, v_new, BinaryOp.Add)
        for mv, g in (velocity, velocity[::-1]) if velocity else ():
            inner = _scaled(graph, mv)
            readers = count[v_new] - (v_new in graph.outputs)
            if inner and count[mv] == 1 and mv not in graph.outputs and readers == 1 and \
                    len({graph.nodes[i].shape for i in (pair[0], inner[1], g, node.id)}) == 1:
                found[node.id] = {"inputs": (pair[0], inner[1], g, v_new), "lr": lr, "mom": inner[0],
                                  "dead": {pair[1], mv}, "velocity": v_new}
                break
    if not found:
        return graph
    dead = set().union(*[f["dead"] for f in found.values()])
    velocities = {f["velocity"]: f for f in found.values()}
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.id in velocities:
            rw.keep(node, op="sgd_velocity", inputs=(), attrs={})
        elif node.id in found:
            f = found[node.id]
            rw.keep(node, op="sgd_momentum", inputs=f["inputs"], attrs={"lr": f["lr"], "mom": f["mom"]})
            log.add("sgd_momentum", f"%{node.source_id}: p − lr·(mom·v + g) → SgdMomentum (lr={f['lr']}, mom={f['mom']})")
        elif node.id not in dead:
            rw.keep(node)
    return rw.finish()


def fuse_bias_add(graph: GraphCore, log: FusionLog) -> GraphCore:
    """A lone `x + b` with `b` the last dim of `x` (what no region took) → `bias_add` (BiasAdd)."""
    hits = []
    for node in graph.nodes:
        pair = _binary_pair(graph, node.id, BinaryOp.Add)
        if pair and node.shape and len(node.shape) >= 2:
            x, b = (graph.nodes[i] for i in pair)
            for x, b in ((x, b), (b, x)):
                if x.shape == node.shape and b.shape == node.shape[-1:] and x.dtype == b.dtype == DType.F32:
                    hits.append((node.id, (x.id, b.id)))
                    break
    if not hits:
        return graph
    found = dict(hits)
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.id in found:
            rw.keep(node, op="bias_add", inputs=found[node.id], attrs={})
            log.add("bias_add", f"%{node.source_id}: trailing-shape bias add → BiasAdd")
        else:
            rw.keep(node)
    return rw.finish()


def _near(value: float | None, target: float) -> bool:
    return value is not None and abs(value - target) <= 1e-6 * abs(target)


def readers(graph: GraphCore) -> dict[int, list[int]]:
    """The ids of the nodes that read each node, in graph order."""
    out: dict[int, list[int]] = {n.id: [] for n in graph.nodes}
    for n in graph.nodes:
        for i in dict.fromkeys(n.inputs):
            out[i].append(n.id)
    return out


def _only_reader(graph: GraphCore, count: dict[int, int], reader: dict[int, list[int]], id: int) -> Node | None:
    """The one node reading `id` (None when `id` has other readers or is an output)."""
    if count[id] != 1 or id in graph.outputs:
        return None
    return graph.nodes[reader[id][0]]


def _gelu_root(graph: GraphCore, count: dict[int, int], reader: dict[int, list[int]], erf: Node
               ) -> tuple[int, int, set[int]] | None:
    """`(root, x, inner nodes)` when `erf` sits in `0.5·x·(1 + erf(x/√2))` (any association of the product)."""
    scaled = graph.nodes[erf.inputs[0]]
    pair = scaled.inputs if scaled.op == "binary" and count[scaled.id] == 1 else ()
    x = None
    for a, c in (pair, pair[::-1]) if pair else ():
        k = _scalar_constant(graph, c)
        if (scaled.attrs["op"] is BinaryOp.Div and c == pair[1] and _near(k, 2 ** 0.5)) or \
                (scaled.attrs["op"] is BinaryOp.Mul and _near(k, 2 ** -0.5)):
            x = a
    one_plus = _only_reader(graph, count, reader, erf.id)
    if x is None or one_plus is None or one_plus.op != "binary" or one_plus.attrs["op"] is not BinaryOp.Add or \
            not any(_near(_scalar_constant(graph, i), 1.0) for i in one_plus.inputs):
        return None
    inner = {scaled.id, erf.id, one_plus.id}
    m1 = _only_reader(graph, count, reader, one_plus.id)
    if m1 is None or m1.op != "binary" or m1.attrs["op"] is not BinaryOp.Mul:
        return None
    other = m1.inputs[0] if m1.inputs[1] == one_plus.id else m1.inputs[1]
    half = _scaled(graph, other)
    if half and _near(half[0], 0.5) and half[1] == x and count[other] == 1:        # (0.5·x)·(1 + erf)
        return m1.id, x, inner | {other}
    m2 = _only_reader(graph, count, reader, m1.id)
    pair = _binary_pair(graph, m2.id, BinaryOp.Mul) if m2 is not None else None
    if not pair or m1.id not in pair:
        return None
    last = pair[1] if pair[0] == m1.id else pair[0]
    if (other == x and _near(_scalar_constant(graph, last), 0.5)) or \
            (_near(_scalar_constant(graph, other), 0.5) and last == x):
        return m2.id, x, inner | {m1.id}                            # (x·(1 + erf))·0.5 or ((1 + erf)·0.5)·x
    return None


def fuse_erf_gelu(graph: GraphCore, log: FusionLog) -> GraphCore:
    """`0.5·x·(1 + erf(x/√2))` as exporters write it → one erf-form `gelu` activation."""
    count, reader = users(graph), readers(graph)
    found: dict[int, int] = {}
    dead: set[int] = set()
    for node in graph.nodes:
        if node.op == "activation" and node.attrs["act"] is Activation.Erf and node.dtype == DType.F32:
            hit = _gelu_root(graph, count, reader, node)
            if hit and not (hit[2] & dead):
                found[hit[0]] = hit[1]
                dead |= hit[2]
    if not found:
        return graph
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.id in found:
            rw.keep(node, op="activation", inputs=(found[node.id],), attrs={"act": Activation.Gelu})
            log.add("erf_gelu", f"%{node.source_id}: 0.5·x·(1 + erf(x/√2)) → gelu")
        elif node.id not in dead:
            rw.keep(node)
    return rw.finish()


STRIDED_READERS = {"attention": (0, 1, 2), "rope": (0,)}


def fuse_strided_reads(graph: GraphCore, log: FusionLog) -> GraphCore:
    """Attention's q/k/v and Rope's x that are last-axis `narrow`s of a `[B, S, W]` tensor (read by nothing
    else) are read in place through the thunks' row strides — no Narrow copy (RLX's Narrow→Rope and
    Narrow×3→Attention rewrites).  The reader records `strided[i] = (start column, width, source width)`."""
    count = users(graph)
    found: dict[int, dict] = {}
    dead: set[int] = set()
    for node in graph.nodes:
        slots = STRIDED_READERS.get(node.op, ())
        strided, inputs = {}, list(node.inputs)
        for i in slots:
            n = graph.nodes[node.inputs[i]]
            src = graph.nodes[n.inputs[0]] if n.op == "narrow" else None
            if src is not None and len(src.shape) == 3 and n.attrs["axis"] % 3 == 2 and count[n.id] == 1 \
                    and n.id not in graph.outputs and n.id not in dead and src.dtype == n.dtype:
                strided[i] = (n.attrs["start"], n.attrs["length"], src.shape[2])
                inputs[i] = src.id
                dead.add(n.id)
        if strided:
            found[node.id] = {"inputs": tuple(inputs), "strided": strided}
    if not found:
        return graph
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.id in found:
            f = found[node.id]
            rw.keep(node, inputs=f["inputs"], attrs={**node.attrs, "strided": f["strided"]})
            log.add("strided_reads", f"%{node.source_id}: {node.op} reads {len(f['strided'])} narrow(s) in place "
                                     f"by row stride")
        elif node.id not in dead:
            rw.keep(node)
    return rw.finish()


def fuse_exported(graph: GraphCore, log: FusionLog) -> GraphCore:
    """The patterns ONNX exporters write (graph/fuse_exported.py; imported here, as it builds on this module)."""
    from .fuse_exported import fuse_exported_patterns
    return fuse_exported_patterns(graph, log)


def fuse_conv(graph: GraphCore, log: FusionLog) -> GraphCore:
    """Narrow-output conv2d + bias + activation → Im2Col + FusedMmBiasAct (graph/fuse_conv.py)."""
    from .fuse_conv import fuse_conv_bias_act
    return fuse_conv_bias_act(graph, log)


Pass = Callable[[GraphCore, FusionLog], GraphCore]
PASSES: list[Pass] = [fuse_conv, fuse_erf_gelu, fuse_exported, fuse_bert_layers, fuse_strided_reads, fuse_matmul_bias_act,
                      fuse_residual_norms, fuse_transposed_matmul, fuse_sgd_momentum, fuse_regions, fuse_bias_add]


def fuse(graph: GraphCore) -> tuple[GraphCore, FusionLog]:
    """Run every pass in order."""
    log = FusionLog()
    for p in PASSES:
        graph = p(graph, log)
    return graph, log
