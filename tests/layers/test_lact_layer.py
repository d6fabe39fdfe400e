"""layers/hybrid.py's LaCT layer against LaCT's layer written out here from its definition (arXiv 2505.23884 and the
official lact_llm layer_lact_swiglu.py / ttt_operation.py), float64, without the engine:

    q, k, v = x W_qkv                                          one projection for both branches
    SWA:  softmax over the last w keys of RoPE(q) · RoPE(k) / √d_h, w = the memory's chunk
    TTT:  q̂ = RoPE(l2(SiLU(q ⊙ s_q + o_q))), k̂ = RoPE(l2(SiLU(k ⊙ s_k + o_k))), v̂ = SiLU(v)   (l2 per memory head,
          x / (‖x‖ + 1e−5); RoPE over the attention's heads)
          per chunk c of b tokens: y_t = f_W(q̂_t) (the weights before the chunk), then
          M_c = mean_{t∈c}(θ_t) M_{c−1} + (1/b) Σ_t γ_t ∇_W(−⟨f_W(k̂_t), v̂_t⟩),  W' = W − NS(M_c),  rows of W' back to
          their initial norms;  γ_t = softplus(w·x + softplus⁻¹(10⁻³)), θ_t = σ(w·x + b)
    o = W_o (SWA + RMSNorm(y) ⊙ SiLU(w·x))

γ_t is one per memory head and weight matrix (LaCT's per-matrix learning rates: the projection's three outputs per
head in the memory's order W1, W2, W3). The project's departure, written so here too: the (1/b) of the mean gradient
(Newton–Schulz removes the scale, up to its 1e−7).
"""
import math

import pytest
import torch
from torch.nn import functional as F

from atlas_lab.layers.hybrid import LaCT, chunk_mean_factors
from atlas_lab.models import resolve_preset
from helpers import LACT_NS, QUINTIC, rel_err, swiglu
from helpers import dot_loss_gradients as gradients
from helpers import newton_schulz_steps as newton_schulz

B, T, D_MODEL, HEADS, MEMORY_HEADS, CHUNK = 2, 23, 16, 2, 4, 5  # four commits and a partial chunk; 2 attention heads


def layer(preset="lact", **options):
    torch.manual_seed(0)
    config = resolve_preset(preset)[1].replace(chunk_size=CHUNK, eta=1 / CHUNK)  # η_c = Σ_t η_t = 1 per chunk
    m = LaCT(D_MODEL, HEADS, config, swa_window=64,
             memory_heads=MEMORY_HEADS, **options).double()
    with torch.no_grad():  # away from the initialisation's symmetries (unit scales, zero offsets and biases)
        g = torch.Generator().manual_seed(1)
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m


def rope(x, heads):
    """Rotate the pairs (x_i, x_{i+d/2}) of each of ``heads`` heads of x [B, T, width] by angle t·10000^(−2i/d) (fla's
    RotaryEmbedding, the official layer's, rotates the same pairs)."""
    width = x.shape[-1]
    d = width // heads
    x = x.view(B, -1, heads, d)
    angle = torch.arange(x.shape[1], dtype=torch.float32)[:, None] * 10000.0 ** (
        -torch.arange(d // 2, dtype=torch.float32) * 2 / d)  # the angles in float32, as layers/rope.py takes them
    c, s = angle.cos().double()[None, :, None], angle.sin().double()[None, :, None]
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], -1).reshape(B, -1, width)


def rms_norm(x, weight):
    return x / (x.square().mean(-1, keepdim=True) + torch.finfo(x.dtype).eps).sqrt() * weight


def lact_layer(m, x, mean_momentum=True, rotate=True, schedule=LACT_NS, renormalise=True, window=CHUNK):
    """The definition above with m's parameters; the switches break one part each."""
    H, d, hd = MEMORY_HEADS, D_MODEL // MEMORY_HEADS, D_MODEL // HEADS
    q, k, v = (x @ m.qkv.weight.T).chunk(3, -1)
    # SWA, a dense mask
    qa, ka = (rope(t, HEADS).view(B, T, HEADS, hd).transpose(1, 2) for t in (q, k))
    va = v.view(B, T, HEADS, hd).transpose(1, 2)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    scores = (qa @ ka.mT / math.sqrt(hd)).masked_fill(~((j <= i) & (j > i - window)), -torch.inf)
    attention = (scores.softmax(-1) @ va).transpose(1, 2).reshape(B, T, D_MODEL)
    # TTT
    fq, fk = (F.silu(t * m.qk_scale[n] + m.qk_offset[n]) for n, t in enumerate((q, k)))
    fq, fk = (t.view(B, T, H, d) for t in (fq, fk))
    fq, fk = (t / (t.norm(dim=-1, keepdim=True) + 1e-5) for t in (fq, fk))
    if rotate:
        fq, fk = (rope(t.reshape(B, T, D_MODEL), HEADS).view(B, T, H, d) for t in (fq, fk))
    fv = F.silu(v).view(B, T, H, d)
    lr = F.softplus(x @ m.lr_proj.weight.T + m.lr_proj.bias + math.log(math.expm1(1e-3))).view(B, T, H, -1)
    lr = lr if lr.shape[-1] > 1 else lr[..., 0]  # one per matrix (lact), or one per head
    momentum = torch.sigmoid(x @ m.momentum_proj.weight.T + m.momentum_proj.bias)
    W = {n: w.expand(B, *w.shape) for n, w in m.initial_weights.items()}
    norms = {n: w.norm(dim=-1, keepdim=True) for n, w in W.items()}
    M = {n: torch.zeros_like(w) for n, w in W.items()}
    out = []
    for s in range(0, T, CHUNK):
        c = slice(s, min(s + CHUNK, T))
        out.append(swiglu(W, fq[:, c])[0])
        if c.stop - c.start < CHUNK:
            break
        G = gradients(W, fk[:, c], fv[:, c], lr[:, c])
        theta = momentum[:, c].mean(1) if mean_momentum else momentum[:, c].prod(1)
        for n in W:
            M[n] = theta[..., None, None] * M[n] + G[n] / CHUNK
            W[n] = W[n] - newton_schulz(M[n], schedule)
            if renormalise:
                W[n] = W[n] / W[n].norm(dim=-1, keepdim=True) * norms[n]
    y = torch.cat(out, 1)
    ttt = rms_norm(y, m.ttt_norm.weight) * F.silu(x @ m.scale_proj.weight.T + m.scale_proj.bias)[..., None]
    return (attention + ttt.reshape(B, T, D_MODEL)) @ m.o_proj.weight.T


