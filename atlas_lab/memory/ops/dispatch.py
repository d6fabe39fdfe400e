"""``memorize(..., impl="triton")``: the memory op on the Triton kernels (docs/memory.md §5.3).

The plan (memory/plan.py: ``triton_gap``, ops/limits.py: ``COVERAGE``) decides which calls come here; this runs them
with the same arguments and results as ``memorize_reference``:
  * a linear memory with an optimiser linear in the gradients (gd, momentum), bias l2 or dot, any window and feature
    map (φ is applied in PyTorch), normalize=True: the chunk kernels (``chunk_linear_memory``: each chunk's products
    in parallel around one walk over chunk states), forward and backward;
  * muon with a built-in memory (linear, mlp, gated_mlp): the chunked path, with every chunk's per-token momenta
    orthogonalised by one batched Newton–Schulz launch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from triton.runtime.interpreter import InterpretedFunction

from ..chunked import memorize_chunked
from ..components import declares
from ..plan import kernel_bias
from .chunk_linear_memory.triton import chunk_linear_memory, chunk_linear_memory_fwd_kernel
from .newton_schulz.triton import newton_schulz

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


def memorize_triton(q, k_all, v_all, gamma_all, alpha, eta, theta, *, mem, phi, bias, window, optimizer,
                    chunk_size, W, S, W_eval, offset, pending=None, form, block):
    """Same arguments and results as ``atlas_lab.memory.reference.memorize_reference``, on the Triton kernels, for a
    call the plan routed here (``form``, ``block``: the plan's, for muon's chunked path)."""
    if declares(optimizer, "with_ns", "direction"):  # muon: every chunk's n·N momenta orthogonalised in one launch
        return memorize_chunked(q, k_all, v_all, gamma_all, alpha, eta, theta, mem=mem, phi=phi, bias=bias,
                                window=window, optimizer=optimizer.with_ns(newton_schulz), chunk_size=chunk_size, W=W,
                                S=S, W_eval=W_eval, offset=offset, form=form, block=block)
    momentum = S is not None  # a linear rule with state: momentum's closed form (m, s, Cs)
    co = chunk_rows(optimizer, alpha, eta, theta, chunk_size, offset)
    y, W_T, S_T, W_e = chunk_linear_memory(
        phi(q), phi(k_all), v_all, gamma_all, co["a"], co["Cw"], W["W"], (W if W_eval is None else W_eval)["W"],
        offset=offset, chunk_size=chunk_size, window=window, bias=kernel_bias(bias),
        m=co.get("m"), s=co.get("s"),
        Cs=co.get("Cs"), S0=S["W"] if momentum else None)
    offset = (offset + q.shape[1]) % chunk_size
    return y, {"W": W_T}, ({"W": S_T} if momentum else None), ({"W": W_e} if offset else None), offset, None
