"""Hybrids of a memory and attention (Titans §4 / Atlas §5).

MAG (memory as a gate): both branches read the same input; o = RMSNorm(SWA(x)) ⊙ σ(RMSNorm(M(x))).
MAC (memory as context): segments attend to themselves and to what they retrieve from the memory.
MAL (memory as a layer) is a layer pattern — a memory layer followed by an SWA layer — built by the model.
LaCT: sliding-window attention and a large-chunk memory on shared q, k, v, summed (LaCT's official layer).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..memory import memorize
from ..memory.chunked import read_at
from .attention import Attention, sliding_window_attention_blocked, sliding_window_attention_dense, with_persistent
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
        keys, values, key_pos = self._slots(x, keys, values, key_pos, 2 * (position % self.segment))
        return torch.cat(outputs, 1), {"position": position, "memory": memory_cache, "weights": weights,
                                       "k": keys, "v": values, "key_pos": key_pos}

    def _slots(self, x, keys, values, key_pos, count: int):
        """The segment's keys and values so far in 2·(segment − 1) slots (a cache of constant size); empty slots have
        the position NEVER, which no query sees. ``count`` = 2 · (tokens of the segment so far), the real slots: known
        on the host, so they are taken in order by a stable sort (no data-dependent shape, no host synchronisation)."""
        B, H, d = x.shape[0], self.n_heads, self.head_dim
        if keys is None:
            keys = values = x.new_zeros(B, 0, H, d)
            key_pos = torch.zeros(0, dtype=torch.long, device=x.device)
        real = torch.argsort((key_pos == NEVER).to(torch.int8), stable=True)[:count]  # the real slots, in order
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


def chunk_mean_factors(theta: torch.Tensor, chunk: int, offset: int = 0, pending: torch.Tensor | None = None):
    """Per-token factors θ'_t whose product over each chunk of ``chunk`` tokens is the chunk's mean of θ_t: θ'_t =
    m_t / m_{t−1}, m_t the mean of θ over the chunk's tokens up to t (m = 1 before a chunk's first token), so that the
    chunk-commit rule's θ_c = ∏_t θ'_t is LaCT's momentum, the chunk's mean. theta: [B, T, H]; offset: tokens of the
    current chunk read before this call (< chunk); pending: their ∏ θ' so far (their mean), [B, H] (a MemoryState's
    pending[chunk]["theta"]). The factors of a chunk's later tokens depend on its earlier ones (the commit waits for
    all)."""
    B, T, H = theta.shape
    pos = torch.arange(offset, offset + T, device=theta.device)
    within = pos % chunk  # each token's place in its chunk
    total = theta.cumsum(1)
    before = torch.cat([total.new_zeros(B, 1, H), total], 1)[:, (torch.arange(T, device=theta.device) - within)
                                                             .clamp_min(0)]  # Σ θ before the token's chunk (in call)
    sums = total - before
    carried = offset > 0 and pending is not None
    if carried:  # the chunk in progress: its first tokens were read before this call, their mean is ``pending``
        sums = sums + torch.where((pos < chunk)[None, :, None], offset * pending.unsqueeze(1), 0.0)
    mean = sums / (within + 1).to(theta.dtype)[None, :, None]
    start = pending.unsqueeze(1) if carried else mean.new_ones(B, 1, H)
    previous = torch.where((within == 0)[None, :, None], 1.0, torch.cat([start, mean[:, :-1]], 1))
    return mean / previous


def _l2(x, eps=1e-5):
    """x / (‖x‖ + eps) over the last axis (LaCT's normalisation of the fast q and k)."""
    return x / (torch.linalg.vector_norm(x, dim=-1, keepdim=True) + eps)


class LaCT(nn.Module):
    """LaCT's layer (Zhang et al., arXiv 2505.23884; its official layer_lact_swiglu.py). x: [B, T, d] -> [B, T, d].

    One projection gives q, k, v for both branches:
      SWA:  RoPE on q, k; each query sees the last ``window`` keys (window="chunk": the memory's chunk, LaCT's; an int:
            that many; "model": ``swa_window``)
      TTT:  q̂ = SiLU(q ⊙ s_q + o_q), k̂ = SiLU(k ⊙ s_k + o_k) (learned per channel), v̂ = SiLU(v); q̂, k̂ divided by
            their norm per memory head (+1e-5), then RoPE (rope=True; over the attention's heads, as the official
            code does); the memory (``config``, read chunk) reads them with γ_t = softplus(w·x + b), b = softplus⁻¹
            (10⁻³), one per memory head and token, or, where the rule learns γ per matrix (chunk_commit with
            per_matrix: LaCT's), one per weight matrix too (in the memory's order W1, W2, W3), and, with
            momentum="learned", θ_c = the chunk's mean of θ_t = σ(w·x + b) per head (``chunk_mean_factors``);
            momentum="config": the config's θ
      o = W_o (SWA + RMSNorm(TTT) ⊙ SiLU(w·x)), the norm per memory head, the scale one per memory head.
    Streaming keeps the SWA ring (its last window − 1 rotated keys and values), the position and the memory's state.
    """

    def __init__(self, d_model: int, n_heads: int, config, swa_window: int, memory_heads: int | None = None,
                 persistent: int = 0, window="chunk", rope: bool = True, momentum: str = "learned",
                 rope_base: float = 10000.0):
        super().__init__()
        self.config = config.validate()
        if config.read != "chunk":
            raise ValueError(f"LaCT: the memory reads its chunk's start (read: chunk); got read={config.read!r}")
        if momentum not in ("learned", "config"):
            raise ValueError(f"LaCT momentum: expected 'learned' or 'config', got {momentum!r}")
        if window == "chunk":
            window = config.chunk_size
        elif window == "model":
            window = swa_window
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"LaCT window: expected 'chunk', 'model' or an int >= 1, got {window!r}")
        self.n_heads, self.head_dim, self.window, self.rope, self.rope_base = n_heads, d_model // n_heads, window, \
            rope, rope_base
        self.memory_heads = H = memory_heads or n_heads
        self.memory_dim = d = d_model // H
        self.momentum = momentum
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.qk_scale = nn.Parameter(torch.ones(2, d_model))
        self.qk_offset = nn.Parameter(torch.zeros(2, d_model))
        self.mem, self.feature_map, _, optimizer = config.components()
        D = self.feature_map.dim(d)
        self.initial_weights = nn.ParameterDict(
            {n: nn.Parameter(w) for n, w in self.mem.init_weights(H, D, d, d).items()})
        # γ per memory head, or per head and weight matrix (the rule's γ on the matrix axis)
        self.rates = len(self.initial_weights) if config.rule().gates(config, optimizer)["gamma"].axis == "matrix" \
            else 1
        self.lr_proj = nn.Linear(d_model, H * self.rates)
        self.momentum_proj = nn.Linear(d_model, H) if momentum == "learned" else None
        self.scale_proj = nn.Linear(d_model, H)
        for proj in (self.lr_proj, self.momentum_proj, self.scale_proj):
            if proj is not None:
                nn.init.normal_(proj.weight, std=0.02)
                nn.init.zeros_(proj.bias)
        self.base_lr = math.log(math.expm1(1e-3))  # softplus⁻¹(10⁻³): γ starts near LaCT's base rate
        self.ttt_norm = nn.RMSNorm(d)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.persistent = nn.ParameterList([nn.Parameter(torch.randn(n_heads, persistent, self.head_dim) * 0.02)
                                            for _ in range(2)]) if persistent else None

    def _rotate(self, x, positions):
        """RoPE over the attention's heads of x [B, T, width]."""
        B, T, width = x.shape
        return rotary(x.view(B, T, width // self.head_dim, self.head_dim), positions, self.rope_base).reshape(B, T,
                                                                                                            width)

    def forward(self, x: torch.Tensor, cache: dict | None = None):
        B, T, d_model = x.shape
        cache = cache or {}
        start = cache.get("position", 0)
        positions = torch.arange(start, start + T, device=x.device)
        q, k, v = self.qkv(x).chunk(3, -1)
        a, ring_k, ring_v = self._attend(q, k, v, positions, cache)
        # the TTT branch
        H, d = self.memory_heads, self.memory_dim
        fq, fk = (F.silu(t * self.qk_scale[i] + self.qk_offset[i]) for i, t in enumerate((q, k)))
        fq, fk = (_l2(t.view(B, T, H, d)).reshape(B, T, d_model) for t in (fq, fk))
        if self.rope:
            fq, fk = self._rotate(fq, positions), self._rotate(fk, positions)
        fq, fk, fv = (t.view(B, T, H, d) for t in (fq, fk, F.silu(v)))
        state = cache.get("memory")
        memory_dtype = torch.promote_types(fq.dtype, torch.float32)  # the gates too (LaCT's: float32 under bf16)
        gamma = F.softplus(self.lr_proj(x).to(memory_dtype) + self.base_lr)
        gates = {"gamma": gamma.view(B, T, H, self.rates) if self.rates > 1 else gamma}
        if self.momentum_proj is not None:
            level = {} if state is None else (state.pending or {}).get(self.config.chunk_size, {})
            offset, pending = (0 if state is None else state.offset), level.get("theta")
            gates["theta"] = chunk_mean_factors(torch.sigmoid(self.momentum_proj(x).to(memory_dtype)),
                                                self.config.chunk_size, offset, pending)

        def exact(t):
            return t.to(memory_dtype) if isinstance(t, torch.Tensor) else t

        with torch.autocast(x.device.type, enabled=False):
            o, state = memorize(*map(exact, (fq, fk, fv)), self.config,
                                initial_state=dict(self.initial_weights.items()) if state is None else state,
                                gates={g: exact(t) for g, t in gates.items()})
            dtype = self.ttt_norm.weight.dtype
            ttt = self.ttt_norm(o.to(dtype)) * F.silu(self.scale_proj(x).to(dtype)).unsqueeze(-1)
        o = a.to(dtype) + ttt.reshape(B, T, d_model)
        return self.o_proj(o.to(x.dtype)), {"position": start + T, "k": ring_k, "v": ring_v, "memory": state}

    def _attend(self, q, k, v, positions, cache):
        """Sliding-window attention of this piece over the ring and itself -> (o [B, T, d], the next ring's keys and
        values)."""
        B, T, _ = q.shape
        heads = (B, T, self.n_heads, self.head_dim)
        q = rotary(q.view(heads), positions, self.rope_base)
        k, v = rotary(k.view(heads), positions, self.rope_base), v.view(heads)
        if "k" in cache:
            k, v = torch.cat([cache["k"], k], 1), torch.cat([cache["v"], v], 1)
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        p = None if self.persistent is None else tuple(self.persistent)
        attend = sliding_window_attention_blocked if T > self.window else sliding_window_attention_dense
        o = attend(qh, kh, vh, self.window, p)
        keep = min(k.shape[1], self.window - 1)
        ring = (k[:, k.shape[1] - keep:].contiguous(), v[:, v.shape[1] - keep:].contiguous())
        return o.transpose(1, 2).reshape(B, T, -1), *ring

    def state_bytes(self, batch_size: int = 1, dtype_bytes: int = 4) -> int:
        """The SWA ring (window − 1 keys and values), the memory's weights, its optimiser state and the pending chunk
        (Σ g and its gates ∏α, Ση, ∏θ)."""
        optimizer = self.config.components()[3]
        weights = sum(w.numel() for w in self.initial_weights.values())
        momentum = sum(w.shape[0] * math.prod(optimizer.state_shape(tuple(w.shape[1:])) or (0,))
                       for w in self.initial_weights.values())
        ring = 2 * (self.window - 1) * self.n_heads * self.head_dim
        return batch_size * dtype_bytes * (ring + 2 * weights + momentum + 3 * self.memory_heads)

    def cache_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        return 0
