"""The Triton path of ``memorize`` (docs/memory.md §5.3), forward and backward on the chunk kernels, φ applied in
PyTorch:

- a linear memory with an optimiser linear in the gradients (gd, momentum), bias l2 or dot, any window, normalize=True:
  ``ops.chunk_linear_memory`` (each chunk's products in parallel around one walk over chunk states);
- a 2-layer MLP memory with gd or momentum: ``ops.chunk_mlp_memory`` (one program per sequence walks the chunks), and
  with muon ``chunk_mlp_muon`` (its Newton–Schulz inside).

The plan (memory/plan.py: ``triton_gap``, ``muon_kernel_gap``; ops/limits.py: ``COVERAGE``) decides which calls come
here (muon otherwise runs on the chunked path with the plan's Newton–Schulz variant, the batched Triton launch on CUDA).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from triton.runtime.interpreter import InterpretedFunction

from .call import Call, Carried, Result
from .components import declares
from .ops.chunk_linear_memory.triton import chunk_linear_memory, chunk_linear_memory_fwd_kernel
from .ops.chunk_mlp_memory.muon import chunk_mlp_muon
from .ops.chunk_mlp_memory.triton import chunk_mlp_memory
from .predict import kernel_bias

INTERPRETED = isinstance(chunk_linear_memory_fwd_kernel, InterpretedFunction)  # TRITON_INTERPRET=1 when imported


def chunk_rows(optimizer, alpha, eta, theta, chunk_size, offset):
    """Each chunk's closed form (``chunk_coefficients``) as per-token rows: a (m, s) [N, T], Cw (Cs) [N, T, b].

    Row t holds token t's coefficients over the tokens of its chunk (column j = the chunk's j-th token).
    Chunks of equal length are solved in one batched call (the head, the full chunks, the tail).
    """
    N, T = alpha.shape
    head = min(T, (chunk_size - offset) % chunk_size)
    full = (T - head) // chunk_size * chunk_size
    parts = []
    for lo, hi, n in ((0, head, head), (head, head + full, chunk_size), (head + full, T, T - head - full)):
        if hi > lo:
            co = optimizer.chunk_coefficients(*(x[:, lo:hi].reshape(-1, n) for x in (alpha, eta, theta)))
            parts.append({name: (x.reshape(N, hi - lo) if x.dim() == 2 else
                                 F.pad(x.reshape(N, hi - lo, n), (0, chunk_size - n))) for name, x in co.items()})
    return {name: torch.cat([p[name] for p in parts], 1) for name in parts[0]}


def memorize_triton(call: Call) -> Result:
    """The same function as ``reference.memorize_reference`` (read token), on the chunk kernels: the linear memory's
    (``chunk_linear_memory``) or the 2-layer MLP's (``chunk_mlp_memory``)."""
    x, st, m = call.inputs, call.state, call.memory
    W, S, W_eval = st.weights, st.optimizer_state, st.eval_weights
    momentum = S is not None  # a linear optimiser with state: momentum's closed form (m, s, Cs)
    co = chunk_rows(m.optimizer, x.alpha, x.eta, x.theta, m.chunk_size, st.offset)
    if "W" not in W:
        return _memorize_mlp(x, st, m, co)
    y, W_T, S_T, W_e = chunk_linear_memory(
        m.phi(x.q), m.phi(x.k), x.v, x.gamma, co["a"], co["Cw"], W["W"], (W if W_eval is None else W_eval)["W"],
        offset=st.offset, chunk_size=m.chunk_size, window=m.window, bias=kernel_bias(m.bias),
        m=co.get("m"), s=co.get("s"), Cs=co.get("Cs"), S0=S["W"] if momentum else None)
    offset = (st.offset + x.q.shape[1]) % m.chunk_size
    return Result(y, Carried({"W": W_T}, {"W": S_T} if momentum else None, {"W": W_e} if offset else None, offset,
                             None))


def _memorize_mlp(x, st, m, co) -> Result:
    """M(k) = r(k) + W2 σ(W1 φ(k)) (gated: r(k) + W1 (σ(W2 φ(k)) ⊙ W3 φ(k))) on ``chunk_mlp_memory`` (muon:
    ``chunk_mlp_muon``): the residual r taken out of the values (l2: δ2 = M(k) − v = W2 σ(W1 φ(k)) − (v − k)) and
    added to the read-out."""
    gated = m.mem.gated

    def layers(w):  # the kernels' (first layer, second layer): a gated memory's W2 and W3 stacked as one first layer
        return (torch.cat([w["W2"], w["W3"]], 1), w["W1"]) if gated else (w["W1"], w["W2"])

    def named(first, second):
        if not gated:
            return {"W1": first, "W2": second}
        gate, value = first.chunk(2, 1)
        return {"W1": second, "W2": gate, "W3": value}

    W, S, W_eval = st.weights, st.optimizer_state, st.eval_weights
    residual = m.mem.residual and x.k.shape[-1] == x.v.shape[-1]
    l2 = kernel_bias(m.bias) == "l2"
    We = W if W_eval is None else W_eval
    inputs = (m.phi(x.q), m.phi(x.k), x.v - x.k if residual and l2 else x.v, x.gamma)
    options = dict(offset=st.offset, chunk_size=m.chunk_size, window=m.window, bias=kernel_bias(m.bias),
                   activation=m.mem.activation)
    if declares(m.optimizer, "one_triple", "direction"):  # muon: the fused kernel, Newton–Schulz inside
        y, W1, W2, S1, S2, E1, E2 = chunk_mlp_muon(
            *inputs, co["a"], co["s"], co["Cw"], co["Cs"], *layers(W), *layers(S), *layers(We),
            ns_steps=m.optimizer.ns_steps, ns_coefficients=m.optimizer.ns_coefficients, gated=gated, **options)
    else:
        y, W1, W2, S1, S2, E1, E2 = chunk_mlp_memory(
            *inputs, co["a"], co["Cw"], *layers(W), *layers(We), m=co.get("m"), s=co.get("s"), Cs=co.get("Cs"),
            **(dict(zip(("S1", "S2"), layers(S))) if S is not None else {}), gated=gated, **options)
    offset = (st.offset + x.q.shape[1]) % m.chunk_size
    return Result(y + x.q if residual else y, Carried(named(W1, W2), None if S is None else named(S1, S2),
                                                     named(E1, E2) if offset else None, offset, None))
