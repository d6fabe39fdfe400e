"""memory/plan.py: the one place that picks a call's path — the routing table of every preset, why not a faster path,
and the fla path's mapping checked on the CPU against the reference through fla's own naive recurrences."""
import pytest
import torch

from atlas_lab.memory import MemoryConfig, memorize
from atlas_lab.memory import plan as planning
from atlas_lab.memory import fla, predict
from atlas_lab.memory.plan import Shapes, plan
from atlas_lab.models import PRESETS, resolve_preset
from helpers import compare, fla_float64, make_problem, run

SHAPES = Shapes(64, 256, 8, 16, 16)  # sweeps/mqar_gpu.yaml's batch, longest length, memory heads, head dim

# preset: (path on CUDA under bf16-mixed [fla's op], path on CUDA in float32, the chunked path's form on the CPU)
ROUTES = {
    "linear_attention": ("fla simple_gla", "triton", "linear"),
    "gla": ("fla simple_gla", "triton", "linear"),
    "retnet": ("fla simple_gla", "triton", "linear"),
    "mamba2": ("fla simple_gla", "triton", "linear"),
    "samba": ("fla simple_gla", "triton", "linear"),
    "deltanet": ("fla gated_delta_rule", "triton", "delta_rule"),
    "longhorn": ("fla gated_delta_rule", "triton", "delta_rule"),  # η_t rescaled by the key before fla sees it
    "kda": ("fla kda", "chunked", "delta_rule"),
    "kimi_linear": ("fla kda", "chunked", "delta_rule"),
    # gradients at W_{t−1} (Titans' form): not fla's gated delta rule, which takes them at α_t W_{t−1}; the chunk
    # kernels at chunk 1 (a walk of T chunks) predicted faster than the chunked path's WY blocks
    "gated_deltanet": ("triton", "triton", "delta_rule"),
    "gated_deltanet_h2": ("triton", "triton", "delta_rule"),
    "gated_deltanet2": ("chunked", "chunked", "delta_rule"),
    "gated_deltaproduct": ("chunked", "chunked", "delta_rule"),
    "swla": ("triton", "triton", "linear"),
    # muon on a 2-layer MLP: the fused kernel, Newton–Schulz inside (ops/chunk_mlp_memory/muon.py), where its backward
    # fits an sm_90 block's shared memory (W1 64 × 153 in float32 and 16-bit operands; atlas_pp's gated pair, a block
    # of 128 × 256, in 16-bit operands only); else the chunked path around the batched Newton–Schulz kernel
    "atlas": ("triton ns fused", "triton ns fused", "transformed"),
    "atlas_pp": ("triton ns fused", "chunked ns triton", "transformed"),
    "atlas_mag": ("triton ns fused", "triton ns fused", "transformed"),
    "atlas_mal": ("triton ns fused", "triton ns fused", "transformed"),
    "atlas_mac": ("triton ns fused", "triton ns fused", "transformed"),
    # a 2-layer MLP with gd or momentum and a window: the MLP chunk kernel (ops/chunk_mlp_memory)
    "ttt_mlp": ("triton", "triton", "linear"),
    "titans": ("triton", "triton", "linear"),
    "titans_mac": ("triton", "triton", "linear"),
    "dla": ("chunked", "chunked", "linear"),
    "omeganet": ("triton", "triton", "linear"),
    "deep_transformer": ("chunked", "chunked", "linear"),
    "swdt": ("chunked", "chunked", "linear"),
    "dot": ("triton", "triton", "linear"),
    "yaad": ("chunked", "chunked", "linear"),
    "moneta": ("chunked", "chunked", "accumulated"),
    "memora": ("chunked", "chunked", "accumulated"),
    "lact": ("chunked", "chunked", "chunk_start"),
    "lact_simple": ("chunked", "chunked", "chunk_start"),
    "hope_cms": ("chunked", "chunked", "chunk_start"),
    "hope_levels": ("chunked", "chunked", "chunk_start"),
    "tnt": ("chunked", "chunked", "linear"),
}


def test_every_preset_with_a_memory_has_a_route():
    assert set(ROUTES) == {p for p in PRESETS if resolve_preset(p)[1] is not None}


def route(how) -> str:
    """A plan's path, fla's op, and muon's Newton–Schulz where it is a Triton kernel's (fused: inside the MLP kernel;
    triton: the batched launch the chunked path calls)."""
    return " ".join(filter(None, (how.path, how.op, f"ns {how.ns}" if how.ns in ("triton", "fused") else None)))


@pytest.mark.parametrize("preset", list(ROUTES))
def test_the_routing_table(preset):
    """Which path each preset's memory takes on CUDA (bf16-mixed and float32) and on the CPU, and the reason given
    for not taking a faster one names what that path lacks."""
    config = resolve_preset(preset)[1]
    low, full, form = ROUTES[preset]
    on_bf16 = plan(config, SHAPES, torch.bfloat16, "cuda")
    assert route(on_bf16) == low, on_bf16
    assert route(plan(config, SHAPES, torch.float32, "cuda")) == full
    on_cpu = plan(config, SHAPES, torch.float32, "cpu")
    assert (on_cpu.path, on_cpu.form) == ("chunked", form)
    if on_bf16.path != "fla":
        assert "not fla: " in on_bf16.reason, on_bf16.reason
    if low.startswith("fla"):  # float32 stays on the project's kernels: fla's refuse it
        assert plan(config, SHAPES, torch.float32, "cuda").path != "fla"


