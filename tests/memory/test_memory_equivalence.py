"""chunked == reference (docs/memory.md §5): outputs, final state and gradients, for every combination of
architecture × feature map × attentional bias × window × optimiser, in float64 and float32, with T not a multiple of
the chunk, chunk 1, and a sequence split into calls that pass the state on."""
import itertools

import pytest
import torch

from atlas_lab import memory as engine
from atlas_lab.memory import MemoryConfig, memorize
from helpers import compare, compare_float32, make_problem, rel_err, run

# every built-in component, from the registries: a component added there is tested here
ARCHITECTURES, FEATURE_MAPS, BIASES, OPTIMIZERS = (list(r) for r in (engine.MEMORIES, engine.FEATURE_MAPS,
                                                                      engine.ATTENTIONAL_BIASES, engine.OPTIMIZERS))
WINDOWS = [1, 3, None]
TOL = 1e-5  # float64: rounding (u = 1.1e-16) amplified even 1e6-fold stays far below it; a wrong result is off by O(1)


@pytest.mark.parametrize("architecture,feature_map,bias,window,optimizer",
                         list(itertools.product(ARCHITECTURES, FEATURE_MAPS, BIASES, WINDOWS, OPTIMIZERS)))
def test_chunked_equals_reference_float64(architecture, feature_map, bias, window, optimizer):
    options = dict(architecture=architecture, feature_map=feature_map, attentional_bias=bias, window=window,
                   optimizer=optimizer,
                   chunk_size=3)  # T = 7: two full chunks and a partial one
    p = make_problem(architecture=architecture, feature_map=feature_map, dtype=torch.float64)
    compare(run(p, "chunked", **options), run(p, "reference", **options), TOL, str(options))


@pytest.mark.parametrize("architecture,feature_map,bias,window,optimizer",
                         list(itertools.product(ARCHITECTURES, FEATURE_MAPS, BIASES, WINDOWS, OPTIMIZERS)))
def test_chunked_equals_reference_float32(architecture, feature_map, bias, window, optimizer):
    """float32 against the float64 oracle within the error model of tests/helpers.py. Muon's quintic Newton–Schulz
    multiplies rounding by up to a^k = 3.4445^5 ≈ 480 near small singular values, Adam's m / √(v + ε²) by up to 1/ε
    where v is small: the float32 reference's own spread (sampled on nudged inputs) carries that into the bound."""
    options = dict(architecture=architecture, feature_map=feature_map, attentional_bias=bias, window=window,
                   optimizer=optimizer,
                   chunk_size=3)
    oracle = run(make_problem(architecture=architecture, feature_map=feature_map, dtype=torch.float64), "reference",
                 **options)
    compare_float32(lambda p: run(p, "chunked", **options), lambda p: run(p, "reference", **options),
                    make_problem(architecture=architecture, feature_map=feature_map,
                                 dtype=torch.float32), oracle, str(options))


@pytest.mark.parametrize("architecture,optimizer", list(itertools.product(ARCHITECTURES, OPTIMIZERS)))
@pytest.mark.parametrize("window", [1, 2, None])
def test_chunk_size_one_is_the_online_rule(architecture, optimizer, window):
    options = dict(architecture=architecture, feature_map="polynomial", attentional_bias="l2", window=window,
                   optimizer=optimizer,
                   chunk_size=1)
    p = make_problem(architecture=architecture, feature_map="polynomial", T=5)
    compare(run(p, "chunked", **options), run(p, "reference", **options), 1e-5, str(options))


