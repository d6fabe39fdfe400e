"""Bad input gets a clear error naming the function, the argument, what was expected and what was given; non-finite
input propagates forward in time only (docs/memory.md, "Bad input and non-finite values")."""
import dataclasses
import itertools

import pytest
import torch

import numpy as np

from atlas_lab.layers import MemoryMixer
from atlas_lab.layers.memory_mixer import MemoryConfig
from atlas_lab.memory import memorize
from atlas_lab.models import LanguageModel
from helpers import make_problem

# The Python API

B, T, H, D = 2, 5, 2, 4


def qkv(**changes):
    """q, k, v [2, 5, 2, 4] in float64, with any of them replaced."""
    g = torch.Generator().manual_seed(0)
    x = {n: torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for n in "qkv"}
    return {**x, **changes}


def state_of(**options):
    """The MemoryState after reading qkv() with these options."""
    x = qkv()
    return memorize(x["q"], x["k"], x["v"], **options)[1]


def call_memorize(inputs=None, **options):
    x = qkv(**(inputs or {}))
    return lambda: memorize(x["q"], x["k"], x["v"], **options)


MEMORIZE_CASES = {  # id: (call, exception, words the message must contain)
    "q-numpy": (call_memorize({"q": np.zeros((B, T, H, D))}), TypeError, ["memorize", "q", "torch.Tensor", "ndarray"]),
    "k-integer": (call_memorize({"k": torch.randint(0, 3, (B, T, H, D))}), TypeError,
                  ["memorize", "k", "floating-point", "int64"]),
    "v-dtype": (call_memorize({"v": torch.zeros(B, T, H, D, dtype=torch.float32)}), TypeError,
                ["memorize", "one dtype and device", "v torch.float32", "q torch.float64"]),
    "q-3d": (call_memorize({"q": torch.zeros(B, T, D, dtype=torch.float64)}), ValueError,
             ["memorize", "q, k [B, T, H, d_k]", "q (2, 5, 4)"]),
    "window-bool": (call_memorize(window=True), ValueError, ["memorize", "window", "int >= 1 or None", "True"]),
    "window-float": (call_memorize(window=2.0), ValueError, ["memorize", "window", "int >= 1", "2.0"]),
    "window-zero": (call_memorize(window=0), ValueError, ["memorize", "window", "int >= 1", "got 0"]),
    "chunk_size-bool": (call_memorize(chunk_size=True), ValueError, ["memorize", "chunk_size", "int >= 1", "True"]),
    "ns_steps-negative": (call_memorize(optimizer="muon", ns_steps=-1), ValueError,
                          ["memorize", "ns_steps", "int >= 0", "-1"]),
    "ns_steps-float": (call_memorize(optimizer="muon", ns_steps=2.5), ValueError, ["memorize", "ns_steps", "2.5"]),
    "degree-zero": (call_memorize(feature_map="polynomial", degree=0), ValueError,
                    ["memorize", "degree", "int >= 1", "polynomial", "got 0"]),
    "alpha-negative": (call_memorize(alpha=-0.5), ValueError, ["memorize", "alpha", ">= 0", "-0.5"]),
    "theta-negative": (call_memorize(optimizer="momentum", theta=-0.1), ValueError,
                       ["memorize", "theta", ">= 0", "-0.1"]),
    "eta-shape": (call_memorize(eta=torch.ones(B, T)), ValueError,
                  ["memorize", "gate eta", "[B, T, H] = [2, 5, 2]", "(2, 5)"]),
    "gamma-list": (call_memorize(gamma=[1.0] * T), ValueError, ["memorize", "gate gamma", "a number or None", "list"]),
    "initial_state-heads": (call_memorize(initial_state={"W": torch.zeros(3, D, D, dtype=torch.float64)}),
                            ValueError, ["memorize", "initial_state['W']", "H = 2", "(3, 4, 4)"]),
    "initial_state-batch": (call_memorize(initial_state={"W": torch.zeros(5, H, D, D, dtype=torch.float64)}),
                            ValueError, ["memorize", "initial_state['W']", "B = 2", "(5, 2, 4, 4)"]),
    "initial_state-numpy": (call_memorize(initial_state={"W": np.zeros((D, D))}), TypeError,
                            ["memorize", "initial_state['W']", "torch.Tensor", "ndarray"]),
    "initial_state-type": (call_memorize(initial_state=[torch.zeros(D, D)]), ValueError,
                           ["memorize", "initial_state", "a dict of weights or a MemoryState", "list"]),
    "MemoryState-heads": (call_memorize({n: torch.zeros(B, T, 3, D, dtype=torch.float64) for n in "qkv"},
                                        initial_state=state_of()), ValueError,
                          ["memorize", "initial_state.weights['W']", "H = 3", "(2, 2, 4, 4)"]),
    "MemoryState-batch": (call_memorize({n: torch.zeros(1, T, H, D, dtype=torch.float64) for n in "qkv"},
                                        initial_state=state_of(window=3)), ValueError,
                          ["memorize", "initial_state.weights['W']", "B = 1", "(2, 2, 4, 4)"]),
    "MemoryState-window-cache": (call_memorize({"v": torch.zeros(B, T, H, 3, dtype=torch.float64)},
                                               initial_state=state_of(window=3)), ValueError,
                                 ["memorize", "initial_state.weights['W']", "(2, 2, 4, 4)"]),
    "MemoryState-keys": (call_memorize(initial_state=dataclasses.replace(state_of(window=3),
                                                                        keys=state_of(window=3).keys[:, :1])),
                         ValueError, ["memorize", "initial_state.keys", "[2, 2, 2, 4]", "[2, 1, 2, 4]"]),
    "MemoryState-memory": (call_memorize(memory="mlp", initial_state=state_of()), ValueError,
                           ["memorize", "initial_state.weights", "the memory expects ['W1', 'W2']"]),
}


