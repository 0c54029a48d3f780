"""Shape and dtype checks shared by the op families' inference rules; each error names the op."""
from __future__ import annotations

from typing import Sequence

from ..dtypes import DType
from .core import DYNAMIC, GraphError, Node


def same_dim(a: int, b: int) -> bool:
    """Equal, or either dynamic."""
    return a == b or DYNAMIC in (a, b)


def shapes_agree(a: Sequence[int], b: Sequence[int]) -> bool:
    """Same rank and every dim `same_dim`."""
    return len(a) == len(b) and all(same_dim(x, y) for x, y in zip(a, b))


def require_f32(op: str, *nodes: Node) -> None:
    """GraphError naming `op` unless every node is f32."""
    if any(n.dtype != DType.F32 for n in nodes):
        raise GraphError(f"{op}: lowered for f32 tensors, got {', '.join(n.dtype.value for n in nodes)}")


def require_rank(op: str, what: str, n: Node, rank: int) -> None:
    """GraphError naming `op` and the shape unless `n` has rank `rank`."""
    if len(n.shape) != rank:
        raise GraphError(f"{op}: {what} must have rank {rank}, got {list(n.shape)}")
