"""Bad input gets a clear error naming the function, the argument, what was expected and what was given; non-finite
input propagates forward in time only (docs/memory.md, "Bad input and non-finite values")."""
import itertools

import pytest
import torch

from atlas_lab.memory import memorize
from helpers import make_problem

# The Python API

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
