"""The MLP chunk kernel's computation in plain PyTorch, chunk by chunk (same arguments and results as
``triton.chunk_mlp_memory``, the Triton kernel next to this file); the kernel's unit-test oracle. The equations are
in that module's docstring."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..causal import causal_operands

ACTIVATIONS = {"gelu": F.gelu, "silu": F.silu, "relu": F.relu, "tanh": torch.tanh}


def activation_grad(name: str, z: torch.Tensor) -> torch.Tensor:
    """σ'(z), written out (autograd differentiates it: the kernel's σ'' is its derivative)."""
    if name == "gelu":
        return torch.special.ndtr(z) + z * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    if name == "silu":
        s = torch.sigmoid(z)
        return s * (1 + z * (1 - s))
    if name == "relu":
        return (z > 0).to(z.dtype)
    return 1 - torch.tanh(z) ** 2


def hidden(activation: str, z: torch.Tensor, H: int, gated: bool):
    """h from the first layer's pre-activations z [..., H1]: σ(z), or gated σ(z_a) ⊙ z_b (z = [z_a, z_b])."""
    if not gated:
        return ACTIVATIONS[activation](z)
    za, zb = z.split(H, -1)
    return ACTIVATIONS[activation](za) * zb


def first_factor(activation: str, z: torch.Tensor, back: torch.Tensor, gated: bool):
    """δ1 [..., H1] from back = W̃2ᵀ δ2 [..., H]: back ⊙ σ'(z), or gated [back ⊙ z_b ⊙ σ'(z_a), back ⊙ σ(z_a)]."""
    if not gated:
        return back * activation_grad(activation, z)
    za, zb = z.split(back.shape[-1], -1)
    return torch.cat([back * zb * activation_grad(activation, za), back * ACTIVATIONS[activation](za)], -1)


def window_factors(q, k, v, gamma, E1, E2, t0, n, window, bias, activation, gated):
    """A chunk's window keys u, their h, δ2, δ1 at W̃ = (E1, E2) and Γ [N, n, keys] (the chunk: n tokens from t0)."""
    T, L, H = q.shape[1], k.shape[1], E2.shape[-1]
    first = L - T + t0
    lo = max(first - window + 1, 0)
    u, g, vv = k[:, lo:first + n], gamma[:, lo:first + n], v[:, lo:first + n]
    z = u @ E1.mT
    h = hidden(activation, z, H, gated)
    d2 = h @ E2.mT - vv if bias == "l2" else -vv
    d1 = first_factor(activation, z, d2 @ E2, gated)
    pos = torch.arange(first, first + n, device=q.device).unsqueeze(-1)
    idx = torch.arange(lo, first + n, device=q.device)
    return u, h, d2, d1, torch.where((idx <= pos) & (idx > pos - window), g.unsqueeze(-2), 0.0)


def chunk_mlp_memory_naive(q, k, v, gamma, a, Cw, W1, W2, We1, We2, *, offset, chunk_size, window, bias,
                           activation, m=None, s=None, Cs=None, S1=None, S2=None, gated=False):
    T = q.shape[1]
    momentum = S1 is not None
    ys, t0 = [], 0
    E1, E2 = (We1, We2) if offset else (W1, W2)  # W̃ of the first chunk: an input only where it continues one
    while t0 < T:
        n = min(chunk_size - (offset if t0 == 0 else 0), T - t0)
        u, h, d2, d1, band = window_factors(q, k, v, gamma, E1, E2, t0, n, window, bias, activation, gated)
        C = Cw[:, t0:t0 + n, :n] @ band
        qc, ac = q[:, t0:t0 + n], a[:, t0:t0 + n, None]
        C_y, u_y, h_y, d1_y, d2_y = causal_operands(C, u, h, d1, d2)  # a later key's NaN stays out of earlier rows
        zq = ac * (qc @ W1.mT) + (C_y * (qc @ u_y.mT)) @ d1_y
        if momentum:
            zq = zq + m[:, t0:t0 + n, None] * (qc @ S1.mT)
        hq = hidden(activation, zq, W2.shape[-1], gated)
        y = ac * (hq @ W2.mT) + (C_y * (hq @ h_y.mT)) @ d2_y
        if momentum:
            y = y + m[:, t0:t0 + n, None] * (hq @ S2.mT)
        ys.append(y)
        c = C[:, -1, :, None]
        an = a[:, t0 + n - 1, None, None]
        W1n, W2n = an * W1 + (d1 * c).mT @ u, an * W2 + (d2 * c).mT @ h
        if momentum:
            mn, sn = m[:, t0 + n - 1, None, None], s[:, t0 + n - 1, None, None]
            W1n, W2n = W1n + mn * S1, W2n + mn * S2
            cs = (Cs[:, t0:t0 + n, :n] @ band)[:, -1, :, None]
            S1, S2 = sn * S1 + (d1 * cs).mT @ u, sn * S2 + (d2 * cs).mT @ h
        W1, W2 = W1n, W2n
        last = (E1, E2)
        E1, E2 = W1, W2
        t0 += n
    return torch.cat(ys, 1), W1, W2, S1, S2, last[0], last[1]


