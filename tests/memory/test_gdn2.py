"""Gated DeltaNet-2 (GDN-2, flash-linear-attention 0.6's fla/ops/gdn2): the `gated_deltanet2` preset's memory against
fla's naive recurrence, and the erase and write gates against the oracle through the registries.

fla's S_t = (I − k_t (b_t ⊙ k_t)ᵀ) Diag(e^{g_t}) S_{t−1} + k_t (w_t ⊙ v_t)ᵀ, o_t = S_tᵀ q_t is our W = Sᵀ with α_t =
e^{g_t} per key channel, the erase gate b_t per key channel, the write gate w_t per value channel and η = 1.
"""
import contextlib
import itertools

import pytest
import torch

import helpers
from atlas_lab import memory as engine
from atlas_lab.memory import MemoryConfig, memorize
from atlas_lab.models import resolve_preset
from helpers import compare, compare_float32, fla_float64, make_problem, run, with_gradients

naive = pytest.importorskip("fla.ops.gdn2.naive")
IMPLS = ["chunked", "reference"]
B, T, H, D, DV = 2, 37, 3, 5, 4  # T = 37: two blocks of 16 and a partial one; d_k ≠ d_v tells the axes apart


def problem(dtype, seed=0):
    """q, k (unit norm), v, α per key channel in [0.5, 1], erase b per key channel and write w per value channel in
    [0, 1], W_0, as leaves on the tests' device."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    def uni(*shape):
        return torch.rand(*shape, generator=g, dtype=torch.float64)

    x = dict(q=rnd(B, T, H, D), k=torch.nn.functional.normalize(rnd(B, T, H, D), dim=-1), v=rnd(B, T, H, DV),
             alpha=0.5 + 0.5 * uni(B, T, H, D), erase=uni(B, T, H, D), write=uni(B, T, H, DV),
             W0=0.1 * rnd(B, H, DV, D))
    return {n: t.to(dtype).to(helpers.DEVICE).requires_grad_(True) for n, t in x.items()}


def ours(impl, config=None):
    config = config or resolve_preset("gated_deltanet2")[1]

    def f(x):
        o, state = memorize(x["q"], x["k"], x["v"], config, gates={n: x[n] for n in ("alpha", "erase", "write")},
                            initial_state={"W": x["W0"]}, impl=impl)
        return with_gradients(x, o, state.weights["W"])
    return f


def fla(x):
    """fla's naive GDN-2 recurrence, in the dtype of x (float64 through ``fla_float64``)."""
    with fla_float64() if x["q"].dtype == torch.float64 else contextlib.nullcontext():
        o, S = naive.naive_recurrent_gdn2(x["q"], x["k"], x["v"], x["alpha"].log(), x["erase"], x["write"],
                                          scale=1.0, initial_state=x["W0"].mT, output_final_state=True)
    assert o.dtype == x["q"].dtype
    return with_gradients(x, o, S.mT)


@pytest.mark.parametrize("impl", IMPLS)
def test_gated_deltanet2_preset_matches_fla_float64(impl):
    """Values, final state and gradients (q, k, v, α, b, w, W_0) within 1e-10 of fla's recurrence in float64."""
    x = problem(torch.float64)
    helpers.compare(ours(impl)(x), fla(x), 1e-10, f"gdn2 {impl}")


@pytest.mark.parametrize("impl", IMPLS)
def test_gated_deltanet2_preset_matches_fla_float32(impl):
    """float32 against fla's float64 values within the error model of tests/helpers.py."""
    compare_float32(ours(impl), fla, problem(torch.float32), fla(problem(torch.float64)), f"gdn2 {impl}")


@pytest.mark.parametrize("broken", ["erase gate dropped", "write gate dropped", "gates swapped onto one β"])
def test_a_broken_gate_fails_the_identity(broken):
    """The identity tells GDN-2 from its neighbours: without the erase gate, without the write gate, or with one
    scalar β = mean(b) for both (KDA), the output is off by far more than its bound."""
    x = problem(torch.float64)
    config = resolve_preset("gated_deltanet2")[1]

    def model(x):
        gates = {"erase": x["erase"], "write": x["write"]}
        if broken == "erase gate dropped":
            gates["erase"] = torch.ones_like(x["erase"])
        elif broken == "write gate dropped":
            gates["write"] = torch.ones_like(x["write"])
        else:
            beta = x["erase"].mean(-1, keepdim=True)
            gates = {"erase": beta.expand_as(x["erase"]), "write": beta.expand_as(x["write"])}
        return memorize(x["q"], x["k"], x["v"], config, initial_state={"W": x["W0"]},
                        gates={**gates, "alpha": x["alpha"]})[0]

    assert helpers.rel_err(model(x), fla(x)["output"]) > 1e-3


