"""The argument checks of the data modules and the corpus tools, importable without torch or Lightning: the atlas-lab
command checks a corpus's arguments and files before it imports them (``atlas-lab data``, ``atlas-lab eval``)."""
from __future__ import annotations


def check(condition: bool, name: str, message: str) -> None:
    """Raise ValueError('name: message') unless condition holds."""
    if not condition:
        raise ValueError(f"{name}: {message}")


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; expected one of: {', '.join(map(str, choices))}")


def first_line(e: Exception) -> str:
    """An exception's message as one line (its first), or its type's name where it has none."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
