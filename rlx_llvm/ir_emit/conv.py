"""Convolution and pooling (NCHW / NCDHW) as native code (semantics.md §3.7)."""
from __future__ import annotations
