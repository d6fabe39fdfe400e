"""One memory configuration: the five components, the window, the gates and the chunking (docs/memory.md §0).

    MemoryConfig(architecture={"name": "mlp", "depth": 3}, feature_map="polynomial", attentional_bias="l2",
                 optimizer={"name": "muon", "ns_steps": 3}, window=8, eta="learned", eta_max=0.1, chunk_size=16)

A component is written as components.py says (a short-hand, a short-hand with its options, a class_path or an
object) and carries its own options; the other fields set the window, the gates and the chunking. ``replace`` also
takes a dotted key into a component (``optimizer.ns_steps=3``), the form the CLI and the sweeps write
(``--model.memory.optimizer.ns_steps=3``).
Every default is written here, once.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Literal, NamedTuple, Optional, Union

from .feature_maps import build_feature_map
from .components import declares
from .memories import build_memory
from .attentional_biases import build_attentional_bias
from .learning_rules import READS, build_learning_rule
from .optimizers import LinearOptimizer, build_optimizer

Gate = Union[float, Literal["learned", "head_decay"]]
# the five components: field -> its builder (registry, short-hands and options live with each kind)
COMPONENTS = {"architecture": build_memory, "feature_map": build_feature_map,
              "attentional_bias": build_attentional_bias, "optimizer": build_optimizer,
              "learning_rule": build_learning_rule}
# keys of the flat form of earlier versions -> the field that holds them now (renamed, or an option of a component)
MOVED = {"memory": "architecture", "objective": "attentional_bias", "depth": "architecture.depth",
         "expansion": "architecture.expansion", "activation": "architecture.activation",
         "residual": "architecture.residual", "output_norm": "architecture.output_norm",
         "degree": "feature_map.degree", "ns_steps": "optimizer.ns_steps",
         "ns_coefficients": "optimizer.ns_coefficients"}
# fields of earlier versions that a learning rule owns now -> how to write them
RULE_FIELDS = {"channel_gates": "learning_rule: kda (α per key channel) or {name: gdn2, per_channel: [alpha, erase, "
                                "write]}",
               "steps_per_token": "learning_rule: {name: deltaproduct, householder_steps: <n_h>}",
               "reset_every": "learning_rule: {name: chunk_commit, reset_every: <R>}",
               "gradient_at": "learning_rule: {name: online, gradient_at: retained} (kda, gdn2 and deltaproduct take "
                              "gradient_at too)",
               "erase": "learning_rule: {name: gdn2, erase: <gate>}",
               "write": "learning_rule: {name: gdn2, write: <gate>}"}


def with_option(spec, option: str, value, where: str):
    """A component spec with one option set: "muon" + ns_steps=3 -> {"name": "muon", "ns_steps": 3}. A class given by
    class_path takes ``init_args.<option>`` (LightningCLI's form) as well as ``<option>``; a mapping of options
    without a name keeps either, for ``MemoryConfig.replace`` to set on the component it has."""
    own = option.removeprefix("init_args.")
    if isinstance(spec, dict) and "class_path" in spec:
        return {**spec, "init_args": {**(spec.get("init_args") or {}), own: value}}
    if own != option and (isinstance(spec, str) or isinstance(spec, dict) and "name" in spec):
        name, field = spec if isinstance(spec, str) else spec["name"], where.rpartition(".")[2]
        raise ValueError(f"{where}.{option}: init_args holds the options of a class given by class_path, and the "
                         f"{field} is {name!r}; write {field}.{own}: {value} for an option of {name}, or {field}: "
                         f"{{class_path: ..., init_args: {{{own}: {value}}}}}")
    if isinstance(spec, str):
        return {"name": spec, option: value}
    if isinstance(spec, dict):
        return {**spec, option: value}
    raise ValueError(f"{where}.{option}: the component is given as an object ({spec!r}); set its options where it "
                     f"is built, or write it as {{name: ..., {option}: ...}}")


def moved_hint(key: str, value, where: str) -> str:
    """The one line that says how a key of the old flat form, or a field a learning rule owns now, is written now."""
    if key in RULE_FIELDS:
        return f"{where}.{key}: owned by the learning rule now; write {RULE_FIELDS[key]} (got {key}: {value!r})"
    new = MOVED[key]
    if "." not in new:
        return f"{where}.{key}: renamed; write {new}: {value}"
    component, option = new.split(".")
    return (f"{where}.{key}: an option of the {component} now; write {new}: {value}, or "
            f"{component}: {{name: <{component}>, {option}: {value}}}")


@dataclass
class MemoryConfig:
    """The memory of a memory layer (docs/memory.md).

    architecture, feature_map, attentional_bias, optimizer: four of the five components, each a short-hand of its kind's
        registry (MEMORIES, FEATURE_MAPS, ATTENTIONAL_BIASES, OPTIMIZERS), a short-hand with the options its class
        takes ({name: muon, ns_steps: 3}), a class_path or an object (docs/components.md lists the built-ins)
    window: Omega window c ≥ 1 (1: online), or None (every past token: global)
    alpha, eta, theta, gamma: retention, inner learning rate, momentum decay, window weight: "learned" (σ(w·x + b),
        one per head — per channel where the learning rule says so —, η scaled by eta_max) or a constant; alpha also
        "head_decay": RetNet's fixed α_h = 1 − 2^(−5−h)
    learning_rule: the fifth component (learning_rules.py): the rule's gates beyond α, η, θ, γ, where gradients are
        taken, steps per token, resets — "online" (default), "kda", {name: gdn2, erase: learned}, {name: deltaproduct,
        householder_steps: 3}, {name: chunk_commit, reset_every: 64}, or a class_path
    chunk_size: b, the tokens whose gradients share one evaluation point (part of the model)
    read: token (y_t reads the weights after token t: the exact rule) | start (a chunk's tokens read the weights it
        started from; the state follows the per-token rule: TNT's global memory) | chunk (a chunk's tokens read the
        weights it started from; one optimizer step per chunk — one Newton–Schulz per chunk for muon; docs/memory.md
        §4.1)
    normalize: normalised read-out (linear architecture + dot bias + gd or momentum)
    checkpoint: recompute each chunk in the backward instead of keeping its intermediates (memory for time)
    """

    architecture: Any = "mlp"
    feature_map: Any = "identity"
    attentional_bias: Any = "l2"
    optimizer: Any = "gd"
    learning_rule: Any = "online"
    window: Optional[int] = 1
    alpha: Gate = 1.0
    eta: Gate = 1.0
    theta: Gate = "learned"
    gamma: Gate = 1.0
    eta_max: float = 1.0
    chunk_size: int = 16
    read: Literal["token", "start", "chunk"] = "token"
    normalize: bool = False
    checkpoint: bool = False

    def components(self, where: str = "memory") -> tuple:
        """(memory, feature map, attentional bias, optimizer) objects of this config (the learning rule: ``rule``)."""
        return tuple(COMPONENTS[name](getattr(self, name), f"{where}.{name}")
                     for name in ("architecture", "feature_map", "attentional_bias", "optimizer"))

    def rule(self, where: str = "memory"):
        """The LearningRule object of this config."""
        return build_learning_rule(self.learning_rule, f"{where}.learning_rule")

    def resolve(self, where: str = "memory") -> "Resolved":
        """The config validated, its five components built once and its learning rule's gates: what ``memorize``
        and the plan read. Raises ValueError naming the key, the value and what is expected."""
        if self.read not in READS:
            raise ValueError(f"{where}.read: unknown value {self.read!r}; valid choices: {', '.join(READS)}")
        mem, fmap, bias, optimizer = self.components(where)
        rule = self.rule(where)
        config = dataclasses.replace(self, architecture=mem, feature_map=fmap, attentional_bias=bias,
                                     optimizer=optimizer, learning_rule=rule)
        specs = rule.gates(config, optimizer)
        for g, gate in specs.items():
            value = gate.value
            if value == "learned" or (g == "alpha" and value == "head_decay"):
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not gate.holds(value):
                name = g if g in ("alpha", "eta", "theta", "gamma") else f"learning_rule.{g}"
                raise ValueError(f"{where}.{name}: expected 'learned' or a constant {gate.expected}, got {value!r}")
        if isinstance(self.eta_max, bool) or not isinstance(self.eta_max, (int, float)) or self.eta_max <= 0:
            raise ValueError(f"{where}.eta_max: expected a number > 0 (the largest learned η), got {self.eta_max!r}")
        if self.window is not None and (not isinstance(self.window, int) or isinstance(self.window, bool)
                                        or self.window < 1):
            raise ValueError(f"{where}.window: expected an int >= 1 or null (global), got {self.window!r}")
        if not isinstance(self.chunk_size, int) or isinstance(self.chunk_size, bool) or self.chunk_size < 1:
            raise ValueError(f"{where}.chunk_size: expected an int >= 1, got {self.chunk_size!r}")
        for key in ("normalize", "checkpoint"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{where}.{key}: expected true or false, got {getattr(self, key)!r}")
        rule.check(config, optimizer, linear_map(mem), where)
        if self.normalize and not normalize_applies(mem, bias, optimizer):
            raise ValueError(f"{where}.normalize: needs architecture linear, attentional_bias dot and optimizer gd "
                             f"or momentum (got {mem!r}, {bias!r}, {optimizer!r}); set it to false")
        return Resolved(config, mem, fmap, bias, optimizer, rule, specs)

    def validate(self, where: str = "memory") -> "MemoryConfig":
        """This config, after ``resolve``'s checks (ValueError naming the key, the value and what is expected)."""
        self.resolve(where)
        return self

    def replace(self, where: str = "memory", **changes) -> "MemoryConfig":
        """A validated copy with fields changed (``changed``, then ``validate``)."""
        return self.changed(where, **changes).validate(where)

    def changed(self, where: str = "memory", **changes) -> "MemoryConfig":
        """A copy with fields changed, in order, not yet validated (``resolve`` validates it); ``component.option``
        keys, and a component given as a mapping of options without ``name`` (``optimizer: {ns_steps: 3}``), set
        options of the component it has.
        An unknown field is an error listing the valid ones; a key of the old flat form says how to write it now."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in changes.items():
            field, _, option = key.partition(".")
            if field not in values:
                if (field in MOVED or field in RULE_FIELDS) and not option:
                    raise ValueError(moved_hint(field, value, where))
                raise ValueError(f"{where}.{field}: unknown field; valid fields: {', '.join(values)}")
            named = isinstance(value, dict) and bool({"name", "class_path"} & set(value))
            if field in COMPONENTS and not option and isinstance(value, dict) and not named:
                for name, option_value in value.items():  # options without a name: of the component it has
                    values[field] = with_option(values[field], name, option_value, f"{where}.{field}")
            elif not option:
                values[field] = value
            elif field in COMPONENTS:
                values[field] = with_option(values[field], option, value, f"{where}.{field}")
            else:
                raise ValueError(f"{where}.{key}: {field} has no options; the components that do are "
                                 f"{', '.join(COMPONENTS)}")
        return MemoryConfig(**values)


class Resolved(NamedTuple):
    """A validated config with its components built once (``MemoryConfig.resolve``): config (its five components as
    objects), mem, feature_map, bias, optimizer, rule (the learning rule) and specs (the rule's gates,
    {name: GateSpec})."""

    config: MemoryConfig
    mem: Any
    feature_map: Any
    bias: Any
    optimizer: Any
    rule: Any
    specs: dict


def linear_map(mem) -> bool:
    """The memory declares itself the linear map y = W φ(k) (``linear_map``: the linear architecture)."""
    return declares(mem, "linear_map", "forward")


def normalize_applies(mem, bias, optimizer) -> bool:
    """normalize=True: a linear memory, a bias whose gradient does not depend on the weights (dot) and an optimiser
    linear in the gradients with its closed form (gd, momentum)."""
    return (linear_map(mem) and declares(bias, "weight_free_gradient", "loss")
            and isinstance(optimizer, LinearOptimizer) and declares(optimizer, "chunk_coefficients", "update"))
