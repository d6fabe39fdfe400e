"""``memorize(..., impl="fla")``: the calls whose rule flash-linear-attention computes exactly, on fla-core's chunk
kernels (docs/memory.md §5.4). The plan (memory/plan.py: ``fla_op``) decides which calls come here and which op:

    op                  the rule (memorize's terms)                                          fla-core
    gated_delta_rule    linear memory, l2 bias, gd, chunk 1, window 1, α per head, each       chunk_gated_delta_rule
                        gradient at the retained weights α_t W_{t−1} (or α ≡ 1)
    kda                 the same with α per key channel                                      chunk_kda
    simple_gla          linear memory, dot bias, gd, window 1, any chunk (the dot bias's      chunk_simple_gla
                        gradient −v φ(k)ᵀ does not depend on the weights), α per head

With W [N, d_v, D] and fla's state S = Wᵀ [N, 1, D, d_v] (each of the N = B·H sequences one fla batch row of one
head): the delta rules are S_t = α_t S_{t−1} + β_t k_t (v_t − (α_t S_{t−1})ᵀ k_t)ᵀ, o_t = S_tᵀ q_t, with k = φ(k),
q = φ(q), β_t = η_t γ_t and g_t = log α_t (fla's gate is in log space), scale 1; simple GLA is S_t = α_t S_{t−1} +
k_t v_tᵀ with the values η_t γ_t v_t. fla computes in float32 with inputs in bfloat16 or float16 (its chunk kernels
refuse float32); the final state comes back in float32.
"""
from __future__ import annotations

import importlib

import torch

from .call import Call, Carried, Result

# op -> (fla-core module, function): imported on first use (fla needs triton and a GPU for its kernels)
FLA_OPS = {"gated_delta_rule": ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
           "kda": ("fla.ops.kda", "chunk_kda"),
           "simple_gla": ("fla.ops.simple_gla", "chunk_simple_gla")}


def fla_function(op: str):
    """fla-core's chunk function of ``op`` (FLA_OPS)."""
    module, name = FLA_OPS[op]
    return getattr(importlib.import_module(module), name)


def _log(alpha):
    """log α in float32, α = 0 read as the smallest positive float (the delta rule's convention)."""
    alpha = alpha.float()
    return torch.log(alpha.clamp_min(torch.finfo(alpha.dtype).tiny))


def memorize_fla(call: Call) -> Result:
    """The same function as ``reference.memorize_reference`` (read token), for a call the plan routed to fla-core's
    ``call.plan.op`` (window 1: the inputs hold the call's tokens only). ``inputs.scale`` (the gradient's per-token
    point α_t) is what fla's delta rules compute themselves. A call that ends inside a chunk (simple GLA at chunk > 1)
    runs in two pieces, the state at the chunk's start being the evaluation point a stream carries."""
    x, st, m = call.inputs, call.state, call.memory
    op, offset, chunk_size = call.plan.op, st.offset, m.chunk_size
    W, W_eval = st.weights, st.eval_weights
    T = x.q.shape[1]
    phi_q, phi_k = m.phi(x.q), m.phi(x.k)
    function = fla_function(op)

    def run(lo, hi, state):  # tokens lo..hi from fla's state [N, 1, D, d_v] (float32)
        inputs = dict(q=phi_q[:, lo:hi, None], k=phi_k[:, lo:hi, None], scale=1.0, initial_state=state,
                      output_final_state=True)
        strength = x.eta[:, lo:hi] * x.gamma[:, lo:hi]  # β_t = η_t γ_t
        log_alpha = _log(x.alpha[:, lo:hi])
        g = log_alpha.unsqueeze(2) if log_alpha.dim() == 3 else log_alpha.unsqueeze(-1)  # [N, n, 1(, D)]
        if op == "simple_gla":
            inputs.update(v=(x.v[:, lo:hi] * strength.unsqueeze(-1))[:, :, None], g=g)
        else:
            inputs.update(v=x.v[:, lo:hi, None], g=g, beta=strength.unsqueeze(-1))
        o, final = function(**inputs)
        return o.squeeze(2), final

    state = W["W"].mT.unsqueeze(1).float().contiguous()
    ends = (offset + T) % chunk_size
    if ends == 0 or offset + T < chunk_size:  # no boundary to keep: the call's chunk started before it, or all close
        y, state = run(0, T, state)
        W_eval = None if ends == 0 else (W if offset == 0 else W_eval)
    else:
        y_head, state = run(0, T - ends, state)
        W_eval = {"W": state.squeeze(1).mT}
        y_tail, state = run(T - ends, T, state)
        y = torch.cat([y_head, y_tail], 1)
    return Result(y.to(x.q.dtype), Carried({"W": state.squeeze(1).mT}, st.optimizer_state, W_eval, ends, None))
