"""Learning rules: how a memory's write is gated and scheduled (docs/components.md, docs/memory.md §3).

A learning rule owns its gates (name, symbol, the axis each is learned on: one per head, per key channel or per
value channel, one per token or per step, the sigmoid it starts at when learned, the range a constant must keep),
what it allows (chunk sizes, read modes, the memories it scales) and what it does to the engine's inputs:

    W_t = α_t ⊙ W_{t−1} − η_t Σ_{i∈window(t)} γ_i ∇ℓ(W_{t−1} Diag(f_t); φ(k_i), w_i ⊙ v_i)      (the optimizer's step)

with f_t the point a token's gradient is taken at (``point``: 1, α_t, e_t or α_t ⊙ e_t), w_t the write
gate, n_h steps of it per token (``steps_per_token``) and a return to W_0 every R tokens (``reset_every``).

    online        the rule of the paper: α, η, θ, γ per head (MemoryConfig's gates; today's default)
    kda           Kimi Delta Attention: α per key channel, gradients at the retained weights α_t ⊙ W_{t−1}
    gdn2          Gated DeltaNet-2: KDA with an erase gate e_t (key channels) and a write gate w_t (value channels)
    deltaproduct  Gated DeltaProduct: n_h Householder (delta-rule) steps per token
    chunk_commit  LaCT's and TNT's chunk-parallel memories: a chunk's tokens share W̃; TNT's local memories return
                  to W_0 every ``reset_every`` tokens; ``per_matrix``: γ one per weight matrix (LaCT's learning rates)
    levels        HOPE's continuum memory: each weight matrix commits at its own frequency, every C_m tokens
    longhorn      Longhorn's implicit online step: η_t / (1 + η_t γ_t ‖φ(k_t)‖²), the closed form of
                  argmin_W ‖W − W_{t−1}‖² + η_t γ_t ‖W φ(k_t) − v_t‖²

A rule acts on a call's steps (``act``: it sees φ(k), φ(q), k, q, v and every gate, and may set each step's gates
and values from them) and states its per-token equation (``equation``: one token's step on the weights, as its
paper writes it). The engine asks the rule (``steps``, ``reset_period``, ``without_resets``, ``row``, ``point``,
``retained``, ``commits``) and never reads its settings; ``check.check_against_reference`` compares the engine with
the rule's equation, token by token, and checks that the rule is causal.

A rule is given like the other components (components.py): "kda", {name: deltaproduct, householder_steps: 3}, a
class_path, or an object; a user's own is one LearningRule subclass (docs/components.md).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from .components import Component, build
from .delta_rule import delta_rule_applies
from .optimizers import scaled

# a gate per head, per key channel (D = dim φ(k)), per value channel (d_v) or per weight matrix of the memory
AXES = ("head", "key", "value", "matrix")


def axis_width(axis: str, D: int, d_v: int, matrices: int) -> int:
    """Gates per head of a gate learned on ``axis`` (AXES): 1, D, d_v, or one per weight matrix."""
    return {"head": 1, "key": D, "value": d_v, "matrix": matrices}[axis]

# what token t reads (docs/memory.md §4.1): token — W_t, after its own step; start — the weights its chunk started
# from, the state following the per-token rule (TNT's global memory); chunk — the chunk's start too, the chunk one
# optimiser step with its mean gradient (Titans' code)
READS = ("token", "start", "chunk")


def _fraction(x):
    return 0 <= x <= 1


def _fraction_below_one(x):
    return 0 <= x < 1


def _non_negative(x):
    return x >= 0


@dataclass(frozen=True)
class Steps:
    """One call's steps as its rule sees them: N = B·H sequences, S = T·n_h steps (token t's at rows t·n_h …
    t·n_h + n_h − 1).

    q [N, S, d_k] (each token's query on each of its steps), k [N, S, d_k], v [N, S, d_v]; gates {name: [N, S(, C)]}
    (a gate of the token, α and θ, at its first step and 1 at its others); acts {gate: whether it acts} (``acting``);
    phi: the feature map. ``phi_k``, ``phi_q``: φ(k), φ(q) [N, S, D], computed when read."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    gates: dict
    acts: dict
    phi: Callable

    @property
    def phi_k(self) -> torch.Tensor:
        return self.phi(self.k)

    @property
    def phi_q(self) -> torch.Tensor:
        return self.phi(self.q)


class Token:
    """One step of every sequence, as a rule's ``equation`` reads it: q, k, v, phi_q, phi_k [N, ·]; gates {name: [N]
    or [N, C]} (every gate of the step: the token's α and θ on each of its steps); first: the token's first step."""

    def __init__(self, q, k, v, phi_q, phi_k, gates, first):
        self.q, self.k, self.v, self.phi_q, self.phi_k, self.gates, self.first = q, k, v, phi_q, phi_k, gates, first


@dataclass(frozen=True)
class GateSpec:
    """One gate of a rule.

    value:    "learned" (σ(w·x + b) per token, times ``scale``), a constant, or "head_decay" (α only: RetNet's
              fixed α_h = 1 − 2^(−5−h))
    init:     a learned gate's σ at initialisation; holds, expected: the range of a constant
    axis:     head (one per head) | key (one per key channel, D) | value (one per value channel, d_v) | matrix (one
              per weight matrix of the memory, in its ``shapes`` order: each matrix's gradients weighted by its own)
    per_step: one per step of the rule (n_h per token), else one per token, acting at the token's first step
    used:     whether the rule reads it (θ only where the optimizer has momentum): an unused gate is not learned
    scale:    the largest value of a learned gate (η_max for η)
    neutral:  the constant at which the gate does nothing (1 for gdn2's erase and write: not shown), or None
    """

    symbol: str
    value: Any
    init: float
    holds: Callable[[float], bool]
    expected: str
    axis: str = "head"
    per_step: bool = False
    used: bool = True
    scale: float = 1.0
    neutral: float | None = None


class LearningRule(Component):
    """The online rule (one step per token, gates per head, gradients at W̃, no resets); subclasses change one thing.

    What a rule states (the engine asks, never reads its settings):
      gates(config, optimizer) -> {name: GateSpec}
      check(config, optimizer, linear_map, where): ValueError for what the rule does not allow
      act(steps) -> Steps: each step's gates and values from the call's tokens (default: as given)
      point(steps) -> f [N, S(, C)] or None: token t's gradient at W_{t−1} Diag(f_t) (None: at W̃)
      equation(W, S, x, loop) -> (W, S): one token's step on the weights, as its paper writes it (``Token`` x; the
        loop gives the window's gradient, the optimizer's step and the chunk's start: check.py)
      steps(), reset_period(), without_resets(), row(read), retained(), commits(names, chunk_size)
    """

    gradient_at = "state"  # state: g_t at W̃ (Titans) | retained: at α_t ⊙ W_{t−1} (chunk 1: KDA, GDN, fla)
    steps_per_token = 1  # n_h
    reset_every = None  # R: W returns to W_0 before tokens R, 2R, … (None: never)
    per_channel: tuple[str, ...] = ()  # the gates learned per channel (their axis: CHANNEL_AXIS)
    reads = READS

    def gates(self, config, optimizer) -> dict[str, GateSpec]:
        """The online rule's gates: MemoryConfig.alpha, eta, theta, gamma (θ read only by a rule with momentum)."""
        return {"alpha": GateSpec("α", config.alpha, 0.999, _fraction, "in [0, 1]", self._axis("alpha")),
                "eta": GateSpec("η", config.eta, 0.5, _non_negative, ">= 0", per_step=True, scale=config.eta_max),
                "theta": GateSpec("θ", config.theta, 0.9, _fraction_below_one, "in [0, 1)", used=optimizer.uses_theta),
                "gamma": GateSpec("γ", config.gamma, 0.9, _non_negative, ">= 0", per_step=True)}

    def _axis(self, name):
        return CHANNEL_AXIS[name] if name in self.per_channel else "head"

    def check(self, config, optimizer, linear_map: bool, where: str) -> None:
        """ValueError naming the key when the config asks for what this rule does not allow."""
        if config.read not in self.reads:
            raise ValueError(f"{where}.read: {self!r} reads {' or '.join(self.reads)} (got {config.read!r})")
        if self.needs_chunk_one and config.chunk_size != 1:
            raise ValueError(f"{where}.chunk_size: {self!r} takes each token's gradient at its own weights "
                             f"({self.evaluation_point}): it needs chunk_size 1 (got {config.chunk_size})")
        if self.reset_every is not None and self.reset_every % config.chunk_size:
            raise ValueError(f"{where}.learning_rule.reset_every: expected a multiple of chunk_size="
                             f"{config.chunk_size} (a reset falls on a chunk boundary), got {self.reset_every!r}")
        if self.per_channel and not linear_map:
            raise ValueError(f"{where}.learning_rule: {self!r} learns {', '.join(self.per_channel)} per channel, "
                             f"which scales the columns of a linear memory's W; needs architecture linear")
        specs = self.gates(config, optimizer)
        for name in self.per_channel:
            if specs[name].value != "learned":
                raise ValueError(f"{where}.{name}: {self!r} learns {name} per channel: expected 'learned', got "
                                 f"{specs[name].value!r}")

    @property
    def needs_chunk_one(self) -> bool:
        return self.gradient_at == "retained" or self.steps_per_token > 1

    @property
    def evaluation_point(self) -> str:
        return "α_t ⊙ W_{t−1}" if self.gradient_at == "retained" else "W̃"

    def steps(self) -> int:
        """n_h: the rule's steps per token."""
        return self.steps_per_token

    def reset_period(self) -> int | None:
        """R: the state returns to W_0 before tokens R, 2R, … of the stream; None: never."""
        return self.reset_every

    def without_resets(self) -> "LearningRule":
        """The same rule with no resets: what each segment of R tokens runs."""
        rule = copy.copy(self)
        rule.reset_every = None
        return rule

    def row(self, read: str) -> int:
        """Of a token's n_h steps, the one whose output it reads: after its last (read token), before its first (read
        start and chunk: the weights before the token)."""
        return self.steps_per_token - 1 if read == "token" else 0

    def retained(self) -> bool:
        """Whether token t's gradient is taken at the retained weights α_t ⊙ W_{t−1} (fla's delta rules' point)."""
        return self.gradient_at == "retained"

    def point(self, steps: Steps):
        """f [N, S(, C)]: token t's gradient at W_{t−1} Diag(f_t); None: at W̃."""
        return steps.gates["alpha"] if self.gradient_at == "retained" else None

    def scaled(self, acts) -> bool:
        """Whether ``point`` is set (each token's gradient at its own point) with these gates acting."""
        return self.gradient_at == "retained"

    def act(self, steps: Steps) -> Steps:
        """The steps the engine runs: each step's gates and values, from the call's tokens (here: as given)."""
        return steps

    def equation(self, W, S, x: Token, loop):
        """One token's step on the weights {name: [N, *shape]}, literally (docs/memory.md §3):

            g_t = Σ_{i ∈ window(t)} γ_i ∇ℓ(W̃; φ(k_i), v_i),   (W_t, S_t) = step(W_{t−1}, S_{t−1}, g_t; α_t, η_t, θ_t)

        W̃ the chunk's start (``loop.start``), or α_t ⊙ W_{t−1} with gradient_at="retained". Returns (W_t, S_t)."""
        alpha = x.gates["alpha"]
        at = scaled(W, alpha) if self.gradient_at == "retained" else loop.start
        g = loop.window(at, x, x.v, x.gates["gamma"])
        return loop.step(W, S, g, alpha, x.gates["eta"], x.gates["theta"])

    def commits(self, names, chunk_size: int) -> dict[str, tuple[int, float]]:
        """read="chunk": {matrix: (C_m, r_m)}: matrix m commits every C_m tokens, one optimiser step with its mean
        gradient over them and η = r_m Σ_t η_t. Every matrix at the config's chunk, r = 1, but for ``levels``."""
        return {n: (chunk_size, 1.0) for n in names}

    def describe(self) -> str:
        """What `atlas-lab presets` adds after the gates ('' for the online rule)."""
        return ""

    def __repr__(self):
        return NAMES.get(type(self), type(self).__name__)


def _check_gradient_at(gradient_at):
    if gradient_at not in ("state", "retained"):
        raise ValueError(f"gradient_at: unknown value {gradient_at!r}; valid choices: state, retained")
    return gradient_at


class Online(LearningRule):
    """The paper's rule: gates per head, one step per token; gradient_at="retained" (chunk 1) takes token t's
    gradient at α_t ⊙ W_{t−1} (Gated DeltaNet's paper and fla's form: decay first, then the step)."""

    def __init__(self, gradient_at: str = "state"):
        self.gradient_at = _check_gradient_at(gradient_at)


CHANNEL_AXIS = {"alpha": "key", "erase": "key", "write": "value"}  # the gates a rule may learn per channel


def _channels(per_channel, allowed):
    per_channel = tuple(per_channel)
    if any(g not in allowed for g in per_channel):
        raise ValueError(f"per_channel: expected gates among {', '.join(allowed)}, got {list(per_channel)!r}")
    return per_channel


class KDA(Online):
    """Kimi Delta Attention: W_t = W_{t−1} Diag(α_t) − η_t ∇ℓ(W_{t−1} Diag(α_t)): α per key channel (D of them per
    head), the gradient at the retained weights (chunk 1). per_channel=() is Gated DeltaNet's per-head α."""

    def __init__(self, gradient_at: str = "retained", per_channel: tuple = ("alpha",)):
        super().__init__(gradient_at)
        self.per_channel = _channels(per_channel, ("alpha",))


class GDN2(Online):
    """Gated DeltaNet-2: W_t = P_t − η_t ∇ℓ(P_t Diag(e_t); k_t, w_t ⊙ v_t), P_t = W_{t−1} Diag(α_t) — an erase gate e_t
    where the gradient is taken (chunk 1) and a write gate w_t on the value. erase, write: "learned" or a constant
    (1: none); per_channel: the gates learned per channel (α and e per key channel, w per value channel)."""

    def __init__(self, erase: Any = "learned", write: Any = "learned", gradient_at: str = "retained",
                 per_channel: tuple = ("alpha", "erase", "write")):
        super().__init__(gradient_at)
        self.erase, self.write = erase, write
        self.per_channel = _channels(per_channel, tuple(CHANNEL_AXIS))

    def gates(self, config, optimizer):
        return {**super().gates(config, optimizer),
                "erase": GateSpec("e", self.erase, 0.5, _non_negative, ">= 0", self._axis("erase"), per_step=True,
                                  neutral=1.0),
                "write": GateSpec("w", self.write, 0.5, _non_negative, ">= 0", self._axis("write"), per_step=True,
                                  neutral=1.0)}

    @property
    def needs_chunk_one(self):
        return super().needs_chunk_one or self.erase != 1.0

    @property
    def evaluation_point(self):
        return "W_{t−1} Diag(α_t ⊙ e_t)" if self.gradient_at == "retained" else "W̃ Diag(e_t)"

    def scaled(self, acts):
        return super().scaled(acts) or acts["erase"]

    def point(self, steps):
        if not steps.acts["erase"]:
            return super().point(steps)
        return _times(steps.gates["alpha"], steps.gates["erase"]) if self.gradient_at == "retained" \
            else steps.gates["erase"]

    def act(self, steps):
        if not steps.acts["write"]:
            return steps
        w = steps.gates["write"]  # the value each token writes: w_t ⊙ v_t
        return replace(steps, v=steps.v * (w if w.dim() == 3 else w.unsqueeze(-1)))

    def equation(self, W, S, x, loop):
        """W_t = P_t − η_t Σ_i γ_i ∇ℓ(P̃ Diag(e_t); φ(k_i), w_i ⊙ v_i), P_t = W_{t−1} Diag(α_t) (the optimizer's step
        with α_t), P̃ = P_t (retained) or the chunk's start W̃."""
        alpha, erase, write = x.gates["alpha"], x.gates["erase"], x.gates["write"]
        at = scaled(W, alpha) if self.gradient_at == "retained" else loop.start
        g = loop.window(scaled(at, erase), x, (write if write.dim() == 2 else write.unsqueeze(-1)) * x.v,
                        x.gates["gamma"])
        return loop.step(W, S, g, alpha, x.gates["eta"], x.gates["theta"])


class DeltaProduct(Online):
    """Gated DeltaProduct: n_h = householder_steps delta-rule steps per token, W_{t,0} = α_t W_{t−1}, W_{t,j} =
    W_{t,j−1} − η_{t,j} ∇ℓ(W_{t,j−1}; k_{t,j}, v_{t,j}) (chunk 1): k, v, η and γ have n_h rows per token, q, α and θ
    one (α, θ act at the first step); read token reads after the last step, read chunk before the first."""

    def __init__(self, householder_steps: int = 2, gradient_at: str = "retained"):
        super().__init__(gradient_at)
        if not isinstance(householder_steps, int) or isinstance(householder_steps, bool) or householder_steps < 1:
            raise ValueError(f"householder_steps: expected an int >= 1, got {householder_steps!r}")
        self.steps_per_token = householder_steps

    def equation(self, W, S, x, loop):
        """Step j of token t: W_{t,j} = W_{t,j−1} − η_{t,j} ∇ℓ(·; k_{t,j}, v_{t,j}), α_t and θ_t at j = 0 only."""
        ones = torch.ones_like(x.gates["alpha"])
        alpha, theta = (x.gates[g] if x.first else ones for g in ("alpha", "theta"))
        at = scaled(W, alpha) if self.gradient_at == "retained" else loop.start
        g = loop.window(at, x, x.v, x.gates["gamma"])
        return loop.step(W, S, g, alpha, x.gates["eta"], theta)

    def describe(self):
        return f"n_h={self.steps_per_token}"


class ChunkCommit(Online):
    """The chunk-parallel rule of LaCT and TNT: a chunk's tokens take their gradients at the weights W̃ it started
    from (with read chunk: one commit per chunk); reset_every R (TNT's local memories, a multiple of chunk_size):
    the state returns to W_0 (a fresh optimiser state, an empty window) before tokens R, 2R, …, so the segments of
    R tokens are independent. per_matrix (LaCT's per-matrix learning rates, read chunk, window 1): γ one per weight
    matrix m, the chunk's gradient of m is Σ_t γ_t^(m) ∇_m ℓ_t(W̃)."""

    def __init__(self, reset_every: int | None = None, per_matrix: bool = False):
        super().__init__("state")
        if reset_every is not None and (not isinstance(reset_every, int) or isinstance(reset_every, bool)
                                        or reset_every < 1):
            raise ValueError(f"reset_every: expected null or an int >= 1, got {reset_every!r}")
        if not isinstance(per_matrix, bool):
            raise ValueError(f"per_matrix: expected true or false, got {per_matrix!r}")
        self.reset_every, self.per_matrix = reset_every, per_matrix

    def gates(self, config, optimizer):
        specs = super().gates(config, optimizer)
        if self.per_matrix:
            specs["gamma"] = replace(specs["gamma"], axis="matrix")
        return specs

    def check(self, config, optimizer, linear_map: bool, where: str) -> None:
        super().check(config, optimizer, linear_map, where)
        if self.per_matrix and (config.read != "chunk" or config.window != 1):
            raise ValueError(f"{where}.learning_rule.per_matrix: weights each matrix's gradients in the chunk's "
                             f"commit: needs read chunk and window 1 (got read={config.read!r}, window="
                             f"{config.window!r})")

    def describe(self):
        return "" if self.reset_every is None else f"R={self.reset_every}"


def _ints(xs, what):
    if (not isinstance(xs, (list, tuple)) or not xs
            or any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in xs)):
        raise ValueError(f"{what}: expected a non-empty list of ints >= 1, got {xs!r}")
    return tuple(xs)