def chunk_mlp_muon_naive(q, k, v, gamma, a, s, Cw, Cs, W1, W2, S1, S2, We1, We2, *, offset, chunk_size, window,
                         bias, activation, ns_steps, ns_coefficients, gated=False):
    """``muon.chunk_mlp_muon``'s computation chunk by chunk: every S_t in closed form, D(S_t) = NS_k(S_t), W_t from
    them (the chunked path's ``_chunk_transformed`` on the MLP's factors; gated: the first layer's W_a and W_b each
    their own NS_k)."""
    from ..newton_schulz.reference import newton_schulz

    def ns(S, pair):  # NS_k of each matrix: the stacked pair [..., 2H, D] as its two halves
        if not pair:
            return newton_schulz(S, ns_steps, ns_coefficients)
        return torch.cat([newton_schulz(x, ns_steps, ns_coefficients) for x in S.chunk(2, -2)], -2)

    H = W2.shape[-1]
    T = q.shape[1]
    ys, t0 = [], 0
    E1, E2 = (We1, We2) if offset else (W1, W2)
    while t0 < T:
        n = min(chunk_size - (offset if t0 == 0 else 0), T - t0)
        u, h, d2, d1, band = window_factors(q, k, v, gamma, E1, E2, t0, n, window, bias, activation, gated)
        Cs_ = Cs[:, t0:t0 + n, :n] @ band  # [N, n, keys]
        cw, st, at = Cw[:, t0:t0 + n, :n], s[:, t0:t0 + n, None, None], a[:, t0:t0 + n, None, None]

        def directions(S, d, x, pair=False):  # S_t = s_t S + Σ_i C'[t, i] d_i x_iᵀ for every t, and D(S_t)
            S_t = st * S.unsqueeze(1) + torch.einsum("nti,nio,nij->ntoj", Cs_, d, x)
            return S_t, ns(S_t, pair)

        S1_t, D1 = directions(S1, d1, u, gated)
        S2_t, D2 = directions(S2, d2, h)
        qc = q[:, t0:t0 + n]
        zq = a[:, t0:t0 + n, None] * (qc @ W1.mT) + torch.einsum("ntj,njhd,ntd->nth", cw, D1, qc)
        hq = hidden(activation, zq, H, gated)
        ys.append(a[:, t0:t0 + n, None] * (hq @ W2.mT) + torch.einsum("ntj,njvh,nth->ntv", cw, D2, hq))
        W1n = at[:, -1] * W1 + torch.einsum("nj,njhd->nhd", cw[:, -1], D1)
        W2n = at[:, -1] * W2 + torch.einsum("nj,njvh->nvh", cw[:, -1], D2)
        S1, S2 = S1_t[:, -1], S2_t[:, -1]
        W1, W2 = W1n, W2n
        last = (E1, E2)
        E1, E2 = W1, W2
        t0 += n
    return torch.cat(ys, 1), W1, W2, S1, S2, last[0], last[1]
