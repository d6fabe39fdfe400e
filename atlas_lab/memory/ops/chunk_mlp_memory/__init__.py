"""Chunked MLP memory (docs/memory.md §3–§5), the fast path and its naive twin under one signature:

    triton.py  chunk_mlp_memory        Triton: one program per sequence walks the chunks with the weights on chip,
                                       one launch forward, one backward (``launches``: their grids and FLOPs)
    naive.py   chunk_mlp_memory_naive  the same computation in plain PyTorch, chunk by chunk (the kernel's oracle)

The equations are in ``triton.py``'s docstring; ``chunk_mlp_memory`` here imports triton on its first call only.
"""
from __future__ import annotations

from .naive import chunk_mlp_memory_naive

__all__ = ["chunk_mlp_memory", "chunk_mlp_memory_naive"]


def chunk_mlp_memory(q, k, v, gamma, a, Cw, W1, W2, We1, We2, *, offset, chunk_size, window, bias, activation,
                     m=None, s=None, Cs=None, S1=None, S2=None, gated=False):
    """``triton.chunk_mlp_memory`` (its docstring), triton imported on the first call."""
    from .triton import chunk_mlp_memory as kernel

    return kernel(q, k, v, gamma, a, Cw, W1, W2, We1, We2, offset=offset, chunk_size=chunk_size, window=window,
                  bias=bias, activation=activation, m=m, s=s, Cs=Cs, S1=S1, S2=S2, gated=gated)
