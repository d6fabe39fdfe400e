"""What a memory costs before it runs: forward FLOPs per token of the chunked path (docs/performance.md, "Cost").

Counted are the matrix products (2·m·k·n FLOPs each, the same as torch's FlopCounterMode, against which
tests/memory/test_cost.py checks every formula here); element-wise work, the gates and φ's products are left out.
Per head, for a chunk of n tokens whose window holds L = n + (c − 1) tokens (fewer in the first chunk), every
weight matrix (out × in) of the memory:

    gradients at W̃     2L·Σ out·in + 2L·Σ_{matrices not fed by φ} out·in      (forward, then ∂ℓ/∂ of inner layers)
    read=token, muon   S_t: 2n·L·out·in;  D = NS: n·k·(4m²M + 2m³);  W_t: 2n²·out·in;  read: 2n·out·in
                       (m ≤ M the sides of the matrix; cubic coefficients drop the 2m³; any TransformedMomentum
                       with its ``direction_flops`` in place of NS's)
    read=token, ℓq/KL  A_t: 2n·L·out·in;  T(A_t): element-wise;  read: 2n·out·in  (any TransformedAccumulator)
    read=token, gd     dual form: 2n·out·in (+ 2n·out·in momentum) + 2n·L·(in + out); state: 2L·out·in (×2 momentum)
    read=chunk         read: 2n·out·in;  Σ_t g_t: 2L·out·in;  muon: one NS per completed chunk, k·(4m²M + 2m³)
    coefficients       2n²L (Cw Γ) and 2n²L more for momentum (Cs Γ) and 2n³ + 2n² (its decay products)

The exact delta rule (chunk 1, window 1, gd, l2, linear) runs in blocks of 64 tokens (WY form; 16 with a retention
per key channel): per block of n tokens 2n²D (KKᵀ) + 2nD·d_v (KW₀ᵀ) + 2nD·d_v (QW₀ᵀ) + 2n²D (QKᵀ) + 2n²d_v (·U) +
2nD·d_v (the new W), and the triangular solve (n²·d_v, which FlopCounterMode does not count and neither does this
formula). Per channel, KKᵀ and QKᵀ are contractions over the channels of the decayed keys (the same 2n²D each; the
decays themselves, n²D exponentials, are element-wise). A gate per channel at chunk > 1 runs token by token: n/a.
With n_h steps per token (DeltaProduct) the rule runs T·n_h steps, each read (the reads between a token's steps are
computed and dropped): the FLOPs of T·n_h steps over T tokens.
"""
from __future__ import annotations

from .delta_rule import delta_rule_applies, delta_rule_block
from .memories import ModuleMemory
from .optimizers import LinearRule, TransformedAccumulator, TransformedMomentum


def _chunks(T: int, chunk_size: int, window):
    """(n, L) of every chunk of a call from a fresh state."""
    out, first = [], 0
    while first < T:
        n = min(chunk_size, T - first)
        lo = 0 if window is None else max(0, first - window + 1)
        out.append((n, first + n - lo))
        first += n
    return out


def _token_reads(c, mem, bias, opt, shapes, D, d_v, T, gradient, channels):
    """read="token": the dual/closed forms per chunk (the exact delta rule in WY blocks). ``gradient``: the FLOPs
    of the window gradients per window token."""
    if c.chunk_size == 1 and c.window == 1 and delta_rule_applies(mem, bias, opt):
        total, block = 0, delta_rule_block("alpha" in channels)
        for first in range(0, T, block):
            n = min(block, T - first)
            total += 4 * n * n * D + 6 * n * D * d_v + 2 * n * n * d_v
        return total
    total = 0
    for n, L in _chunks(T, c.chunk_size, c.window):
        total += gradient * L
        if isinstance(opt, TransformedMomentum):
            total += 2 * n * n * L  # Cs Γ
            for o, i in shapes.values():
                total += 2 * n * L * o * i + n * opt.direction_flops(o, i) + 2 * n * n * o * i + 2 * n * o * i
        elif isinstance(opt, TransformedAccumulator):  # Cw Γ; A_t and the read per matrix
            total += 2 * n * n * L + sum(2 * n * L * o * i + 2 * n * o * i for o, i in shapes.values())
        else:
            momentum = opt.state_shape((1, 1)) is not None
            total += 2 * n * n * L * (2 if momentum else 1) + ((2 * n ** 3 + 2 * n * n) if momentum else 0)
            for o, i in shapes.values():
                total += 2 * n * o * i * (2 if momentum else 1) + 2 * n * L * (i + o) + 2 * L * o * i * (
                    2 if momentum else 1)
    return total


def _chunk_start_reads(c, mem, bias, opt, shapes, D, d_v, T, gradient, channels):
    """read="chunk": every token reads W̃; Σ_t g_t per chunk; one direction (NS) per completed chunk."""
    size = sum(o * i for o, i in shapes.values())
    total = 0
    for n, L in _chunks(T, c.chunk_size, c.window):
        total += gradient * L + (2 * n + 2 * L) * size
        if isinstance(opt, TransformedMomentum) and n == c.chunk_size:  # a partial last chunk is pending
            total += sum(opt.direction_flops(o, i) for o, i in shapes.values())
    return total


READ_FLOPS = {"token": _token_reads, "chunk": _chunk_start_reads}  # by MemoryConfig.read


def memory_flops(config, head_dim: int, T: int) -> float | None:
    """Forward FLOPs per token and head of ``memorize`` (chunked path) for a MemoryConfig ``config`` on a fresh
    sequence of T tokens, head dim d_k = d_v = ``head_dim``. None where no formula is known: a custom nn.Module
    memory, or an optimiser without a closed in-chunk form or gates per channel outside the exact delta rule (they
    run token by token: adam)."""
    mem, fmap, bias, opt = config.components()
    rule = config.rule()
    channels = [g for g, spec in rule.gates(config, opt).items() if spec.axis != "head"]  # gates per channel
    if isinstance(mem, ModuleMemory) or not isinstance(opt, (LinearRule, TransformedMomentum, TransformedAccumulator)):
        return None
    if channels and config.read == "token" and not (config.chunk_size == 1 and config.window == 1
                                                                 and delta_rule_applies(mem, bias, opt)):
        return None
    D = fmap.dim(head_dim)
    d_v = head_dim + int(config.normalize)
    shapes = mem.shapes(D, head_dim, d_v)
    # forward at W̃, then ∂ℓ/∂ of the inner layers (the matrices whose input is not φ(k)), per window token
    first = mem.phi_weights(D, head_dim, d_v)
    gradient = 2 * sum(o * i for o, i in shapes.values()) + 2 * sum(o * i for n, (o, i) in shapes.items()
                                                                     if n not in first)
    steps = T * rule.steps_per_token  # the rule runs n_h steps per token, each with its read (op.py)
    return READ_FLOPS[config.read](config, mem, bias, opt, shapes, D, d_v, steps, gradient, channels) / T


def attention_flops(head_dim: int, T: int, window: int | None = None) -> float:
    """Forward FLOPs per token and head of causal softmax attention over T tokens (QKᵀ and PV: 4·d per key), each
    token attending to the t keys up to it (the last ``window`` of them for sliding-window attention)."""
    keys = sum(t if window is None else min(t, window) for t in range(1, T + 1))
    return 4 * head_dim * keys / T


def flops_text(x: float | None) -> str:
    """1.23G, 456M, 7.8k, 0; "n/a" for None (no formula)."""
    if x is None:
        return "n/a"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"
