"""``check_against_reference``: one call that tells whether a component, or a whole memory, computes its own equation.

A random problem (every gate of the learning rule on its axis, initial weights, T not a multiple of the chunk, an
Omega window) goes through the engine (``memorize`` with ``impl``, and its token loop ``reference``) and through
``equation_loop``: the learning rule's own per-token equation (``LearningRule.equation``: one token's step on the
weights, as its paper writes it), run token by token with nothing of the engine but the components' ``token_forward``,
``loss`` and ``update``. Outputs, final weights and the gradients of a loss on the outputs with respect to q, k, v,
every gate and the initial weights must agree; and every output must be causal: perturbing the tokens after t leaves
the outputs up to t unchanged, exactly (docs/components.md).
"""
from __future__ import annotations

import torch
from torch.func import grad, vmap

from .config import MemoryConfig
from .learning_rules import Token, axis_width
from .op import memorize
from .optimizers import accumulate, commit, period, start, step

# the problem a check reads: an Omega window of 3 and chunks of 3 over T = 8 tokens (a partial last chunk)
CHECKED = MemoryConfig(window=3, chunk_size=3)
# the range each gate is drawn from (a rule's other gates: [0.5, 1])
RANGES = {"alpha": (0.8, 1.0), "eta": (0.05, 0.5), "theta": (0.3, 0.9), "gamma": (0.2, 1.0)}


class EquationLoop:
    """What a rule's ``equation`` reads besides the token: the chunk's ``start`` (W̃), ``window`` (the token enters
    the Omega window with the value and γ its equation writes; returns Σ_{i ∈ window(t)} γ_i ∇ℓ(W; φ(k_i), v_i), γ_i
    [N] or one per weight matrix [N, M]) and ``step`` (the optimizer's step; with read chunk: the token joins its
    chunk's commit, and the chunk's last token commits)."""

    def __init__(self, mem, bias, optimizer, window, chunk_size, read, commits):
        self.mem, self.optimizer, self.size, self.chunk_size, self.read = mem, optimizer, window, chunk_size, read
        self.commits, self.pending, self.tokens, self.start, self.position = commits, None, [], None, 0

        def loss(W, phi_k, k, v):
            return bias.loss(mem.token_forward(W, phi_k, k), v)

        self.gradient = vmap(grad(loss))  # over the N sequences

    def window(self, W, x: Token, value, gamma):
        self.tokens.append((x.phi_k, x.k, value, gamma))
        if self.size is not None:
            self.tokens = self.tokens[-self.size:]
        total = None
        for phi_k, k, v, g in self.tokens:
            G = self.gradient(W, phi_k, k, v)
            gams = {n: (g if g.dim() == 1 else g[:, j]) for j, n in enumerate(G)}
            G = {n: gams[n].reshape(-1, *(1,) * (G[n].dim() - 1)) * G[n] for n in G}
            total = G if total is None else {n: total[n] + G[n] for n in G}
        return total

    def step(self, W, S, g, alpha, eta, theta):
        if self.read != "chunk":
            return step(self.optimizer, W, S, g, alpha, eta, theta)
        self.pending = accumulate(self.pending, self.commits, g, alpha, eta, theta)
        if (self.position + 1) % self.chunk_size == 0:
            W, S, self.pending = commit(self.optimizer, W, S, self.pending, self.commits,
                                        (self.position + 1) % period(self.commits))
        return W, S


def equation_loop(config: MemoryConfig, q, k, v, gates: dict, W0: dict, coefficients=None):
    """The memory by its learning rule's per-token equation: q [B, T, H, d_k], k, v [B, T·n_h, H, ·], gates {name:
    [B, T(·n_h), H(, C)]}, W0 {name: [H, *shape]} -> (o [B, T, H, d_v], weights {name: [B, H, *shape]}).

    Steps s = 0 … T·n_h − 1 in order (token t's n_h steps at t·n_h …): a reset (the rule's ``reset_period``) returns
    the weights to W_0; a chunk boundary sets the chunk's start; ``rule.equation`` takes the step; read token reads
    after a token's last step, read start and chunk before its first (the chunk's start; with read chunk the
    weights committed so far)."""
    config, mem, fmap, bias, optimizer, rule, specs = config.resolve("check")
    B, T, H, d_k = q.shape
    n_h, R, N = rule.steps(), rule.reset_period(), B * H

    def flat(x):  # [B, L, H, ...] -> [N, L, ...]
        return x.transpose(1, 2).reshape(N, x.shape[1], *x.shape[3:])

    q_, k_, v_ = flat(q), flat(k), flat(v)
    if config.normalize:  # z: one more row of W, learnt on the constant value 1
        v_ = torch.cat([v_, v_.new_ones(*v_.shape[:-1], 1)], -1)
        W0 = {**W0, "W": torch.cat([W0["W"], W0["W"].new_zeros(H, 1, W0["W"].shape[-1])], -2)}
    g_ = {name: flat(x) for name, x in gates.items()}
    phi_q, phi_k = fmap(q_, coefficients), fmap(k_, coefficients)
    initial = {n: w.unsqueeze(0).expand(B, *w.shape).reshape(N, *w.shape[1:]) for n, w in W0.items()}
    commits = rule.commits(initial, config.chunk_size) if config.read == "chunk" else None
    loop = EquationLoop(mem, bias, optimizer, config.window, config.chunk_size, config.read, commits)
    W, S = start(optimizer, initial)

    def read(W, t):
        return vmap(mem.token_forward)(W, phi_q[:, t], q_[:, t])

    ys = []
    for s in range(T * n_h):
        t, first = divmod(s, n_h)[0], s % n_h == 0
        if first and R is not None and t % R == 0:  # a reset: W_0, a fresh optimizer state, an empty window
            W, S = start(optimizer, initial)
            loop = EquationLoop(mem, bias, optimizer, config.window, config.chunk_size, config.read, commits)
        if loop.position % config.chunk_size == 0:
            loop.start = W
        if first and config.read != "token":
            ys.append(read(loop.start if config.read == "start" else W, t))
        x = Token(q_[:, t], k_[:, s], v_[:, s], phi_q[:, t], phi_k[:, s],
                  {name: g_[name][:, s if specs[name].per_step else t] for name in specs}, first)
        W, S = rule.equation(W, S, x, loop)
        loop.position += 1
        if config.read == "token" and s % n_h == n_h - 1:
            ys.append(read(W, t))
    y = torch.stack(ys, 1)  # [N, T, d_out]
    if config.normalize:
        y = y[..., :-1] / y[..., -1:]
    o = y.reshape(B, H, T, -1).transpose(1, 2)
    return o, {n: w.reshape(B, H, *w.shape[1:]) for n, w in W.items()}


