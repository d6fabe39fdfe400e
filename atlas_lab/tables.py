"""Tables a person can read at any width, in a terminal or a pipe: a cell is never cut.

When the columns do not fit the console (80 columns in a pipe, or ``COLUMNS``), they are spread over several
tables, one after the other, each repeating the row's name (the first ``keys`` columns). A column wider than the
console on its own wraps. Cells are plain text, never rich markup: labels and error messages may hold brackets.
"""
from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

# rich draws a column as its cells plus one space either side and one border line; a table adds one more border.
_COLUMN_OVERHEAD, _TABLE_OVERHEAD = 3, 1


def _width(cell: object) -> int:
    return max((len(line) for line in str(cell).splitlines()), default=0)


def column_groups(widths: Sequence[int], width: int, keys: int = 1) -> list[list[int]]:
    """The column indices of each table: the first ``keys`` in every one, the others in order, as many per table
    as fit ``width`` characters (at least one)."""
    key_width = _TABLE_OVERHEAD + sum(w + _COLUMN_OVERHEAD for w in widths[:keys])
    groups, current, used = [], [], key_width
    for i in range(keys, len(widths)):
        need = widths[i] + _COLUMN_OVERHEAD
        if current and used + need > width:
            groups.append(current)
            current, used = [], key_width
        current.append(i)
        used += need
    groups.append(current)
    return [list(range(keys)) + g for g in groups]


def print_table(console: Console, title: str, columns: Sequence[str], rows: Sequence[Sequence[object]],
                right: Sequence[str] = (), keys: int = 1, styles: Sequence[str | None] | None = None,
                caption: str | None = None) -> None:
    """Print ``rows`` (one cell per column; None shows as "—") under ``title``; the columns named in ``right`` are
    right-aligned; ``styles``: one rich style (or None) per row."""
    rows = [["—" if c is None else str(c) for c in r] for r in rows]
    widths = [max([_width(c)] + [_width(r[i]) for r in rows]) for i, c in enumerate(columns)]
    groups = column_groups(widths, console.width, keys)
    for n, group in enumerate(groups):
        part = f" ({n + 1}/{len(groups)})" if len(groups) > 1 else ""
        table = Table(title=Text(title + part), caption=Text(caption) if caption and n == len(groups) - 1 else None)
        for i in group:
            table.add_column(Text(columns[i]), justify="right" if columns[i] in right else "left", overflow="fold",
                             min_width=min(widths[i], console.width - _TABLE_OVERHEAD - _COLUMN_OVERHEAD))
        for k, r in enumerate(rows):
            table.add_row(*(Text(r[i]) for i in group), style=styles[k] if styles else None)
        console.print(table)
