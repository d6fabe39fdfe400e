"""Memory optimisers: the step that turns the window gradient g_t into new memory weights (docs/memory.md §3).

    gd:        W_t = α_t W_{t-1} − η_t g_t
    momentum:  S_t = θ_t S_{t-1} − η_t g_t,   W_t = α_t W_{t-1} + S_t          (Titans form, S_0 = 0)
    muon:      S_t = θ_t S_{t-1} + g_t,       W_t = α_t W_{t-1} − η_t NS_k(S_t)  (Atlas eq. 32; LaCT's Newton–Schulz
               schedule and its row renormalisation are options: ns_coefficients lact, keep_row_norms)
    adam:      m_t = β₁ m_{t−1} + (1 − β₁) g_t,  v_t = β₂ v_{t−1} + (1 − β₂) g_t²,
               W_t = α_t W_{t−1} − η_t m_t / √(v_t + ε²)                      (no bias correction)

Every optimiser is a ``MemoryOptimizer`` with ``update``, the literal one-token step of one weight matrix (the
reference loop runs it). What else it provides decides the chunked path (docs/components.md):
  * ``LinearOptimizer`` (gd, momentum): W_t and S_t are linear in the gradients; ``chunk_coefficients`` solves the
    recurrences inside a chunk in closed form (cumulative products as [n, n] decay matrices), and the read-out is
    taken in dual form without building any W_t.
  * ``TransformedMomentum`` (muon): S_t = θ_t S_{t−1} + g_t, W_t = α_t W_{t−1} − η_t D(S_t) for a map D
    (``direction``): every S_t of a chunk in closed form, D on all of them in one call, W_t by one product.
  * anything else: the chunk's per-token gradients are formed and ``update`` runs token by token.

With chunk-start reads (``read="chunk"``, docs/memory.md §4.1) a chunk of b tokens is one step of the same optimiser:
``accumulate`` gathers its tokens' gradients and gates, ``commit`` takes the step at the chunk's end with

    ḡ = (1/b) Σ_t g_t,   α_c = ∏_t α_t,   η_c = Σ_t η_t,   θ_c = ∏_t θ_t
"""
from __future__ import annotations

import torch

from .ops.newton_schulz.reference import NS_CHOICES, NS_SCHEDULES, newton_schulz, ns_schedule
from .ops.causal import causal_mask, causal_matmul, strictly_lower
from .components import Component, build

def orthogonalize(S: torch.Tensor, ndim: int, steps: int, coefficients: str, ns=newton_schulz) -> torch.Tensor:
    """NS_k on 2-D weights (the trailing ``ndim`` dims of S); a 1-D parameter passes through (plain momentum).

    ns: the Newton–Schulz implementation (this module's, or a kernel with the same signature)."""
    return ns(S, steps, coefficients) if ndim == 2 else S


def _bc(x, like):
    """Gates [N] against a weight [N, *shape]; a channel gate [N, C] scales the weight's last (input) axis."""
    if x.dim() == 2:
        return x.reshape(x.shape[:1] + (1,) * (like.dim() - 2) + x.shape[1:])
    return x.reshape(x.shape + (1,) * (like.dim() - 1))


def scaled(W, f):
    """f ⊙ W for every weight {name: [N, *shape]}: the weights a token's gradient is taken at with gradient_at=
    "retained" (f = α_t) or an erase gate (f = e_t, or α_t ⊙ e_t). f: [N] or, per channel, [N, C] (W Diag(f))."""
    return {n: _bc(f, w) * w for n, w in W.items()}


class MemoryOptimizer(Component):
    """The memory's optimiser. ``update(w, s, g, alpha, eta, theta) -> (w, s)``: one token for one weight
    matrix, w and g [N, *shape], s its state [N, *state_shape(shape)] (None for a stateless optimiser), gates [N].

    uses_theta: whether the optimiser reads the θ gate (a layer learns θ only then)."""

    uses_theta = False

    def state_shape(self, shape: tuple) -> tuple | None:
        """The optimiser state of one weight matrix of ``shape`` (None: no state)."""
        return None

    def update(self, w, s, g, alpha, eta, theta):
        raise NotImplementedError

    def start(self, w):
        """(W_0, S_0) of a sequence from the initial weights w [N, *shape]: w and a zero state by default."""
        shape = self.state_shape(tuple(w.shape[1:]))
        return w, (None if shape is None else w.new_zeros(w.shape[0], *shape))


