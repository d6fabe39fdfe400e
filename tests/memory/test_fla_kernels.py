"""fla-core's chunk kernels (memorize's impl="fla") against the chunked path for every preset the plan routes to fla,
on a GPU (``pytest --device cuda``; ``make gpu-check`` runs this file): outputs and the gradients of q, k, v, the
gates and W_0.

Error model: both paths read the same bfloat16 q, k, v (the chunked path in float32 after the cast, exact); fla
computes in float32 but keeps its chunk intermediates (the WY factors, the chunk states it stores for the backward)
in the inputs' dtype, each a rounding of relative size u = 2⁻⁸, a handful of them in series per output; at these
sizes (T 300, 5 chunks of 64) the distance is a few u, far below a wrong mapping's O(1). The bound is 16 u ≈ 0.06.
"""
import pytest
import torch

import helpers
from atlas_lab.memory import memorize
from atlas_lab.memory.plan import Shapes, plan
from atlas_lab.models import resolve_preset
from test_plan import ROUTES

pytestmark = pytest.mark.skipif(helpers.DEVICE.type != "cuda", reason="fla's chunk kernels run on CUDA (--device cuda)")

BOUND = 16 * 2.0 ** -8
FLA_PRESETS = [preset for preset, (on_bf16, _, _) in ROUTES.items() if on_bf16.startswith("fla")]
B, T, H, D = 2, 300, 4, 64


def inputs(config, seed=0):
    g = torch.Generator().manual_seed(seed)
    per_channel = config.rule().gates(config, config.components()[3])["alpha"].axis != "head"
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g), dim=-1) for _ in range(2))
    x = dict(q=q, k=k, v=torch.randn(B, T, H, D, generator=g),
             alpha=0.9 + 0.1 * torch.rand(B, T, H, *((D,) if per_channel else ()), generator=g),
             eta=0.2 + 0.6 * torch.rand(B, T, H, generator=g), gamma=torch.ones(B, T, H))
    x = {n: t.to(helpers.DEVICE) for n, t in x.items()}
    x["q"], x["k"], x["v"] = (x[n].bfloat16() for n in ("q", "k", "v"))
    x["W"] = 0.1 * torch.randn(H, D, D, generator=g).to(helpers.DEVICE)
    return {n: t.requires_grad_(True) for n, t in x.items()}


def run(x, config, impl, dtype):
    gates = {"alpha": x["alpha"], "eta": x["eta"], "gamma": x["gamma"]}
    if config.rule().gates(config, config.components()[3])["alpha"].value == 1.0:
        gates.pop("alpha")
    o, state = memorize(*(x[n].to(dtype) for n in ("q", "k", "v")), config, gates=gates, impl=impl,
                        initial_state={"W": x["W"]})
    loss = (o.float() * torch.linspace(-1, 1, o.shape[-1], device=o.device)).sum() + state.weights["W"].square().sum()
    leaves = [x[n] for n in ("q", "k", "v", "W", *gates)]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return {"output": o.float(), "state": state.weights["W"].float(),
            **{f"grad.{n}": gr for n, gr in zip(("q", "k", "v", "W", *gates), grads)}}


@pytest.mark.parametrize("preset", FLA_PRESETS)
def test_fla_equals_the_chunked_path(preset):
    config = resolve_preset(preset)[1]
    assert plan(config, Shapes(B, T, H, D, D), torch.bfloat16, helpers.DEVICE).path == "fla"
    x = inputs(config)
    fast, exact = run(x, config, "fla", torch.bfloat16), run(x, config, "chunked", torch.float32)
    errors = {n: helpers.rel_err(fast[n], exact[n]) for n in exact if exact[n] is not None}
    assert all(e <= BOUND for e in errors.values()), (preset, errors)
