"""The recurrent state that ``memorize`` returns and accepts back as ``initial_state``."""
from __future__ import annotations

from dataclasses import dataclass

import torch


PENDING_GATES = ("alpha", "eta", "theta")  # the gates of MemoryState.pending (∏ α, Σ η, ∏ θ), beside its "grad"


@dataclass
class MemoryState:
    """Everything needed to continue a sequence exactly where a previous call stopped.

    weights:      W_t, the memory weights after the last token: {name: [B, H, *shape]}.
    optimizer_state: the memory optimiser's state S_t, {name: [B, H, *state_shape]}: the momentum of
                  ``momentum`` / ``muon``, Adam's (m, v), the accumulator A_t of ``lq_retention`` /
                  ``kl_retention``; None for ``gd``.
    eval_weights: W̃, the weights at which gradients of the chunk in progress are taken (the state at
                  the end of the previous chunk); None when ``offset == 0`` (a chunk boundary).
    keys, values, gamma: the last min(c−1, seen) raw keys [B, H, m, d_k], values [B, H, m, d_v] and
                  window weights [B, H, m] (every past token for ``window=None``): the tokens of
                  earlier calls that still lie in the Omega window.
    offset:       tokens of the chunk in progress already consumed, 0 ≤ offset < chunk_size (read="chunk": of the
                  longest level's chunk, LearningRule.commits).
    pending:      read="chunk" only: the commits in progress, one per level C (the weight matrices that commit every
                  C tokens: all of them every chunk_size tokens but for a rule of levels), {C: {"grad": {name:
                  [B, H, *shape]} (Σ of its tokens' window gradients), "alpha", "eta", "theta": [B, H] (∏ α, Σ η,
                  ∏ θ)}}; None when every level is at a boundary, and for read="token".
    initial:      reset_every only: W_0, the weights the state returns to at each reset, {name: [B, H, *shape]}.
    since_reset:  reset_every only: tokens read since the last reset, 0 ≤ since_reset < reset_every.

    With ``normalize=True`` the last row of the linear memory's W (and of S, and the last column of
    ``values``, a constant 1) is the running normaliser z.
    """

    weights: dict[str, torch.Tensor]
    optimizer_state: dict[str, torch.Tensor] | None
    eval_weights: dict[str, torch.Tensor] | None
    keys: torch.Tensor
    values: torch.Tensor
    gamma: torch.Tensor
    offset: int = 0
    pending: dict | None = None
    initial: dict[str, torch.Tensor] | None = None
    since_reset: int = 0

    def detach(self) -> "MemoryState":
        """A copy cut from the autograd graph (for truncated backpropagation through long streams)."""
        def d(x):
            return None if x is None else {n: w.detach() for n, w in x.items()}

        pending = map_pending(self.pending, d, lambda x: x.detach())
        return MemoryState(d(self.weights), d(self.optimizer_state), d(self.eval_weights), self.keys.detach(),
                           self.values.detach(), self.gamma.detach(), self.offset, pending, d(self.initial),
                           self.since_reset)


def map_pending(pending, weights, gate):
    """``pending`` (MemoryState.pending, or None) with ``weights`` applied to each level's {name: Σ g} and ``gate``
    to each of its gates."""
    if pending is None:
        return None
    return {C: {"grad": weights(level["grad"]), **{g: gate(level[g]) for g in PENDING_GATES}}
            for C, level in pending.items()}