class LinearOptimizer(MemoryOptimizer):
    """An optimiser linear in the gradients, solved over a chunk by ``chunk_coefficients``."""

    def chunk_coefficients(self, alpha, eta, theta) -> dict:
        """Closed forms over one chunk of n tokens, from (W_0, S_0). Gates: [N, n]. Returns
          W_t = a[t] W_0 + m[t] S_0 + Σ_j Cw[t, j] g_j,   S_t = s[t] S_0 + Σ_j Cs[t, j] g_j
        a (m, s): [N, n]; Cw (Cs): [N, n, n] lower triangular; m, s, Cs only for an optimiser with state."""
        raise NotImplementedError


class TransformedMomentum(MemoryOptimizer):
    """S_t = θ_t S_{t−1} + g_t,  W_t = α_t W_{t−1} − η_t D(S_t); a subclass gives D (``direction``)."""

    uses_theta = True

    def state_shape(self, shape):
        return tuple(shape)

    def direction(self, S: torch.Tensor, ndim: int) -> torch.Tensor:
        """D(S) for momenta S [..., *shape] of weights with ``ndim`` dims."""
        raise NotImplementedError

    def direction_flops(self, out_dim: int, in_dim: int) -> int:
        """Matrix-product FLOPs of D on one [out, in] momentum (memory/cost.py; 0: element-wise)."""
        return 0

    def update(self, w, s, g, alpha, eta, theta):
        s = _bc(theta, w) * s + g
        return _bc(alpha, w) * w - _bc(eta, w) * self.direction(s, w.dim() - 1), s

    def chunk_coefficients(self, alpha, eta, theta) -> dict:
        """S_t = s[t] S_0 + Σ_j Cs[t, j] g_j and W_t = a[t] W_0 + Σ_j Cw[t, j] D(S_j) over a chunk (gates [N, n])."""
        A = decay_matrix(alpha)  # (the order of these products is kept: it fixes autograd's order of sums)
        a = A[..., 0] * alpha[..., :1]
        Th = decay_matrix(theta)
        return {"a": a, "s": Th[..., 0] * theta[..., :1], "Cs": Th, "Cw": _times_eta(A, eta)}


class GD(LinearOptimizer):
    """W_t = α_t W_{t−1} − η_t g_t."""

    delta_rule = True  # with a linear map and the l2 bias at chunk 1: the gated delta rule (delta_rule.py)

    def update(self, w, s, g, alpha, eta, theta):
        return _bc(alpha, w) * w - _bc(eta, w) * g, None

    def chunk_coefficients(self, alpha, eta, theta):
        return _accumulation(alpha, eta)

    def __repr__(self):
        return "gd"


class Momentum(LinearOptimizer):
    """S_t = θ_t S_{t−1} − η_t g_t,  W_t = α_t W_{t−1} + S_t (Titans' form, S_0 = 0)."""

    uses_theta = True

    def state_shape(self, shape):
        return tuple(shape)

    def update(self, w, s, g, alpha, eta, theta):
        s = _bc(theta, w) * s - _bc(eta, w) * g
        return _bc(alpha, w) * w + s, s

    def chunk_coefficients(self, alpha, eta, theta):
        A = decay_matrix(alpha)
        a = A[..., 0] * alpha[..., :1]
        Th = decay_matrix(theta)
        s = Th[..., 0] * theta[..., :1]
        AT = causal_matmul(A, Th)  # Σ_{m=j..t} A[t,m] Θ[m,j]
        return {"a": a, "m": causal_matmul(A, s.unsqueeze(-1)).squeeze(-1), "s": s, "Cw": _times_eta(AT, eta),
                "Cs": _times_eta(Th, eta)}

    def __repr__(self):
        return "momentum"


