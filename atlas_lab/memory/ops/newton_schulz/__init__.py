"""Newton–Schulz NS_k on a batch of small matrices (docs/memory.md §3, muon), one fused kernel per device:

    triton.py  newton_schulz  one Triton launch for the whole batch, the k steps fused; forward and recomputing
                              backward (CUDA, or the CPU under TRITON_INTERPRET=1)
    cpu.py     newton_schulz_cpu  the compiled C++ kernel (``cpu.cpp``, built on first use) as a registered
                              operator: float32/float64 on the CPU
    cpu.cpp                   its source (shipped as package data)
    reference.py newton_schulz  the PyTorch reference: batched matmuls (impl "bmm") or the CPU kernel (impl "cpu");
                              the coefficient triples and schedules (``NS_COEFFICIENTS``, ``NS_SCHEDULES``)

Which one a memory runs is the plan's choice (memory/plan.py). This package is imported with the memory package (the
optimisers import ``reference``), so ``newton_schulz`` here imports triton on its first call only.
"""
from __future__ import annotations

import torch

__all__ = ["newton_schulz"]


def newton_schulz(G: torch.Tensor, steps: int = 5, coefficients: str = "quintic", eps: float = 1e-7) -> torch.Tensor:
    """``triton.newton_schulz``: NS_k(G) for G [..., m, n] (each matrix separately, min(m, n) ≤ 128 and
    max(m, n) ≤ 512) -> [..., m, n]; triton is imported on the first call."""
    from .triton import newton_schulz as kernel

    return kernel(G, steps, coefficients, eps)
