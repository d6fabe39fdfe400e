"""``memorize``: the public entry point of the memory engine."""
from __future__ import annotations

import dataclasses
import functools

import torch

from .call import Call, Carried, Inputs, Memory
from .chunked import memorize_chunked, memorize_chunked_chunk_start
from .config import MemoryConfig
from .learning_rules import Steps, axis_width
from .ops.newton_schulz.reference import newton_schulz
from .optimizers import levels, period, start as optimizer_start
from .plan import Shapes, acting, check_impl, plan
from .reference import memorize_reference, memorize_reference_chunk_start
from .state import MemoryState, map_pending


def memorize_triton(call):
    """The Triton path (memory/dispatch.py), imported on first use (it imports triton)."""
    from .dispatch import memorize_triton
    return memorize_triton(call)


def memorize_fla(call):
    """fla-core's chunk kernels (memory/fla.py), imported on first use."""
    from .fla import memorize_fla
    return memorize_fla(call)


def triton_newton_schulz(G, steps, coefficients):
    """The batched Triton Newton–Schulz (ops/newton_schulz/triton.py), imported on first use."""
    from .ops.newton_schulz import newton_schulz as kernel
    return kernel(G, steps, coefficients)


# what computes each path of the plan (memory/plan.py), by read (docs/memory.md §4.1): path(Call) -> Result
PATHS = {"token": {"reference": memorize_reference, "chunked": memorize_chunked, "triton": memorize_triton,
                   "fla": memorize_fla},
         "start": {"reference": memorize_reference, "chunked": memorize_chunked},
         "chunk": {"reference": memorize_reference_chunk_start, "chunked": memorize_chunked_chunk_start}}
# muon's Newton–Schulz, by the plan's variant
NEWTON_SCHULZ = {"triton": triton_newton_schulz, "cpu": functools.partial(newton_schulz, impl="cpu"),
                 "bmm": functools.partial(newton_schulz, impl="bmm")}


def _gate(name, gate, value, B, T, H, like, channels=None):
    """A gate as [B·H, T]: a [B, T, H] tensor, a Python number, or None (the rule's value: a constant). A gate the
    rule does not read (θ of a rule without momentum) may stay unset: it is 0. A gate learned per channel (``channels``
    of them) is [B·H, T, C], from a [B, T, H, C] tensor or a number."""
    shape, per = ((B, T, H), ()) if channels is None else ((B, T, H, channels), (channels,))
    dims = "B, T, H" if channels is None else "B, T, H, C"
    if value is None:
        value = gate.value
        if not isinstance(value, (int, float)):
            if gate.used:
                raise ValueError(f"memorize: gate {name} is {value!r} in the config; pass its values (a [{dims}] "
                                 f"tensor or a number)")
            value = 0.0
    if isinstance(value, (int, float)):
        if name in ("alpha", "theta") and value < 0:  # decay factors: the chunked closed forms take their logarithm
            raise ValueError(f"memorize: gate {name} must be >= 0 (a decay factor); got {value!r}")
        return torch.full((B * H, T, *per), float(value), dtype=like.dtype, device=like.device)
    if not isinstance(value, torch.Tensor) or value.shape != shape:
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"memorize: gate {name} must be a [{dims}] = {list(shape)} tensor, a number or None; "
                         f"got {got}")
    if value.device != like.device:
        raise ValueError(f"memorize: gate {name} must be on q's device {like.device}; got {value.device}")
    return value.to(like.dtype).transpose(1, 2).reshape(B * H, T, *per)


def _given_gates(specs, gates):
    """{gate: the call's value, or None (the config's constant)}; a name the rule does not have is an error listing
    those it has."""
    gates = dict(gates or {})
    unknown = sorted(set(gates) - set(specs))
    if unknown:
        raise ValueError(f"memorize: the learning rule has no gate(s) {unknown}; its gates: {', '.join(specs)}")
    return {name: gates.get(name) for name in specs}


def _at_first_step(gate, steps):
    """A per-token decay [N, T(, C)] at the first of each token's n_h = ``steps`` steps, 1 at the others:
    [N, T·n_h(, C)]."""
    ones = torch.ones_like(gate).unsqueeze(2).expand(-1, -1, steps - 1, *gate.shape[2:])
    return torch.cat([gate.unsqueeze(2), ones], 2).flatten(1, 2)