def call_mixer(x, cache=None):
    mixer = MemoryMixer(8, 2, MemoryConfig(memory="linear", chunk_size=4))
    return lambda: mixer(x, cache)


def call_model(input_ids, cache=None):
    model = LanguageModel(vocab_size=11, preset="deltanet", d_model=8, n_layers=2, n_heads=2)
    return lambda: model(input_ids, cache)


LAYER_CASES = {
    "mixer-2d": (call_mixer(torch.zeros(2, 8)), ValueError,
                 ["MemoryMixer", "x", "[B, T, d_model] = [B, T, 8]", "[2, 8]"]),
    "mixer-width": (call_mixer(torch.zeros(2, 3, 5)), ValueError, ["MemoryMixer", "x", "[B, T, 8]", "[2, 3, 5]"]),
    "mixer-integer": (call_mixer(torch.zeros(2, 3, 8, dtype=torch.long)), ValueError,
                      ["MemoryMixer", "x", "floating-point", "torch.int64"]),
    "mixer-numpy": (call_mixer(np.zeros((2, 3, 8))), ValueError, ["MemoryMixer", "x", "tensor", "ndarray"]),
    "mixer-cache-batch": (call_mixer(torch.zeros(3, 4, 8), MemoryMixer(8, 2, MemoryConfig(memory="linear"))(
        torch.zeros(2, 4, 8))[1]), ValueError, ["MemoryMixer", "cache", "batch of 2", "with 3"]),
    "model-float-ids": (call_model(torch.zeros(2, 3)), TypeError,
                        ["LanguageModel", "input_ids", "integer torch.Tensor", "torch.float32"]),
    "model-numpy-ids": (call_model(np.zeros((2, 3), dtype=np.int64)), TypeError,
                        ["LanguageModel", "input_ids", "integer torch.Tensor", "ndarray"]),
    "model-1d-ids": (call_model(torch.zeros(3, dtype=torch.long)), ValueError,
                     ["LanguageModel", "input_ids", "[B, T] with T >= 1", "[3]"]),
    "model-empty": (call_model(torch.zeros(2, 0, dtype=torch.long)), ValueError,
                    ["LanguageModel", "input_ids", "T >= 1", "[2, 0]"]),
    "model-id-range": (call_model(torch.tensor([[1, 11]])), ValueError,
                       ["LanguageModel", "input_ids", "[0, vocab_size) = [0, 11)", "from 1 to 11"]),
    "model-negative-id": (call_model(torch.tensor([[-1, 2]])), ValueError,
                          ["LanguageModel", "input_ids", "[0, 11)", "from -1 to 2"]),
    "model-cache-length": (call_model(torch.tensor([[1, 2]]), [None] * 3), ValueError,
                           ["LanguageModel", "cache", "one entry per layer (2)", "got 3"]),
}


