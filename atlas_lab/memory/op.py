"""``memorize``: the public entry point of the memory engine."""
from __future__ import annotations

import torch

from .chunked import memorize_chunked
from .feature_maps import build_feature_map
from .memories import LinearMemory, build_memory
from .objectives import Dot, build_objective
from .optimizers import LinearRule, build_optimizer, start as optimizer_start
from .reference import memorize_reference
from .state import PENDING_GATES, MemoryState

IMPLS = {"reference": memorize_reference, "chunked": memorize_chunked}
READS = ("token", "chunk")
GATE_DEFAULTS = {"alpha": 1.0, "eta": 1.0, "theta": 0.0, "gamma": 1.0}


def _choice(key, value, choices):
    if value not in choices:
        raise ValueError(f"memorize: unknown {key}={value!r}; valid choices: {', '.join(map(str, choices))}")


def _int(key, value, low, what=""):
    """An int >= low (a bool is refused: True would pass for 1)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"memorize: {key} must be an int >= {low}{what}; got {value!r}")


def _gate(name, value, B, T, H, like):
    """A gate as [B·H, T]: a [B, T, H] tensor, a Python number, or None (the default)."""
    if value is None:
        value = GATE_DEFAULTS[name]
    if isinstance(value, (int, float)):
        if name in ("alpha", "theta") and value < 0:  # decay factors: the chunked closed forms take their logarithm
            raise ValueError(f"memorize: gate {name} must be >= 0 (a decay factor); got {value!r}")
        return torch.full((B * H, T), float(value), dtype=like.dtype, device=like.device)
    if not isinstance(value, torch.Tensor) or value.shape != (B, T, H):
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"memorize: gate {name} must be a [B, T, H] = [{B}, {T}, {H}] tensor, a number or None; "
                         f"got {got}")
    if value.device != like.device:
        raise ValueError(f"memorize: gate {name} must be on q's device {like.device}; got {value.device}")
    return value.to(like.dtype).permute(0, 2, 1).reshape(B * H, T)


def _check_qkv(q, k, v):
    """q, k, v: floating-point torch tensors of one dtype on one device, [B, T, H, d_k] (q, k) and [B, T, H, d_v]."""
    given = {"q": q, "k": k, "v": v}
    for name, x in given.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"memorize: {name} must be a torch.Tensor; got {type(x).__name__}")
    for name, x in given.items():
        if not x.is_floating_point():
            raise TypeError(f"memorize: {name} must be a floating-point tensor; got {x.dtype}")
    if len({(x.dtype, x.device) for x in given.values()}) > 1:
        raise TypeError("memorize: q, k and v must have one dtype and device; got "
                        + ", ".join(f"{name} {x.dtype} on {x.device}" for name, x in given.items()))
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"memorize: expected q, k [B, T, H, d_k] and v [B, T, H, d_v]; "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")


def _heads_first(x):
    """[B, T, H, d] -> [B·H, T, d]."""
    B, T, H, d = x.shape
    return x.permute(0, 2, 1, 3).reshape(B * H, T, d)


def _broadcast_weights(weights, shapes, B, H, what, like):
    """Weights given as [*shape], [H, *shape] or [B, H, *shape] (each leading dim may be 1) -> [B·H, *shape]."""
    if set(weights) != set(shapes):
        raise ValueError(f"memorize: {what} has weights {sorted(weights)}, the memory expects {sorted(shapes)}")
    out = {}
    for n, shape in shapes.items():
        w = weights[n]
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"memorize: {what}[{n!r}] must be a torch.Tensor; got {type(w).__name__}")
        lead = tuple(w.shape[:w.dim() - len(shape)])
        if (tuple(w.shape[-len(shape):]) != tuple(shape) or len(lead) > 2
                or any(d not in (1, full) for d, full in zip(lead, (B, H)[2 - len(lead):]))):
            raise ValueError(f"memorize: {what}[{n!r}] must have shape [{', '.join(map(str, shape))}], "
                             f"[H, ...] or [B, H, ...] with B = {B}, H = {H}; got {tuple(w.shape)}")
        if w.device != like.device:
            raise ValueError(f"memorize: {what}[{n!r}] must be on q's device {like.device}; got {w.device}")
        while w.dim() < len(shape) + 2:
            w = w.unsqueeze(0)
        out[n] = w.expand(B, H, *shape).reshape(B * H, *shape)
    return out


def _implementation(impl, q, mem, objective, optimizer, chunk_size, W, read):
    """The function behind ``impl``; the Triton kernels are imported only when asked for (or on CUDA for "auto")."""
    if impl == "triton" or (impl == "auto" and q.is_cuda):
        from atlas_lab.kernels import memorize_triton, unsupported
        if impl == "triton" or unsupported(q, mem, objective, optimizer, chunk_size, W, read) is None:
            return memorize_triton
    return IMPLS["chunked" if impl == "auto" else impl]


def build_components(memory="linear", feature_map="identity", objective="l2", optimizer="gd", where="memory",
                     **options):
    """(memory, feature map, objective, optimizer) objects from short-hands, objects or class_path dicts; the
    short-hands take their options (depth, expansion, activation, residual, output_norm, degree, ns_steps,
    ns_coefficients) from ``options``."""
    return (build_memory(memory, f"{where}.memory", **options),
            build_feature_map(feature_map, f"{where}.feature_map", **options),
            build_objective(objective, f"{where}.objective", **options),
            build_optimizer(optimizer, f"{where}.optimizer", **options))


def normalize_applies(mem, objective, optimizer) -> bool:
    """normalize=True: a linear memory, the dot objective and a rule linear in the gradients (gd, momentum)."""
    return isinstance(mem, LinearMemory) and isinstance(objective, Dot) and isinstance(optimizer, LinearRule)


def memorize(q, k, v, *, memory="linear", feature_map="identity", objective="l2", window=1, optimizer="gd",
             alpha=None, eta=None, theta=None, gamma=None, chunk_size=64, initial_state=None, impl="chunked",
             degree=2, coefficients=None, depth=2, expansion=4, activation="gelu", residual=True,
             ns_steps=5, ns_coefficients="quintic", normalize=False, output_norm=False, checkpoint=False,
             read="token"):
    """Read a sequence with a memory that is trained while it reads (docs/memory.md).

    q, k: [B, T, H, d_k]; v: [B, T, H, d_v]. Returns (o [B, T, H, d_v], MemoryState).

    The four components are each a short-hand name, an object or a {"class_path", "init_args"} dict
    (docs/components.md); the short-hands take the options below.
    memory:       "linear" | "mlp" | "gated_mlp" | a Memory | an nn.Module mapping φ(k) [D] -> [d_v] (custom memory)
    feature_map:  "identity" | "polynomial" | "taylor" | a FeatureMap  (degree=p; coefficients=a_i ≥ 0, shape
                  [p+1], for "polynomial", default 1/i!)
    objective:    "l2" (½‖M(φ(k)) − v‖²) | "dot" (−⟨M(φ(k)), v⟩) | "huber" | "lp" | an Objective
    window:       c ≥ 1 (Omega window; 1 = online), or None (every past token: global)
    optimizer:    "gd" | "momentum" | "muon" (ns_steps=k, ns_coefficients="quintic" | "cubic") | a MemoryOptimizer
    alpha, eta, theta, gamma: retention, inner learning rate, momentum decay, window weight; each a
                  [B, T, H] tensor, a number, or None (alpha = 1, eta = 1, theta = 0, gamma = 1).
    chunk_size:   b; gradients of a chunk are taken at the state before it (part of the model's definition).
    read:         "token" (y_t reads W_t, the weights after token t: the exact rule) | "chunk" (every token of a
                  chunk reads the weights the chunk started from, and the optimizer steps once per chunk with
                  its mean gradient: one Newton–Schulz per chunk and matrix; docs/memory.md §4.1).
    initial_state: None (zeros for linear memory; a fixed-seed N(0, 1/fan_in) draw for the MLPs — layers pass
                  their learnable W_0), a dict {name: [*shape] | [H, *shape] | [B, H, *shape]} of initial
                  weights, or the MemoryState of a previous call to continue the sequence.
    depth, expansion, activation, residual: options of the MLP memories.
    output_norm:  MLP memories: M(x) = r(x) + LN(last layer), a parameter-free layer norm over the outputs (keeps
                  the dot objective bounded below; docs/memory.md).
    normalize:    linear memory + dot objective (gd or momentum): divide the read-out by z_tᵀφ(q_t), z
                  updated by the same rule on the constant value 1 (normalised linear attention).
    checkpoint:   chunked path only: keep each chunk's inputs for the backward and recompute the chunk there
                  (less memory, one more forward of each chunk; worth it for muon's per-token weights).
    impl:         "chunked" (fast) | "reference" (token loop, the oracle) | "triton" (the kernels of
                  atlas_lab.kernels; raises for combinations they do not cover, listing those they do) |
                  "auto" (triton on CUDA where it covers the combination, chunked otherwise).

    Bad arguments raise TypeError (not a floating-point torch tensor; q, k, v of different dtypes or devices) or
    ValueError (shapes, choices, ranges: window, chunk_size, degree, ns_steps ≥ 1; a number alpha or theta
    ≥ 0; an initial_state of another batch, head count or shape) naming the argument. Tensor gates and
    coefficients are not scanned for their values.
    T = 0 (an empty piece of a stream) returns o [B, 0, H, d_v] and the state unchanged.
    NaN / inf: a non-finite input at token t (q, k, v, a gate) makes outputs non-finite from t on — for keys,
    values and gates every later output of that head, since it enters the weights; for a query only o_t — and never
    reaches outputs before t, in every implementation. Gradients of a loss on the earlier outputs stay finite
    within one chunk of a linear memory; elsewhere autograd multiplies the zero gradient of a later, non-finite
    output by NaN and they may not.
    """
    _choice("impl", impl, (*IMPLS, "triton", "auto"))
    _choice("read", read, READS)
    if window is not None:
        _int("window", window, 1, " or None (global)")
    _int("chunk_size", chunk_size, 1)
    _check_qkv(q, k, v)
    B, T, H, d_k = q.shape
    d_v = v.shape[-1]
    mem, fmap, objective, optimizer = build_components(
        memory, feature_map, objective, optimizer, "memorize", depth=depth, expansion=expansion,
        activation=activation, residual=residual, output_norm=output_norm, degree=degree, ns_steps=ns_steps,
        ns_coefficients=ns_coefficients)
    if normalize and not normalize_applies(mem, objective, optimizer):
        raise ValueError("memorize: normalize=True needs memory='linear', objective='dot' and optimizer 'gd' or "
                         "'momentum'")
    D = fmap.dim(d_k)
    d_out = d_v + int(normalize)
    shapes = mem.shapes(D, d_k, d_out)

    def phi(x):
        return fmap(x, coefficients)

    q_, k_, v_ = _heads_first(q), _heads_first(k), _heads_first(v)
    if normalize:  # z_t is one more row of W, learnt on the constant value 1
        v_ = torch.cat([v_, v_.new_ones(*v_.shape[:-1], 1)], -1)
    gates = {g: _gate(g, val, B, T, H, q) for g, val in
             (("alpha", alpha), ("eta", eta), ("theta", theta), ("gamma", gamma))}

    offset, W_eval, S, pending = 0, None, None, None
    cache_k = q_.new_zeros(B * H, 0, d_k)
    cache_v = q_.new_zeros(B * H, 0, d_out)
    cache_g = q_.new_zeros(B * H, 0)
    if isinstance(initial_state, MemoryState):
        st = initial_state
        if not 0 <= st.offset < chunk_size:
            raise ValueError(f"memorize: initial_state.offset={st.offset} does not fit chunk_size={chunk_size}")
        W = _broadcast_weights(st.weights, shapes, B, H, "initial_state.weights", q)
        if st.momentum is not None:
            state_shapes = {n: optimizer.state_shape(shape) for n, shape in shapes.items()}
            S = _broadcast_weights(st.momentum, state_shapes, B, H, "initial_state.momentum", q)
        if st.eval_weights is not None:
            W_eval = _broadcast_weights(st.eval_weights, shapes, B, H, "initial_state.eval_weights", q)
        offset = st.offset
        if st.pending is not None:
            pending = {"grad": _broadcast_weights(st.pending["grad"], shapes, B, H, "initial_state.pending", q),
                       **{g: st.pending[g].reshape(B * H) for g in PENDING_GATES}}
        m = st.keys.shape[2] if st.keys.dim() == 4 else -1
        for part, x, shape in (("keys", st.keys, (B, H, m, d_k)), ("values", st.values, (B, H, m, d_out)),
                               ("gamma", st.gamma, (B, H, m))):
            if tuple(x.shape) != shape:
                raise ValueError(f"memorize: initial_state.{part} must have shape [B, H, m, ...] = "
                                 f"{list(shape)} for this call; got {list(x.shape)}")
        cache_k, cache_v = st.keys.reshape(B * H, -1, d_k), st.values.reshape(B * H, -1, d_out)
        cache_g = st.gamma.reshape(B * H, -1)
    elif isinstance(initial_state, dict):
        weights = dict(initial_state)
        if normalize and weights.get("W") is not None and weights["W"].shape[-2] == d_v:
            weights["W"] = torch.cat([weights["W"], weights["W"].new_zeros(*weights["W"].shape[:-2], 1, D)], -2)
        W = _broadcast_weights(weights, shapes, B, H, "initial_state", q)
    elif initial_state is None:
        init = mem.init_weights(H, D, d_k, d_out, generator=torch.Generator().manual_seed(0), dtype=q.dtype,
                                device=q.device)
        W = _broadcast_weights(init, shapes, B, H, "initial weights", q)
    else:
        raise ValueError(f"memorize: initial_state must be None, a dict of weights or a MemoryState; "
                         f"got {type(initial_state).__name__}")
    if not isinstance(initial_state, MemoryState):  # a sequence starts (the rule may map W_0, e.g. onto a simplex)
        W, S = optimizer_start(optimizer, W)
    elif S is None:
        S = optimizer_start(optimizer, W)[1]
    if offset and read == "token" and W_eval is None:
        raise ValueError("memorize: initial_state has offset > 0 but no eval_weights")
    if offset and read == "chunk" and pending is None:
        raise ValueError("memorize: initial_state has offset > 0 but no pending chunk (read='chunk' continues a "
                         "state of read='chunk')")

    k_all = torch.cat([cache_k, k_], 1)
    v_all = torch.cat([cache_v, v_], 1)
    g_all = torch.cat([cache_g, gates["gamma"]], 1)
    if T == 0:  # an empty piece of a stream: no outputs, the state passes through unchanged
        y = q_.new_zeros(B * H, 0, d_out)
    else:
        implementation = _implementation(impl, q_, mem, objective, optimizer, chunk_size, W, read)
        y, W, S, W_eval, offset, pending = implementation(
            q_, k_all, v_all, g_all, gates["alpha"], gates["eta"], gates["theta"], mem=mem, phi=phi,
            objective=objective, window=window, optimizer=optimizer, chunk_size=chunk_size, W=W, S=S, W_eval=W_eval,
            offset=offset, read=read, pending=pending,
            **({"checkpoint": checkpoint} if implementation is memorize_chunked else {}))

    if normalize:
        y = y[..., :d_v] / y[..., d_v:]
    o = y.reshape(B, H, T, d_v).permute(0, 2, 1, 3)
    keep = k_all.shape[1] if window is None else min(window - 1, k_all.shape[1])
    start = k_all.shape[1] - keep

    def unflat(x):
        return None if x is None else {n: w.reshape(B, H, *w.shape[1:]) for n, w in x.items()}

    state = MemoryState(
        weights=unflat(W), momentum=unflat(S), eval_weights=unflat(W_eval),
        keys=k_all[:, start:].reshape(B, H, keep, d_k), values=v_all[:, start:].reshape(B, H, keep, d_out),
        gamma=g_all[:, start:].reshape(B, H, keep), offset=offset,
        pending=None if pending is None else {"grad": unflat(pending["grad"]),
                                              **{g: pending[g].reshape(B, H) for g in PENDING_GATES}})
    return o, state
