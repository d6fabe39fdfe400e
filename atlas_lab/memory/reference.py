"""The oracle: docs/memory.md §2–§4 followed literally, one token at a time, gradients by torch.func.

For t = 1..T (chunks of b tokens; W̃ = the weights at the end of the previous chunk):
    g_t = Σ_{i = t−c+1..t} γ_i ∇ℓ_i(W̃)        ℓ_i(W) = loss(M_W(φ(k_i)), v_i)
    (W_t, S_t) = optimizer step(W_{t−1}, S_{t−1}, g_t; α_t, η_t, θ_t)
    y_t = M_{W_t}(φ(q_t))
With gradient_at="retained" or an erase gate (chunk 1) the gradient of token t is taken at W̃ = W_{t−1} Diag(f_t),
f_t = α_t (retained) ⊙ e_t (erase).
With read="start" (§4.1) every token of a chunk reads the weights the chunk started from, y_t = M_{W̃}(φ(q_t)), and
the state follows the rule above. With read="chunk" every token reads W̃ too, and the optimizer steps once, at the
chunk's last token, with the chunk's mean gradient (optimizers.commit); a rule of levels commits each weight matrix
at the end of its own chunk.
Slow and obviously right; every fast path is tested against it.
"""
from __future__ import annotations

import torch
from torch.func import grad, vmap

from .call import Call, Carried, Result
from .optimizers import accumulate, commit, period, scaled, step


def _window_gradients(q, k_all, v_all, gamma_all, mem, phi, bias, window):
    """(g(W, t): the window gradient Σ_i γ_i ∇ℓ_i(W) of token t, read_out(W, t): y = M_W(φ(q_t)), m0)."""
    T = q.shape[1]
    m0 = k_all.shape[1] - T
    f = mem.token_forward

    def token_loss(W, phi_k, k, v):
        return bias.loss(f(W, phi_k, k), v)

    grads = vmap(vmap(grad(token_loss), in_dims=(None, 0, 0, 0)))  # over heads×batch, then window tokens
    phi_q, phi_k = phi(q), phi(k_all)

    def g(W, t):
        j = m0 + t
        lo = 0 if window is None else max(0, j - window + 1)
        G = grads(W, phi_k[:, lo:j + 1], k_all[:, lo:j + 1], v_all[:, lo:j + 1])
        gam = gamma_all[:, lo:j + 1]  # [N, L], or [N, L, M]: γ per weight matrix, in W's order
        gams = {n: gam if gam.dim() == 2 else gam[..., m] for m, n in enumerate(G)}
        return {n: (gams[n].reshape(gams[n].shape + (1,) * (G[n].dim() - 2)) * G[n]).sum(1) for n in G}

    def read_out(W, t):
        return vmap(f)(W, phi_q[:, t], q[:, t])

    return g, read_out


def memorize_reference(call: Call) -> Result:
    """read="token" and "start" (each token reads its chunk's start): the token loop above on a ``Call`` (call.py);
    only the components' ``token_forward``, ``loss`` and ``update`` are used."""
    x, st, m = call.inputs, call.state, call.memory
    W, S, W_eval, offset = st.weights, st.optimizer_state, st.eval_weights, st.offset
    g, read_out = _window_gradients(x.q, x.k, x.v, x.gamma, m.mem, m.phi, m.bias, m.window)
    ys = []
    chunk_start = W_eval  # mid-chunk (chunk > 1, no scale): the evaluation point is the chunk's start
    for t in range(x.q.shape[1]):
        if offset == 0:
            chunk_start = W
            W_eval = W if x.scale is None else scaled(W, x.scale[:, t])
        if m.read == "start":
            ys.append(read_out(chunk_start, t))
        W, S = step(m.optimizer, W, S, g(W_eval, t), x.alpha[:, t], x.eta[:, t], x.theta[:, t])
        if m.read != "start":
            ys.append(read_out(W, t))
        offset = (offset + 1) % m.chunk_size
    return Result(torch.stack(ys, 1), Carried(W, S, W_eval if offset else None, offset, None))


def memorize_reference_chunk_start(call: Call) -> Result:
    """read="chunk": every token reads W̃ = W; the commits in progress (``pending``) commit each level at the end
    of its chunk (call.memory.commits: {name: (C, r)}, LearningRule.commits); offset: tokens since the start of the
    longest level's chunk."""
    x, st, m = call.inputs, call.state, call.memory
    W, S, offset, pending = st.weights, st.optimizer_state, st.offset, st.pending
    longest = period(m.commits)
    g, read_out = _window_gradients(x.q, x.k, x.v, x.gamma, m.mem, m.phi, m.bias, m.window)
    ys = []
    for t in range(x.q.shape[1]):
        ys.append(read_out(W, t))
        pending = accumulate(pending, m.commits, g(W if x.scale is None else scaled(W, x.scale[:, t]), t),
                             x.alpha[:, t], x.eta[:, t], x.theta[:, t])
        offset = (offset + 1) % longest
        if offset % m.chunk_size == 0:
            W, S, pending = commit(m.optimizer, W, S, pending, m.commits, offset)
    return Result(torch.stack(ys, 1), Carried(W, S, None, offset, pending))
