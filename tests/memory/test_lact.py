"""LaCT (arXiv 2505.23884, "Test-Time Training Done Right"): the `lact` and `lact_simple` presets' memories against a
direct computation of their per-chunk update, written here from the paper and its official code (lact_llm's
ttt_operation.py) without the engine.

Per head, with the SwiGLU fast weights f_W(x) = W_1 (SiLU(W_2 x) ⊙ W_3 x) and the dot-product loss
ℓ_t(W) = −⟨f_W(k_t), v_t⟩, chunk c of b tokens (starting from W = W_{c−1}, momentum M_{c−1}):

    y_t = f_W(q_t)                                   every token of the chunk reads the weights before its update
    G_c = (1/b) Σ_{t∈c} γ_t ∇_W ℓ_t(W)               per weight matrix, by the chain rule (no autograd)
    M_c = θ_c M_{c−1} + G_c,   W'_c = α_c W − η_c NS_5(M_c)       α_c = ∏ α_t, η_c = Σ η_t, θ_c = ∏ θ_t over c
    W_c[r] = W'_c[r] ‖W_0[r]‖ / ‖W'_c[r]‖            lact only: each row back to its initial norm (official code)

and a partial last chunk reads W without updating it. NS_5 is written out below: Muon's quintic (lact_simple) or
LaCT's schedule of five coefficient triples, one per iteration (lact). The official code renormalises to the initial
norms with a guard, ‖W'[r]‖ + 1e−5; written here without it (the engine rescales to the norms before the step, equal
to the initial ones in exact arithmetic).
"""
import pytest
import torch
from torch.nn import functional as F

import helpers
from atlas_lab.memory import MemoryConfig, build_optimizer, check_against_reference, memorize, newton_schulz
from atlas_lab.memory.plan import Shapes, plan
from atlas_lab.models import LanguageModel, resolve_preset
from helpers import (LACT_NS, QUINTIC, compare_float32, dot_loss_gradients, rel_err, swiglu, with_gradients,
                     newton_schulz_steps as newton_schulz5)

B, T, H, D, DV = 2, 23, 2, 3, 4  # T = 23, chunks of 5: four updates and a partial chunk of 3; W_2, W_3 are 4 × 3
CHUNK = 5
NAMES = ("W1", "W2", "W3")


PRESETS = ("lact", "lact_simple")


def config(preset="lact", **changes):
    return resolve_preset(preset)[1].replace(chunk_size=CHUNK, **changes)


def rates(preset):
    """γ per head and token (lact_simple), or per weight matrix too (lact: LaCT's per-matrix learning rates)."""
    return (len(NAMES),) if preset == "lact" else ()


