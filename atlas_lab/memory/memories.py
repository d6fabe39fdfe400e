"""Memory architectures M_W: R^D -> R^{d_v} and attentional biases (docs/memory.md §3).

A memory is a function of weights W (a dict of matrices [out, in]) written once, in terms of
``apply(name, u) = u @ W[name]ᵀ``. The same ``forward`` then serves every place it is needed:
evaluated at fixed weights, at per-token weights materialised by the optimiser, or in the chunked
"dual form" where W_t = a_t W_0 + Σ_i C[t, i] δ_i u_iᵀ is never built.

Built-in memories also give their per-token loss gradients analytically as rank-1 factors,
∇_{W_n} ℓ_i = δ_{n,i} u_{n,i}ᵀ (``gradient_factors``, for an attentional bias that gives ∂ℓ/∂y). Any
``torch.nn.Module`` mapping φ(k) [D] to [d_v] is a custom memory (``ModuleMemory``); its gradients come from
torch.func. A new architecture subclasses ``Memory`` (docs/components.md).

    linear:     M(k) = W φ(k)
    mlp:        M(k) = r(k) + N(W_L σ(… σ(W_1 φ(k))))          hidden width E·d_v
    gated_mlp:  M(k) = r(k) + N(W_1 (σ(W_2 φ(k)) ⊙ W_3 φ(k)))  (Atlas++)
    r(k) = k (the raw key, before φ) when residual and d_k = d_v, else 0.
    N = the identity, or with output_norm=True the parameter-free layer norm LN(z) = (z − mean z) / √(var z + ε)
    over the d_v outputs (the Miras form; it keeps −⟨M(φ(k)), v⟩ bounded below, docs/memory.md). Its Jacobian is
    applied to ∂ℓ/∂y before the last layer's factor, so the gradients stay rank-1 factors.

The attentional bias (``attentional_biases.py``) enters the factors only through its ∂ℓ/∂y at the output.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .components import Component, build

class _GeluGrad(torch.autograd.Function):
    """σ'(z) = Φ(z) + z·φ(z) for the exact GELU, with its own derivative σ''(z) = φ(z)·(2 − z²):
    one graph node where the composed expression records eight (the chunked path differentiates it)."""

    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        pdf = torch.exp(-0.5 * z * z) * (1.0 / math.sqrt(2.0 * math.pi))
        return torch.special.ndtr(z) + z * pdf

    @staticmethod
    def backward(ctx, grad):
        (z,) = ctx.saved_tensors
        return grad * (2.0 - z * z) * torch.exp(-0.5 * z * z) * (1.0 / math.sqrt(2.0 * math.pi))


def _gelu_grad(z):
    return _GeluGrad.apply(z)


def _silu_grad(z):
    s = torch.sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


# name -> (σ, σ')
ACTIVATIONS = {
    "gelu": (F.gelu, _gelu_grad),
    "silu": (F.silu, _silu_grad),
    "relu": (F.relu, lambda z: (z > 0).to(z.dtype)),
    "tanh": (torch.tanh, lambda z: 1.0 - torch.tanh(z) ** 2),
}


LN_EPS = 1e-5


def layer_norm(z: torch.Tensor) -> torch.Tensor:
    """Parameter-free layer norm over the last dim: (z − μ) / √(σ² + ε)."""
    return F.layer_norm(z, z.shape[-1:], eps=LN_EPS)


def layer_norm_backward(z: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """J_LN(z)ᵀ g = (g − mean g − n · mean(g ⊙ n)) / √(σ² + ε), n = LN(z): ∂ℓ/∂z from ∂ℓ/∂LN(z)."""
    zc = z - z.mean(-1, keepdim=True)
    rstd = torch.rsqrt(zc.pow(2).mean(-1, keepdim=True) + LN_EPS)
    n = zc * rstd
    return rstd * (g - g.mean(-1, keepdim=True) - n * (g * n).mean(-1, keepdim=True))


def fixed_apply(W):
    """apply(name, u) = u @ W[name]ᵀ; works for u [in] with W [out, in] and for batched u [N, L, in] with
    W [N, out, in]."""
    return lambda n, u: u @ W[n].mT


class Memory(Component):
    """A memory architecture M_W: R^D -> R^{d_v} with weights W = {name: [out, in]}.

    shapes(D, d_k, d_v) -> {name: (out, in)}; init_weights(H, D, d_k, d_v, generator, dtype, device) -> {name:
    [H, out, in]}; forward(apply, phi, x) -> y, written with apply(name, u) = u @ W[name]ᵀ so that the chunked path
    can evaluate it in dual form; x is the raw key (for a residual). Optional: ``gradient_factors`` (rank-1
    factors of ∇ℓ), else the gradients come from torch.func.  ``dual_form``: forward is written with ``apply``."""

    gradient_factors = None
    dual_form = True  # forward is written with ``apply`` (False: read only at materialised weights)

    def shapes(self, D: int, d_k: int, d_v: int) -> dict:
        raise NotImplementedError

    def init_weights(self, H, D, d_k, d_v, generator=None, dtype=torch.float32, device=None):
        return _normal_init(H, self.shapes(D, d_k, d_v), generator, dtype, device)

    def phi_weights(self, D: int, d_k: int, d_v: int) -> tuple:
        """The names of the weights whose input is φ(k) (the first layer; memory/cost.py counts the backward
        through the others). By default those of input size D."""
        return tuple(n for n, (_, i) in self.shapes(D, d_k, d_v).items() if i == D)

    def forward(self, apply, phi, x):
        raise NotImplementedError

    def token_forward(self, W, phi, x):
        """y = M_W(φ) at fixed weights (one token under torch.func, or a batch)."""
        return self.forward(fixed_apply(W), phi, x)


class LinearMemory(Memory):
    """M(k) = W φ(k); W: [d_v, D], zeros at start unless given."""

    linear_map = True  # y = W φ(k): gates per key channel scale W's columns; the delta rule's memory

    def __repr__(self):
        return "linear"

    def shapes(self, D: int, d_k: int, d_v: int) -> dict:
        return {"W": (d_v, D)}

    def init_weights(self, H, D, d_k, d_v, generator=None, dtype=torch.float32, device=None):
        return {"W": torch.zeros(H, d_v, D, dtype=dtype, device=device)}

    def forward(self, apply, phi, x):
        return apply("W", phi)

    def gradient_factors(self, W, phi, x, v, bias):
        """Rank-1 factors of ∇ℓ_i at W for a batch of tokens: {name: (δ [N, L, out], u [N, L, in])}."""
        return {"W": (bias.grad(phi @ W["W"].mT, v), phi)}


def _normal_init(H, shapes, generator, dtype, device):
    out = {}
    for n, (o, i) in shapes.items():
        w = torch.randn(H, o, i, generator=generator, dtype=torch.float64) / math.sqrt(i)
        out[n] = w.to(dtype=dtype, device=device)
    return out


class MLPMemory(Memory):
    """M(k) = r(k) + N(W_L σ(… σ(W_1 φ(k)))); W_1: [E·d_v, D], W_l: [E·d_v, E·d_v], W_L: [d_v, E·d_v].

    output_norm: N = parameter-free layer norm over the outputs (else the identity)."""

    def __init__(self, depth: int = 2, expansion: int = 4, activation: str = "gelu", residual: bool = True,
                 output_norm: bool = False):
        self.output_norm = output_norm
        if depth < 1:
            raise ValueError(f"mlp memory depth must be >= 1, got {depth}")
        if expansion < 1:
            raise ValueError(f"mlp memory expansion must be >= 1, got {expansion}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; valid choices: {', '.join(ACTIVATIONS)}")
        self.depth, self.expansion, self.activation, self.residual = depth, expansion, activation, residual

    def shapes(self, D, d_k, d_v):
        h = self.expansion * d_v
        dims = [D] + [h] * (self.depth - 1) + [d_v]
        return {f"W{i + 1}": (dims[i + 1], dims[i]) for i in range(self.depth)}

    def __repr__(self):
        return f"mlp(L={self.depth},E={self.expansion}{',LN' if self.output_norm else ''})"

    def phi_weights(self, D, d_k, d_v):
        return ("W1",)

    def _output(self, x, z):
        """y = r(x) + N(z) from the last layer's pre-output z."""
        y = layer_norm(z) if self.output_norm else z
        return y + x if self.residual and x.shape[-1] == y.shape[-1] else y

    def _output_grad(self, bias, x, z, v):
        """∂ℓ/∂z at the last layer's pre-output z."""
        dy = bias.grad(self._output(x, z), v)
        return layer_norm_backward(z, dy) if self.output_norm else dy

    gated = False  # the first layer a gated pair (GatedMLPMemory)

    @property
    def two_layer(self) -> bool:
        """M(k) = r(k) + W2 σ(W1 φ(k)): the MLP chunk kernel's memory (ops/chunk_mlp_memory; depth 2, no output
        norm)."""
        return self.depth == 2 and not self.output_norm

    def forward(self, apply, phi, x):
        act = ACTIVATIONS[self.activation][0]
        h = phi
        for i in range(1, self.depth):
            h = act(apply(f"W{i}", h))
        return self._output(x, apply(f"W{self.depth}", h))

    def gradient_factors(self, W, phi, x, v, bias):
        act, dact = ACTIVATIONS[self.activation]
        hs, zs = [phi], []
        for i in range(1, self.depth):
            zs.append(hs[-1] @ W[f"W{i}"].mT)
            hs.append(act(zs[-1]))
        delta = self._output_grad(bias, x, hs[-1] @ W[f"W{self.depth}"].mT, v)
        factors = {}
        for i in range(self.depth, 0, -1):
            factors[f"W{i}"] = (delta, hs[i - 1])
            if i > 1:
                delta = (delta @ W[f"W{i}"]) * dact(zs[i - 2])
        return factors


