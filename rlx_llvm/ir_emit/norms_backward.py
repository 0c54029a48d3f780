"""Backward kernels of the norms, cumsum, gather and RoPE as native code (semantics.md §3.3, §3.12)."""
from __future__ import annotations
