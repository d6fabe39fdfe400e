"""Softmax attention and sliding-window attention (SWA), the non-parametric memories (Atlas §4.1).

Both use RoPE on q, k and torch's scaled_dot_product_attention. Streaming keeps a KV cache: all past
keys/values for full attention, the last w−1 for SWA (a ring of constant size).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .rope import rotary


class Attention(nn.Module):
    """Causal multi-head attention over the last ``window`` tokens (None: all). x: [B, T, d] -> [B, T, d]."""

    def __init__(self, d_model: int, n_heads: int, window: int | None = None, rope_base: float = 10000.0):
        super().__init__()
        if window is not None and window < 1:
            raise ValueError(f"attention window must be >= 1 or None (full attention), got {window}")
        self.n_heads, self.head_dim, self.window, self.rope_base = n_heads, d_model // n_heads, window, rope_base
        self.qkv = nn.Linear(d_model, 3 * n_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)

    def forward(self, x: torch.Tensor, cache: dict | None = None):
        B, T, _ = x.shape
        start = cache["position"] if cache else 0
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).unbind(2)
        positions = torch.arange(start, start + T, device=x.device)
        q, k = rotary(q, positions, self.rope_base), rotary(k, positions, self.rope_base)
        if cache:
            k, v = torch.cat([cache["k"], k], 1), torch.cat([cache["v"], v], 1)
        S = k.shape[1]  # keys: positions start+T−S .. start+T−1
        if self.window is None and S == T:
            mask, causal = None, True
        else:
            qpos = positions[:, None]
            kpos = torch.arange(start + T - S, start + T, device=x.device)[None, :]
            mask = kpos <= qpos
            if self.window is not None:
                mask = mask & (kpos > qpos - self.window)
            causal = False
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask, is_causal=causal)
        keep = S if self.window is None else min(S, self.window - 1)
        new_cache = {"k": k[:, S - keep:], "v": v[:, S - keep:], "position": start + T}
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1)), new_cache

    def state_bytes(self, batch_size: int = 1, dtype_bytes: int = 4) -> int:
        """Fixed-size streaming state: the SWA ring (w−1 keys and values); 0 for full attention."""
        if self.window is None:
            return 0
        return batch_size * dtype_bytes * 2 * (self.window - 1) * self.n_heads * self.head_dim

    def cache_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """Growth of the KV cache per token read: 2·H·d for full attention, 0 for SWA."""
        return 0 if self.window is not None else dtype_bytes * 2 * self.n_heads * self.head_dim
