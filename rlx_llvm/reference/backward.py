"""NumPy references of the activation backward kernels (semantics.md §2.3)."""
from __future__ import annotations
