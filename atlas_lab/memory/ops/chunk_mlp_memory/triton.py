"""A deep (MLP) memory's chunk loop in two launches: one program per sequence walks every chunk with the memory's
weights on chip, forward; one walks them back, recomputing each chunk from its start weights (docs/memory.md §5.3).

Memory M_W(u) = W2 σ(W1 u), W1: [H, D], W2: [d_v, H] (u = φ(k), queries φ(q): the feature map and the residual
r(k) are applied outside); or gated (``GATED``, Atlas++'s memory): W1 = [W_a; W_b] [2H, D] one stacked first layer,
h = σ(W_a u) ⊙ W_b u, its factor δ1 = [(W2ᵀ δ2) ⊙ W_b u ⊙ σ'(W_a u), (W2ᵀ δ2) ⊙ σ(W_a u)] (``_hidden``,
``_hidden_back``); every product below is the same with that h and δ1.
Chunk of n tokens starting at W_p = (W1, W2) (S_p = (S1, S2) for momentum), every gradient at W̃ (= W_p, except
for the first chunk of a call that continues a chunk: the input We):

    z_i = W̃1 u_i,  h_i = σ(z_i),  δ2_i = W̃2 h_i − v_i (l2) or −v_i (dot),  δ1_i = (W̃2ᵀ δ2_i) ⊙ σ'(z_i)
                                                   for the chunk's tokens and the c−1 before them (its window keys)
    ∇_{W1} ℓ_i = δ1_i u_iᵀ,  ∇_{W2} ℓ_i = δ2_i h_iᵀ
    Γ[t, i] = γ_i  if t−c < i ≤ t  else 0,   C = Cw Γ,  C' = Cs Γ   (Cw, Cs: the optimiser's [n, n] closed forms)
    W_t = a_t W_p + m_t S_p + Σ_i C[t, i] ∇ℓ_i                        (every t, never built: the dual form)
    zq_t = a_t W1 uq_t + m_t S1 uq_t + Σ_i C[t, i] (uq_t · u_i) δ1_i,   hq_t = σ(zq_t)
    y_t  = a_t W2 hq_t + m_t S2 hq_t + Σ_i C[t, i] (hq_t · h_i) δ2_i
    W_end = a_n W_p + m_n S_p + Σ_i C[n, i] ∇ℓ_i,   S_end = s_n S_p + Σ_i C'[n, i] ∇ℓ_i

(a, m, s, Cw, Cs from ``atlas_lab.memory.optimizers.chunk_coefficients``; gd has no m, s, Cs.) These are the chunked
path's products (memory/chunked.py: ``_chunk_linear`` in dual form on the factors of ``MLPMemory.gradient_factors``).

**Launches.** ``chunk_mlp_memory_fwd_kernel`` (grid: one program per sequence) walks the chunks in order: each
chunk's products as ``tl.dot``s of [BT, BK, BD, BH, BV] blocks (tokens, window keys, features, hidden units, values),
its read-out stored, its start weights stored (the checkpoints), the weights carried to the next chunk in registers.
``chunk_mlp_memory_bwd_kernel`` (the same grid) walks them back: from each chunk's checkpoint it recomputes the chunk,
takes the gradients of its read-out and end states (the carried ∂L/∂W_end, ∂L/∂S_end) back to its inputs and start
weights, and carries ∂L/∂W_p to the chunk before. A key shared by two chunks' windows gets its gradient from both
(``tl.atomic_add``). So a pass is one launch whatever T is; the programs are N = B·H (a study of B 64, H 8: 512, about
four per multiprocessor of an H100); the work of a program grows with T, in sequence.

**Its backward**, per chunk, with dy the read-out's gradient and G = ∂L/∂W_end, G' = ∂L/∂S_end:

    E2 = dy δ2ᵀ,  P2 = hq hᵀ:   ∂hq = a dy W2 + m dy S2 + (C⊙E2) h,   ∂h += (C⊙E2)ᵀ hq,   ∂δ2 += (C⊙P2)ᵀ dy
    ∂zq = ∂hq ⊙ σ'(zq);  E1 = ∂zq δ1ᵀ, P1 = uq uᵀ:  ∂uq = a ∂zq W1 + m ∂zq S1 + (C⊙E1) u,  ∂u += (C⊙E1)ᵀ uq,
                                                    ∂δ1 += (C⊙P1)ᵀ ∂zq,   ∂C = E1⊙P1 + E2⊙P2
    end states:  ∂δ1 += c ⊙ u G1ᵀ,  ∂u += c ⊙ δ1 G1,  ∂c = Σ (δ1 ⊙ u G1ᵀ) + Σ (δ2 ⊙ h G2ᵀ)  (and c', G')
    factors at W̃:  ∂(W̃2ᵀδ2) = ∂δ1 ⊙ σ'(z),  ∂z = ∂δ1 ⊙ (W̃2ᵀ δ2) ⊙ σ''(z) + ∂h ⊙ σ'(z),  ∂δ2 += ∂(W̃2ᵀδ2) W̃2ᵀ,
                   l2: ∂h += ∂δ2 W̃2,  ∂u += ∂z W̃1,  ∂v = −∂δ2
    ∂W_p = (a ∂y-terms) + a_n G + ∂W̃ (when W̃ = W_p),  ∂S_p = m-terms + m_n G + s_n G'

and the gates' by the chain rule through C = Cw Γ (∂Cw = ∂C Γᵀ, ∂Γ = Cwᵀ ∂C).

**Precision.** Every product is a ``tl.dot`` accumulating in fp32 (``ops.dots.dot``: tf32 where torch allows it);
weights, states and element-wise arithmetic are fp32. The same computation in plain PyTorch is
``naive.chunk_mlp_memory_naive`` (next to this file).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..chunk_linear_memory.triton import _chunk, _key_grads, _load_state, _store_state, chunk_count
from ..dots import DTYPES, dot, dot_precision

ACTS = ("gelu", "silu", "relu", "tanh")

# ---------------------------------------------------------------- helpers


@triton.jit
def _act(z, ACT: tl.constexpr):
    """(σ(z), σ'(z), σ''(z)) of the activation ACT (ACTS' index)."""
    if ACT == 0:  # gelu (exact)
        cdf = 0.5 * (1.0 + tl.math.erf(z * 0.7071067811865476))
        pdf = tl.exp(-0.5 * z * z) * 0.3989422804014327
        return z * cdf, cdf + z * pdf, pdf * (2.0 - z * z)
    elif ACT == 1:  # silu
        sg = 1.0 / (1.0 + tl.exp(-z))
        return z * sg, sg * (1.0 + z * (1.0 - sg)), sg * (1.0 - sg) * (2.0 + z * (1.0 - 2.0 * sg))
    elif ACT == 2:  # relu
        return tl.maximum(z, 0.0), tl.where(z > 0, 1.0, 0.0), z * 0.0
    else:  # tanh
        e = tl.exp(-2.0 * tl.abs(z))
        th = tl.where(z >= 0, 1.0, -1.0) * (1.0 - e) / (1.0 + e)
        return th, 1.0 - th * th, -2.0 * th * (1.0 - th * th)


@triton.jit
def _rows(X, idx, mask, offs, W):
    """X[idx, offs] of a row-major [·, W] tensor (0 outside), as fp32."""
    return tl.load(X + idx[:, None] * W + offs[None, :], mask=mask[:, None] & (offs < W)[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def _last(x, last):
    """Row n−1 of x [BT, ·] (``last``: the mask of that row)."""
    return tl.sum(tl.where(last[:, None], x, 0.0), axis=0)


@triton.jit
def _halves(x, R: tl.constexpr, BH: tl.constexpr):
    """A gated first layer's [R, 2·BH] block as its two halves [R, BH]: the gate's, then the value's."""
    return tl.split(tl.permute(tl.reshape(x, [R, 2, BH]), (0, 2, 1)))


