"""The levels rule (HOPE's continuum memory as one memory, learning_rules.Levels) against a direct computation of
Nested Learning's eq. 71 per weight matrix, written here without the engine.

The memory is Titans' MLP M_θ(x) = x + W_2 GELU(W_1 x) on ℓ_t(θ) = ½‖M_θ(k_t) − v_t‖². Matrix m is updated only at
the end of each chunk of C_m tokens, by its rate r_m times the sum of its tokens' steps, each taken at the weights of
the moment (both matrices as committed so far):

    y_t = M_θ(q_t),   W_m ← W_m − r_m Σ_{t∈chunk of C_m} η γ_t ∇_{W_m} ℓ_t(θ)

The weights change only at the end of a chunk of the smallest C, so a base chunk's gradients share one θ.
"""

import dataclasses

import pytest
import torch

import helpers
from atlas_lab.layers import MemoryMixer
from atlas_lab.memory import MemoryConfig, memorize
from atlas_lab.models import LanguageModel, resolve_preset
from helpers import (assert_pieces_equal_one_call, compare_float32, make_problem, rel_err, residual_mlp,
                     residual_mlp_l2_gradients, residual_mlp_problem, run, with_gradients)

B, T, H, D, E = 2, 23, 2, 3, 2  # 23 tokens: every case ends inside a chunk of each level; hidden width E·D
ETA = 0.1
NAMES = ("W1", "W2")
CASES = {"fast W1": ((2, 6), (1.0, 0.5)), "fast W2": ((6, 2), (0.25, 1.0)), "one frequency": ((3, 3), (1.0, 0.3))}


def config(chunks, rates, **changes):
    return MemoryConfig(architecture={"name": "mlp", "expansion": E}, attentional_bias="l2", optimizer="gd",
                        alpha=1.0, eta=ETA, gamma="learned", chunk_size=min(chunks), read="chunk",
                        learning_rule={"name": "levels", "chunks": list(chunks), "rates": list(rates)}
                        ).replace(**changes)


def problem(dtype, seed=0):
    """q, k (unit norm), v, γ ∈ [0.2, 1] per token; W_1 [E·D, D], W_2 [D, E·D]."""
    return residual_mlp_problem(B, T, H, D, E, dtype, seed, gamma=(0.2, 1.0))


def levels_direct(x, chunks, rates, at_commit=False):
    """Eq. 71 per matrix; at_commit breaks one part: each matrix's gradients taken at the weights (all of them) as
    they were when its own chunk started, not at the weights of the moment."""
    W = {n: x[n] for n in NAMES}
    starts = {n: dict(W) for n in NAMES}  # the weights when each matrix's chunk started
    sums = {n: 0.0 for n in NAMES}
    base, out = min(chunks), []
    for s in range(0, T, base):
        c = slice(s, min(s + base, T))
        out.append(residual_mlp(W, x["q"][:, c])[0])
        if c.stop - c.start < base:  # a partial chunk reads θ; its steps wait for the chunk's end
            break
        G = {n: residual_mlp_l2_gradients(starts[n] if at_commit else W, x["k"][:, c], x["v"][:, c],
                                          ETA * x["gamma"][:, c])[n] for n in NAMES}
        ended = [n for n, C in zip(NAMES, chunks) if (s + base) % C == 0]
        for n, r in zip(NAMES, rates):
            sums[n] = sums[n] + G[n]
            if n in ended:
                W[n], sums[n] = W[n] - r * sums[n], 0.0
        starts.update({n: dict(W) for n in ended})
    return with_gradients(x, torch.cat(out, 1), torch.cat([W[n].flatten(2) for n in NAMES], -1))


