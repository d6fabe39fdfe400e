"""``check_against_reference``: one call that checks a component (or a combination) against the oracle.

A random problem (every gate of the learning rule, initial weights, T not a multiple of the chunk, an Omega window)
goes through the fast path and through ``reference``; outputs, final weights and the gradients of a loss on the
outputs with respect to q, k, v, the gates and the initial weights must agree (docs/components.md).
"""
from __future__ import annotations

import torch

from .config import MemoryConfig
from .op import memorize

# the problem a check reads: an Omega window of 3 and chunks of 3 over T = 8 tokens (a partial last chunk)
CHECKED = MemoryConfig(window=3, chunk_size=3)
# the range each gate is drawn from (a rule's other gates: [0.5, 1])
RANGES = {"alpha": (0.8, 1.0), "eta": (0.05, 0.5), "theta": (0.3, 0.9), "gamma": (0.2, 1.0)}


def _rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check_against_reference(config: MemoryConfig | None = None, *, T=8, B=2, H=2, d=4, impl="chunked",
                            dtype=torch.float64, tol=1e-6, seed=0, **changes) -> dict:
    """Max relative errors {"output", "weights", "gradients"} of ``impl`` against ``reference``; AssertionError when
    one exceeds ``tol``. The memory: ``config`` (default CHECKED) with ``changes`` in MemoryConfig.replace's form,
    e.g. check_against_reference(optimizer=MyOptimizer(beta=0.5), window=None)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, lo=None, hi=None):
        x = torch.rand(*shape, generator=g, dtype=torch.float64) if lo is not None else \
            torch.randn(*shape, generator=g, dtype=torch.float64)
        return (lo + (hi - lo) * x if lo is not None else x).to(dtype)

    config = (config or CHECKED).replace("check", **changes)
    mem, fmap, obj, opt = config.components("check")
    rule = config.rule("check")
    n_h = rule.steps_per_token
    q = rnd(B, T, H, d)
    k, v = torch.nn.functional.normalize(rnd(B, T * n_h, H, d), dim=-1), 0.5 * rnd(B, T * n_h, H, d)
    gates = {}
    for name, spec in rule.gates(config, opt).items():  # every gate of the rule, on its axis and rows
        lo, hi = RANGES.get(name, (0.5, 1.0))
        width = {"head": (), "key": (fmap.dim(d),), "value": (d,)}[spec.axis]
        gates[name] = rnd(B, T * (n_h if spec.per_step else 1), H, *width, lo=lo, hi=hi)
    W0 = mem.init_weights(H, fmap.dim(d), d, d, generator=g, dtype=dtype)
    W0 = {n: (w if w.abs().sum() > 0 else 0.1 * rnd(*w.shape)) for n, w in W0.items()}  # a non-zero start
    leaves = {"q": q, "k": k, "v": v, **gates, **{f"W0.{n}": w for n, w in W0.items()}}
    for x in leaves.values():
        x.requires_grad_(True)
    weight = rnd(B, T, H, d)
    results = {}
    for which in (impl, "reference"):
        o, state = memorize(q, k, v, config, impl=which, gates=gates, initial_state={n: w for n, w in W0.items()})
        grads = torch.autograd.grad((o * weight).sum(), list(leaves.values()), allow_unused=True)
        results[which] = (o, state.weights, grads)
    (o, W, G), (o_ref, W_ref, G_ref) = results[impl], results["reference"]
    errors = {"output": _rel(o, o_ref), "weights": max(_rel(W[n], W_ref[n]) for n in W_ref),
              "gradients": max((_rel(a, b) for a, b in zip(G, G_ref) if b is not None), default=0.0)}
    bad = {k: e for k, e in errors.items() if not e <= tol}
    assert not bad, f"{impl} differs from reference for {mem!r}, {fmap!r}, {obj!r}, {opt!r}: {bad} (tol {tol})"
    return errors
