"""HOPE's continuum memory system ("Nested Learning: The Illusion of Deep Learning Architectures", NeurIPS 2025,
§7.1): the `hope_cms` preset's levels against a direct computation of eq. 71, written here without the engine.

Level ℓ is an MLP block θ = (W_1, W_2), M_θ(x) = x + W_2 GELU(W_1 x), trained on ℓ_t(θ) = ½‖M_θ(k_t) − v_t‖² and
updated only at the end of each chunk of C tokens, with the steps of the chunk's tokens all taken at the weights θ_i
the chunk started from:

    y_t = M_{θ_i}(q_t)   (t in the chunk after boundary i),   θ_{i+C} = θ_i − Σ_{t∈chunk} η_t ∇ℓ_t(θ_i)

with η_t = γ_t η/C (γ_t the learned per-token rate, η = 0.1); a partial last chunk reads θ_i and does not update it.
∇ℓ_t is written out by the chain rule below.
"""

import pytest
import torch

import helpers
from atlas_lab.layers import MemoryMixer
from atlas_lab.memory import memorize
from atlas_lab.models import PRESETS, LanguageModel, resolve_preset
from helpers import (assert_pieces_equal_one_call, compare_float32, rel_err, residual_mlp,
                     residual_mlp_l2_gradients, residual_mlp_problem, with_gradients)

B, T, H, D, E = 2, 23, 2, 3, 2  # 23 tokens: chunks of 2, 3 and 5 each end with a partial chunk; hidden width E·D
ETA = 0.1  # η_c = Σ_t η_t of one commit, every level
NAMES = ("W1", "W2")


def level(chunk_size):
    """The preset's memory as a level of chunk C (its η = 0.1/C), with a hidden width of E·d_v."""
    return resolve_preset("hope_cms", layer_changes={"chunk_size": chunk_size, "eta": ETA / chunk_size,
                                                     "architecture.expansion": E})[1]


def problem(dtype, seed=0):
    """q, k (unit norm), v, γ ∈ [0.2, 1] per token; W_1 [E·D, D], W_2 [D, E·D]."""
    return residual_mlp_problem(B, T, H, D, E, dtype, seed, gamma=(0.2, 1.0))


def cms_direct(x, C, per_token_rate=True, read_start=True, mean=True):
    """Eq. 71 for one level of chunk C; the switches break one part each (for the test that it matters)."""
    W = {n: x[n] for n in NAMES}
    out = []
    for s in range(0, T, C):
        c = slice(s, min(s + C, T))
        out.append(residual_mlp(W, x["q"][:, c])[0])
        if c.stop - c.start < C:  # a partial chunk reads θ_i; its update waits for the chunk's end
            break
        rate = x["gamma"][:, c] if per_token_rate else torch.ones_like(x["gamma"][:, c])
        G = residual_mlp_l2_gradients(W, x["k"][:, c], x["v"][:, c], rate * (ETA / C if mean else ETA))
        W = {n: W[n] - G[n] for n in NAMES}
        if not read_start:  # the chunk reads its own update
            out[-1] = residual_mlp(W, x["q"][:, c])[0]
    return with_gradients(x, torch.cat(out, 1), torch.cat([W[n].flatten(2) for n in NAMES], -1))


def ours(impl, C):
    def f(x):
        o, state = memorize(x["q"], x["k"], x["v"], level(C), initial_state={n: x[n] for n in NAMES},
                            impl=impl, gates={"gamma": x["gamma"]})
        return with_gradients(x, o, torch.cat([state.weights[n].flatten(2) for n in NAMES], -1))
    return f


@pytest.mark.parametrize("C", [2, 3, 5])
@pytest.mark.parametrize("impl", ["chunked", "reference"])
def test_cms_level_is_eq_71_float64(impl, C):
    """Outputs, committed weights and gradients (q, k, v, γ, θ_0) within 1e-10 of the direct computation."""
    x = problem(torch.float64)
    helpers.compare(ours(impl, C)(x), cms_direct(x, C), 1e-10, f"cms {impl} C={C}")


@pytest.mark.parametrize("C", [3, 5])
def test_cms_level_is_eq_71_float32(C):
    """float32 against the float64 direct computation within the error model of tests/helpers.py."""
    compare_float32(ours("chunked", C), lambda x: cms_direct(x, C), problem(torch.float32),
                    cms_direct(problem(torch.float64), C), f"cms C={C}")


