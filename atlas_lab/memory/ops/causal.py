"""Causal contractions over tokens that keep a later token's NaN or inf out of earlier rows.

The chunk-parallel paths form sums Σ_{i ≤ t} X[t, i] Y_i as one matrix product over every token i of a chunk, the
causal mask held by X's zeros. In X @ Y a later token's non-finite Y_i still reaches row t (0 · NaN = NaN), and so
does a non-finite X[t, i] above the boundary in a product X ⊙ P. ``causal_operands`` rewrites the operands so that
a non-finite value reaches exactly the rows at or after its own token; finite products are unchanged (the rewritten
entries were zeros). A ``torch.where`` passes a zero gradient to what it drops, so the backward is cut there too.
"""
from __future__ import annotations

import functools
import operator

import torch


def tensor_cache(maxsize: int | None = 256):
    """``functools.lru_cache`` for functions that build constant tensors, built outside inference mode: a tensor first
    made during Lightning's validation (torch.inference_mode) would otherwise be an inference tensor, which no later
    training step may save for backward."""
    def decorate(build):
        @functools.lru_cache(maxsize=maxsize)
        @functools.wraps(build)
        def cached(*args):
            with torch.inference_mode(False):
                return build(*args)
        return cached
    return decorate


@tensor_cache()
def causal_mask(n: int, L: int, device=None) -> torch.Tensor:
    """[n, L] bool, True where token i ≤ t + L − n: the last n of the L tokens are the rows' own, the rest precede.

    Cached per (n, L, device): every chunk of a length shares one mask (read only), instead of building it with four
    kernels per product and chunk."""
    return torch.arange(L, device=device) <= torch.arange(n, device=device).unsqueeze(-1) + (L - n)


@tensor_cache()
def strictly_lower(n: int, device=None) -> torch.Tensor:
    """[n, n] bool, True where j < t (cached like ``causal_mask``)."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril(-1)


def non_finite_tokens(y: torch.Tensor) -> torch.Tensor:
    """[N, L] bool: True where token i's entries y[:, i] hold a NaN or an inf. y: [N, L, ...].

    On the CPU: the token's max is NaN or +inf, or its min NaN or −inf, exactly then (max and min propagate NaN): two
    reductions that read y once each, without the copy of y's size that max |y| makes (measured faster on one core,
    docs/performance.md §f). Elsewhere: max |y| is NaN or inf, two kernels and a compare where the CPU's form takes
    five (launches, the GPU model's cost; isfinite + all take five too). Detached: a flag, never part of the graph."""
    y = y.detach().flatten(2)
    if y.device.type == "cpu":
        return ~((y.amax(-1) < torch.inf) & (y.amin(-1) > -torch.inf))
    return ~(y.abs().amax(-1) < torch.inf)


def causal_operands(X: torch.Tensor, *factors: torch.Tensor):
    """(X', *factors') for Σ_{i ≤ t + L − n} X[t, i] · (product of the factors of token i), safe to sum over all i.

    X: [N, n, L] (the last n of the L tokens are the rows' own); factors: [N, L, ...] per-token tensors.
    X' = 0 above the causal boundary and NaN at (t, i) on or below it where a factor of token i is non-finite;
    those factors are zeroed. Rows t ≥ i then hold NaN, rows t < i are exactly what finite inputs would give.
    """
    bad = functools.reduce(operator.or_, (non_finite_tokens(y) for y in factors))  # [N, L]
    return (_causal_rows(X, bad), *(torch.where(bad.reshape(bad.shape + (1,) * (y.dim() - 2)), 0.0, y)
                                    for y in factors))


def _causal_rows(X: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    """X' [N, n, L]: 0 above the causal boundary, NaN on or below it in the columns of the tokens ``bad`` [N, L]."""
    n, L = X.shape[-2:]
    return torch.where(causal_mask(n, L, X.device), torch.where(bad.unsqueeze(-2), torch.nan, X), 0.0)


class _ZeroedProduct(torch.autograd.Function):
    """X @ torch.where(bad, 0, Y) for X [N, n, L], Y [N, L, k], bad [N, L, 1]. Backward: autograd's through the product
    and the where, the where's zeros written in place into the product's own gradient of Y (a fresh tensor;
    masked_fill_: the values torch.where gives, without its copy)."""

    @staticmethod
    def forward(ctx, X, Y, bad):
        Y = torch.where(bad, 0.0, Y)
        ctx.save_for_backward(X, Y, bad)
        return X @ Y

    @staticmethod
    def backward(ctx, grad):
        X, Y, bad = ctx.saved_tensors
        dX = grad @ Y.mT if ctx.needs_input_grad[0] else None
        dY = (X.mT @ grad).masked_fill_(bad, 0.0) if ctx.needs_input_grad[1] else None
        return dX, dY, None


def causal_matmul(X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """Σ_{i ≤ t + L − n} X[t, i] Y_i: X @ Y for X [N, n, L], Y [N, L, k] (``causal_operands``). Returns [N, n, k].
    On the CPU the product's backward zeroes the non-finite tokens' rows in place (``_ZeroedProduct``: no copy);
    elsewhere autograd's where, as the GPU model's fit counted it (the same values)."""
    bad = non_finite_tokens(Y)
    X, bad = _causal_rows(X, bad), bad.unsqueeze(-1)
    if X.device.type == "cpu":
        return _ZeroedProduct.apply(X, Y, bad)
    return X @ torch.where(bad, 0.0, Y)