def test_an_impl_that_does_not_cover_a_call_says_why_in_one_line():
    with pytest.raises(NotImplementedError, match=r"impl='fla' does not cover dtype torch.float32 .*bf16-mixed"):
        plan(resolve_preset("deltanet")[1], SHAPES, torch.float32, "cuda", impl="fla")
    with pytest.raises(NotImplementedError, match=r"impl='fla' does not cover window=8 "):
        plan(resolve_preset("atlas")[1], SHAPES, torch.bfloat16, "cuda", impl="fla")
    with pytest.raises(NotImplementedError, match=r"impl='triton' does not cover read='chunk'"):
        plan(resolve_preset("lact")[1], SHAPES, torch.float32, "cuda", impl="triton")
    with pytest.raises(ValueError, match="unknown impl='fast'"):
        plan(MemoryConfig(), SHAPES, impl="fast")


def test_a_rule_that_overrides_update_leaves_the_kernels():
    """A subclass of gd with its own update is not gd's closed form: the plan does not send it to a kernel or fla."""
    from atlas_lab.memory import GD

    class Doubled(GD):
        def update(self, w, s, g, alpha, eta, theta):
            return GD.update(self, w, s, 2 * g, alpha, eta, theta)

    config = MemoryConfig(architecture="linear", optimizer=Doubled(), window=1, chunk_size=1, alpha=1.0)
    assert plan(MemoryConfig(architecture="linear", window=1, chunk_size=1, alpha=1.0), SHAPES, torch.bfloat16,
                "cuda").path == "fla"
    how = plan(config, SHAPES, torch.bfloat16, "cuda")
    assert (how.path, how.form) == ("chunked", "stepwise"), how


# fla's naive recurrences, standing in for its chunk kernels (same keyword arguments) on the CPU
NAIVE = {"gated_delta_rule": ("fla.ops.gated_delta_rule.naive", "naive_recurrent_gated_delta_rule"),
         "kda": ("fla.ops.kda.naive", "naive_recurrent_kda"),
         "simple_gla": ("fla.ops.simple_gla.naive", "naive_recurrent_simple_gla")}
