"""Every bad input handled, in one place: the Python API raises an error naming the function, the argument, what
was expected and what was given (non-finite input propagates forward in time only: docs/memory.md, "Bad input and
non-finite values"); the atlas-lab command prints one line naming the file or key, exits 2 and writes nothing."""
import dataclasses
import functools
import itertools
import json
import os
import subprocess
import sys
import types
import typing
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from atlas_lab.layers import MemoryMixer
from atlas_lab.memory import MemoryConfig, Online, memorize
from atlas_lab.models import LanguageModel
from atlas_lab.cli import main
from helpers import make_problem
from atlas_lab.sweep.study import open_storage
from sweep_helpers import runs_of, write_sweep

# The Python API

B, T, H, D = 2, 5, 2, 4


class ValueNormDelta(Online):
    """A user's learning rule with an option of its own, p (η scaled by ‖v‖^p): the option is checked against its
    annotation wherever the rule is named (``USER_RULE``)."""

    def __init__(self, p: float = 1.0):
        super().__init__()
        self.p = p


USER_RULE = f"{__name__}.ValueNormDelta"


def qkv(**changes):
    """q, k, v [2, 5, 2, 4] in float64, with any of them replaced."""
    g = torch.Generator().manual_seed(0)
    x = {n: torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for n in "qkv"}
    return {**x, **changes}


def state_of(**options):
    """The MemoryState after reading qkv() with these options (a linear memory unless they say otherwise)."""
    x = qkv()
    return memorize(x["q"], x["k"], x["v"], **{"architecture": "linear", **options})[1]


def call_memorize(inputs=None, **options):
    x = qkv(**(inputs or {}))
    return lambda: memorize(x["q"], x["k"], x["v"], **{"architecture": "linear", **options})


MEMORIZE_CASES = {  # id: (call, exception, words the message must contain)
    "q-numpy": (call_memorize({"q": np.zeros((B, T, H, D))}), TypeError, ["memorize", "q", "torch.Tensor", "ndarray"]),
    "k-integer": (call_memorize({"k": torch.randint(0, 3, (B, T, H, D))}), TypeError,
                  ["memorize", "k", "floating-point", "int64"]),
    "v-dtype": (call_memorize({"v": torch.zeros(B, T, H, D, dtype=torch.float32)}), TypeError,
                ["memorize", "one dtype and device", "v torch.float32", "q torch.float64"]),
    "q-3d": (call_memorize({"q": torch.zeros(B, T, D, dtype=torch.float64)}), ValueError,
             ["memorize", "expected q [B, T, H, d_k], k [B, T, H, d_k]", "got q (2, 5, 4)"]),
    "window-bool": (call_memorize(window=True), ValueError, ["memorize.window", "int >= 1 or null", "True"]),
    "window-float": (call_memorize(window=2.0), ValueError, ["memorize", "window", "int >= 1", "2.0"]),
    "window-zero": (call_memorize(window=0), ValueError, ["memorize", "window", "int >= 1", "got 0"]),
    "chunk_size-bool": (call_memorize(chunk_size=True), ValueError, ["memorize", "chunk_size", "int >= 1", "True"]),
    "ns_steps-negative": (call_memorize(optimizer={"name": "muon", "ns_steps": -1}), ValueError,
                          ["memorize.optimizer", "ns_steps", "int >= 1", "-1"]),
    "ns_steps-float": (call_memorize(optimizer={"name": "muon", "ns_steps": 2.5}), ValueError,
                       ["memorize.optimizer", "ns_steps", "2.5"]),
    "ns_steps-of-gd": (call_memorize(optimizer={"name": "gd", "ns_steps": 3}), ValueError,
                       ["memorize.optimizer.ns_steps", "gd does not take 'ns_steps'", "takes no options"]),
    "ns_steps-flat": (call_memorize(optimizer="muon", ns_steps=3), ValueError,
                      ["memorize.ns_steps", "an option of the optimizer now", "write optimizer.ns_steps: 3"]),
    "degree-zero": (call_memorize(feature_map={"name": "polynomial", "degree": 0}), ValueError,
                    ["memorize.feature_map", "degree", "int >= 1", "polynomial", "got 0"]),
    # an option of each kind of component, and of a user's class, by its constructor's annotation
    "depth-type": (call_memorize(architecture={"name": "mlp", "depth": "deep"}), ValueError,
                   ["memorize.architecture.depth: expected int; got deep"]),
    "degree-type": (call_memorize(feature_map={"name": "polynomial", "degree": 2.5}), ValueError,
                    ["memorize.feature_map.degree: expected int; got 2.5"]),
    "delta-type": (call_memorize(attentional_bias={"name": "huber", "delta": "wide"}), ValueError,
                   ["memorize.attentional_bias.delta: expected float; got wide"]),
    "beta1-type": (call_memorize(optimizer={"name": "adam", "beta1": [0.9]}), ValueError,
                   ["memorize.optimizer.beta1: expected float; got [0.9]"]),
    "per_matrix-type": (call_memorize(learning_rule={"name": "chunk_commit", "per_matrix": "yes"}), ValueError,
                        ["memorize.learning_rule.per_matrix: expected true or false; got yes"]),
    "user-option-type": (call_memorize(learning_rule={"class_path": USER_RULE, "init_args": {"p": "abc"}}),
                         ValueError, ["memorize.learning_rule.init_args.p: expected float; got abc"]),
    "alpha-negative": (call_memorize(alpha=-0.5), ValueError, ["memorize.alpha", "a constant in [0, 1]", "-0.5"]),
    "theta-negative": (call_memorize(optimizer="momentum", theta=-0.1), ValueError,
                       ["memorize.theta", "a constant in [0, 1)", "-0.1"]),
    "alpha-negative-gate": (call_memorize(gates={"alpha": -0.5}), ValueError, ["memorize", "alpha", ">= 0", "-0.5"]),
    "eta-tensor-keyword": (call_memorize(eta=torch.ones(B, T, H)), ValueError,
                           ["memorize: eta is a tensor", "gates={'eta': ...}"]),
    "eta-shape": (call_memorize(gates={"eta": torch.ones(B, T)}), ValueError,
                  ["memorize", "gate eta", "[B, T, H] = [2, 5, 2]", "(2, 5)"]),
    "gamma-list": (call_memorize(gates={"gamma": [1.0] * T}), ValueError,
                   ["memorize", "gate gamma", "a number or None", "list"]),
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
    "MemoryState-memory": (call_memorize(architecture="mlp", initial_state=state_of()), ValueError,
                           ["memorize", "initial_state.weights", "the memory expects ['W1', 'W2']"]),
}


