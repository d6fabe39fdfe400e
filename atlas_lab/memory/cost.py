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


def _chunks(T: int, chunk_size: int, window):
    """(n, L) of every chunk of a call from a fresh state."""
    out, first = [], 0
    while first < T:
        n = min(chunk_size, T - first)
        lo = 0 if window is None else max(0, first - window + 1)
        out.append((n, first + n - lo))
        first += n
    return out


def _delta_rule(c, opt, shapes, D, d_v, T, gradient, block):
    """The exact delta rule in WY blocks of ``block`` tokens."""
    total = 0
    for first in range(0, T, block):
        n = min(block, T - first)
        total += 4 * n * n * D + 6 * n * D * d_v + 2 * n * n * d_v
    return total


def _transformed(c, opt, shapes, D, d_v, T, gradient, block):
    """S_t in closed form, D(S_t) for every token, W_t by one product, the read at W_t."""
    total = 0
    for n, L in _chunks(T, c.chunk_size, c.window):
        total += gradient * L + 2 * n * n * L  # Cs Γ
        for o, i in shapes.values():
            total += 2 * n * L * o * i + n * opt.direction_flops(o, i) + 2 * n * n * o * i + 2 * n * o * i
    return total


def _accumulated(c, opt, shapes, D, d_v, T, gradient, block):
    """A_t in closed form (Cw Γ), T(A_t) element-wise, the read at W_t."""
    total = 0
    for n, L in _chunks(T, c.chunk_size, c.window):
        total += gradient * L + 2 * n * n * L + sum(2 * n * L * o * i + 2 * n * o * i for o, i in shapes.values())
    return total


def _linear(c, opt, shapes, D, d_v, T, gradient, block):
    """The closed form and the dual-form read (momentum doubles the state's products)."""
    momentum = 2 if opt.state_shape((1, 1)) is not None else 1
    total = 0
    for n, L in _chunks(T, c.chunk_size, c.window):
        total += gradient * L + 2 * n * n * L * momentum + ((2 * n ** 3 + 2 * n * n) if momentum == 2 else 0)
        for o, i in shapes.values():
            total += 2 * n * o * i * momentum + 2 * n * L * (i + o) + 2 * L * o * i * momentum
    return total


def _chunk_start(c, opt, shapes, D, d_v, T, gradient, block):
    """read="chunk": every token reads W̃; Σ_t g_t per chunk; one direction (NS) per matrix per completed chunk of
    its level (LearningRule.commits: every chunk but for a rule of levels)."""
    size = sum(o * i for o, i in shapes.values())
    total = sum(gradient * L + (2 * n + 2 * L) * size for n, L in _chunks(T, c.chunk_size, c.window))
    direction = getattr(opt, "direction_flops", None)
    if direction is not None:  # a partial last chunk is pending
        commits = c.rule().commits(shapes, c.chunk_size)
        total += sum(T // commits[n][0] * direction(o, i) for n, (o, i) in shapes.items())
    return total


FORMS = {"delta_rule": _delta_rule, "linear": _linear, "transformed": _transformed, "accumulated": _accumulated,
         "chunk_start": _chunk_start}  # by the plan's form (memory/plan.py); "stepwise": no formula


def form_flops(form: str, config, mem, optimizer, shapes: dict, D: int, d_k: int, d_v: int, T: int,
               block: int, start: bool = False) -> float | None:
    """Forward FLOPs of T steps of one head in the plan's ``form`` (memory/plan.py), for a memory whose weight
    matrices are ``shapes`` {name: (out, in)} on D = dim φ(k) features, d_v value rows (the normaliser's included);
    None for a form without a formula (stepwise: ``update`` token by token). start (read="start"): every token is
    read once more, at its chunk's start (2·Σ out·in each; the form's own reads are computed too)."""
    if form not in FORMS:
        return None
    # forward at W̃, then ∂ℓ/∂ of the inner layers (the matrices whose input is not φ(k)), per window token
    first = mem.phi_weights(D, d_k, d_v)
    gradient = 2 * sum(o * i for o, i in shapes.values()) + 2 * sum(o * i for n, (o, i) in shapes.items()
                                                                     if n not in first)
    total = FORMS[form](config, optimizer, shapes, D, d_v, T, gradient, block)
    return total + (2 * T * sum(o * i for o, i in shapes.values()) if start else 0)


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