def _rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check_against_reference(config: MemoryConfig | None = None, *, T=8, B=2, H=2, d=4, impl="chunked",
                            dtype=torch.float64, tol=1e-6, seed=0, **changes) -> dict:
    """Max relative errors {"output", "weights", "gradients"} of ``impl`` (and of ``reference``) against the learning
    rule's equation (``equation_loop``); AssertionError, naming the learning rule and the components, when one exceeds
    ``tol`` or when an output before a token changes with it. The memory: ``config`` (default CHECKED) with
    ``changes`` in MemoryConfig.replace's form, e.g. check_against_reference(optimizer=MyOptimizer(beta=0.5),
    window=None)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, lo=None, hi=None):
        x = torch.rand(*shape, generator=g, dtype=torch.float64) if lo is not None else \
            torch.randn(*shape, generator=g, dtype=torch.float64)
        return (lo + (hi - lo) * x if lo is not None else x).to(dtype)

    config = (config or CHECKED).replace("check", **changes)
    _, mem, fmap, obj, opt, rule, specs = config.resolve("check")
    what = f"learning rule {rule!r} with {mem!r}, {fmap!r}, {obj!r}, {opt!r}"
    n_h, D = rule.steps(), fmap.dim(d)
    q = rnd(B, T, H, d)
    k, v = torch.nn.functional.normalize(rnd(B, T * n_h, H, d), dim=-1), 0.5 * rnd(B, T * n_h, H, d)
    W0 = mem.init_weights(H, D, d, d, generator=g, dtype=dtype)
    W0 = {n: (w if w.abs().sum() > 0 else 0.1 * rnd(*w.shape)) for n, w in W0.items()}  # a non-zero start
    gates = {}
    for name, spec in specs.items():  # every gate of the rule, on its axis and rows
        lo, hi = RANGES.get(name, (0.5, 1.0))
        width = axis_width(spec.axis, D, d, len(W0))
        gates[name] = rnd(B, T * (n_h if spec.per_step else 1), H, *((width,) if spec.axis != "head" else ()),
                          lo=lo, hi=hi)
    leaves = {"q": q, "k": k, "v": v, **gates, **{f"W0.{n}": w for n, w in W0.items()}}
    for x in leaves.values():
        x.requires_grad_(True)
    weight = rnd(B, T, H, d)

    def engine(which, inputs):
        return memorize(inputs["q"], inputs["k"], inputs["v"], config, impl=which,
                        gates={name: inputs[name] for name in gates},
                        initial_state={n: inputs[f"W0.{n}"] for n in W0})

    with torch.no_grad():  # causality: the tokens after t change, the outputs up to t do not
        o = engine(impl, leaves)[0]
        for t in sorted({0, T // 2, T - 2}):
            later = {name: x.detach().clone() for name, x in leaves.items()}
            for name, x in later.items():
                if not name.startswith("W0."):
                    rows = (t + 1) * (x.shape[1] // T)  # a tensor of T·n_h steps: token t's last step
                    x[:, rows:] = x[:, rows:] * 0.5 + 0.25
            changed = engine(impl, later)[0]
            if not torch.equal(changed[:, :t + 1], o[:, :t + 1].detach()):
                raise AssertionError(f"{impl}: the output of {what} at a token t <= {t} changed when the tokens after "
                                     f"{t} did: not causal")
    results = {}
    for which in (impl, "reference", "equation"):
        if which == "equation":
            o, weights = equation_loop(config, q, k, v, gates, W0)
        else:
            o, state = engine(which, leaves)
            weights = state.weights
        grads = torch.autograd.grad((o * weight).sum(), list(leaves.values()), allow_unused=True)
        results[which] = (o, weights, grads)
    o_eq, W_eq, G_eq = results["equation"]
    errors = {}
    for which in dict.fromkeys((impl, "reference")):
        o, W, G = results[which]
        found = {"output": _rel(o, o_eq), "weights": max(_rel(W[n], W_eq[n]) for n in W_eq),
                 "gradients": max((_rel(a, b) for a, b in zip(G, G_eq) if b is not None), default=0.0)}
        bad = {key: e for key, e in found.items() if not e <= tol}
        assert not bad, f"{which} differs from the equation of {what}: {bad} (tol {tol})"
        errors = {key: max(errors.get(key, 0.0), e) for key, e in found.items()}

    return errors