def call_mixer(x, cache=None):
    mixer = MemoryMixer(8, 2, MemoryConfig(architecture="linear", chunk_size=4))
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
    "mixer-cache-batch": (call_mixer(torch.zeros(3, 4, 8), MemoryMixer(8, 2, MemoryConfig(architecture="linear"))(
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


@pytest.mark.parametrize("options", [dict(architecture="linear"),
                                     dict(architecture="mlp", optimizer="momentum", theta=0.5, window=3, chunk_size=4),
                                     dict(architecture="gated_mlp", optimizer="muon", theta=0.5, window=None,
                                          chunk_size=3)])
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
    mixer = MemoryMixer(8, 2, MemoryConfig(architecture="mlp", window=2, chunk_size=4))
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
    p = make_problem(T=7, architecture=options["architecture"])
    k = p["k"].detach().clone()
    if poison:
        k[:, NAN_T] = float("nan")
    k.requires_grad_(True)
    o, _ = memorize(p["q"], k, p["v"],
                    initial_state=p["initial_state"], impl=impl, **options,
                    gates={"alpha": p["alpha"], "eta": p["eta"], "theta": p["theta"], "gamma": p["gamma"]})
    grads = torch.autograd.grad(o[:, :NAN_T].sum(), (p["q"], k, p["v"]))
    return o, [g[:, :NAN_T] for g in grads]


@pytest.mark.parametrize("memory,optimizer,impl,window,chunk_size", [
    *itertools.product(["linear", "mlp", "gated_mlp"], ["gd", "momentum", "muon"], ["chunked", "reference"],
                       [1, 3, None], [4]),
    ("linear", "gd", "chunked", 1, 1),  # the exact delta rule (WY form)
])
def test_a_nan_key_never_reaches_earlier_outputs(memory, optimizer, impl, window, chunk_size):
    options = dict(architecture=memory, optimizer=optimizer, window=window, chunk_size=chunk_size)
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
             for n, x in make_problem(architecture=memory).items()}
        if poison:
            p[poisoned][:, NAN_T] = float("nan")
        outputs.append(memorize(p["q"], p["k"], p["v"],
                                initial_state=p["initial_state"], architecture=memory,
                                optimizer=optimizer, window=window, chunk_size=4,
                                gates={g: p[g] for g in ("alpha", "eta", "theta", "gamma")})[0])
    torch.testing.assert_close(outputs[1][:, :NAN_T], outputs[0][:, :NAN_T], rtol=1e-12, atol=1e-12)
    assert not torch.isfinite(outputs[1][:, NAN_T]).all(), f"a NaN {poisoned} at t = 3 did not reach o_3"


@pytest.mark.parametrize("optimizer,impl,window", list(itertools.product(["gd", "momentum"], ["chunked", "reference"],
                                                                        [1, 3, None])))
def test_a_nan_key_never_reaches_earlier_gradients_of_a_linear_memory(optimizer, impl, window):
    """One chunk (every gradient at W_0) of a linear memory: from token 3 to y[:, :3] only the causal mask leads.

    Deep memories and later chunks are not covered: there the zero gradient of an output after the NaN meets NaN
    activations (0 · NaN), which no mask can stop, and the gradients of earlier inputs become NaN as well."""
    options = dict(architecture="linear", optimizer=optimizer, window=window, chunk_size=8)
    (_, grads), (_, grads_nan) = nan_key_run(impl, False, **options), nan_key_run(impl, True, **options)
    for name, g, g_nan in zip("qkv", grads, grads_nan):
        assert torch.isfinite(g_nan).all(), f"the NaN key made the gradient of {name} at t < 3 non-finite"
        torch.testing.assert_close(g_nan, g, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("memory,optimizer,window", [
    *itertools.product(["linear"], ["gd", "momentum"], [1, 3, None]),
    *itertools.product(["mlp"], ["gd", "momentum"], [1, 3])])
def test_a_nan_key_never_reaches_earlier_outputs_of_the_triton_kernel(memory, optimizer, window):
    pytest.importorskip("triton")
    from atlas_lab.memory.dispatch import INTERPRETED
    if not (INTERPRETED or torch.cuda.is_available()):
        pytest.skip("no GPU, and triton was imported before TRITON_INTERPRET=1 could be set (see conftest.py)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    outputs = []
    for poison in (False, True):
        p = make_problem(T=7, dtype=torch.float32, architecture=memory)
        q, k, v = (p[n].detach().clone().to(device) for n in "qkv")
        if poison:
            k[:, NAN_T] = float("nan")
        gates = {n: p[n].detach().to(device) for n in ("alpha", "eta", "theta", "gamma")}
        o, _ = memorize(q, k, v, architecture=memory, optimizer=optimizer, window=window, chunk_size=4,
                        impl="triton", gates=gates,
                        initial_state={n: w.detach().to(device) for n, w in p["initial_state"].items()})
        outputs.append(o)
    assert torch.isfinite(outputs[1][:, :NAN_T]).all(), "a NaN key at t = 3 reached outputs at t < 3"
    torch.testing.assert_close(outputs[1][:, :NAN_T], outputs[0][:, :NAN_T], rtol=0, atol=0)
    assert not torch.isfinite(outputs[1][:, NAN_T:]).any(), "the NaN key did not reach every later output"


# The atlas-lab command: fit, validate, test

ROOT = Path(__file__).resolve().parents[1]  # the checkout
TINY_RUN = ["-c", "lightning_config.yaml", "-c", "experiments/mqar.yaml", "--model.preset=gla", "--model.d_model=16",
            "--model.n_layers=1", "--model.n_heads=2", "--trainer.max_steps=1", "--trainer.limit_val_batches=1"]
LM_RUN = ["-c", "lightning_config.yaml", "-c", "experiments/lm.yaml", "--model.preset=gla", "--model.d_model=16",
          "--model.n_layers=1", "--model.n_heads=2", "--model.memory_heads=2", "--trainer.max_steps=1"]
BAD_RUNS = {  # name: (arguments after the subcommand, what the one line must say)
    # the parser: the key, the valid choices or the expected type, the value given
    "unknown key": (["fit", *TINY_RUN, "--model.colour=red"], "unrecognized arguments: --model.colour=red"),
    "unknown preset": (["fit", *TINY_RUN, "--model.preset=atlass"], "model.preset: expected 'transformer', 'swa'"),
    "not an int": (["fit", *TINY_RUN, "--trainer.max_epochs=three"],
                   "trainer.max_epochs: expected int or null; got three"),
    "window type": (["fit", *TINY_RUN, "--model.memory.window=wide"],
                    "model.memory.window: expected an int >= 1 or null (global), got 'wide'"),
    "window type in a file": (["fit", *TINY_RUN, "-c", "memory.yaml"],
                              "model.memory.window: expected an int >= 1 or null (global), got 'wide'"),
    "memory key": (["fit", *TINY_RUN, "--model.memory.windw=3"],
                   "model.memory.windw: unknown key; valid keys: architecture, feature_map, attentional_bias"),
    "memory key in a file": (["fit", *TINY_RUN, "-c", "windw.yaml"], "model.memory.windw: unknown key; valid keys: "
                             "architecture, feature_map, attentional_bias, optimizer, learning_rule, window"),
    "memory choice": (["fit", *TINY_RUN, "--model.memory.read=tok"],
                      "model.memory.read: unknown value 'tok'; valid choices: token, start, chunk"),
    "yaml syntax": (["fit", "-c", "broken.yaml"], "broken.yaml: not valid YAML at line 2, column 1"),
    "missing config": (["fit", "-c", "experiments/nothere.yaml"], "experiments/nothere.yaml: config file not found"),
    # the model: every value out of its range, before any training step
    "lr < 0": (["fit", *TINY_RUN, "--model.lr=-1"], "model.lr: expected a number > 0, got -1.0"),
    "memory_lr < 0": (["fit", *TINY_RUN, "--model.memory_lr=-1"], "model.memory_lr: expected null or a number >= 0"),
    "warmup < 0": (["fit", *TINY_RUN, "--model.warmup_steps=-5"], "model.warmup_steps: expected an int >= 0, got -5"),
    "min_lr_ratio > 1": (["fit", *TINY_RUN, "--model.min_lr_ratio=2"],
                         "model.min_lr_ratio: expected a number in [0, 1]"),
    "betas": (["fit", *TINY_RUN, "--model.betas=[1.5, 0.9]"], "model.betas: expected two numbers in [0, 1)"),
    "eta < 0": (["fit", *TINY_RUN, "--model.memory.eta=-0.5"],
                "model.memory.eta: expected 'learned' or a constant >= 0"),
    "alpha > 1": (["fit", *TINY_RUN, "--model.memory.alpha=2"],
                  "model.memory.alpha: expected 'learned' or a constant in [0, 1]"),
    "eta_max < 0": (["fit", *TINY_RUN, "--model.memory.eta_max=-1"], "model.memory.eta_max: expected a number > 0"),
    "ns_steps -1": (["fit", *TINY_RUN, "--model.preset=atlas", "--model.memory.optimizer.ns_steps=-1"],
                    "model.memory.optimizer: muon ns_steps must be an int >= 1, got -1"),
    "ns_steps 0": (["fit", *TINY_RUN, "--model.preset=atlas", "--model.memory.optimizer.ns_steps=0"],
                   "model.memory.optimizer: muon ns_steps must be an int >= 1, got 0"),
    "ns_steps of gd": (["fit", *TINY_RUN, "--model.preset=atlas", "--model.memory.optimizer=gd",
                        "--model.memory.optimizer.ns_steps=3"],
                       "model.memory.optimizer.ns_steps: gd does not take 'ns_steps'; it takes no options"),
    "ns_steps flat": (["fit", *TINY_RUN, "--model.preset=atlas", "--model.memory.ns_steps=3"],
                      "model.memory.ns_steps: an option of the optimizer now; write optimizer.ns_steps: 3"),
    "mixer": (["fit", *TINY_RUN, "--model.mixer=atlas"], "model.mixer: renamed; write model.preset: atlas"),
    "mixer in a file": (["fit", *TINY_RUN, "-c", "old.yaml"],
                        "model.mixer: renamed; write model.preset: atlas (in old.yaml)"),
    "degree 0": (["fit", *TINY_RUN, "--model.preset=atlas", "--model.memory.feature_map.degree=0"],
                 "model.memory.feature_map: polynomial degree must be an int >= 1, got 0"),
    "window 0": (["fit", *TINY_RUN, "--model.memory.window=0"], "model.memory.window: expected an int >= 1 or null"),
    "heads": (["fit", *TINY_RUN, "--model.n_heads=5"], "model.n_heads: d_model=16 must be divisible by n_heads=5"),
    "normalize on atlas": (["fit", *TINY_RUN, "--model.preset=atlas", "--model.memory.normalize=true"],
                           "model.memory.normalize: needs architecture linear, attentional_bias dot"),
    "output_norm on linear": (["fit", *TINY_RUN, "--model.memory.architecture.output_norm=true"],
                              "model.memory.architecture.output_norm: linear does not take 'output_norm'"),
    # a component's option by its constructor's annotation: a user's class (rule.yaml: learning_rule: {class_path:
    # ValueNormDelta}) or a shipped one, in a file, as an option flag or in LightningCLI's init_args form
    "user option type in a file": (["fit", *TINY_RUN, "-c", "rule_abc.yaml"],
                                   "model.memory.learning_rule.init_args.p: expected float; got abc"),
    "user option type": (["fit", *TINY_RUN, "-c", "rule.yaml", "--model.memory.learning_rule.init_args.p=abc"],
                         "model.memory.learning_rule.init_args.p: expected float; got abc"),
    "user option type, short": (["fit", *TINY_RUN, "-c", "rule.yaml", "--model.memory.learning_rule.p=abc"],
                                "model.memory.learning_rule.init_args.p: expected float; got abc"),
    "user option name": (["fit", *TINY_RUN, "-c", "rule.yaml", "--model.memory.learning_rule.init_args.q=1"],
                         f"model.memory.learning_rule.init_args.q: {USER_RULE} does not take 'q'; it takes p"),
    "init_args of a short-hand": (["fit", *TINY_RUN, "--model.memory.learning_rule.init_args.p=0.5"],
                                  "model.memory.learning_rule.init_args.p: init_args holds the options of a class "
                                  "given by class_path, and the learning_rule is 'online'"),
    "shipped option type": (["fit", *TINY_RUN, "--model.preset=atlas", "--model.memory.optimizer.ns_steps=abc"],
                            "model.memory.optimizer.ns_steps: expected int; got abc"),
    # the data: checked when it is set up, before the run is created
    "vocabulary": (["fit", *TINY_RUN, "--data.init_args.vocab_size=8"], "data.init_args.vocab_size"),
    "missing corpus": (["fit", *LM_RUN, "--data.init_args.data_path=/no/such/file.txt"],
                       "data.init_args.data_path: expected an existing text file or folder, got '/no/such/file.txt'"),
    "empty corpus": (["fit", *LM_RUN, "--data.init_args.data_path=empty.txt"],
                     "data.init_args.data_path: 'empty.txt' is too short: its train split would be empty"),
    "binary corpus": (["fit", *LM_RUN, "--data.init_args.data_path=binary.bin"],
                      "data.init_args.data_path: 'binary.bin' is not UTF-8 text (byte 0x80 at offset 128)"),
    "short NIAH": (["fit", "-c", "lightning_config.yaml", "-c", "experiments/niah.yaml",
                    "--data.init_args.lengths=[16]", "--data.init_args.train_lengths=[16]"],
                   "data.init_args.lengths: 16 tokens cannot hold the needle"),
    "validation interval": (["fit", *TINY_RUN, "--trainer.val_check_interval=100000"],
                            "trainer.val_check_interval: 100000 is more than the"),
    # the trainer, and what validate and test score
    "trainer conflict": (["fit", *TINY_RUN, "--trainer.enable_progress_bar=false"],
                         "enable_progress_bar=False` but found `RichProgressBar`"),
    "unknown callback class": (["fit", *TINY_RUN, "--trainer.callbacks+=atlas_lab.lit.module.NoSuchSummary"],
                               "trainer.callbacks: class_path 'atlas_lab.lit.module.NoSuchSummary' cannot be imported "
                               "(module 'atlas_lab.lit.module' has no attribute 'NoSuchSummary')"),
    "unknown data class": (["fit", *TINY_RUN, "--data.class_path=atlas_lab.data.NoSuchData"],
                           "data: class_path 'atlas_lab.data.NoSuchData' cannot be imported"),
    "data value type": (["fit", *TINY_RUN, "--data.init_args.batch_size=abc"],
                        "data.init_args.batch_size: expected int; got abc"),
    "module value type": (["fit", *TINY_RUN, "--model.lr=abc"], "model.lr: expected float; got abc"),
    "module value in a file": (["fit", *TINY_RUN, "-c", "betas.yaml"],
                               "model.betas: expected tuple[float, float]; got [0.9] (in betas.yaml)"),
    "fsdp on the CPU": (["fit", *TINY_RUN, "--trainer.strategy=fsdp", "--trainer.accelerator=cpu"], "FSDP"),
    "accumulate 0": (["fit", *TINY_RUN, "--trainer.accumulate_grad_batches=0"],
                     "trainer.accumulate_grad_batches: expected an int >= 1, got 0"),
    "validation epochs 0": (["fit", *TINY_RUN, "--trainer.check_val_every_n_epoch=0"],
                            "trainer.check_val_every_n_epoch: expected null or an int >= 1, got 0"),
    "seed < 0": (["fit", *TINY_RUN, "--seed_everything=-1"],
                 "seed_everything: expected true, false or an int in [0, 2^32), got -1"),
    "test without checkpoint": (["test", *TINY_RUN], "test: --ckpt_path is required"),
    "validate without checkpoint": (["validate", *TINY_RUN], "validate: --ckpt_path is required"),
    "missing checkpoint": (["test", *TINY_RUN, "--ckpt_path=runs/nothere.ckpt"],
                           "--ckpt_path: no such checkpoint file: runs/nothere.ckpt"),
    "unreadable checkpoint": (["test", *TINY_RUN, "--ckpt_path=x.ckpt"],
                              "--ckpt_path: x.ckpt is not a readable checkpoint (EOFError"),
    "untrained with checkpoint": (["test", *TINY_RUN, "--ckpt_path=x.ckpt", "--untrained=true"],
                                  "--ckpt_path and --untrained=true exclude each other"),
    "untrained fit": (["fit", *TINY_RUN, "--untrained=true"], "--untrained applies to validate and test only"),
}


@pytest.mark.parametrize("case", list(BAD_RUNS))
def test_a_bad_run_is_one_line_exit_2_and_writes_nothing(case, workdir, capsys):
    args, message = BAD_RUNS[case]
    Path("broken.yaml").write_text("model: [1, 2\n")
    Path("old.yaml").write_text("model:\n  mixer: atlas\n")
    Path("memory.yaml").write_text("model:\n  memory:\n    window: wide\n")
    Path("windw.yaml").write_text("model:\n  memory:\n    windw: 3\n")
    Path("betas.yaml").write_text("model:\n  betas: [0.9]\n")
    Path("rule.yaml").write_text(f"model:\n  memory:\n    learning_rule: {{class_path: {USER_RULE}}}\n")
    Path("rule_abc.yaml").write_text(f"model:\n  memory:\n    learning_rule: {{class_path: {USER_RULE}, "
                                     "init_args: {p: abc}}\n")
    Path("empty.txt").write_text("")
    Path("binary.bin").write_bytes(bytes(range(256)) * 40)
    Path("x.ckpt").write_bytes(b"")
    before = sorted(p for p in Path(".").rglob("*"))
    assert main(args) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in err, err
    assert sorted(p for p in Path(".").rglob("*")) == before  # no run, no store, no checkpoint


EARLY_VALUES = {  # a model or trainer value a config file or argument gets wrong, and the line it must give
    "preset": ("--model.preset=atlass", "model.preset: expected 'transformer', 'swa'"),
    "trainer type": ("--trainer.max_epochs=three", "trainer.max_epochs: expected int or null; got three"),
    "trainer flag": ("--trainer.enable_progress_bar=maybe",
                     "trainer.enable_progress_bar: expected true or false or null"),
    "type": ("--model.d_model=abc", "model.d_model: expected int; got abc"),
    "range": ("--model.n_layers=0", "model.n_layers: expected an int >= 1, got 0"),
    "renamed": ("--model.mixer=atlas", "model.mixer: renamed; write model.preset: atlas"),
    "memory key": ("--model.memory={windw: 3}", "model.memory.windw: unknown key; valid keys: architecture"),
    "memory value": ("--model.memory.window=wide", "model.memory.window: expected an int >= 1 or null (global), got "
                                                   "'wide'"),
    "memory choice": ("--model.memory.read=tok", "model.memory.read: unknown value 'tok'; valid choices: token, start"),
    "heads": ("--model.n_heads=5", "model.n_heads: d_model=16 must be divisible by n_heads=5"),
    "component option": ("--model.memory={learning_rule: {class_path: atlas_lab.memory.ChunkCommit, init_args: "
                         "{reset_every: often}}}",
                         "model.memory.learning_rule.init_args.reset_every: expected int or null; got often"),
}


EARLY_RUNNER = """
import contextlib, io, json, sys
from atlas_lab.cli import main
out = {}
for case, arg in json.loads(sys.argv[1]).items():  # one command after another, as separate processes would run them
    before, err = 'lightning' in sys.modules, io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(['fit', *sys.argv[2:], arg])
    out[case] = dict(code=code, stderr=err.getvalue(), lightning=None if before else 'lightning' in sys.modules)
print(json.dumps(out))
"""


@functools.cache
def early_values() -> dict:
    """Each EARLY_VALUES command run by ``main`` in one fresh process, one after another: {case: its exit code,
    stderr and whether it imported lightning (None: an earlier one had)}."""
    cases = json.dumps({case: arg for case, (arg, _) in EARLY_VALUES.items()})
    done = subprocess.run([sys.executable, "-c", EARLY_RUNNER, cases, *TINY_RUN], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", list(EARLY_VALUES))
def test_a_bad_model_or_trainer_value_is_its_line_before_lightning_is_imported(case):
    """The model's and trainer's values are checked before the LightningCLI (~3.5 s of imports) is imported, with the
    parser's own line; the value of the last config file or argument is the one checked (a file's preset is
    overridden by TINY_RUN's). The commands run in one process, one after another (``early_values``): each must
    exit 2 without importing lightning."""
    arg, message = EARLY_VALUES[case]
    done = early_values()[case]
    assert (done["code"], done["lightning"]) == (2, False), done
    errors = [line for line in done["stderr"].splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], done["stderr"]


CHECKED_TYPES = [  # (annotation, value, conforms): a value as YAML loads it (a config file's, or a command line's)
    (int, 3, True), (int, True, False), (int, "abc", False), (int, 2.0, False),
    (float, 1, True), (float, 0.5, True), (float, "1e-3", True), (float, "abc", False), (float, False, False),
    (bool, True, True), (bool, "maybe", False), (str, "x", True), (str, 3, False),
    (typing.Optional[int], None, True), (typing.Optional[int], "three", False),
    (typing.Literal["a", "b"], "a", True), (typing.Literal["a", "b"], "c", False),
    (typing.Literal[16, 32], "16", False),
    (list[int], [1, 2], True), (list[int], [1, "a"], False), (list[int], 1, False),
    (tuple[float, float], [0.9, 0.95], True), (tuple[float, float], [0.9], False), (tuple[int, ...], [1, 2, 3], True),
    (dict[str, int], {"a": 1}, True), (dict[str, int], {"a": "b"}, False), (dict, [], False),
    (typing.Union[list[int], str, int], "auto", True), (typing.Union[list[int], str, int], 1.5, False),
    (Path, "a/b", True),  # a class: the parser's to check
]


@pytest.mark.parametrize("kind, value, expected", CHECKED_TYPES)
def test_a_value_is_checked_against_its_annotation(kind, value, expected):
    from atlas_lab.memory.components import conforms

    assert conforms(value, kind) is expected


@pytest.mark.parametrize("kind, value, taken", [
    (float, "1e-3", 0.001), (typing.Optional[float], "2", 2.0), (typing.Union[float, str], "1e-3", "1e-3"),
    (typing.Any, "1e-3", "1e-3"), (float, 1, 1), (int, 3, 3), (list[float], ["1e-3"], ["1e-3"])])
def test_a_component_takes_a_string_of_a_number_as_the_float_its_annotation_says(kind, value, taken):
    """YAML 1.1 reads 1e-3 as a string, which conforms to float: a component's float option receives 0.001."""
    from atlas_lab.memory.components import as_annotated

    assert as_annotated(value, kind) == taken and type(as_annotated(value, kind)) is type(taken)


def test_an_annotation_is_described_as_a_person_writes_it():
    from atlas_lab.memory.components import describe
    from atlas_lab.models.lm import MemoryChanges

    assert describe(typing.Optional[int]) == "int or null"
    assert describe(typing.Optional[bool]) == "true or false or null"
    assert describe(typing.Literal["a", "b"]) == "'a', 'b'"
    assert describe(typing.Union[int, float, None]) == "int or float or null"
    assert describe(tuple[float, float]) == "tuple[float, float]"
    assert describe(list[typing.Union[str, dict[str, int]]]) == "list[str or dict[str, int]]"
    assert describe(MemoryChanges).startswith("a mapping of architecture, feature_map")


def test_every_annotation_a_run_checks_is_one_the_checker_reads():
    """The model's, the module's, the trainer's, the shipped data modules' and components' argument types are built
    from the builtins, None, Literal, Union, list, tuple, dict and TypedDict (``conforms`` judges them), or are
    classes and paths the CLI's parser checks: none is a typing form the checker would pass unread."""
    import inspect

    import atlas_lab.data as data
    from lightning.pytorch import LightningDataModule

    from atlas_lab.configfiles import TRAINER_VALUES
    from atlas_lab.lit.module import SequenceModel
    from atlas_lab.memory.components import argument_types
    from atlas_lab.models.lm import ModelConfig

    read = (list, tuple, dict, typing.Union, types.UnionType, typing.Literal)

    def unread(kind) -> list:
        origin = typing.get_origin(kind)
        if origin is None:
            return [] if inspect.isclass(kind) or kind is None or kind is typing.Any else [kind]
        if origin not in read:
            return [kind]
        return [] if origin is typing.Literal else [u for a in typing.get_args(kind) if a is not Ellipsis
                                                    for u in unread(a)]

    modules = [c for c in map(functools.partial(getattr, data), data.EXPORTS)
               if inspect.isclass(c) and issubclass(c, LightningDataModule)]
    assert len(modules) >= 7
    from atlas_lab.memory import ATTENTIONAL_BIASES, FEATURE_MAPS, LEARNING_RULES, MEMORIES, OPTIMIZERS

    components = [c for registry in (MEMORIES, FEATURE_MAPS, ATTENTIONAL_BIASES, OPTIMIZERS, LEARNING_RULES)
                  for c in registry.values()]
    kinds = [*typing.get_type_hints(ModelConfig).values(), *argument_types(SequenceModel).values(),
             *TRAINER_VALUES.values(), *(k for m in [*modules, *components] for k in argument_types(m).values())]
    assert [u for k in kinds for u in unread(k)] == []


def test_the_trainer_values_checked_early_are_lightnings_own():
    """configfiles.TRAINER_VALUES is the installed Lightning's Trainer signature: each type as Lightning annotates it,
    and every argument whose type names only builtins is in the table (a Lightning upgrade that changes one fails
    here, not in a user's run)."""
    import inspect
    import typing

    from lightning.pytorch import Trainer

    from atlas_lab.configfiles import TRAINER_VALUES

    def builtin(kind) -> bool:
        args = typing.get_args(kind)
        if typing.get_origin(kind) is typing.Literal:
            return True
        return all(map(builtin, args)) if args else kind in (int, float, bool, str, type(None))

    signature = {n: p.annotation for n, p in inspect.signature(Trainer.__init__).parameters.items() if n != "self"}
    assert {n: k for n, k in signature.items() if builtin(k)} == TRAINER_VALUES


def test_validate_and_test_score_the_last_fit_or_an_explicitly_untrained_model(workdir):
    """`last.ckpt` is the last fit's, whatever ran before (no last-v1.ckpt), each run is named after its config,
    checkpoints follow trainer.default_root_dir, and --untrained=true scores a freshly built model."""
    assert main(["fit", *TINY_RUN]) == 0
    assert main(["fit", *TINY_RUN, "--model.d_model=32"]) == 0  # another size: its checkpoint replaces the first
    names = sorted(p.name for p in Path("runs/checkpoints").iterdir())  # last.ckpt and the step's (validated at end)
    assert "last.ckpt" in names and len(names) == 2 and not any("-v" in name for name in names), names
    assert main(["test", *TINY_RUN, "--model.d_model=32", "--ckpt_path=runs/checkpoints/last.ckpt"]) == 0
    assert main(["test", *TINY_RUN, "--untrained=true"]) == 0
    assert main(["fit", *TINY_RUN, "--trainer.default_root_dir=elsewhere"]) == 0
    assert (Path("elsewhere/checkpoints/last.ckpt")).is_file()
    client = MlflowClient("sqlite:///" + str(Path("runs/mlflow.db").resolve()))
    runs = client.search_runs([client.get_experiment_by_name("atlas-lab").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["fit-mqar-gla"] * 3 + ["test-mqar-gla"] * 2
    assert all(r.info.status == "FINISHED" for r in runs)


# The atlas-lab command: sweep files, checked before anything is created

BAD_SWEEPS = {  # name: (sweep file fields, what the one line must say)
    "unknown grid key": (dict(grid={"model.mixr": ["atlas"]}), "model.mixr"),
    "unknown grid value": (dict(grid={"model.preset": ["atlas", "atlass"]}), "atlass"),
    "value type": (dict(grid={"trainer.max_epochs": ["three"]}), "trainer.max_epochs"),
    "no axis": (dict(grid={}), "grid: sampler grid needs at least one grid axis"),
    "low > high": (dict(sampler="tpe", trials=4, search={"model.lr": {"low": 1.0, "high": 0.1}}),
                   "low (1.0) > high (0.1)"),
    "log from 0": (dict(sampler="tpe", trials=4, search={"model.lr": {"low": 0.0, "high": 0.1, "log": True}}),
                   "a log range needs low > 0"),
    "int on floats": (dict(sampler="tpe", trials=4, search={"model.lr": {"low": 0.001, "high": 0.01, "int": True}}),
                      "search.model.lr: int: true needs integer bounds, got low=0.001, high=0.01"),
    "sampler": (dict(sampler="bayes"), "sampler: unknown value 'bayes'; valid choices: grid, tpe, random"),
    "pruner": (dict(pruner={"type": "asha"}),
               "pruner.type: unknown value 'asha'; valid choices: none, median, hyperband"),
    "missing base": (dict(base=["experiments/missing.yaml"]), "config file 'experiments/missing.yaml' not found"),
    "window type": (dict(grid={"model.memory.window": [1, "wide"]}), "grid.model.memory.window = wide: model.memory"),
    "unknown top key": (dict(colour="blue"), "unknown key(s) ['colour']"),
    # values that parse but cannot build a model: caught for every grid point, never left to a worker
    "window 0": (dict(grid={"model.memory.window": [0, 1]}),
                 "grid.model.memory.window = 0: model.memory.window: expected an int >= 1 or null"),
    "heads": (dict(grid={"model.n_heads": [5]}), "grid.model.n_heads = 5: model.n_heads: d_model=16 must be divisible"),
    "a point": (dict(grid={"model.d_model": [16, 24], "model.n_heads": [2, 16]}),
                "grid point {'model.d_model': 24, 'model.n_heads': 16}: model.n_heads: d_model=24 must be "
                "divisible"),
    "search bound": (dict(sampler="random", trials=2, search={"model.memory.eta_max": {"low": -1.0, "high": 1.0}}),
                     "search.model.memory.eta_max = -1.0: model.memory.eta_max: expected a number > 0"),
    "metric": (dict(grid={"model.lr": [1e-3]}, metric="val/accuracy"),
               "metric: 'val/accuracy' is not logged by the trials"),
    "baseline label": (dict(grid={"model.lr": [1e-3, 2e-3]}, baseline={"model.lr": 5e-3}),
                       "baseline.model.lr: unknown label 0.005; valid choices: 0.001, 0.002"),
    "baseline axes": (dict(grid={"model.lr": [1e-3], "model.preset": ["gla"]}, baseline={"model.lr": 1e-3}),
                      "baseline: expected one label for each grid axis (model.lr, model.preset)"),
    "baseline search": (dict(sampler="tpe", trials=2, search={"model.lr": {"low": 1e-3, "high": 1e-2}},
                             baseline={"model.lr": 1e-3}),
                        "baseline: a baseline is a grid point; sampler tpe has none"),
    "summary": (dict(summary="median"), "summary: unknown value 'median'; valid choices: final, best, mean"),
    "steps_to value": (dict(summary={"steps_to": "high"}), "summary: expected one of final, best, mean or"),
    "steps_to pruned": (dict(summary={"steps_to": 0.9}, pruner={"type": "median"}),
                        "pruner: a steps_to study is not pruned"),
    "tune a grid axis": (dict(tune={"grid": {"model.lr": [1e-3, 3e-3]}}),
                         "tune.grid.model.lr: also a grid axis"),
    "tune seeds": (dict(tune={"grid": {"model.memory.eta_max": [0.1]}, "seeds": 0}),
                   "tune.seeds: expected an int from 3 to 1000 (the choice is the best median"),
    "tune key": (dict(tune={"grid": {"model.memory.eta_max": [0.1]}, "pilots": 2}),
                 "tune: unknown key(s) ['pilots']; valid keys: grid, seeds"),
    "tune candidate": (dict(tune={"grid": {"model.memory.eta_max": [0.1, -1.0]}}),
                       "tune.grid.model.memory.eta_max = -1.0: model.memory.eta_max: expected a number > 0"),
    "tune search": (dict(sampler="tpe", trials=2, search={"model.lr": {"low": 1e-3, "high": 1e-2}},
                         tune={"grid": {"model.memory.eta_max": [0.1]}}),
                    "tune: tuning picks a setting per grid point; sampler tpe has none"),
    # a component's option by its constructor's annotation, a user's class's (``ValueNormDelta``) included
    "user option type": (dict(fixed={"model.memory.learning_rule": {"class_path": USER_RULE,
                                                                    "init_args": {"p": "abc"}}}),
                         "fixed: model.memory.learning_rule.init_args.p: expected float; got abc"),
    "user option grid": (dict(fixed={"model.memory.learning_rule": {"class_path": USER_RULE}},
                              grid={"model.memory.learning_rule.init_args.p": [0.5, "abc"]}),
                         "grid.model.memory.learning_rule.init_args.p = abc: model.memory.learning_rule.init_args.p: "
                         "expected float; got abc"),
    "shipped option grid": (dict(fixed={"model.preset": "atlas"}, grid={"model.memory.optimizer.ns_steps": [2, 2.5]}),
                            "grid.model.memory.optimizer.ns_steps = 2.5: model.memory.optimizer.ns_steps: expected "
                            "int; got 2.5"),
}


@pytest.mark.parametrize("case", list(BAD_SWEEPS))
def test_a_bad_sweep_file_is_one_line_exit_2_and_creates_nothing(case, sweep_dir, capsys):
    fields, message = BAD_SWEEPS[case]
    if fields.get("sampler", "grid") == "grid":
        fields = {"grid": {"model.lr": [1e-3]}, **fields}
    sweep = write_sweep("bad.yaml", **fields)
    assert main(["sweep", sweep]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "bad.yaml" in errors[0] and message in errors[0], errors
    assert not Path("runs").exists()


def test_a_sweep_whose_trials_end_before_their_first_validation_is_refused(sweep_dir):
    """validate_at_end: false, and every fit ends (trainer.max_steps: 2) before its first validation (after the
    epoch's 4 batches): `atlas-lab sweep` refuses the file up front, one line naming it and the keys, exit 2, and
    writes nothing (with validate_at_end, the default, the same study runs: tests/sweep/test_sweep.py)."""
    sweep = write_sweep("off.yaml", grid={"seed_everything": [0, 1], "trainer.max_steps": [2, 4]},
                        fixed={"validate_at_end": False})
    done = subprocess.run([sys.executable, "-m", "atlas_lab.cli", "sweep", sweep], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: off.yaml: grid point ") and "Traceback" not in done.stderr
    assert "'trainer.max_steps': 2}: val/acc would never be logged: validate_at_end is false and the fit ends after " \
           "2 training batch(es) (trainer.max_steps: 2), before its first validation after batch 4" in errors[0]
    assert not Path("runs").exists()


def test_a_study_name_reused_for_another_sweep_is_refused(sweep_dir, capsys):
    from atlas_lab.sweep import load_sweep
    from atlas_lab.sweep.study import load_study, record_spec

    first = load_sweep(write_sweep("first.yaml", grid={"model.lr": [1e-3]}))
    record_spec(load_study(first, "runs/optuna/s.journal", create=True), first, "runs/optuna/s.journal")
    journal = Path("runs/optuna/s.journal").read_bytes()
    assert main(["sweep", write_sweep("second.yaml", grid={"model.lr": [2e-3]}, metric="val/loss",
                                      direction="minimize")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "study: 's' already exists" in errors[0]
    assert "(metric, direction, grid differ)" in errors[0] and "rm runs/optuna/s.journal" in errors[0]
    assert Path("runs/optuna/s.journal").read_bytes() == journal


def test_a_sweep_whose_every_trial_failed_exits_1_and_its_parent_run_failed(sweep_dir, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ["PYTHONPATH"]]))
    boom = [{"class_path": "dist_probe.Fail", "init_args": {"message": "boom"}}]
    assert main(["sweep", write_sweep("fail.yaml", grid={"model.lr": [1e-3]}, fixed={"trainer.callbacks": boom})]) == 1
    assert "error: every trial of study 's' failed (1)" in " ".join(capsys.readouterr().out.split())
    _, parents, children = runs_of()
    assert parents[0].info.status == "FAILED" and children[0].data.tags["optuna.state"] == "FAIL"


def test_a_trial_that_cannot_be_configured_fails_with_its_reason_and_is_never_retried(sweep_dir):
    """A value the sweep command's check did not see (here: given to the worker directly) fails its trial in the
    worker with the configuration's one line; the trial is not lost, so nothing runs it again."""
    from atlas_lab.sweep import load_sweep
    from atlas_lab.sweep.driver import prepare_study
    from atlas_lab.sweep.study import LostTrials
    from atlas_lab.sweep.tracking import init_store, resolve_uri
    from atlas_lab.sweep.worker import work

    spec = load_sweep(write_sweep("w.yaml", grid={"model.memory.window": {"zero": 0}}))  # never validated here
    uri = resolve_uri("sqlite:///runs/mlflow.db")
    init_store(uri)
    study, parent, added, _ = prepare_study(spec, "runs/optuna/s.journal", MlflowClient(uri))
    assert added == 1 and work(spec, "runs/optuna/s.journal", uri, parent, "worker-1", os.getppid()) == 1
    (trial,) = study.get_trials()
    assert trial.state.name == "FAIL" and LostTrials()(study) == []
    assert trial.user_attrs["fail_reason"].startswith("ConfigError: model.memory.window: expected an int >= 1")


BAD_COMMANDS = {  # name: (arguments, what the one line must say): every numeric flag of the other sub-commands
    **{f"presets {flag} {value}": (["presets", flag, value], f"{flag}: expected an int >= 1, got '{value}'")
       for flag in ("--d-model", "--n-layers", "--n-heads", "--vocab-size", "--swa-window", "--seq-len")
       for value in ("0", "-2", "x")},
    "presets heads": (["presets", "--d-model", "64", "--n-heads", "5"],
                      "--n-heads: d_model=64 must be divisible by n_heads=5"),
    **{f"sweep --workers {value}": (["sweep", "no.yaml", "--workers", value],
                                    f"--workers: expected an int >= 1, got '{value}'") for value in ("0", "-1", "x")},
    **{f"ui --port {value}": (["ui", "--port", value], f"--port: expected an int in [1, 65535], got '{value}'")
       for value in ("0", "-1", "65536", "x")},
    "no command": ([], "the following arguments are required: command"),
}


@pytest.mark.parametrize("case", list(BAD_COMMANDS))
def test_a_bad_command_line_is_one_line_exit_2_and_writes_nothing(case, sweep_dir, capsys):
    args, message = BAD_COMMANDS[case]
    before = _tree()
    assert main(args) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(f"error: {message}") and "Traceback" not in err, err
    assert _tree() == before


def _tree() -> dict:
    return {str(p): p.stat().st_size for p in Path(".").rglob("*")}


def test_a_report_of_a_missing_study_is_one_line_exit_2_and_writes_nothing(sweep_dir, capsys):
    import optuna

    assert main(["report", "nosuch"]) == 2  # no --storage: the default journal does not exist, and stays so
    assert not Path("runs").exists()
    Path("runs/optuna").mkdir(parents=True)
    optuna.create_study(study_name="other", storage=open_storage("runs/optuna/other.journal"))
    before = _tree()
    assert main(["report", "nosuch", "--storage", "runs/optuna/other.journal"]) == 2
    assert main(["report", "nosuch", "--storage", "sqlite:///runs/optuna.db"]) == 2
    assert _tree() == before
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 3 and all("report: no study named 'nosuch'" in e for e in errors), errors


def test_a_report_never_creates_tables_in_a_database(postgres, sweep_dir, capsys):
    """A fresh PostgreSQL database stays empty: the report reads, it never creates Optuna's tables."""
    import sqlalchemy

    postgres_url = postgres.database()
    assert main(["report", "nosuch", "--storage", postgres_url]) == 2
    assert "report: no study named 'nosuch'" in capsys.readouterr().err
    assert sqlalchemy.inspect(sqlalchemy.create_engine(postgres_url)).get_table_names() == []


def test_ui_on_a_port_in_use_is_one_line_exit_2(sweep_dir, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["ui", "--port", str(taken.getsockname()[1])]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is in use on 127.0.0.1" in errors[0] and not Path("runs").exists()



# Every subcommand: a missing file and a file or value of the wrong kind, each one line and exit 2, checked before
# the heavy packages are imported

MISSING_OR_WRONG = {  # name: (arguments, what the one line must say)
    "eval missing checkpoint": (["eval", "--ckpt_path", "missing.ckpt", "--tasks", "t"],
                                "--ckpt_path: no such checkpoint file: missing.ckpt"),
    "eval folder checkpoint": (["eval", "--ckpt_path", "folder", "--tasks", "t"], "--ckpt_path: folder is a folder"),
    "eval text checkpoint": (["eval", "--ckpt_path", "text.ckpt", "--tasks", "t"],
                             "--ckpt_path: text.ckpt is not a readable checkpoint (not the zip archive"),
    "eval checkpoint before tasks": (["eval", "--ckpt_path", "missing.ckpt", "--tasks", "no_such_task"],
                                     "--ckpt_path: no such checkpoint file"),
    "eval missing tasks folder": (["eval", "--ckpt_path", "zip.ckpt", "--tasks", "t", "--include-path", "nowhere"],
                                  "--include-path: no such folder: nowhere"),
    "eval missing position file": (["eval", "--ckpt_path", "zip.ckpt", "--ppl-by-position", "missing.txt",
                                    "--max-length", "8"], "--ppl-by-position: no such file: missing.txt"),
    "eval limit type": (["eval", "--ckpt_path", "zip.ckpt", "--tasks", "t", "--limit", "x"],
                        "--limit: expected an int >= 1, got 'x'"),
    "prepare missing input": (["data", "prepare", "missing.txt", "--out", "o"], "INPUT: no such file: 'missing.txt'"),
    "prepare folder input": (["data", "prepare", "folder", "--out", "o"], "INPUT: 'folder' is a folder"),
    "prepare input type": (["data", "prepare", "table.csv", "--out", "o"], "INPUT: 'table.csv' has the suffix '.csv'"),
    "prepare missing tokenizer": (["data", "prepare", "text.txt", "--out", "o", "--tokenizer", "missing.json"],
                                  "--tokenizer: expected 'byte' or the path of a tokenizer.json"),
    "prepare tokenizer type": (["data", "prepare", "text.txt", "--out", "o", "--tokenizer", "text.txt"],
                               "--tokenizer: 'text.txt' does not load as a tokenizer.json"),
    "prepare workers type": (["data", "prepare", "text.txt", "--out", "o", "--workers", "x"],
                             "--workers: expected an int >= 1, got 'x'"),
    "tokenizer missing input": (["data", "tokenizer", "missing.txt", "--out", "t.json", "--vocab-size", "300"],
                                "INPUT: no such file: 'missing.txt'"),
    "tokenizer folder input": (["data", "tokenizer", "folder", "--out", "t.json", "--vocab-size", "300"],
                               "INPUT: 'folder' is a folder"),
    "tokenizer vocabulary type": (["data", "tokenizer", "text.txt", "--out", "t.json", "--vocab-size", "x"],
                                  "--vocab-size: expected an int >= 259, got 'x'"),
    "report missing storage": (["report", "s", "--storage", "missing.journal"], "missing.journal does not exist"),
    "report folder storage": (["report", "s", "--storage", "folder"], "report: no study named 's'"),
    "report power type": (["report", "s", "--power", "x"], "--power: expected a number > 0, got 'x'"),
    "capacity missing file": (["capacity", "missing.yaml"], "missing.yaml"),
    "capacity folder": (["capacity", "folder"], "folder"),
    "capacity list": (["capacity", "list.yaml"], "list.yaml: expected a mapping"),
    "ui missing store": (["ui", "--tracking-uri", "sqlite:///missing/mlflow.db"], "--tracking-uri: no tracking store"),
    "ui port type": (["ui", "--port", "x"], "--port: expected an int in [1, 65535], got 'x'"),
    "sweep missing file": (["sweep", "missing.yaml"], "missing.yaml"),
    "sweep folder": (["sweep", "folder"], "folder"),
    "sweep workers type": (["sweep", "missing.yaml", "--workers", "x"], "--workers: expected an int >= 1, got 'x'"),
    "fit missing config": (["fit", "-c", "missing.yaml"], "missing.yaml: config file not found"),
    "fit folder config": (["fit", "-c", "folder"], "folder: a folder; expected a YAML config file"),
    "fit binary config": (["fit", "-c", "binary.yaml"], "binary.yaml: not UTF-8 text (byte 0x80 at offset 0)"),
    "validate missing config": (["validate", "--config=missing.yaml"], "missing.yaml: config file not found"),
    "test broken config": (["test", "-c", "broken.yaml"], "broken.yaml: not valid YAML at line 2, column 1"),
    "presets type": (["presets", "--d-model", "x"], "--d-model: expected an int >= 1, got 'x'"),
}


def _bad_files(folder: Path) -> None:
    """The files the cases above name: a folder, a text file posing as a checkpoint, a zip archive (the container of
    a checkpoint: the cheap check passes), a CSV, a text file, YAML that is a list, YAML that does not parse, and bytes
    that are not UTF-8."""
    import zipfile

    (folder / "folder").mkdir()
    (folder / "text.ckpt").write_text("not a checkpoint")
    with zipfile.ZipFile(folder / "zip.ckpt", "w") as archive:
        archive.writestr("archive/data.pkl", b"")
    (folder / "table.csv").write_text("a,b\n1,2\n")
    (folder / "text.txt").write_text("some text\n")
    (folder / "list.yaml").write_text("- a list\n")
    (folder / "broken.yaml").write_text("model: [1, 2\n")
    (folder / "binary.yaml").write_bytes(b"\x80\x81 binary")


@pytest.mark.parametrize("case", list(MISSING_OR_WRONG))
def test_a_missing_file_or_a_wrong_type_is_one_line_exit_2_under_every_subcommand(case, tmp_path, monkeypatch,
                                                                                   capsys):
    args, message = MISSING_OR_WRONG[case]
    monkeypatch.chdir(tmp_path)
    _bad_files(tmp_path)
    before = _tree()
    assert main(args) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in err, err
    assert _tree() == before


HEAVY = ("torch", "lightning", "lm_eval.tasks", "litdata", "mlflow", "optuna")
PROBE = """import json, sys
from atlas_lab.cli import main
code = main(json.loads(sys.argv[1]))
print(json.dumps([code, sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)]))
"""


@pytest.mark.parametrize("case", ["eval missing checkpoint", "eval text checkpoint", "eval checkpoint before tasks",
                                  "eval missing position file", "prepare missing input", "prepare tokenizer type",
                                  "tokenizer missing input", "fit missing config", "fit binary config",
                                  "test broken config"])
def test_arguments_and_files_are_checked_before_the_heavy_packages_are_imported(case, tmp_path):
    """In a fresh process: the one line comes before torch, Lightning, the harness's task index, litdata, MLflow or
    Optuna is imported (each takes a second or more to import; the harness's index, half a minute)."""
    _bad_files(tmp_path)
    args, _ = MISSING_OR_WRONG[case]
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args), json.dumps(HEAVY)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    code, imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert code == 2 and imported == [], (imported, done.stderr)
