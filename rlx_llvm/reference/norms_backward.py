"""NumPy references of the norm, cumsum, gather and RoPE backward kernels."""
from __future__ import annotations
