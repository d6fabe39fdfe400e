"""The fast PyTorch path: the same function as ``reference`` (docs/memory.md §4–§5), a chunk at a time.

Inside a chunk every gradient is taken at the same point W̃, so for the n chunk tokens and the
c−1 window tokens before them all per-token gradients G_i = ∇ℓ_i(W̃) are formed at once — for the
built-in memories analytically as rank-1 factors G_i = δ_i u_iᵀ per weight matrix. Then

    g_t = Σ_i Γ[t, i] G_i                      Γ: banded [n, n+c−1] matrix of window weights γ_i
    W_t = a_t W_0 + m_t S_0 + Σ_i C[t, i] G_i  C = Cw Γ, Cw from the optimiser's closed form

for gd and momentum, and the read-out y_t = M_{W_t}(φ(q_t)) is computed in dual form, layer by layer,
without building any W_t: u ↦ a_t u W_0ᵀ + m_t u S_0ᵀ + (C ⊙ (u Uᵀ)) Δ for every weight matrix.
For muon the per-token momenta S_t are materialised, Newton–Schulz runs on all of them in one
batched call, and the per-token weights W_t are formed with one matrix product (any ``TransformedMomentum``).
For the retention rules (ℓq, KL: any ``TransformedAccumulator``) the accumulators A_t take gd's closed form and
W_t = T(A_t) is one call on all of them. An optimiser with none of these forms runs its ``update`` token by token
on the chunk's materialised gradients.
Memories without analytic factors (custom nn.Module memories, attentional biases without ∂ℓ/∂y) take torch.func
gradients; memories without a dual form are read with materialised per-token weights.

With chunk-start reads (read="chunk", docs/memory.md §4.1) every token of a chunk reads the weights W̃ the chunk
started from, and the chunk's Σ_t g_t = Σ_i (Σ_t Γ[t, i]) G_i is one weighted sum of its factors: one optimiser
step (one Newton–Schulz per weight matrix for muon) per chunk, no per-token state.
"""
from __future__ import annotations

import itertools

import torch
import torch.utils.checkpoint
from torch.func import grad, vmap

from .call import Call, Carried, Result
from .ops.causal import causal_matmul, causal_operands, tensor_cache
from .delta_rule import delta_rule
from .memories import fixed_apply
from .optimizers import accumulate, commit, period, scaled


@tensor_cache()
def window_mask(n: int, L: int, first: int, window, device) -> torch.Tensor:
    """[n, L] bool: token i lies in the window of chunk token t (at index first + t). Cached: one per chunk shape."""
    t = torch.arange(n, device=device).unsqueeze(-1) + first
    i = torch.arange(L, device=device)
    inside = i <= t
    if window is not None:
        inside = inside & (i > t - window)
    return inside


def window_band(gamma, n: int, first: int, window):
    """Γ [N, n, L]: Γ[t, i] = γ_i for window token i of chunk token t (at index first + t), else 0.

    gamma: [N, L] window weights of the L tokens (cache, then chunk); window c or None (global).
    """
    return torch.where(window_mask(n, gamma.shape[-1], first, window, gamma.device), gamma.unsqueeze(-2), 0.0)


def combine(C, G):
    """Σ_i C[t, i] G_i for every t. C: [N, n, L], causal (the last n of the L tokens are the chunk's); G: factors
    (δ [N, L, out], u [N, L, in]) or a tensor [N, L, *shape]. Returns [N, n, *shape].
    """
    if isinstance(G, tuple):  # one GEMM per sample: [(t, out), L] @ [L, in]
        C, delta, u = causal_operands(C, *G)
        if C.device.type == "cpu":  # its products written in the GEMM's order
            return _FactorCombine.apply(C, delta, u)
        N, n, L = C.shape  # elsewhere autograd's, as the GPU model's fit counted it (the same values)
        scaled = C.unsqueeze(-1) * delta.unsqueeze(1)  # [N, n, L, out]
        return (scaled.transpose(1, 2).reshape(N, L, -1).mT @ u).view(N, n, delta.shape[-1], u.shape[-1])
    return causal_matmul(C, G.flatten(2)).reshape(C.shape[:2] + G.shape[2:])