@triton.jit
def _joined(a, b, R: tl.constexpr, BH: tl.constexpr):
    """``_halves``' inverse: [R, BH] twice -> [R, 2·BH]."""
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), [R, 2 * BH])


@triton.jit
def _first(P, offs_h1, offs_d, HD: tl.constexpr, D: tl.constexpr, BH: tl.constexpr, GATED: tl.constexpr):
    """(pointers, mask) of a first-layer matrix [HD1, D] (HD1 = HD, or 2·HD gated: the gate's rows, then the value's)
    as its block [BH1, BD] (gated: the gate's HD rows in the first BH, the value's in the next BH)."""
    if GATED:
        row = tl.where(offs_h1 < BH, offs_h1, HD + offs_h1 - BH)
        valid = tl.where(offs_h1 < BH, offs_h1 < HD, offs_h1 - BH < HD)
    else:
        row = offs_h1
        valid = offs_h1 < HD
    return P + row[:, None] * D + offs_d[None, :], valid[:, None] & (offs_d < D)[None, :]


@triton.jit
def _load1(P, offs_h1, offs_d, HD: tl.constexpr, D: tl.constexpr, BH: tl.constexpr, GATED: tl.constexpr):
    at, mask = _first(P, offs_h1, offs_d, HD, D, BH, GATED)
    return tl.load(at, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store1(P, x, offs_h1, offs_d, HD: tl.constexpr, D: tl.constexpr, BH: tl.constexpr, GATED: tl.constexpr):
    at, mask = _first(P, offs_h1, offs_d, HD, D, BH, GATED)
    tl.store(at, x.to(P.dtype.element_ty), mask=mask)


@triton.jit
def _hidden(z, ACT: tl.constexpr, GATED: tl.constexpr, R: tl.constexpr, BH: tl.constexpr):
    """The hidden units h [R, BH] from the first layer's pre-activations z [R, BH1], and what their derivatives take:
    (h, s, σ'(·), σ''(·), g): h = σ(z) (s = h, g = 1), or gated h = σ(z_a) ⊙ z_b (s = σ(z_a), g = z_b)."""
    if GATED:
        za, zb = _halves(z, R, BH)
        s, ds, dds = _act(za, ACT)
        return s * zb, s, ds, dds, zb
    else:
        s, ds, dds = _act(z, ACT)
        return s, s, ds, dds, s


@triton.jit
def _hidden_back(gh, s, ds, g, GATED: tl.constexpr, R: tl.constexpr, BH: tl.constexpr):
    """∂z [R, BH1] from ∂h [R, BH] (``_hidden``'s s, σ', g); with ∂h = W̃2ᵀ δ2 it is the factor δ1."""
    if GATED:
        return _joined(gh * g * ds, gh * s, R, BH)
    else:
        return gh * ds


@triton.jit
def _factors(K, V, GAMMA, E1, E2, t0, n, m0, c, offs_t, offs_k, offs_d, offs_h, offs_v,
             D: tl.constexpr, DV: tl.constexpr, L2: tl.constexpr, ACT: tl.constexpr, GATED: tl.constexpr,
             BK: tl.constexpr, BH: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    """A chunk's window keys (index, mask, band [BT, BK], Γ on it) and its gradient factors at W̃ = (E1, E2):
    u [BK, BD], h and ``_hidden``'s (s, σ', σ'', g) [BK, BH], δ2 [BK, BV], W̃2ᵀ δ2 [BK, BH] and δ1 [BK, BH1]: (W̃2ᵀ δ2)
    ⊙ σ'(z), or gated [(W̃2ᵀ δ2) ⊙ z_b ⊙ σ'(z_a), (W̃2ᵀ δ2) ⊙ σ(z_a)]."""
    first = m0 + t0
    lo = tl.maximum(first - c + 1, 0)
    idx = lo + offs_k
    kmask = idx < first + n
    g = tl.load(GAMMA + idx, mask=kmask, other=0.0).to(tl.float32)
    pos = first + offs_t
    band = (idx[None, :] <= pos[:, None]) & (idx[None, :] > pos[:, None] - c) & (offs_t < n)[:, None] & kmask[None, :]
    gam = tl.where(band, g[None, :], 0.0)
    u = _rows(K, idx, kmask, offs_d, D)
    h, s, ds, dds, gate = _hidden(dot(u, tl.trans(E1), DT, PREC), ACT, GATED, BK, BH)
    d2 = -_rows(V, idx, kmask, offs_v, DV)
    if L2:
        d2 += dot(h, tl.trans(E2), DT, PREC)
    back = dot(d2, E2, DT, PREC)
    return idx, kmask, band, gam, u, h, s, ds, dds, gate, d2, back, _hidden_back(back, s, ds, gate, GATED, BK, BH)


@triton.jit
def _causal(C, idx, pos, u, h, d1, d2):
    """The read-out's sums Σ_i C[t, i] (·) over the keys i ≤ t only, a later key's NaN kept out of row t (0 · NaN in the
    plain product; ``atlas_lab.memory.ops.causal``): (C', u', h', δ1', δ2'), the rows of a key whose u, h or δ is
    non-finite zeroed, C' NaN at (t, i ≤ t) for such a key i, 0 above. Finite keys: the operands unchanged."""
    bad = (tl.max(((u - u) != 0).to(tl.int32), axis=1) + tl.max(((h - h) != 0).to(tl.int32), axis=1)
           + tl.max(((d1 - d1) != 0).to(tl.int32), axis=1) + tl.max(((d2 - d2) != 0).to(tl.int32), axis=1)) > 0
    causal = idx[None, :] <= pos[:, None]
    C = tl.where(causal & (bad == 0)[None, :], C, tl.where(causal, float("nan"), 0.0))
    return (C, tl.where(bad[:, None], 0.0, u), tl.where(bad[:, None], 0.0, h), tl.where(bad[:, None], 0.0, d1),
            tl.where(bad[:, None], 0.0, d2))


@triton.jit
def _factors_back(gd1, gd2, gh, gu, u, h, s, ds, dds, g, d2, back, E1, E2, L2: tl.constexpr, GATED: tl.constexpr,
                  BK: tl.constexpr, BH: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    """``_factors`` backward, from ∂δ1 [BK, BH1], ∂δ2, ∂h, ∂u [BK, ·] of the chunk's other uses: (∂δ2 in all — ∂v =
    −∂δ2 —, ∂u in all, ∂W̃1, ∂W̃2), through δ1 (``_factors``), δ2 = W̃2 h − v (l2), h (``_hidden``), z = W̃1 u."""
    if GATED:
        ga, gb = _halves(gd1, BK, BH)
        gback = ga * g * ds + gb * s
    else:
        gback = gd1 * ds
    gd2 += dot(gback, tl.trans(E2), DT, PREC)
    dE2 = dot(tl.trans(d2), gback, DT, PREC)
    if L2:
        gh += dot(gd2, E2, DT, PREC)
        dE2 += dot(tl.trans(gd2), h, DT, PREC)
    if GATED:
        gz = _joined((gh * g + gb * back) * ds + ga * back * g * dds, gh * s + ga * back * ds, BK, BH)
    else:
        gz = gh * ds + gd1 * back * dds
    gu += dot(gz, E1, DT, PREC)
    return gd2, gu, dot(tl.trans(gz), u, DT, PREC), dE2


# ---------------------------------------------------------------- the forward walk

@triton.jit(do_not_specialize=["T", "L", "m0", "offset", "b", "c", "NC"])
def chunk_mlp_memory_fwd_kernel(Q, K, V, GAMMA, A, M, S, CW, CS, W10, W20, S10, S20, WE10, WE20,
                                Y, W1T, W2T, S1T, S2T, WE1T, WE2T, W1H, W2H, S1H, S2H,
                                T, L, m0, offset, b, c, NC,
                                D: tl.constexpr, HD: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr,
                                BK: tl.constexpr, BD: tl.constexpr, BH: tl.constexpr, BV: tl.constexpr,
                                MOMENTUM: tl.constexpr, L2: tl.constexpr, ACT: tl.constexpr, EVAL: tl.constexpr,
                                GATED: tl.constexpr, HD1: tl.constexpr, BH1: tl.constexpr, DT: tl.constexpr,
                                PREC: tl.constexpr):
    i_n = tl.program_id(0)
    offs_t, offs_k = tl.arange(0, BT), tl.arange(0, BK)
    offs_d, offs_h, offs_v = tl.arange(0, BD), tl.arange(0, BH), tl.arange(0, BV)
    offs_h1 = tl.arange(0, BH1)  # the first layer's rows (gated: the gate's block, then the value's)
    Q, A, M, S, CW, CS, Y = Q + i_n * T * D, A + i_n * T, M + i_n * T, S + i_n * T, CW + i_n * T * b, \
        CS + i_n * T * b, Y + i_n * T * DV
    K, V, GAMMA = K + i_n * L * D, V + i_n * L * DV, GAMMA + i_n * L
    W1 = _load1(W10 + i_n * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)
    W2 = _load_state(W20 + i_n * DV * HD, offs_v, offs_h, DV, HD)
    E1, E2 = W1, W2
    if EVAL:  # the first chunk continues one: its gradients at the given W̃
        E1 = _load1(WE10 + i_n * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)
        E2 = _load_state(WE20 + i_n * DV * HD, offs_v, offs_h, DV, HD)
    S1, S2 = W1 * 0.0, W2 * 0.0
    if MOMENTUM:
        S1 = _load1(S10 + i_n * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)
        S2 = _load_state(S20 + i_n * DV * HD, offs_v, offs_h, DV, HD)
    for ci in range(NC):
        at = i_n * NC + ci
        _store1(W1H + at * HD1 * D, W1, offs_h1, offs_d, HD, D, BH, GATED)  # the checkpoints the backward takes
        _store_state(W2H + at * DV * HD, W2, offs_v, offs_h, DV, HD)
        if MOMENTUM:
            _store1(S1H + at * HD1 * D, S1, offs_h1, offs_d, HD, D, BH, GATED)
            _store_state(S2H + at * DV * HD, S2, offs_v, offs_h, DV, HD)
        t0, n = _chunk(ci, b, offset, T)
        rows = t0 + offs_t
        rmask = offs_t < n
        last = offs_t == n - 1
        idx, kmask, band, gam, u, h, sg, dsg, ddsg, gate, d2, back, d1 = _factors(
            K, V, GAMMA, E1, E2, t0, n, m0, c, offs_t, offs_k, offs_d, offs_h, offs_v, D, DV, L2, ACT, GATED, BK, BH,
            DT, PREC)
        cw = tl.load(CW + rows[:, None] * b + offs_t[None, :], mask=rmask[:, None] & rmask[None, :], other=0.0)
        C = dot(cw, gam, DT, PREC)  # [BT, BK]
        a = tl.load(A + rows, mask=rmask, other=0.0).to(tl.float32)
        uq = _rows(Q, rows, rmask, offs_d, D)
        C_y, u_y, h_y, d1_y, d2_y = _causal(C, idx, m0 + t0 + offs_t, u, h, d1, d2)
        zq = a[:, None] * dot(uq, tl.trans(W1), DT, PREC) + dot(C_y * dot(uq, tl.trans(u_y), DT, PREC), d1_y, DT,
                                                                 PREC)
        if MOMENTUM:
            m = tl.load(M + rows, mask=rmask, other=0.0).to(tl.float32)
            zq += m[:, None] * dot(uq, tl.trans(S1), DT, PREC)
        hq, _, _, _, _ = _hidden(zq, ACT, GATED, BT, BH)
        y = a[:, None] * dot(hq, tl.trans(W2), DT, PREC) + dot(C_y * dot(hq, tl.trans(h_y), DT, PREC), d2_y, DT,
                                                                PREC)
        if MOMENTUM:
            y += m[:, None] * dot(hq, tl.trans(S2), DT, PREC)
        _store_state(Y + t0 * DV, y, offs_t, offs_v, n, DV)
        c_n = _last(C, last)  # [BK]
        a_n = tl.sum(tl.where(last, a, 0.0))
        W1n = a_n * W1 + dot(tl.trans(d1 * c_n[:, None]), u, DT, PREC)
        W2n = a_n * W2 + dot(tl.trans(d2 * c_n[:, None]), h, DT, PREC)
        if MOMENTUM:
            m_n = tl.sum(tl.where(last, m, 0.0))
            s_n = tl.sum(tl.where(last, tl.load(S + rows, mask=rmask, other=0.0).to(tl.float32), 0.0))
            cs = tl.load(CS + rows[:, None] * b + offs_t[None, :], mask=rmask[:, None] & rmask[None, :], other=0.0)
            cs_n = _last(dot(cs, gam, DT, PREC), last)
            W1n += m_n * S1
            W2n += m_n * S2
            S1 = s_n * S1 + dot(tl.trans(d1 * cs_n[:, None]), u, DT, PREC)
            S2 = s_n * S2 + dot(tl.trans(d2 * cs_n[:, None]), h, DT, PREC)
        _store1(WE1T + i_n * HD1 * D, E1, offs_h1, offs_d, HD, D, BH, GATED)  # W̃ of the last chunk (continued)
        _store_state(WE2T + i_n * DV * HD, E2, offs_v, offs_h, DV, HD)
        W1, W2 = W1n, W2n
        E1, E2 = W1, W2
    _store1(W1T + i_n * HD1 * D, W1, offs_h1, offs_d, HD, D, BH, GATED)
    _store_state(W2T + i_n * DV * HD, W2, offs_v, offs_h, DV, HD)
    if MOMENTUM:
        _store1(S1T + i_n * HD1 * D, S1, offs_h1, offs_d, HD, D, BH, GATED)
        _store_state(S2T + i_n * DV * HD, S2, offs_v, offs_h, DV, HD)


# ---------------------------------------------------------------- the backward walk

@triton.jit(do_not_specialize=["T", "L", "m0", "offset", "b", "c", "NC"])
def chunk_mlp_memory_bwd_kernel(Q, K, V, GAMMA, A, M, S, CW, CS, WE10, WE20, W1H, W2H, S1H, S2H, DY,
                                GW1, GW2, GS1, GS2, GE1, GE2,
                                DQ, DK, DVV, DGAMMA, DA, DM, DS, DCW, DCS, DW10, DW20, DS10, DS20, DWE10, DWE20,
                                T, L, m0, offset, b, c, NC,
                                D: tl.constexpr, HD: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr,
                                BK: tl.constexpr, BD: tl.constexpr, BH: tl.constexpr, BV: tl.constexpr,
                                MOMENTUM: tl.constexpr, L2: tl.constexpr, ACT: tl.constexpr, EVAL: tl.constexpr,
                                GATED: tl.constexpr, HD1: tl.constexpr, BH1: tl.constexpr, DT: tl.constexpr,
                                PREC: tl.constexpr):
    i_n = tl.program_id(0)
    offs_t, offs_k = tl.arange(0, BT), tl.arange(0, BK)
    offs_d, offs_h, offs_v = tl.arange(0, BD), tl.arange(0, BH), tl.arange(0, BV)
    offs_h1 = tl.arange(0, BH1)  # the first layer's rows (gated: the gate's block, then the value's)
    Q, A, M, S, CW, CS, DY = Q + i_n * T * D, A + i_n * T, M + i_n * T, S + i_n * T, CW + i_n * T * b, \
        CS + i_n * T * b, DY + i_n * T * DV
    DQ, DA, DM, DS, DCW, DCS = DQ + i_n * T * D, DA + i_n * T, DM + i_n * T, DS + i_n * T, DCW + i_n * T * b, \
        DCS + i_n * T * b
    K, V, GAMMA = K + i_n * L * D, V + i_n * L * DV, GAMMA + i_n * L
    DK, DVV, DGAMMA = DK + i_n * L * D, DVV + i_n * L * DV, DGAMMA + i_n * L
    G1 = _load1(GW1 + i_n * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)  # ∂L/∂W_end of the chunk being walked
    G2 = _load_state(GW2 + i_n * DV * HD, offs_v, offs_h, DV, HD)
    H1, H2 = G1 * 0.0, G2 * 0.0  # ∂L/∂S_end
    if MOMENTUM:
        H1 = _load1(GS1 + i_n * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)
        H2 = _load_state(GS2 + i_n * DV * HD, offs_v, offs_h, DV, HD)
    X1 = _load1(GE1 + i_n * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)  # ∂L/∂W̃ of the last chunk (its output)
    X2 = _load_state(GE2 + i_n * DV * HD, offs_v, offs_h, DV, HD)
    for cj in range(NC):
        ci = NC - 1 - cj
        at = i_n * NC + ci
        W1 = _load1(W1H + at * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)
        W2 = _load_state(W2H + at * DV * HD, offs_v, offs_h, DV, HD)
        E1, E2 = W1, W2
        if EVAL:
            if ci == 0:
                E1 = _load1(WE10 + i_n * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)
                E2 = _load_state(WE20 + i_n * DV * HD, offs_v, offs_h, DV, HD)
        t0, n = _chunk(ci, b, offset, T)
        rows = t0 + offs_t
        rmask = offs_t < n
        last = offs_t == n - 1
        cmask = rmask[:, None] & rmask[None, :]
        idx, kmask, band, gam, u, h, sg, dsg, ddsg, gate, d2, back, d1 = _factors(
            K, V, GAMMA, E1, E2, t0, n, m0, c, offs_t, offs_k, offs_d, offs_h, offs_v, D, DV, L2, ACT, GATED, BK, BH,
            DT, PREC)
        cw = tl.load(CW + rows[:, None] * b + offs_t[None, :], mask=cmask, other=0.0)
        C = dot(cw, gam, DT, PREC)
        a = tl.load(A + rows, mask=rmask, other=0.0).to(tl.float32)
        a_n = tl.sum(tl.where(last, a, 0.0))
        c_n = _last(C, last)
        causal = idx[None, :] <= (m0 + t0 + offs_t)[:, None]
        Cr = tl.where(causal, C, 0.0)  # the read-out's C: keys i ≤ t (the forward's _causal, for finite keys)
        uq = _rows(Q, rows, rmask, offs_d, D)
        P1 = dot(uq, tl.trans(u), DT, PREC)
        zq = a[:, None] * dot(uq, tl.trans(W1), DT, PREC) + dot(Cr * P1, d1, DT, PREC)
        if MOMENTUM:
            S1 = _load1(S1H + at * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)
            S2 = _load_state(S2H + at * DV * HD, offs_v, offs_h, DV, HD)
            m = tl.load(M + rows, mask=rmask, other=0.0).to(tl.float32)
            m_n = tl.sum(tl.where(last, m, 0.0))
            s_n = tl.sum(tl.where(last, tl.load(S + rows, mask=rmask, other=0.0).to(tl.float32), 0.0))
            cs = tl.load(CS + rows[:, None] * b + offs_t[None, :], mask=cmask, other=0.0)
            cs_n = _last(dot(cs, gam, DT, PREC), last)
            zq += m[:, None] * dot(uq, tl.trans(S1), DT, PREC)
        hq, sq, dsq, _, gq = _hidden(zq, ACT, GATED, BT, BH)
        P2 = dot(hq, tl.trans(h), DT, PREC)
        dy = _rows(DY, rows, rmask, offs_v, DV)
        # the read-out's second layer: y = a W2 hq + m S2 hq + (C ⊙ P2) δ2
        E2y = dot(dy, tl.trans(d2), DT, PREC)
        ghq = a[:, None] * dot(dy, W2, DT, PREC) + dot(Cr * E2y, h, DT, PREC)
        da = tl.sum(dy * dot(hq, tl.trans(W2), DT, PREC), axis=1)
        dW2 = dot(tl.trans(dy * a[:, None]), hq, DT, PREC)
        dC = tl.where(causal, E2y * P2, 0.0)
        gh = dot(tl.trans(Cr * E2y), hq, DT, PREC)
        gd2 = dot(tl.trans(Cr * P2), dy, DT, PREC)
        if MOMENTUM:
            ghq += m[:, None] * dot(dy, S2, DT, PREC)
            dm = tl.sum(dy * dot(hq, tl.trans(S2), DT, PREC), axis=1)
            dS2 = dot(tl.trans(dy * m[:, None]), hq, DT, PREC)
        # its first layer: zq = a W1 uq + m S1 uq + (C ⊙ P1) δ1
        gzq = _hidden_back(ghq, sq, dsq, gq, GATED, BT, BH)
        E1y = dot(gzq, tl.trans(d1), DT, PREC)
        duq = a[:, None] * dot(gzq, W1, DT, PREC) + dot(Cr * E1y, u, DT, PREC)
        da += tl.sum(gzq * dot(uq, tl.trans(W1), DT, PREC), axis=1)
        dW1 = dot(tl.trans(gzq * a[:, None]), uq, DT, PREC)
        dC += tl.where(causal, E1y * P1, 0.0)
        gu = dot(tl.trans(Cr * E1y), uq, DT, PREC)
        gd1 = dot(tl.trans(Cr * P1), gzq, DT, PREC)
        if MOMENTUM:
            duq += m[:, None] * dot(gzq, S1, DT, PREC)
            dm += tl.sum(gzq * dot(uq, tl.trans(S1), DT, PREC), axis=1)
            dS1 = dot(tl.trans(gzq * m[:, None]), uq, DT, PREC)
        # the end states: W_end = a_n W_p + m_n S_p + Σ c_i ∇ℓ_i, S_end = s_n S_p + Σ c'_i ∇ℓ_i
        da += tl.where(last, tl.sum(G1 * W1) + tl.sum(G2 * W2), 0.0)
        dW1 += a_n * G1
        dW2 += a_n * G2
        uG1 = dot(u, tl.trans(G1), DT, PREC)  # [BK, BH]
        hG2 = dot(h, tl.trans(G2), DT, PREC)  # [BK, BV]
        gd1 += c_n[:, None] * uG1
        gu += c_n[:, None] * dot(d1, G1, DT, PREC)
        gd2 += c_n[:, None] * hG2
        gh += c_n[:, None] * dot(d2, G2, DT, PREC)
        dc = tl.sum(d1 * uG1, axis=1) + tl.sum(d2 * hG2, axis=1)
        dC += tl.where(last[:, None], dc[None, :], 0.0)
        dgam = dot(tl.trans(cw), dC, DT, PREC)
        dcw = dot(dC, tl.trans(gam), DT, PREC)
        if MOMENTUM:
            dm += tl.where(last, tl.sum(G1 * S1) + tl.sum(G2 * S2), 0.0)
            ds = tl.where(last, tl.sum(H1 * S1) + tl.sum(H2 * S2), 0.0)
            dS1 += m_n * G1 + s_n * H1
            dS2 += m_n * G2 + s_n * H2
            uH1 = dot(u, tl.trans(H1), DT, PREC)
            hH2 = dot(h, tl.trans(H2), DT, PREC)
            gd1 += cs_n[:, None] * uH1
            gu += cs_n[:, None] * dot(d1, H1, DT, PREC)
            gd2 += cs_n[:, None] * hH2
            gh += cs_n[:, None] * dot(d2, H2, DT, PREC)
            dCs = tl.where(last[:, None], (tl.sum(d1 * uH1, axis=1) + tl.sum(d2 * hH2, axis=1))[None, :], 0.0)
            dgam += dot(tl.trans(cs), dCs, DT, PREC)
            dcs = dot(dCs, tl.trans(gam), DT, PREC)
        gd2, gu, dE1, dE2 = _factors_back(gd1, gd2, gh, gu, u, h, sg, dsg, ddsg, gate, d2, back, E1, E2, L2, GATED,
                                          BK, BH, DT, PREC)
        if cj == 0:  # the last chunk's W̃ is an output too
            dE1 += X1
            dE2 += X2
        _key_grads(DK, DVV, DGAMMA, idx, kmask, band, gu, gd2, dgam, offs_d, offs_v, D, DV)
        _store_state(DQ + t0 * D, duq, offs_t, offs_d, n, D)
        tl.store(DA + rows, da, mask=rmask)
        tl.store(DCW + rows[:, None] * b + offs_t[None, :], dcw, mask=cmask)
        if MOMENTUM:
            tl.store(DM + rows, dm, mask=rmask)
            tl.store(DS + rows, ds, mask=rmask)
            tl.store(DCS + rows[:, None] * b + offs_t[None, :], dcs, mask=cmask)
            H1, H2 = dS1, dS2
        G1, G2 = dW1 + dE1, dW2 + dE2
        if EVAL:  # the first chunk's W̃ is the input We, not W_p
            if ci == 0:
                _store1(DWE10 + i_n * HD1 * D, dE1, offs_h1, offs_d, HD, D, BH, GATED)
                _store_state(DWE20 + i_n * DV * HD, dE2, offs_v, offs_h, DV, HD)
                G1, G2 = dW1, dW2
    _store1(DW10 + i_n * HD1 * D, G1, offs_h1, offs_d, HD, D, BH, GATED)
    _store_state(DW20 + i_n * DV * HD, G2, offs_v, offs_h, DV, HD)
    if MOMENTUM:
        _store1(DS10 + i_n * HD1 * D, H1, offs_h1, offs_d, HD, D, BH, GATED)
        _store_state(DS20 + i_n * DV * HD, H2, offs_v, offs_h, DV, HD)


# ---------------------------------------------------------------- launches

def _config(D, HD, DV, b, window):
    """Block sizes and launch options: BT a chunk's tokens, BK its window's keys (b + c − 1), BD, BH, BV all
    features, hidden units and values (the weights stay whole on chip: one program per sequence)."""
    p2 = triton.next_power_of_2
    BD, BH = max(16, p2(D)), max(16, p2(HD))
    return dict(BT=max(16, p2(b)), BK=max(16, p2(b + window - 1)), BD=BD, BH=BH, BV=max(16, p2(DV)),
                num_warps=4 if BH * BD <= 4096 else 8, num_stages=1)


def launches(N, T, D, HD, DV, *, chunk_size, window, bias="l2", momentum=True, offset=0, gated=False):
    """Each launch of a forward and backward call: {kernel: (grid, programs, dot FLOPs)} for N sequences of T new
    tokens, D features, HD hidden units (a gated first layer: 2·HD rows), d_v = DV. FLOPs as the tensor cores take
    them: 2·m·n·k of every ``tl.dot`` at its blocks' sizes (``_config``: BT a chunk's rows, BK its window's keys, BD,
    BH, BV; BH1 the first layer's rows), the same for every chunk, a partial one too."""
    cfg = _config(D, HD, DV, chunk_size, window)
    mom, l2, n, k, D, H, V = int(momentum), int(bias == "l2"), cfg["BT"], cfg["BK"], cfg["BD"], cfg["BH"], cfg["BV"]
    H1 = H * (1 + int(gated))  # the first layer's rows
    factors = k * H1 * D + (1 + l2) * k * V * H  # z = U W̃1ᵀ, W̃2 h (l2), W̃2ᵀ δ2
    mixing = (1 + mom) * n * n * k  # C (and C')
    read = (1 + mom) * n * (H1 * D + V * H) + n * k * (D + H1) + n * k * (H + V)
    ends = (1 + mom) * k * (H1 * D + V * H)
    recomputed = factors + mixing + (1 + mom) * n * H1 * D + n * k * (D + H1) + n * k * H
    read_back = n * k * (2 * V + 2 * H + 2 * H1 + 2 * D) + 3 * (1 + mom) * n * (V * H + H1 * D)
    factors_back = 2 * (1 + l2) * k * H * V + 2 * k * H1 * D
    NC = chunk_count(T, chunk_size, offset)
    fwd, bwd = NC * 2 * (factors + mixing + read + ends), \
        NC * 2 * (recomputed + read_back + 2 * ends + 2 * mixing + factors_back)
    return {"chunk_mlp_memory_fwd_kernel": ((N,), N, N * fwd), "chunk_mlp_memory_bwd_kernel": ((N,), N, N * bwd)}


def launch_options(D, HD, DV, chunk_size, window, bias, momentum, activation, dtype, evaluated, prec=None,
                   gated=False) -> dict:
    """The constexprs, num_warps and num_stages of both launches of one call (gated: a gated first layer)."""
    cfg = _config(D, HD, DV, chunk_size, window)
    BH1 = cfg["BH"] * (1 + int(gated))
    return dict(D=D, HD=HD, DV=DV, BT=cfg["BT"], BK=cfg["BK"], BD=cfg["BD"], BH=cfg["BH"], BV=cfg["BV"],
                MOMENTUM=momentum, L2=bias == "l2", ACT=ACTS.index(activation), EVAL=evaluated, GATED=gated,
                HD1=HD * (1 + int(gated)), BH1=BH1, DT=DTYPES[dtype],
                PREC=dot_precision(dtype) if prec is None else prec,
                num_warps=4 if BH1 * cfg["BD"] <= 4096 else 8, num_stages=cfg["num_stages"])


class ChunkMLPMemoryFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, gamma, a, m, s, Cw, Cs, W1, W2, S1, S2, We1, We2, offset, chunk_size, window, bias,
                activation, momentum, evaluated, gated):
        N, T, D = q.shape
        L, DV, HD = k.shape[1], v.shape[-1], W2.shape[-1]
        m0, NC = L - T, chunk_count(T, chunk_size, offset)
        opts = launch_options(D, HD, DV, chunk_size, window, bias, momentum, activation, q.dtype, evaluated,
                              gated=gated)
        f32 = dict(dtype=torch.float32, device=q.device)
        W1H, W2H = torch.empty(N, NC, W1.shape[1], D, **f32), torch.empty(N, NC, DV, HD, **f32)
        S1H, S2H = (torch.empty_like(W1H), torch.empty_like(W2H)) if momentum else (W1H, W2H)
        y = torch.empty(N, T, DV, dtype=q.dtype, device=q.device)
        W1T, W2T, WE1, WE2 = (torch.empty_like(x) for x in (W1, W2, W1, W2))
        S1T, S2T = torch.empty_like(S1), torch.empty_like(S2)
        chunk_mlp_memory_fwd_kernel[(N,)](
            q, k, v, gamma, a, m, s, Cw, Cs, W1, W2, S1, S2, We1, We2, y, W1T, W2T, S1T, S2T, WE1, WE2,
            W1H, W2H, S1H, S2H, T, L, m0, offset, chunk_size, window, NC, **opts)
        ctx.save_for_backward(q, k, v, gamma, a, m, s, Cw, Cs, We1, We2, W1H, W2H, S1H, S2H)
        ctx.args = (offset, chunk_size, window, momentum, evaluated, NC, opts)
        return y, W1T, W2T, S1T, S2T, WE1, WE2

    @staticmethod
    def backward(ctx, dy, dW1T, dW2T, dS1T, dS2T, dWE1, dWE2):
        q, k, v, gamma, a, m, s, Cw, Cs, We1, We2, W1H, W2H, S1H, S2H = ctx.saved_tensors
        offset, chunk_size, window, momentum, evaluated, NC, opts = ctx.args
        N, T, D = q.shape
        L, DV = k.shape[1], v.shape[-1]
        f32 = dict(dtype=torch.float32, device=q.device)

        def given(x, like):  # an output without a gradient: zeros
            return torch.zeros(like.shape, **f32) if x is None else x.float().contiguous()

        G = [given(x, like) for x, like in ((dW1T, We1), (dW2T, We2), (dS1T, We1), (dS2T, We2), (dWE1, We1),
                                            (dWE2, We2))]
        dq, dk, dv = torch.empty(N, T, D, **f32), torch.zeros(N, L, D, **f32), torch.zeros(N, L, DV, **f32)
        dgamma, da, dm, ds = torch.zeros(N, L, **f32), torch.empty(N, T, **f32), torch.zeros(N, T, **f32), \
            torch.zeros(N, T, **f32)
        dCw, dCs = torch.zeros(N, T, chunk_size, **f32), torch.zeros(N, T, chunk_size, **f32)
        dW = [torch.empty(x.shape, **f32) for x in (We1, We2, We1, We2, We1, We2)]
        chunk_mlp_memory_bwd_kernel[(N,)](
            q, k, v, gamma, a, m, s, Cw, Cs, We1, We2, W1H, W2H, S1H, S2H, dy.to(q.dtype).contiguous(), *G,
            dq, dk, dv, dgamma, da, dm, ds, dCw, dCs, *dW, T, L, L - T, offset, chunk_size, window, NC, **opts)
        dW1, dW2, dS1, dS2, dWe1, dWe2 = dW
        like = a.dtype
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dgamma.to(gamma.dtype), da.to(like),
                dm.to(like) if momentum else None, ds.to(like) if momentum else None, dCw.to(like),
                dCs.to(like) if momentum else None, dW1.to(We1.dtype), dW2.to(We2.dtype),
                dS1.to(We1.dtype) if momentum else None, dS2.to(We2.dtype) if momentum else None,
                dWe1.to(We1.dtype) if evaluated else None, dWe2.to(We2.dtype) if evaluated else None,
                None, None, None, None, None, None, None, None)


@torch.compiler.disable  # a compiled graph calls it as it is (a graph break): its launches are fused already
def chunk_mlp_memory(q, k, v, gamma, a, Cw, W1, W2, We1, We2, *, offset, chunk_size, window, bias, activation,
                     m=None, s=None, Cs=None, S1=None, S2=None, gated=False):
    """A 2-layer MLP memory over T new tokens in one forward and one backward launch (the module docstring); gated:
    the first layer a gated pair, W1 [N, 2H, D] the gate's H rows then the value's, h = σ(W1_a u) ⊙ W1_b u.

    q: φ(q) [N, T, D]; k: φ(k) [N, L, D] and v [N, L, d_v] (less the residual r(k) with l2) for the window cache
    followed by the new tokens; gamma [N, L]; a [N, T], Cw [N, T, b]: per-token rows of each chunk's closed form
    (column j = the chunk's j-th token), with m, s [N, T], Cs [N, T, b] and the momenta S1, S2 for momentum.
    W1 [N, H, D], W2 [N, d_v, H]: the weights at the start; We1, We2: W̃ of the first chunk (pass W1, W2 unless
    ``offset`` > 0); window: c (≥ 1); activation: one of ACTS. Returns (y [N, T, d_v] without the residual, W1_T,
    W2_T, S1_T, S2_T (None without momentum), W̃1, W̃2 of the last chunk).
    """
    momentum = S1 is not None
    if not momentum:
        m = s = a
        Cs = Cw
        S1, S2 = W1, W2
    evaluated = offset > 0
    args = [x.contiguous() for x in (q, k, v, gamma, a, m, s, Cw, Cs, W1, W2, S1, S2, We1, We2)]
    y, W1T, W2T, S1T, S2T, WE1, WE2 = ChunkMLPMemoryFunction.apply(*args, offset, chunk_size, window, bias,
                                                                   activation, momentum, evaluated, gated)
    return y, W1T, W2T, (S1T if momentum else None), (S2T if momentum else None), WE1, WE2