def inputs():
    return torch.randn(B, T, D_MODEL, generator=torch.Generator().manual_seed(2), dtype=torch.float64,
                       requires_grad=True)


def with_gradients(m, x, y):
    leaves = [x, *m.parameters()]
    weight = torch.randn(y.shape, generator=torch.Generator().manual_seed(3), dtype=y.dtype)
    return y, torch.autograd.grad((y * weight).sum(), leaves, allow_unused=True)


@pytest.mark.parametrize("preset", ["lact", "lact_simple"])
def test_lact_layer_is_its_definition_float64(preset):
    """Outputs and the gradients of x and of every parameter within 1e-10 of the direct computation."""
    m, x = layer(preset), inputs()
    official = preset == "lact"
    y, grads = with_gradients(m, x, m(x)[0])
    y_ref, grads_ref = with_gradients(m, x, lact_layer(m, x, schedule=LACT_NS if official else QUINTIC,
                                                       renormalise=official))
    assert rel_err(y, y_ref) < 1e-10
    names = ["x", *(n for n, _ in m.named_parameters())]
    bad = {n: rel_err(a, b) for n, a, b in zip(names, grads, grads_ref) if b is not None and rel_err(a, b) >= 1e-10}
    assert not bad, bad
    assert all(g is not None and g.abs().sum() > 0 for g in grads), "a parameter without a gradient"


@pytest.mark.parametrize("broken", ["momentum as a product", "no RoPE on the fast q, k", "the model's window"])
def test_a_broken_part_fails_the_identity(broken):
    """The identity tells the layer from its neighbours: the chunk's momentum as the engine's product of per-token
    factors instead of their mean, the fast q, k without RoPE, or the SWA window of the model instead of the chunk."""
    m, x = layer(), inputs()
    switches = {"momentum as a product": dict(mean_momentum=False), "no RoPE on the fast q, k": dict(rotate=False),
                "the model's window": dict(window=64)}[broken]
    assert rel_err(m(x)[0], lact_layer(m, x, **switches)) > 1e-3


def test_lact_layer_streams_in_pieces():
    """23 tokens in pieces of 7, 1 and 15 (a chunk in progress and a part of the SWA window at each cut) equal one
    call, outputs and gradients: the ring, the positions and the chunk's running mean of θ carry over."""
    m, x = layer(), inputs()
    full = m(x)[0]
    pieces, cache = [], None
    for lo, hi in [(0, 7), (7, 8), (8, 23)]:
        o, cache = m(x[:, lo:hi], cache)
        pieces.append(o)
    split = torch.cat(pieces, 1)
    assert rel_err(split, full) < 1e-12
    for a, b in zip(with_gradients(m, x, split)[1], with_gradients(m, x, full)[1]):
        assert rel_err(a, b) < 1e-10


def test_chunk_mean_factors_multiply_to_the_chunk_mean():
    theta = torch.rand(2, 13, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    f = chunk_mean_factors(theta, 5)
    for s in (0, 5):
        assert rel_err(f[:, s:s + 5].prod(1), theta[:, s:s + 5].mean(1)) < 1e-14
    # continued mid-chunk: 2 tokens read before (their mean pending), then the rest
    head = chunk_mean_factors(theta[:, :2], 5)
    tail = chunk_mean_factors(theta[:, 2:], 5, offset=2, pending=head.prod(1))
    assert rel_err(torch.cat([head, tail], 1), f) < 1e-14


def test_lact_layer_options():
    m = layer()
    assert m.window == CHUNK and m.rope and m.momentum == "learned"
    assert layer(window="model").window == 64 and layer(window=3).window == 3
    with pytest.raises(ValueError, match="read: chunk"):
        LaCT(D_MODEL, HEADS, resolve_preset("lact")[1].replace(read="start", learning_rule="chunk_commit"), 64)
    with pytest.raises(ValueError, match="window: expected 'chunk', 'model' or an int"):
        layer(window="all")
    assert layer(momentum="config").momentum_proj is None
