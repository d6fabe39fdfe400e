"""Hybrids of a memory and attention (Titans §4 / Atlas §5).

MAG (memory as a gate): both branches read the same input; o = RMSNorm(SWA(x)) ⊙ σ(RMSNorm(M(x))).
MAC (memory as context): segments attend to themselves and to what they retrieve from the memory.
MAL (memory as a layer) is a layer pattern — a memory layer followed by an SWA layer — built by the model.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..memory.chunked import read_at
from .attention import Attention, with_persistent
from .memory_mixer import MemoryConfig, MemoryMixer
from .rope import rotary


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


NEVER = torch.iinfo(torch.int64).max  # the position of an empty key slot


class MAC(nn.Module):
    """Memory-as-context mixer (Titans §4.1). x: [B, T, d] -> [B, T, d], read in segments of ``segment`` tokens.

    For segment s (positions in it i, j):
        h_i = M*_{s−1}(q̂_i)         read-only retrieval at the memory's weights at the segment's start, with a query
                                      q̂ = L2norm(SiLU(W_q̂ x)) per memory head, projected back to d_model (W_h)
        y_i = Attn(q_i; P, {h_j, x_j : j ≤ i in s})     one softmax over the persistent pairs and the segment so far
        z_i = M(y_i)                  the memory layer reads y (its rule writes y token by token: M_t, then M*_t(y_t))
        o_i = W_o (RMSNorm(y_i) ⊙ σ(RMSNorm(z_i)))
    Attention sees only the current segment (and the retrieved h of it); the memory carries everything before.
    Reading: docs/memory.md §7. Streaming keeps the segment's keys and values so far, the memory layer's cache and
    the weights the segment started from.
    """

    def __init__(self, d_model: int, n_heads: int, config: MemoryConfig, segment: int,
                 memory_heads: int | None = None, persistent: int = 0, rope_base: float = 10000.0):
        super().__init__()
        if segment < 1:
            raise ValueError(f"MAC segment must be >= 1, got {segment}")
        self.memory = MemoryMixer(d_model, memory_heads or n_heads, config)
        self.n_heads, self.head_dim, self.segment, self.rope_base = n_heads, d_model // n_heads, segment, rope_base
        inner = self.memory.n_heads * self.memory.head_dim
        self.retrieve_q = nn.Linear(d_model, inner, bias=False)
        self.retrieve_out = nn.Linear(inner, d_model, bias=False)
        self.attention = Attention(d_model, n_heads, persistent=persistent, rope_base=rope_base)  # its projections
        self.y_norm, self.z_norm = nn.RMSNorm(d_model), nn.RMSNorm(d_model)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def retrieve(self, x, weights):
        """h = W_h M_W(φ(q̂)) at fixed weights W {name: [B, H, *shape]}. x: [B, n, d] -> [B, n, d]."""
        mem, B, n = self.memory, x.shape[0], x.shape[1]
        H, d = mem.n_heads, mem.head_dim
        q = F.normalize(F.silu(self.retrieve_q(x)).view(B, n, H, d), dim=-1).permute(0, 2, 1, 3).reshape(B * H, n, d)
        W = {k: w.to(q.dtype).reshape(B * H, *w.shape[2:]) for k, w in weights.items()}
        coefficients = mem.feature_coefficients()
        h = read_at(mem.mem, W, mem.feature_map(q, coefficients), q)[..., :d]  # a normaliser column is not read
        return self.retrieve_out(h.reshape(B, H, n, d).permute(0, 2, 1, 3).reshape(B, n, H * d))

    def forward(self, x: torch.Tensor, cache: dict | None = None):
        B, T, _ = x.shape
        cache = cache or {}
        position, memory_cache = cache.get("position", 0), cache.get("memory")
        weights = cache.get("weights")
        if weights is None:
            weights = {k: w.unsqueeze(0).expand(B, *w.shape) for k, w in self.memory.initial_weights.items()}
        keys, values, key_pos = cache.get("k"), cache.get("v"), cache.get("key_pos")
        outputs, t = [], 0
        while t < T:
            n = min(self.segment - position % self.segment, T - t)
            piece = x[:, t:t + n]
            pos = torch.arange(position, position + n, device=x.device)
            h = self.retrieve(piece, weights)
            y, keys, values, key_pos = self._attend(piece, h, pos, keys, values, key_pos)
            z, memory_cache = self.memory(y, memory_cache)
            dtype = self.y_norm.weight.dtype
            outputs.append(self.o_proj(self.y_norm(y.to(dtype)) * torch.sigmoid(self.z_norm(z.to(dtype)))))
            position, t = position + n, t + n
            if position % self.segment == 0:  # a segment ends: the next one reads the memory as it is now
                weights, keys, values, key_pos = memory_cache["state"].weights, None, None, None
        keys, values, key_pos = self._slots(x, keys, values, key_pos)
        return torch.cat(outputs, 1), {"position": position, "memory": memory_cache, "weights": weights,
                                       "k": keys, "v": values, "key_pos": key_pos}

    def _slots(self, x, keys, values, key_pos):
        """The segment's keys and values so far in 2·(segment − 1) slots (a cache of constant size); empty slots have
        the position NEVER, which no query sees."""
        B, H, d = x.shape[0], self.n_heads, self.head_dim
        if keys is None:
            keys = values = x.new_zeros(B, 0, H, d)
            key_pos = torch.zeros(0, dtype=torch.long, device=x.device)
        real = key_pos != NEVER
        keys, values, key_pos = keys[:, real], values[:, real], key_pos[real]
        pad = 2 * (self.segment - 1) - keys.shape[1]
        return (F.pad(keys, (0, 0, 0, 0, 0, pad)), F.pad(values, (0, 0, 0, 0, 0, pad)),
                torch.cat([key_pos, key_pos.new_full((pad,), NEVER)]))

    def _attend(self, x, h, pos, keys, values, key_pos):
        """Attention of the segment piece x (positions pos) over P and the segment's h and x tokens up to each."""
        a, (B, n, _) = self.attention, x.shape
        qkv = a.qkv(torch.cat([x, h], 1)).view(B, 2 * n, 3, self.n_heads, self.head_dim).unbind(2)
        both = torch.cat([pos, pos])
        q, k, v = rotary(qkv[0][:, :n], pos, self.rope_base), rotary(qkv[1], both, self.rope_base), qkv[2]
        if keys is not None:
            k, v, both = torch.cat([keys, k], 1), torch.cat([values, v], 1), torch.cat([key_pos, both])
        mask = both[None, :] <= pos[:, None]
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        p = None if a.persistent is None else tuple(a.persistent)
        kh, vh, mask = with_persistent(kh, vh, mask, p)
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
        return a.o_proj(o.transpose(1, 2).reshape(B, n, -1)), k, v, both

    def state_bytes(self, batch_size: int = 1, dtype_bytes: int = 4) -> int:
        """The memory layer's state, the segment's start weights, and 2·(segment − 1) cached key/value slots with
        their positions (int64, shared by the batch)."""
        weights = sum(p.numel() for p in self.memory.initial_weights.values())
        slots = 2 * (self.segment - 1)
        kv = 2 * slots * self.n_heads * self.head_dim
        return self.memory.state_bytes(batch_size, dtype_bytes) + batch_size * dtype_bytes * (weights + kv) + 8 * slots

    def cache_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        return self.memory.cache_bytes_per_token(dtype_bytes)

    def attention_flops(self, T: int) -> float:
        """Forward FLOPs per token of the segment attention (QKᵀ and PV, all heads): token r of a segment attends
        to 2(r + 1) keys (its segment's h and x tokens up to it; the persistent pairs are not counted)."""
        keys = sum(2 * (t % self.segment + 1) for t in range(T))
        return self.n_heads * 4 * self.head_dim * keys / T
