"""The memory mixer: a token mixer whose state is a memory trained while it reads (docs/memory.md §2, §8).

x -> q, k, v projections -> short causal conv + SiLU -> L2-normalised q, k per head
  -> data-dependent gates: the learning rule's (α, η, θ, γ; gdn2's erase, write), one scalar per head per token
     (per head and channel where the rule learns them per channel) -> memorize(...)
  -> per-head RMSNorm -> ⊙ SiLU(W_g x) -> output projection.
With a rule of n_h > 1 steps per token (deltaproduct, arXiv 2502.10297) the layer projects n_h keys, values and
gates of a step (η, γ) per token, one query, α and θ.
"""
from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn
from torch.nn import functional as F

from ..memory import MemoryConfig, memorize
from ..memory.learning_rules import axis_width
from ..memory.optimizers import levels
from ..memory.plan import Shapes, plan
from ..memory.state import PENDING_GATES
from .conv import ShortConv


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


class MemoryMixer(nn.Module):
    """Multi-head memory token mixer. x: [B, T, d_model] -> [B, T, d_model].

    Streaming: ``forward(x, cache)`` returns ``(y, cache)``; the cache holds the three conv caches ("q", "k", "v")
    and the MemoryState ("state"), so a sequence read in pieces gives the same outputs as read at once.
    """

    def __init__(self, d_model: int, n_heads: int, config: MemoryConfig, head_dim: int | None = None,
                 conv_size: int = 4):
        super().__init__()
        self.config = config.validate()
        self.n_heads = n_heads
        self.head_dim = d = head_dim or d_model // n_heads
        inner = n_heads * d
        self.learning_rule = config.rule()
        self.steps = n = self.learning_rule.steps()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_model, width, bias=False) for width in (inner, n * inner,
                                                                                                    n * inner))
        self.q_conv, self.k_conv, self.v_conv = (ShortConv(width, conv_size) for width in (inner, n * inner, n * inner))
        self.mem, self.feature_map, self.bias, self.optimizer = config.components()
        # the config memorize reads: the same one, with its components built once
        self.memory = dataclasses.replace(config, architecture=self.mem, feature_map=self.feature_map,
                                        attentional_bias=self.bias, optimizer=self.optimizer,
                                        learning_rule=self.learning_rule)
        self.fla_routes: dict[tuple, bool] = {}  # takes_fla's answers by (dtype, device)
        D = self.feature_map.dim(d)
        self.gate_specs = self.learning_rule.gates(config, self.optimizer)
        # the learned gates and their outputs per head: 1, or one per channel of the gate's axis (D keys, d values,
        # the memory's weight matrices)
        matrices = len(self.mem.shapes(D, d, d + int(config.normalize)))
        self.learned_gates = {g: axis_width(spec.axis, D, d, matrices) for g, spec in self.gate_specs.items()
                              if spec.value == "learned" and spec.used}
        # one block of outputs per gate: per head (and channel), per step for the gates of a step
        self.gate_sizes = [(n if self.gate_specs[g].per_step else 1) * n_heads * width
                           for g, width in self.learned_gates.items()]
        self.gate_proj = nn.Linear(d_model, sum(self.gate_sizes)) if self.learned_gates else None
        if self.gate_proj is not None:
            nn.init.normal_(self.gate_proj.weight, std=0.02)
            with torch.no_grad():
                for bias, g in zip(self.gate_proj.bias.split(self.gate_sizes), self.learned_gates):
                    bias.fill_(_logit(self.gate_specs[g].init))
        d_out = d + int(config.normalize)
        self.initial_weights = nn.ParameterDict(
            {n: nn.Parameter(w) for n, w in self.mem.init_weights(n_heads, D, d, d_out).items()})
        a = self.feature_map.initial_coefficients()
        if a is not None:  # a learnable feature map: a_i = softplus(raw_i) ≥ 0, initialised to its a_i
            a = a.float()
            self.raw_coefficients = nn.Parameter(a + torch.log(-torch.expm1(-a)))
        else:
            self.raw_coefficients = None
        self.out_norm = nn.RMSNorm(d)
        self.g_proj = nn.Linear(d_model, inner, bias=False)
        self.o_proj = nn.Linear(inner, d_model, bias=False)

    def feature_coefficients(self) -> torch.Tensor | None:
        """The learnable feature map's a_i = softplus(raw_i) ≥ 0, shape [p + 1]; None for a map without them."""
        return F.softplus(self.raw_coefficients) if self.raw_coefficients is not None else None

    def gates(self, x: torch.Tensor) -> dict:
        """{gate: [B, T, H(, C)] tensor or constant}; [B, T·n_h, H(, C)] for a gate per step (n_h steps per
        token)."""
        out = {g: (spec.value if spec.used else None) for g, spec in self.gate_specs.items()}
        if out["alpha"] == "head_decay":  # RetNet: α_h = 1 − 2^(−5−h)
            h = torch.arange(self.n_heads, device=x.device, dtype=torch.float64)
            out["alpha"] = (1 - 2.0 ** (-5 - h)).to(torch.promote_types(x.dtype, torch.float32)).expand(
                *x.shape[:2], self.n_heads)
        if self.gate_proj is not None:
            z = self.gate_proj(x).sigmoid()
            for (g, width), value in zip(self.learned_gates.items(), z.split(self.gate_sizes, -1)):
                steps = self.steps if self.gate_specs[g].per_step else 1
                value = value.unflatten(-1, (steps, self.n_heads, width)).flatten(1, 2)  # [B, T·steps, H, width]
                value = value if width > 1 else value.squeeze(-1)
                out[g] = value * self.gate_specs[g].scale
        return out

    def forward(self, x: torch.Tensor, cache: dict | None = None):
        """x: [B, T, d_model] (T = 0 allowed: an empty piece of a stream leaves the cache as it was)."""
        d_model = self.q_proj.in_features
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 3 or x.shape[-1] != d_model:
            got = f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"MemoryMixer: x must be a floating-point [B, T, d_model] = [B, T, {d_model}] tensor; "
                             f"got {got}")
        B, T, _ = x.shape
        cache = cache or {}
        if "q" in cache and cache["q"].shape[0] != B:
            raise ValueError(f"MemoryMixer: cache holds a batch of {cache['q'].shape[0]} sequences; got x with {B}")
        heads, steps = (B, T, self.n_heads, self.head_dim), (B, T * self.steps, self.n_heads, self.head_dim)
        q, cq = self.q_conv(self.q_proj(x), cache.get("q"))
        k, ck = self.k_conv(self.k_proj(x), cache.get("k"))
        v, cv = self.v_conv(self.v_proj(x), cache.get("v"))
        q = F.normalize(F.silu(q).view(heads), dim=-1)
        k = F.normalize(F.silu(k).reshape(steps), dim=-1)  # token t's steps at rows t·n_h .. t·n_h + n_h − 1
        v = F.silu(v).reshape(steps)
        coefficients = self.feature_coefficients()
        state = cache.get("state")
        if state is None:
            state = dict(self.initial_weights.items())
        gates = self.gates(x)
        # The memory runs in float32 (float64 stays float64) whatever the autocast: under bf16/16-mixed the
        # projections above are low precision, but the inner state, its updates and Newton–Schulz are not, since
        # their rounding accumulates over the sequence (docs/memory.md §11). A streamed MemoryState is the rule's
        # own output, already in its precision. Where the plan routes the call to fla (CUDA, a rule fla computes),
        # q, k and v stay as the projections give them: fla's kernels take them so and compute in float32.
        memory_dtype = torch.promote_types(q.dtype, torch.float32)
        fla = self.takes_fla(q.dtype, q.device)

        def exact(t):
            return t.to(memory_dtype) if isinstance(t, torch.Tensor) else t

        with torch.autocast(x.device.type, enabled=False):
            o, state = memorize(
                *((q, k, v) if fla else map(exact, (q, k, v))), self.memory,
                initial_state={name: exact(w) for name, w in state.items()} if isinstance(state, dict) else state,
                coefficients=exact(coefficients), impl="auto", gates={g: exact(value) for g, value in gates.items()})
        o = self.out_norm(o).reshape(B, T, self.n_heads * self.head_dim) * F.silu(self.g_proj(x))
        return self.o_proj(o), {"q": cq, "k": ck, "v": cv, "state": state}

    @torch.compiler.assume_constant_result  # a compiled block takes the answer as a constant (no guard on the cache)
    def takes_fla(self, dtype: torch.dtype, device: torch.device) -> bool:
        """Whether the plan routes this layer's calls in ``dtype`` on ``device`` to fla (it does not depend on B or T);
        asked once per dtype and device."""
        key = (dtype, str(device))
        if key not in self.fla_routes:
            shapes = Shapes(1, 1, self.n_heads, self.head_dim, self.head_dim)
            self.fla_routes[key] = plan(self.memory, shapes, dtype, device).path == "fla"
        return self.fla_routes[key]

    def state_bytes(self, batch_size: int = 1, dtype_bytes: int = 4) -> int:
        """Bytes of the fixed-size streaming state: memory weights (+ momentum), window cache, conv caches (+ W_0 with
        reset_every)."""
        c = self.config
        weights = sum(p.numel() for p in self.initial_weights.values())
        momentum = sum(p.shape[0] * math.prod(self.optimizer.state_shape(tuple(p.shape[1:])) or (0,))
                       for p in self.initial_weights.values())  # per head
        inner = self.n_heads * self.head_dim
        window = 0 if c.window is None else (c.window - 1) * self.n_heads * self._cached_floats_per_token()
        # mid-chunk (the plan's ``carried``): the evaluation point W̃ (read token), or the pending Σ g and, per level
        # of commits, its gates ∏α, Ση, ∏θ (read chunk)
        carried = plan(c, Shapes(batch_size, 1, self.n_heads, self.head_dim, self.head_dim)).carried
        commits = self.learning_rule.commits(self.initial_weights, c.chunk_size)
        gates = len(PENDING_GATES) * self.n_heads * len(levels(commits))
        mid_chunk = {"nothing": 0, "eval_weights": weights, "pending": weights + gates}[carried]
        conv = (1 + 2 * self.steps) * (self.q_conv.kernel_size - 1) * inner
        reset = 0 if self.learning_rule.reset_period() is None else weights  # the W_0 a reset returns to
        return batch_size * dtype_bytes * (weights + momentum + mid_chunk + window + conv + reset)

    def _cached_floats_per_token(self) -> int:  # per step of the rule
        return 2 * self.head_dim + 1 + int(self.config.normalize)  # key, value (+ normaliser column), γ

    def cache_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """Growth of the state per token read: the global window (window=None) keeps every past token."""
        return 0 if self.config.window is not None else (dtype_bytes * self.n_heads * self.steps
                                                         * self._cached_floats_per_token())
