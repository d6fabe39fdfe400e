"""Chunked linear memory (docs/memory.md §3–§5), the fast path and its naive twin under one signature:

    triton.py  chunk_linear_memory        Triton: every chunk's own products in parallel around one walk over
                                          chunk states, three launches a pass (``launches``: their grids and FLOPs)
    naive.py   chunk_linear_memory_naive  the same computation in plain PyTorch, chunk by chunk (the kernel's oracle)

The equations are in ``triton.py``'s docstring. This package is imported with the memory package (whose optimisers
import the CPU Newton–Schulz kernel of ``ops.newton_schulz``), so ``chunk_linear_memory`` here imports triton on its
first call only.
"""
from __future__ import annotations

from .naive import chunk_linear_memory_naive

__all__ = ["chunk_linear_memory", "chunk_linear_memory_naive"]


def chunk_linear_memory(q, k, v, gamma, a, Cw, W0, We0, *, offset, chunk_size, window, bias,
                        m=None, s=None, Cs=None, S0=None):
    """``triton.chunk_linear_memory``: φ(q) [N, T, D], φ(k) [N, L, D], v [N, L, d_v], gamma [N, L], a [N, T],
    Cw [N, T, b], W0, We0 [N, d_v, D] (momentum: m, s [N, T], Cs [N, T, b], S0 [N, d_v, D]) ->
    (y [N, T, d_v], W_T, S_T or None, W̃ of the last chunk [N, d_v, D]); triton is imported on the first call.
    Float32 dots run in tf32 where torch's float32 matmul precision allows it (``ops.dots.dot_precision``)."""
    from .triton import chunk_linear_memory as kernel

    return kernel(q, k, v, gamma, a, Cw, W0, We0, offset=offset, chunk_size=chunk_size, window=window,
                  bias=bias, m=m, s=s, Cs=Cs, S0=S0)