@pytest.mark.parametrize("impl", ["chunked", "reference"])
@pytest.mark.parametrize("architecture,optimizer", list(itertools.product(ARCHITECTURES, OPTIMIZERS)))
@pytest.mark.parametrize("window", [1, 3, None])
def test_split_into_calls_passes_the_state(impl, architecture, optimizer, window):
    """One call on T = 11 equals calls on 4 + 1 + 6 tokens (splits inside a chunk of 3) that pass the state on."""
    options = dict(architecture=architecture, feature_map="taylor", attentional_bias="l2", window=window,
                   optimizer=optimizer,
                   chunk_size=3)
    p = make_problem(architecture=architecture, feature_map="taylor", T=11)
    gates = {g: p[g] for g in ("alpha", "eta", "theta", "gamma")}
    o_full, s_full = memorize(p["q"], p["k"], p["v"], initial_state=p["initial_state"], impl=impl, gates=gates,
                              **options)
    state, pieces = p["initial_state"], []
    for lo, hi in [(0, 4), (4, 5), (5, 11)]:
        o, state = memorize(p["q"][:, lo:hi], p["k"][:, lo:hi], p["v"][:, lo:hi], initial_state=state, impl=impl,
                            gates={g: x[:, lo:hi] for g, x in gates.items()}, **options)
        pieces.append(o)
    o_split = torch.cat(pieces, 1)
    assert rel_err(o_split, o_full) <= 1e-10
    assert state.offset == s_full.offset == 11 % 3
    for n in s_full.weights:
        assert rel_err(state.weights[n], s_full.weights[n]) <= 1e-10
    # gradients flow through the carried state to the first piece's inputs and the initial weights
    leaves = [p["q"], p["k"], p["v"], *p["initial_state"].values()]
    g_full = torch.autograd.grad(o_full.square().sum(), leaves)
    g_split = torch.autograd.grad(o_split.square().sum(), leaves)
    for a, b in zip(g_split, g_full):
        assert rel_err(a, b) <= 1e-10


@pytest.mark.parametrize("architecture,bias,window,optimizer",
                         list(itertools.product(["mlp", "gated_mlp"], BIASES, [1, 3, None], OPTIMIZERS)))
def test_output_norm_chunked_equals_reference(architecture, bias, window, optimizer):
    """M = r + LN(…): the chunked path's analytic LN Jacobian against autograd through the reference loop, T = 13
    over chunks of 4 (a partial last chunk).

    float64: chunked == reference within 1e-5; float32: against the float64 oracle within the error model of
    tests/helpers.py (LN divides by the output's std, small at d_v = 4, which widens the float32 spread; the bound
    follows it). kl_retention is held to float64 only: its softmax of accumulated logits under LN puts the float32
    reference's own output spread near 1.4e-3, so SPREAD × that reaches USEFUL and could not tell a wrong chunk
    boundary from rounding."""
    options = dict(architecture={"name": architecture, "output_norm": True}, feature_map="polynomial",
                   attentional_bias=bias, window=window, optimizer=optimizer, chunk_size=4)
    oracle = run(make_problem(architecture=architecture, feature_map="polynomial", T=13), "reference", **options)
    compare(run(make_problem(architecture=architecture, feature_map="polynomial", T=13), "chunked", **options), oracle,
            TOL, str(options))
    if optimizer == "kl_retention":
        return
    compare_float32(lambda p: run(p, "chunked", **options), lambda p: run(p, "reference", **options),
                    make_problem(architecture=architecture, feature_map="polynomial", T=13,
                                 dtype=torch.float32), oracle,
                    str(options))


def test_output_norm_normalises_the_memory_output():
    """With output_norm and no residual, every read-out has mean 0 and variance 1 over its d_v outputs (up to ε)."""
    p = make_problem(architecture="mlp", T=9, d_k=4, d_v=6)
    o, _ = memorize(p["q"], p["k"], p["v"], architecture={"name": "mlp", "residual": False, "output_norm": True},
                    attentional_bias="dot", chunk_size=4, initial_state=p["initial_state"])
    torch.testing.assert_close(o.mean(-1), torch.zeros_like(o[..., 0]), atol=1e-12, rtol=0)
    assert (o.var(-1, unbiased=False) - 1).abs().max() < 1e-3
    with pytest.raises(ValueError, match="memorize.architecture.output_norm: linear does not take 'output_norm'; it "
                                         "takes no options"):
        memorize(p["q"], p["k"], p["v"], architecture={"name": "linear", "output_norm": True})


