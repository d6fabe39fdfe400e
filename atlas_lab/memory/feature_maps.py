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

import torch

from .ops.causal import tensor_cache
from .components import Component, build


def taylor_coefficients(degree: int) -> torch.Tensor:
    """a_i = 1/i!, i = 0..degree (float64)."""
    return torch.tensor([1.0 / math.factorial(i) for i in range(degree + 1)], dtype=torch.float64)


@tensor_cache(maxsize=None)
@torch.compiler.assume_constant_result  # torch.compile takes the tensors as constants (it cannot trace itertools)
def _monomials(d: int, i: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Index tuples of the degree-i monomials of d variables and their multinomial scales sqrt(i!/∏β_j!) (computed in
    float64, then rounded to ``dtype``), on ``device`` once: a copy from the host in every call would be a host
    synchronisation on a GPU."""
    combos = list(itertools.combinations_with_replacement(range(d), i))
    index = torch.tensor(combos, dtype=torch.long).reshape(len(combos), i)
    scale = torch.tensor(
        [math.sqrt(math.factorial(i) / math.prod(math.factorial(m) for m in Counter(c).values())) for c in combos],
        dtype=torch.float64,
    )
    return index.to(device), scale.to(device=device, dtype=dtype)


def polynomial(x: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
    """φ_p(x): [..., d] -> [..., C(d+p, p)] with φ(q)·φ(k) = Σ_i a_i (q·k)^i.

    coefficients: a = [a_0, ..., a_p], non-negative, shape [p+1].
    """
    d = x.shape[-1]
    a = coefficients.to(x.dtype)
    blocks = []
    for i in range(a.shape[0]):
        index, scale = _monomials(d, i, x.device, x.dtype)
        if i == 0:
            block = x.new_ones(*x.shape[:-1], 1)
        else:
            block = x[..., index].prod(-1)
        blocks.append(block * (scale * a[i].sqrt()))
    return torch.cat(blocks, dim=-1)


class FeatureMap(Component):
    """φ: [..., d] -> [..., D]. ``coefficients``: the map's learnable a_i where it has them (a layer keeps them as a
    parameter, initialised to ``initial_coefficients()``); None where it has none."""

    def dim(self, d: int) -> int:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor, coefficients: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def initial_coefficients(self) -> torch.Tensor | None:
        return None


class Identity(FeatureMap):
    """φ(x) = x."""

    def dim(self, d):
        return d

    def __call__(self, x, coefficients=None):
        return x

    def __repr__(self):
        return "identity"


class Polynomial(FeatureMap):
    """φ_p with learnable a_i ≥ 0 (default 1/i!): φ(q)·φ(k) = Σ_{i≤p} a_i (q·k)^i."""

    def __init__(self, degree: int = 2):
        if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
            raise ValueError(f"{type(self).__name__.lower()} degree must be an int >= 1, got {degree!r}")
        self.degree = degree

    def dim(self, d):
        return math.comb(d + self.degree, self.degree)

    def initial_coefficients(self):
        return taylor_coefficients(self.degree)

    def __call__(self, x, coefficients=None):
        if coefficients is None:
            coefficients = taylor_coefficients(self.degree)
        if coefficients.shape != (self.degree + 1,):
            raise ValueError(f"polynomial coefficients must have shape [degree+1] = [{self.degree + 1}], "
                             f"got {tuple(coefficients.shape)}")
        return polynomial(x, coefficients)

    def __repr__(self):
        return f"polynomial(p={self.degree})"


class Taylor(Polynomial):
    """φ_p with a_i fixed to 1/i!: the truncated Taylor series of exp(q·k)."""

    def initial_coefficients(self):
        return None

    def __call__(self, x, coefficients=None):
        if coefficients is not None:
            raise ValueError("feature_map='taylor' has fixed coefficients 1/i!; "
                             "use feature_map='polynomial' to learn them")
        return polynomial(x, taylor_coefficients(self.degree))

    def __repr__(self):
        return f"taylor(p={self.degree})"


FEATURE_MAPS = {"identity": Identity, "polynomial": Polynomial, "taylor": Taylor}


def build_feature_map(spec, where: str = "feature_map") -> FeatureMap:
    """A feature map from a short-hand (``polynomial``), a short-hand with options ({name: polynomial, degree: 3}),
    a FeatureMap or a class_path dict."""
    return build("feature map", FEATURE_MAPS, spec, FeatureMap, where)
