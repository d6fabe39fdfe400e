"""Names of a package imported from their modules when first used (PEP 562), so that importing the package loads
nothing heavy: ``atlas-lab data``, ``eval`` and ``sweep`` check their arguments before torch, Lightning, litdata,
Optuna or MLflow are imported."""
from __future__ import annotations

import sys
from importlib import import_module


def lazy_exports(package: str, homes: dict[str, str]):
    """(``__getattr__``, ``__dir__``) for ``package``, whose name ``n`` lives in its module ``homes[n]``; a name is
    imported once, then kept in the package's namespace."""

    def __getattr__(name: str):
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{homes[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted([*vars(sys.modules[package]), *homes])

    return __getattr__, __dir__
