"""NumPy references of convolution and pooling (semantics.md §3.7)."""
from __future__ import annotations
