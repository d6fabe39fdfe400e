"""Memory optimisers: the rule that turns the window gradient g_t into new memory weights (docs/memory.md §3).

    gd:        W_t = α_t W_{t-1} − η_t g_t
    momentum:  S_t = θ_t S_{t-1} − η_t g_t,   W_t = α_t W_{t-1} + S_t          (Titans form, S_0 = 0)
    muon:      S_t = θ_t S_{t-1} + g_t,       W_t = α_t W_{t-1} − η_t NS_k(S_t)  (Atlas eq. 32)

``step`` is the literal one-token rule used by the reference loop; ``chunk_coefficients`` solves the
same recurrences inside a chunk in closed form (cumulative products as [n, n] decay matrices).

With chunk-start reads (``read="chunk"``, docs/memory.md §4.1) a chunk of b tokens is one step of the same rule:
``accumulate`` gathers its tokens' gradients and gates, ``commit`` takes the step at the chunk's end with

    ḡ = (1/b) Σ_t g_t,   α_c = ∏_t α_t,   η_c = Σ_t η_t,   θ_c = ∏_t θ_t
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from . import newton_schulz_cpu
from .causal import causal_mask, causal_matmul, strictly_lower

OPTIMIZERS = ("gd", "momentum", "muon")
NS_COEFFICIENTS = {
    "quintic": (3.4445, -4.7750, 2.0315),  # Muon's: fast, singular values end up in ~[0.5, 1.5]
    "cubic": (1.5, -0.5, 0.0),  # converges to the polar factor U Vᵀ as the number of steps grows
}
NS_IMPLS = ("auto", "kernel", "bmm")


def newton_schulz(G: torch.Tensor, steps: int = 5, coefficients: str = "quintic", eps: float = 1e-7,
                  impl: str = "auto") -> torch.Tensor:
    """NS_k(G) for a batch of matrices G [..., m, n] (each matrix separately).

    X_0 = G / (‖G‖_F + eps), on Gᵀ when m > n; k times: A = X Xᵀ, X ← a X + (b A + c A²) X.
    impl: "bmm" runs the iterations as batched matmuls on a cache-sized block of matrices at a time, and the
    backward recomputes them (``_NSIterations``) instead of keeping 3k intermediates per matrix; "kernel" runs
    them fused per matrix in the compiled CPU kernel (``newton_schulz_cpu``, float32/float64 on the CPU);
    "auto" takes the kernel where it applies and builds.
    """
    if coefficients not in NS_COEFFICIENTS:
        raise ValueError(f"unknown ns_coefficients {coefficients!r}; valid choices: {', '.join(NS_COEFFICIENTS)}")
    if impl not in NS_IMPLS:
        raise ValueError(f"unknown newton_schulz impl {impl!r}; valid choices: {', '.join(NS_IMPLS)}")
    transpose = G.shape[-2] > G.shape[-1]
    X = G.mT if transpose else G
    batch = X.shape[:-2]
    X = X.reshape(-1, *X.shape[-2:])
    X = X / (torch.linalg.matrix_norm(X, keepdim=True) + eps)
    if impl == "kernel" and not newton_schulz_cpu.applies(X):
        raise ValueError(f"newton_schulz impl 'kernel' takes float32/float64 CPU tensors where the kernel builds, "
                         f"not {X.dtype} on {X.device.type}; use impl 'auto' or 'bmm'")
    if impl == "kernel" or (impl == "auto" and newton_schulz_cpu.applies(X)):
        X = newton_schulz_cpu.NSKernel.apply(X, steps, *NS_COEFFICIENTS[coefficients])
    else:
        m, pad = X.shape[-2], _row_padding(X.shape[-2])
        if pad:  # zero rows stay zero: A, B and every X_j gain zero rows (and columns), the rest is unchanged
            X = F.pad(X, (0, 0, 0, pad))
        X = _NSIterations.apply(X, steps, *NS_COEFFICIENTS[coefficients])[:, :m]
    X = X.reshape(*batch, *X.shape[-2:])
    return X.mT if transpose else X


def _row_padding(m: int) -> int:
    """Zero rows that take a small m up to a multiple of 8, where batched matmul kernels run full vectors.

    Measured (1 CPU thread, AVX-512, 16,384 matrices, forward+backward): 15×16 → 16×16: 1.5–1.7× faster;
    6×8 and 7×28: 1.5×; 4×16 → 8×16: 1.2× slower; 45×180 and 153×612: no change.
    """
    return -m % 8 if 4 < m < 32 else 0


NS_BLOCK_ELEMENTS = 1 << 18  # matrices per block: about 1 MiB of fp32 iterate, which stays in cache


def _ns_iterates(X, steps, a, b, c):
    """X_0 … X_k and the A_j = X_j X_jᵀ, B_j = b A_j + c A_j² of k iterations. X: [M, m, n], m ≤ n."""
    Xs, As, Bs = [X], [], []
    for _ in range(steps):
        A = Xs[-1] @ Xs[-1].mT
        B = torch.baddbmm(A, A, A, beta=b, alpha=c) if c != 0.0 else b * A
        Xs.append(torch.baddbmm(Xs[-1], B, Xs[-1], beta=a))
        As.append(A)
        Bs.append(B)
    return Xs, As, Bs


class _NSIterations(torch.autograd.Function):
    """X_k from X_0 [M, m, n] by k steps X ← a X + B X, B = b A + c A², A = X Xᵀ (m ≤ n).

    Backward, per step from the last (A, B symmetric), with Ḡ = ∂L/∂X_{j+1}:
      ∂B = Ḡ X_jᵀ,  ∂A = b ∂B + c (∂B A + A ∂B),  ∂L/∂X_j = a Ḡ + B Ḡ + (∂A + ∂Aᵀ) X_j.
    """

    @staticmethod
    def forward(ctx, X, steps, a, b, c):
        ctx.save_for_backward(X)
        block = max(1, NS_BLOCK_ELEMENTS // (X.shape[-2] * X.shape[-1]))
        ctx.args = (steps, a, b, c, block)
        return torch.cat([_ns_iterates(x, steps, a, b, c)[0][-1] for x in X.split(block)])

    @staticmethod
    def backward(ctx, grad):
        (X,) = ctx.saved_tensors
        steps, a, b, c, block = ctx.args
        out = []
        for x, g in zip(X.split(block), grad.split(block)):
            Xs, As, Bs = _ns_iterates(x, steps, a, b, c)
            for j in reversed(range(steps)):
                dB = g @ Xs[j].mT
                dA = torch.baddbmm(dB, dB, As[j], beta=b, alpha=c).baddbmm_(As[j], dB, alpha=c) if c != 0.0 \
                    else b * dB
                g = torch.baddbmm(torch.baddbmm(g, Bs[j], g, beta=a), dA + dA.mT, Xs[j])
            out.append(g)
        return torch.cat(out), None, None, None, None


def orthogonalize(S: torch.Tensor, ndim: int, steps: int, coefficients: str, ns=newton_schulz) -> torch.Tensor:
    """NS_k on 2-D weights (the trailing ``ndim`` dims of S); a 1-D parameter passes through (plain momentum).

    ns: the Newton–Schulz implementation (this module's, or a kernel with the same signature)."""
    return ns(S, steps, coefficients) if ndim == 2 else S


def step(optimizer, W, S, g, alpha, eta, theta, ns_steps=5, ns_coefficients="quintic", ns=newton_schulz):
    """One token of the optimiser, literally. W, S, g: dicts name -> [N, *shape]; gates: [N].

    Returns (W_t, S_t); S is None for gd.
    """
    def bc(x, like):
        return x.reshape(x.shape + (1,) * (like.dim() - 1))

    W_new, S_new = {}, {}
    for n, w in W.items():
        a, e = bc(alpha, w), bc(eta, w)
        if optimizer == "gd":
            W_new[n] = a * w - e * g[n]
        elif optimizer == "momentum":
            S_new[n] = bc(theta, w) * S[n] - e * g[n]
            W_new[n] = a * w + S_new[n]
        elif optimizer == "muon":
            S_new[n] = bc(theta, w) * S[n] + g[n]
            W_new[n] = a * w - e * orthogonalize(S_new[n], w.dim() - 1, ns_steps, ns_coefficients, ns)
        else:
            raise ValueError(f"unknown optimizer {optimizer!r}; valid choices: {', '.join(OPTIMIZERS)}")
    return W_new, (S_new if optimizer != "gd" else None)


def accumulate(pending, g, alpha, eta, theta):
    """The chunk in progress with more tokens (chunk-start reads): Σ g, ∏ α, Σ η, ∏ θ.

    pending: None (a chunk starts) or {"grad": {name: [N, *shape]}, "alpha", "eta", "theta": [N]}; g: the tokens'
    summed window gradients {name: [N, *shape]}; gates: their ∏ α, Σ η and ∏ θ, [N]."""
    if pending is None:
        return {"grad": g, "alpha": alpha, "eta": eta, "theta": theta}
    return {"grad": {n: pending["grad"][n] + g[n] for n in g}, "alpha": pending["alpha"] * alpha,
            "eta": pending["eta"] + eta, "theta": pending["theta"] * theta}


def commit(optimizer, W, S, pending, chunk_size, ns_steps, ns_coefficients, ns=newton_schulz):
    """(W_c, S_c): one optimiser step with the chunk's mean gradient ḡ = Σ g / b and gates ∏ α, Σ η, ∏ θ."""
    g = {n: x / chunk_size for n, x in pending["grad"].items()}
    return step(optimizer, W, S, g, pending["alpha"], pending["eta"], pending["theta"], ns_steps, ns_coefficients, ns)


def decay_matrix(x: torch.Tensor) -> torch.Tensor:
    """P[t, j] = ∏_{l=j+1..t} x_l for j ≤ t, 0 above the diagonal. x: [N, n] in [0, 1] -> [N, n, n].

    Computed in log space as a masked cumulative sum (no division by small products).
    """
    n = x.shape[-1]
    logx = torch.log(x.clamp_min(torch.finfo(x.dtype).tiny))
    rep = logx.unsqueeze(-1).expand(*x.shape, n)  # rep[l, j] = log x_l
    below = strictly_lower(n, x.device)  # j < l
    seg = torch.where(below, rep, 0.0).cumsum(-2)  # seg[t, j] = Σ_{j<l≤t} log x_l
    return torch.where(causal_mask(n, n, x.device), seg.exp(), 0.0)


def chunk_coefficients(optimizer, alpha, eta, theta):
    """Closed forms of the optimiser over one chunk of n tokens, started from (W_0, S_0). Gates: [N, n].

    Returns a dict of tensors with
      W_t = a[t] W_0 + m[t] S_0 + Σ_j Cw[t, j] g_j                      (gd, momentum)
      S_t = s[t] S_0 + Σ_j Cs[t, j] g_j                                 (momentum, muon)
      muon: W_t = a[t] W_0 + Σ_j Cw[t, j] NS(S_j)
    a, m, s: [N, n]; Cw, Cs: [N, n, n] lower triangular. A non-finite gate of token j reaches rows t ≥ j only.
    """
    lower = causal_mask(alpha.shape[-1], alpha.shape[-1], alpha.device)

    def times_eta(P):  # P[t, j] η_j on and below the diagonal (where, not a product: a NaN η_j stays in rows t ≥ j)
        return torch.where(lower, -P * eta.unsqueeze(-2), 0.0)

    A = decay_matrix(alpha)  # ∏ α over (j, t]
    a = A[..., 0] * alpha[..., :1]  # ∏ α over [0, t]
    out = {"a": a}
    if optimizer == "gd":
        out["Cw"] = times_eta(A)
    elif optimizer == "momentum":
        Th = decay_matrix(theta)
        s = Th[..., 0] * theta[..., :1]
        AT = causal_matmul(A, Th)  # Σ_{m=j..t} A[t,m] Θ[m,j]
        out.update(m=causal_matmul(A, s.unsqueeze(-1)).squeeze(-1), s=s, Cw=times_eta(AT), Cs=times_eta(Th))
    elif optimizer == "muon":
        Th = decay_matrix(theta)
        out.update(s=Th[..., 0] * theta[..., :1], Cs=Th, Cw=times_eta(A))
    else:
        raise ValueError(f"unknown optimizer {optimizer!r}; valid choices: {', '.join(OPTIMIZERS)}")
    return out
