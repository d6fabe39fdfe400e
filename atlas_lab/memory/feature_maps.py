"""Feature maps φ: R^d -> R^D applied to keys and queries before the memory (Atlas §4.2).

- ``identity``:   φ(x) = x, D = d.
- ``polynomial``: all monomials of degree 0..p in the symmetric basis, degree block i scaled by
  sqrt(a_i · i!/∏β_j!), so that φ(q)·φ(k) = Σ_i a_i (q·k)^i exactly; D = C(d+p, p).
  The coefficients a_i ≥ 0 are learnable in a layer (default 1/i!).
- ``taylor``:     the polynomial map with a_i fixed to 1/i!: φ(q)·φ(k) = Σ_{i≤p} (q·k)^i / i!,
  the truncated Taylor series of the exponential kernel exp(q·k).
"""
from __future__ import annotations

import itertools
import math
from collections import Counter
from functools import lru_cache

import torch

FEATURE_MAPS = ("identity", "polynomial", "taylor")


def feature_dim(feature_map: str, d: int, degree: int = 2) -> int:
    """D, the output width of φ for inputs of width d."""
    if feature_map == "identity":
        return d
    return math.comb(d + degree, degree)


def taylor_coefficients(degree: int) -> torch.Tensor:
    """a_i = 1/i!, i = 0..degree (float64)."""
    return torch.tensor([1.0 / math.factorial(i) for i in range(degree + 1)], dtype=torch.float64)


@lru_cache(maxsize=None)
def _monomials(d: int, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Index tuples of the degree-i monomials of d variables and their multinomial scales sqrt(i!/∏β_j!)."""
    combos = list(itertools.combinations_with_replacement(range(d), i))
    index = torch.tensor(combos, dtype=torch.long).reshape(len(combos), i)
    scale = torch.tensor(
        [math.sqrt(math.factorial(i) / math.prod(math.factorial(m) for m in Counter(c).values())) for c in combos],
        dtype=torch.float64,
    )
    return index, scale


def polynomial(x: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
    """φ_p(x): [..., d] -> [..., C(d+p, p)] with φ(q)·φ(k) = Σ_i a_i (q·k)^i.

    coefficients: a = [a_0, ..., a_p], non-negative, shape [p+1].
    """
    d = x.shape[-1]
    a = coefficients.to(x.dtype)
    blocks = []
    for i in range(a.shape[0]):
        index, scale = _monomials(d, i)
        scale = scale.to(device=x.device, dtype=x.dtype)
        if i == 0:
            block = x.new_ones(*x.shape[:-1], 1)
        else:
            block = x[..., index.to(x.device)].prod(-1)
        blocks.append(block * (scale * a[i].sqrt()))
    return torch.cat(blocks, dim=-1)


def apply_feature_map(x: torch.Tensor, feature_map: str, degree: int = 2, coefficients: torch.Tensor | None = None):
    """φ(x) for the named feature map. ``coefficients`` (polynomial only) defaults to 1/i!."""
    if feature_map == "identity":
        return x
    if feature_map == "taylor":
        if coefficients is not None:
            raise ValueError("feature_map='taylor' has fixed coefficients 1/i!; "
                             "use feature_map='polynomial' to learn them")
        return polynomial(x, taylor_coefficients(degree))
    if feature_map == "polynomial":
        if coefficients is None:
            coefficients = taylor_coefficients(degree)
        if coefficients.shape != (degree + 1,):
            raise ValueError(f"polynomial coefficients must have shape [degree+1] = [{degree + 1}], "
                             f"got {tuple(coefficients.shape)}")
        return polynomial(x, coefficients)
    raise ValueError(f"unknown feature_map {feature_map!r}; valid choices: {', '.join(FEATURE_MAPS)}")