@pytest.mark.parametrize("case", [*MEMORIZE_CASES, *LAYER_CASES])
def test_bad_input_is_refused_with_a_clear_message(case):
    call, error, words = {**MEMORIZE_CASES, **LAYER_CASES}[case]
    with pytest.raises(error) as raised:
        call()
    missing = [w for w in words if w not in str(raised.value)]
    assert not missing, f"{raised.value!r} does not say {missing}"


@pytest.mark.parametrize("options", [dict(), dict(memory="mlp", optimizer="momentum", window=3, chunk_size=4),
                                     dict(memory="gated_mlp", optimizer="muon", window=None, chunk_size=3)])
def test_an_empty_piece_returns_no_outputs_and_the_state_unchanged(options):
    x = qkv()
    o, state = memorize(x["q"][:, :3], x["k"][:, :3], x["v"][:, :3], **options)
    o_empty, state_empty = memorize(x["q"][:, :0], x["k"][:, :0], x["v"][:, :0], initial_state=state, **options)
    assert o_empty.shape == (B, 0, H, D)
    o_rest, _ = memorize(x["q"][:, 3:], x["k"][:, 3:], x["v"][:, 3:], initial_state=state_empty, **options)
    o_all, _ = memorize(x["q"], x["k"], x["v"], **options)
    torch.testing.assert_close(torch.cat([o, o_empty, o_rest], 1), o_all)
    assert state_empty.offset == state.offset and state_empty.keys.shape == state.keys.shape


def test_an_empty_piece_through_the_memory_mixer_keeps_its_cache():
    mixer = MemoryMixer(8, 2, MemoryConfig(memory="mlp", window=2, chunk_size=4))
    x = torch.randn(2, 6, 8)
    y_all, _ = mixer(x)
    y1, cache = mixer(x[:, :3])
    y0, cache = mixer(x[:, :0], cache)
    y2, _ = mixer(x[:, 3:], cache)
    assert y0.shape == (2, 0, 8)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y_all)

NAN_T = 3  # a NaN key at t = 3 of a T = 7 sequence


def nan_key_run(impl, poison, **options):
    """(outputs, gradients of y[:, :3] w.r.t. q, k, v at t < 3) of one problem, with k[:, 3] = NaN if ``poison``."""
    p = make_problem(T=7, memory=options["memory"])
    k = p["k"].detach().clone()
    if poison:
        k[:, NAN_T] = float("nan")
    k.requires_grad_(True)
    o, _ = memorize(p["q"], k, p["v"], alpha=p["alpha"], eta=p["eta"], theta=p["theta"], gamma=p["gamma"],
                    initial_state=p["initial_state"], impl=impl, **options)
    grads = torch.autograd.grad(o[:, :NAN_T].sum(), (p["q"], k, p["v"]))
    return o, [g[:, :NAN_T] for g in grads]


@pytest.mark.parametrize("memory,optimizer,impl,window,chunk_size", [
    *itertools.product(["linear", "mlp", "gated_mlp"], ["gd", "momentum", "muon"], ["chunked", "reference"],
                       [1, 3, None], [4]),
    ("linear", "gd", "chunked", 1, 1),  # the exact delta rule (WY form)
])
def test_a_nan_key_never_reaches_earlier_outputs(memory, optimizer, impl, window, chunk_size):
    options = dict(memory=memory, optimizer=optimizer, window=window, chunk_size=chunk_size)
    (o, _), (o_nan, _) = nan_key_run(impl, False, **options), nan_key_run(impl, True, **options)
    assert torch.isfinite(o_nan[:, :NAN_T]).all(), "a NaN key at t = 3 reached outputs at t < 3"
    torch.testing.assert_close(o_nan[:, :NAN_T], o[:, :NAN_T], rtol=1e-12, atol=1e-12)
    assert not torch.isfinite(o_nan[:, NAN_T:]).any(), "the NaN key did not reach every later output"