class Muon(TransformedMomentum):
    """D(S) = NS_k(S) for matrices, S for vectors (Atlas eq. 32).

    ns_steps:        k
    ns_coefficients: quintic | cubic (one triple for every step) | lact (LaCT's schedule of five triples, k = 5)
    keep_row_norms:  after each step, every row of a matrix (a unit's input weights: the last axis) rescaled to the
                     norm it had before the step, W_t[r] ← W_t[r] ‖W_{t−1}[r]‖ / ‖W_t[r]‖ — LaCT's renormalisation
                     of its fast weights, which keeps each row at its initial norm. The step is then not W_0 plus a sum
                     of D(S_t): no closed form over a chunk (``direction`` is None, the chunk runs ``update`` token by
                     token; with read chunk nothing changes: one step per chunk).
    ns: the Newton–Schulz implementation (``newton_schulz``; the Triton path gives its kernel, ``with_ns``)."""

    def __init__(self, ns_steps: int = 5, ns_coefficients: str = "quintic", keep_row_norms: bool = False):
        if isinstance(ns_steps, bool) or not isinstance(ns_steps, int) or ns_steps < 1:
            raise ValueError(f"muon ns_steps must be an int >= 1, got {ns_steps!r}")
        if ns_coefficients not in NS_CHOICES:
            raise ValueError(f"muon ns_coefficients: unknown value {ns_coefficients!r}; valid choices: "
                             f"{', '.join(NS_CHOICES)}")
        if ns_coefficients in NS_SCHEDULES and ns_steps != len(NS_SCHEDULES[ns_coefficients]):
            raise ValueError(f"muon ns_steps: ns_coefficients {ns_coefficients!r} is a schedule of "
                             f"{len(NS_SCHEDULES[ns_coefficients])} steps, got ns_steps={ns_steps!r}")
        if not isinstance(keep_row_norms, bool):
            raise ValueError(f"muon keep_row_norms: expected true or false, got {keep_row_norms!r}")
        self.ns_steps, self.ns_coefficients, self.ns = ns_steps, ns_coefficients, newton_schulz
        self.keep_row_norms = keep_row_norms

    @property
    def one_triple(self) -> bool:
        """One (a, b, c) for every step (quintic, cubic): what the Newton–Schulz kernels take; a schedule is not."""
        return self.ns_coefficients not in NS_SCHEDULES

    def with_ns(self, ns) -> "Muon":
        """The same optimiser on another Newton–Schulz implementation (the plan's variant: memory/plan.py)."""
        other = Muon(self.ns_steps, self.ns_coefficients, self.keep_row_norms)
        other.ns = ns
        return other

    @property
    def direction(self):
        """D(S, ndim): the transformed closed form's map; None with keep_row_norms (no closed form, see above)."""
        return None if self.keep_row_norms else self._direction

    def _direction(self, S, ndim):
        return orthogonalize(S, ndim, self.ns_steps, self.ns_coefficients, self.ns)

    def update(self, w, s, g, alpha, eta, theta):
        s = _bc(theta, w) * s + g
        new = _bc(alpha, w) * w - _bc(eta, w) * self._direction(s, w.dim() - 1)
        return (kept_row_norms(new, w) if self.keep_row_norms else new), s

    def direction_flops(self, out_dim, in_dim):
        """k steps of A = X Xᵀ (2m²M), A² (2m³, not where c = 0: cubic) and B X (2m²M); m ≤ M the matrix's sides."""
        m, M = sorted((out_dim, in_dim))
        return sum(4 * m * m * M + (2 * m ** 3 if c else 0) for _, _, c in ns_schedule(self.ns_coefficients,
                                                                                       self.ns_steps))

    def __repr__(self):
        return f"muon(k={self.ns_steps},{self.ns_coefficients}{',rows kept' if self.keep_row_norms else ''})"


def kept_row_norms(new, old):
    """``new`` with each row of a matrix rescaled to the norm of that row in ``old`` (LaCT's renormalisation; weights
    [N, out, in], rows along the last axis); vectors [N, d] pass through."""
    if new.dim() != 3:
        return new
    norm = torch.linalg.vector_norm(new, dim=-1, keepdim=True)
    return new * (torch.linalg.vector_norm(old, dim=-1, keepdim=True) / norm.clamp_min(torch.finfo(new.dtype).tiny))


class Adam(MemoryOptimizer):
    """Adam (Kingma & Ba, 2015) as the memory's optimiser, with the retention gate α and the learning rate η of the
    token; β₁, β₂ are constants (θ is not used) and there is no bias correction (the state keeps no step count).
    ε sits inside the root, √(v + ε²), so that the step's derivative stays finite where v = 0: the layer's backward
    differentiates through m / √(v + ε²), whose derivative in g reaches 1/ε at g = 0. ε = 1e-3 bounds it (at the
    outer optimisers' 1e-8, float32 gradients of the keys came out non-finite). v is not linear in g, so a chunk
    runs token by token."""

    def __init__(self, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-3):
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1 and eps > 0):
            raise ValueError(f"adam needs 0 <= beta1, beta2 < 1 and eps > 0; got {beta1}, {beta2}, {eps}")
        self.beta1, self.beta2, self.eps = beta1, beta2, eps

    def state_shape(self, shape):
        return (2, *shape)  # m, v

    def update(self, w, s, g, alpha, eta, theta):
        m = self.beta1 * s[:, 0] + (1 - self.beta1) * g
        v = self.beta2 * s[:, 1] + (1 - self.beta2) * g * g
        return _bc(alpha, w) * w - _bc(eta, w) * m / (v + self.eps ** 2).sqrt(), torch.stack([m, v], 1)

    def __repr__(self):
        return f"adam(β={self.beta1:g},{self.beta2:g})"


