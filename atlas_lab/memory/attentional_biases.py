"""Attentional biases: the per-token bias ℓ(y, v) of the memory's output y = M(φ(k)) (docs/memory.md §3).

    l2:     ℓ = ½‖y − v‖²                                     ∂ℓ/∂y = y − v
    dot:    ℓ = −⟨y, v⟩                                       ∂ℓ/∂y = −v
    huber:  ℓ = ½‖r‖² if ‖r‖ ≤ δ, else δ‖r‖ − ½δ²   (r = y − v)  ∂ℓ/∂y = r · min(1, δ/‖r‖)      (Miras' Yaad)
    lp:     ℓ = ‖r‖_p^p = Σ_j |r_j|^p                           ∂ℓ/∂y = p |r|^{p−1} sign(r)   (Miras' Moneta)

An attentional bias that gives ``grad`` (∂ℓ/∂y) keeps the built-in memories' analytic gradients, rank-1 factors
δ uᵀ per weight matrix; one with only ``loss`` takes torch.func's gradients (docs/components.md).
"""
from __future__ import annotations

import torch

from .components import Component, build


class AttentionalBias(Component):
    """ℓ(y, v) for outputs y and values v [..., d_v] -> [...]; ``grad`` (∂ℓ/∂y, same shape as y) is optional."""

    grad = None

    def loss(self, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class L2(AttentionalBias):
    """ℓ = ½‖y − v‖² (the delta rule's)."""

    delta_rule = True  # ∇ℓ = y − v: with a linear map and gd, the gated delta rule (delta_rule.py)

    def loss(self, y, v):
        return 0.5 * ((y - v) ** 2).sum(-1)

    def grad(self, y, v):
        return y - v

    def __repr__(self):
        return "l2"


class Dot(AttentionalBias):
    """ℓ = −⟨y, v⟩ (linear attention's; its gradient does not depend on the weights)."""

    weight_free_gradient = True
    linear_attention = True  # ∇ℓ = −v: the chunk kernel's "dot" form (memory/plan.py: kernel_bias)

    def loss(self, y, v):
        return -(y * v).sum(-1)

    def grad(self, y, v):
        return -v

    def __repr__(self):
        return "dot"


class Huber(AttentionalBias):
    """ℓ = ½‖r‖² inside ‖r‖ ≤ δ, δ‖r‖ − ½δ² outside (r = y − v): l2 near the target, l1-like growth for outliers.

    Miras' Yaad takes a data-dependent δ_t; here δ is one constant (``delta``)."""

    def __init__(self, delta: float = 1.0):
        if not delta > 0:
            raise ValueError(f"huber delta must be > 0, got {delta!r}")
        self.delta = float(delta)

    def _norm(self, r):
        return r.norm(dim=-1, keepdim=True)

    def loss(self, y, v):
        r = y - v
        n = self._norm(r).squeeze(-1)
        return torch.where(n <= self.delta, 0.5 * n * n, self.delta * n - 0.5 * self.delta ** 2)

    def grad(self, y, v):
        r = y - v
        n = self._norm(r)
        return torch.where(n <= self.delta, r, r * (self.delta / n))

    def __repr__(self):
        return f"huber(δ={self.delta:g})"


class Lp(AttentionalBias):
    """ℓ = Σ_j |y_j − v_j|^p, p ≥ 1 (p = 2: twice l2; Miras' Moneta uses p = 3)."""

    def __init__(self, p: float = 3.0):
        if not p >= 1:
            raise ValueError(f"lp p must be >= 1, got {p!r}")
        self.p = float(p)

    def loss(self, y, v):
        return (y - v).abs().pow(self.p).sum(-1)

    def grad(self, y, v):
        r = y - v
        return self.p * r.abs().pow(self.p - 1) * torch.sign(r)

    def __repr__(self):
        return f"lp(p={self.p:g})"


ATTENTIONAL_BIASES = {"l2": L2, "dot": Dot, "huber": Huber, "lp": Lp}


def build_attentional_bias(spec, where: str = "attentional_bias") -> AttentionalBias:
    """An attentional bias from a short-hand (``lp``), a short-hand with options ({name: lp, p: 4}), an AttentionalBias
    or a class_path dict."""
    return build("attentional bias", ATTENTIONAL_BIASES, spec, AttentionalBias, where)