@pytest.mark.parametrize("poisoned", ["q", "v", "alpha", "eta", "theta", "gamma"])
@pytest.mark.parametrize("memory,optimizer,window", [("linear", "momentum", 3), ("mlp", "muon", None),
                                                     ("gated_mlp", "gd", 1)])
def test_a_nan_in_any_other_input_never_reaches_earlier_outputs(poisoned, memory, optimizer, window):
    if poisoned == "theta" and optimizer == "gd":
        pytest.skip("gd has no momentum: theta is not used")
    outputs = []
    for poison in (False, True):
        p = {n: x.detach().clone() if isinstance(x, torch.Tensor) else x
             for n, x in make_problem(memory=memory).items()}
        if poison:
            p[poisoned][:, NAN_T] = float("nan")
        outputs.append(memorize(p["q"], p["k"], p["v"], alpha=p["alpha"], eta=p["eta"], theta=p["theta"],
                                gamma=p["gamma"], initial_state=p["initial_state"], memory=memory, optimizer=optimizer,
                                window=window, chunk_size=4)[0])
    torch.testing.assert_close(outputs[1][:, :NAN_T], outputs[0][:, :NAN_T], rtol=1e-12, atol=1e-12)
    assert not torch.isfinite(outputs[1][:, NAN_T]).all(), f"a NaN {poisoned} at t = 3 did not reach o_3"


@pytest.mark.parametrize("optimizer,impl,window", list(itertools.product(["gd", "momentum"], ["chunked", "reference"],
                                                                        [1, 3, None])))
def test_a_nan_key_never_reaches_earlier_gradients_of_a_linear_memory(optimizer, impl, window):
    """One chunk (every gradient at W_0) of a linear memory: from token 3 to y[:, :3] only the causal mask leads.

    Deep memories and later chunks are not covered: there the zero gradient of an output after the NaN meets NaN
    activations (0 · NaN), which no mask can stop, and the gradients of earlier inputs become NaN as well."""
    options = dict(memory="linear", optimizer=optimizer, window=window, chunk_size=8)
    (_, grads), (_, grads_nan) = nan_key_run(impl, False, **options), nan_key_run(impl, True, **options)
    for name, g, g_nan in zip("qkv", grads, grads_nan):
        assert torch.isfinite(g_nan).all(), f"the NaN key made the gradient of {name} at t < 3 non-finite"
        torch.testing.assert_close(g_nan, g, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("optimizer,window", list(itertools.product(["gd", "momentum"], [1, 3, None])))
def test_a_nan_key_never_reaches_earlier_outputs_of_the_triton_kernel(optimizer, window):
    pytest.importorskip("triton")
    from atlas_lab.kernels import INTERPRETED
    if not (INTERPRETED or torch.cuda.is_available()):
        pytest.skip("no GPU, and triton was imported before TRITON_INTERPRET=1 could be set (see conftest.py)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    outputs = []
    for poison in (False, True):
        p = make_problem(T=7, dtype=torch.float32)
        q, k, v = (p[n].detach().clone().to(device) for n in "qkv")
        if poison:
            k[:, NAN_T] = float("nan")
        gates = {n: p[n].detach().to(device) for n in ("alpha", "eta", "theta", "gamma")}
        o, _ = memorize(q, k, v, optimizer=optimizer, window=window, chunk_size=4, impl="triton", **gates,
                        initial_state={n: w.detach().to(device) for n, w in p["initial_state"].items()})
        outputs.append(o)
    assert torch.isfinite(outputs[1][:, :NAN_T]).all(), "a NaN key at t = 3 reached outputs at t < 3"
    torch.testing.assert_close(outputs[1][:, :NAN_T], outputs[0][:, :NAN_T], rtol=0, atol=0)
    assert not torch.isfinite(outputs[1][:, NAN_T:]).any(), "the NaN key did not reach every later output"
