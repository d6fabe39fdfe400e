"""The exact online rule (chunk size 1) of the linear memory with the l2 bias and gd: the gated delta rule.

    u_t = η_t (v_t − W_{t−1} φ(k_t)),   W_t = α_t W_{t−1} + u_t φ(k_t)ᵀ,   y_t = W_t φ(q_t)

(η_t already multiplied by the window weight γ_t of c = 1). ``reference`` runs it token by token and
``chunked`` at chunk size 1 would do the same; here it runs a block of C tokens at a time (the WY / UT
form of DeltaNet). With c_t = Σ_{s≤t} log α_s inside the block and W_0 the state before it:

    W_t = e^{c_t} W_0 + Σ_{i≤t} e^{c_t − c_i} u_i φ(k_i)ᵀ
    (I + diag(η) L) U = diag(η) (V − diag(e^{c_{t−1}}) K W_0ᵀ),  L[t, i] = e^{c_{t−1} − c_i} k_t·k_i (i < t)
    Y = diag(e^{c_t}) Q W_0ᵀ + (M ⊙ Q Kᵀ) U,                         M[t, i] = e^{c_t − c_i}        (i ≤ t)

one unit-lower-triangular solve per block; every exponent is ≤ 0. The block size is an implementation
detail: the result is the same function for any block.
"""
from __future__ import annotations

import torch

from .causal import causal_operands
from .memories import LinearMemory
from .attentional_biases import L2
from .optimizers import GD

BLOCK = 64


def delta_rule_applies(mem, bias, optimizer) -> bool:
    """The components of the delta rule: a linear memory, the l2 bias, gd (at chunk size 1, window 1)."""
    return isinstance(mem, LinearMemory) and isinstance(bias, L2) and isinstance(optimizer, GD)


def delta_rule(phi_q, phi_k, v, alpha, eta, W, block: int | None = None):
    """phi_q, phi_k: [N, T, D]; v: [N, T, d_v]; alpha, eta: [N, T]; W: [N, d_v, D] (the state before).

    Returns (y [N, T, d_v], W after the last token). α = 0 is read as the smallest positive float.
    """
    ys, block = [], block or BLOCK
    log_alpha = torch.log(alpha.clamp_min(torch.finfo(alpha.dtype).tiny))
    for q, k, v_c, la, e in zip(*(x.split(block, 1) for x in (phi_q, phi_k, v, log_alpha, eta))):
        n = q.shape[1]
        c = la.cumsum(-1)  # c_t, t = 1..n
        c_prev = c - la  # c_{t−1}
        i = torch.arange(n, device=q.device)
        strictly_lower = i[:, None] > i[None, :]
        lower = i[:, None] >= i[None, :]
        L = torch.exp(torch.where(strictly_lower, c_prev[:, :, None] - c[:, None, :], -torch.inf)) * (k @ k.mT)
        A = torch.eye(n, dtype=q.dtype, device=q.device) + e[:, :, None] * L
        rhs = e[:, :, None] * (v_c - torch.exp(c_prev)[:, :, None] * (k @ W.mT))
        U = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
        M = torch.exp(torch.where(lower, c[:, :, None] - c[:, None, :], -torch.inf))
        M, k_past, U_past = causal_operands(M, k, U)  # a later token's NaN key or update stays out of earlier rows
        ys.append(torch.exp(c)[:, :, None] * (q @ W.mT) + (M * (q @ k_past.mT)) @ U_past)
        decay_to_end = torch.exp(c[:, -1:] - c)  # e^{c_n − c_i}
        W = torch.exp(c[:, -1])[:, None, None] * W + (U * decay_to_end[:, :, None]).mT @ k
    return torch.cat(ys, 1), W
