"""Batched Newton–Schulz: NS_k on many small matrices in one launch (docs/memory.md §3, muon).

    X_0 = G / (‖G‖_F + ε)      (on Gᵀ when rows > cols, so X is [r, c] with r ≤ c)
    k times:  A = X Xᵀ,  X ← a X + (b A + c A²) X

One program per matrix; the k iterations are fused. A, B = bA + cA² ([r, r], r ≤ 128) stay in
registers; X ([r, c], c ≤ 512) stays in registers when it fits one column block and is otherwise
streamed through an fp32 workspace in column blocks — every column block of X ← aX + BX needs only
B and itself. Inputs may be fp32, fp16 or bf16; the iterates and all element-wise arithmetic are fp32,
the result is cast back. The products run on tensor cores (``ns_precision``): tf32 for float32 inputs
where torch's float32 matmul precision allows it (IEEE fp32 otherwise), and tf32 for float16 and
bfloat16 inputs, whose result is rounded to their 11 or 8 bits (tf32 keeps 11); fp32 accumulation.

Backward (recomputation): the backward kernel recomputes the iterates X_0..X_{k−1} into a workspace
(nothing is kept from the forward) and runs the steps in reverse,

    dB = dX' Xᵀ,  dA = b dB + c (dB A + A dB),  dX = a dX' + B dX' + (dA + dAᵀ) X

then through the normalisation: dG = s dX_0 − s² ⟨dX_0, G⟩ / ‖G‖ · G with s = 1/(‖G‖ + ε).

The PyTorch reference is ``reference.newton_schulz`` (this folder).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .reference import NS_COEFFICIENTS
from ..dots import dot_precision
from ..limits import MAX_COLS, MAX_ROWS  # after the transpose to rows ≤ cols
from ..operators import register_like_input


def ns_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input_precision for Newton–Schulz of ``dtype`` inputs (the iterates are fp32): float32 as torch
    allows (``dot_precision``), tf32 for float16 and bfloat16."""
    return "tf32" if dtype in (torch.float16, torch.bfloat16) else dot_precision(dtype)


@triton.jit
def _normalize(G, X, stride_gr, stride_gc, R, C, eps, rows, BR: tl.constexpr, BC: tl.constexpr):
    """X_0 = G / (‖G‖_F + ε) written to the workspace X; returns ‖G‖_F."""
    sq = tl.zeros([BR, BC], dtype=tl.float32)
    for c0 in range(0, C, BC):
        cols = c0 + tl.arange(0, BC)
        mask = (rows < R)[:, None] & (cols < C)[None, :]
        g = tl.load(G + rows[:, None] * stride_gr + cols[None, :] * stride_gc, mask=mask, other=0.0).to(tl.float32)
        sq += g * g
    norm = tl.sqrt(tl.sum(sq))
    scale = 1.0 / (norm + eps)
    for c0 in range(0, C, BC):
        cols = c0 + tl.arange(0, BC)
        mask = (rows < R)[:, None] & (cols < C)[None, :]
        g = tl.load(G + rows[:, None] * stride_gr + cols[None, :] * stride_gc, mask=mask, other=0.0).to(tl.float32)
        tl.store(X + rows[:, None] * C + cols[None, :], g * scale, mask=mask)
    tl.debug_barrier()
    return norm


@triton.jit
def _gram(X, R, C, rows, BR: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr):
    """A = X Xᵀ over the column blocks of the workspace X [R, C]."""
    A = tl.zeros([BR, BR], dtype=tl.float32)
    for c0 in range(0, C, BC):
        cols = c0 + tl.arange(0, BC)
        mask = (rows < R)[:, None] & (cols < C)[None, :]
        x = tl.load(X + rows[:, None] * C + cols[None, :], mask=mask, other=0.0)
        A += tl.dot(x, tl.trans(x), input_precision=PREC)
    return A


@triton.jit
def _poly(A, b, c, QUINTIC: tl.constexpr, PREC: tl.constexpr):
    """B = b A + c A² (c = 0 for the cubic coefficients)."""
    B = b * A
    if QUINTIC:
        B += c * tl.dot(A, A, input_precision=PREC)
    return B


@triton.jit
def _step(X, Y, A, a, b, c, R, C, rows, QUINTIC: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
          PREC: tl.constexpr):
    """Y ← a X + (b A + c A²) X, column block by column block (Y may be X)."""
    B = _poly(A, b, c, QUINTIC, PREC)
    for c0 in range(0, C, BC):
        cols = c0 + tl.arange(0, BC)
        mask = (rows < R)[:, None] & (cols < C)[None, :]
        x = tl.load(X + rows[:, None] * C + cols[None, :], mask=mask, other=0.0)
        tl.store(Y + rows[:, None] * C + cols[None, :], a * x + tl.dot(B, x, input_precision=PREC), mask=mask)
    tl.debug_barrier()


