"""Fused kernels for atlas-lab's hot paths (docs/memory.md §5.3), flash-linear-attention style: one folder per
operation, its fast paths and their twin side by side under one signature.

    chunk_linear_memory/  linear memory, l2 / dot, Omega window, gates, gd / momentum: every chunk's products in
                          parallel around one walk over chunk states (triton.py: ``chunk_linear_memory``; naive.py:
                          ``chunk_linear_memory_naive``, its oracle)
    chunk_mlp_memory/     the 2-layer MLP memory (gd / momentum: triton.py ``chunk_mlp_memory``; muon: muon.py
                          ``chunk_mlp_muon``, Newton–Schulz inside): one program per sequence walks the chunks with the
                          weights on chip, one launch forward and one backward (naive.py: the twins)
    newton_schulz/        batched NS_k (quintic / cubic), k steps fused, forward + recomputation backward
                          (triton.py: ``newton_schulz``; cpu.py + cpu.cpp: the compiled CPU kernel)
    limits.py             what the kernels cover (``COVERAGE``), read by the plan (memory/plan.py) without triton
    dots.py, operators.py the kernels' dot precision and their registration as torch operators

Kernels only: the paths of ``memorize`` that call them (memory/dispatch.py: the Triton path, memory/fla.py: fla-core's
kernels) live beside the chunked path, and nothing here imports from the memory package. Nothing here imports triton
until a kernel is asked for: the memory package imports this package (its optimisers use the CPU Newton–Schulz
kernel), on machines without triton too.
On a machine without a GPU the kernels run under Triton's interpreter: set TRITON_INTERPRET=1 before triton
is first imported (triton.language decorates its own helpers then, and these kernels when they are imported).
"""
from __future__ import annotations

from .chunk_linear_memory import chunk_linear_memory, chunk_linear_memory_naive
from .chunk_mlp_memory import chunk_mlp_memory, chunk_mlp_memory_naive
from .newton_schulz import newton_schulz

__all__ = ["newton_schulz", "chunk_linear_memory", "chunk_linear_memory_naive", "chunk_mlp_memory",
           "chunk_mlp_memory_naive"]