@pytest.mark.parametrize("optimizer,window", list(itertools.product(engine.OPTIMIZERS, [1, 3])))
@pytest.mark.parametrize("channels,gradient_at", [((), "state"), (("erase", "write"), "state"),
                                                  (("alpha", "erase", "write"), "retained")])
def test_erase_and_write_gates_chunked_equal_reference(optimizer, window, channels, gradient_at):
    """Erase and write gates, per head or per channel, with every optimiser and both gradient points, through the
    registries at chunk 1: outputs, state and gradients, float64."""
    config = MemoryConfig(architecture="linear", optimizer=optimizer, window=window, alpha="learned", chunk_size=1,
                          learning_rule={"name": "gdn2", "per_channel": channels, "gradient_at": gradient_at})
    p = make_problem(d_k=4, d_v=3)
    g = torch.Generator().manual_seed(1)
    for name, width in (("alpha", 4), ("erase", 4), ("write", 3)):
        shape = (2, 7, 2, width) if name in channels else (2, 7, 2)
        p[name] = (0.5 + 0.5 * torch.rand(*shape, generator=g, dtype=torch.float64)).to(helpers.DEVICE)
        p[name].requires_grad_(True)

    def go(impl):
        o, state = memorize(p["q"], p["k"], p["v"], config, impl=impl, initial_state=p["initial_state"],
                            gates={n: p[n] for n in ("alpha", "eta", "theta", "gamma", "erase", "write")})
        return with_gradients({n: t for n, t in p.items() if isinstance(t, torch.Tensor)}, o, state.weights["W"])
    compare(go("chunked"), go("reference"), 1e-8, str(config))


def test_write_gate_is_the_value_it_writes():
    """write = w is the rule on the values w ⊙ v, with any memory and chunk (the engine gates v before the rule)."""
    p = make_problem(architecture="mlp")
    w = torch.rand(2, 7, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(helpers.DEVICE)
    rule = {"name": "gdn2", "erase": 1.0, "write": "learned", "gradient_at": "state", "per_channel": []}
    options = dict(architecture="mlp", chunk_size=3, window=2, learning_rule=rule)
    a = run({**p, "v": p["v"]}, "chunked", config=MemoryConfig(**options), gates={"write": w})
    b = run({**p, "v": p["v"] * w.unsqueeze(-1)}, "chunked",
            config=MemoryConfig(**{**options, "learning_rule": {**rule, "write": 1.0}}))
    assert helpers.rel_err(a[0], b[0]) < 1e-12


def test_gated_deltanet2_layer_learns_its_gates_per_channel():
    """The memory layer learns α and the erase gate per key channel, the write gate per value channel; no η."""
    from atlas_lab.models import LanguageModel
    mixer = LanguageModel(64, "gated_deltanet2", d_model=16, n_layers=1, n_heads=2).blocks[0].mixer
    gates = mixer.gates(torch.zeros(2, 5, 16))
    assert {g: tuple(x.shape) for g, x in gates.items() if isinstance(x, torch.Tensor)} == {
        "alpha": (2, 5, 2, 8), "erase": (2, 5, 2, 8), "write": (2, 5, 2, 8)}
    assert gates["eta"] == 1.0 and torch.allclose(gates["erase"], torch.tensor(0.5))


def test_an_erase_gate_needs_chunk_one():
    rule = {"name": "gdn2", "gradient_at": "state", "per_channel": []}
    with pytest.raises(ValueError, match=r"chunk_size: gdn2 takes each token's gradient at its own weights \(W̃ Diag"):
        MemoryConfig(learning_rule=rule, chunk_size=4).validate()
    q = torch.zeros(1, 3, 1, 4)
    with pytest.raises(ValueError, match=r"memorize: gdn2 takes each token's gradient .* needs chunk_size 1"):
        memorize(q, q, q, chunk_size=4, learning_rule={**rule, "erase": 1.0, "write": 1.0},
                 gates={"erase": torch.ones(1, 3, 1)})
    with pytest.raises(ValueError, match=r"erase: owned by the learning rule now; write learning_rule: \{name: gdn2"):
        MemoryConfig().replace(erase="learned")
