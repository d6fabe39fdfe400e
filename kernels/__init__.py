"""Triton kernels for atlas-lab's hot paths (docs/memory.md §5.3), imported as ``atlas_lab.kernels``.

    newton_schulz        batched NS_k (quintic / cubic), k steps fused, forward + recomputation backward
    chunk_linear_memory  linear memory, l2 / dot, Omega window, gates, gd / momentum, one launch per pass
    memorize_triton      ``memorize(..., impl="triton")`` on top of them (coverage: ``COVERAGE``)

On a machine without a GPU the kernels run under Triton's interpreter: set TRITON_INTERPRET=1 before triton
is first imported (triton.language decorates its own helpers then, and these kernels when they are imported).
"""
from .chunk_linear_memory import chunk_linear_memory
from .dispatch import COVERAGE, INTERPRETED, memorize_triton, unsupported
from .naive import chunk_linear_memory_naive
from .newton_schulz import newton_schulz

__all__ = ["newton_schulz", "chunk_linear_memory", "chunk_linear_memory_naive", "memorize_triton", "unsupported",
           "COVERAGE", "INTERPRETED"]