CASES = {  # a config fla computes, and the op the plan must pick
    "delta rule": (dict(architecture="linear", window=1, chunk_size=1), "gated_delta_rule"),  # α ≡ 1 (below)
    "gated delta rule": (dict(architecture="linear", window=1, chunk_size=1, learning_rule={"name": "online",
                                                                                          "gradient_at": "retained"}),
                         "gated_delta_rule"),
    "kda": (dict(architecture="linear", window=1, chunk_size=1, alpha="learned", learning_rule="kda"), "kda"),
    "simple gla, chunk 4": (dict(architecture="linear", attentional_bias="dot", window=1, chunk_size=4),
                            "simple_gla"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_fla_path_is_the_reference_rule(case, monkeypatch):
    """The fla path's mapping (state layout, log gates, β = η γ, the values of simple GLA, scale 1, a call that ends
    inside a chunk) against the reference in float64: values, final state and every gradient, at 1e-12. fla's chunk
    kernels need a GPU; here its naive recurrences, evaluated in float64, compute the ops (make gpu-check runs the
    kernels themselves)."""
    import importlib

    options, op = CASES[case]
    monkeypatch.setattr(planning, "FLA_DTYPES", (torch.float64,))
    monkeypatch.setattr(planning, "FLA_DEVICES", ("cpu",))
    monkeypatch.setattr(fla, "fla_function", lambda name: getattr(importlib.import_module(NAIVE[name][0]),
                                                                 NAIVE[name][1]))
    config = MemoryConfig(**options)
    problem = make_problem(T=11, d_k=4, d_v=3)
    if case == "delta rule":  # gradients at W_{t−1} are fla's only without a retention
        problem["alpha"] = 1.0
    if config.rule().per_channel:
        problem["alpha"] = problem["alpha"].detach()[..., None].expand(-1, -1, -1, 4).clone().requires_grad_(True)
    given = {"alpha": problem["alpha"]}
    assert plan(config, Shapes(2, 11, 2, 4, 3), torch.float64, "cpu", "fla", planning.acting(
        config.rule().gates(config, config.components()[3]), given)).op == op
    with fla_float64():
        fast = run(problem, "fla", config=config)
    compare(fast, run(problem, "reference", config=config), 1e-12, case)


def test_a_call_ending_inside_a_chunk_continues_on_any_path(monkeypatch):
    """simple GLA at chunk 4, split 0..6 | 6..11 on the fla path and continued on the chunked one: the carried
    evaluation point is the chunk's start, and the result is the one call's."""
    import importlib

    monkeypatch.setattr(planning, "FLA_DTYPES", (torch.float64,))
    monkeypatch.setattr(planning, "FLA_DEVICES", ("cpu",))
    monkeypatch.setattr(fla, "fla_function", lambda name: getattr(importlib.import_module(NAIVE[name][0]),
                                                                 NAIVE[name][1]))
    config = MemoryConfig(architecture="linear", attentional_bias="dot", window=1, chunk_size=4)
    p = {n: (x.detach() if isinstance(x, torch.Tensor) else {k: w.detach() for k, w in x.items()})
         for n, x in make_problem(T=11, d_k=4, d_v=3).items()}
    gates = {g: p[g] for g in ("alpha", "eta", "gamma")}
    whole, _ = memorize(p["q"], p["k"], p["v"], config, gates=gates, initial_state=p["initial_state"])
    with fla_float64():
        head, state = memorize(p["q"][:, :6], p["k"][:, :6], p["v"][:, :6], config, impl="fla",
                               gates={g: x[:, :6] for g, x in gates.items()}, initial_state=p["initial_state"])
    assert state.offset == 2 and state.eval_weights is not None
    tail, _ = memorize(p["q"][:, 6:], p["k"][:, 6:], p["v"][:, 6:], config, impl="chunked",
                       gates={g: x[:, 6:] for g, x in gates.items()}, initial_state=state)
    torch.testing.assert_close(torch.cat([head, tail], 1), whole, rtol=1e-12, atol=1e-12)


def argmin(how) -> str:
    """The covering path of the lowest prediction in a plan's predictions."""
    return min(how.predictions, key=lambda p: p[1])[0]


@pytest.mark.parametrize("preset", ["deltanet", "gated_deltanet", "gla", "swla"])
def test_on_cuda_the_plan_takes_the_lowest_prediction_and_states_them(preset):
    """At the study's shapes (two or three paths cover each) and at a 125M-class T (swla's φ then has 2,145 features:
    the chunked path alone), every covering path has a prediction, the plan takes the lowest and its reason gives
    each (predict.py)."""
    config = resolve_preset(preset)[1]
    for shapes in (SHAPES, Shapes(8, 4096, 12, 64, 64)):
        for dtype in (torch.float32, torch.bfloat16):
            how = plan(config, shapes, dtype, "cuda")
            assert len(how.predictions) >= (2 if shapes == SHAPES else 1), how
            assert all(t is not None for _, t in how.predictions), how
            assert how.path == argmin(how), how
            for path, seconds in how.predictions:
                assert f"{planning.label(path, how.form)}: predicted {predict.ms(seconds)}" in how.reason, how.reason


def test_the_choice_flips_where_the_prediction_flips(monkeypatch):
    """gated_deltanet in float32 on CUDA: the chunk kernels walk T chunks (2 walks), the chunked path's WY blocks walk
    none but launch ~130 kernels a block. With a walked chunk made to cost 1 ms, the kernels' prediction rises past
    the blocks' after a few tokens: the plan takes the kernels below that length and the blocks above it, at every
    length the path of the lowest prediction."""
    monkeypatch.setattr(predict, "C_WALK", 1e-3)
    config = resolve_preset("gated_deltanet")[1]
    paths = {}
    for T in range(1, 130):
        how = plan(config, Shapes(64, T, 8, 16, 16), torch.float32, "cuda")
        assert how.path == argmin(how), (T, how)
        paths[T] = how.path
    assert paths[1] == "triton" and paths[129] == "chunked" and set(paths.values()) == {"triton", "chunked"}
    flips = [T for T in range(2, 130) if paths[T] != paths[T - 1]]
    assert flips, paths  # the lengths where the lowest prediction changes


def test_fla_is_taken_by_its_prediction_not_by_rank(monkeypatch):
    """deltanet in bfloat16: fla's kernels (fewer launches, a walk of T/64 chunks) are predicted faster than the
    chunk kernels, so the plan takes fla; at a FLOP rate made 1 GFLOP/s fla's three products a forward product (2.7×
    the chunk kernels' dots) cost more, and the plan takes the chunk kernels."""
    pytest.importorskip("fla")
    config = resolve_preset("deltanet")[1]
    assert plan(config, SHAPES, torch.bfloat16, "cuda").path == "fla"
    monkeypatch.setattr(predict, "R", 1e9)
    how = plan(config, SHAPES, torch.bfloat16, "cuda")
    assert how.path == "triton" and how.op is None and argmin(how) == "triton", how


def test_an_empty_call_is_predicted_to_cost_nothing():
    """T = 0 (an empty piece of a stream): nothing runs, every covering path is predicted 0 and the first is taken."""
    how = plan(resolve_preset("gated_deltanet")[1], Shapes(2, 0, 4, 16, 16), torch.float32, "cuda")
    assert how.predictions == (("triton", 0.0), ("chunked", 0.0)) and how.path == "triton", how
