"""The chunk kernel's computation in plain PyTorch, chunk by chunk (same arguments and results as
``triton.chunk_linear_memory``, the Triton kernel next to this file); the kernels' unit-test oracle. The equations
are in that module's docstring."""
from __future__ import annotations

import torch

from ..causal import causal_operands


def chunk_linear_memory_naive(q, k, v, gamma, a, Cw, W0, We0, *, offset, chunk_size, window, bias,
                              m=None, s=None, Cs=None, S0=None):
    N, T, _ = q.shape
    L = k.shape[1]
    c = L if window is None else window
    W, We, S = W0, We0, S0
    ys, t0 = [], 0
    while t0 < T:
        n = min(chunk_size - (offset if t0 == 0 else 0), T - t0)
        first = L - T + t0
        lo = max(first - c + 1, 0)
        u, g = k[:, lo:first + n], gamma[:, lo:first + n]
        delta = u @ We.mT - v[:, lo:first + n] if bias == "l2" else -v[:, lo:first + n]
        pos = torch.arange(first, first + n, device=q.device).unsqueeze(-1)
        idx = torch.arange(lo, first + n, device=q.device)
        band = torch.where((idx <= pos) & (idx > pos - c), g.unsqueeze(-2), 0.0)  # Γ [N, n, window keys]
        C = Cw[:, t0:t0 + n, :n] @ band
        qc = q[:, t0:t0 + n]
        C_y, u_y, delta_y = causal_operands(C, u, delta)  # a later key's NaN stays out of earlier rows
        y = a[:, t0:t0 + n, None] * (qc @ W.mT) + (C_y * (qc @ u_y.mT)) @ delta_y
        W_end = a[:, t0 + n - 1, None, None] * W + (delta * C[:, -1, :, None]).mT @ u
        if S is not None:
            y = y + m[:, t0:t0 + n, None] * (qc @ S.mT)
            W_end = W_end + m[:, t0 + n - 1, None, None] * S
            S = s[:, t0 + n - 1, None, None] * S + (delta * (Cs[:, t0:t0 + n, :n] @ band)[:, -1, :, None]).mT @ u
        ys.append(y)
        W_eval_last, W, We = We, W_end, W_end
        t0 += n
    return torch.cat(ys, 1), W, S, W_eval_last