class TwoLayerMLP(torch.nn.Module):
    """A custom memory: the built-in mlp memory (depth 2, gelu, no residual) written as an nn.Module."""

    def __init__(self, d_in, d_hidden, d_out):
        super().__init__()
        self.W1 = torch.nn.Parameter(torch.randn(d_hidden, d_in, dtype=torch.float64) / d_in ** 0.5)
        self.W2 = torch.nn.Parameter(torch.randn(d_out, d_hidden, dtype=torch.float64) / d_hidden ** 0.5)

    def forward(self, x):
        return self.W2 @ torch.nn.functional.gelu(self.W1 @ x)


class BiasMemory(torch.nn.Module):
    """A custom memory with a 1-D parameter (takes the plain momentum step under muon)."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.lin = torch.nn.Linear(d_in, d_out, dtype=torch.float64)

    def forward(self, x):
        return torch.tanh(self.lin(x))


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("window", [1, 3, None])
def test_custom_module_memory(optimizer, window, device):
    """The generic torch.func path: chunked == reference, and a module equal to the built-in mlp gives its results."""
    torch.manual_seed(0)
    module = TwoLayerMLP(4, 16, 4).to(device)
    p = make_problem(architecture={"name": "mlp", "residual": False}, T=7)
    p["initial_state"] = {n: w.detach().clone().unsqueeze(0).repeat(2, 1, 1).requires_grad_()
                          for n, w in module.named_parameters()}
    options = dict(attentional_bias="l2", window=window, optimizer=optimizer, chunk_size=3)
    custom = run(p, "chunked", architecture=module, **options)
    compare(custom, run(p, "reference", architecture=module, **options), 1e-5, f"module {options}")
    compare(custom, run(p, "chunked", architecture={"name": "mlp", "depth": 2, "expansion": 4, "residual": False},
                        **options), 1e-5,
            f"module vs built-in {options}")
    bias_memory = BiasMemory(4, 4).to(device)
    p2 = make_problem(architecture="mlp", T=7)
    p2["initial_state"] = {n: w.detach().clone().requires_grad_() for n, w in bias_memory.named_parameters()}
    compare(run(p2, "chunked", architecture=bias_memory, **options), run(p2, "reference", architecture=bias_memory,
                                                                         **options),
            1e-5, f"bias module {options}")


def test_default_gates_and_state(device):
    """None gates are the config's constants (MemoryConfig: α = 1, η = 1, γ = 1; a learned θ must be given where
    the optimizer reads it); initial_state=None means zeros for linear memory."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 5, 2, 3, dtype=torch.float64).to(device) for _ in range(3))
    options = dict(architecture="linear", optimizer="momentum", chunk_size=2)
    o1, s1 = memorize(q, k, v, theta=0.0, **options)
    ones = q.new_ones(1, 5, 2)
    o2, s2 = memorize(q, k, v, eta=1.0, initial_state={"W": q.new_zeros(3, 3)},
                      **options, gates={"alpha": ones, "theta": 0 * ones, "gamma": ones})
    assert rel_err(o1, o2) < 1e-12
    o3, _ = memorize(q, k, v, MemoryConfig(architecture="linear", optimizer="momentum", chunk_size=2, theta=0.0))
    assert torch.equal(o1, o3)
    with pytest.raises(ValueError, match="gate theta is 'learned' in the config; pass its values"):
        memorize(q, k, v, **options)
    assert rel_err(o1, o2) < 1e-12
    assert s1.weights["W"].shape == (1, 2, 3, 3) and s1.optimizer_state["W"].shape == (1, 2, 3, 3)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("feature_map", ["identity", "polynomial"])