class Levels(Online):
    """HOPE's continuum memory as one memory (Nested Learning, eqs. 70–71): weight matrix m (the memory's order:
    W1, W2, …) is updated only at the end of each chunk of C_m = ``chunks[m]`` tokens, with its tokens' gradients
    taken at the weights the chunk started from and its own learning rate r_m = ``rates[m]`` (default 1):

        W^(m) ← step(W^(m), Σ_{t∈chunk} γ_t ∇_m ℓ_t(W̃) / C_m; ∏ α_t, r_m Σ η_t, ∏ θ_t)    W̃: the weights now

    read chunk (every token reads the weights committed so far); chunk_size is the smallest C_m, every C_m a multiple
    of it that divides the largest (the period after which all levels have committed)."""

    reads = ("chunk",)

    def __init__(self, chunks: list, rates: list | None = None):
        super().__init__("state")
        self.chunks = _ints(chunks, "chunks")
        if rates is None:
            rates = [1.0] * len(self.chunks)
        if (not isinstance(rates, (list, tuple)) or len(rates) != len(self.chunks)
                or any(isinstance(r, bool) or not isinstance(r, (int, float)) or r <= 0 for r in rates)):
            raise ValueError(f"rates: expected {len(self.chunks)} numbers > 0 (one per chunk), got {rates!r}")
        self.rates = tuple(float(r) for r in rates)
        low, high = min(self.chunks), max(self.chunks)
        if any(c % low or high % c for c in self.chunks):
            raise ValueError(f"chunks: expected each a multiple of the smallest ({low}) dividing the largest "
                             f"({high}), got {list(self.chunks)!r}")

    def check(self, config, optimizer, linear_map: bool, where: str) -> None:
        super().check(config, optimizer, linear_map, where)
        if config.chunk_size != min(self.chunks):
            raise ValueError(f"{where}.chunk_size: {self!r} reads and accumulates a chunk of the smallest level at a "
                             f"time: expected {min(self.chunks)}, got {config.chunk_size}")
        matrices = list(config.components(where)[0].shapes(1, 1, 1))  # how many: not a function of the widths
        if len(matrices) != len(self.chunks):
            raise ValueError(f"{where}.learning_rule.chunks: expected one chunk per weight matrix of the memory "
                             f"({', '.join(matrices)}), got {list(self.chunks)!r}")

    def commits(self, names, chunk_size):  # one chunk per matrix: ``check`` holds the config to it
        return {n: (c, r) for n, c, r in zip(names, self.chunks, self.rates, strict=True)}

    def describe(self):
        return "C=" + "/".join(map(str, self.chunks))


