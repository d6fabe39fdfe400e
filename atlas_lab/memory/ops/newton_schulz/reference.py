"""Newton–Schulz NS_k in PyTorch: the reference the kernels of this folder are tested against, and the batched-matmul
path (``impl="bmm"``) beside the compiled CPU kernel (``impl="cpu"``); the coefficient triples and schedules every
implementation reads."""
from __future__ import annotations

import torch
from torch.nn import functional as F

from . import cpu as newton_schulz_cpu

NS_COEFFICIENTS = {
    "quintic": (3.4445, -4.7750, 2.0315),  # Muon's: fast, singular values end up in ~[0.5, 1.5]
    "cubic": (1.5, -0.5, 0.0),  # converges to the polar factor U Vᵀ as the number of steps grows
}
# per-iteration coefficients (a_j, b_j, c_j), one triple per step: ns_steps is the schedule's length
NS_SCHEDULES = {
    # LaCT's (Zhang et al., arXiv 2505.23884; its official ttt_operation.py): five tuned quintic steps
    "lact": ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
             (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)),
}
NS_CHOICES = (*NS_COEFFICIENTS, *NS_SCHEDULES)
NS_IMPLS = ("bmm", "cpu")


def ns_schedule(coefficients: str, steps: int) -> tuple:
    """The (a, b, c) of each of the ``steps`` iterations: a fixed triple repeated, or a schedule (of that length)."""
    if coefficients in NS_SCHEDULES:
        schedule = NS_SCHEDULES[coefficients]
        if steps != len(schedule):
            raise ValueError(f"ns_coefficients {coefficients!r} is a schedule of {len(schedule)} steps: ns_steps must "
                             f"be {len(schedule)}, got {steps!r}")
        return schedule
    if coefficients not in NS_COEFFICIENTS:
        raise ValueError(f"unknown ns_coefficients {coefficients!r}; valid choices: {', '.join(NS_CHOICES)}")
    return (NS_COEFFICIENTS[coefficients],) * steps


def newton_schulz(G: torch.Tensor, steps: int = 5, coefficients: str = "quintic", eps: float = 1e-7,
                  impl: str = "bmm") -> torch.Tensor:
    """NS_k(G) for a batch of matrices G [..., m, n] (each matrix separately).

    X_0 = G / (‖G‖_F + eps), on Gᵀ when m > n; k times: A = X Xᵀ, X ← a X + (b A + c A²) X, with one (a, b, c) for
    every step (quintic, cubic) or the j-th triple of a schedule at step j (lact: ``NS_SCHEDULES``).
    impl: "bmm" runs the iterations as batched matmuls on a cache-sized block of matrices at a time, and the
    backward recomputes them (``_NSIterations``) instead of keeping 3k intermediates per matrix; "cpu" runs
    them fused per matrix in the compiled CPU kernel (``cpu.newton_schulz_cpu``, float32/float64 on the CPU, one
    triple for every step), the normalisation and the transpose inside it with the same values bit for bit.
    Which one a memory uses is the plan's choice (memory/plan.py: ``newton_schulz_variant``).
    """
    schedule = ns_schedule(coefficients, steps)
    if impl not in NS_IMPLS:
        raise ValueError(f"unknown newton_schulz impl {impl!r}; valid choices: {', '.join(NS_IMPLS)}")
    fixed = coefficients in NS_COEFFICIENTS  # the kernel takes one triple for every step
    if impl == "cpu" and not (fixed and newton_schulz_cpu.applies(G)):
        raise ValueError(f"newton_schulz impl 'cpu' takes float32/float64 CPU tensors where the kernel builds and "
                         f"one triple for every step, not {G.dtype} on {G.device.type} with {coefficients!r}; use "
                         f"impl 'bmm'")
    if impl == "cpu":  # the normalisation and the transpose inside the kernel, the same values (cpu.cpp)
        out = newton_schulz_cpu.newton_schulz_cpu(G.reshape(-1, *G.shape[-2:]), steps, *NS_COEFFICIENTS[coefficients],
                                                  eps)
        return out.view(G.shape)
    transpose = G.shape[-2] > G.shape[-1]
    X = G.mT if transpose else G
    batch = X.shape[:-2]
    X = X.reshape(-1, *X.shape[-2:])
    X = X / (torch.linalg.matrix_norm(X, keepdim=True) + eps)
    m, pad = X.shape[-2], _row_padding(X.shape[-2])
    if pad:  # zero rows stay zero: A, B and every X_j gain zero rows (and columns), the rest is unchanged
        X = F.pad(X, (0, 0, 0, pad))
    X = _NSIterations.apply(X, schedule)[:, :m]
    X = X.reshape(*batch, *X.shape[-2:])
    return X.mT if transpose else X


def _row_padding(m: int) -> int:
    """Zero rows that take a small m up to a multiple of 8, where batched matmul kernels run full vectors.

    Measured (1 CPU thread, AVX-512, 16,384 matrices, forward+backward): 15×16 → 16×16: 1.5–1.7× faster;
    6×8 and 7×28: 1.5×; 4×16 → 8×16: 1.2× slower; 45×180 and 153×612: no change.
    """
    return -m % 8 if 4 < m < 32 else 0


NS_BLOCK_ELEMENTS = 1 << 18  # matrices per block: about 1 MiB of fp32 iterate, which stays in cache


def _ns_iterates(X, schedule):
    """X_0 … X_k and the A_j = X_j X_jᵀ, B_j = b_j A_j + c_j A_j² of k iterations (schedule: k triples (a_j, b_j,
    c_j)). X: [M, m, n], m ≤ n."""
    Xs, As, Bs = [X], [], []
    for a, b, c in schedule:
        A = Xs[-1] @ Xs[-1].mT
        B = torch.baddbmm(A, A, A, beta=b, alpha=c) if c != 0.0 else b * A
        Xs.append(torch.baddbmm(Xs[-1], B, Xs[-1], beta=a))
        As.append(A)
        Bs.append(B)
    return Xs, As, Bs


class _NSIterations(torch.autograd.Function):
    """X_k from X_0 [M, m, n] by k steps X ← a_j X + B X, B = b_j A + c_j A², A = X Xᵀ (m ≤ n; schedule: the k
    triples).

    Backward, per step from the last (A, B symmetric), with Ḡ = ∂L/∂X_{j+1}:
      ∂B = Ḡ X_jᵀ,  ∂A = b_j ∂B + c_j (∂B A + A ∂B),  ∂L/∂X_j = a_j Ḡ + B Ḡ + (∂A + ∂Aᵀ) X_j.
    """

    @staticmethod
    def forward(ctx, X, schedule):
        ctx.save_for_backward(X)
        block = max(1, NS_BLOCK_ELEMENTS // (X.shape[-2] * X.shape[-1]))
        ctx.args = (schedule, block)
        return torch.cat([_ns_iterates(x, schedule)[0][-1] for x in X.split(block)])

    @staticmethod
    def backward(ctx, grad):
        (X,) = ctx.saved_tensors
        schedule, block = ctx.args
        out = []
        for x, g in zip(X.split(block), grad.split(block)):
            Xs, As, Bs = _ns_iterates(x, schedule)
            for j in reversed(range(len(schedule))):
                a, b, c = schedule[j]
                dB = g @ Xs[j].mT
                dA = torch.baddbmm(dB, dB, As[j], beta=b, alpha=c).baddbmm_(As[j], dB, alpha=c) if c != 0.0 \
                    else b * dB
                g = torch.baddbmm(torch.baddbmm(g, Bs[j], g, beta=a), dA + dA.mT, Xs[j])
            out.append(g)
        return torch.cat(out), None