@triton.jit
def newton_schulz_fwd_kernel(G, X, stride_gb, stride_gr, stride_gc, R, C, a, b, c, eps,
                             STEPS: tl.constexpr, QUINTIC: tl.constexpr, ONE_BLOCK: tl.constexpr,
                             BR: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr):
    """G: [M, R, C] (any strides, R ≤ C) -> X = NS_k(G): [M, R, C] fp32, contiguous."""
    i = tl.program_id(0).to(tl.int64)
    G += i * stride_gb
    X += i * R * C
    rows = tl.arange(0, BR)
    if ONE_BLOCK:  # X fits one [BR, BC] block: keep it in registers for all k steps
        cols = tl.arange(0, BC)
        mask = (rows < R)[:, None] & (cols < C)[None, :]
        x = tl.load(G + rows[:, None] * stride_gr + cols[None, :] * stride_gc, mask=mask, other=0.0).to(tl.float32)
        x = x / (tl.sqrt(tl.sum(x * x)) + eps)
        for _ in range(STEPS):
            B = _poly(tl.dot(x, tl.trans(x), input_precision=PREC), b, c, QUINTIC, PREC)
            x = a * x + tl.dot(B, x, input_precision=PREC)
        tl.store(X + rows[:, None] * C + cols[None, :], x, mask=mask)
    else:
        _normalize(G, X, stride_gr, stride_gc, R, C, eps, rows, BR, BC)
        for _ in range(STEPS):
            _step(X, X, _gram(X, R, C, rows, BR, BC, PREC), a, b, c, R, C, rows, QUINTIC, BR, BC, PREC)


@triton.jit
def newton_schulz_bwd_kernel(G, Xs, dX, stride_gb, stride_gr, stride_gc, R, C, M, a, b, c, eps,
                             STEPS: tl.constexpr, QUINTIC: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
                             PREC: tl.constexpr):
    """dX: [M, R, C] fp32, holds ∂L/∂NS_k(G) on entry and ∂L/∂G on exit (in place).

    Xs: [STEPS, M, R, C] fp32 workspace for the recomputed iterates X_0..X_{k−1}.
    """
    i = tl.program_id(0).to(tl.int64)
    G += i * stride_gb
    dX += i * R * C
    rows = tl.arange(0, BR)
    size = M * R * C
    X0 = Xs + i * R * C
    norm = _normalize(G, X0, stride_gr, stride_gc, R, C, eps, rows, BR, BC)
    for j in range(STEPS - 1):
        Xj = X0 + j * size
        _step(Xj, Xj + size, _gram(Xj, R, C, rows, BR, BC, PREC), a, b, c, R, C, rows, QUINTIC, BR, BC,
              PREC)
    for jr in range(STEPS):
        Xj = X0 + (STEPS - 1 - jr) * size
        A = _gram(Xj, R, C, rows, BR, BC, PREC)
        B = _poly(A, b, c, QUINTIC, PREC)
        dB = tl.zeros([BR, BR], dtype=tl.float32)
        for c0 in range(0, C, BC):
            cols = c0 + tl.arange(0, BC)
            mask = (rows < R)[:, None] & (cols < C)[None, :]
            x = tl.load(Xj + rows[:, None] * C + cols[None, :], mask=mask, other=0.0)
            dx = tl.load(dX + rows[:, None] * C + cols[None, :], mask=mask, other=0.0)
            dB += tl.dot(dx, tl.trans(x), input_precision=PREC)
        dA = b * dB
        if QUINTIC:
            dA += c * (tl.dot(dB, A, input_precision=PREC) + tl.dot(A, dB, input_precision=PREC))
        sym = dA + tl.trans(dA)
        for c0 in range(0, C, BC):
            cols = c0 + tl.arange(0, BC)
            mask = (rows < R)[:, None] & (cols < C)[None, :]
            x = tl.load(Xj + rows[:, None] * C + cols[None, :], mask=mask, other=0.0)
            dx = tl.load(dX + rows[:, None] * C + cols[None, :], mask=mask, other=0.0)
            dx = a * dx + tl.dot(B, dx, input_precision=PREC) + tl.dot(sym, x, input_precision=PREC)
            tl.store(dX + rows[:, None] * C + cols[None, :], dx, mask=mask)
        tl.debug_barrier()
    # through X_0 = s G, s = 1 / (‖G‖ + ε)
    s = 1.0 / (norm + eps)
    inner = tl.zeros([BR, BC], dtype=tl.float32)
    for c0 in range(0, C, BC):
        cols = c0 + tl.arange(0, BC)
        mask = (rows < R)[:, None] & (cols < C)[None, :]
        g = tl.load(G + rows[:, None] * stride_gr + cols[None, :] * stride_gc, mask=mask, other=0.0).to(tl.float32)
        inner += g * tl.load(dX + rows[:, None] * C + cols[None, :], mask=mask, other=0.0)
    coef = tl.where(norm > 0, s * s * tl.sum(inner) / tl.maximum(norm, 1e-30), 0.0)
    for c0 in range(0, C, BC):
        cols = c0 + tl.arange(0, BC)
        mask = (rows < R)[:, None] & (cols < C)[None, :]
        g = tl.load(G + rows[:, None] * stride_gr + cols[None, :] * stride_gc, mask=mask, other=0.0).to(tl.float32)
        dx = tl.load(dX + rows[:, None] * C + cols[None, :], mask=mask, other=0.0)
        tl.store(dX + rows[:, None] * C + cols[None, :], s * dx - coef * g, mask=mask)