class Longhorn(Online):
    """Longhorn (Liu et al., 2024, arXiv 2407.14207): each token's step is the implicit online-learning step

        W_t = argmin_W ‖W − W_{t−1}‖²_F + β_t ‖W φ(k_t) − v_t‖²  =  W_{t−1} (I − ε_t φ(k_t) φ(k_t)ᵀ) + ε_t v_t φ(k_t)ᵀ,
        ε_t = β_t / (1 + β_t ‖φ(k_t)‖²),   β_t = η_t γ_t

    the delta rule with η_t rescaled by the key it writes (``act``). Needs a linear memory, the l2 bias, gd, window 1
    and chunk 1 (the closed form is the exact step from W_{t−1})."""

    def check(self, config, optimizer, linear_map, where):
        super().check(config, optimizer, linear_map, where)
        mem, _, bias, _ = config.components(where)
        if not (delta_rule_applies(mem, bias, optimizer) and config.window == 1 and config.chunk_size == 1):
            raise ValueError(f"{where}.learning_rule: longhorn's implicit step is the closed form of a linear memory "
                             f"with the l2 bias and gd at window 1 and chunk_size 1 (got {config.architecture!r}, "
                             f"{bias!r}, {optimizer!r}, window={config.window!r}, chunk_size={config.chunk_size})")

    def act(self, steps):
        eta, gamma = steps.gates["eta"], steps.gates["gamma"]
        return replace(steps, gates={**steps.gates,
                                     "eta": eta / (1 + eta * gamma * steps.phi_k.square().sum(-1))})

    def equation(self, W, S, x, loop):
        """W_t = W_{t−1} (I − ε_t φ(k_t) φ(k_t)ᵀ) + ε_t v_t φ(k_t)ᵀ, ε_t = η_t γ_t / (1 + η_t γ_t ‖φ(k_t)‖²) (a
        retention α_t < 1, which Longhorn does not have, scales W_{t−1} as gd's does: α_t W_{t−1} − ε_t (…))."""
        beta = x.gates["eta"] * x.gates["gamma"]
        k = x.phi_k.unsqueeze(1)  # [N, 1, D]
        eps = (beta / (1 + beta * x.phi_k.square().sum(-1)))[:, None, None]
        W = W["W"]  # [N, d_v, D]
        return {"W": x.gates["alpha"][:, None, None] * W - eps * (W @ k.mT) @ k + eps * x.v.unsqueeze(-1) @ k}, S

    def describe(self):
        return "η/(1+ηγ‖k‖²)"


def _times(a, b):
    """a ⊙ b for two gates [N, T] or [N, T, C] (a per-head one broadcast over the other's channels)."""
    if a.dim() < b.dim():
        a = a.unsqueeze(-1)
    elif b.dim() < a.dim():
        b = b.unsqueeze(-1)
    return a * b


LEARNING_RULES = {"online": Online, "kda": KDA, "gdn2": GDN2, "deltaproduct": DeltaProduct,
                  "chunk_commit": ChunkCommit, "levels": Levels, "longhorn": Longhorn}
NAMES = {cls: name for name, cls in LEARNING_RULES.items()}


def build_learning_rule(spec, where: str = "learning_rule") -> LearningRule:
    """A learning rule from a short-hand ("kda"), a short-hand with options ({name: deltaproduct,
    householder_steps: 3}), a LearningRule or a class_path dict."""
    return build("learning_rule", LEARNING_RULES, spec, LearningRule, where)