def ours(impl, chunks, rates):
    def f(x):
        o, state = memorize(x["q"], x["k"], x["v"], config(chunks, rates),
                            initial_state={n: x[n] for n in NAMES}, impl=impl, gates={"gamma": x["gamma"]})
        return with_gradients(x, o, torch.cat([state.weights[n].flatten(2) for n in NAMES], -1))
    return f


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("impl", ["chunked", "reference"])
def test_levels_are_eq_71_per_matrix_float64(impl, case):
    """Outputs, committed weights and gradients (q, k, v, γ, θ_0) within 1e-10 of the direct computation."""
    x = problem(torch.float64)
    helpers.compare(ours(impl, *CASES[case])(x), levels_direct(x, *CASES[case]), 1e-10, f"levels {impl} {case}")


def test_levels_are_eq_71_per_matrix_float32():
    """float32 against the float64 direct computation within the error model of tests/helpers.py."""
    chunks, rates = CASES["fast W1"]
    compare_float32(ours("chunked", chunks, rates), lambda x: levels_direct(x, chunks, rates),
                    problem(torch.float32), levels_direct(problem(torch.float64), chunks, rates), "levels")


@pytest.mark.parametrize("broken", ["levels swapped", "rates ignored", "one frequency", "gradients at the commit"])
def test_a_broken_part_fails_the_identity(broken):
    """The identity tells the rule from its neighbours: each matrix at the other's frequency, the rates left out,
    both matrices at the faster frequency, or each matrix's gradient at its own chunk's start."""
    x = problem(torch.float64)
    (c1, c2), (r1, r2) = CASES["fast W1"]
    direct = {"levels swapped": lambda: levels_direct(x, (c2, c1), (r1, r2)),
              "rates ignored": lambda: levels_direct(x, (c1, c2), (1.0, 1.0)),
              "one frequency": lambda: levels_direct(x, (c1, c1), (r1, r2)),
              "gradients at the commit": lambda: levels_direct(x, (c1, c2), (r1, r2), at_commit=True)}[broken]()
    assert rel_err(ours("chunked", (c1, c2), (r1, r2))(x)["output"], direct["output"]) > 1e-3


@pytest.mark.parametrize("chunks,rates", [CASES["fast W1"], ((1, 3), (1.0, 0.5))])
def test_levels_stream_across_chunks(chunks, rates):
    """23 tokens in pieces of 7, 1 and 15 — cuts inside a level's chunk (chunks 2 and 6), or inside the slow
    level's only (chunks 1 and 3: the state carries a commit in progress though every piece ends on a chunk of the
    config) — equal one call, gradients included: the state carries each level's commit in progress."""
    x = problem(torch.float64)

    def call(lo, hi, state):
        return memorize(*(x[n][:, lo:hi] for n in ("q", "k", "v")), config(chunks, rates),
                        initial_state=state, gates={"gamma": x["gamma"][:, lo:hi]})

    assert_pieces_equal_one_call(call, x, {n: x[n] for n in NAMES}, cuts=((0, 7), (7, 8), (8, 23)))
    _, state = call(0, 8, {n: x[n] for n in NAMES})
    assert (state.offset, sorted(state.pending)) == (8 % max(chunks), [C for C in chunks if 8 % C])


def test_a_state_of_other_levels_is_refused_in_one_line():
    """A state whose commits in progress are of levels the rule does not have (chunks 2, 6 continued as one level of
    2) names both."""
    x = problem(torch.float64)
    _, state = memorize(x["q"][:, :8], x["k"][:, :8], x["v"][:, :8], config(*CASES["fast W1"]),
                        initial_state={n: x[n] for n in NAMES}, gates={"gamma": x["gamma"][:, :8]})
    with pytest.raises(ValueError, match=r"initial_state.pending has levels \[6\]; this rule's: \[2\]"):
        memorize(x["q"][:, 8:], x["k"][:, 8:], x["v"][:, 8:], config((2, 2), (1.0, 1.0)),
                 initial_state=dataclasses.replace(state, offset=0), gates={"gamma": x["gamma"][:, 8:]})