def launch_config(R: int, C: int) -> dict:
    """Block sizes and launch options of both kernels for matrices of R × C (R ≤ C): [BR, BC] blocks, 4 warps up to
    64 rows (8 beyond), one stage. Compiled for sm_90 (tests/kernels/sm90_resources.py), the column loops pipelined
    over the default 3 stages need 278,528 bytes of shared memory in the backward at 128 rows (IEEE; 327,680 in tf32),
    more than one block may use (232,448): one stage needs 131,072 there."""
    BR = max(16, triton.next_power_of_2(R))
    BC = max(16, min(triton.next_power_of_2(C), 128 if BR <= 64 else 64))
    return dict(BR=BR, BC=BC, num_warps=4 if BR <= 64 else 8, num_stages=1)


@torch.library.custom_op("atlas_lab::newton_schulz_triton", mutates_args=())
def newton_schulz_op(G: torch.Tensor, steps: int, coefficients: str, eps: float, prec: str) -> torch.Tensor:
    """NS_k on a batch of matrices G [M, R, C] with R ≤ C, in one launch, its products in ``prec``. A registered
    operator (its shape function and backward below): ``torch.compile`` keeps it whole in a graph, without tracing
    into the kernel's launch."""
    M, R, C = G.shape
    a, b, c = NS_COEFFICIENTS[coefficients]
    config = launch_config(R, C)
    X = torch.empty(M, R, C, dtype=torch.float32, device=G.device)
    newton_schulz_fwd_kernel[(M,)](G, X, *G.stride(), R, C, a, b, c, eps, STEPS=steps, QUINTIC=c != 0.0,
                                   ONE_BLOCK=C <= config["BC"], PREC=prec, **config)
    return X.to(G.dtype)


@torch.library.custom_op("atlas_lab::newton_schulz_triton_backward", mutates_args=())
def newton_schulz_backward_op(G: torch.Tensor, dout: torch.Tensor, steps: int, coefficients: str, eps: float,
                              prec: str) -> torch.Tensor:
    """∂L/∂G from ∂L/∂NS_k(G), in one launch: the iterates are recomputed."""
    M, R, C = G.shape
    a, b, c = NS_COEFFICIENTS[coefficients]
    config = launch_config(R, C)
    dX = dout.to(torch.float32).contiguous().clone()
    Xs = torch.empty(max(steps, 1), M, R, C, dtype=torch.float32, device=G.device)
    newton_schulz_bwd_kernel[(M,)](G, Xs, dX, *G.stride(), R, C, M, a, b, c, eps, STEPS=steps,
                                   QUINTIC=c != 0.0, PREC=prec, **config)
    return dX.to(G.dtype)


register_like_input(newton_schulz_op, newton_schulz_backward_op)


def newton_schulz(G: torch.Tensor, steps: int = 5, coefficients: str = "quintic", eps: float = 1e-7) -> torch.Tensor:
    """NS_k(G) for G [..., m, n] (each matrix separately), min(m, n) ≤ 128 and max(m, n) ≤ 512.

    Same function and arguments as ``reference.newton_schulz``; differentiable.
    """
    if coefficients not in NS_COEFFICIENTS:
        raise ValueError(f"unknown ns_coefficients {coefficients!r}; valid choices: {', '.join(NS_COEFFICIENTS)}")
    if G.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise NotImplementedError(f"triton newton_schulz covers float32, float16 and bfloat16; got {G.dtype}")
    transpose = G.shape[-2] > G.shape[-1]
    X = G.mT if transpose else G
    R, C = X.shape[-2:]
    if R > MAX_ROWS or C > MAX_COLS:
        raise NotImplementedError(f"triton newton_schulz covers matrices up to {MAX_ROWS} × {MAX_COLS} "
                                  f"(either orientation); got {tuple(G.shape[-2:])}")
    batch = X.shape[:-2]
    if X.numel() == 0:
        return G.clone()
    # torch's float32 matmul precision now: the backward's products take the same
    Y = newton_schulz_op(X.reshape(-1, R, C), steps, coefficients, eps, ns_precision(G.dtype)).reshape(*batch, R, C)
    return Y.mT if transpose else Y