@pytest.mark.parametrize("T,block", [(150, None), (23, 5)])
def test_exact_delta_rule_blocks_equal_the_token_loop(dtype, feature_map, T, block, monkeypatch):
    """Chunk size 1 of the linear l2 gd memory at window 1 runs the WY-form delta rule a block of tokens at a
    time (atlas_lab.memory.delta_rule): the same function as the reference's token loop, gradients included."""
    from atlas_lab.memory import delta_rule

    if block:
        monkeypatch.setattr(delta_rule, "BLOCK", block)  # several blocks, the last one partial
    options = dict(architecture="linear", feature_map=feature_map, attentional_bias="l2", window=1, optimizer="gd",
                   chunk_size=1)
    p = make_problem(T=T, feature_map=feature_map, dtype=dtype)
    if dtype == torch.float64:
        compare(run(p, "chunked", **options), run(p, "reference", **options), TOL, f"T={T} block={block}")
    else:
        oracle = run(make_problem(T=T, feature_map=feature_map), "reference", **options)
        compare_float32(lambda p: run(p, "chunked", **options), lambda p: run(p, "reference", **options), p, oracle,
                        f"T={T} block={block}")


def test_exact_delta_rule_passes_its_state_between_calls():
    options = dict(architecture="linear", attentional_bias="l2", window=1, optimizer="gd", chunk_size=1)
    p = make_problem(T=23)
    whole, state = memorize(p["q"], p["k"], p["v"],
                            initial_state=p["initial_state"], **options,
                            gates={"alpha": p["alpha"], "eta": p["eta"], "gamma": p["gamma"]})
    o1, s1 = memorize(*(p[n][:, :10] for n in "qkv"),
                      initial_state=p["initial_state"], **options,
                      gates={"alpha": p["alpha"][:, :10], "eta": p["eta"][:, :10], "gamma": p["gamma"][:, :10]})
    o2, s2 = memorize(*(p[n][:, 10:] for n in "qkv"),
                      initial_state=s1, **options,
                      gates={"alpha": p["alpha"][:, 10:], "eta": p["eta"][:, 10:], "gamma": p["gamma"][:, 10:]})
    assert rel_err(torch.cat([o1, o2], 1), whole) < 1e-12
    assert rel_err(s2.weights["W"], state.weights["W"]) < 1e-12


@pytest.mark.parametrize("architecture,optimizer,window", [("mlp", "muon", 3), ("linear", "momentum", None),
                                                     ("gated_mlp", "gd", 1)])
def test_checkpointed_chunks_give_the_same_values_and_gradients(architecture, optimizer, window):
    options = dict(architecture=architecture, feature_map="polynomial", attentional_bias="l2", window=window,
                   optimizer=optimizer,
                   chunk_size=3)
    p = make_problem(architecture=architecture, feature_map="polynomial", dtype=torch.float64)
    compare(run(p, "chunked", checkpoint=True, **options), run(p, "chunked", **options), 1e-12, str(options))


def test_muon_state_does_not_keep_the_chunk_per_token_weights_alive():
    """The state after a chunk is a copy of the last token's weights, not a view of all of them
    (with B = H = 1 a view would pass through memorize's reshapes unchanged)."""
    p = make_problem(architecture="mlp", T=6, B=1, H=1)  # the last chunk is a full one
    _, state = memorize(p["q"], p["k"], p["v"], architecture="mlp", optimizer="muon", window=3, chunk_size=3,
                        gates={"alpha": p["alpha"], "eta": p["eta"], "theta": p["theta"], "gamma": p["gamma"]})
    for part in (state.weights, state.optimizer_state):
        for w in part.values():
            assert w.untyped_storage().nbytes() == w.numel() * w.element_size()


# ---------------------------------------------------------------- chunk-start reads (read="chunk", docs/memory.md §4.1)

@pytest.mark.parametrize("architecture,bias,window,optimizer",
                         list(itertools.product(ARCHITECTURES, BIASES, WINDOWS, OPTIMIZERS)))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_chunk_start_reads_chunked_equals_reference(architecture, bias, window, optimizer, dtype):
    chunked_equals_reference(dict(attentional_bias=bias, window=window, chunk_size=3, read="chunk"), architecture,
                             optimizer, dtype)