class TransformedAccumulator(MemoryOptimizer):
    """A_t = α_t A_{t−1} − η_t g_t (state: A),  W_t = T(A_t); a subclass gives T (``weights``) and A_0 (``start``).
    A is linear in the gradients (gd's closed form over a chunk); W_t is T of it, token by token."""

    def state_shape(self, shape):
        return tuple(shape)

    def weights(self, A: torch.Tensor) -> torch.Tensor:
        """T(A) for accumulators A [N, *shape] of one weight matrix each (a chunk's tokens: [N, n, *shape] flattened
        to [N·n, *shape] by the caller)."""
        raise NotImplementedError

    def update(self, w, s, g, alpha, eta, theta):
        A = _bc(alpha, w) * s - _bc(eta, w) * g
        return self.weights(A), A

    def chunk_coefficients(self, alpha, eta, theta) -> dict:
        """A_t = a[t] A_0 + Σ_j Cw[t, j] g_j over a chunk (gates [N, n])."""
        return _accumulation(alpha, eta)


def _accumulation(alpha, eta):
    """X_t = α_t X_{t−1} − η_t g_t over a chunk: X_t = a[t] X_0 + Σ_j Cw[t, j] g_j (gates [N, n])."""
    A = decay_matrix(alpha)  # ∏ α over (j, t]
    return {"a": A[..., 0] * alpha[..., :1], "Cw": _times_eta(A, eta)}


def _lq_norm(A, q, eps=1e-12):
    """‖A‖_q over each weight matrix's entries, [N, 1, ...] (at least eps)."""
    return A.abs().pow(q).flatten(1).sum(1).pow(1 / q).clamp_min(eps).reshape(-1, *[1] * (A.dim() - 1))


class LqRetention(TransformedAccumulator):
    """Miras' ℓq retention (Moneta): an accumulator A_t = α_t A_{t−1} − η_t g_t and W_t = A_t / ‖A_t‖_q^{q−2}, the norm
    over each weight matrix's entries; q = 2 is gd. A_0 = W_0 ‖W_0‖_q^{(q−2)/(3−q)}, so that W_0 is the layer's
    initial weights (q = 3 is refused: W would always have unit norm). State: A."""

    def __init__(self, q: float = 4.0):
        if not (q > 1 and q != 3):
            raise ValueError(f"lq_retention q must be > 1 and not 3, got {q!r}")
        self.q = float(q)

    def start(self, w):
        return w, w * _lq_norm(w, self.q) ** ((self.q - 2) / (3 - self.q))

    def weights(self, A):
        return A / _lq_norm(A, self.q) ** (self.q - 2)

    def __repr__(self):
        return f"lq_retention(q={self.q:g})"


class KLRetention(TransformedAccumulator):
    """Miras' KL retention (Memora): W_t = c · softmax(α_t log W_{t−1} − η_t g_t) over each row of a weight matrix
    (rows positive, summing to c; c = √in by default, the scale of a N(0, 1/in) row). Kept as logits z with W = c ·
    softmax(z): z_t = α_t z_{t−1} − η_t g_t is the same step (a row's constant drops out of the softmax). A sequence
    starts from W_0 = c · softmax(w), the layer's initial weights read as logits."""

    def __init__(self, scale: float | None = None):
        if scale is not None and not scale > 0:
            raise ValueError(f"kl_retention scale must be > 0, got {scale!r}")
        self.scale = scale

    def weights(self, z):
        c = self.scale if self.scale is not None else z.shape[-1] ** 0.5
        return c * torch.softmax(z, -1)

    def start(self, w):
        return self.weights(w), w

    def __repr__(self):
        return "kl_retention" + (f"(c={self.scale:g})" if self.scale is not None else "")


OPTIMIZERS = {"gd": GD, "momentum": Momentum, "muon": Muon, "adam": Adam, "lq_retention": LqRetention,
              "kl_retention": KLRetention}


def build_optimizer(spec, where: str = "optimizer") -> MemoryOptimizer:
    """A memory optimizer from a short-hand (``muon``), a short-hand with options ({name: muon, ns_steps: 3}), a
    MemoryOptimizer or a class_path dict."""
    return build("optimizer", OPTIMIZERS, spec, MemoryOptimizer, where)


