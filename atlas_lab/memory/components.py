"""How a component is written (docs/components.md): a short-hand, a short-hand with options, a class_path, or an
object.

Every kind of component (memory architecture, feature map, attentional bias, memory optimizer) keeps a registry
{short-hand: class}. A component is given as

    a short-hand               "muon"                                  -> Muon()
    a short-hand with options  {"name": "muon", "ns_steps": 3}         -> Muon(ns_steps=3)
    a class_path               {"class_path": "pkg.mod.Adam", "init_args": {"beta2": 0.99}}   (LightningCLI's form)
    an object                  Muon(ns_steps=3)                        -> used as it is

A component owns its options: they are its ``__init__``'s keyword arguments, and one it does not take is an error
naming the key, the component and the options it does take; a value its annotation does not admit is an error naming
the key, the type and the value (``check_value``: the one checker of annotations, which the command's early checks
use too). The engine never asks a component for its name: it asks what the component provides (docs/components.md).
"""
from __future__ import annotations

import functools
import importlib
import inspect
from types import NoneType, UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict

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


def describe(kind) -> str:
    """A type annotation as a person writes it in YAML: ``Optional[int]`` -> int or null; ``bool`` -> true or false;
    ``Literal['a', 'b']`` -> 'a', 'b'; ``list[int]`` -> list[int]."""
    origin, args = get_origin(kind), get_args(kind)
    if kind is None or kind is NoneType:
        return "null"
    if kind is bool:
        return "true or false"
    if origin is Literal:
        return ", ".join(map(repr, args))
    if origin in (Union, UnionType):
        return " or ".join(dict.fromkeys(map(describe, args)))
    if is_typeddict(kind):
        return f"a mapping of {', '.join(kind.__annotations__)}"
    if origin is not None and args:
        return f"{origin.__name__}[{', '.join('...' if a is Ellipsis else describe(a) for a in args)}]"
    return getattr(kind, "__name__", str(kind))


def _number(value, kind) -> bool:
    """An int (not a bool) for int; an int or float for float, or a string of one (``1e-3``: YAML 1.1 reads it as a
    string, the CLI's parser as a number)."""
    if isinstance(value, bool):
        return False
    if kind is int:
        return isinstance(value, int)
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return False
        return True
    return isinstance(value, (int, float))


def conforms(value, kind) -> bool:
    """Whether a YAML value (a config file's, or ``yaml.safe_load`` of a command-line value) has type ``kind``: the
    builtins, None, Literal, Union, list, tuple, dict and TypedDict, as the CLI's parser takes them; a type of another
    kind (a class, a path) is the parser's to check, and conforms here."""
    origin, args = get_origin(kind), get_args(kind)
    if kind is Any or kind is object:
        return True
    if kind is None or kind is NoneType:
        return value is None
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (Union, UnionType):
        return any(conforms(value, a) for a in args)
    if kind in (int, float):
        return _number(value, kind)
    if kind in (bool, str):
        return isinstance(value, kind)
    if is_typeddict(kind):
        return isinstance(value, dict) and all(k in kind.__annotations__ and conforms(v, kind.__annotations__[k])
                                               for k, v in value.items())
    if kind in (list, tuple) or origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(map(conforms, value, args))
        return not args or all(conforms(v, args[0]) for v in value)
    if kind is dict or origin is dict:
        return isinstance(value, dict) and (not args or all(conforms(k, args[0]) and conforms(v, args[1])
                                                            for k, v in value.items()))
    return True


def check_value(key: str, value, kind) -> None:
    """ValueError ``<key>: expected <kind>; got <value>`` unless ``value`` conforms to ``kind``."""
    if not conforms(value, kind):
        raise ValueError(f"{key}: expected {describe(kind)}; got {value}")


def as_annotated(value, kind):
    """A value that conforms to ``kind`` as the class takes it: a string of a number (``1e-3``) as a float where
    ``kind`` takes a float and no string; any other value as it is."""
    arms = get_args(kind) if get_origin(kind) in (Union, UnionType) else (kind,)
    if not isinstance(value, str) or float not in arms or any(conforms(value, a) for a in arms if a is not float):
        return value
    return float(value)


@functools.cache
def argument_types(cls) -> dict:
    """{argument: annotation} of ``cls.__init__``'s named arguments (not *args, **kwargs), as ``typing`` resolves
    them."""
    hints = get_type_hints(cls.__init__)
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {n: hints[n] for n, p in inspect.signature(cls.__init__).parameters.items()
            if n in hints and p.kind in named}


def import_class(path: str, where: str):
    """The object a dotted ``path`` names (``package.module.Name``); ValueError ``<where>: class_path … cannot be
    imported (why)`` where it cannot be imported."""
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"{where}: class_path {path!r} cannot be imported ({e})") from None


def _construct(cls, options: dict, label: str, where: str):
    """cls(**options); an option cls does not take, or whose value its annotation does not admit (``check_value``),
    is an error naming the key. Inside a compiled graph the options were checked where the config was built."""
    if not isinstance(options, dict):
        raise ValueError(f"{where}: the options of {label} must be a mapping; got {options!r}")
    takes = cls.options()
    for key in options:
        if key not in takes:
            raise ValueError(f"{where}.{key}: {label} does not take {key!r}; it takes "
                             f"{', '.join(takes) if takes else 'no options'}")
    if not torch.compiler.is_compiling():
        types = _option_types(cls, label, where)
        for key, value in options.items():
            if key in types:
                check_value(f"{where}.{key}", value, types[key])
        options = {key: as_annotated(value, types[key]) if key in types else value for key, value in options.items()}
    try:
        return cls(**options)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def _option_types(cls, label: str, where: str) -> dict:
    """``argument_types(cls)``; ValueError naming the component where its annotations do not resolve."""
    try:
        return argument_types(cls)
    except Exception as e:  # an annotation naming what its module does not define: get_type_hints' NameError, …
        raise ValueError(f"{where}: the annotations of {label}.__init__ cannot be resolved ({type(e).__name__}: "
                         f"{e}); its options are checked by them") from None


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
