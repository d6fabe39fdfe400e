"""Kimi Delta Attention (KDA, arXiv 2510.26692): the `kda` preset's memory against flash-linear-attention's naive
recurrence, and the learning rule's gates per channel (``kda``: α per key channel) and gradients at the retained
weights (``gradient_at="retained"``) against the oracle through the registries.

fla's S_t = (I − β_t k_t k_tᵀ) Diag(e^{g_t}) S_{t−1} + β_t k_t v_tᵀ, o_t = S_tᵀ q_t is our W = Sᵀ with α_t = e^{g_t}
per key channel and η_t = β_t (scale 1: the memory layers do not scale q).
"""
import contextlib
import itertools

import pytest
import torch

import helpers
from atlas_lab import memory as engine
from atlas_lab.memory import MemoryConfig, memorize
from atlas_lab.models import resolve_preset
from helpers import (assert_pieces_equal_one_call, compare, compare_float32, fla_float64, make_problem, rel_err, run,
                     with_gradients)

naive = pytest.importorskip("fla.ops.kda.naive")
IMPLS = ["chunked", "reference"]
B, T, H, D = 2, 37, 3, 5  # T = 37: two blocks of 16 and a partial one


def problem(dtype, seed=0):
    """q, k (unit norm), v, α per key channel in [0.5, 1], β in [0, 1] and W_0, as leaves on the tests' device."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    x = dict(q=rnd(B, T, H, D), k=torch.nn.functional.normalize(rnd(B, T, H, D), dim=-1), v=rnd(B, T, H, D),
             alpha=0.5 + 0.5 * torch.rand(B, T, H, D, generator=g, dtype=torch.float64),
             beta=torch.rand(B, T, H, generator=g, dtype=torch.float64), W0=0.1 * rnd(B, H, D, D))
    return {n: t.to(dtype).to(helpers.DEVICE).requires_grad_(True) for n, t in x.items()}


def ours(impl, config=None):
    config = config or resolve_preset("kda")[1]

    def f(x):
        o, state = memorize(x["q"], x["k"], x["v"], config,
                            initial_state={"W": x["W0"]}, impl=impl, gates={"alpha": x["alpha"], "eta": x["beta"]})
        return with_gradients(x, o, state.weights["W"])
    return f


def fla(x):
    """fla's naive KDA recurrence, in the dtype of x (float64 through ``fla_float64``)."""
    context = fla_float64() if x["q"].dtype == torch.float64 else contextlib.nullcontext()
    with context:
        o, S = naive.naive_recurrent_kda(x["q"], x["k"], x["v"], x["alpha"].log(), x["beta"], scale=1.0,
                                         initial_state=x["W0"].mT, output_final_state=True)
    assert o.dtype == x["q"].dtype
    return with_gradients(x, o, S.mT)


@pytest.mark.parametrize("impl", IMPLS)
def test_kda_preset_matches_fla_float64(impl):
    """Values, final state and gradients (q, k, v, α, β, W_0) within 1e-10 of fla's recurrence in float64."""
    x = problem(torch.float64)
    helpers.compare(ours(impl)(x), fla(x), 1e-10, f"kda {impl}")


@pytest.mark.parametrize("impl", IMPLS)
def test_kda_preset_matches_fla_float32(impl):
    """float32 against fla's float64 values within the error model of tests/helpers.py."""
    compare_float32(ours(impl), fla, problem(torch.float32), fla(problem(torch.float64)), f"kda {impl}")


@pytest.mark.parametrize("broken", ["alpha per head", "gradient at the state"])
def test_a_broken_gate_fails_the_identity(broken):
    """The identity above tells KDA from its neighbours: α averaged over the key channels (one per head, Gated
    DeltaNet's decay) or the gradient taken before the decay (the Titans form) is off by far more than its bound."""
    x = problem(torch.float64)
    if broken == "alpha per head":
        config = resolve_preset("kda")[1].replace(learning_rule={"name": "kda", "per_channel": []})

        def model(x):
            o, state = memorize(x["q"], x["k"], x["v"], config,
                                initial_state={"W": x["W0"]}, gates={"alpha": x["alpha"].mean(-1), "eta": x["beta"]})
            return with_gradients(x, o, state.weights["W"])
    else:
        model = ours("chunked", resolve_preset("kda")[1].replace(learning_rule={"name": "kda", "gradient_at": "state"}))
    assert helpers.errors(model(x), fla(x), broken)["output"] > 1e-3


