"""How a component is named (docs/components.md): a registered short-hand, an object, or a class_path.

Every kind of component (memory architecture, feature map, objective, memory optimizer) keeps a registry
{short-hand: class}. A component is given as

    a short-hand   "muon"                      -> the registered class, built from the call's options
                                                  (``from_options``: each class takes the options it has)
    an object      Muon(ns_steps=3)            -> used as it is
    a class_path   {"class_path": "pkg.mod.Adam", "init_args": {"beta2": 0.99}}   (LightningCLI's convention)

The engine never asks a component for its name: it asks what the component provides (docs/components.md).
"""
from __future__ import annotations

import importlib
import inspect


class Component:
    """Base of the built-in components: ``from_options`` builds one from the options it takes."""

    @classmethod
    def from_options(cls, **options):
        """An instance from the options its __init__ names (the others are some other component's)."""
        params = inspect.signature(cls.__init__).parameters
        return cls(**{k: v for k, v in options.items() if k in params and v is not None})

    def __repr__(self) -> str:
        return type(self).__name__


def _import(path: str, where: str):
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"{where}: class_path {path!r} cannot be imported ({e})") from None


def build(kind: str, registry: dict, spec, base: type, options: dict | None = None, where: str | None = None):
    """The component of ``kind`` that ``spec`` names (a short-hand, an instance of ``base`` or a class_path dict).

    options: keyword options of the built-ins (e.g. ns_steps, degree), given to a short-hand's ``from_options``."""
    where = where or kind
    if isinstance(spec, base):
        return spec
    if isinstance(spec, str):
        if spec not in registry:
            raise ValueError(f"{where}: unknown value {spec!r}; valid choices: {', '.join(registry)}, or a "
                             f"class_path to a {base.__name__} subclass")
        try:
            return registry[spec].from_options(**(options or {}))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
    if isinstance(spec, dict) and "class_path" in spec:
        unknown = sorted(set(spec) - {"class_path", "init_args"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown} beside class_path; expected class_path and "
                             f"init_args")
        cls = _import(spec["class_path"], where)
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise ValueError(f"{where}: class_path {spec['class_path']!r} is not a {base.__name__} subclass")
        try:
            return cls(**(spec.get("init_args") or {}))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {spec['class_path']}(**init_args): {e}") from None
    raise ValueError(f"{where}: expected one of {', '.join(registry)}, a {base.__name__} or "
                     f"{{class_path: ..., init_args: {{...}}}}; got {spec!r}")