class _FactorCombine(torch.autograd.Function):
    """Σ_i C[t, i] δ_i u_iᵀ for every t: C [N, n, L], δ [N, L, out], u [N, L, in] -> [N, n, out, in], one GEMM per
    sample, [(t, out), L] @ [L, in], over the products P[i, t, o] = C[t, i] δ_i[o] written in the GEMM's order
    ([N, L, n, out]; autograd's C ⊙ δ would lay them out [N, n, L, out] and copy them for the GEMM). Backward:
    autograd's, operation by operation on the same operands and layouts (the GEMM's two products; ∂C and ∂δ as the
    product's backward sums them over [N, n, L, out]), so the values are those of the composed expression bit for
    bit."""

    @staticmethod
    def forward(ctx, C, delta, u):
        N, n, L = C.shape
        P = (C.mT.contiguous().unsqueeze(-1) * delta.unsqueeze(2)).view(N, L, -1).mT  # [N, n·out, L]
        ctx.save_for_backward(C, delta, u, P)
        return (P @ u).view(N, n, delta.shape[-1], u.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        C, delta, u, P = ctx.saved_tensors
        N, n, L = C.shape
        grad = grad.reshape(N, n * delta.shape[-1], u.shape[-1])
        dC = dDelta = dU = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            dP = (grad @ u.mT).mT.reshape(N, L, n, -1).transpose(1, 2)  # [N, n, L, out]
            if ctx.needs_input_grad[0]:  # δ with its tokens contiguous, as dP has them: the same products, vectorised
                dC = (dP * delta.mT.contiguous().mT.unsqueeze(1)).sum(-1)
            if ctx.needs_input_grad[1]:
                dDelta = (dP * C.unsqueeze(-1)).sum(1)
        if ctx.needs_input_grad[2]:
            dU = P.mT @ grad
        return dC, dDelta, dU


def chunk_windows(x, spans):
    """x[:, lo:hi] for every chunk's (lo, hi) window span. x: [N, L, ...].

    Overlapping spans (window c > 1) are gathered with one index_select: its backward is one
    index_add, where a slice per chunk would zero-fill a full-size gradient per chunk. Spans that
    tile x (c = 1) are split; the global window (every span starts at 0) keeps views.
    """
    starts_at_zero = all(lo == 0 for lo, _ in spans)
    if starts_at_zero and len(spans) > 1:
        return [x[:, lo:hi] for lo, hi in spans]
    lengths = [hi - lo for lo, hi in spans]
    if all(a[1] == b[0] for a, b in zip(spans, spans[1:])) and spans[0][0] == 0 and spans[-1][1] == x.shape[1]:
        return list(x.split(lengths, 1))
    index = torch.cat([torch.arange(lo, hi, device=x.device) for lo, hi in spans])
    return list(x.index_select(1, index).split(lengths, 1))


def combine_last(c, G):
    """Σ_i c[i] G_i, the last row of ``combine``. c: [N, L]; G as in ``combine``. Returns [N, *shape]."""
    if isinstance(G, tuple):
        delta, u = G
        return (delta * c.unsqueeze(-1)).mT @ u
    return (c.unsqueeze(1) @ G.flatten(2)).reshape(G.shape[:1] + G.shape[2:])


def _bc(x, like):
    """Broadcast [N, n] coefficients against [N, n, *shape]."""
    return x.reshape(x.shape + (1,) * (like.dim() - x.dim()))


class _TokenApply(torch.autograd.Function):
    """u_t W_tᵀ for every token: W [N, n, out, in], u [N, n, in] -> [N, n, out] (one batched product of matrix-vector
    products). Backward: ∂W_t = ∂y_t u_tᵀ as an element-wise product, the values of the outer products autograd's
    batched GEMM forms (a product over K = 1, each entry one rounded multiplication) without N·n GEMM calls; ∂u_t =
    W_tᵀ ∂y_t as autograd takes it."""

    @staticmethod
    def forward(ctx, W, u):
        ctx.save_for_backward(W, u)
        return (W @ u.unsqueeze(-1)).squeeze(-1)

    @staticmethod
    def backward(ctx, grad):
        W, u = ctx.saved_tensors
        dW = grad.unsqueeze(-1) * u.unsqueeze(-2) if ctx.needs_input_grad[0] else None
        du = (W.mT @ grad.unsqueeze(-1)).squeeze(-1) if ctx.needs_input_grad[1] else None
        return dW, du


def _materialized_read(mem, W_t, phi_q, q):
    """y_t = M_{W_t}(φ(q_t)) with per-token weights W_t {name: [N, n, *shape]}."""
    if not mem.dual_form:
        return vmap(vmap(mem.token_forward))(W_t, phi_q, q)
    return mem.forward(lambda n, u: _TokenApply.apply(W_t[n], u), phi_q, q)


def _last(x):
    """Each token's tensors -> the last token's, cloned: a view would keep every token's weights alive."""
    return {n: w[:, -1].clone() for n, w in x.items()}


def _chunk_transformed(mem, opt, G, band, alpha, eta, theta, W, S, phi_q, q):
    """TransformedMomentum: every S_t in closed form, D(S_t) in one call, W_t by one product."""
    co = opt.chunk_coefficients(alpha, eta, theta)
    Cs = causal_matmul(co["Cs"], band)
    S_t = {n: _bc(co["s"], S[n].unsqueeze(1)) * S[n].unsqueeze(1) + combine(Cs, G[n]) for n in W}
    D = {n: opt.direction(S_t[n], W[n].dim() - 1) for n in W}
    W_t = {n: _bc(co["a"], D[n]) * W[n].unsqueeze(1) + combine(co["Cw"], D[n]) for n in W}
    return _materialized_read(mem, W_t, phi_q, q), _last(W_t), _last(S_t)


def _chunk_accumulated(mem, opt, G, band, alpha, eta, theta, W, S, phi_q, q):
    """TransformedAccumulator: every A_t in closed form (gd's), W_t = T(A_t) on all of them in one call."""
    co = opt.chunk_coefficients(alpha, eta, theta)
    C = causal_matmul(co["Cw"], band)
    A_t = {n: _bc(co["a"], S[n].unsqueeze(1)) * S[n].unsqueeze(1) + combine(C, G[n]) for n in W}
    W_t = {n: opt.weights(A.flatten(0, 1)).view_as(A) for n, A in A_t.items()}
    return _materialized_read(mem, W_t, phi_q, q), _last(W_t), _last(A_t)


def _chunk_stepwise(mem, opt, G, band, alpha, eta, theta, W, S, phi_q, q):
    """Any other rule: g_t = Σ_i Γ[t, i] G_i for every chunk token, then ``update`` token by token."""
    g = {n: combine(band, G[n]) for n in W}
    W, S = dict(W), (None if S is None else dict(S))
    W_t = {n: [] for n in W}
    for t in range(q.shape[1]):
        for n in W:
            W[n], s = opt.update(W[n], None if S is None else S[n], g[n][:, t], alpha[:, t], eta[:, t], theta[:, t])
            if S is not None:
                S[n] = s
            W_t[n].append(W[n])
    return _materialized_read(mem, {n: torch.stack(w, 1) for n, w in W_t.items()}, phi_q, q), W, S


def _chunk_linear(mem, opt, G, band, alpha, eta, theta, W, S, phi_q, q):
    """LinearOptimizer: the chunk's state in closed form and the read-out in dual form (no W_t built)."""
    co = opt.chunk_coefficients(alpha, eta, theta)
    C = causal_matmul(co["Cw"], band)
    Cs = causal_matmul(co["Cs"], band) if "Cs" in co else None
    a, m = co["a"], co.get("m")

    def state_after(n):
        w = _bc(a[:, -1], W[n]) * W[n] + combine_last(C[:, -1], G[n])
        return w + _bc(m[:, -1], S[n]) * S[n] if m is not None else w

    W_new = {n: state_after(n) for n in W}
    S_new = None if Cs is None else {n: _bc(co["s"][:, -1], S[n]) * S[n] + combine_last(Cs[:, -1], G[n]) for n in W}

    if not (mem.dual_form and all(isinstance(x, tuple) for x in G.values())):  # dual form: rank-1 factors only
        W_t = {n: _bc(a, W[n].unsqueeze(1)) * W[n].unsqueeze(1) + combine(C, G[n]) for n in W}
        if m is not None:
            W_t = {n: W_t[n] + _bc(m, W_t[n]) * S[n].unsqueeze(1) for n in W}
        return _materialized_read(mem, W_t, phi_q, q), W_new, S_new

    def dual_apply(n, u):  # u [N, n, in] -> u @ W_tᵀ for every token t, W_t never built
        C_n, delta, x = causal_operands(C, *G[n])
        out = a.unsqueeze(-1) * (u @ W[n].mT)
        if m is not None:
            out = out + m.unsqueeze(-1) * (u @ S[n].mT)
        return torch.baddbmm(out, C_n * (u @ x.mT), delta)

    return mem.forward(dual_apply, phi_q, q), W_new, S_new


# the in-chunk evaluations of read="token", by the plan's form (memory/plan.py decides which)
FORMS = {"linear": _chunk_linear, "transformed": _chunk_transformed, "accumulated": _chunk_accumulated,
         "stepwise": _chunk_stepwise}


def gradients(mem, bias):
    """G(W̃, φ(k), k, v) for a window of tokens: rank-1 factors where the memory and the bias give them, else
    torch.func's per-token gradients [N, L, *shape]."""
    if mem.gradient_factors is not None and bias.grad is not None:
        return lambda W, phi_k, k, v: mem.gradient_factors(W, phi_k, k, v, bias)
    return vmap(vmap(grad(lambda W, p, k, v: bias.loss(mem.token_forward(W, p, k), v)),
                     in_dims=(None, 0, 0, 0)))


def read_at(mem, W, phi_q, q):
    """y_t = M_W(φ(q_t)) for every token at one set of weights W {name: [N, *shape]}. phi_q: [N, n, D]."""
    if mem.dual_form:
        return mem.forward(fixed_apply(W), phi_q, q)
    return vmap(vmap(mem.token_forward, in_dims=(None, 0, 0)))(W, phi_q, q)


def chunks(q, phi_q, phi_k, k_all, v_all, gamma_all, alpha, eta, theta, chunk_size, offset, window):
    """Per chunk of the call (the rest of the chunk in progress, whole chunks, a partial last one): its length n, the
    offset of its first token in its window, its per-token inputs (q, φ(q), α, η, θ) and its window's
    (φ(k), k, v, γ), the cache's tokens included."""
    T, m0 = q.shape[1], k_all.shape[1] - q.shape[1]
    sizes = [min(T, chunk_size - offset)] if offset else []
    sizes += [chunk_size] * ((T - sum(sizes)) // chunk_size)
    sizes += [T - sum(sizes)] if T > sum(sizes) else []
    firsts = list(itertools.accumulate(sizes[:-1], initial=m0))  # each chunk's first token in cache+new
    spans = [(0 if window is None else max(0, f - window + 1), f + n) for f, n in zip(firsts, sizes)]
    # split (not slice) the per-token inputs: the backward of split is one cat, not a zero-fill per chunk
    pieces = zip(*(x.split(sizes, 1) for x in (q, phi_q, alpha, eta, theta)))
    windows = zip(*(chunk_windows(x, spans) for x in (phi_k, k_all, v_all, gamma_all)))
    return zip(sizes, [f - lo for f, (lo, _) in zip(firsts, spans)], pieces, windows)


def memorize_chunked(call: Call) -> Result:
    """read="token" (and "start": each chunk's tokens read the weights it started from, ``read_at``, and the form's
    per-token reads are not used): the same function as ``reference.memorize_reference``, in the plan's ``form`` (its
    ``block``: the delta rule's WY block). memory.checkpoint: keep only each chunk's inputs for the backward and
    recompute the chunk there (activation checkpointing per chunk)."""
    x, st, m = call.inputs, call.state, call.memory
    W, S, W_eval, offset = st.weights, st.optimizer_state, st.eval_weights, st.offset
    start = m.read == "start"
    phi_q, phi_k = m.phi(x.q), m.phi(x.k)
    if call.plan.form == "delta_rule":  # chunk 1, window 1: no cache
        y, W_last = delta_rule(phi_q, phi_k, x.v, x.alpha, x.eta * x.gamma, W["W"], x.scale, call.plan.block)
        return Result(y, Carried({"W": W_last}, None, None, 0, None))
    grads = gradients(m.mem, m.bias)
    route = FORMS[call.plan.form]
    mem, optimizer, window = m.mem, m.optimizer, m.window
    ys = []
    for t, (n, shift, (q_c, phi_q_c, alpha_c, eta_c, theta_c), (phi_k_c, k_c, v_c, gamma_c)) in enumerate(chunks(
            x.q, phi_q, phi_k, x.k, x.v, x.gamma, x.alpha, x.eta, x.theta, m.chunk_size, offset, window)):
        chunk_start = W if offset == 0 else W_eval  # mid-chunk (chunk > 1, no scale): the evaluation point
        if offset == 0:
            W_eval = W if x.scale is None else scaled(W, x.scale[:, t])  # chunk 1: the chunk is token t

        def body(W_eval, W, S, q_c, phi_q_c, alpha_c, eta_c, theta_c, phi_k_c, k_c, v_c, gamma_c,
                 n=n, shift=shift, chunk_start=chunk_start):
            G = grads(W_eval, phi_k_c, k_c, v_c)
            band = window_band(gamma_c, n, shift, window)
            y, W, S = route(mem, optimizer, G, band, alpha_c, eta_c, theta_c, W, S, phi_q_c, q_c)
            return (read_at(mem, chunk_start, phi_q_c, q_c) if start else y), W, S

        args = (W_eval, W, S, q_c, phi_q_c, alpha_c, eta_c, theta_c, phi_k_c, k_c, v_c, gamma_c)
        if m.checkpoint and torch.is_grad_enabled():  # keep only the chunk's inputs; recompute the rest in backward
            y, W, S = torch.utils.checkpoint.checkpoint(body, *args, use_reentrant=False)
        else:
            y, W, S = body(*args)
        ys.append(y)
        offset = (offset + n) % m.chunk_size
    return Result(torch.cat(ys, 1), Carried(W, S, W_eval if offset else None, offset, None))


def memorize_chunked_chunk_start(call: Call) -> Result:
    """read="chunk": the same function as ``reference.memorize_reference_chunk_start``. Each chunk reads W̃ = W (the
    weights committed so far) and adds its tokens' Σ_t g_t, ∏ α, Σ η, ∏ θ to ``pending``; a chunk that ends a level's
    chunk commits that level (optimizers.commit). The chunk-start path keeps no per-token weights."""
    x, st, m = call.inputs, call.state, call.memory
    W, S, offset, pending = st.weights, st.optimizer_state, st.offset, st.pending
    commits = m.commits
    longest = period(commits)
    phi_q, phi_k = m.phi(x.q), m.phi(x.k)
    grads = gradients(m.mem, m.bias)
    ys = []
    for t, (n, shift, (q_c, phi_q_c, alpha_c, eta_c, theta_c), (phi_k_c, k_c, v_c, gamma_c)) in enumerate(chunks(
            x.q, phi_q, phi_k, x.k, x.v, x.gamma, x.alpha, x.eta, x.theta, m.chunk_size, offset % m.chunk_size,
            m.window)):
        G = grads(W if x.scale is None else scaled(W, x.scale[:, t]), phi_k_c, k_c, v_c)  # chunk 1: the chunk is t
        ys.append(read_at(m.mem, W, phi_q_c, q_c))
        # [N, L]: Σ_t Γ[t, i], one for every matrix, or for each (γ per weight matrix: gamma_c [N, L, M])
        weight = {name: window_band(gamma_c if gamma_c.dim() == 2 else gamma_c[..., j], n, shift, m.window).sum(1)
                  for j, name in enumerate(W)}
        pending = accumulate(pending, commits, {name: combine_last(weight[name], G[name]) for name in W},
                             alpha_c.prod(1), eta_c.sum(1), theta_c.prod(1))
        offset = (offset + n) % longest
        if offset % m.chunk_size == 0:
            W, S, pending = commit(m.optimizer, W, S, pending, commits, offset)
    return Result(torch.cat(ys, 1), Carried(W, S, None, offset, pending))