def chunked_equals_reference(options: dict, architecture: str, optimizer: str, dtype):
    """chunked against reference with polynomial features, 7 tokens: float64 within TOL, float32 within the error
    model of tests/helpers.py (muon with cubic coefficients in float32)."""
    cubic = {"name": "muon", "ns_coefficients": "cubic" if dtype == torch.float32 else "quintic"}
    options = dict(options, architecture=architecture, feature_map="polynomial",
                   optimizer=cubic if optimizer == "muon" else optimizer)
    p = make_problem(architecture=architecture, feature_map="polynomial", dtype=dtype)
    if dtype == torch.float64:
        compare(run(p, "chunked", **options), run(p, "reference", **options), TOL, str(options))
    else:
        oracle = run(make_problem(architecture=architecture, feature_map="polynomial", dtype=torch.float64),
                     "reference", **options)
        compare_float32(lambda p: run(p, "chunked", **options), lambda p: run(p, "reference", **options), p, oracle,
                        str(options))


@pytest.mark.parametrize("impl", ["chunked", "reference"])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_chunk_start_reads_split_into_calls_pass_the_pending_chunk(impl, optimizer):
    """T = 11 at once equals 4 + 1 + 6 tokens in calls (the chunk of 3 in progress travels in state.pending)."""
    options = dict(architecture="mlp", feature_map="polynomial", attentional_bias="l2", window=3, optimizer=optimizer,
                   chunk_size=3, read="chunk", impl=impl)
    p = make_problem(architecture="mlp", feature_map="polynomial", T=11)
    gates = {g: p[g] for g in ("alpha", "eta", "theta", "gamma")}
    o_full, s_full = memorize(p["q"], p["k"], p["v"], initial_state=p["initial_state"], gates=gates, **options)
    state, pieces = p["initial_state"], []
    for lo, hi in [(0, 4), (4, 5), (5, 11)]:
        o, state = memorize(p["q"][:, lo:hi], p["k"][:, lo:hi], p["v"][:, lo:hi], initial_state=state,
                            gates={g: x[:, lo:hi] for g, x in gates.items()}, **options)
        pieces.append(o)
        assert (state.pending is None) == (hi % 3 == 0) and state.eval_weights is None
    assert rel_err(torch.cat(pieces, 1), o_full) <= 1e-12
    for n in s_full.weights:
        assert rel_err(state.weights[n], s_full.weights[n]) <= 1e-12
        assert rel_err(state.pending[3]["grad"][n], s_full.pending[3]["grad"][n]) <= 1e-12
    with pytest.raises(ValueError, match="no pending state"):  # a per-token state does not continue as read=chunk
        _, token_state = memorize(p["q"][:, :4], p["k"][:, :4], p["v"][:, :4], theta=0.5,
                                  **{**options, "read": "token"})
        memorize(p["q"][:, 4:], p["k"][:, 4:], p["v"][:, 4:], initial_state=token_state, theta=0.5, **options)


@pytest.mark.parametrize("architecture,optimizer", [("linear", "gd"), ("mlp", "muon"), ("gated_mlp", "momentum")])
def test_chunk_start_reads_of_chunk_one_read_before_the_exact_step(architecture, optimizer):
    """b = 1: the same weights as the exact rule after every token, each read taken before the token's step:
    o_chunk[t + 1] = M_{W_t}(φ(q_{t+1})) = the exact rule's output at t for the queries shifted by one."""
    p = make_problem(architecture=architecture, feature_map="polynomial", T=9)
    opts = dict(architecture=architecture, feature_map="polynomial", window=2, optimizer=optimizer, chunk_size=1,
                coefficients=p["coefficients"], initial_state=p["initial_state"],
                gates={g: p[g] for g in ("alpha", "eta", "theta", "gamma")})
    o_chunk, s_chunk = memorize(p["q"], p["k"], p["v"], read="chunk", **opts)
    q_next = torch.cat([p["q"][:, 1:], p["q"][:, :1]], 1)
    o_token, s_token = memorize(q_next, p["k"], p["v"], read="token", **opts)
    assert rel_err(o_chunk[:, 1:], o_token[:, :-1]) < 1e-12
    for n in s_token.weights:
        assert rel_err(s_chunk.weights[n], s_token.weights[n]) < 1e-12


