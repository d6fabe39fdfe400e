"""TNT ("TNT: Improving Chunkwise Training for Test-Time Memorization", arXiv 2511.07343): the `tnt` preset's local
memory against a direct computation of its rule, written here without the engine, and ``reset_every`` through the
engine's paths and streaming.

The memory is an MLP θ = (W_1, W_2), M_θ(x) = x + W_2 GELU(W_1 x), trained on ℓ_t(θ) = ½‖M_θ(k_t) − v_t‖² by gd on
chunks of C tokens (every gradient of a chunk taken at the weights θ̃ the chunk started from), its state returned to
the initial weights θ_0 before every R-th token (R a multiple of C):

    θ_{t−1} := θ_0 if t ≡ 0 (mod R),   θ_t = α_t θ_{t−1} − η_t ∇ℓ_t(θ̃),   y_t = M_{θ_t}(q_t)

The global memory is the same rule on larger chunks without resets (R = ∞).
"""

import pytest
import torch

import helpers
from atlas_lab.memory import MemoryConfig, memorize
from atlas_lab.models import LanguageModel, resolve_preset
from helpers import (assert_pieces_equal_one_call, compare_float32, rel_err, residual_mlp,
                     residual_mlp_l2_gradients, residual_mlp_problem, with_gradients)

B, T, H, D, E = 2, 23, 2, 3, 2  # 23 tokens: every (C, R) below ends with a partial chunk; hidden width E·D
NAMES = ("W1", "W2")


def local(C, R):
    """The preset's local memory with chunk C and reset period R, a hidden width of E·d_v."""
    return resolve_preset("tnt", layer_changes={"chunk_size": C, "architecture.expansion": E, "read": "token",
                                                "learning_rule": {"name": "chunk_commit", "reset_every": R}})[1]


def global_memory(C):
    """The preset's global memory with chunk C (no resets, read at the chunk's start), a hidden width of E·d_v."""
    return resolve_preset("tnt", layer_changes={"chunk_size": C, "architecture.expansion": E})[1]


def problem(dtype, seed=0):
    """q, k (unit norm), v, α ∈ [0.8, 1], η ∈ [0, 0.5] per token; W_1 [E·D, D], W_2 [D, E·D]."""
    return residual_mlp_problem(B, T, H, D, E, dtype, seed, alpha=(0.8, 1.0), eta=(0.0, 0.5))


def tnt_direct(x, C, R, reset_to="W0", read="token"):
    """The rule above, token by token; reset_to="zero" or "none" breaks the reset (for the test that it matters);
    read="start": y_t = M_{W̃}(q_t), the weights the chunk started from (the global memory, eq. 7)."""
    W0 = {n: x[n] for n in NAMES}
    W, out = dict(W0), []
    for t in range(T):
        if t % R == 0 and reset_to != "none":
            W = dict(W0) if reset_to == "W0" else {n: torch.zeros_like(w) for n, w in W0.items()}
        if t % C == 0 or (t % R == 0 and reset_to != "none"):
            W_start = dict(W)
        token = slice(t, t + 1)
        g = residual_mlp_l2_gradients(W_start, x["k"][:, token], x["v"][:, token], torch.ones_like(x["eta"][:, token]))
        a, e = x["alpha"][:, t, :, None, None], x["eta"][:, t, :, None, None]
        W = {n: a * W[n] - e * g[n] for n in NAMES}
        out.append(residual_mlp(W_start if read == "start" else W, x["q"][:, token])[0])
    return with_gradients(x, torch.cat(out, 1), torch.cat([W[n].flatten(2) for n in NAMES], -1))


def ours(impl, C, R):
    def f(x):
        o, state = memorize(x["q"], x["k"], x["v"], local(C, R),
                            initial_state={n: x[n] for n in NAMES}, impl=impl,
                            gates={"alpha": x["alpha"], "eta": x["eta"]})
        return with_gradients(x, o, torch.cat([state.weights[n].flatten(2) for n in NAMES], -1))
    return f


CASES = [(2, 6), (3, 3), (1, 5), (4, 8)]


@pytest.mark.parametrize("C,R", CASES)
@pytest.mark.parametrize("impl", ["chunked", "reference"])
def test_tnt_local_memory_is_the_rule_float64(impl, C, R):
    """Outputs, final weights and gradients (q, k, v, α, η, θ_0) within 1e-10 of the direct computation."""
    x = problem(torch.float64)
    helpers.compare(ours(impl, C, R)(x), tnt_direct(x, C, R), 1e-10, f"tnt {impl} C={C} R={R}")


