"""Gated DeltaProduct (arXiv 2502.10297): the `gated_deltaproduct` preset's memory against flash-linear-attention's
naive recurrence, and the engine's steps per token (the ``deltaproduct`` learning rule's ``householder_steps``) against
the oracle through the registries.

fla's token t: S ← e^{g_t} S, then for j = 1..n_h S ← S + β_{t,j} k_{t,j} (v_{t,j} − S ᵀk_{t,j})ᵀ, o_t = Sᵀ q_t; its
k, v, β are [B, T·n_h, H, ·] (token t's steps at rows t·n_h + j). That is our W = Sᵀ with α_t = e^{g_t} at the first
step, η = β per step, the gradient at the retained weights (the decayed ones, at the first step; the previous
step's, at the others) and the read after the last step (scale 1: the memory layers do not scale q).
"""
import contextlib
import itertools

import pytest
import torch

import helpers
from atlas_lab import memory as engine
from atlas_lab.memory import MemoryConfig, memorize
from atlas_lab.models import LanguageModel, resolve_preset
from helpers import (assert_pieces_equal_one_call, compare, compare_float32, fla_float64, make_problem, rel_err, run,
                     with_gradients)

naive = pytest.importorskip("fla.ops.gated_delta_product.naive")
IMPLS = ["chunked", "reference"]
B, T, H, D = 2, 37, 3, 5  # T = 37: with n_h = 2, 74 steps, a block of 64 and a partial one


def problem(dtype, n_h, seed=0):
    """q [B, T, H, D], α in [0.5, 1] [B, T, H]; k (unit norm), v [B, T·n_h, H, D], β in [0, 1] [B, T·n_h, H]; W_0."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    x = dict(q=rnd(B, T, H, D), k=torch.nn.functional.normalize(rnd(B, T * n_h, H, D), dim=-1),
             v=rnd(B, T * n_h, H, D), alpha=0.5 + 0.5 * torch.rand(B, T, H, generator=g, dtype=torch.float64),
             beta=torch.rand(B, T * n_h, H, generator=g, dtype=torch.float64), W0=0.1 * rnd(B, H, D, D))
    return {n: t.to(dtype).to(helpers.DEVICE).requires_grad_(True) for n, t in x.items()}


def preset(n_h):
    return resolve_preset("gated_deltaproduct")[1].replace(learning_rule={"name": "deltaproduct",
                                                                        "householder_steps": n_h})


def ours(impl, config):
    def f(x):
        o, state = memorize(x["q"], x["k"], x["v"], config,
                            initial_state={"W": x["W0"]}, impl=impl, gates={"alpha": x["alpha"], "eta": x["beta"]})
        return with_gradients(x, o, state.weights["W"])
    return f


def fla(x, q=None):
    """fla's naive Gated DeltaProduct recurrence, in the dtype of x (float64 through ``fla_float64``)."""
    n_h = x["k"].shape[1] // x["q"].shape[1]
    context = fla_float64() if x["q"].dtype == torch.float64 else contextlib.nullcontext()
    with context:
        o, S = naive.naive_recurrent_gated_delta_product(
            x["q"] if q is None else q, x["k"], x["v"], x["alpha"].log(), x["beta"], scale=1.0,
            initial_state=x["W0"].mT, output_final_state=True, num_householder=n_h)
    assert o.dtype == x["q"].dtype
    return with_gradients(x, o, S.mT)


@pytest.mark.parametrize("n_h", [2, 3])
@pytest.mark.parametrize("impl", IMPLS)
def test_gated_deltaproduct_matches_fla_float64(impl, n_h):
    """Values, final state and gradients (q, k, v, α, β, W_0) within 1e-10 of fla's recurrence in float64."""
    x = problem(torch.float64, n_h)
    helpers.compare(ours(impl, preset(n_h))(x), fla(x), 1e-10, f"{impl} n_h={n_h}")


@pytest.mark.parametrize("impl", IMPLS)
def test_gated_deltaproduct_matches_fla_float32(impl):
    """float32 against fla's float64 values within the error model of tests/helpers.py."""
    compare_float32(ours(impl, preset(2)), fla, problem(torch.float32, 2), fla(problem(torch.float64, 2)),
                    f"gated_deltaproduct {impl}")


def test_chunk_read_is_the_state_before_the_token():
    """read="chunk" reads before a token's first step: y_t = W_{t−1} q_t, which is fla's output at token t − 1
    for the query q_t (and W_0 q_0 at the first token)."""
    x = problem(torch.float64, 2)
    o, _ = memorize(x["q"], x["k"], x["v"], preset(2).replace(read="chunk"),
                    initial_state={"W": x["W0"]}, gates={"alpha": x["alpha"], "eta": x["beta"]})
    shifted = fla(x, q=torch.cat([x["q"][:, 1:], x["q"][:, :1]], 1))["output"]
    first = torch.einsum("bhvk,bhk->bhv", x["W0"], x["q"][:, 0])
    assert rel_err(o[:, 1:], shifted[:, :-1]) < 1e-12 and rel_err(o[:, 0], first) < 1e-12