class GatedMLPMemory(MLPMemory):
    """Atlas++: M(k) = r(k) + N(W_1 (σ(W_2 φ(k)) ⊙ W_3 φ(k))); W_1: [d_v, E·d_v], W_2, W_3: [E·d_v, D]."""

    def __init__(self, expansion: int = 4, activation: str = "gelu", residual: bool = True,
                 output_norm: bool = False):
        super().__init__(depth=2, expansion=expansion, activation=activation, residual=residual,
                         output_norm=output_norm)

    def shapes(self, D, d_k, d_v):
        h = self.expansion * d_v
        return {"W1": (d_v, h), "W2": (h, D), "W3": (h, D)}

    gated = True

    @property
    def two_layer(self) -> bool:
        """M(k) = r(k) + W1 (σ(W2 φ(k)) ⊙ W3 φ(k)): the MLP chunk kernel's gated memory (no output norm)."""
        return not self.output_norm

    def __repr__(self):
        return f"gated_mlp(E={self.expansion}{',LN' if self.output_norm else ''})"

    def phi_weights(self, D, d_k, d_v):
        return ("W2", "W3")

    def forward(self, apply, phi, x):
        act = ACTIVATIONS[self.activation][0]
        return self._output(x, apply("W1", act(apply("W2", phi)) * apply("W3", phi)))

    def gradient_factors(self, W, phi, x, v, bias):
        act, dact = ACTIVATIONS[self.activation]
        z2, z3 = phi @ W["W2"].mT, phi @ W["W3"].mT
        u = act(z2) * z3
        dy = self._output_grad(bias, x, u @ W["W1"].mT, v)
        du = dy @ W["W1"]
        return {"W1": (dy, u), "W2": (du * z3 * dact(z2), phi), "W3": (du * act(z2), phi)}


