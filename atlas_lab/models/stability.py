"""Long-context stability: read a long sequence in streaming pieces and watch the logits and memory weights.

A model is *stable* on a sequence when every logit is finite and the memories' weights stay bounded: they grow no
faster than linearly in the tokens read (a memory without forgetting, like linear attention, is a sum of its writes
and grows linearly; a diverging one grows geometrically) and stay below ``WEIGHT_LIMIT``. Reading in pieces (the
streaming cache carries the state) is how a long document is evaluated, and it costs memory in the piece length only.
The held-out text the checks read is ``atlas_lab.data.corpus.held_out_bytes`` (data sits above models).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..memory import MemoryState

# Past 1e6 a float32 weight rounds a unit-size write to 1e6 · 2^-23 ≈ 0.12: the memory no longer stores what it reads.
WEIGHT_LIMIT = 1e6
# Linear growth multiplies the largest weight by 4 from a quarter of the read to all of it; 25 % slack for noise.
LINEAR_GROWTH = 4 * 1.25


@dataclass
class LongRead:
    """What ``read_long`` saw: the first piece with a non-finite logit (its first token index, or None), the largest
    |logit| and |memory weight| over all finite pieces read, the tokens read, and ``weights``: the largest |memory
    weight| after each piece."""

    tokens: int
    first_nonfinite: int | None
    max_abs_logit: float
    max_abs_weight: float
    weights: list[float]

    @property
    def finite(self) -> bool:
        return self.first_nonfinite is None

    @property
    def growth(self) -> float:
        """max |weight| over the whole read / over its first quarter (1 when the model has no memory weights)."""
        quarter = max(self.weights[:max(1, len(self.weights) // 4)])
        return self.max_abs_weight / quarter if quarter > 0 else 1.0

    @property
    def bounded(self) -> bool:
        return self.finite and self.max_abs_weight < WEIGHT_LIMIT and self.growth <= LINEAR_GROWTH


def memory_states(cache):
    """Every MemoryState inside a model's streaming cache (nested dicts and lists)."""
    if isinstance(cache, MemoryState):
        yield cache
    elif isinstance(cache, dict):
        for value in cache.values():
            yield from memory_states(value)
    elif isinstance(cache, (list, tuple)):
        for value in cache:
            yield from memory_states(value)


def max_abs_weight(cache) -> float:
    """max |w| over the weights W_t of every memory in the cache; 0 when there is none, NaN when any weight is NaN
    (Python's max would skip it). The optimisers' states act on the read only through W_t (momentum adds S to W,
    muon reads S through the scale-free NS, the retention rules read their accumulator as W = T(A): for ℓq retention
    ‖W‖_q = ‖A‖_q^{3−q}, so a large A is a small W); a state that grows while W does not ends in an overflow, which
    the finite check catches."""
    out = 0.0
    for state in memory_states(cache):
        for w in state.weights.values():
            m = w.detach().abs().max().item()
            if math.isnan(m):
                return m
            out = max(out, m)
    return out


@torch.no_grad()
def read_long(model, input_ids: torch.Tensor, piece: int = 512) -> LongRead:
    """Stream ``input_ids`` [B, T] through ``model`` (a LanguageModel) ``piece`` tokens at a time.

    Stops at the first piece whose logits are not all finite.
    """
    cache, max_logit, weights = None, 0.0, []
    T = input_ids.shape[1]
    for start in range(0, T, piece):
        logits, cache = model(input_ids[:, start:start + piece], cache)
        weight = max_abs_weight(cache)
        if not torch.isfinite(logits).all() or not math.isfinite(weight):
            return LongRead(T, start, max_logit, max(weights, default=0.0), weights)
        max_logit = max(max_logit, logits.abs().max().item())
        weights.append(weight)
    return LongRead(T, None, max_logit, max(weights, default=0.0), weights)
