"""Chunked linear memory: one fused kernel for every chunk of a sequence (docs/memory.md §3–§5).

Linear memory M_W(u) = W u, W: [d_v, D]; u = φ(k), queries φ(q) (the feature map is applied outside).
Chunk of n tokens starting at W_p (S_p for momentum), gradients at W̃ (= W_p, except for a chunk
that a previous call left partially consumed):

    δ_i = W̃ u_i − v_i (l2)  or  −v_i (dot)                     for the chunk's tokens and the c−1 before them
    Γ[t, i] = γ_i  if t−c < i ≤ t  else 0                       (c = window; global: every past token)
    C = Cw Γ,  C' = Cs Γ                                        Cw, Cs: the optimiser's [n, n] closed forms
    y_t = a_t W_p u_q,t + m_t S_p u_q,t + Σ_i C[t, i] (u_q,t · u_i) δ_i
    W_end = a_n W_p + m_n S_p + Σ_i C[n, i] δ_i u_iᵀ,   S_end = s_n S_p + Σ_i C'[n, i] δ_i u_iᵀ

(a, m, s, Cw, Cs from ``atlas_lab.memory.optimizers.chunk_coefficients``; gd has no m, s, Cs.)
One program per (d_v block, sequence) walks the chunks in order, keeping W_p, W̃ (and S_p) on chip;
the window's keys are visited in blocks of BT. Rows of W evolve independently, so d_v is split
across programs. The chunk-start states are stored for the backward kernel, which walks the chunks in
reverse carrying ∂L/∂W (and ∂L/∂S), recomputes δ, Γ and C, and returns gradients for φ(q), φ(k), v,
γ, the coefficients (a, m, s, Cw, Cs — their gate gradients follow by autograd) and the initial
states. Gradients of tokens shared by several windows (keys, values, γ) are accumulated atomically.
All arithmetic is fp32 (``ieee`` dots, like torch's default fp32 matmul); inputs may be fp16/bf16.
The same computation in plain PyTorch is ``naive.chunk_linear_memory_naive`` (next to this file).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_FEATURES, MAX_CHUNK = 256, 64
IEEE = tl.constexpr("ieee")  # exact fp32 dots (no tf32), like torch's default fp32 matmul


@triton.jit
def _last(x, n, offs_t):
    """x[n − 1] of a [BT] vector."""
    return tl.sum(tl.where(offs_t == n - 1, x, 0.0))


@triton.jit
def _last_row(x, n, offs_t):
    """Row n − 1 of a [BT, BT] block."""
    return tl.sum(tl.where((offs_t == n - 1)[:, None], x, 0.0), axis=0)


@triton.jit
def _load_state(P, offs_v, offs_d, DV, D):
    mask = (offs_v < DV)[:, None] & (offs_d < D)[None, :]
    return tl.load(P + offs_v[:, None] * D + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store_state(P, x, offs_v, offs_d, DV, D):
    mask = (offs_v < DV)[:, None] & (offs_d < D)[None, :]
    tl.store(P + offs_v[:, None] * D + offs_d[None, :], x.to(P.dtype.element_ty), mask=mask)


@triton.jit
def _window_block(K, V, GAMMA, We, i0, first, n, c, offs_t, offs_d, offs_v, D, DV, L2: tl.constexpr):
    """Keys i0..i0+BT of the window: u [BT, BD], δ [BT, BV], Γ [BT (chunk token), BT (key)], key mask."""
    idx = i0 + offs_t
    imask = idx < first + n
    u = tl.load(K + idx[:, None] * D + offs_d[None, :], mask=imask[:, None] & (offs_d < D)[None, :],
                other=0.0).to(tl.float32)
    v = tl.load(V + idx[:, None] * DV + offs_v[None, :], mask=imask[:, None] & (offs_v < DV)[None, :],
                other=0.0).to(tl.float32)
    g = tl.load(GAMMA + idx, mask=imask, other=0.0).to(tl.float32)
    delta = -v
    if L2:
        delta += tl.dot(u, tl.trans(We), input_precision=IEEE)
    pos = first + offs_t
    band = (idx[None, :] <= pos[:, None]) & (idx[None, :] > pos[:, None] - c) & (offs_t < n)[:, None] & imask[None, :]
    return idx, imask, u, delta, band, tl.where(band, g[None, :], 0.0)


@triton.jit
def _causal_factors(C, u, delta, idx, pos):
    """The read-out's Σ_i C[t, i] (q_t·u_i) δ_i over the keys i ≤ t only, keeping a later key's NaN out of row t
    (0 · NaN in the plain product; ``atlas_lab.memory.causal``). C [BT (chunk token t), BT (key i)], u [BT, BD],
    δ [BT, BV]. Returns (C', u', δ', kept, bad): bad[i] = key i's u or δ (this block of d_v) is non-finite; those
    rows of u, δ zeroed; C' = C where kept (i ≤ t and not bad[i]), NaN at i ≤ t with bad[i], 0 above."""
    bad = (tl.max(((u - u) != 0).to(tl.int32), axis=1) + tl.max(((delta - delta) != 0).to(tl.int32), axis=1)) > 0
    causal = idx[None, :] <= pos[:, None]
    kept = causal & (bad == 0)[None, :]
    C = tl.where(kept, C, tl.where(causal, float("nan"), 0.0))
    return C, tl.where(bad[:, None], 0.0, u), tl.where(bad[:, None], 0.0, delta), kept, bad


@triton.jit
def chunk_linear_memory_fwd_kernel(
    Q, K, V, GAMMA, A, M, S, CW, CS, W0, S0, WE0,
    Y, WT, ST, WE_OUT, WH, SH,
    T, L, m0, offset, b, c, NC,
    D: tl.constexpr, DV: tl.constexpr, L2: tl.constexpr, MOMENTUM: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr,
):
    """Q [N, T, D]; K [N, L, D]; V [N, L, DV]; GAMMA [N, L]; A, M, S [N, T]; CW, CS [N, T, b];
    W0, S0, WE0 [N, DV, D] -> Y [N, T, DV]; WT, ST (final states), WE_OUT (W̃ of the last chunk)
    [N, DV, D]; WH, SH [N, NC, DV, D] chunk-start states for the backward. L = m0 + T."""
    i_v, i_n = tl.program_id(0), tl.program_id(1).to(tl.int64)
    offs_t, offs_d = tl.arange(0, BT), tl.arange(0, BD)
    offs_v = i_v * BV + tl.arange(0, BV)
    Q, Y, A, M, S = Q + i_n * T * D, Y + i_n * T * DV, A + i_n * T, M + i_n * T, S + i_n * T
    CW, CS = CW + i_n * T * b, CS + i_n * T * b
    K, V, GAMMA = K + i_n * L * D, V + i_n * L * DV, GAMMA + i_n * L
    W = _load_state(W0 + i_n * DV * D, offs_v, offs_d, DV, D)
    We = _load_state(WE0 + i_n * DV * D, offs_v, offs_d, DV, D)
    Sm = tl.zeros([BV, BD], dtype=tl.float32)
    if MOMENTUM:
        Sm = _load_state(S0 + i_n * DV * D, offs_v, offs_d, DV, D)
    for ci in range(NC):
        t0 = tl.maximum(ci * b - offset, 0)
        n = tl.minimum(ci * b - offset + b, T) - t0
        _store_state(WH + (i_n * NC + ci) * DV * D, W, offs_v, offs_d, DV, D)
        if MOMENTUM:
            _store_state(SH + (i_n * NC + ci) * DV * D, Sm, offs_v, offs_d, DV, D)
        if ci == NC - 1:
            _store_state(WE_OUT + i_n * DV * D, We, offs_v, offs_d, DV, D)
        rows = t0 + offs_t
        rmask = offs_t < n
        q = tl.load(Q + rows[:, None] * D + offs_d[None, :], mask=rmask[:, None] & (offs_d < D)[None, :],
                    other=0.0).to(tl.float32)
        cmask = rmask[:, None] & (offs_t < n)[None, :]
        cw = tl.load(CW + rows[:, None] * b + offs_t[None, :], mask=cmask, other=0.0).to(tl.float32)
        a = tl.load(A + rows, mask=rmask, other=0.0).to(tl.float32)
        y = a[:, None] * tl.dot(q, tl.trans(W), input_precision=IEEE)
        W_new = _last(a, n, offs_t) * W
        if MOMENTUM:
            cs = tl.load(CS + rows[:, None] * b + offs_t[None, :], mask=cmask, other=0.0).to(tl.float32)
            m = tl.load(M + rows, mask=rmask, other=0.0).to(tl.float32)
            s = tl.load(S + rows, mask=rmask, other=0.0).to(tl.float32)
            y += m[:, None] * tl.dot(q, tl.trans(Sm), input_precision=IEEE)
            W_new += _last(m, n, offs_t) * Sm
            S_new = _last(s, n, offs_t) * Sm
        first = m0 + t0
        for i0 in range(tl.maximum(first - c + 1, 0), first + n, BT):
            idx, imask, u, delta, band, gam = _window_block(K, V, GAMMA, We, i0, first, n, c, offs_t, offs_d, offs_v,
                                                            D, DV, L2)
            C = tl.dot(cw, gam, input_precision=IEEE)
            C_y, u_y, delta_y, _, _ = _causal_factors(C, u, delta, idx, first + offs_t)
            y += tl.dot(C_y * tl.dot(q, tl.trans(u_y), input_precision=IEEE), delta_y, input_precision=IEEE)
            W_new += tl.dot(tl.trans(delta * _last_row(C, n, offs_t)[:, None]), u, input_precision=IEEE)
            if MOMENTUM:
                cs_last = _last_row(tl.dot(cs, gam, input_precision=IEEE), n, offs_t)
                S_new += tl.dot(tl.trans(delta * cs_last[:, None]), u, input_precision=IEEE)
        tl.store(Y + rows[:, None] * DV + offs_v[None, :], y.to(Y.dtype.element_ty),
                 mask=rmask[:, None] & (offs_v < DV)[None, :])
        W, We = W_new, W_new
        if MOMENTUM:
            Sm = S_new
    _store_state(WT + i_n * DV * D, W, offs_v, offs_d, DV, D)
    if MOMENTUM:
        _store_state(ST + i_n * DV * D, Sm, offs_v, offs_d, DV, D)


@triton.jit
def chunk_linear_memory_bwd_kernel(
    Q, K, V, GAMMA, A, M, S, CW, CS, WE0, WH, SH,
    DY, DWT, DST, DWE_OUT,
    DQ, DK, DVV, DGAMMA, DA, DM, DS, DCW, DCS, DW0, DS0, DWE0,
    N, T, L, m0, offset, b, c, NC,
    D: tl.constexpr, DV: tl.constexpr, L2: tl.constexpr, MOMENTUM: tl.constexpr,
    BT: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr,
):
    """Gradients of chunk_linear_memory_fwd_kernel. DY [N, T, DV]; DWT, DST, DWE_OUT [N, DV, D].

    Per d_v block (leading NV dim, summed by the caller): DQ [NV, N, T, D]; DA, DM, DS [NV, N, T];
    DCW, DCS [NV, N, T, b]. Accumulated atomically (zero on entry): DK [N, L, D], DVV [N, L, DV],
    DGAMMA [N, L]. DW0, DS0, DWE0 [N, DV, D]."""
    i_v, i_n = tl.program_id(0), tl.program_id(1).to(tl.int64)
    offs_t, offs_d = tl.arange(0, BT), tl.arange(0, BD)
    offs_v = i_v * BV + tl.arange(0, BV)
    Q, DY, A, M, S = Q + i_n * T * D, DY + i_n * T * DV, A + i_n * T, M + i_n * T, S + i_n * T
    CW, CS = CW + i_n * T * b, CS + i_n * T * b
    K, V, GAMMA = K + i_n * L * D, V + i_n * L * DV, GAMMA + i_n * L
    DK, DVV, DGAMMA = DK + i_n * L * D, DVV + i_n * L * DV, DGAMMA + i_n * L
    part = i_v * N + i_n  # this program's slice of the per-d_v-block outputs
    DQ, DA, DM, DS = DQ + part * T * D, DA + part * T, DM + part * T, DS + part * T
    DCW, DCS = DCW + part * T * b, DCS + part * T * b
    dW = _load_state(DWT + i_n * DV * D, offs_v, offs_d, DV, D)
    dSm = tl.zeros([BV, BD], dtype=tl.float32)
    if MOMENTUM:
        dSm = _load_state(DST + i_n * DV * D, offs_v, offs_d, DV, D)
    dWe = _load_state(DWE_OUT + i_n * DV * D, offs_v, offs_d, DV, D)  # ∂L/∂W̃ of the last chunk
    for cr in range(NC):
        ci = NC - 1 - cr
        t0 = tl.maximum(ci * b - offset, 0)
        n = tl.minimum(ci * b - offset + b, T) - t0
        W = _load_state(WH + (i_n * NC + ci) * DV * D, offs_v, offs_d, DV, D)
        if ci == 0:  # W̃ of the first chunk is an input (W0 itself unless a previous call began the chunk)
            We = _load_state(WE0 + i_n * DV * D, offs_v, offs_d, DV, D)
        else:
            We = W
        rows = t0 + offs_t
        rmask = offs_t < n
        last = offs_t == n - 1
        qmask = rmask[:, None] & (offs_d < D)[None, :]
        q = tl.load(Q + rows[:, None] * D + offs_d[None, :], mask=qmask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * DV + offs_v[None, :], mask=rmask[:, None] & (offs_v < DV)[None, :],
                     other=0.0).to(tl.float32)
        cmask = rmask[:, None] & (offs_t < n)[None, :]
        cw = tl.load(CW + rows[:, None] * b + offs_t[None, :], mask=cmask, other=0.0).to(tl.float32)
        a = tl.load(A + rows, mask=rmask, other=0.0).to(tl.float32)
        # y_t ∋ a_t W_p u_q,t and W_end ∋ a_n W_p
        da = tl.sum(dy * tl.dot(q, tl.trans(W), input_precision=IEEE), axis=1) + tl.where(last, tl.sum(dW * W), 0.0)
        dq = a[:, None] * tl.dot(dy, W, input_precision=IEEE)
        dW_p = _last(a, n, offs_t) * dW + tl.dot(tl.trans(dy * a[:, None]), q, input_precision=IEEE)
        if MOMENTUM:
            Sm = _load_state(SH + (i_n * NC + ci) * DV * D, offs_v, offs_d, DV, D)
            cs = tl.load(CS + rows[:, None] * b + offs_t[None, :], mask=cmask, other=0.0).to(tl.float32)
            m = tl.load(M + rows, mask=rmask, other=0.0).to(tl.float32)
            s = tl.load(S + rows, mask=rmask, other=0.0).to(tl.float32)
            dm = tl.sum(dy * tl.dot(q, tl.trans(Sm), input_precision=IEEE), axis=1)
            dm += tl.where(last, tl.sum(dW * Sm), 0.0)
            ds = tl.where(last, tl.sum(dSm * Sm), 0.0)
            dq += m[:, None] * tl.dot(dy, Sm, input_precision=IEEE)
            dS_p = _last(m, n, offs_t) * dW + _last(s, n, offs_t) * dSm
            dS_p += tl.dot(tl.trans(dy * m[:, None]), q, input_precision=IEEE)
            dcs = tl.zeros([BT, BT], dtype=tl.float32)
        dcw = tl.zeros([BT, BT], dtype=tl.float32)
        first = m0 + t0
        for i0 in range(tl.maximum(first - c + 1, 0), first + n, BT):
            idx, imask, u, delta, band, gam = _window_block(K, V, GAMMA, We, i0, first, n, c, offs_t, offs_d, offs_v,
                                                            D, DV, L2)
            C = tl.dot(cw, gam, input_precision=IEEE)
            c_last = _last_row(C, n, offs_t)
            C_y, u_y, delta_y, kept, bad = _causal_factors(C, u, delta, idx, first + offs_t)  # the read-out's
            P = tl.dot(q, tl.trans(u_y), input_precision=IEEE)
            dyd = tl.dot(dy, tl.trans(delta_y), input_precision=IEEE)  # [t, i]: dy_t · δ_i
            udW = tl.dot(u, tl.trans(dW), input_precision=IEEE)  # [i, v]
            dC = tl.where(kept, dyd * P, 0.0) + tl.where(last[:, None], tl.sum(udW * delta, axis=1)[None, :], 0.0)
            ddelta = tl.where(bad[:, None], 0.0, tl.dot(tl.trans(C_y * P), dy, input_precision=IEEE))
            ddelta += c_last[:, None] * udW
            du = tl.where(bad[:, None], 0.0, tl.dot(tl.trans(dyd * C_y), q, input_precision=IEEE))
            du += c_last[:, None] * tl.dot(delta, dW, input_precision=IEEE)
            dq += tl.dot(dyd * C_y, u_y, input_precision=IEEE)
            dgam = tl.dot(tl.trans(cw), dC, input_precision=IEEE)
            dcw += tl.dot(dC, tl.trans(gam), input_precision=IEEE)
            if MOMENTUM:
                cs_last = _last_row(tl.dot(cs, gam, input_precision=IEEE), n, offs_t)
                udS = tl.dot(u, tl.trans(dSm), input_precision=IEEE)
                dCs = tl.where(last[:, None], tl.sum(udS * delta, axis=1)[None, :], 0.0)
                ddelta += cs_last[:, None] * udS
                du += cs_last[:, None] * tl.dot(delta, dSm, input_precision=IEEE)
                dgam += tl.dot(tl.trans(cs), dCs, input_precision=IEEE)
                dcs += tl.dot(dCs, tl.trans(gam), input_precision=IEEE)
            if L2:  # δ = W̃ u − v
                du += tl.dot(ddelta, We, input_precision=IEEE)
                dWe += tl.dot(tl.trans(ddelta), u, input_precision=IEEE)
            tl.atomic_add(DK + idx[:, None] * D + offs_d[None, :], du, mask=imask[:, None] & (offs_d < D)[None, :])
            tl.atomic_add(DVV + idx[:, None] * DV + offs_v[None, :], -ddelta,
                          mask=imask[:, None] & (offs_v < DV)[None, :])
            tl.atomic_add(DGAMMA + idx, tl.sum(tl.where(band, dgam, 0.0), axis=0), mask=imask)
        tl.store(DQ + rows[:, None] * D + offs_d[None, :], dq, mask=qmask)
        tl.store(DA + rows, da, mask=rmask)
        tl.store(DCW + rows[:, None] * b + offs_t[None, :], dcw, mask=cmask)
        if MOMENTUM:
            tl.store(DM + rows, dm, mask=rmask)
            tl.store(DS + rows, ds, mask=rmask)
            tl.store(DCS + rows[:, None] * b + offs_t[None, :], dcs, mask=cmask)
            dSm = dS_p
        if ci == 0:
            _store_state(DWE0 + i_n * DV * D, dWe, offs_v, offs_d, DV, D)
            dW = dW_p
        else:
            dW = dW_p + dWe
        dWe = tl.zeros([BV, BD], dtype=tl.float32)
    _store_state(DW0 + i_n * DV * D, dW, offs_v, offs_d, DV, D)
    if MOMENTUM:
        _store_state(DS0 + i_n * DV * D, dSm, offs_v, offs_d, DV, D)


def _config(D, DV, b):
    """Block sizes: a chunk (BT), all features (BD) and a slice of d_v (BV ≤ 32: more programs, fewer registers)."""
    BT = max(16, triton.next_power_of_2(b))
    BD = max(16, triton.next_power_of_2(D))
    BV = max(16, min(triton.next_power_of_2(DV), 32, 4096 // BD))
    return dict(BT=BT, BD=BD, BV=BV, num_warps=4 if BT * BD <= 4096 else 8)


class ChunkLinearMemoryFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, gamma, a, m, s, Cw, Cs, W0, S0, We0, offset, chunk_size, window, bias, momentum):
        N, T, D = q.shape
        L, DV = k.shape[1], v.shape[-1]
        NC = triton.cdiv(T + offset, chunk_size)
        cfg = _config(D, DV, chunk_size)
        y = torch.empty(N, T, DV, dtype=q.dtype, device=q.device)
        WT, WE = torch.empty_like(W0), torch.empty_like(W0)
        ST = torch.empty_like(S0)
        WH = torch.empty(N, NC, DV, D, dtype=torch.float32, device=q.device)
        SH = torch.empty_like(WH) if momentum else WH
        grid = (triton.cdiv(DV, cfg["BV"]), N)
        chunk_linear_memory_fwd_kernel[grid](
            q, k, v, gamma, a, m, s, Cw, Cs, W0, S0, We0, y, WT, ST, WE, WH, SH,
            T, L, L - T, offset, chunk_size, window, NC, D=D, DV=DV, L2=bias == "l2", MOMENTUM=momentum, **cfg)
        ctx.save_for_backward(q, k, v, gamma, a, m, s, Cw, Cs, We0, WH, SH)
        ctx.args = (offset, chunk_size, window, bias, momentum, NC, cfg)
        return y, WT, ST, WE

    @staticmethod
    def backward(ctx, dy, dWT, dST, dWE):
        q, k, v, gamma, a, m, s, Cw, Cs, We0, WH, SH = ctx.saved_tensors
        offset, chunk_size, window, bias, momentum, NC, cfg = ctx.args
        N, T, D = q.shape
        L, DV = k.shape[1], v.shape[-1]
        NV = triton.cdiv(DV, cfg["BV"])
        f32 = dict(dtype=torch.float32, device=q.device)
        dq = torch.empty(NV, N, T, D, **f32)
        dk, dv, dgamma = torch.zeros(N, L, D, **f32), torch.zeros(N, L, DV, **f32), torch.zeros(N, L, **f32)
        da, dm, ds = (torch.zeros(NV, N, T, **f32) for _ in range(3))
        dCw, dCs = torch.zeros(NV, N, T, chunk_size, **f32), torch.zeros(NV, N, T, chunk_size, **f32)
        dW0, dS0, dWe0 = (torch.zeros(N, DV, D, **f32) for _ in range(3))
        chunk_linear_memory_bwd_kernel[(NV, N)](
            q, k, v, gamma, a, m, s, Cw, Cs, We0, WH, SH, dy.contiguous(), dWT.contiguous(), dST.contiguous(),
            dWE.contiguous(), dq, dk, dv, dgamma, da, dm, ds, dCw, dCs, dW0, dS0, dWe0,
            N, T, L, L - T, offset, chunk_size, window, NC, D=D, DV=DV, L2=bias == "l2", MOMENTUM=momentum,
            **cfg)
        gates = (da.sum(0), dm.sum(0) if momentum else None, ds.sum(0) if momentum else None, dCw.sum(0),
                 dCs.sum(0) if momentum else None)
        return (dq.sum(0).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dgamma.to(gamma.dtype),
                *(g if g is None else g.to(a.dtype) for g in gates),
                dW0.to(We0.dtype), dS0.to(We0.dtype) if momentum else None, dWe0.to(We0.dtype),
                None, None, None, None, None)


def chunk_linear_memory(q, k, v, gamma, a, Cw, W0, We0, *, offset, chunk_size, window, bias,
                        m=None, s=None, Cs=None, S0=None):
    """Linear memory over T new tokens, chunk by chunk, in one kernel launch (forward and backward).

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