# ---------------------------------------------------------------- start reads (read="start", docs/memory.md §4.1)

@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_start_reads_chunked_equals_reference(architecture, optimizer, dtype):
    """read="start", window 2, chunk 3, 7 tokens (a partial last chunk): values, state and gradients."""
    chunked_equals_reference(dict(window=2, chunk_size=3, read="start"), architecture, optimizer, dtype)


@pytest.mark.parametrize("impl", ["chunked", "reference"])
@pytest.mark.parametrize("optimizer", ["gd", "muon"])
def test_start_reads_are_the_per_token_rule_read_at_each_chunk_start(impl, optimizer):
    """read="start" keeps the per-token rule's state (read token's, exactly) and reads, at every token of a chunk,
    the weights the chunk started from: the read-token output of the chunk's first token with its queries read
    through the previous chunk's last weights. Pieces cut inside a chunk give the one call's result."""
    p = make_problem(architecture="mlp", feature_map="polynomial", T=10)
    gates = {g: p[g] for g in ("alpha", "eta", "theta", "gamma")}
    opts = dict(architecture="mlp", feature_map="polynomial", window=2, optimizer=optimizer, chunk_size=4, impl=impl,
                coefficients=p["coefficients"])
    o_start, s_start = memorize(p["q"], p["k"], p["v"], read="start", initial_state=p["initial_state"], gates=gates,
                                **opts)
    o_token, s_token = memorize(p["q"], p["k"], p["v"], read="token", initial_state=p["initial_state"], gates=gates,
                                **opts)
    for n in s_token.weights:
        assert rel_err(s_start.weights[n], s_token.weights[n]) < 1e-12
    _, before = memorize(p["q"][:, :4], p["k"][:, :4], p["v"][:, :4], read="token", initial_state=p["initial_state"],
                         gates={g: x[:, :4] for g, x in gates.items()}, **opts)
    W4 = {n: w.unsqueeze(1).expand(-1, 4, *w.shape[1:]) for n, w in before.weights.items()}  # [B, 4 queries, H, ...]
    q4 = p["q"][:, 4:8].reshape(-1, 1, *p["q"].shape[2:])  # each query of chunk 2 alone, at W_4
    o_at_start, _ = memorize(q4, p["k"][:, 4:5].repeat_interleave(4, 0), p["v"][:, 4:5].repeat_interleave(4, 0),
                             read="start", initial_state={n: w.flatten(0, 1) for n, w in W4.items()},
                             gates={g: x[:, 4:5].repeat_interleave(4, 0) for g, x in gates.items()}, **opts)
    assert rel_err(o_start[:, 4:8], o_at_start.reshape(o_start[:, 4:8].shape)) < 1e-12
    state, pieces = p["initial_state"], []
    for lo, hi in [(0, 2), (2, 7), (7, 10)]:
        o, state = memorize(p["q"][:, lo:hi], p["k"][:, lo:hi], p["v"][:, lo:hi], read="start", initial_state=state,
                            gates={g: x[:, lo:hi] for g, x in gates.items()}, **opts)
        pieces.append(o)
    assert rel_err(torch.cat(pieces, 1), o_start) < 1e-12


