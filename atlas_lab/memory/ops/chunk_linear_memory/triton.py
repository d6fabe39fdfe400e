"""Chunked linear memory on the GPU: every chunk's own work in parallel, one light pass over chunk states
(docs/memory.md §3–§5).

Linear memory M_W(u) = W u, W: [d_v, D]; u = φ(k), queries φ(q) (the feature map is applied outside).
Chunk of n tokens starting at W_p (S_p for momentum), gradients at W̃ (= W_p, except for a chunk
that a previous call left partially consumed, whose W̃ is the input We0):

    δ_i = W̃ u_i − v_i (l2)  or  −v_i (dot)                     for the chunk's tokens and the c−1 before them
    Γ[t, i] = γ_i  if t−c < i ≤ t  else 0                       (c = window; global: every past token)
    C = Cw Γ,  C' = Cs Γ                                        Cw, Cs: the optimiser's [n, n] closed forms
    y_t = a_t W_p u_q,t + m_t S_p u_q,t + Σ_i C[t, i] (u_q,t · u_i) δ_i
    W_end = a_n W_p + m_n S_p + Σ_i C[n, i] δ_i u_iᵀ,   S_end = s_n S_p + Σ_i C'[n, i] δ_i u_iᵀ

(a, m, s, Cw, Cs from ``atlas_lab.memory.optimizers.chunk_coefficients``; gd has no m, s, Cs.)

**The state recurrence.** Write c = C[n, ·] and c' = C'[n, ·] (the last rows, over the chunk's window keys) and
split δ_i = W̃ u_i − v_i into its state part and the rest:

    W_end = a_n W_p + m_n S_p + B + (W̃ Uᵀ ⊙ c) U,     B  = −Σ_i c_i v_i u_iᵀ
    S_end = s_n S_p + B' + (W̃ Uᵀ ⊙ c') U,              B' = −Σ_i c'_i v_i u_iᵀ

(the (W̃ Uᵀ ⊙ c) U terms only with l2; R ⊙ c scales column i of R = W̃ Uᵀ [d_v, keys] by c_i). B, B' depend on
the chunk's inputs alone; only the state part walks the chunks in order, and with the dot bias the walk is
element-wise. The gradients walk back the same way: with G = ∂L/∂W_end, G' = ∂L/∂S_end of a chunk,

    ∂L/∂W_p = a_n G + E (+ ∂L/∂W̃ when W̃ = W_p),   ∂L/∂S_p = m_n G + s_n G' + E'
    ∂L/∂W̃  = F + (G Uᵀ ⊙ c) U + (G' Uᵀ ⊙ c') U       (l2; 0 with dot)
    E = Σ_t a_t dy_t u_q,tᵀ,  E' = Σ_t m_t dy_t u_q,tᵀ,  F = Σ_i (Σ_t C[t, i] (u_q,t · u_i) dy_t) u_iᵀ

(from y_t and W_end, S_end above: W_p enters y_t through a_t W_p u_q,t and the end states through a_n, m_n;
W̃ through δ_i, read by y_t with weight C[t, i] (u_q,t · u_i) and by the end states with c_i, c'_i). E, E', F are
the chunk's own; G, G' at every chunk end come from the walk, and then every input gradient of a chunk follows from
its start state and G, G' alone (the products of ``chunk_linear_memory_bwd_kernel``'s docstring).

**Launches** (``launches`` gives each one's grid and FLOPs), forward:

    1. chunk_state_contrib_kernel   (chunk, sequence, d_v tile × D tile)  B, B' of every chunk
    2. chunk_state_scan_kernel      (d_v tile [× D tile with dot], sequence)  the walk: every chunk's W_p, S_p
    3. chunk_linear_memory_fwd_kernel (chunk, sequence, d_v tile)      y of every chunk from its W_p, S_p, W̃

and backward: 4. chunk_grad_contrib_kernel (chunk, sequence, d_v tile): E, E', F of every chunk; 5.
chunk_grad_scan_kernel (d_v tile [× D tile], sequence): the reverse walk, every chunk's G, G' and the gradients of
the initial states; 6. chunk_linear_memory_bwd_kernel (chunk, sequence, d_v tile): the gradients of φ(q), φ(k), v,
γ and the coefficients (a, m, s, Cw, Cs — their gate gradients follow by autograd), those of tokens shared by
several windows (keys, values, γ) accumulated atomically. The walks keep a [d_v tile, D] state on chip and visit
the window's keys in blocks of BI, two products per block with l2 (W̃ Uᵀ, then (· ⊙ c) U); with a global window
(c = None) a chunk's window is every key before it, so their work grows with the square of T (as before).

**A token's non-finite key** reaches only the outputs at and after it (``atlas_lab.memory.ops.causal``): the read-out
products zero that key's u, δ and give NaN to C[t, i] at i ≤ t only; the states after its chunk are non-finite, and
so is every later output.

**Precision.** Every product is a ``tl.dot`` accumulating in fp32 over operands of the caller's dtype: bf16/fp16
inputs are multiplied as they are passed (fp32 intermediates — C, δ, the states — rounded to that dtype first, as
fla's kernels do); float32 on tensor cores in tf32 when torch allows it (``torch.get_float32_matmul_precision()`` is
"high" or "medium", e.g. ``torch.backends.cuda.matmul.allow_tf32 = True``), IEEE otherwise (the default "highest",
like torch's own fp32 matmul; and the backward read-out kernel at [64, 256] blocks, whose tf32 layouts do not fit a
block's shared memory: ``_config``). Element-wise arithmetic, states and gradients are fp32.
The same computation in plain PyTorch is ``naive.chunk_linear_memory_naive`` (next to this file).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..dots import DTYPES, dot, dot_precision

# The kernels compile once per block sizes, D, d_v, chunk size, bias, momentum and dtype; lengths, offsets and windows
# are runtime values (do_not_specialize: no recompilation for each length's divisibility by 16).

# ---------------------------------------------------------------- helpers

@triton.jit
def _chunk(ci, b, offset, T):
    """First token t0 and length n of chunk ci (the first one is b − offset tokens long)."""
    t0 = tl.maximum(ci * b - offset, 0)
    return t0, tl.minimum(ci * b - offset + b, T) - t0


@triton.jit
def _rows(X, idx, mask, offs, W):
    """X[idx, offs] of a row-major [·, W] tensor (0 outside), in its own dtype."""
    return tl.load(X + idx[:, None] * W + offs[None, :], mask=mask[:, None] & (offs < W)[None, :], other=0.0)


@triton.jit
def _load_state(P, offs_v, offs_d, DV, D):
    """A row-major [DV, D] matrix at P (0 outside), as fp32."""
    mask = (offs_v < DV)[:, None] & (offs_d < D)[None, :]
    return tl.load(P + offs_v[:, None] * D + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store_state(P, x, offs_v, offs_d, DV, D):
    """x into the rows < DV and columns < D of a row-major [·, D] matrix at P, in its dtype."""
    mask = (offs_v < DV)[:, None] & (offs_d < D)[None, :]
    tl.store(P + offs_v[:, None] * D + offs_d[None, :], x.to(P.dtype.element_ty), mask=mask)


@triton.jit
def _key_grads(DK, DVV, DGAMMA, idx, kmask, band, du, ddelta, dgam, offs_d, offs_v, D, DV):
    """A chunk's window keys' gradients added to those of the chunks that share them (``tl.atomic_add``): ∂φ(k) += du
    [keys, D], ∂v −= ∂δ [keys, DV], ∂γ += Σ_t ∂Γ[t, i] on the band."""
    tl.atomic_add(DK + idx[:, None] * D + offs_d[None, :], du, mask=kmask[:, None] & (offs_d < D)[None, :])
    tl.atomic_add(DVV + idx[:, None] * DV + offs_v[None, :], -ddelta, mask=kmask[:, None] & (offs_v < DV)[None, :])
    tl.atomic_add(DGAMMA + idx, tl.sum(tl.where(band, dgam, 0.0), axis=0), mask=kmask)


@triton.jit
def _band(GAMMA, i0, first, n, c, offs_t, offs_i):
    """Keys i0..i0+BI of a chunk's window: (key index, key mask, band [BT (chunk token), BI (key)], Γ on the band)."""
    idx = i0 + offs_i
    imask = idx < first + n
    g = tl.load(GAMMA + idx, mask=imask, other=0.0).to(tl.float32)
    pos = first + offs_t
    band = (idx[None, :] <= pos[:, None]) & (idx[None, :] > pos[:, None] - c) & (offs_t < n)[:, None] & imask[None, :]
    return idx, imask, band, tl.where(band, g[None, :], 0.0)