def _check_qkv(q, k, v, steps=1):
    """q, k, v: floating-point torch tensors of one dtype on one device, q [B, T, H, d_k], k [B, T·n_h, H, d_k] and
    v [B, T·n_h, H, d_v] (n_h = ``steps`` per token)."""
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
    B, T, H, d_k = q.shape if q.dim() == 4 else (None,) * 4
    if q.dim() != 4 or k.shape != (B, T * steps, H, d_k) or v.dim() != 4 or v.shape[:3] != k.shape[:3]:
        n = "" if steps == 1 else f"·{steps}"
        raise ValueError(f"memorize: expected q [B, T, H, d_k], k [B, T{n}, H, d_k] and v [B, T{n}, H, d_v]; "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")


def _with_normaliser(weights, normalize, d_v, D):
    """Initial weights with normalize=True's z row (zeros) appended to a linear W of d_v rows."""
    weights = dict(weights)
    if normalize and weights.get("W") is not None and weights["W"].shape[-2] == d_v:
        weights["W"] = torch.cat([weights["W"], weights["W"].new_zeros(*weights["W"].shape[:-2], 1, D)], -2)
    return weights


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


def memorize(q, k, v, config: MemoryConfig | None = None, *, gates=None, coefficients=None, initial_state=None,
             impl="auto", **changes):
    """Read a sequence with a memory that is trained while it reads (docs/memory.md).

    q, k: [B, T, H, d_k]; v: [B, T, H, d_v]. Returns (o [B, T, H, d_v], MemoryState). With a learning rule of n_h > 1
    steps per token (deltaproduct) k, v and the gates per step (η, γ) have T·n_h rows ([B, T·n_h, H, ·]: token t's
    steps at t·n_h .. t·n_h + n_h − 1), q, α and θ T: token t runs n_h steps of the rule, α_t and θ_t at the first,
    and reads after the last (read="chunk": before the first).

    config:       the memory (MemoryConfig: components, window, chunk_size, read, normalize, checkpoint); None:
                  MemoryConfig(). ``changes`` are fields of it changed for this call, in MemoryConfig.replace's
                  form: memorize(q, k, v, architecture="linear", optimizer={"name": "muon", "ns_steps": 3}).
    gates:        {name: value} for the learning rule's gates (config.rule().gates: α, η, θ, γ; gdn2 adds erase
                  and write); each a [B, T, H] tensor, a number, or None/absent: the rule's constant (a gate
                  "learned" must be given; θ only where the optimizer reads it). A gate the rule learns per channel
                  is a [B, T, H, D] tensor (D = dim φ(k): α, erase per key channel) or [B, T, H, d_v] (write).
                  A constant gate may also be a change of the config: memorize(q, k, v, alpha=0.9).
    coefficients: the polynomial feature map's a_i ≥ 0, shape [p+1] (None: 1/i!).
    initial_state: None (zeros for linear memory; a fixed-seed N(0, 1/fan_in) draw for the MLPs — layers pass
                  their learnable W_0), a dict {name: [*shape] | [H, *shape] | [B, H, *shape]} of initial
                  weights, or the MemoryState of a previous call to continue the sequence.
    normalize:    (config) divide the read-out by z_tᵀφ(q_t), z updated by the same rule on the constant value 1
                  (normalised linear attention).
    checkpoint:   (config) chunked path only: keep each chunk's inputs for the backward and recompute the chunk there
                  (less memory, one more forward of each chunk; worth it for muon's per-token weights).
    impl:         "auto" (default): memory/plan.py's choice — on CUDA, of the paths that compute the call (fla
                  where it computes the rule in the inputs' dtype, bfloat16 / float16; triton where it covers the
                  call; chunked), the one of the lowest predicted time (memory/predict.py); chunked on the
                  CPU | "chunked" (fast) | "reference" (token loop, the oracle) | "triton" (the kernels of
                  atlas_lab.memory.ops) | "fla" (fla-core's chunk kernels, where they compute the same rule).
                  An impl asked for a call it does not cover raises NotImplementedError naming why and what it
                  covers.

    Bad arguments raise TypeError (not a floating-point torch tensor; q, k, v of different dtypes or devices) or
    ValueError (shapes, choices, ranges: window, chunk_size, a component's options; a number alpha or theta
    ≥ 0; an initial_state of another batch, head count or shape) naming the argument. Tensor gates and
    coefficients are not scanned for their values.
    T = 0 (an empty piece of a stream) returns o [B, 0, H, d_v] and the state unchanged.
    NaN / inf: a non-finite input at token t (q, k, v, a gate) makes outputs non-finite from t on — for keys,
    values and gates every later output of that head, since it enters the weights; for a query only o_t — and never
    reaches outputs before t, in every implementation. Gradients of a loss on the earlier outputs stay finite
    within one chunk of a linear memory; elsewhere autograd multiplies the zero gradient of a later, non-finite
    output by NaN and they may not.
    """
    check_impl(impl)
    if config is None:
        config = MemoryConfig()
    if not isinstance(config, MemoryConfig):
        raise TypeError(f"memorize: config must be a MemoryConfig or None; got {type(config).__name__}")
    for key, value in changes.items():
        if isinstance(value, torch.Tensor):
            raise ValueError(f"memorize: {key} is a tensor; pass a gate's values as gates={{{key!r}: ...}}")
    memory = (config.changed("memorize", **changes) if changes else config).resolve("memorize")
    config, mem, fmap, bias, optimizer, rule, specs = memory
    given = _given_gates(specs, gates)
    if rule.reset_period() is not None:
        return _with_resets(q, k, v, memory, given, coefficients, initial_state, impl)
    steps = rule.steps()
    _check_qkv(q, k, v, steps)
    B, T, H, d_k = q.shape
    d_v = v.shape[-1]
    window, chunk_size, read, normalize = config.window, config.chunk_size, config.read, config.normalize
    D = fmap.dim(d_k)
    d_out = d_v + int(normalize)
    shapes = mem.shapes(D, d_k, d_out)

    def phi(x):
        return fmap(x, coefficients)

    # which gates that are 1 by default act (a tensor, or a number other than 1: gdn2's erase and write)
    acts = acting(specs, given)
    how = plan(memory, Shapes(B, T, H, d_k, d_v), q.dtype, q.device, impl, acts)
    q_, k_, v_ = _heads_first(q), _heads_first(k), _heads_first(v)
    channels = {g: axis_width(spec.axis, D, d_v, len(shapes)) for g, spec in specs.items() if spec.axis != "head"}
    # the gates in q's dtype; in float32 for fla (its kernels take low-precision q, k, v and float32 decays)
    like = q.new_empty(0, dtype=torch.float32) if how.path == "fla" else q
    tensors = {g: _gate(g, spec, given[g], B, T * steps if spec.per_step else T, H, like, channels.get(g))
               for g, spec in specs.items()}
    if steps > 1:  # the rule runs on the T·n_h steps: q read after a token's last step, α and θ at its first
        q_ = q_.repeat_interleave(steps, 1)
        tensors = {g: x if specs[g].per_step else _at_first_step(x, steps) for g, x in tensors.items()}
    written = rule.act(Steps(q_, k_, v_, tensors, acts, phi))
    scale, v_ = rule.point(written), written.v
    if scale is not None and chunk_size != 1:
        raise ValueError(f"memorize: {rule!r} takes each token's gradient at its own weights "
                         f"({rule.evaluation_point}): it needs chunk_size 1 (got {chunk_size})")

    if normalize:  # z_t is one more row of W, learnt on the constant value 1
        v_ = torch.cat([v_, v_.new_ones(*v_.shape[:-1], 1)], -1)
    gamma_ = written.gates["gamma"]

    commits = rule.commits(shapes, chunk_size) if read == "chunk" else None
    state, (cache_k, cache_v, cache_g) = _initial(initial_state, memory, shapes, commits, how, q, v.shape[-1])
    k_all = torch.cat([cache_k, k_], 1)
    v_all = torch.cat([cache_v, v_], 1)
    g_all = torch.cat([cache_g.reshape(B * H, -1, *gamma_.shape[2:]), gamma_], 1)  # γ per matrix: window 1, none cached
    if T == 0:  # an empty piece of a stream: no outputs, the state passes through unchanged
        y = q_.new_zeros(B * H, 0, d_out)
    else:
        if how.ns in NEWTON_SCHULZ:  # muon on the plan's Newton–Schulz (fused: inside the kernel the path runs)
            optimizer = optimizer.with_ns(NEWTON_SCHULZ[how.ns])
        inputs = Inputs(q_, k_all, v_all, g_all, written.gates["alpha"], written.gates["eta"],
                        written.gates["theta"], scale)
        parts = Memory(mem, phi, bias, optimizer, window, chunk_size, read, commits, config.checkpoint)
        y, state = PATHS[read][how.path](Call(inputs, state, how, parts))
    W, S, W_eval, offset, pending = state

    y = y[:, how.row::steps]  # the output of the step each token reads at (of its n_h)
    if normalize:
        y = y[..., :d_v] / y[..., d_v:]
    o = y.reshape(B, H, T, d_v).permute(0, 2, 1, 3)
    keep = k_all.shape[1] if window is None else min(window - 1, k_all.shape[1])
    start = k_all.shape[1] - keep

    def unflat(x):
        return None if x is None else {n: w.reshape(B, H, *w.shape[1:]) for n, w in x.items()}

    state = MemoryState(
        weights=unflat(W), optimizer_state=unflat(S), eval_weights=unflat(W_eval),
        keys=k_all[:, start:].reshape(B, H, keep, d_k), values=v_all[:, start:].reshape(B, H, keep, d_out),
        gamma=g_all[:, start:].reshape(B, H, keep), offset=offset,
        pending=map_pending(pending, unflat, lambda x: x.reshape(B, H)))
    return o, state


def _initial(initial_state, memory, shapes, commits, how, q, d_v):
    """(Carried, (cached keys, values, γ of the window) [B·H, m, ·]) a call starts from: ``initial_state`` (None: the
    memory's own draw of W_0; a dict of weights; a MemoryState to continue) checked against the call. shapes: the
    memory's {name: shape}; commits: read chunk's {name: (C, r)} (the offset counts to the longest C), else None."""
    config, mem, fmap, _, optimizer, _, _ = memory
    B, _, H, d_k = q.shape
    D, normalize, chunk_size, read = fmap.dim(d_k), config.normalize, config.chunk_size, config.read
    d_out = d_v + int(normalize)
    longest = chunk_size if commits is None else period(commits)
    offset, W_eval, S, pending = 0, None, None, None
    cache_k = q.new_zeros(B * H, 0, d_k)
    cache_v = q.new_zeros(B * H, 0, d_out)
    cache_g = q.new_zeros(B * H, 0)
    if isinstance(initial_state, MemoryState):
        st = initial_state
        if not 0 <= st.offset < longest:
            raise ValueError(f"memorize: initial_state.offset={st.offset} does not fit chunk_size={chunk_size}"
                             + ("" if longest == chunk_size else f" (levels up to {longest})"))
        W = _broadcast_weights(st.weights, shapes, B, H, "initial_state.weights", q)
        if st.optimizer_state is not None:
            state_shapes = {n: optimizer.state_shape(shape) for n, shape in shapes.items()}
            S = _broadcast_weights(st.optimizer_state, state_shapes, B, H, "initial_state.optimizer_state", q)
        if st.eval_weights is not None:
            W_eval = _broadcast_weights(st.eval_weights, shapes, B, H, "initial_state.eval_weights", q)
        offset = st.offset
        if st.pending is not None:
            groups = levels(commits or {})
            if not set(st.pending) <= set(groups):
                raise ValueError(f"memorize: initial_state.pending has levels {sorted(st.pending)}; this rule's: "
                                 f"{sorted(groups)} (a state of another chunk_size or learning rule)")
            pending = {C: map_pending({C: level}, lambda x, C=C: _broadcast_weights(
                x, {n: shapes[n] for n in groups[C]}, B, H, f"initial_state.pending[{C}]", q),
                lambda x: x.reshape(B * H))[C] for C, level in st.pending.items()}
        m = st.keys.shape[2] if st.keys.dim() == 4 else -1
        for part, x, shape in (("keys", st.keys, (B, H, m, d_k)), ("values", st.values, (B, H, m, d_out)),
                               ("gamma", st.gamma, (B, H, m))):
            if tuple(x.shape) != shape:
                raise ValueError(f"memorize: initial_state.{part} must have shape [B, H, m, ...] = "
                                 f"{list(shape)} for this call; got {list(x.shape)}")
        cache_k, cache_v = st.keys.reshape(B * H, -1, d_k), st.values.reshape(B * H, -1, d_out)
        cache_g = st.gamma.reshape(B * H, -1)
    elif isinstance(initial_state, dict):
        W = _broadcast_weights(_with_normaliser(initial_state, normalize, d_v, D), shapes, B, H, "initial_state", q)
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
    if offset and {"eval_weights": W_eval, "pending": pending}.get(how.carried) is None:
        raise ValueError(f"memorize: initial_state has offset > 0 but no {how.carried} state (read={read!r} "
                         f"continues a state of read={read!r})")

    return Carried(W, S, W_eval, offset, pending), (cache_k, cache_v, cache_g)


def _with_resets(q, k, v, memory, gates, coefficients, initial_state, impl):
    """``memorize`` with a learning rule of reset period R: the state returns to W_0 before tokens R, 2R, … of the
    stream, so each segment of R tokens is read from W_0 by the rule without resets. The state carries W_0 and the
    tokens read since the last reset. The segments between the first and the last of a call are independent of the
    rest and are read as one batch of B·n sequences."""
    config, mem, fmap, _, _, rule, specs = memory
    R, steps = rule.reset_period(), rule.steps()
    inner = dataclasses.replace(config, learning_rule=rule.without_resets())
    _check_qkv(q, k, v, steps)
    B, T, H, d_k = q.shape
    D, d_out = fmap.dim(d_k), v.shape[-1] + int(config.normalize)
    if isinstance(initial_state, MemoryState):
        if initial_state.initial is None or not 0 <= initial_state.since_reset < R:
            raise ValueError(f"memorize: initial_state must carry the initial weights and 0 <= since_reset < "
                             f"reset_every={R} (a state of reset_every={R}); got since_reset="
                             f"{initial_state.since_reset}, initial={'set' if initial_state.initial else None}")
        W0, done, state = initial_state.initial, initial_state.since_reset, initial_state
    else:
        if initial_state is None:  # memorize's own draw of W_0
            initial_state = mem.init_weights(H, D, d_k, d_out, generator=torch.Generator().manual_seed(0),
                                             dtype=q.dtype, device=q.device)
        if not isinstance(initial_state, dict):
            raise ValueError(f"memorize: initial_state must be None, a dict of weights or a MemoryState; "
                             f"got {type(initial_state).__name__}")
        W0 = _broadcast_weights(_with_normaliser(initial_state, config.normalize, v.shape[-1], D),
                                mem.shapes(D, d_k, d_out), B, H, "initial_state", q)
        W0 = {n: w.reshape(B, H, *w.shape[1:]) for n, w in W0.items()}
        done, state = 0, W0
    # (start, end, whole segments read as one batch) of each call: up to the next reset, the whole segments between,
    # the last segment
    head = min(T, (R - done) % R)
    n = max(0, -(-(T - head) // R) - 1)
    calls = [c for c in ((0, head, 1), (head, head + n * R, n), (head + n * R, T, 1)) if c[1] > c[0]] or [(0, 0, 1)]
    outputs = []
    for lo, hi, count in calls:
        def part(x, rows=1):  # tokens lo..hi of a [B, T·rows, …] input as [B·count, (hi − lo)·rows / count, …]
            return x[:, lo * rows:hi * rows].reshape(B * count, (hi - lo) * rows // count, *x.shape[2:])

        given = {g: part(x, steps if specs[g].per_step else 1) if isinstance(x, torch.Tensor) else x
                 for g, x in gates.items()}
        start = state if lo == 0 and done else {n_: w.unsqueeze(1).expand(B, count, *w.shape[1:]).flatten(0, 1)
                                                 for n_, w in W0.items()}
        o, last = memorize(part(q), part(k, steps), part(v, steps), inner, gates=given, coefficients=coefficients,
                           initial_state=start, impl=impl)
        outputs.append(o.reshape(B, hi - lo, *o.shape[2:]))
        if count == 1:
            state = last
    return torch.cat(outputs, 1), dataclasses.replace(state, initial=W0, since_reset=(done + T) % R)