def test_chunk_start_reads_of_gd_commit_the_exact_chunk_end_state():
    """Linear memory, gd, α = 1, one η for every token, window 1: a chunk's commit W̃ − (Σ η) ḡ is the exact rule's
    state at the chunk's end, W̃ − Σ_t η g_t (both take the gradients at W̃), and every token reads W̃."""
    p = make_problem(T=10)
    opts = dict(architecture="linear", optimizer="gd", attentional_bias="l2", window=1, chunk_size=4, alpha=1.0,
                eta=0.3)
    o_chunk, s_chunk = memorize(p["q"], p["k"], p["v"], read="chunk", initial_state=p["initial_state"], **opts)
    W = p["initial_state"]["W"].unsqueeze(0)  # [1, H, d_v, D]
    for lo in (0, 4, 8):  # each chunk reads the exact rule's weights at its start
        if lo:
            W = memorize(p["q"][:, :lo], p["k"][:, :lo], p["v"][:, :lo], initial_state=p["initial_state"],
                         **opts)[1].weights["W"]
        hi = min(lo + 4, 10)
        direct = torch.einsum("bhvd,bthd->bthv", W.expand(2, -1, -1, -1), p["q"][:, lo:hi])
        assert rel_err(o_chunk[:, lo:hi], direct) < 1e-12
    exact_at_8 = memorize(p["q"][:, :8], p["k"][:, :8], p["v"][:, :8], initial_state=p["initial_state"], **opts)[1]
    assert rel_err(s_chunk.weights["W"], exact_at_8.weights["W"]) < 1e-12  # tokens 8, 9: pending, not committed


@pytest.mark.parametrize("bias", BIASES)
@pytest.mark.parametrize("architecture,optimizer", list(itertools.product(ARCHITECTURES, OPTIMIZERS)))
def test_float32_comparison_fails_on_a_wrong_path(architecture, optimizer, bias):
    """The float32 bound still catches a wrong path, in every combination the float32 tests cover, the
    ill-conditioned ones (Adam under lp and huber) included: the reference with η dropped on its last token fails,
    and so does chunked with its boundaries moved (chunk 2 where the reference takes 3); the right path passes."""
    options = dict(architecture=architecture, feature_map="polynomial", attentional_bias=bias, window=None,
                   optimizer=optimizer,
                   chunk_size=3)
    oracle = run(make_problem(architecture=architecture, feature_map="polynomial"), "reference", **options)
    p = make_problem(architecture=architecture, feature_map="polynomial", dtype=torch.float32)

    def reference(p):
        return run(p, "reference", **options)

    def no_last_eta(p):
        return run({**p, "eta": torch.cat([p["eta"][:, :-1], torch.zeros_like(p["eta"][:, -1:])], 1)}, "reference",
                   **options)

    compare_float32(lambda p: run(p, "chunked", **options), reference, p, oracle, str(options))
    wrongs = [no_last_eta]
    if not (architecture == "linear" and bias == "dot"):  # there ∇ℓ = −v kᵀ does not read W: chunking changes nothing
        wrongs.append(lambda p: run(p, "chunked", **{**options, "chunk_size": 2}))
    for wrong in wrongs:
        with pytest.raises(AssertionError, match="exceeded"):
            compare_float32(wrong, reference, p, oracle, str(options))


@pytest.mark.parametrize("architecture,read", [("linear", "token"), ("mlp", "token"), ("mlp", "chunk")])
def test_cached_constants_built_in_inference_mode_serve_a_later_backward(architecture, read):
    """Lightning validates under torch.inference_mode. The masks and feature-map indices the chunked path caches may
    be built first there, and a later training step must still take gradients through them."""
    from atlas_lab.memory import chunked, feature_maps
    from atlas_lab.memory.ops import causal

    for cached in (causal.causal_mask, causal.strictly_lower, chunked.window_mask, feature_maps._monomials):
        cached.cache_clear()
    config = MemoryConfig(architecture=architecture, feature_map="polynomial", window=3, chunk_size=4, read=read,
                          alpha="learned", eta="learned", gamma="learned", optimizer="momentum")
    p = make_problem(architecture=architecture, feature_map="polynomial", T=9)
    with torch.inference_mode():
        memorize(p["q"], p["k"], p["v"], impl="chunked", config=config, initial_state=p["initial_state"],
                 coefficients=p["coefficients"], gates={n: p[n] for n in ("alpha", "eta", "theta", "gamma")})
    compare(run(p, "chunked", config=config), run(p, "reference", config=config), 1e-8, str(config))
