"""Activation backward kernels as native code (semantics.md §2.3 derivatives)."""
from __future__ import annotations