class ModuleMemory(Memory):
    """A custom memory: any nn.Module mapping φ(k) [D] -> [d_v], used functionally through torch.func.

    Its parameters define the weight shapes and the default initial weights W_0 (shared by all heads).
    Gradients of ℓ come from torch.func.grad (the generic path, slower than the analytic built-ins).
    """

    dual_form = False

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def shapes(self, D, d_k, d_v):
        return {n: tuple(p.shape) for n, p in self.module.named_parameters()}

    def init_weights(self, H, D, d_k, d_v, generator=None, dtype=torch.float32, device=None):
        return {n: p.detach().to(dtype=dtype, device=device).expand(H, *p.shape).clone()
                for n, p in self.module.named_parameters()}

    def token_forward(self, W, phi, x):
        """y = M_W(φ) for one token (used under torch.func.vmap)."""
        return torch.func.functional_call(self.module, W, (phi,))

    def __repr__(self):
        return f"module({type(self.module).__name__})"


MEMORIES = {"linear": LinearMemory, "mlp": MLPMemory, "gated_mlp": GatedMLPMemory}


def build_memory(spec, where: str = "architecture") -> Memory:
    """A memory from a short-hand (``mlp``), a short-hand with options ({name: mlp, depth: 3}), a Memory, a
    class_path dict, or an nn.Module (a custom memory, ``ModuleMemory``)."""
    if isinstance(spec, torch.nn.Module):
        return ModuleMemory(spec)
    return build("architecture", MEMORIES, spec, Memory, where)
