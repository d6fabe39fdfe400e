"""Atlas's memory step — muon on a 2-layer MLP memory — in one forward and one backward launch: the per-token
Newton–Schulz of every chunk inside the program that walks the chunks (docs/memory.md §5.3).

Memory M_W(u) = W2 σ(W1 u) as in ``triton.py`` (φ and the residual applied outside); a chunk of n tokens starting at
W_p (momenta S_p), every gradient at W̃ (``triton.py``'s factors δ1, δ2 of the window keys), and for each weight
matrix (dropping its index):

    S_t = s_t S_p + Σ_i C'[t, i] ∇ℓ_i        C' = Cs Γ   (the momentum of token t, in closed form)
    D_t = NS_k(S_t)                          X_0 = S_t / (‖S_t‖_F + ε); k times A = X Xᵀ, X ← aX + (bA + cA²) X
    W_t = a_t W_p + Σ_{j ≤ t} Cw[t, j] D_j   (Cw: −η's closed form over the chunk's tokens)
    zq_t = W1_t uq_t,  hq_t = σ(zq_t),  y_t = W2_t hq_t
    W_end = W_n,  S_end = S_n

(a, s, Cw, Cs from ``TransformedMomentum.chunk_coefficients``; the chunked path's ``_chunk_transformed``.) A program
holds W_p, S_p and one token's S_t at a time: for j in the chunk, S_j from the factors, D_j by k steps of products on
chip, and its contributions Cw[:, j] (D_j uq) to every read-out and Cw[n, j] D_j to the end weights.

**Backward**, per chunk from its checkpoint, with dy, G = ∂L/∂W_end, H = ∂L/∂S_end:

    ∂D_j = Σ_t Cw[t, j] ∂(W_t x_t) x_tᵀ + Cw[n, j] G,   ∂Cw[t, j] = ∂(W_t x_t) · D_j x_t (+ ⟨G, D_j⟩ at t = n)
    ∂S_j = NS_k'(S_j)ᵀ ∂D_j (+ H at j = n)           the k steps back (``newton_schulz``'s), their iterates kept
    ∂S_p = Σ_j s_j ∂S_j,  ∂s_j = ⟨∂S_j, S_p⟩,  ∂δ_i += Σ_j C'[j, i] ∂S_j x_i,  ∂x_i += Σ_j C'[j, i] ∂S_jᵀ δ_i,
    ∂C'[j, i] = δ_iᵀ ∂S_j x_i

then ``triton.py``'s factors backward. The forward keeps the first layer's read-out zq [N, T, H], so the backward
forms the first layer's D_j for their own gradients only, and each D_j once: its iterates X_0 … X_{k−1} and each
step's A and B = bA + cA² go to a scratch buffer per program (global memory: [k, rows, cols] and [k, 2, rows, rows]
for each weight matrix, in the dtype the dots read them in: 16 bits with 16-bit inputs) that its k steps back read;
there ∂A + ∂Aᵀ = bE + c(EA + (EA)ᵀ) with E = ∂B + ∂Bᵀ (A and E symmetric), one product where ∂B A + A ∂B took two,
and the gradient G, carried in a float32 scratch of its own, is taken in column tiles (``TILE_BYTES``:
∂B = Σ_tiles G Xᵀ, each tile of G updated on its own and put into the next step's ∂B as it is made), so that W1's
products fit sm_90's shared memory in tf32, and only over the tiles that hold W1's columns (``column_tiles``: D 153
in a block of 256 takes 5 tiles of 32, 160 columns). Dots a token and weight matrix R × C:
forward 2k(2R²C + R³), backward the same again and 2k(3R²C + R³) back (``launches()`` counts them at the blocks'
sizes, as the tensor cores take them; ``scratch_bytes()`` the scratch's traffic).

Covers weights with rows ≤ columns (NS_k on the matrix itself, no transpose) and one (a, b, c) for every step; and
Atlas++'s gated first layer W1 = [W_a; W_b] held as one block (``triton.py``'s): each step's A = X Xᵀ is zero between
the two matrices and each has its own norm, so the block's NS_k is theirs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..dots import DTYPES, dot, dot_precision
from ..newton_schulz.reference import NS_COEFFICIENTS
from ..chunk_linear_memory.triton import _chunk, _key_grads, _load_state, _store_state, chunk_count
from .triton import (ACTS, _config, _factors, _factors_back, _hidden, _hidden_back, _last, _load1, _rows,
                     _store1)



@triton.jit
def _row(x, j, offs):
    """Row j of x [BT, ·]."""
    return tl.sum(tl.where((offs == j)[:, None], x, 0.0), axis=0)


@triton.jit
def _col(x, j, offs):
    """Column j of x [·, BT]."""
    return tl.sum(tl.where((offs == j)[None, :], x, 0.0), axis=1)


@triton.jit
def _norms(X, offs_r, HALF: tl.constexpr):
    """Per row of X [BR, ·], the Frobenius norm of its matrix: rows < HALF one matrix, the rest another (a gated
    first layer's W2 and W3; HALF = BR: one matrix)."""
    rows, top = tl.sum(X * X, axis=1), offs_r < HALF
    return tl.where(top, tl.sqrt(tl.sum(tl.where(top, rows, 0.0))), tl.sqrt(tl.sum(tl.where(top, 0.0, rows))))


@triton.jit
def _ns_step(X, offs_r, HALF: tl.constexpr, NS_A: tl.constexpr, NS_B: tl.constexpr, NS_C: tl.constexpr,
             DT: tl.constexpr, PREC: tl.constexpr):
    """One Newton–Schulz step of each matrix of X (``_norms``' rows): A = X Xᵀ (zero between the two matrices),
    B = bA + cA², returns (A, B, aX + B X)."""
    same = (offs_r[:, None] < HALF) == (offs_r[None, :] < HALF)
    A = tl.where(same, dot(X, tl.trans(X), DT, PREC), 0.0)
    B = NS_B * A + NS_C * dot(A, A, DT, PREC)
    return A, B, NS_A * X + dot(B, X, DT, PREC)


@triton.jit
def _ns(X, offs_r, HALF: tl.constexpr, STEPS: tl.constexpr, NS_A: tl.constexpr, NS_B: tl.constexpr,
        NS_C: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    """NS_k of each matrix of X [BR, BC] (``_norms``' rows), rows ≤ columns (zero padding stays zero)."""
    X = X / (_norms(X, offs_r, HALF)[:, None] + 1e-7)
    for _ in tl.static_range(STEPS):
        _, _, X = _ns_step(X, offs_r, HALF, NS_A, NS_B, NS_C, DT, PREC)
    return X


@triton.jit
def _ns_keep(X, SCR, SCQ, offs_r, offs_c, BR: tl.constexpr, BC: tl.constexpr, CU: tl.constexpr,
             HALF: tl.constexpr, STEPS: tl.constexpr, NS_A: tl.constexpr, NS_B: tl.constexpr, NS_C: tl.constexpr,
             DT: tl.constexpr, PREC: tl.constexpr):
    """``_ns``, keeping each step's X in SCR [STEPS, BR, BC] (its first CU columns: the rest are zero) and its A, B in
    SCQ [STEPS, 2, BR, BR] (this program's scratch, in the products' dtype DT: what their dots read) for
    ``_ns_back``."""
    at, aq = offs_r[:, None] * BC + offs_c[None, :], offs_r[:, None] * BR + offs_r[None, :]
    used = (offs_r[:, None] < BR) & (offs_c[None, :] < CU)
    X = X / (_norms(X, offs_r, HALF)[:, None] + 1e-7)
    for j in tl.static_range(STEPS):
        tl.store(SCR + j * BR * BC + at, X.to(DT), mask=used)
        A, B, X = _ns_step(X, offs_r, HALF, NS_A, NS_B, NS_C, DT, PREC)
        tl.store(SCQ + 2 * j * BR * BR + aq, A.to(DT))
        tl.store(SCQ + (2 * j + 1) * BR * BR + aq, B.to(DT))
    tl.debug_barrier()  # the iterates stored by every thread, before any reads them back
    return X


@triton.jit
def _ns_back(S, G, SCR, SCG, SCQ, offs_r, offs_c, BR: tl.constexpr, BC: tl.constexpr, BCT: tl.constexpr,
             CU: tl.constexpr, HALF: tl.constexpr, STEPS: tl.constexpr, NS_A: tl.constexpr, NS_B: tl.constexpr,
             NS_C: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    """∂L/∂S of NS_k(S) from G = ∂L/∂NS_k(S), the iterates as ``_ns_keep`` left them: per step from the last (A, B
    symmetric), ∂B = G Xᵀ, E = ∂B + ∂Bᵀ, ∂A + ∂Aᵀ = bE + c(EA + (EA)ᵀ), G ← aG + BG + (∂A + ∂Aᵀ) X; then the
    normalisation's, each of the two matrices on its own (``_norms``; ∂B zero between them). G is carried in SCG
    [BR, BC] (float32) and the products over C are taken in column tiles of BCT (the operands of one product then fit
    sm_90's shared memory in tf32: ∂B sums over the tiles, G's update is per tile), over the first CU columns only
    (beyond them S, every X and G are zero: padding); each tile of the new G goes into the next step's ∂B as it is
    made (G is read from the scratch once a step)."""
    at, aq = offs_r[:, None] * BC + offs_c[None, :], offs_r[:, None] * BR + offs_r[None, :]
    used = (offs_r[:, None] < BR) & (offs_c[None, :] < CU)
    same = (offs_r[:, None] < HALF) == (offs_r[None, :] < HALF)
    offs_ct = tl.arange(0, BCT)
    tl.store(SCG + at, G, mask=used)
    tl.debug_barrier()
    dB = tl.zeros([BR, BR], dtype=tl.float32)  # the last step's ∂B = G Xᵀ_{k−1}
    for c0 in tl.static_range(0, CU, BCT):
        tile = offs_r[:, None] * BC + (c0 + offs_ct)[None, :]
        dB += dot(tl.load(SCG + tile), tl.trans(tl.load(SCR + (STEPS - 1) * BR * BC + tile)), DT, PREC)
    for jj in tl.static_range(STEPS):
        j = STEPS - 1 - jj
        A = tl.load(SCQ + 2 * j * BR * BR + aq)
        B = tl.load(SCQ + (2 * j + 1) * BR * BR + aq)
        dB = tl.where(same, dB, 0.0)
        E = dB + tl.trans(dB)
        F = dot(E, A, DT, PREC)
        P = NS_B * E + NS_C * (F + tl.trans(F))
        dB = tl.zeros([BR, BR], dtype=tl.float32)  # the next step's ∂B = G Xᵀ_{j−1}, a tile of G at a time
        for c0 in tl.static_range(0, CU, BCT):
            tile = offs_r[:, None] * BC + (c0 + offs_ct)[None, :]
            Gt = tl.load(SCG + tile)
            Gt = NS_A * Gt + dot(B, Gt, DT, PREC) + dot(P, tl.load(SCR + j * BR * BC + tile), DT, PREC)
            tl.debug_barrier()  # the tile read by every thread, before any overwrites it
            tl.store(SCG + tile, Gt)
            if jj < STEPS - 1:
                dB += dot(Gt, tl.trans(tl.load(SCR + (j - 1) * BR * BC + tile)), DT, PREC)
        tl.debug_barrier()  # the step's G stored, before the next reads it
    G = tl.load(SCG + at, mask=used, other=0.0)
    tl.debug_barrier()  # every read done, before the next token's iterates overwrite them
    norm, top, gs = _norms(S, offs_r, HALF), offs_r < HALF, tl.sum(G * S, axis=1)
    gs = tl.where(top, tl.sum(tl.where(top, gs, 0.0)), tl.sum(tl.where(top, 0.0, gs)))  # ⟨G, S⟩ of each matrix
    r = norm + 1e-7
    return G / r[:, None] - S * (gs / (r * r * tl.maximum(norm, 1e-30)))[:, None]


@triton.jit
def _layer(acc, ends, x_in, S, d, x, cw, C2, sc, n, last, offs_t, offs_r, HALF: tl.constexpr, STEPS: tl.constexpr,
           NS_A: tl.constexpr, NS_B: tl.constexpr, NS_C: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    """One weight matrix's per-token terms over a chunk, added to ``acc`` [BT, R] and ``ends`` [R, C]:
    Σ_j Cw[:, j] (x_in D_jᵀ) (the read-out's) and Σ_j Cw[n, j] D_j (the end weights'), D_j = NS_k(S_j),
    S_j = s_j S_p + Σ_i C'[j, i] d_i x_iᵀ. x_in [BT, C]: the layer's inputs at the chunk's tokens; d [BK, R], x [BK, C]:
    the window keys' factors; sc: the momentum's s. Rows < HALF and the rest are two matrices, each its own NS_k
    (a gated first layer; HALF = R: one)."""
    for j in range(0, n):
        cs_j, s_j, cw_j = _row(C2, j, offs_t), tl.sum(tl.where(offs_t == j, sc, 0.0)), _col(cw, j, offs_t)
        Dj = _ns(s_j * S + dot(tl.trans(d * cs_j[:, None]), x, DT, PREC), offs_r, HALF, STEPS, NS_A, NS_B, NS_C, DT,
                 PREC)
        acc += cw_j[:, None] * dot(x_in, tl.trans(Dj), DT, PREC)
        ends += tl.sum(tl.where(last, cw_j, 0.0)) * Dj
    return acc, ends


@triton.jit
def _layer_back(dx_in, dcw, dC2, ds, x_in, g, S, G, H, d, x, cw, C2, sc, n, last, offs_t, SCR, SCG, SCQ, offs_r,
                offs_c, BR: tl.constexpr, BC: tl.constexpr, BCT: tl.constexpr, CU: tl.constexpr, HALF: tl.constexpr,
                BK: tl.constexpr,
                STEPS: tl.constexpr, NS_A: tl.constexpr, NS_B: tl.constexpr, NS_C: tl.constexpr, DT: tl.constexpr,
                PREC: tl.constexpr):
    """``_layer`` backward for one weight matrix, g [BT, R] the gradient of its read-out terms, G and H those of the
    end weights and momentum: the D_j again, ∂D_j = (Cw[:, j] ⊙ g)ᵀ x_in + Cw[n, j] G, ∂S_j = NS_k'(S_j)ᵀ ∂D_j (+ H at
    j = n). Adds to ∂x_in, ∂Cw, ∂C', ∂s; returns them with ∂S_p [BR, BC], ∂d [BK, BR] and ∂x [BK, BC]."""
    dS = tl.zeros([BR, BC], dtype=tl.float32)
    gd = tl.zeros([BK, BR], dtype=tl.float32)
    gx = tl.zeros([BK, BC], dtype=tl.float32)
    for j in range(0, n):
        cs_j, s_j, cw_j = _row(C2, j, offs_t), tl.sum(tl.where(offs_t == j, sc, 0.0)), _col(cw, j, offs_t)
        col = offs_t[None, :] == j
        Sj = s_j * S + dot(tl.trans(d * cs_j[:, None]), x, DT, PREC)
        Dj = _ns_keep(Sj, SCR, SCQ, offs_r, offs_c, BR, BC, CU, HALF, STEPS, NS_A, NS_B, NS_C, DT, PREC)
        dx_in += cw_j[:, None] * dot(g, Dj, DT, PREC)
        dcw += tl.where(col, tl.sum(g * dot(x_in, tl.trans(Dj), DT, PREC), axis=1)[:, None], 0.0)
        dcw += tl.where(col & last[:, None], tl.sum(G * Dj), 0.0)
        dD = dot(tl.trans(g * cw_j[:, None]), x_in, DT, PREC) + tl.sum(tl.where(last, cw_j, 0.0)) * G
        dSj = _ns_back(Sj, dD, SCR, SCG, SCQ, offs_r, offs_c, BR, BC, BCT, CU, HALF, STEPS, NS_A, NS_B, NS_C, DT,
                       PREC)
        dSj += (j == n - 1).to(tl.float32) * H
        dS += s_j * dSj
        ds += tl.where(offs_t == j, tl.sum(dSj * S), 0.0)
        xS = dot(x, tl.trans(dSj), DT, PREC)  # [BK, BR]
        gd += cs_j[:, None] * xS
        gx += cs_j[:, None] * dot(d, dSj, DT, PREC)
        dC2 += tl.where((offs_t == j)[:, None], tl.sum(d * xS, axis=1)[None, :], 0.0)
    return dx_in, dcw, dC2, ds, dS, gd, gx


# ---------------------------------------------------------------- the forward walk

@triton.jit(do_not_specialize=["T", "L", "m0", "offset", "b", "c", "NC"])
def chunk_mlp_muon_fwd_kernel(Q, K, V, GAMMA, A, S, CW, CS, W10, W20, S10, S20, WE10, WE20,
                              Y, ZQ, W1T, W2T, S1T, S2T, WE1T, WE2T, W1H, W2H, S1H, S2H,
                              T, L, m0, offset, b, c, NC,
                              D: tl.constexpr, HD: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr,
                              BK: tl.constexpr, BD: tl.constexpr, BH: tl.constexpr, BV: tl.constexpr,
                              L2: tl.constexpr, ACT: tl.constexpr, EVAL: tl.constexpr, GATED: tl.constexpr,
                              HD1: tl.constexpr, BH1: tl.constexpr, STEPS: tl.constexpr, NS_A: tl.constexpr,
                              NS_B: tl.constexpr, NS_C: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    i_n = tl.program_id(0)
    offs_t, offs_k = tl.arange(0, BT), tl.arange(0, BK)
    offs_d, offs_h, offs_v, offs_h1 = tl.arange(0, BD), tl.arange(0, BH), tl.arange(0, BV), tl.arange(0, BH1)
    Q, A, S, CW, CS, Y = Q + i_n * T * D, A + i_n * T, S + i_n * T, CW + i_n * T * b, CS + i_n * T * b, \
        Y + i_n * T * DV
    K, V, GAMMA, ZQ = K + i_n * L * D, V + i_n * L * DV, GAMMA + i_n * L, ZQ + i_n * T * BH1
    W1 = _load1(W10 + i_n * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)
    W2 = _load_state(W20 + i_n * DV * HD, offs_v, offs_h, DV, HD)
    S1 = _load1(S10 + i_n * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)
    S2 = _load_state(S20 + i_n * DV * HD, offs_v, offs_h, DV, HD)
    E1, E2 = W1, W2
    if EVAL:  # the first chunk continues one: its gradients at the given W̃
        E1 = _load1(WE10 + i_n * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)
        E2 = _load_state(WE20 + i_n * DV * HD, offs_v, offs_h, DV, HD)
    for ci in range(NC):
        at = i_n * NC + ci
        _store1(W1H + at * HD1 * D, W1, offs_h1, offs_d, HD, D, BH, GATED)  # the checkpoints the backward takes
        _store_state(W2H + at * DV * HD, W2, offs_v, offs_h, DV, HD)
        _store1(S1H + at * HD1 * D, S1, offs_h1, offs_d, HD, D, BH, GATED)
        _store_state(S2H + at * DV * HD, S2, offs_v, offs_h, DV, HD)
        t0, n = _chunk(ci, b, offset, T)
        rows = t0 + offs_t
        rmask = offs_t < n
        last = offs_t == n - 1
        cmask = rmask[:, None] & rmask[None, :]
        idx, kmask, band, gam, u, h, sg, dsg, ddsg, gate, d2, back, d1 = _factors(
            K, V, GAMMA, E1, E2, t0, n, m0, c, offs_t, offs_k, offs_d, offs_h, offs_v, D, DV, L2, ACT, GATED, BK, BH,
            DT, PREC)
        cw = tl.load(CW + rows[:, None] * b + offs_t[None, :], mask=cmask, other=0.0).to(tl.float32)
        cs = tl.load(CS + rows[:, None] * b + offs_t[None, :], mask=cmask, other=0.0)
        C2 = dot(cs, gam, DT, PREC)  # C' [BT, BK]
        a = tl.load(A + rows, mask=rmask, other=0.0).to(tl.float32)
        sc = tl.load(S + rows, mask=rmask, other=0.0).to(tl.float32)
        a_n = tl.sum(tl.where(last, a, 0.0))
        uq = _rows(Q, rows, rmask, offs_d, D)
        zq, W1n = _layer(a[:, None] * dot(uq, tl.trans(W1), DT, PREC), a_n * W1, uq, S1, d1, u, cw, C2, sc, n, last,
                         offs_t, offs_h1, BH, STEPS, NS_A, NS_B, NS_C, DT, PREC)
        _store_state(ZQ + t0 * BH1, zq, offs_t, offs_h1, n, BH1)  # the first layer's read-out, for the backward
        hq, _, _, _, _ = _hidden(zq, ACT, GATED, BT, BH)
        y, W2n = _layer(a[:, None] * dot(hq, tl.trans(W2), DT, PREC), a_n * W2, hq, S2, d2, h, cw, C2, sc, n, last,
                        offs_t, offs_v, BV, STEPS, NS_A, NS_B, NS_C, DT, PREC)
        _store_state(Y + t0 * DV, y, offs_t, offs_v, n, DV)
        cs_n, s_n = _last(C2, last), tl.sum(tl.where(last, sc, 0.0))
        S1 = s_n * S1 + dot(tl.trans(d1 * cs_n[:, None]), u, DT, PREC)
        S2 = s_n * S2 + dot(tl.trans(d2 * cs_n[:, None]), h, DT, PREC)
        _store1(WE1T + i_n * HD1 * D, E1, offs_h1, offs_d, HD, D, BH, GATED)  # W̃ of the last chunk (continued)
        _store_state(WE2T + i_n * DV * HD, E2, offs_v, offs_h, DV, HD)
        W1, W2 = W1n, W2n
        E1, E2 = W1, W2
    _store1(W1T + i_n * HD1 * D, W1, offs_h1, offs_d, HD, D, BH, GATED)
    _store_state(W2T + i_n * DV * HD, W2, offs_v, offs_h, DV, HD)
    _store1(S1T + i_n * HD1 * D, S1, offs_h1, offs_d, HD, D, BH, GATED)
    _store_state(S2T + i_n * DV * HD, S2, offs_v, offs_h, DV, HD)


# ---------------------------------------------------------------- the backward walk

@triton.jit(do_not_specialize=["T", "L", "m0", "offset", "b", "c", "NC"])
def chunk_mlp_muon_bwd_kernel(Q, K, V, GAMMA, A, S, CW, CS, WE10, WE20, W1H, W2H, S1H, S2H, ZQ, DY,
                              GW1, GW2, GS1, GS2, GE1, GE2,
                              DQ, DK, DVV, DGAMMA, DA, DS, DCW, DCS, DW10, DW20, DS10, DS20, DWE10, DWE20,
                              SCR1, SCR2, SCG1, SCG2, SCQ1, SCQ2, T, L, m0, offset, b, c, NC,
                              D: tl.constexpr, HD: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr,
                              BK: tl.constexpr, BD: tl.constexpr, BH: tl.constexpr, BV: tl.constexpr,
                              BDT: tl.constexpr, DU: tl.constexpr, L2: tl.constexpr, ACT: tl.constexpr,
                              EVAL: tl.constexpr,
                              GATED: tl.constexpr, HD1: tl.constexpr, BH1: tl.constexpr, STEPS: tl.constexpr,
                              NS_A: tl.constexpr, NS_B: tl.constexpr, NS_C: tl.constexpr, DT: tl.constexpr,
                              PREC: tl.constexpr):
    i_n = tl.program_id(0)
    offs_t, offs_k = tl.arange(0, BT), tl.arange(0, BK)
    offs_d, offs_h, offs_v, offs_h1 = tl.arange(0, BD), tl.arange(0, BH), tl.arange(0, BV), tl.arange(0, BH1)
    Q, A, S, CW, CS, DY = Q + i_n * T * D, A + i_n * T, S + i_n * T, CW + i_n * T * b, CS + i_n * T * b, \
        DY + i_n * T * DV
    ZQ = ZQ + i_n * T * BH1
    DQ, DA, DS, DCW, DCS = DQ + i_n * T * D, DA + i_n * T, DS + i_n * T, DCW + i_n * T * b, DCS + i_n * T * b
    K, V, GAMMA = K + i_n * L * D, V + i_n * L * DV, GAMMA + i_n * L
    DK, DVV, DGAMMA = DK + i_n * L * D, DVV + i_n * L * DV, DGAMMA + i_n * L
    SCR1, SCR2 = SCR1 + i_n * STEPS * BH1 * BD, SCR2 + i_n * STEPS * BV * BH
    SCG1, SCG2 = SCG1 + i_n * BH1 * BD, SCG2 + i_n * BV * BH
    SCQ1, SCQ2 = SCQ1 + i_n * STEPS * 2 * BH1 * BH1, SCQ2 + i_n * STEPS * 2 * BV * BV
    G1 = _load1(GW1 + i_n * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)  # ∂L/∂W_end of the chunk being walked
    G2 = _load_state(GW2 + i_n * DV * HD, offs_v, offs_h, DV, HD)
    H1 = _load1(GS1 + i_n * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)  # ∂L/∂S_end
    H2 = _load_state(GS2 + i_n * DV * HD, offs_v, offs_h, DV, HD)
    X1 = _load1(GE1 + i_n * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)  # ∂L/∂W̃ of the last chunk (its output)
    X2 = _load_state(GE2 + i_n * DV * HD, offs_v, offs_h, DV, HD)
    for cj in range(NC):
        ci = NC - 1 - cj
        at = i_n * NC + ci
        W1 = _load1(W1H + at * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)
        W2 = _load_state(W2H + at * DV * HD, offs_v, offs_h, DV, HD)
        S1 = _load1(S1H + at * HD1 * D, offs_h1, offs_d, HD, D, BH, GATED)
        S2 = _load_state(S2H + at * DV * HD, offs_v, offs_h, DV, HD)
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
        cw = tl.load(CW + rows[:, None] * b + offs_t[None, :], mask=cmask, other=0.0).to(tl.float32)
        cs = tl.load(CS + rows[:, None] * b + offs_t[None, :], mask=cmask, other=0.0)
        C2 = dot(cs, gam, DT, PREC)
        a = tl.load(A + rows, mask=rmask, other=0.0).to(tl.float32)
        sc = tl.load(S + rows, mask=rmask, other=0.0).to(tl.float32)
        a_n = tl.sum(tl.where(last, a, 0.0))
        uq = _rows(Q, rows, rmask, offs_d, D)
        dy = _rows(DY, rows, rmask, offs_v, DV)
        hq, sq, dsq, _, gq = _hidden(_rows(ZQ, rows, rmask, offs_h1, BH1), ACT, GATED, BT, BH)  # the forward's zq
        # the second layer: y = a W2 hq + Σ_j Cw[:, j] D2_j hq;  W2_end = a_n W2 + Σ_j Cw[n, j] D2_j
        da = tl.sum(dy * dot(hq, tl.trans(W2), DT, PREC), axis=1)
        da += tl.where(last, tl.sum(G1 * W1) + tl.sum(G2 * W2), 0.0)
        dW2 = dot(tl.trans(dy * a[:, None]), hq, DT, PREC) + a_n * G2
        ghq, dcw, dC2, ds, dS2, gd2, gh = _layer_back(
            a[:, None] * dot(dy, W2, DT, PREC), tl.zeros([BT, BT], dtype=tl.float32),
            tl.zeros([BT, BK], dtype=tl.float32), tl.zeros([BT], dtype=tl.float32), hq, dy, S2, G2, H2, d2, h, cw,
            C2, sc, n, last, offs_t, SCR2, SCG2, SCQ2, offs_v, offs_h, BV, BH, BH, BH, BV, BK, STEPS, NS_A, NS_B, NS_C,
            DT, PREC)
        # the first layer: zq = a W1 uq + Σ_j Cw[:, j] D1_j uq;  W1_end = a_n W1 + Σ_j Cw[n, j] D1_j
        gzq = _hidden_back(ghq, sq, dsq, gq, GATED, BT, BH)
        da += tl.sum(gzq * dot(uq, tl.trans(W1), DT, PREC), axis=1)
        dW1 = dot(tl.trans(gzq * a[:, None]), uq, DT, PREC) + a_n * G1
        duq, dcw, dC2, ds, dS1, gd1, gu = _layer_back(
            a[:, None] * dot(gzq, W1, DT, PREC), dcw, dC2, ds, uq, gzq, S1, G1, H1, d1, u, cw, C2, sc, n, last, offs_t,
            SCR1, SCG1, SCQ1, offs_h1, offs_d, BH1, BD, BDT, DU, BH, BK, STEPS, NS_A, NS_B, NS_C, DT, PREC)
        dgam = dot(tl.trans(cs), dC2, DT, PREC)
        dcs = dot(dC2, tl.trans(gam), DT, PREC)
        gd2, gu, dE1, dE2 = _factors_back(gd1, gd2, gh, gu, u, h, sg, dsg, ddsg, gate, d2, back, E1, E2, L2, GATED,
                                          BK, BH, DT, PREC)
        if cj == 0:  # the last chunk's W̃ is an output too
            dE1 += X1
            dE2 += X2
        _key_grads(DK, DVV, DGAMMA, idx, kmask, band, gu, gd2, dgam, offs_d, offs_v, D, DV)
        _store_state(DQ + t0 * D, duq, offs_t, offs_d, n, D)
        tl.store(DA + rows, da, mask=rmask)
        tl.store(DS + rows, ds, mask=rmask)
        tl.store(DCW + rows[:, None] * b + offs_t[None, :], dcw, mask=cmask)
        tl.store(DCS + rows[:, None] * b + offs_t[None, :], dcs, mask=cmask)
        G1, G2 = dW1 + dE1, dW2 + dE2
        if EVAL:  # the first chunk's W̃ is the input We, not W_p
            if ci == 0:
                _store1(DWE10 + i_n * HD1 * D, dE1, offs_h1, offs_d, HD, D, BH, GATED)
                _store_state(DWE20 + i_n * DV * HD, dE2, offs_v, offs_h, DV, HD)
                G1, G2 = dW1, dW2
        H1, H2 = dS1, dS2
    _store1(DW10 + i_n * HD1 * D, G1, offs_h1, offs_d, HD, D, BH, GATED)
    _store_state(DW20 + i_n * DV * HD, G2, offs_v, offs_h, DV, HD)
    _store1(DS10 + i_n * HD1 * D, H1, offs_h1, offs_d, HD, D, BH, GATED)
    _store_state(DS20 + i_n * DV * HD, H2, offs_v, offs_h, DV, HD)


# ---------------------------------------------------------------- launches

TILE_BYTES = 32 * 1024  # the backward's Newton–Schulz steps take W1's products in column tiles of ≤ 32 KB operands
# (64 × 128 in float32; ``column_tiles`` takes a smaller one where it covers fewer padded columns): compiled for
# sm_90 at W1 64 × 153 in tf32 (tests/kernels/sm90_resources.py) its backward needed 193 KB of shared memory in tiles
# of 128, 225 KB untiled through the same scratch, 291 KB with G in registers


def column_tiles(D, largest):
    """(tile, columns): the column tile of W1's steps back (a power of two from 16 to ``largest``) and the columns its
    tiles cover, ⌈D / tile⌉ · tile: the fewest such columns, then the largest tile (D 153 by ≤ 128: 32 and 160, where
    tiles of 128 would take 256)."""
    tiles = [16 << i for i in range(max(largest // 16, 1).bit_length())]
    tile = min(tiles, key=lambda t: (-(-D // t) * t, -t))
    return tile, -(-D // tile) * tile


def ns_flops(R, C, steps):
    """2·m·n·k of one NS_k's products on an R × C matrix: A = X Xᵀ, A², B X per step."""
    return 2 * steps * (2 * R * R * C + R ** 3)


def ns_back_flops(R, C, steps):
    """``_ns_back``'s: per step ∂B = G Xᵀ, E A, B G, (∂A + ∂Aᵀ) X."""
    return 2 * steps * (3 * R * R * C + R ** 3)


def launches(N, T, D, HD, DV, *, chunk_size, window, bias="l2", steps=5, offset=0, gated=False,
             dtype=torch.float32):
    """Each launch of a forward and backward call: {kernel: (grid, programs, dot FLOPs)} for N sequences of T new
    tokens. FLOPs as the tensor cores take them: 2·m·n·k of every ``tl.dot`` at its blocks' sizes (``launch_options``:
    BT a chunk's rows, BK its window's keys, BD, BH, BV, BH1; a chunk of n tokens loops n times), so padding counts
    (W1 64 × 153 is a 64 × 256 block; its steps back take DU = 160 columns); gated: the first layer's 2·HD rows,
    their Newton–Schulz products on the stacked pair."""
    o = launch_options(D, HD, DV, chunk_size, window, bias, "gelu", dtype, False, steps, "quintic", gated=gated)
    NC = chunk_count(T, chunk_size, offset)
    l2, BT, BK, BD, H, V, H1 = int(bias == "l2"), o["BT"], o["BK"], o["BD"], o["BH"], o["BV"], o["BH1"]
    ns1, ns2 = ns_flops(H1, BD, steps), ns_flops(V, H, steps)
    back1, back2 = ns_back_flops(H1, o["DU"], steps), ns_back_flops(V, H, steps)
    factors = BK * H1 * BD + (1 + l2) * BK * V * H  # z = U W̃1ᵀ, W̃2 h (l2), W̃2ᵀ δ2
    weights = H1 * BD + V * H
    recomputed = factors + BT * BT * BK  # C'; the D_j again in ``_layer_back``
    # per chunk, and per token: a chunk of n tokens loops n times, and the chunks' tokens add up to T
    fwd = NC * 2 * (factors + BT * BT * BK + BT * weights + BK * weights) + T * (2 * (BK + BT) * weights + ns1 + ns2)
    # ∂uq, ∂a, ∂W1 (∂h, ∂a, ∂W2); per token S_j, ∂x_in, ∂Cw, ∂D, ∂S's two products back to the factors
    bwd = NC * 2 * (recomputed + 3 * BT * weights + 2 * BT * BT * BK + 2 * (1 + l2) * BK * H * V + 2 * BK * H1 * BD) \
        + T * (6 * (BK + BT) * weights + ns1 + back1 + ns2 + back2)
    return {"chunk_mlp_muon_fwd_kernel": ((N,), N, N * fwd), "chunk_mlp_muon_bwd_kernel": ((N,), N, N * bwd)}


def scratch_bytes(N, T, D, HD, DV, *, chunk_size, steps=5, gated=False, dtype=torch.float32) -> int:
    """Bytes the backward moves through its scratch (global memory) in one call of N sequences of T tokens: per token
    and weight matrix R × C (C: the columns its steps back take), ``_ns_keep`` stores X_0 … X_{k−1} and each step's A,
    B (in ``dtype``, as the dots read them); ``_ns_back`` stores G (float32) and loads it and X_{k−1} (the last step's
    ∂B), then per step loads A, B, G and X_j, stores G and (but the first step's) loads X_{j−1}, and loads G once
    more. The forward has none."""
    o = launch_options(D, HD, DV, chunk_size, 1, "l2", "gelu", dtype, False, steps, "quintic", gated=gated)
    e = dtype.itemsize
    per_token = sum(e * (steps * R * C + 4 * steps * R * R + R * C + steps * R * C + (steps - 1) * R * C)
                    + 4 * (3 * R * C + 2 * steps * R * C) for R, C in ((o["BH1"], o["DU"]), (o["BV"], o["BH"])))
    return N * T * per_token


def launch_options(D, HD, DV, chunk_size, window, bias, activation, dtype, evaluated, steps, coefficients,
                   prec=None, gated=False) -> dict:
    """The constexprs, num_warps and num_stages of both launches of one call (``triton._config``'s blocks; gated:
    a gated first layer, its pair one block of 2·BH rows)."""
    cfg = _config(D, HD, DV, chunk_size, window)
    a, b, c = NS_COEFFICIENTS[coefficients]
    BH1 = cfg["BH"] * (1 + int(gated))
    BDT, DU = column_tiles(D, min(cfg["BD"], max(16, TILE_BYTES // (BH1 * dtype.itemsize))))
    return dict(D=D, HD=HD, DV=DV, BT=cfg["BT"], BK=cfg["BK"], BD=cfg["BD"], BH=cfg["BH"], BV=cfg["BV"],
                BDT=BDT, DU=DU, L2=bias == "l2",
                ACT=ACTS.index(activation), EVAL=evaluated, GATED=gated, HD1=HD * (1 + int(gated)), BH1=BH1,
                STEPS=steps, NS_A=a, NS_B=b, NS_C=c, DT=DTYPES[dtype],
                PREC=dot_precision(dtype) if prec is None else prec,
                num_warps=4 if BH1 * cfg["BD"] <= 4096 else 8, num_stages=cfg["num_stages"])


class ChunkMLPMuonFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, gamma, a, s, Cw, Cs, W1, W2, S1, S2, We1, We2, offset, chunk_size, window, bias,
                activation, evaluated, steps, coefficients, gated):
        N, T, D = q.shape
        L, DV, HD, HD1 = k.shape[1], v.shape[-1], W2.shape[-1], W1.shape[1]
        NC = chunk_count(T, chunk_size, offset)
        opts = launch_options(D, HD, DV, chunk_size, window, bias, activation, q.dtype, evaluated, steps,
                              coefficients, gated=gated)
        f32 = dict(dtype=torch.float32, device=q.device)
        W1H, W2H = torch.empty(N, NC, HD1, D, **f32), torch.empty(N, NC, DV, HD, **f32)
        S1H, S2H = torch.empty_like(W1H), torch.empty_like(W2H)
        y, zq = torch.empty(N, T, DV, dtype=q.dtype, device=q.device), torch.empty(N, T, opts["BH1"], **f32)
        W1T, W2T, S1T, S2T, WE1, WE2 = (torch.empty_like(x) for x in (W1, W2, S1, S2, W1, W2))
        chunk_mlp_muon_fwd_kernel[(N,)](
            q, k, v, gamma, a, s, Cw, Cs, W1, W2, S1, S2, We1, We2, y, zq, W1T, W2T, S1T, S2T, WE1, WE2,
            W1H, W2H, S1H, S2H, T, L, L - T, offset, chunk_size, window, NC,
            **{n: x for n, x in opts.items() if n not in ("BDT", "DU")})  # the backward's tiles
        ctx.save_for_backward(q, k, v, gamma, a, s, Cw, Cs, We1, We2, W1H, W2H, S1H, S2H, zq)
        ctx.args = (offset, chunk_size, window, evaluated, NC, opts)
        return y, W1T, W2T, S1T, S2T, WE1, WE2

    @staticmethod
    def backward(ctx, dy, dW1T, dW2T, dS1T, dS2T, dWE1, dWE2):
        q, k, v, gamma, a, s, Cw, Cs, We1, We2, W1H, W2H, S1H, S2H, zq = ctx.saved_tensors
        offset, chunk_size, window, evaluated, NC, opts = ctx.args
        N, T, D = q.shape
        L, DV = k.shape[1], v.shape[-1]
        f32 = dict(dtype=torch.float32, device=q.device)

        def given(x, like):  # an output without a gradient: zeros
            return torch.zeros(like.shape, **f32) if x is None else x.float().contiguous()

        G = [given(x, like) for x, like in ((dW1T, We1), (dW2T, We2), (dS1T, We1), (dS2T, We2), (dWE1, We1),
                                            (dWE2, We2))]
        dq, dk, dv = torch.empty(N, T, D, **f32), torch.zeros(N, L, D, **f32), torch.zeros(N, L, DV, **f32)
        dgamma, da, ds = torch.zeros(N, L, **f32), torch.empty(N, T, **f32), torch.empty(N, T, **f32)
        dCw, dCs = torch.zeros(N, T, chunk_size, **f32), torch.zeros(N, T, chunk_size, **f32)
        dW = [torch.empty(x.shape, **f32) for x in (We1, We2, We1, We2, We1, We2)]
        BD, BH, BH1, BV, steps = opts["BD"], opts["BH"], opts["BH1"], opts["BV"], opts["STEPS"]
        low = dict(dtype=q.dtype, device=q.device)  # the iterates, A and B as the dots read them; G in float32
        scratch = [torch.empty(N, steps, BH1, BD, **low), torch.empty(N, steps, BV, BH, **low),
                   torch.empty(N, BH1, BD, **f32), torch.empty(N, BV, BH, **f32),
                   torch.empty(N, steps, 2, BH1, BH1, **low), torch.empty(N, steps, 2, BV, BV, **low)]
        chunk_mlp_muon_bwd_kernel[(N,)](
            q, k, v, gamma, a, s, Cw, Cs, We1, We2, W1H, W2H, S1H, S2H, zq, dy.to(q.dtype).contiguous(), *G,
            dq, dk, dv, dgamma, da, ds, dCw, dCs, *dW, *scratch, T, L, L - T, offset, chunk_size, window, NC, **opts)
        dW1, dW2, dS1, dS2, dWe1, dWe2 = dW
        like = a.dtype
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dgamma.to(gamma.dtype), da.to(like), ds.to(like),
                dCw.to(like), dCs.to(like), dW1.to(We1.dtype), dW2.to(We2.dtype), dS1.to(We1.dtype),
                dS2.to(We2.dtype), dWe1.to(We1.dtype) if evaluated else None,
                dWe2.to(We2.dtype) if evaluated else None, None, None, None, None, None, None, None, None, None)


@torch.compiler.disable  # a compiled graph calls it as it is (a graph break): its launches are fused already
def chunk_mlp_muon(q, k, v, gamma, a, s, Cw, Cs, W1, W2, S1, S2, We1, We2, *, offset, chunk_size, window, bias,
                   activation, ns_steps, ns_coefficients, gated=False):
    """Muon on a 2-layer MLP memory over T new tokens in one forward and one backward launch (module docstring;
    gated: Atlas++'s gated first layer, W1 = [W_a; W_b] [2H, D] as ``triton.chunk_mlp_memory`` takes it, the
    Newton–Schulz of W_a and W_b each on its own).

    q: φ(q) [N, T, D]; k: φ(k) [N, L, D], v [N, L, d_v] (less the residual with l2), gamma [N, L] for the window
    cache followed by the new tokens; a, s [N, T], Cw, Cs [N, T, b]: the per-token rows of each chunk's closed form;
    W1 [N, H, D], W2 [N, d_v, H] and the momenta S1, S2 at the start; We1, We2: W̃ of the first chunk (W1, W2 unless
    ``offset`` > 0). Returns (y [N, T, d_v] without the residual, W1_T, W2_T, S1_T, S2_T, W̃1, W̃2 of the last chunk).
    """
    args = [x.contiguous() for x in (q, k, v, gamma, a, s, Cw, Cs, W1, W2, S1, S2, We1, We2)]
    return ChunkMLPMuonFunction.apply(*args, offset, chunk_size, window, bias, activation, offset > 0, ns_steps,
                                      ns_coefficients, gated)
