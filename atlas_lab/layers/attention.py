"""Softmax attention and sliding-window attention (SWA), the non-parametric memories (Atlas §4.1).

Both use RoPE on q, k and torch's scaled_dot_product_attention. Streaming keeps a KV cache: all past
keys/values for full attention, the last w−1 for SWA (a ring of constant size).

Persistent memory (Titans §3.3): ``persistent`` learnable key/value pairs per head that every query attends to
besides its causal window — the projections of input-independent tokens prepended to every sequence, without a
position (no rotation). The function's keys are then [P; window] with one softmax over both.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .rope import rotary


def with_persistent(k, v, mask, persistent):
    """Keys and values with the persistent pairs in front, and the mask with their columns (always visible).

    k, v: [B, H, ..., S, d]; mask: [..., S] bool (broadcast against the scores [B, H, ..., T, S]); persistent:
    (pk, pv) [H, P, d] or None (then all three are returned as they are) -> k, v [B, H, ..., P + S, d] and
    mask [..., P + S]."""
    if persistent is None:
        return k, v, mask
    H, P, d = persistent[0].shape
    pk, pv = (x.to(k.dtype).view(1, H, *[1] * (k.dim() - 4), P, d).expand(*k.shape[:-2], P, d) for x in persistent)
    k, v = torch.cat([pk, k], -2), torch.cat([pv, v], -2)
    return k, v, torch.cat([mask.new_ones(*mask.shape[:-1], P), mask], -1)


def full_attention(q, k, v, persistent=None):
    """Causal attention of T queries over S ≥ T keys (the last T keys are the queries' own positions).

    q: [B, H, T, d]; k, v: [B, H, S, d] -> [B, H, T, d]. persistent: (pk, pv) [H, P, d] or None."""
    T, S = q.shape[2], k.shape[2]
    if S == T and persistent is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    mask = torch.arange(S, device=q.device)[None, :] <= torch.arange(S - T, S, device=q.device)[:, None]
    k, v, mask = with_persistent(k, v, mask, persistent)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def sliding_window_attention_dense(q, k, v, window: int, persistent=None):
    """Each query attends to the last ``window`` keys up to its own position, with a dense T × S mask.

    q: [B, H, T, d]; k, v: [B, H, S, d] (S ≥ T, the last T keys at the queries' positions) -> [B, H, T, d].
    O(T·S) time and memory: the oracle of ``sliding_window_attention_blocked``, and the path for T ≤ window.
    persistent: (pk, pv) [H, P, d] or None.
    """
    T, S = q.shape[2], k.shape[2]
    qpos = torch.arange(S - T, S, device=q.device)[:, None]
    kpos = torch.arange(S, device=q.device)[None, :]
    mask = (kpos <= qpos) & (kpos > qpos - window)
    k, v, mask = with_persistent(k, v, mask, persistent)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def sliding_window_attention_blocked(q, k, v, window: int, persistent=None):
    """The same function as ``sliding_window_attention_dense`` in O(T·w): blocks of w queries, each against its own
    and the previous block's keys.

    The keys are padded on the left to T + w (so that query i needs padded keys (i, i + w]) and on the right to a
    whole number of blocks; block j of queries reads key blocks j and j + 1 with one [w, 2w] band mask, and the
    left padding is masked out (it only reaches the first block).
    """
    B, H, T, d = q.shape
    S, w = k.shape[2], window
    n = -(-T // w)  # query blocks
    left = w - (S - T)  # ≥ 1: the cache holds at most w − 1 keys
    pad = (0, 0, left, n * w + w - (left + S))
    k_, v_ = F.pad(k, pad), F.pad(v, pad)  # [B, H, (n + 1)·w, d]
    q_ = F.pad(q, (0, 0, 0, n * w - T)).view(B, H, n, w, d)

    def blocks(x):  # [B, H, n, 2w, d]: key blocks j and j + 1 for query block j
        x = x.view(B, H, n + 1, w, d)
        return torch.cat([x[:, :, :-1], x[:, :, 1:]], 3)

    i = torch.arange(w, device=q.device)[:, None]
    j = torch.arange(2 * w, device=q.device)[None, :]
    band = (j > i) & (j <= i + w)  # [w, 2w]
    first = torch.arange(n, device=q.device)[:, None, None] * w + j >= left  # [n, 1, 2w]: not left padding
    kb, vb, mask = with_persistent(blocks(k_), blocks(v_), (band & first).expand(n, w, 2 * w), persistent)
    o = F.scaled_dot_product_attention(q_, kb, vb, attn_mask=mask)
    return o.reshape(B, H, n * w, d)[:, :, :T]


class Attention(nn.Module):
    """Causal multi-head attention over the last ``window`` tokens (None: all). x: [B, T, d] -> [B, T, d].

    persistent: learnable key/value pairs every query also attends to (persistent memory; 0: none)."""

    def __init__(self, d_model: int, n_heads: int, window: int | None = None, rope_base: float = 10000.0,
                 persistent: int = 0):
        super().__init__()
        if window is not None and window < 1:
            raise ValueError(f"attention window must be >= 1 or None (full attention), got {window}")
        if isinstance(persistent, bool) or not isinstance(persistent, int) or persistent < 0:
            raise ValueError(f"persistent_tokens must be an int >= 0, got {persistent!r}")
        self.n_heads, self.head_dim, self.window, self.rope_base = n_heads, d_model // n_heads, window, rope_base
        self.qkv = nn.Linear(d_model, 3 * n_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)
        shape = (n_heads, persistent, self.head_dim)
        self.persistent = nn.ParameterList([nn.Parameter(torch.randn(shape) * 0.02) for _ in range(2)]) \
            if persistent else None

    def forward(self, x: torch.Tensor, cache: dict | None = None):
        B, T, _ = x.shape
        start = cache["position"] if cache else 0
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim).unbind(2)
        positions = torch.arange(start, start + T, device=x.device)
        q, k = rotary(q, positions, self.rope_base), rotary(k, positions, self.rope_base)
        if cache:
            k, v = torch.cat([cache["k"], k], 1), torch.cat([cache["v"], v], 1)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, ·, d]
        S = k.shape[2]  # keys: positions start+T−S .. start+T−1
        p = None if self.persistent is None else tuple(self.persistent)
        if self.window is None:
            o = full_attention(q, k, v, p)
        elif T > self.window:
            o = sliding_window_attention_blocked(q, k, v, self.window, p)
        else:
            o = sliding_window_attention_dense(q, k, v, self.window, p)
        keep = S if self.window is None else min(S, self.window - 1)
        new_cache = {"k": k[:, :, S - keep:].transpose(1, 2).contiguous(),
                     "v": v[:, :, S - keep:].transpose(1, 2).contiguous(),
                     "position": start + T}
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1)), new_cache

    def state_bytes(self, batch_size: int = 1, dtype_bytes: int = 4) -> int:
        """Fixed-size streaming state: the SWA ring (w−1 keys and values); 0 for full attention."""
        if self.window is None:
            return 0
        return batch_size * dtype_bytes * 2 * (self.window - 1) * self.n_heads * self.head_dim

    def cache_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """Growth of the KV cache per token read: 2·H·d for full attention, 0 for SWA."""
        return 0 if self.window is not None else dtype_bytes * 2 * self.n_heads * self.head_dim