@pytest.mark.parametrize("C", [1, 3, 5])
@pytest.mark.parametrize("impl", ["chunked", "reference"])
def test_tnt_global_memory_reads_the_chunk_start_float64(impl, C):
    """The global memory (eq. 7): the per-token rule, each token read at the weights its chunk started from."""
    x = problem(torch.float64)

    def ours_global(x):
        o, state = memorize(x["q"], x["k"], x["v"], global_memory(C),
                            initial_state={n: x[n] for n in NAMES}, impl=impl,
                            gates={"alpha": x["alpha"], "eta": x["eta"]})
        return with_gradients(x, o, torch.cat([state.weights[n].flatten(2) for n in NAMES], -1))

    direct = tnt_direct(x, C, T + 1, reset_to="none", read="start")
    helpers.compare(ours_global(x), direct, 1e-10, f"tnt global {impl} C={C}")
    if C > 1:  # per-token reads are another function
        assert rel_err(ours_global(x)["output"], tnt_direct(x, C, T + 1, reset_to="none")["output"]) > 1e-3


@pytest.mark.parametrize("C,R", [(2, 6), (4, 8)])
def test_tnt_local_memory_is_the_rule_float32(C, R):
    """float32 against the float64 direct computation within the error model of tests/helpers.py."""
    compare_float32(ours("chunked", C, R), lambda x: tnt_direct(x, C, R), problem(torch.float32),
                    tnt_direct(problem(torch.float64), C, R), f"tnt C={C} R={R}")


@pytest.mark.parametrize("broken", ["never reset", "reset to zero", "another period"])
def test_a_broken_reset_fails_the_identity(broken):
    """The identity tells the reset from its neighbours: no reset, a reset to zero weights instead of θ_0, or a
    reset at another period."""
    x = problem(torch.float64)
    direct = {"never reset": dict(reset_to="none"), "reset to zero": dict(reset_to="zero"),
              "another period": dict(R=4)}[broken]
    assert rel_err(ours("chunked", 2, 6)(x)["output"], tnt_direct(x, **{"C": 2, "R": 6, **direct})["output"]) > 1e-3


@pytest.mark.parametrize("config", [local(2, 6), MemoryConfig(architecture="linear", optimizer="momentum",
                                                              window=3, theta=0.9, chunk_size=3,
                                                              learning_rule={"name": "chunk_commit",
                                                                             "reset_every": 9})])
def test_streaming_across_resets_equals_one_call(config):
    """Pieces of 7, 2, 3 and 11 tokens (cut inside a chunk, at a reset of R = 9 and of R = 6) equal one call, for the
    deep memory and for a linear one with momentum and an Omega window (both cleared by a reset)."""
    x = problem(torch.float64)
    deep = config.architecture != "linear"
    weights = {n: x[n] for n in NAMES} if deep else {"W": x["W1"][:, :, :D]}

    def call(lo, hi, state):
        return memorize(*(x[n][:, lo:hi] for n in ("q", "k", "v")), config,
                        initial_state=state, gates={"alpha": x["alpha"][:, lo:hi], "eta": x["eta"][:, lo:hi]})

    inputs = {n: x[n] for n in ("q", "k", "v", "alpha", "eta", *(NAMES if deep else ()))}
    assert_pieces_equal_one_call(call, inputs, weights, cuts=((0, 7), (7, 9), (9, 12), (12, 23)))
    _, state = call(0, 23, weights)
    assert state.since_reset == 23 % config.rule().reset_every


def test_reset_every_is_checked():
    with pytest.raises(ValueError, match="learning_rule.reset_every: expected a multiple of chunk_size=4"):
        MemoryConfig(chunk_size=4, learning_rule={"name": "chunk_commit", "reset_every": 6}).validate()
    with pytest.raises(ValueError, match="reset_every: expected null or an int >= 1"):
        MemoryConfig(learning_rule={"name": "chunk_commit", "reset_every": 0}).validate()
    with pytest.raises(ValueError,
                       match=r"reset_every: owned by the learning rule now; write learning_rule: \{name: chunk"):
        MemoryConfig().replace(reset_every=64)
    x = problem(torch.float64)
    _, plain = memorize(x["q"], x["k"], x["v"], local(2, None), gates={"alpha": x["alpha"], "eta": x["eta"]})
    with pytest.raises(ValueError, match="initial_state must carry the initial weights"):
        memorize(x["q"], x["k"], x["v"], local(2, 6), initial_state=plain, gates={"alpha": x["alpha"], "eta": x["eta"]})


def test_tnt_preset_alternates_global_and_local_memories():
    """The global memory on chunks of 64 without resets, read at each chunk's start (eq. 7), the local one on chunks of
    8 reset every 64, read per token, in turn."""
    model = LanguageModel(64, "tnt", d_model=16, n_layers=4, n_heads=2)
    configs = [b.mixer.config for b in model.blocks]
    assert [(c.chunk_size, c.rule().reset_every, c.read) for c in configs] == [(64, None, "start"),
                                                                               (8, 64, "token")] * 2
    assert configs[1] == configs[0].replace(chunk_size=8, read="token", learning_rule={"name": "chunk_commit",
                                                                                       "reset_every": 64})
    assert (configs[0].architecture, configs[0].attentional_bias, configs[0].optimizer) == ("mlp", "l2", "gd")