@pytest.mark.parametrize("broken", ["decay at every step", "gradient before the decay", "read after the first step"])
def test_a_broken_part_fails_the_identity(broken):
    """The identity tells Gated DeltaProduct from its neighbours: α applied at each of a token's steps (the gated
    delta rule on the steps), the first step's gradient taken before the decay, or the read after the first step."""
    x = problem(torch.float64, 2)
    if broken == "gradient before the decay":
        model = ours("chunked", preset(2).replace(learning_rule={"name": "deltaproduct", "gradient_at": "state"}))
    else:
        def model(x):  # the plain rule (one step per token) on the 2T steps, every step read
            alpha = x["alpha"].repeat_interleave(2, 1) if broken == "decay at every step" else \
                torch.stack([x["alpha"], torch.ones_like(x["alpha"])], 2).flatten(1, 2)
            o, state = memorize(x["q"].repeat_interleave(2, 1), x["k"], x["v"], preset(1),
                                initial_state={"W": x["W0"]}, gates={"alpha": alpha, "eta": x["beta"]})
            return with_gradients(x, o[:, 1::2] if broken == "decay at every step" else o[:, 0::2],
                                  state.weights["W"])
    assert helpers.errors(model(x), fla(x), broken)["output"] > 1e-3


def step_problem(n_h=2, T_tokens=7, **options):
    """make_problem over T_tokens·n_h steps, with q, α and θ kept for T_tokens tokens (as new leaves)."""
    p = make_problem(T=T_tokens * n_h, **options)
    for n in ("q", "alpha", "theta"):
        p[n] = p[n][:, :T_tokens].detach().requires_grad_(True)
    return p


@pytest.mark.parametrize("optimizer,window", list(itertools.product(engine.OPTIMIZERS, [1, 3])))
@pytest.mark.parametrize("architecture,gradient_at", [("linear", "state"), ("linear", "retained"),
                                                      ("mlp", "state")])
def test_steps_per_token_chunked_equals_reference(optimizer, window, architecture, gradient_at):
    """Two steps per token with every optimiser, both gradient points, a linear and a deep memory, through the
    registries: outputs, state and gradients, float64, 7 tokens (14 steps)."""
    options = dict(config=MemoryConfig(architecture=architecture, optimizer=optimizer, window=window, alpha="learned",
                                       eta="learned", gamma="learned", chunk_size=1,
                                       learning_rule={"name": "deltaproduct", "gradient_at": gradient_at}))
    p = step_problem(architecture=architecture)
    compare(run(p, "chunked", **options), run(p, "reference", **options), 1e-8, str(options))


@pytest.mark.parametrize("config", ["gated_deltaproduct", "momentum window 3"])
def test_steps_per_token_streams(config):
    """37 tokens in pieces of 17, 1 and 19 equal one call, gradients included: the preset's memory (across the WY
    blocks) and a momentum rule with a window of 3 steps (the state carries the window's steps and the momentum)."""
    x = problem(torch.float64, 2)
    config = preset(2) if config == "gated_deltaproduct" else MemoryConfig(
        architecture="linear", optimizer="momentum", window=3, alpha="learned", eta="learned",
        learning_rule="deltaproduct", chunk_size=1)

    def call(lo, hi, state):
        return memorize(x["q"][:, lo:hi], x["k"][:, 2 * lo:2 * hi], x["v"][:, 2 * lo:2 * hi], config,
                        theta=0.7, initial_state=state,
                        gates={"alpha": x["alpha"][:, lo:hi], "eta": x["beta"][:, 2 * lo:2 * hi]})

    assert_pieces_equal_one_call(call, x, {"W": x["W0"]}, cuts=((0, 17), (17, 18), (18, T)))


def test_layer_projects_n_h_keys_values_and_etas_per_token():
    """The preset's memory layer: 2 keys, values and η per head and token, one query and α; streaming equals one
    call."""
    torch.manual_seed(0)
    model = LanguageModel(64, "gated_deltaproduct", d_model=16, n_layers=1, n_heads=2)
    mixer = model.blocks[0].mixer
    gates = mixer.gates(torch.zeros(2, 5, 16))
    assert gates["alpha"].shape == (2, 5, 2) and gates["eta"].shape == (2, 10, 2)
    assert mixer.k_proj.out_features == mixer.v_proj.out_features == 2 * mixer.q_proj.out_features
    x = torch.randn(2, 9, 16)
    y_full, _ = mixer(x)
    y1, cache = mixer(x[:, :4])
    y2, _ = mixer(x[:, 4:], cache)
    assert rel_err(torch.cat([y1, y2], 1), y_full) < 1e-5


@pytest.mark.parametrize("changes,message", [
    (dict(learning_rule="deltaproduct", chunk_size=4), "chunk_size: deltaproduct takes each token's gradient at its"),
    (dict(learning_rule={"name": "deltaproduct", "householder_steps": 0}), "householder_steps: expected an int >= 1"),
    (dict(steps_per_token=2), r"steps_per_token: owned by the learning rule now; write learning_rule: \{name: delta"),
])
def test_bad_steps_per_token_is_named(changes, message):
    with pytest.raises(ValueError, match=message):
        MemoryConfig().replace(**changes)


def test_keys_take_n_h_rows_per_token():
    q = torch.zeros(1, 3, 1, 4)
    with pytest.raises(ValueError, match=r"expected q \[B, T, H, d_k\], k \[B, T·2, H, d_k\]"):
        memorize(q, q, q, preset(2), alpha=0.9, eta=0.5)
