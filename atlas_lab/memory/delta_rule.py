"""The exact online rule (chunk size 1) of the linear memory with the l2 bias and gd: the gated delta rule.

    u_t = η_t (v_t − W_{t−1} Diag(f_t) φ(k_t)),   W_t = W_{t−1} Diag(α_t) + u_t φ(k_t)ᵀ,   y_t = W_t φ(q_t)

with α_t one retention per head (α_t I) or one per key channel (KDA), and W_{t−1} Diag(f_t) the weights the
gradient is taken at (the learning rule's evaluation scale): f_t = 1 at the state (gradient_at="state", the Titans
form), f_t = α_t at the retained weights (gradient_at="retained": the form of Gated DeltaNet's and KDA's papers and of
fla), times an erase gate e_t (Gated DeltaNet-2; its write gate is already in v_t). η_t is already multiplied by
the window weight γ_t of c = 1.
``reference`` runs it token by token and ``chunked`` at chunk size 1 would do the same; here it runs a block of C
tokens at a time (the WY / UT form of DeltaNet). With c_t = Σ_{s≤t} log α_s inside the block (a vector over the key
channels for a retention per channel), k̃_t = f_t ⊙ k_t (the erase key) and W_0 the state before the block:

    W_t = W_0 Diag(e^{c_t}) + Σ_{i≤t} u_i (e^{c_t − c_i} ⊙ k_i)ᵀ
    (I + diag(η) L) U = diag(η) (V − (e^{c_{t−1}} ⊙ K̃) W_0ᵀ),   L[t, i] = Σ_d k̃_t[d] k_i[d] e^{c_{t−1}[d] − c_i[d]}
    Y = (e^{c} ⊙ Q) W_0ᵀ + M U,                                M[t, i] = Σ_d q_t[d] k_i[d] e^{c_t[d] − c_i[d]}

(L over i < t, M over i ≤ t): one unit-lower-triangular solve per block; every exponent is ≤ 0. With one α per head
the exponents are the same on every channel and L, M are (K Kᵀ), (Q Kᵀ) times a decay matrix; per channel they are
contracted over an [n, n, D] tensor of decays (the block is 16 tokens there, to bound that tensor). The block size is
an implementation detail: the result is the same function for any block.

Where this departs from fla's chunked kernels (fla/ops/kda, fla/ops/gdn2): they compute the same recurrence over
chunks of 64 in float32 (bf16 inputs), and their fast path (``safe_gate``) clamps the log-decay to [lower_bound, 0)
(−5 recommended) so that decays factorised within a sub-chunk stay in float range: a bound on the model. Here every
α in [0, 1] is taken as it is, in the caller's dtype (float64 in the tests), at the cost of the [n, n, D] decays.
"""
from __future__ import annotations

import torch

from .ops.causal import causal_operands
from .components import declares

BLOCK = 64
CHANNEL_BLOCK = 16  # per-channel decays: a block holds an [N, n, n, D] tensor of them


def delta_rule_applies(mem, bias, optimizer) -> bool:
    """The components of the delta rule, as they declare it: a linear map (linear), the l2 bias, gd (at chunk size 1,
    window 1). A subclass that overrides ``forward``, ``loss`` or ``update`` without declaring it again runs its own."""
    return (declares(mem, "linear_map", "forward") and declares(bias, "delta_rule", "loss")
            and declares(optimizer, "delta_rule", "update"))


def delta_rule_block(channels: bool) -> int:
    """Tokens per block of ``delta_rule``: fewer where the retention is per channel."""
    return CHANNEL_BLOCK if channels else BLOCK


def _pairwise_decay(c_rows, c, mask):
    """e^{c_rows[t] − c[i]} where mask[t, i], else 0. c_rows, c: [N, n] or [N, n, D] -> [N, n, n] or [N, n, n, D]."""
    if c.dim() == 2:
        return torch.exp(torch.where(mask, c_rows[:, :, None] - c[:, None, :], -torch.inf))
    return torch.exp(torch.where(mask[:, :, None], c_rows[:, :, None, :] - c[:, None, :, :], -torch.inf))


def _decayed_products(x, k, decay):
    """P[t, i] = Σ_d x_t[d] k_i[d] decay[t, i(, d)]: (X Kᵀ) ⊙ decay for a per-head decay [N, n, n], one contraction
    over the channels for a per-channel one [N, n, n, D]."""
    if decay.dim() == 3:
        return decay * (x @ k.mT)
    return torch.einsum("ntid,nid->nti", x[:, :, None, :] * decay, k)


def delta_rule(phi_q, phi_k, v, alpha, eta, W, scale=None, block: int | None = None):
    """phi_q, phi_k: [N, T, D]; v: [N, T, d_v]; alpha: [N, T] or, per key channel, [N, T, D]; eta: [N, T];
    W: [N, d_v, D] (the state before); scale: f [N, T] or [N, T, D], the gradient at W_{t−1} Diag(f_t) (None: f = 1).

    Returns (y [N, T, d_v], W after the last token). α = 0 is read as the smallest positive float.
    """
    channels = alpha.dim() == 3
    ys, block = [], block or delta_rule_block(channels)
    log_alpha = torch.log(alpha.clamp_min(torch.finfo(alpha.dtype).tiny))
    erase_key = phi_k if scale is None else phi_k * (scale if scale.dim() == 3 else scale.unsqueeze(-1))
    for q, k, k_e, v_c, la, e in zip(*(x.split(block, 1) for x in (phi_q, phi_k, erase_key, v, log_alpha, eta))):
        n = q.shape[1]
        c = la.cumsum(1)  # c_t, t = 1..n
        c_prev = c - la  # c_{t−1}
        i = torch.arange(n, device=q.device)
        strictly_lower = i[:, None] > i[None, :]
        lower = i[:, None] >= i[None, :]
        L = _decayed_products(k_e, k, _pairwise_decay(c_prev, c, strictly_lower))
        A = torch.eye(n, dtype=q.dtype, device=q.device) + e[:, :, None] * L
        read_state = (k_e * torch.exp(c_prev)) @ W.mT if channels else torch.exp(c_prev)[:, :, None] * (k_e @ W.mT)
        U = torch.linalg.solve_triangular(A, e[:, :, None] * (v_c - read_state), upper=False, unitriangular=True)
        M = _decayed_products(q, k, _pairwise_decay(c, c, lower))
        M, _, U_past = causal_operands(M, k, U)  # a later token's NaN key or update stays out of earlier rows
        if channels:
            ys.append((q * torch.exp(c)) @ W.mT + M @ U_past)
            W = torch.exp(c[:, -1])[:, None, :] * W + U.mT @ (k * torch.exp(c[:, -1:] - c))  # e^{c_n − c_i} ⊙ k_i
        else:
            ys.append(torch.exp(c)[:, :, None] * (q @ W.mT) + M @ U_past)
            decay_to_end = torch.exp(c[:, -1:] - c)  # e^{c_n − c_i}
            W = torch.exp(c[:, -1])[:, None, None] * W + (U * decay_to_end[:, :, None]).mT @ k
    return torch.cat(ys, 1), W