@pytest.mark.parametrize("optimizer,window", list(itertools.product(engine.OPTIMIZERS, [1, 3])))
@pytest.mark.parametrize("chunk_size,gradient_at", [(3, "state"), (1, "state"), (1, "retained")])
def test_channel_gates_chunked_equals_reference(optimizer, window, chunk_size, gradient_at):
    """α per key channel with every optimiser (the chunked path runs ``update`` token by token) and both gradient
    points, through the registries: outputs, state and gradients, float64. T = 7: a partial last chunk of 3."""
    options = dict(config=MemoryConfig(architecture="linear", optimizer=optimizer, window=window, alpha="learned",
                                       learning_rule={"name": "kda", "gradient_at": gradient_at},
                                       chunk_size=chunk_size))
    p = make_problem(d_k=4)
    p["alpha"] = (0.8 + 0.2 * torch.rand(2, 7, 2, 4, generator=torch.Generator().manual_seed(1),
                                         dtype=torch.float64)).to(helpers.DEVICE).requires_grad_(True)
    compare(run(p, "chunked", **options), run(p, "reference", **options), 1e-8, str(options))


@pytest.mark.parametrize("read", ["token", "chunk"])
def test_retained_gradient_is_the_decayed_step(read):
    """gradient_at="retained" with per-head gates, both reads: the reference token loop is, by hand, W_t = P − η_t
    (P k_t − v_t) k_tᵀ with P = α_t W_{t−1}; a chunk-start read reads W_{t−1}, a token read W_t."""
    p = make_problem(T=9)
    options = dict(architecture="linear", attentional_bias="l2", chunk_size=1, read=read,
                   learning_rule={"name": "online", "gradient_at": "retained"})
    for impl in IMPLS:
        o, state = memorize(p["q"], p["k"], p["v"], gamma=1.0,
                            initial_state=p["initial_state"], impl=impl, **options,
                            gates={"alpha": p["alpha"], "eta": p["eta"]})
        W, out = p["initial_state"]["W"].expand(2, -1, -1, -1), []
        for t in range(9):
            a, e = p["alpha"][:, t, :, None, None], p["eta"][:, t, :, None, None]
            P = a * W
            err = torch.einsum("bhvk,bhk->bhv", P, p["k"][:, t]) - p["v"][:, t]
            W_next = P - e * torch.einsum("bhv,bhk->bhvk", err, p["k"][:, t])
            out.append(torch.einsum("bhvk,bhk->bhv", W_next if read == "token" else W, p["q"][:, t]))
            W = W_next
        assert rel_err(o, torch.stack(out, 1)) < 1e-12 and rel_err(state.weights["W"], W) < 1e-12, impl


def test_kda_streams_across_blocks():
    """The preset's memory over 37 tokens in pieces of 17, 1 and 19 (across the blocks of 16) equals one call,
    gradients included."""
    x = problem(torch.float64)
    config = resolve_preset("kda")[1]

    def call(lo, hi, state):
        return memorize(*(x[n][:, lo:hi] for n in ("q", "k", "v")), config,
                        initial_state=state, gates={"alpha": x["alpha"][:, lo:hi], "eta": x["beta"][:, lo:hi]})

    assert_pieces_equal_one_call(call, x, {"W": x["W0"]})


def test_kda_layer_learns_one_retention_per_key_channel():
    """The memory layer of the preset learns α per head and key channel, starting at 0.999, and β per head."""
    from atlas_lab.models import LanguageModel
    mixer = LanguageModel(64, "kda", d_model=16, n_layers=1, n_heads=2).blocks[0].mixer
    gates = mixer.gates(torch.zeros(2, 5, 16))
    assert gates["alpha"].shape == (2, 5, 2, 8) and gates["eta"].shape == (2, 5, 2)
    assert torch.allclose(gates["alpha"], torch.tensor(0.999))


@pytest.mark.parametrize("changes,message", [
    (dict(learning_rule={"name": "kda", "per_channel": ["eta"]}), "per_channel: expected gates among alpha"),
    (dict(learning_rule="kda", alpha=0.9, chunk_size=1, architecture="linear"),
     "alpha: kda learns alpha per channel: expected 'learned'"),
    (dict(learning_rule="kda", alpha="learned", architecture="mlp", chunk_size=1), "needs architecture linear"),
    (dict(learning_rule={"name": "online", "gradient_at": "retained"}, chunk_size=4),
     r"chunk_size: online takes each token's gradient at its own weights \(α_t ⊙ W_\{t−1\}\)"),
    (dict(learning_rule={"name": "online", "gradient_at": "decayed"}), "gradient_at: unknown value 'decayed'"),
    (dict(channel_gates=["alpha"]), "channel_gates: owned by the learning rule now; write learning_rule: kda"),
    (dict(gradient_at="retained"), r"gradient_at: owned by the learning rule now; write learning_rule: \{name: online"),
])
def test_bad_channel_gates_and_gradient_points_are_named(changes, message):
    with pytest.raises(ValueError, match=message):
        MemoryConfig().replace(**changes)


def test_a_channel_gate_takes_its_channels():
    q = torch.zeros(1, 3, 1, 4)
    with pytest.raises(ValueError, match=r"gate alpha must be a \[B, T, H, C\] = \[1, 3, 1, 4\] tensor"):
        memorize(q, q, q, resolve_preset("kda")[1], eta=0.5, gates={"alpha": torch.ones(1, 3, 1)})
