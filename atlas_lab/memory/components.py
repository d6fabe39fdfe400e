"""How a component is written (docs/components.md): a short-hand, a short-hand with options, a class_path, or an
object.

Every kind of component (memory architecture, feature map, attentional bias, memory optimizer) keeps a registry
{short-hand: class}. A component is given as

    a short-hand               "muon"                                  -> Muon()
    a short-hand with options  {"name": "muon", "ns_steps": 3}         -> Muon(ns_steps=3)
    a class_path               {"class_path": "pkg.mod.Adam", "init_args": {"beta2": 0.99}}   (LightningCLI's form)
    an object                  Muon(ns_steps=3)                        -> used as it is

A component owns its options: they are its ``__init__``'s keyword arguments, and one it does not take is an error
naming the key, the component and the options it does take. The engine never asks a component for its name: it
asks what the component provides (docs/components.md).
"""
from __future__ import annotations

import importlib
import inspect

import torch


@torch.compiler.assume_constant_result  # a compiled block takes the answer as a constant (it cannot trace inspect)
def _options(cls) -> tuple[str, ...]:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


class Component:
    """Base of the built-in components: the options a component takes are its ``__init__``'s keyword arguments."""

    @classmethod
    def options(cls) -> tuple[str, ...]:
        """The option names this component takes (its __init__'s keyword arguments)."""
        return _options(cls)

    def __repr__(self) -> str:
        return type(self).__name__


def import_class(path: str, where: str):
    """The object a dotted ``path`` names (``package.module.Name``); ValueError ``<where>: class_path … cannot be
    imported (why)`` where it cannot be imported."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"{where}: class_path {path!r} cannot be imported ({e})") from None


def _construct(cls, options: dict, label: str, where: str):
    """cls(**options); an option cls does not take is an error naming the key, the component and what it takes."""
    if not isinstance(options, dict):
        raise ValueError(f"{where}: the options of {label} must be a mapping; got {options!r}")
    takes = cls.options()
    for key in options:
        if key not in takes:
            raise ValueError(f"{where}.{key}: {label} does not take {key!r}; it takes "
                             f"{', '.join(takes) if takes else 'no options'}")
    try:
        return cls(**options)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def build(kind: str, registry: dict, spec, base: type, where: str | None = None):
    """The component of ``kind`` that ``spec`` names: a short-hand, {"name": short-hand, **options}, a class_path
    dict or an instance of ``base``."""
    where = where or kind
    if isinstance(spec, base):
        return spec
    choices = f"{', '.join(registry)}, {{name: ..., <option>: ...}} or {{class_path: ..., init_args: {{...}}}}"
    if isinstance(spec, dict) and "name" in spec:
        name, options = spec["name"], {k: v for k, v in spec.items() if k != "name"}
    elif isinstance(spec, str):
        name, options = spec, {}
    elif isinstance(spec, dict) and "class_path" in spec:
        unknown = sorted(set(spec) - {"class_path", "init_args"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown} beside class_path; expected class_path and "
                             f"init_args")
        cls = import_class(spec["class_path"], where)
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise ValueError(f"{where}: class_path {spec['class_path']!r} is not a {base.__name__} subclass")
        return _construct(cls, spec.get("init_args") or {}, spec["class_path"], f"{where}.init_args")
    else:
        raise ValueError(f"{where}: expected {choices}, or a {base.__name__}; got {spec!r}")
    if name not in registry:
        raise ValueError(f"{where}: unknown {kind} {name!r}; valid choices: {choices}")
    return _construct(registry[name], options, name, where)


def declares(component, capability: str, over: str) -> bool:
    """Whether ``component`` provides ``capability`` (a closed form: a method or a flag its class defines) for the
    ``over`` it has (the method whose result the closed form reproduces: ``update``, ``loss``, ``forward``). The
    capability counts only where it is defined at or below the class that defines ``over``: a subclass that overrides
    ``update`` without declaring a closed form again runs its own ``update``, not its parent's closed form."""
    def owner(name):
        return next((cls for cls in type(component).__mro__ if name in vars(cls)), None)

    has, base = owner(capability), owner(over)
    return has is not None and base is not None and issubclass(has, base) and bool(getattr(component, capability))
