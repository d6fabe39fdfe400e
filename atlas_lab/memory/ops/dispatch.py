"""``memorize(..., impl="triton")``: the memory op on the Triton kernels (docs/memory.md §5.3).

Covered (same function as ``impl="chunked"``, same arguments and results as ``memorize_reference``):
  * memory="linear", bias "l2" or "dot", any window (c ≥ 1 or global), optimizer "gd" or
    "momentum", any feature map (φ is applied in PyTorch), normalize=True: one fused chunk kernel
    (``chunk_linear_memory``), forward and backward; needs D = dim φ(k) ≤ 256 and chunk_size ≤ 64.
  * optimizer "muon" with a built-in memory (linear, mlp, gated_mlp): the chunked path, with every
    chunk's per-token momenta orthogonalised by one batched Newton–Schulz launch; needs every weight
    matrix to be at most 128 × 512 (either orientation).
  * float32, float16 or bfloat16 tensors, on CUDA (on the CPU only under TRITON_INTERPRET=1).
Not covered: mlp / gated_mlp memories with gd or momentum, custom nn.Module memories, float64.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from triton.runtime.interpreter import InterpretedFunction

from ..chunked import memorize_chunked
from ..memories import GatedMLPMemory, LinearMemory, MLPMemory
from ..attentional_biases import L2, Dot
from ..optimizers import GD, Momentum, Muon
from .chunk_linear_memory.triton import MAX_CHUNK, MAX_FEATURES, chunk_linear_memory, chunk_linear_memory_fwd_kernel
from .newton_schulz.triton import MAX_COLS, MAX_ROWS, newton_schulz

INTERPRETED = isinstance(chunk_linear_memory_fwd_kernel, InterpretedFunction)  # TRITON_INTERPRET=1 when imported
# What the kernels cover, by component class (exact classes: a subclass may change what a method computes).
KERNEL_BIASES = {L2: "l2", Dot: "dot"}  # the chunk kernel's two gradient forms
LINEAR_KERNEL_OPTIMIZERS = (GD, Momentum)
MUON_MEMORIES = (LinearMemory, MLPMemory, GatedMLPMemory)  # built-in memories with analytic gradient factors
COVERAGE = ("impl='triton' covers architecture 'linear' with optimizer 'gd' or 'momentum' (attentional_bias 'l2' "
            f"or 'dot', any window and feature map, D ≤ {MAX_FEATURES}, chunk_size ≤ {MAX_CHUNK}) and optimizer "
            f"'muon' with architecture 'linear', 'mlp' or 'gated_mlp' (weights up to {MAX_ROWS} × {MAX_COLS}), in "
            "float32, float16 "
            "or bfloat16 on CUDA (or the CPU under TRITON_INTERPRET=1); use impl='chunked' (or 'auto') otherwise")


def unsupported(q, mem, bias, optimizer, chunk_size, W) -> str | None:
    """Why the Triton kernels do not cover a call of per-token reads (None when they do)."""
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"dtype {q.dtype}"
    if not (q.is_cuda or INTERPRETED):
        return f"tensors on {q.device.type} (on the CPU, set TRITON_INTERPRET=1 before triton is first imported)"
    if type(bias) not in KERNEL_BIASES:
        return f"bias {bias!r}"
    if type(optimizer) is Muon:
        if type(mem) not in MUON_MEMORIES:
            return f"memory {mem!r} with muon"
        big = [n for n, w in W.items() if min(w.shape[-2:]) > MAX_ROWS or max(w.shape[-2:]) > MAX_COLS]
        return f"weights {big} larger than {MAX_ROWS} × {MAX_COLS} with muon" if big else None
    if type(optimizer) not in LINEAR_KERNEL_OPTIMIZERS:
        return f"optimizer {optimizer!r}"
    if type(mem) is not LinearMemory:
        return f"memory {mem!r} with optimizer {optimizer!r}"
    if W["W"].shape[-1] > MAX_FEATURES:
        return f"D = {W['W'].shape[-1]} features (more than {MAX_FEATURES})"
    if chunk_size > MAX_CHUNK:
        return f"chunk_size={chunk_size} (more than {MAX_CHUNK})"
    return None


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
                    chunk_size, W, S, W_eval, offset, pending=None):
    """Same arguments and results as ``atlas_lab.memory.reference.memorize_reference``, on the Triton kernels."""
    reason = unsupported(q, mem, bias, optimizer, chunk_size, W)
    if reason:
        raise NotImplementedError(f"memorize: impl='triton' does not cover {reason}. {COVERAGE}")
    if type(optimizer) is Muon:  # the chunked path, every chunk's n·N momenta orthogonalised in one NS launch
        return memorize_chunked(q, k_all, v_all, gamma_all, alpha, eta, theta, mem=mem, phi=phi, bias=bias,
                                window=window, optimizer=optimizer.with_ns(newton_schulz), chunk_size=chunk_size, W=W,
                                S=S, W_eval=W_eval, offset=offset)
    momentum = type(optimizer) is Momentum
    co = chunk_rows(optimizer, alpha, eta, theta, chunk_size, offset)
    y, W_T, S_T, W_e = chunk_linear_memory(
        phi(q), phi(k_all), v_all, gamma_all, co["a"], co["Cw"], W["W"], (W if W_eval is None else W_eval)["W"],
        offset=offset, chunk_size=chunk_size, window=window, bias=KERNEL_BIASES[type(bias)],
        m=co.get("m"), s=co.get("s"),
        Cs=co.get("Cs"), S0=S["W"] if momentum else None)
    offset = (offset + q.shape[1]) % chunk_size
    return y, {"W": W_T}, ({"W": S_T} if momentum else None), ({"W": W_e} if offset else None), offset, None