@pytest.mark.parametrize("broken", ["no per-token rate", "reads its own update", "sum, not mean",
                                    "another frequency"])
def test_a_broken_part_fails_the_identity(broken):
    """The identity tells the rule from its neighbours: γ_t ignored, the chunk reading its own commit, η not divided
    by the chunk (a step C times too large), or the level updated at another frequency."""
    x = problem(torch.float64)
    switches = {"no per-token rate": dict(per_token_rate=False), "reads its own update": dict(read_start=False),
                "sum, not mean": dict(mean=False), "another frequency": dict(C=5)}[broken]
    assert rel_err(ours("chunked", 3)(x)["output"], cms_direct(x, **{"C": 3, **switches})["output"]) > 1e-3


def test_cms_level_streams_across_chunks():
    """23 tokens in pieces of 17, 1 and 5 (a chunk in progress at each cut) equal one call, gradients included."""
    x = problem(torch.float64)

    def call(lo, hi, state):
        return memorize(*(x[n][:, lo:hi] for n in ("q", "k", "v")), level(5),
                        initial_state=state, gates={"gamma": x["gamma"][:, lo:hi]})

    assert_pieces_equal_one_call(call, x, {n: x[n] for n in NAMES}, cuts=((0, 17), (17, 18), (18, 23)))


def test_hope_cms_preset_chains_levels_of_four_frequencies():
    """The preset's layers are the levels, in the order of the chain: one memory each, equal but for the chunk
    C^(ℓ) = 16, 64, 256, 1024 and η = 0.1/C^(ℓ); a memory override reaches every level, after the level's own
    changes."""
    model = LanguageModel(64, "hope_cms", d_model=16, n_layers=4, n_heads=2)
    configs = [b.mixer.config for b in model.blocks]
    assert all(isinstance(b.mixer, MemoryMixer) for b in model.blocks)
    assert [c.chunk_size for c in configs] == [16, 64, 256, 1024]
    assert [c.eta * c.chunk_size for c in configs] == pytest.approx([ETA] * 4)
    base = resolve_preset("hope_cms")[1]
    assert all(c.replace(chunk_size=16, eta=base.eta) == base for c in configs)
    assert (base.read, base.alpha, base.gamma, base.optimizer, base.attentional_bias) == ("chunk", 1.0, "learned",
                                                                                         "gd", "l2")
    assert set(model.blocks[0].mixer.learned_gates) == {"gamma"}
    overridden = LanguageModel(64, "hope_cms", d_model=16, n_layers=4, n_heads=2, memory={"chunk_size": 8})
    assert [b.mixer.config.chunk_size for b in overridden.blocks] == [8] * 4
    assert PRESETS["hope_cms"]["layers"][1] == {"kind": "memory", "memory": {"chunk_size": 64, "eta": ETA / 64}}


@pytest.mark.parametrize("layers,message", [
    ([{"kind": "swa", "memory": {"chunk_size": 4}}], "a swa layer has no memory"),
    ([{"kind": "memory", "memroy": {}}], "a layer is a kind or {kind: <kind>, memory:"),
    ([{"kind": "lstm"}], "unknown layer kind(s) ['lstm']"),
    ([{"kind": "memory", "memory": {"chunk": 4}}], "layers.memory.chunk: unknown field"),
])
def test_bad_layer_entries_are_named(layers, message):
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        LanguageModel(64, "atlas", d_model=16, n_layers=2, n_heads=2, layers=layers)


def test_a_layer_of_a_pattern_changes_its_own_memory_only():
    """{kind: memory, memory: changes} in any pattern: that layer's memory is the preset's with the changes, the
    others' the preset's; a one-memory-layer preset and MAG take changes the same way."""
    model = LanguageModel(64, "atlas", d_model=16, n_layers=3, n_heads=2, layers=[
        "memory", {"kind": "mag", "memory": {"window": 2}}, {"kind": "gated_deltanet", "memory": {"alpha": 0.5}}])
    atlas = resolve_preset("atlas")[1]
    assert model.blocks[0].mixer.config == atlas
    assert model.blocks[1].mixer.memory.config == atlas.replace(window=2)
    assert model.blocks[2].mixer.config == resolve_preset("gated_deltanet")[1].replace(alpha=0.5)
    assert model.layer_labels == ["memory", "mag(window=2)", "gated_deltanet(alpha=0.5)"]