@triton.jit
def _window(K, V, GAMMA, We, cw, i0, first, n, c, offs_t, offs_i, offs_d, offs_v, D: tl.constexpr, DV: tl.constexpr,
            L2: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    """Keys i0..i0+BI of a chunk's window as the read-out and its gradient take them: ``_band``'s four (key index,
    key mask, band, Γ on the band), u [BI, D], δ [BI, DV] = W̃ u_i − v_i (l2) or −v_i (dot), C [BT, BI] = Cw Γ."""
    idx, imask, band, gam = _band(GAMMA, i0, first, n, c, offs_t, offs_i)
    u = _rows(K, idx, imask, offs_d, D)
    delta = -_rows(V, idx, imask, offs_v, DV).to(tl.float32)
    if L2:
        delta += dot(u, tl.trans(We), DT, PREC)
    return idx, imask, band, gam, u, delta, dot(cw, gam, DT, PREC)


@triton.jit
def _last_coefficients(C, t0, n, b, offs_t):
    """Row n − 1 of a chunk's closed form (Cw or Cs) over its tokens [BT], fp32."""
    return tl.load(C + (t0 + n - 1) * b + offs_t, mask=offs_t < n, other=0.0).to(tl.float32)


@triton.jit
def _causal_factors(C, u, delta, idx, pos):
    """The read-out's Σ_i C[t, i] (q_t·u_i) δ_i over the keys i ≤ t only, keeping a later key's NaN out of row t
    (0 · NaN in the plain product; ``atlas_lab.memory.ops.causal``). C [BT (chunk token t), BT (key i)], u [BT, BD],
    δ [BT, BV]. Returns (C', u', δ', kept, bad): bad[i] = key i's u or δ (this block of d_v) is non-finite; those
    rows of u, δ zeroed; C' = C where kept (i ≤ t and not bad[i]), NaN at i ≤ t with bad[i], 0 above."""
    bad = (tl.max(((u - u) != 0).to(tl.int32), axis=1) + tl.max(((delta - delta) != 0).to(tl.int32), axis=1)) > 0
    causal = idx[None, :] <= pos[:, None]
    kept = causal & (bad == 0)[None, :]
    C = tl.where(kept, C, tl.where(causal, float("nan"), 0.0))
    return C, tl.where(bad[:, None], 0.0, u), tl.where(bad[:, None], 0.0, delta), kept, bad


# ---------------------------------------------------------------- forward

@triton.jit(do_not_specialize=["T", "L", "m0", "offset", "c", "NK"])
def chunk_state_contrib_kernel(
    K, V, GAMMA, CW, CS, BW, BS,
    T, L, m0, offset, b, c, NK,
    D: tl.constexpr, DV: tl.constexpr, MOMENTUM: tl.constexpr,
    BT: tl.constexpr, BI: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):
    """Every chunk's state contribution from its inputs alone: BW = B = −Σ_i c_i v_i u_iᵀ (BS = B' with c'),
    [N, NC, DV, D]. Grid (chunk, sequence, d_v tile × D tile)."""
    ci, i_n, i_vk = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    NC = tl.num_programs(0)
    offs_t, offs_i = tl.arange(0, BT), tl.arange(0, BI)
    offs_v = (i_vk // NK) * BV + tl.arange(0, BV)
    offs_k = (i_vk % NK) * BK + tl.arange(0, BK)
    K, V, GAMMA = K + i_n * L * D, V + i_n * L * DV, GAMMA + i_n * L
    t0, n = _chunk(ci, b, offset, T)
    first = m0 + t0
    cw = _last_coefficients(CW + i_n * T * b, t0, n, b, offs_t)
    cs = _last_coefficients(CS + i_n * T * b, t0, n, b, offs_t)
    acc = tl.zeros([BV, BK], dtype=tl.float32)
    acc_s = tl.zeros([BV, BK], dtype=tl.float32)
    for i0 in range(tl.maximum(first - c + 1, 0), first + n, BI):
        idx, imask, band, gam = _band(GAMMA, i0, first, n, c, offs_t, offs_i)
        u = _rows(K, idx, imask, offs_k, D)
        v = _rows(V, idx, imask, offs_v, DV).to(tl.float32)
        acc -= dot(tl.trans(v * tl.sum(cw[:, None] * gam, axis=0)[:, None]), u, DT, PREC)
        if MOMENTUM:
            acc_s -= dot(tl.trans(v * tl.sum(cs[:, None] * gam, axis=0)[:, None]), u, DT, PREC)
    _store_state(BW + (i_n * NC + ci) * DV * D, acc, offs_v, offs_k, DV, D)
    if MOMENTUM:
        _store_state(BS + (i_n * NC + ci) * DV * D, acc_s, offs_v, offs_k, DV, D)


@triton.jit(do_not_specialize=["T", "L", "m0", "offset", "c", "NC"])
def chunk_state_scan_kernel(
    K, GAMMA, A, M, S, CW, CS, W0, S0, WE0, BW, BS,
    WT, ST, WE_OUT, WH, SH,
    T, L, m0, offset, b, c, NC,
    D: tl.constexpr, DV: tl.constexpr, L2: tl.constexpr, MOMENTUM: tl.constexpr,
    BT: tl.constexpr, BI: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):
    """The walk over chunk states: W_end = a_n W_p + m_n S_p + B + (W̃ Uᵀ ⊙ c) U, S_end = s_n S_p + B' +
    (W̃ Uᵀ ⊙ c') U. Stores every chunk's start states WH, SH [N, NC, DV, D], the final WT, ST and W̃ of the last
    chunk WE_OUT. Grid (d_v tile, D tile, sequence); with l2 one D tile covers every feature (BK ≥ D)."""
    i_v, i_k, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    offs_t, offs_i = tl.arange(0, BT), tl.arange(0, BI)
    offs_v = i_v * BV + tl.arange(0, BV)
    offs_k = i_k * BK + tl.arange(0, BK)
    K, GAMMA, A, M, S = K + i_n * L * D, GAMMA + i_n * L, A + i_n * T, M + i_n * T, S + i_n * T
    CW, CS = CW + i_n * T * b, CS + i_n * T * b
    W = _load_state(W0 + i_n * DV * D, offs_v, offs_k, DV, D)
    We = _load_state(WE0 + i_n * DV * D, offs_v, offs_k, DV, D)
    Sm = tl.zeros([BV, BK], dtype=tl.float32)
    if MOMENTUM:
        Sm = _load_state(S0 + i_n * DV * D, offs_v, offs_k, DV, D)
    for ci in range(NC):
        t0, n = _chunk(ci, b, offset, T)
        at = i_n * NC + ci
        _store_state(WH + at * DV * D, W, offs_v, offs_k, DV, D)
        if MOMENTUM:
            _store_state(SH + at * DV * D, Sm, offs_v, offs_k, DV, D)
        if ci == NC - 1:
            _store_state(WE_OUT + i_n * DV * D, We, offs_v, offs_k, DV, D)
        W_new = tl.load(A + t0 + n - 1).to(tl.float32) * W + _load_state(BW + at * DV * D, offs_v, offs_k, DV, D)
        S_new = Sm
        if MOMENTUM:
            W_new += tl.load(M + t0 + n - 1).to(tl.float32) * Sm
            S_new = tl.load(S + t0 + n - 1).to(tl.float32) * Sm + _load_state(BS + at * DV * D, offs_v, offs_k,
                                                                                DV, D)
        if L2:
            first = m0 + t0
            cw = _last_coefficients(CW, t0, n, b, offs_t)
            cs = _last_coefficients(CS, t0, n, b, offs_t)
            for i0 in range(tl.maximum(first - c + 1, 0), first + n, BI):
                idx, imask, band, gam = _band(GAMMA, i0, first, n, c, offs_t, offs_i)
                u = _rows(K, idx, imask, offs_k, D)
                R = dot(u, tl.trans(We), DT, PREC)  # [key, v]: W̃ u_i
                W_new += dot(tl.trans(R * tl.sum(cw[:, None] * gam, axis=0)[:, None]), u, DT, PREC)
                if MOMENTUM:
                    S_new += dot(tl.trans(R * tl.sum(cs[:, None] * gam, axis=0)[:, None]), u, DT, PREC)
        W, We, Sm = W_new, W_new, S_new
    _store_state(WT + i_n * DV * D, W, offs_v, offs_k, DV, D)
    if MOMENTUM:
        _store_state(ST + i_n * DV * D, Sm, offs_v, offs_k, DV, D)


@triton.jit(do_not_specialize=["T", "L", "m0", "offset", "c"])
def chunk_linear_memory_fwd_kernel(
    Q, K, V, GAMMA, A, M, CW, WE0, WH, SH, Y,
    T, L, m0, offset, b, c,
    D: tl.constexpr, DV: tl.constexpr, L2: tl.constexpr, MOMENTUM: tl.constexpr,
    BT: tl.constexpr, BI: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):
    """Every chunk's read-out from its start states (WH, SH from the walk; W̃ = WE0 for the first chunk):
    y_t = a_t W_p u_q,t + m_t S_p u_q,t + Σ_i C[t, i] (u_q,t · u_i) δ_i. Q [N, T, D]; K [N, L, D]; V [N, L, DV];
    GAMMA [N, L]; A, M [N, T]; CW [N, T, b] -> Y [N, T, DV]. Grid (chunk, sequence, d_v tile)."""
    ci, i_n, i_v = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    NC = tl.num_programs(0)
    offs_t, offs_i, offs_d = tl.arange(0, BT), tl.arange(0, BI), tl.arange(0, BD)
    offs_v = i_v * BV + tl.arange(0, BV)
    Q, Y, A, M, CW = Q + i_n * T * D, Y + i_n * T * DV, A + i_n * T, M + i_n * T, CW + i_n * T * b
    K, V, GAMMA = K + i_n * L * D, V + i_n * L * DV, GAMMA + i_n * L
    W = _load_state(WH + (i_n * NC + ci) * DV * D, offs_v, offs_d, DV, D)
    if ci == 0:
        We = _load_state(WE0 + i_n * DV * D, offs_v, offs_d, DV, D)
    else:
        We = W
    t0, n = _chunk(ci, b, offset, T)
    rows = t0 + offs_t
    rmask = offs_t < n
    q = _rows(Q, rows, rmask, offs_d, D)
    cw = tl.load(CW + rows[:, None] * b + offs_t[None, :], mask=rmask[:, None] & rmask[None, :], other=0.0)
    a = tl.load(A + rows, mask=rmask, other=0.0).to(tl.float32)
    y = a[:, None] * dot(q, tl.trans(W), DT, PREC)
    if MOMENTUM:
        Sm = _load_state(SH + (i_n * NC + ci) * DV * D, offs_v, offs_d, DV, D)
        m = tl.load(M + rows, mask=rmask, other=0.0).to(tl.float32)
        y += m[:, None] * dot(q, tl.trans(Sm), DT, PREC)
    first = m0 + t0
    for i0 in range(tl.maximum(first - c + 1, 0), first + n, BI):
        idx, _, _, _, u, delta, C = _window(K, V, GAMMA, We, cw, i0, first, n, c, offs_t, offs_i, offs_d, offs_v, D,
                                            DV, L2, DT, PREC)
        C_y, u_y, delta_y, _, _ = _causal_factors(C, u, delta, idx, first + offs_t)
        y += dot(C_y * dot(q, tl.trans(u_y), DT, PREC), delta_y, DT, PREC)
    tl.store(Y + rows[:, None] * DV + offs_v[None, :], y.to(Y.dtype.element_ty),
             mask=rmask[:, None] & (offs_v < DV)[None, :])


# ---------------------------------------------------------------- backward

@triton.jit(do_not_specialize=["T", "L", "m0", "offset", "c"])
def chunk_grad_contrib_kernel(
    Q, K, V, GAMMA, A, M, CW, WE0, WH, DY, ZE, ZF, ZS,
    T, L, m0, offset, b, c,
    D: tl.constexpr, DV: tl.constexpr, L2: tl.constexpr, MOMENTUM: tl.constexpr,
    BT: tl.constexpr, BI: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):
    """Every chunk's own share of the state gradients: ZE = E = Σ_t a_t dy_t u_q,tᵀ, ZS = E' (m_t), ZF = F =
    Σ_i (Σ_t C[t, i] (u_q,t · u_i) dy_t) u_iᵀ (l2; keys whose u or δ is non-finite left out, as in the read-out),
    [N, NC, DV, D]. Grid (chunk, sequence, d_v tile)."""
    ci, i_n, i_v = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    NC = tl.num_programs(0)
    offs_t, offs_i, offs_d = tl.arange(0, BT), tl.arange(0, BI), tl.arange(0, BD)
    offs_v = i_v * BV + tl.arange(0, BV)
    Q, DY, A, M, CW = Q + i_n * T * D, DY + i_n * T * DV, A + i_n * T, M + i_n * T, CW + i_n * T * b
    K, V, GAMMA = K + i_n * L * D, V + i_n * L * DV, GAMMA + i_n * L
    at = (i_n * NC + ci) * DV * D
    t0, n = _chunk(ci, b, offset, T)
    rows = t0 + offs_t
    rmask = offs_t < n
    q = _rows(Q, rows, rmask, offs_d, D)
    dy = _rows(DY, rows, rmask, offs_v, DV).to(tl.float32)
    a = tl.load(A + rows, mask=rmask, other=0.0).to(tl.float32)
    _store_state(ZE + at, dot(tl.trans(dy * a[:, None]), q, DT, PREC), offs_v, offs_d, DV, D)
    if MOMENTUM:
        m = tl.load(M + rows, mask=rmask, other=0.0).to(tl.float32)
        _store_state(ZS + at, dot(tl.trans(dy * m[:, None]), q, DT, PREC), offs_v, offs_d, DV, D)
    if L2:
        if ci == 0:
            We = _load_state(WE0 + i_n * DV * D, offs_v, offs_d, DV, D)
        else:
            We = _load_state(WH + at, offs_v, offs_d, DV, D)
        cw = tl.load(CW + rows[:, None] * b + offs_t[None, :], mask=rmask[:, None] & rmask[None, :], other=0.0)
        F = tl.zeros([BV, BD], dtype=tl.float32)
        first = m0 + t0
        for i0 in range(tl.maximum(first - c + 1, 0), first + n, BI):
            idx, imask, band, gam = _band(GAMMA, i0, first, n, c, offs_t, offs_i)
            u = _rows(K, idx, imask, offs_d, D)
            delta = dot(u, tl.trans(We), DT, PREC) - _rows(V, idx, imask, offs_v, DV).to(tl.float32)
            C_y, u_y, _, kept, bad = _causal_factors(dot(cw, gam, DT, PREC), u, delta, idx, first + offs_t)
            CP = tl.where(kept, C_y * dot(q, tl.trans(u_y), DT, PREC), 0.0)
            F += dot(tl.trans(dot(tl.trans(CP), dy, DT, PREC)), u_y, DT, PREC)
        _store_state(ZF + at, F, offs_v, offs_d, DV, D)


@triton.jit(do_not_specialize=["T", "L", "m0", "offset", "c", "NC"])
def chunk_grad_scan_kernel(
    K, GAMMA, A, M, S, CW, CS, ZE, ZF, ZS, DWT, DST, DWE_OUT,
    GH, GSH, DW0, DS0, DWE0,
    T, L, m0, offset, b, c, NC,
    D: tl.constexpr, DV: tl.constexpr, L2: tl.constexpr, MOMENTUM: tl.constexpr,
    BT: tl.constexpr, BI: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):
    """The reverse walk: from G = ∂L/∂W_end, G' = ∂L/∂S_end of the last chunk (DWT, DST; DWE_OUT = ∂L/∂W̃ of the
    last chunk) back to the first, storing every chunk's G, G' (GH, GSH [N, NC, DV, D]) and ∂L/∂W0, ∂L/∂S0,
    ∂L/∂We0. Grid (d_v tile, D tile, sequence); with l2 one D tile covers every feature (BK ≥ D)."""
    i_v, i_k, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    offs_t, offs_i = tl.arange(0, BT), tl.arange(0, BI)
    offs_v = i_v * BV + tl.arange(0, BV)
    offs_k = i_k * BK + tl.arange(0, BK)
    K, GAMMA, A, M, S = K + i_n * L * D, GAMMA + i_n * L, A + i_n * T, M + i_n * T, S + i_n * T
    CW, CS = CW + i_n * T * b, CS + i_n * T * b
    G = _load_state(DWT + i_n * DV * D, offs_v, offs_k, DV, D)
    Gs = tl.zeros([BV, BK], dtype=tl.float32)
    if MOMENTUM:
        Gs = _load_state(DST + i_n * DV * D, offs_v, offs_k, DV, D)
    dWe = _load_state(DWE_OUT + i_n * DV * D, offs_v, offs_k, DV, D)  # ∂L/∂W̃ of the last chunk, from outside
    dWp = tl.zeros([BV, BK], dtype=tl.float32)
    for cr in range(NC):
        ci = NC - 1 - cr
        t0, n = _chunk(ci, b, offset, T)
        at = i_n * NC + ci
        _store_state(GH + at * DV * D, G, offs_v, offs_k, DV, D)
        if MOMENTUM:
            _store_state(GSH + at * DV * D, Gs, offs_v, offs_k, DV, D)
        dWp = tl.load(A + t0 + n - 1).to(tl.float32) * G + _load_state(ZE + at * DV * D, offs_v, offs_k, DV, D)
        if L2:
            dWe += _load_state(ZF + at * DV * D, offs_v, offs_k, DV, D)
            first = m0 + t0
            cw = _last_coefficients(CW, t0, n, b, offs_t)
            cs = _last_coefficients(CS, t0, n, b, offs_t)
            for i0 in range(tl.maximum(first - c + 1, 0), first + n, BI):
                idx, imask, band, gam = _band(GAMMA, i0, first, n, c, offs_t, offs_i)
                u = _rows(K, idx, imask, offs_k, D)
                R = dot(u, tl.trans(G), DT, PREC) * tl.sum(cw[:, None] * gam, axis=0)[:, None]
                if MOMENTUM:
                    R += dot(u, tl.trans(Gs), DT, PREC) * tl.sum(cs[:, None] * gam, axis=0)[:, None]
                dWe += dot(tl.trans(R), u, DT, PREC)
        if MOMENTUM:
            Gs = (tl.load(M + t0 + n - 1).to(tl.float32) * G + tl.load(S + t0 + n - 1).to(tl.float32) * Gs
                  + _load_state(ZS + at * DV * D, offs_v, offs_k, DV, D))
        if ci > 0:  # W̃ of a later chunk is its W_p
            G = dWp + dWe
            dWe = tl.zeros([BV, BK], dtype=tl.float32)
    _store_state(DW0 + i_n * DV * D, dWp, offs_v, offs_k, DV, D)
    _store_state(DWE0 + i_n * DV * D, dWe, offs_v, offs_k, DV, D)
    if MOMENTUM:
        _store_state(DS0 + i_n * DV * D, Gs, offs_v, offs_k, DV, D)


@triton.jit(do_not_specialize=["N", "T", "L", "m0", "offset", "c"])
def chunk_linear_memory_bwd_kernel(
    Q, K, V, GAMMA, A, M, CW, CS, WE0, WH, SH, GH, GSH, DY,
    DQ, DK, DVV, DGAMMA, DA, DM, DS, DCW, DCS,
    N, T, L, m0, offset, b, c,
    D: tl.constexpr, DV: tl.constexpr, L2: tl.constexpr, MOMENTUM: tl.constexpr,
    BT: tl.constexpr, BI: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):
    """Every chunk's input gradients from its start states (WH, SH; W̃) and the gradients at its end (GH, GSH):
    with P = Q Uᵀ, D_y = dy δᵀ [t, i] and dW = G, dS = G',

        ∂q_t = a_t W_pᵀ dy_t + m_t S_pᵀ dy_t + Σ_i C[t, i] D_y[t, i] u_i
        ∂C[t, i] = D_y[t, i] P[t, i] + [t = n] δ_i · G u_i,   ∂C'[n, i] = δ_i · G' u_i
        ∂δ_i = Σ_t C[t, i] P[t, i] dy_t + c_i G u_i + c'_i G' u_i,   ∂v_i = −∂δ_i
        ∂u_i = Σ_t C[t, i] D_y[t, i] u_q,t + c_i Gᵀ δ_i + c'_i G'ᵀ δ_i (+ W̃ᵀ ∂δ_i with l2)
        ∂a_t = dy_t · W_p u_q,t + [t = n] ⟨G, W_p⟩,  ∂m_t = dy_t · S_p u_q,t + [t = n] ⟨G, S_p⟩,  ∂s_n = ⟨G', S_p⟩

    and ∂Cw = ∂C Γᵀ, ∂γ from ∂Γ = Cwᵀ ∂C + Csᵀ ∂C' on the band. Per d_v tile (leading NV dim, summed by the caller):
    DQ [NV, N, T, D]; DA, DM, DS [NV, N, T]; DCW, DCS [NV, N, T, b]. Accumulated atomically (zero on entry):
    DK [N, L, D], DVV [N, L, DV], DGAMMA [N, L]. Grid (chunk, sequence, d_v tile)."""
    ci, i_n, i_v = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    NC = tl.num_programs(0)
    offs_t, offs_i, offs_d = tl.arange(0, BT), tl.arange(0, BI), tl.arange(0, BD)
    offs_v = i_v * BV + tl.arange(0, BV)
    Q, DY, A, M = Q + i_n * T * D, DY + i_n * T * DV, A + i_n * T, M + i_n * T
    CW, CS = CW + i_n * T * b, CS + i_n * T * b
    K, V, GAMMA = K + i_n * L * D, V + i_n * L * DV, GAMMA + i_n * L
    DK, DVV, DGAMMA = DK + i_n * L * D, DVV + i_n * L * DV, DGAMMA + i_n * L
    part = i_v * N + i_n  # this program's slice of the per-d_v-tile outputs
    DQ, DA, DM, DS = DQ + part * T * D, DA + part * T, DM + part * T, DS + part * T
    DCW, DCS = DCW + part * T * b, DCS + part * T * b
    at = (i_n * NC + ci) * DV * D
    dW = _load_state(GH + at, offs_v, offs_d, DV, D)
    W = _load_state(WH + at, offs_v, offs_d, DV, D)
    if ci == 0:  # W̃ of the first chunk is an input (W0 itself unless a previous call began the chunk)
        We = _load_state(WE0 + i_n * DV * D, offs_v, offs_d, DV, D)
    else:
        We = W
    t0, n = _chunk(ci, b, offset, T)
    rows = t0 + offs_t
    rmask = offs_t < n
    last = offs_t == n - 1
    qmask = rmask[:, None] & (offs_d < D)[None, :]
    q = _rows(Q, rows, rmask, offs_d, D)
    dy = _rows(DY, rows, rmask, offs_v, DV).to(tl.float32)
    cmask = rmask[:, None] & rmask[None, :]
    cw = tl.load(CW + rows[:, None] * b + offs_t[None, :], mask=cmask, other=0.0)
    a = tl.load(A + rows, mask=rmask, other=0.0).to(tl.float32)
    # y_t ∋ a_t W_p u_q,t and W_end ∋ a_n W_p
    da = tl.sum(dy * dot(q, tl.trans(W), DT, PREC), axis=1) + tl.where(last, tl.sum(dW * W), 0.0)
    dq = a[:, None] * dot(dy, W, DT, PREC)
    if MOMENTUM:
        dSm = _load_state(GSH + at, offs_v, offs_d, DV, D)
        Sm = _load_state(SH + at, offs_v, offs_d, DV, D)
        cs = tl.load(CS + rows[:, None] * b + offs_t[None, :], mask=cmask, other=0.0)
        m = tl.load(M + rows, mask=rmask, other=0.0).to(tl.float32)
        dm = tl.sum(dy * dot(q, tl.trans(Sm), DT, PREC), axis=1) + tl.where(last, tl.sum(dW * Sm), 0.0)
        ds = tl.where(last, tl.sum(dSm * Sm), 0.0)
        dq += m[:, None] * dot(dy, Sm, DT, PREC)
        dcs = tl.zeros([BT, BT], dtype=tl.float32)
    dcw = tl.zeros([BT, BT], dtype=tl.float32)
    first = m0 + t0
    for i0 in range(tl.maximum(first - c + 1, 0), first + n, BI):
        idx, imask, band, gam, u, delta, C = _window(K, V, GAMMA, We, cw, i0, first, n, c, offs_t, offs_i, offs_d,
                                                      offs_v, D, DV, L2, DT, PREC)
        c_last = tl.sum(tl.where(last[:, None], C, 0.0), axis=0)
        C_y, u_y, delta_y, kept, bad = _causal_factors(C, u, delta, idx, first + offs_t)  # the read-out's
        P = dot(q, tl.trans(u_y), DT, PREC)
        dyd = dot(dy, tl.trans(delta_y), DT, PREC)  # [t, i]: dy_t · δ_i
        udW = dot(u, tl.trans(dW), DT, PREC)  # [i, v]: G u_i
        dC = tl.where(kept, dyd * P, 0.0) + tl.where(last[:, None], tl.sum(udW * delta, axis=1)[None, :], 0.0)
        ddelta = tl.where(bad[:, None], 0.0, dot(tl.trans(C_y * P), dy, DT, PREC))
        ddelta += c_last[:, None] * udW
        du = tl.where(bad[:, None], 0.0, dot(tl.trans(dyd * C_y), q, DT, PREC))
        du += c_last[:, None] * dot(delta, dW, DT, PREC)
        dq += dot(dyd * C_y, u_y, DT, PREC)
        dgam = dot(tl.trans(cw), dC, DT, PREC)
        dcw += dot(dC, tl.trans(gam), DT, PREC)
        if MOMENTUM:
            cs_last = tl.sum(tl.where(last[:, None], dot(cs, gam, DT, PREC), 0.0), axis=0)
            udS = dot(u, tl.trans(dSm), DT, PREC)
            dCs = tl.where(last[:, None], tl.sum(udS * delta, axis=1)[None, :], 0.0)
            ddelta += cs_last[:, None] * udS
            du += cs_last[:, None] * dot(delta, dSm, DT, PREC)
            dgam += dot(tl.trans(cs), dCs, DT, PREC)
            dcs += dot(dCs, tl.trans(gam), DT, PREC)
        if L2:  # δ = W̃ u − v
            du += dot(ddelta, We, DT, PREC)
        _key_grads(DK, DVV, DGAMMA, idx, imask, band, du, ddelta, dgam, offs_d, offs_v, D, DV)
    tl.store(DQ + rows[:, None] * D + offs_d[None, :], dq, mask=qmask)
    tl.store(DA + rows, da, mask=rmask)
    tl.store(DCW + rows[:, None] * b + offs_t[None, :], dcw, mask=cmask)
    if MOMENTUM:
        tl.store(DM + rows, dm, mask=rmask)
        tl.store(DS + rows, ds, mask=rmask)
        tl.store(DCS + rows[:, None] * b + offs_t[None, :], dcs, mask=cmask)


# ---------------------------------------------------------------- launches

def _config(D, DV, b, bias, prec="ieee"):
    """Block sizes and launch options. BT: a chunk's tokens; BI: a block of its window's keys; BD: all features; BV:
    the d_v tile of the chunk-parallel kernels (≤ 32: more programs, fewer registers); BVC × BK: the contribution
    kernel's tiles; BVS × BKS: the walks' (16 × all of D with l2, whose walk holds [16, D] states; BVC × BK with dot,
    whose walk is element-wise). Chosen by compiling every kernel for sm_90 without a GPU (triton.compile to a cubin,
    cuobjdump's register, spill and shared-memory counts; docs/performance.md §l) — not by timing:
    8 warps where a program holds [64, 64] blocks or more (4 spilled more), no software pipelining beyond that
    (num_stages 1), and the backward read-out kernel in IEEE fp32 at [64, 256] blocks (``bwd_prec``): its tf32
    operand layouts took 346 KB of shared memory there, over the 227 KB one block may use on an H100/H200."""
    BT = max(16, triton.next_power_of_2(b))
    BD = max(16, triton.next_power_of_2(D))
    BVC = max(16, min(triton.next_power_of_2(DV), 32))
    BK = min(BD, 64)
    return dict(BT=BT, BI=16, BD=BD, BV=max(16, min(triton.next_power_of_2(DV), 32, 4096 // BD)), BVC=BVC, BK=BK,
                BVS=16 if bias == "l2" else BVC, BKS=BD if bias == "l2" else BK,
                num_warps=4 if BT * BD < 4096 else 8, walk_warps=4 if BD <= 128 else 8,
                num_stages=3 if BT * BD <= 4096 else 1, bwd_prec="ieee" if BT * BD >= 16384 else prec)


def chunk_count(T, chunk_size, offset):
    return triton.cdiv(T + offset, chunk_size)


def grids(N, T, D, DV, *, chunk_size, bias="l2", offset=0):
    """The grid of every launch of a forward and backward call (what ``ChunkLinearMemoryFunction`` launches)."""
    cfg = _config(D, DV, chunk_size, bias)
    NC, cdiv = chunk_count(T, chunk_size, offset), triton.cdiv
    parallel = (NC, N, cdiv(DV, cfg["BV"]))
    walk = (cdiv(DV, cfg["BVS"]), cdiv(D, cfg["BKS"]), N)
    return {"chunk_state_contrib_kernel": (NC, N, cdiv(DV, cfg["BVC"]) * cdiv(D, cfg["BK"])),
            "chunk_state_scan_kernel": walk, "chunk_linear_memory_fwd_kernel": parallel,
            "chunk_grad_contrib_kernel": parallel, "chunk_grad_scan_kernel": walk,
            "chunk_linear_memory_bwd_kernel": parallel}


def launches(N, T, D, DV, *, chunk_size, window=None, bias="l2", momentum=True, offset=0, m0=0):
    """Each launch of a forward and backward call: {kernel: (grid, programs, dot FLOPs)} for N sequences of T new
    tokens (m0 cached keys), D features, d_v = DV. FLOPs are 2·m·n·k of every ``tl.dot`` at the problem's own sizes
    (a chunk's n tokens, its window's keys, D, DV; the padding of blocks to powers of two left out)."""
    NC = chunk_count(T, chunk_size, offset)
    c = m0 + T if window is None else window
    keys = nk = nnk = 0  # over chunks: Σ k (a chunk's window keys), Σ n·k, Σ n²·k
    for ci in range(NC):
        t0 = max(ci * chunk_size - offset, 0)
        n = min(ci * chunk_size - offset + chunk_size, T) - t0
        first = m0 + t0
        k = first + n - max(first - c + 1, 0)
        keys, nk, nnk = keys + k, nk + n * k, nnk + n * n * k
    mom, l2, KDV, TDV = (2 if momentum else 1), bias == "l2", keys * D * DV, T * D * DV
    flops = {  # per sequence
        "chunk_state_contrib_kernel": 2 * mom * KDV,
        "chunk_state_scan_kernel": (2 + 2 * mom) * KDV if l2 else 0,
        "chunk_linear_memory_fwd_kernel": 2 * mom * TDV + 2 * nnk + 2 * nk * (D + DV) + (2 * KDV if l2 else 0),
        "chunk_grad_contrib_kernel": 2 * mom * TDV + (2 * nnk + 2 * nk * (D + DV) + 4 * KDV if l2 else 0),
        "chunk_grad_scan_kernel": (2 + 2 * mom) * KDV if l2 else 0,
        "chunk_linear_memory_bwd_kernel": 4 * mom * TDV + 6 * mom * nnk + 2 * nk * (3 * D + 2 * DV)
        + (4 * mom + 4 * l2) * KDV,
    }
    return {name: (g, g[0] * g[1] * g[2], N * flops[name])
            for name, g in grids(N, T, D, DV, chunk_size=chunk_size, bias=bias, offset=offset).items()}


TABLE_SHAPES = {  # (B, H, d, T): docs/performance.md's table of launches
    "study": (64, 8, 16, 256),  # sweeps/mqar_gpu.yaml
    "B·H = 8": (2, 4, 64, 16384),  # gpu_check's rows
    "125M-class": (8, 12, 64, 4096),
}
TABLE_OPTIONS = dict(chunk_size=16, window=8, bias="l2", momentum=True)  # an Omega window with momentum, D = d
MULTIPROCESSORS = 132  # an H100 / H200


def launches_table(shapes=None, options=None) -> str:
    """docs/performance.md's table: each launch's grid, its programs per multiprocessor and its dot GFLOP, at each
    shape of ``shapes`` (default TABLE_SHAPES, with TABLE_OPTIONS; D = d_v = d), and the single kernel each pass
    was before (one program per (d_v block, sequence), walking every chunk)."""
    shapes, options = shapes or TABLE_SHAPES, options or TABLE_OPTIONS
    head = "| launch | " + " | ".join(f"{s}: grid = programs (per SM) | GFLOP" for s in shapes) + " |"
    rows = {}
    for B, H, d, T in shapes.values():
        each = launches(B * H, T, d, d, **options)
        before = (triton.cdiv(d, _config(d, d, options["chunk_size"], options["bias"])["BV"]), B * H)
        for name, (grid, programs, flops) in {**each, "before: the one forward (or backward) kernel":
                                              (before, before[0] * before[1], None)}.items():
            gflop = "—" if flops is None else f"{flops / 1e9:,.2f}"
            rows.setdefault(name, []).append(f"{grid} = {programs:,} ({programs / MULTIPROCESSORS:,.1f}) | {gflop}")
    return "\n".join([head, "|---|" + "---|---|" * len(shapes)] + [f"| {n} | " + " | ".join(r) + " |"
                                                                    for n, r in rows.items()])


def launch_options(D, DV, chunk_size, bias, momentum, dtype, prec=None) -> dict:
    """{kernel name: its constexprs, num_warps and num_stages} for one call (``_config``'s choices); prec: the dot
    precision (default ``dot_precision(dtype)``, torch's setting now)."""
    prec = dot_precision(dtype) if prec is None else prec
    cfg = _config(D, DV, chunk_size, bias, prec)
    common = dict(D=D, DV=DV, MOMENTUM=momentum, DT=DTYPES[dtype], BT=cfg["BT"], BI=cfg["BI"], PREC=prec,
                  num_stages=cfg["num_stages"])
    chunks = dict(common, L2=bias == "l2", BD=cfg["BD"], BV=cfg["BV"], num_warps=cfg["num_warps"])
    walk = dict(common, L2=bias == "l2", BK=cfg["BKS"], BV=cfg["BVS"], num_warps=cfg["walk_warps"])
    return {"chunk_state_contrib_kernel": dict(common, BK=cfg["BK"], BV=cfg["BVC"], num_warps=cfg["walk_warps"]),
            "chunk_state_scan_kernel": walk, "chunk_linear_memory_fwd_kernel": chunks,
            "chunk_grad_contrib_kernel": chunks, "chunk_grad_scan_kernel": walk,
            "chunk_linear_memory_bwd_kernel": dict(chunks, PREC=cfg["bwd_prec"])}


class ChunkLinearMemoryFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, gamma, a, m, s, Cw, Cs, W0, S0, We0, offset, chunk_size, window, bias, momentum):
        N, T, D = q.shape
        L, DV = k.shape[1], v.shape[-1]
        m0, NC = L - T, chunk_count(T, chunk_size, offset)
        # the backward's products in the same precision, whatever torch's setting is by then
        opts = launch_options(D, DV, chunk_size, bias, momentum, q.dtype)
        grid = grids(N, T, D, DV, chunk_size=chunk_size, bias=bias, offset=offset)
        f32 = dict(dtype=torch.float32, device=q.device)
        BW = torch.empty(N, NC, DV, D, **f32)
        BS = torch.empty_like(BW) if momentum else BW
        name = "chunk_state_contrib_kernel"
        chunk_state_contrib_kernel[grid[name]](
            k, v, gamma, Cw, Cs, BW, BS, T, L, m0, offset, chunk_size, window, triton.cdiv(D, opts[name]["BK"]),
            **opts[name])
        WT, WE, ST = torch.empty_like(W0), torch.empty_like(W0), torch.empty_like(S0)
        WH = torch.empty(N, NC, DV, D, **f32)  # every chunk's start states, for the read-out and the backward
        SH = torch.empty_like(WH) if momentum else WH
        name = "chunk_state_scan_kernel"
        chunk_state_scan_kernel[grid[name]](
            k, gamma, a, m, s, Cw, Cs, W0, S0, We0, BW, BS, WT, ST, WE, WH, SH,
            T, L, m0, offset, chunk_size, window, NC, **opts[name])
        del BW, BS
        y = torch.empty(N, T, DV, dtype=q.dtype, device=q.device)
        name = "chunk_linear_memory_fwd_kernel"
        chunk_linear_memory_fwd_kernel[grid[name]](
            q, k, v, gamma, a, m, Cw, We0, WH, SH, y, T, L, m0, offset, chunk_size, window, **opts[name])
        ctx.save_for_backward(q, k, v, gamma, a, m, s, Cw, Cs, We0, WH, SH)
        ctx.args = (offset, chunk_size, window, bias, momentum, NC, opts, grid)
        return y, WT, ST, WE

    @staticmethod
    def backward(ctx, dy, dWT, dST, dWE):
        q, k, v, gamma, a, m, s, Cw, Cs, We0, WH, SH = ctx.saved_tensors
        offset, chunk_size, window, bias, momentum, NC, opts, grid = ctx.args
        N, T, D = q.shape
        L, DV = k.shape[1], v.shape[-1]
        m0, l2 = L - T, bias == "l2"
        f32 = dict(dtype=torch.float32, device=q.device)
        dy = dy.to(q.dtype).contiguous()
        ZE = torch.empty(N, NC, DV, D, **f32)
        ZF = torch.empty_like(ZE) if l2 else ZE
        ZS = torch.empty_like(ZE) if momentum else ZE
        name = "chunk_grad_contrib_kernel"
        chunk_grad_contrib_kernel[grid[name]](
            q, k, v, gamma, a, m, Cw, We0, WH, dy, ZE, ZF, ZS, T, L, m0, offset, chunk_size, window, **opts[name])
        GH = torch.empty(N, NC, DV, D, **f32)  # ∂L/∂ every chunk's end states
        GSH = torch.empty_like(GH) if momentum else GH
        dW0, dS0, dWe0 = (torch.zeros(N, DV, D, **f32) for _ in range(3))
        name = "chunk_grad_scan_kernel"
        chunk_grad_scan_kernel[grid[name]](
            k, gamma, a, m, s, Cw, Cs, ZE, ZF, ZS, dWT.float().contiguous(), dST.float().contiguous(),
            dWE.float().contiguous(), GH, GSH, dW0, dS0, dWe0, T, L, m0, offset, chunk_size, window, NC, **opts[name])
        del ZE, ZF, ZS
        name = "chunk_linear_memory_bwd_kernel"
        NV = grid[name][2]
        dq = torch.empty(NV, N, T, D, **f32)
        dk, dv, dgamma = torch.zeros(N, L, D, **f32), torch.zeros(N, L, DV, **f32), torch.zeros(N, L, **f32)
        da, dm, ds = (torch.zeros(NV, N, T, **f32) for _ in range(3))
        dCw, dCs = torch.zeros(NV, N, T, chunk_size, **f32), torch.zeros(NV, N, T, chunk_size, **f32)
        chunk_linear_memory_bwd_kernel[grid[name]](
            q, k, v, gamma, a, m, Cw, Cs, We0, WH, SH, GH, GSH, dy,
            dq, dk, dv, dgamma, da, dm, ds, dCw, dCs, N, T, L, m0, offset, chunk_size, window, **opts[name])
        gates = (da.sum(0), dm.sum(0) if momentum else None, ds.sum(0) if momentum else None, dCw.sum(0),
                 dCs.sum(0) if momentum else None)
        return (dq.sum(0).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dgamma.to(gamma.dtype),
                *(g if g is None else g.to(a.dtype) for g in gates),
                dW0.to(We0.dtype), dS0.to(We0.dtype) if momentum else None, dWe0.to(We0.dtype),
                None, None, None, None, None)


@torch.compiler.disable  # a compiled graph calls it as it is (a graph break): its launches are fused already
def chunk_linear_memory(q, k, v, gamma, a, Cw, W0, We0, *, offset, chunk_size, window, bias,
                        m=None, s=None, Cs=None, S0=None):
    """Linear memory over T new tokens, all chunks in parallel around one walk over chunk states (three launches
    forward, three backward; the module docstring).

    q: φ(q) [N, T, D]; k: φ(k) [N, L, D] and v [N, L, d_v] for the window cache followed by the new tokens;
    gamma [N, L]; a [N, T], Cw [N, T, b]: per-token rows of each chunk's closed form (column j = the
    chunk's j-th token), with m, s [N, T], Cs [N, T, b] and the momentum S0 for momentum.
    W0: W at the start; We0: W̃ for the first chunk (pass W0 itself unless ``offset`` > 0); window: c, or
    None (global). Returns (y [N, T, d_v], W_T, S_T or None, W̃ of the last chunk), all [N, d_v, D].
    """
    momentum = S0 is not None
    if not momentum:
        m = s = a
        Cs = Cw
        S0 = W0
    L = k.shape[1]
    args = [x.contiguous() for x in (q, k, v, gamma, a, m, s, Cw, Cs, W0, S0, We0)]
    y, WT, ST, WE = ChunkLinearMemoryFunction.apply(*args, offset, chunk_size, L if window is None else window,
                                                     bias, momentum)
    return y, WT, (ST if momentum else None), WE
