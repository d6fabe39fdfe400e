"""One memory configuration: the four components, the window, the gates and the chunking (docs/memory.md §0).

    MemoryConfig(architecture={"name": "mlp", "depth": 3}, feature_map="polynomial", attentional_bias="l2",
                 optimizer={"name": "muon", "ns_steps": 3}, window=8, eta="learned", eta_max=0.1, chunk_size=16)

A component is written as components.py says (a short-hand, a short-hand with its options, a class_path or an
object) and carries its own options; the other fields belong to the rule. ``replace`` also takes a dotted key into
a component (``optimizer.ns_steps=3``), the form the CLI and the sweeps write (``--model.memory.optimizer.ns_steps=3``).
Every default is written here, once.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal, Optional, Union

from .feature_maps import build_feature_map
from .memories import LinearMemory, build_memory
from .attentional_biases import Dot, build_attentional_bias
from .optimizers import LinearRule, build_optimizer

Gate = Union[float, Literal["learned", "head_decay"]]
GATES = ("alpha", "eta", "theta", "gamma", "erase", "write")
# the gates that may be learned per channel (``channel_gates``: one σ per head and channel instead of one per head),
# with their axis: a key-axis gate scales the columns of the linear memory's W (α: W Diag(α_t), KDA's decay; the
# erase gate: the weights W Diag(e_t) a gradient is taken at), a value-axis gate the value (write: w_t ⊙ v_t)
CHANNEL_GATES = {"alpha": "key", "erase": "key", "write": "value"}
# with n_h steps per token (``steps_per_token``, DeltaProduct), the gates of one write, given per step: η, γ, erase
# and write, like k and v; the decays α and θ are per token, like q, and act at its first step
STEP_GATES = ("eta", "gamma", "erase", "write")
# initial value of each learned gate's sigmoid (α ≈ 0.999: almost no forgetting; θ ≈ 0.9: Titans/Muon momentum)
GATE_INIT = {"alpha": 0.999, "eta": 0.5, "theta": 0.9, "gamma": 0.9, "erase": 0.5, "write": 0.5}
# the values a constant gate may take: retention and momentum decay are fractions (θ = 1 never forgets a step)
GATE_RANGES = {"alpha": (lambda x: 0 <= x <= 1, "in [0, 1]"), "eta": (lambda x: x >= 0, ">= 0"),
               "theta": (lambda x: 0 <= x < 1, "in [0, 1)"), "gamma": (lambda x: x >= 0, ">= 0"),
               "erase": (lambda x: x >= 0, ">= 0"), "write": (lambda x: x >= 0, ">= 0")}
# the four components: field -> its builder (registry, short-hands and options live with each kind)
COMPONENTS = {"architecture": build_memory, "feature_map": build_feature_map,
              "attentional_bias": build_attentional_bias, "optimizer": build_optimizer}
# keys of the flat form of earlier versions -> the field that holds them now (renamed, or an option of a component)
MOVED = {"memory": "architecture", "objective": "attentional_bias", "depth": "architecture.depth",
         "expansion": "architecture.expansion", "activation": "architecture.activation",
         "residual": "architecture.residual", "output_norm": "architecture.output_norm",
         "degree": "feature_map.degree", "ns_steps": "optimizer.ns_steps",
         "ns_coefficients": "optimizer.ns_coefficients"}


def with_option(spec, option: str, value, where: str):
    """A component spec with one option set: "muon" + ns_steps=3 -> {"name": "muon", "ns_steps": 3}."""
    if isinstance(spec, str):
        return {"name": spec, option: value}
    if isinstance(spec, dict) and "name" in spec:
        return {**spec, option: value}
    if isinstance(spec, dict) and "class_path" in spec:
        return {**spec, "init_args": {**(spec.get("init_args") or {}), option: value}}
    raise ValueError(f"{where}.{option}: the component is given as an object ({spec!r}); set its options where it "
                     f"is built, or write it as {{name: ..., {option}: ...}}")


def moved_hint(key: str, value, where: str) -> str:
    """The one line that says how a key of the old flat form is written now."""
    new = MOVED[key]
    if "." not in new:
        return f"{where}.{key}: renamed; write {new}: {value}"
    component, option = new.split(".")
    return (f"{where}.{key}: an option of the {component} now; write {new}: {value}, or "
            f"{component}: {{name: <{component}>, {option}: {value}}}")


@dataclass
class MemoryConfig:
    """The memory of a memory layer (docs/memory.md).

    architecture, feature_map, attentional_bias, optimizer: the four components, each a short-hand of its kind's
        registry (MEMORIES, FEATURE_MAPS, ATTENTIONAL_BIASES, OPTIMIZERS), a short-hand with the options its class
        takes ({name: muon, ns_steps: 3}), a class_path or an object (docs/components.md lists the built-ins)
    window: Omega window c ≥ 1 (1: online), or None (every past token: global)
    alpha, eta, theta, gamma: retention, inner learning rate, momentum decay, window weight: "learned" (σ(w·x + b),
        one per head, η scaled by eta_max) or a constant; alpha also "head_decay": RetNet's fixed α_h = 1 − 2^(−5−h)
    erase, write: Gated DeltaNet-2's gates, 1 (none) by default: the gradient of token t is taken at the weights
        W̃ Diag(e_t) (chunk_size 1), and its value is w_t ⊙ v_t
    channel_gates: the learned gates learned per channel instead of per head: ["alpha"] is one α per head and key
        channel (D of them; W_t = W_{t−1} Diag(α_t) − …: KDA), "erase" per key channel, "write" per value channel;
        for the linear architecture; the closed in-chunk forms take one gate per head, so chunks > 1 then run the
        rule token by token
    steps_per_token: n_h, the rule's steps per token (Gated DeltaProduct, arXiv 2502.10297): k, v and the gates of
        STEP_GATES have n_h rows per token, q, α and θ one; α and θ act at a token's first step (1 at the others);
        read token reads after its last step, read chunk before its first; needs chunk_size 1 (a window counts steps)
    chunk_size: b, the tokens whose gradients share one evaluation point (part of the model)
    reset_every: R, a multiple of chunk_size, or None (never): the state returns to its initial weights W_0 (a fresh
        optimiser state, an empty window) before tokens R, 2R, … of the stream (TNT's local memories, arXiv 2511.07343)
    gradient_at: state (g_t at W̃, the state before the chunk: the Titans form) | retained (chunk_size 1: g_t at the
        retained weights α_t ⊙ W_{t−1}, so W_t = α_t ⊙ W_{t−1} − η_t g_t is decay first, then the step: the form of
        the gated delta rules of KDA, Gated DeltaNet's paper and fla; docs/memory.md §3)
    read: token (y_t reads the weights after token t: the exact rule) | chunk (a chunk's tokens read the weights it
        started from; one optimizer step per chunk — one Newton–Schulz per chunk for muon; docs/memory.md §4.1)
    normalize: normalised read-out (linear architecture + dot bias + gd or momentum)
    checkpoint: recompute each chunk in the backward instead of keeping its intermediates (memory for time)
    """

    architecture: Any = "mlp"
    feature_map: Any = "identity"
    attentional_bias: Any = "l2"
    optimizer: Any = "gd"
    window: Optional[int] = 1
    alpha: Gate = 1.0
    eta: Gate = 1.0
    theta: Gate = "learned"
    gamma: Gate = 1.0
    erase: Gate = 1.0
    write: Gate = 1.0
    eta_max: float = 1.0
    channel_gates: tuple[str, ...] = ()
    steps_per_token: int = 1
    chunk_size: int = 16
    reset_every: Optional[int] = None
    gradient_at: Literal["state", "retained"] = "state"
    read: Literal["token", "chunk"] = "token"
    normalize: bool = False
    checkpoint: bool = False

    def components(self, where: str = "memory") -> tuple:
        """(memory, feature map, attentional bias, optimizer) objects of this config."""
        return tuple(build(getattr(self, name), f"{where}.{name}") for name, build in COMPONENTS.items())

    def validate(self, where: str = "memory") -> "MemoryConfig":
        """Raise ValueError naming the key, the value and what is expected."""
        from .op import PATHS  # the reads, each with the functions that compute it (op.py imports this module)
        if self.read not in PATHS:
            raise ValueError(f"{where}.read: unknown value {self.read!r}; valid choices: {', '.join(PATHS)}")
        for g in GATES:
            value, (holds, expected) = getattr(self, g), GATE_RANGES[g]
            if value == "learned" or (g == "alpha" and value == "head_decay"):
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not holds(value):
                raise ValueError(f"{where}.{g}: expected 'learned' or a constant {expected}, got {value!r}")
        if isinstance(self.eta_max, bool) or not isinstance(self.eta_max, (int, float)) or self.eta_max <= 0:
            raise ValueError(f"{where}.eta_max: expected a number > 0 (the largest learned η), got {self.eta_max!r}")
        if self.window is not None and (not isinstance(self.window, int) or isinstance(self.window, bool)
                                        or self.window < 1):
            raise ValueError(f"{where}.window: expected an int >= 1 or null (global), got {self.window!r}")
        if not isinstance(self.chunk_size, int) or isinstance(self.chunk_size, bool) or self.chunk_size < 1:
            raise ValueError(f"{where}.chunk_size: expected an int >= 1, got {self.chunk_size!r}")
        if self.reset_every is not None and (not isinstance(self.reset_every, int) or isinstance(self.reset_every, bool)
                                             or self.reset_every < 1 or self.reset_every % self.chunk_size):
            raise ValueError(f"{where}.reset_every: expected null or a multiple of chunk_size={self.chunk_size} (a "
                             f"reset falls on a chunk boundary), got {self.reset_every!r}")
        if (not isinstance(self.steps_per_token, int) or isinstance(self.steps_per_token, bool)
                or self.steps_per_token < 1):
            raise ValueError(f"{where}.steps_per_token: expected an int >= 1, got {self.steps_per_token!r}")
        if self.steps_per_token > 1 and self.chunk_size != 1:
            raise ValueError(f"{where}.steps_per_token: {self.steps_per_token} steps per token take each step at the "
                             f"weights the one before left: they need chunk_size 1 (got {self.chunk_size})")
        for key in ("normalize", "checkpoint"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{where}.{key}: expected true or false, got {getattr(self, key)!r}")
        if self.gradient_at not in ("state", "retained"):
            raise ValueError(f"{where}.gradient_at: unknown value {self.gradient_at!r}; valid choices: state, retained")
        if self.gradient_at == "retained" and self.chunk_size != 1:
            raise ValueError(f"{where}.gradient_at: 'retained' takes each token's gradient at its own retained "
                             f"weights: it needs chunk_size 1 (got {self.chunk_size})")
        if self.erase != 1.0 and self.chunk_size != 1:
            raise ValueError(f"{where}.erase: an erase gate takes each token's gradient at its own weights "
                             f"W̃ Diag(e_t): it needs chunk_size 1 (got {self.chunk_size})")
        if not isinstance(self.channel_gates, (list, tuple)) or any(
                g not in CHANNEL_GATES or getattr(self, g) != "learned" for g in self.channel_gates):
            raise ValueError(f"{where}.channel_gates: expected a list of learned gates among "
                             f"{', '.join(CHANNEL_GATES)} (got {self.channel_gates!r})")
        mem, _, bias, optimizer = self.components(where)
        if self.channel_gates and not isinstance(mem, LinearMemory):
            raise ValueError(f"{where}.channel_gates: a gate per channel scales the columns of a linear memory's W; "
                             f"needs architecture linear (got {mem!r})")
        if self.normalize and not normalize_applies(mem, bias, optimizer):
            raise ValueError(f"{where}.normalize: needs architecture linear, attentional_bias dot and optimizer gd "
                             f"or momentum (got {mem!r}, {bias!r}, {optimizer!r}); set it to false")
        return self

    def replace(self, where: str = "memory", **changes) -> "MemoryConfig":
        """A validated copy with fields changed, in order; ``component.option`` keys set one option of a component.
        An unknown field is an error listing the valid ones; a key of the old flat form says how to write it now."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in changes.items():
            field, _, option = key.partition(".")
            if field not in values:
                if field in MOVED and not option:
                    raise ValueError(moved_hint(field, value, where))
                raise ValueError(f"{where}.{field}: unknown field; valid fields: {', '.join(values)}")
            if not option:
                values[field] = value
            elif field in COMPONENTS:
                values[field] = with_option(values[field], option, value, f"{where}.{field}")
            else:
                raise ValueError(f"{where}.{key}: {field} has no options; the components that do are "
                                 f"{', '.join(COMPONENTS)}")
        return MemoryConfig(**values).validate(where)


def normalize_applies(mem, bias, optimizer) -> bool:
    """normalize=True: a linear memory, the dot bias and a rule linear in the gradients (gd, momentum)."""
    return isinstance(mem, LinearMemory) and isinstance(bias, Dot) and isinstance(optimizer, LinearRule)
