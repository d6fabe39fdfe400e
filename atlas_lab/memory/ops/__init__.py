"""Fused kernels for atlas-lab's hot paths (docs/memory.md §5.3), flash-linear-attention style: one folder per
operation, its fast paths and their twin side by side under one signature.

    chunk_linear_memory/  linear memory, l2 / dot, Omega window, gates, gd / momentum: every chunk's products in
                          parallel around one walk over chunk states (triton.py: ``chunk_linear_memory``; naive.py:
                          ``chunk_linear_memory_naive``, its oracle)
    newton_schulz/        batched NS_k (quintic / cubic), k steps fused, forward + recomputation backward
                          (triton.py: ``newton_schulz``; cpu.py + cpu.cpp: the compiled CPU kernel)
    dispatch.py           ``memorize_triton``: ``memorize(..., impl="triton")`` on top of them (``INTERPRETED``: the
                          kernels run under Triton's interpreter)
    limits.py             what the kernels cover (``COVERAGE``), read by the plan (memory/plan.py) without triton
    fla.py                ``memorize_fla``: ``memorize(..., impl="fla")`` on fla-core's chunk kernels

Nothing here imports triton until a kernel is asked for: the memory package imports this package (its optimisers use
the CPU Newton–Schulz kernel), on machines without triton too, and ``dispatch`` itself builds on the memory modules.
On a machine without a GPU the kernels run under Triton's interpreter: set TRITON_INTERPRET=1 before triton
is first imported (triton.language decorates its own helpers then, and these kernels when they are imported).
"""
from __future__ import annotations

from .chunk_linear_memory import chunk_linear_memory, chunk_linear_memory_naive
from .newton_schulz import newton_schulz

DISPATCH = ("memorize_triton", "INTERPRETED")  # loaded from .dispatch on first use

__all__ = ["newton_schulz", "chunk_linear_memory", "chunk_linear_memory_naive", *DISPATCH]


def __getattr__(name: str):
    """``memorize_triton`` and ``INTERPRETED``, imported from ``dispatch`` (and with
    it triton and the memory modules) when first asked for."""
    if name in DISPATCH:
        from . import dispatch

        return getattr(dispatch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
