"""Hybrids of a memory and sliding-window attention (Titans / Atlas §5).

MAG (memory as a gate): both branches read the same input; o = RMSNorm(SWA(x)) ⊙ σ(RMSNorm(M(x))).
MAL (memory as a layer) is a layer pattern — a memory layer followed by an SWA layer — built by the model.
"""
from __future__ import annotations

import torch
from torch import nn

from .attention import Attention
from .memory_mixer import MemoryConfig, MemoryMixer


class MAG(nn.Module):
    """Memory-as-gate mixer. x: [B, T, d] -> [B, T, d]; the streaming cache holds both branches' caches.

    n_heads: the attention branch's heads; memory_heads: the memory branch's (default n_heads); persistent: the
    attention branch's persistent memory tokens."""

    def __init__(self, d_model: int, n_heads: int, config: MemoryConfig, swa_window: int,
                 memory_heads: int | None = None, persistent: int = 0):
        super().__init__()
        self.memory = MemoryMixer(d_model, memory_heads or n_heads, config)
        self.swa = Attention(d_model, n_heads, window=swa_window, persistent=persistent)
        self.memory_norm, self.swa_norm = nn.RMSNorm(d_model), nn.RMSNorm(d_model)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor, cache: dict | None = None):
        cache = cache or {}
        m, cm = self.memory(x, cache.get("memory"))
        a, ca = self.swa(x, cache.get("swa"))
        # the norms in the weights' precision (float32 under bf16/16-mixed autocast, whose outputs a and m are not)
        dtype = self.swa_norm.weight.dtype
        o = self.swa_norm(a.to(dtype)) * torch.sigmoid(self.memory_norm(m.to(dtype)))
        return self.o_proj(o), {"memory": cm, "swa": ca}

    def state_bytes(self, batch_size: int = 1, dtype_bytes: int = 4) -> int:
        return self.memory.state_bytes(batch_size, dtype_bytes) + self.swa.state_bytes(batch_size, dtype_bytes)

    def cache_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        return self.memory.cache_bytes_per_token(dtype_bytes) + self.swa.cache_bytes_per_token(dtype_bytes)