def problem(dtype, seed=0, preset="lact"):
    """q, k (unit norm), v; per-token gates α ∈ [0.9, 1], η ∈ [0, 0.4], θ ∈ [0.8, 1], γ ∈ [0.2, 1] (per matrix for
    lact); W_0."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return scale * torch.randn(*shape, generator=g, dtype=torch.float64)

    def uni(lo, hi, *channels):
        return lo + (hi - lo) * torch.rand(B, T, H, *channels, generator=g, dtype=torch.float64)

    x = dict(q=rnd(B, T, H, D), k=F.normalize(rnd(B, T, H, D), dim=-1), v=rnd(B, T, H, DV),
             alpha=uni(0.9, 1.0), eta=uni(0.0, 0.4), theta=uni(0.8, 1.0), gamma=uni(0.2, 1.0, *rates(preset)),
             W1=rnd(B, H, DV, DV, scale=0.5), W2=rnd(B, H, DV, D, scale=0.5), W3=rnd(B, H, DV, D, scale=0.5))
    return {n: t.to(dtype).to(helpers.DEVICE).requires_grad_(True) for n, t in x.items()}


def lact_direct(x, momentum=True, token_lr=True, apply_first=True, schedule=LACT_NS, renormalise=True):
    """The definition above, chunk by chunk (lact; schedule=QUINTIC, renormalise=False: lact_simple); the switches
    break one part each (for the test that it matters)."""
    W = {n: x[n] for n in NAMES}
    M = {n: torch.zeros_like(w) for n, w in W.items()}
    norms = {n: w.norm(dim=-1, keepdim=True) for n, w in W.items()}  # each row's initial norm (its last axis)
    out = []
    for s in range(0, T, CHUNK):
        c = slice(s, min(s + CHUNK, T))
        if c.stop - c.start < CHUNK:  # a partial chunk reads, its update waits for the chunk's end
            out.append(swiglu(W, x["q"][:, c])[0])
            break
        if apply_first:
            out.append(swiglu(W, x["q"][:, c])[0])
        G = dot_loss_gradients(W, x["k"][:, c], x["v"][:, c], x["gamma"][:, c] if token_lr else
                               torch.ones_like(x["gamma"][:, c]))
        alpha, eta, theta = (x[n][:, c].prod(1) if n != "eta" else x[n][:, c].sum(1) for n in ("alpha", "eta", "theta"))
        for n in NAMES:
            M[n] = (theta[..., None, None] * M[n] if momentum else 0) + G[n] / CHUNK
            W[n] = alpha[..., None, None] * W[n] - eta[..., None, None] * newton_schulz5(M[n], schedule)
            if renormalise:
                W[n] = W[n] / W[n].norm(dim=-1, keepdim=True) * norms[n]
        if not apply_first:
            out.append(swiglu(W, x["q"][:, c])[0])
    return with_gradients(x, torch.cat(out, 1), torch.cat([W[n].flatten(2) for n in NAMES], -1))


def direct(preset):
    """``lact_direct`` of the preset, in the dtype of x."""
    if preset == "lact":
        return lact_direct
    return lambda x: lact_direct(x, schedule=QUINTIC, renormalise=False)


def ours(impl, cfg=None):
    if isinstance(cfg, str):
        cfg = config(cfg)

    def f(x):
        o, state = memorize(x["q"], x["k"], x["v"], cfg or config(),
                            initial_state={n: x[n] for n in NAMES}, impl=impl,
                            gates={"alpha": x["alpha"], "eta": x["eta"], "theta": x["theta"], "gamma": x["gamma"]})
        return with_gradients(x, o, torch.cat([state.weights[n].flatten(2) for n in NAMES], -1))
    return f


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("impl", ["chunked", "reference"])
def test_lact_memory_is_its_chunk_update_float64(impl, preset):
    """Outputs, committed weights and gradients (q, k, v, every gate, W_0) within 1e-10 of the direct computation."""
    x = problem(torch.float64, preset=preset)
    helpers.compare(ours(impl, preset)(x), direct(preset)(x), 1e-10, f"{preset} {impl}")


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("impl", ["chunked", "reference"])
def test_lact_memory_is_its_chunk_update_float32(impl, preset):
    """float32 against the float64 direct computation within the error model of tests/helpers.py."""
    compare_float32(ours(impl, preset), direct(preset), problem(torch.float32, preset=preset),
                    direct(preset)(problem(torch.float64, preset=preset)), f"{preset} {impl}")


@pytest.mark.parametrize("broken", ["no momentum", "no per-token learning rate", "one rate for every matrix",
                                    "update, then apply", "no renormalisation", "quintic Newton–Schulz"])
def test_a_broken_part_fails_the_identity(broken):
    """The identity tells the rule from its neighbours: momentum dropped, γ_t ignored, W1's rate for all three
    matrices, the chunk reading its own update (LaCT's "update, then apply", read token's chunk form), the rows left
    at their new norms or Muon's fixed quintic in place of LaCT's schedule are off by far more than rounding."""
    x = problem(torch.float64)
    if broken == "one rate for every matrix":
        y = dict(x, gamma=x["gamma"][..., :1].expand(x["gamma"].shape))
        assert rel_err(ours("chunked")(x)["output"], lact_direct(y)["output"]) > 1e-3
        return
    switches = {"no momentum": dict(momentum=False), "no per-token learning rate": dict(token_lr=False),
                "update, then apply": dict(apply_first=False), "no renormalisation": dict(renormalise=False),
                "quintic Newton–Schulz": dict(schedule=QUINTIC)}[broken]
    assert rel_err(ours("chunked")(x)["output"], lact_direct(x, **switches)["output"]) > 1e-3


def test_lact_streams_across_chunks():
    """23 tokens in pieces of 7, 1 and 15 (a chunk in progress at each cut) equal one call, gradients included."""
    x = problem(torch.float64)
    gates = ("alpha", "eta", "theta", "gamma")

    def call(lo, hi, state):
        return memorize(*(x[n][:, lo:hi] for n in ("q", "k", "v")), config(),
                        gates={g: x[g][:, lo:hi] for g in gates}, initial_state=state)

    o_full, s_full = call(0, T, {n: x[n] for n in NAMES})
    state, pieces = {n: x[n] for n in NAMES}, []
    for lo, hi in [(0, 7), (7, 8), (8, 23)]:
        o, state = call(lo, hi, state)
        pieces.append(o)
    o_split = torch.cat(pieces, 1)
    assert rel_err(o_split, o_full) < 1e-12
    assert all(rel_err(state.weights[n], s_full.weights[n]) < 1e-12 for n in NAMES)
    for a, b in zip(torch.autograd.grad(o_split.square().sum(), list(x.values())),
                    torch.autograd.grad(o_full.square().sum(), list(x.values()))):
        assert rel_err(a, b) < 1e-12


def test_lact_preset_is_a_swiglu_memory_beside_sliding_window_attention():
    """lact_simple: MAG layers (memory and SWA branches; lact: LaCT's own layer, tests/layers/test_lact_layer.py); the
    memory's f_W is SwiGLU without residual; the layer learns γ per head and token; a chunk's η sums to 1 and θ
    multiplies to 0.9."""
    assert type(LanguageModel(64, "lact", d_model=16, n_layers=1, n_heads=2).blocks[0].mixer).__name__ == "LaCT"
    model = LanguageModel(64, "lact_simple", d_model=16, n_layers=1, n_heads=2)
    mag = model.blocks[0].mixer
    assert type(mag).__name__ == "MAG"
    c = resolve_preset("lact_simple")[1]
    assert c.chunk_size * c.eta == pytest.approx(1.0) and c.theta ** c.chunk_size == pytest.approx(0.9)
    assert set(mag.memory.learned_gates) == {"gamma"}
    W = {n: torch.randn(1, 1, *w.shape[1:], dtype=torch.float64) for n, w in mag.memory.initial_weights.items()}
    x = torch.randn(1, 1, 1, 8, dtype=torch.float64)
    o, _ = memorize(x, x, x, c, gamma=1.0, initial_state=W)  # one token: it reads W_0
    assert rel_err(o, swiglu(W, x)[0]) < 1e-12  # d_k = d_v: a residual r(k) = k would show here


# ---------------------------------------------------------------- the components' options, one at a time

@pytest.mark.parametrize("shape", [(3, 4, 4), (2, 4, 6), (2, 7, 3)])
def test_lact_newton_schulz_schedule_is_its_five_triples(shape, impl="bmm"):
    """newton_schulz(ns_coefficients="lact") is the iteration with LaCT's j-th triple at step j (written out above):
    values and gradients, float64, square, wide and tall (transposed) matrices."""
    G = torch.randn(*shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64, requires_grad=True)
    ours_, theirs = newton_schulz(G, 5, "lact", impl=impl), newton_schulz5(G, LACT_NS)
    assert rel_err(ours_, theirs) < 1e-12
    weight = torch.randn(*shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    g1, g2 = (torch.autograd.grad((y * weight).sum(), G)[0] for y in (ours_, theirs))
    assert rel_err(g1, g2) < 1e-10
    assert rel_err(newton_schulz(G, 5, "quintic", impl=impl), theirs) > 1e-3  # the schedule is not Muon's quintic


def test_a_schedule_takes_its_own_number_of_steps():
    with pytest.raises(ValueError, match="schedule of 5 steps"):
        build_optimizer({"name": "muon", "ns_coefficients": "lact", "ns_steps": 3})
    with pytest.raises(ValueError, match="valid choices: quintic, cubic, lact"):
        build_optimizer({"name": "muon", "ns_coefficients": "septic"})
    with pytest.raises(ValueError, match="one triple for every step"):  # the compiled CPU kernel takes one triple
        newton_schulz(torch.randn(2, 4, 4, dtype=torch.float64), 5, "lact", impl="cpu")
    with pytest.raises(ValueError, match="keep_row_norms: expected true or false"):
        build_optimizer({"name": "muon", "keep_row_norms": "yes"})


@pytest.mark.parametrize("read", ["token", "start", "chunk"])
def test_kept_row_norms_stay_at_the_initial_norms(read):
    """With keep_row_norms every row of every matrix ends each step at the norm it started from, whatever the
    retention α and the read; without it they move."""
    x = helpers.make_problem(T=11, architecture="mlp")
    norms = {n: w.norm(dim=-1) for n, w in x["initial_state"].items()}
    for keep in (True, False):
        _, state, _ = helpers.run(x, "chunked", optimizer={"name": "muon", "keep_row_norms": keep}, read=read,
                                  chunk_size=3, window=1)
        moved = max(rel_err(state.weights[n].norm(dim=-1), norms[n].expand_as(state.weights[n][..., 0]))
                    for n in norms)
        assert moved < 1e-12 if keep else moved > 1e-2


@pytest.mark.parametrize("read", ["token", "start", "chunk"])
@pytest.mark.parametrize("optimizer", [{"name": "muon", "ns_coefficients": "lact"},
                                       {"name": "muon", "keep_row_norms": True},
                                       {"name": "muon", "ns_coefficients": "lact", "keep_row_norms": True}])
def test_the_muon_options_against_the_reference(optimizer, read):
    """check_against_reference (chunked against the token loop, Omega window 3, chunks of 3 over 8 tokens); kept row
    norms have no closed form over a chunk: the chunked path runs Muon's update token by token (form stepwise)."""
    errors = check_against_reference(optimizer=optimizer, read=read, tol=1e-10)
    assert max(errors.values()) < 1e-10
    cfg = MemoryConfig(optimizer=optimizer, read=read, window=3, chunk_size=3).validate()
    form = plan(cfg, Shapes(2, 8, 2, 4, 4)).form
    assert form == ("chunk_start" if read == "chunk" else "stepwise" if optimizer.get("keep_row_norms")
                    else "transformed")


def test_the_schedule_stays_off_the_newton_schulz_kernel():
    """The Triton Newton–Schulz kernel takes one triple for every step: a schedule on CUDA takes the chunked path
    (the batched PyTorch iteration), and says so."""
    cfg = MemoryConfig(optimizer={"name": "muon", "ns_coefficients": "lact"}, window=3).validate()
    how = plan(cfg, Shapes(2, 64, 2, 16, 16), torch.float32, "cuda")
    assert (how.path, how.ns) == ("chunked", "bmm") and "muon(k=5,lact)" in how.reason, how
    assert "its Newton–Schulz in batched matmuls (a schedule of triples" in how.reason, how
    quintic = MemoryConfig(optimizer="muon", window=3).validate()
    how = plan(quintic, Shapes(2, 64, 2, 16, 16), torch.float32, "cuda")
    assert (how.path, how.ns) == ("chunked", "triton") and "one batched Triton launch per chunk" in how.reason, how
    assert plan(quintic, Shapes(2, 64, 2, 16, 16), torch.float32, "cpu").ns == "cpu"


def test_lact_and_lact_simple_differ_only_in_muon_options_and_the_rates_per_matrix():
    """lact's memory is lact_simple's with LaCT's Newton–Schulz schedule, its row renormalisation and its learning
    rates per matrix (two YAML keys away)."""
    official, simple = (resolve_preset(p)[1] for p in PRESETS)
    assert official.replace(optimizer="muon", learning_rule="chunk_commit") == simple
    assert official.rule().per_matrix and not simple.rule().per_matrix
    _, _, _, opt = official.components()
    assert (opt.ns_coefficients, opt.keep_row_norms) == ("lact", True)


def test_rates_per_matrix_that_are_equal_are_the_rule_per_head():
    """chunk_commit with per_matrix and the same γ_t for W1, W2, W3 is chunk_commit with that γ_t per head, bit for
    bit (each matrix's window weights are the same numbers)."""
    x = problem(torch.float64, preset="lact_simple")
    per_matrix = config()
    per_head = per_matrix.replace(learning_rule="chunk_commit")
    gates = {g: x[g] for g in ("alpha", "eta", "theta")}
    W = {n: x[n] for n in NAMES}
    o_head, _ = memorize(x["q"], x["k"], x["v"], per_head, gates={**gates, "gamma": x["gamma"]}, initial_state=W)
    o_matrix, _ = memorize(x["q"], x["k"], x["v"], per_matrix, initial_state=W,
                           gates={**gates, "gamma": x["gamma"].unsqueeze(-1).expand(B, T, H, len(NAMES))})
    assert torch.equal(o_head, o_matrix)


@pytest.mark.parametrize("changes", [dict(read="start"), dict(read="token"), dict(window=2)])
def test_rates_per_matrix_need_chunk_reads_and_window_1(changes):
    with pytest.raises(ValueError, match=r"learning_rule.per_matrix: weights each matrix's gradients in the chunk's "
                                         r"commit: needs read chunk and window 1"):
        config(**changes)