def step(optimizer, W, S, g, alpha, eta, theta):
    """One token of the optimiser, literally. W, S, g: dicts name -> [N, *shape]; gates: [N].

    Returns (W_t, S_t); S is None for an optimiser without state."""
    W_new, S_new = {}, {}
    for n, w in W.items():
        W_new[n], S_new[n] = optimizer.update(w, None if S is None else S[n], g[n], alpha, eta, theta)
    return W_new, (S_new if S is not None else None)


def start(optimizer, W):
    """(W_0, S_0) of a sequence from initial weights W {name: [N, *shape]} (``MemoryOptimizer.start``); S_0 is None
    for an optimiser without state."""
    pairs = {n: optimizer.start(w) for n, w in W.items()}
    S = {n: s for n, (_, s) in pairs.items()}
    return {n: w for n, (w, _) in pairs.items()}, (None if any(s is None for s in S.values()) else S)


def levels(commits) -> dict[int, list[str]]:
    """{C: the matrices that commit every C tokens} of a learning rule's ``commits`` {name: (C, r)}
    (LearningRule.commits)."""
    out: dict[int, list[str]] = {}
    for n, (C, _) in commits.items():
        out.setdefault(C, []).append(n)
    return out


def period(commits) -> int:
    """Tokens after which every matrix of a learning rule's ``commits`` {name: (C, r)} has committed: the longest C."""
    return max(C for C, _ in commits.values())


def accumulate(pending, commits, g, alpha, eta, theta):
    """The commits in progress with more tokens (chunk-start reads): per level C, Σ g of its matrices, ∏ α, Σ η, ∏ θ
    since its last commit.

    pending: None (every level at a boundary) or {C: {"grad": {name: [N, *shape]}, "alpha", "eta", "theta": [N]}}
    (the levels in progress); commits: {name: (C, r)}; g: the tokens' summed window gradients {name: [N, *shape]};
    gates: their ∏ α, Σ η and ∏ θ, [N]."""
    pending = dict(pending or {})
    for C, names in levels(commits).items():
        level = pending.get(C)
        pending[C] = ({"grad": {n: g[n] for n in names}, "alpha": alpha, "eta": eta, "theta": theta} if level is None
                      else {"grad": {n: level["grad"][n] + g[n] for n in names}, "alpha": level["alpha"] * alpha,
                            "eta": level["eta"] + eta, "theta": level["theta"] * theta})
    return pending


def commit(optimizer, W, S, pending, commits, position):
    """(W, S, pending): every level whose chunk ends at ``position`` (tokens since the start of the longest level's
    chunk; position % C == 0) commits: each of its matrices takes one optimiser step with its mean gradient
    ḡ = Σ g / C and gates ∏ α, r Σ η, ∏ θ, and the level leaves ``pending`` (None when none is left)."""
    W, S, pending = dict(W), (None if S is None else dict(S)), dict(pending)
    for C, names in levels(commits).items():
        if position % C:
            continue
        level = pending.pop(C)
        for n in names:
            w, s = step(optimizer, {n: W[n]}, None if S is None else {n: S[n]}, {n: level["grad"][n] / C},
                        level["alpha"], level["eta"] * commits[n][1], level["theta"])
            W[n] = w[n]
            if S is not None:
                S[n] = s[n]
    return W, S, (pending or None)


def decay_matrix(x: torch.Tensor) -> torch.Tensor:
    """P[t, j] = ∏_{l=j+1..t} x_l for j ≤ t, 0 above the diagonal. x: [N, n] in [0, 1] -> [N, n, n].

    Computed in log space as a masked cumulative sum (no division by small products).
    """
    n = x.shape[-1]
    logx = torch.log(x.clamp_min(torch.finfo(x.dtype).tiny))
    rep = logx.unsqueeze(-1).expand(*x.shape, n)  # rep[l, j] = log x_l
    below = strictly_lower(n, x.device)  # j < l
    seg = torch.where(below, rep, 0.0).cumsum(-2)  # seg[t, j] = Σ_{j<l≤t} log x_l
    return torch.where(causal_mask(n, n, x.device), seg.exp(), 0.0)


def _times_eta(P, eta):
    """−P[t, j] η_j on and below the diagonal (where, not a product: a NaN η_j stays in rows t ≥ j)."""
    lower = causal_mask(eta.shape[-1], eta.shape[-1], eta.device)
    return torch.where(lower, -P * eta.unsqueeze(-2), 0.0)