@pytest.mark.parametrize("optimizer", ["gd", "momentum", "muon"])
def test_one_level_is_the_chunk_commit_rule_exactly(optimizer):
    """Every matrix at the config's chunk with rate 1 is chunk_commit's computation, value for value."""
    p = make_problem(architecture="mlp", T=11)
    options = dict(architecture="mlp", optimizer=optimizer, chunk_size=3, read="chunk")
    o, s, grads = run(p, "chunked", learning_rule={"name": "levels", "chunks": [3, 3]}, **options)
    o_c, s_c, grads_c = run(p, "chunked", learning_rule="chunk_commit", **options)
    assert torch.equal(o, o_c) and all(torch.equal(s.weights[n], s_c.weights[n]) for n in s.weights)
    assert all(torch.equal(grads[n], grads_c[n]) for n in grads if grads[n] is not None)


@pytest.mark.parametrize("optimizer", ["momentum", "muon"])
def test_levels_chunked_equals_the_reference_with_a_window(optimizer):
    """A window of 2 and an optimiser with state: the chunked path against the token loop, float64, 1e-10."""
    p = make_problem(architecture="mlp", T=13)
    options = dict(architecture="mlp", optimizer=optimizer, window=2, chunk_size=2, read="chunk",
                   learning_rule={"name": "levels", "chunks": [2, 4], "rates": [1.0, 0.5]})
    a, b = run(p, "chunked", **options), run(p, "reference", **options)
    helpers.compare(a, b, 1e-10, f"levels {optimizer}")


@pytest.mark.parametrize("changes,message", [
    (dict(chunk_size=3), "memory.chunk_size: levels reads and accumulates a chunk of the smallest level at a time: "
                         "expected 2, got 3"),
    (dict(read="token"), "memory.read: levels reads chunk (got 'token')"),
    (dict(learning_rule={"name": "levels", "chunks": [2, 4, 8]}),
     "memory.learning_rule.chunks: expected one chunk per weight matrix of the memory (W1, W2), got [2, 4, 8]"),
    (dict(learning_rule={"name": "levels", "chunks": [2, 3]}),
     "chunks: expected each a multiple of the smallest (2) dividing the largest (3), got [2, 3]"),
    (dict(learning_rule={"name": "levels", "chunks": [2, 4], "rates": [1.0]}),
     "rates: expected 2 numbers > 0 (one per chunk), got [1.0]"),
])
def test_bad_levels_are_named(changes, message):
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        config((2, 4), (1.0, 1.0), **changes)


def test_hope_levels_preset_commits_each_layer_of_its_memory_at_its_frequency():
    """One memory layer whose MLP's four matrices are the levels: C = 16, 64, 256, 1024, each commit a step of
    η = 0.1 on its chunk's mean gradient (r·Σ η_t = 0.1), as hope_cms's levels; the mixer's mid-chunk state holds
    the four levels' gates."""
    memory = resolve_preset("hope_levels")[1]
    commits = memory.rule().commits(["W1", "W2", "W3", "W4"], memory.chunk_size)
    assert [C for C, _ in commits.values()] == [16, 64, 256, 1024]
    assert [r * C * memory.eta for C, r in commits.values()] == pytest.approx([ETA] * 4)
    assert (memory.read, memory.alpha, memory.gamma, memory.optimizer) == ("chunk", 1.0, "learned", "gd")
    model = LanguageModel(64, "hope_levels", d_model=16, n_layers=1, n_heads=2)
    mixer = model.blocks[0].mixer
    assert isinstance(mixer, MemoryMixer)
    one_level = MemoryMixer(16, mixer.n_heads, memory.replace(learning_rule={"name": "levels", "chunks": [16] * 4}),
                            head_dim=mixer.head_dim)
    # 3 more levels × (∏α, Ση, ∏θ) per head, 4 bytes each
    assert mixer.state_bytes() - one_level.state_bytes() == 4 * 3 * 3 * mixer.n_heads
