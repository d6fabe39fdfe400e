"""Tables a person can read at any width, in a terminal or a pipe: no cell, header or title is ever cut.

The width is the console's: the terminal's, ``COLUMNS``, or 80 in a pipe. A table that fits is printed as it is.
One that does not first wraps its headers at their spaces and, in a column whose widest cell alone stands out, that
cell; then its columns are spread over several tables, one after the other, in order, each repeating the row's name
(the first ``keys`` columns) and saying which part it is ("(2/3)"); a table with room left unwraps its columns
again. Cells wrap at word boundaries: spaces, or inside a long word after one of ``, ; + / |`` not followed by a
digit (4,265,548 and (2/6) stay whole); only a word wider than its whole column, which a very narrow console
meets, is split. A title or caption wider than its table is a paragraph of its own at the console's width. Cells
are plain text, never rich markup: labels and error messages may hold brackets.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

# rich draws a column as its cells plus one space either side and one border line; a table adds one more border.
_COLUMN_OVERHEAD, _TABLE_OVERHEAD = 3, 1
# where a word longer than its column may break: after these characters, unless a digit follows (4,265,548 and
# "(2/6)" stay whole; so does a name like gated_deltanet)
_BREAK_AFTER = re.compile(r"(?<=[,;+/|])(?!\d)")
# a column whose widest cell would not fit beside the others wraps it, to the width of its next widest cell but not
# narrower than this
_OUTLIER = 20


def _width(cell: object) -> int:
    return max((cell_len(line) for line in str(cell).splitlines()), default=0)


def _pieces(word: str, inside: bool = True) -> list[str]:
    return [p for p in _BREAK_AFTER.split(word) if p] if inside else [word]


def _min_width(cell: str, inside: bool = True) -> int:
    """The narrowest column ``cell`` wraps into without splitting a piece of a word."""
    return max((cell_len(p) for word in cell.split() for p in _pieces(word, inside)), default=0)


def _split(piece: str, width: int) -> list[str]:
    """A piece wider than ``width`` in chunks of at most ``width`` cells (the last resort)."""
    out, current = [], ""
    for ch in piece:
        if current and cell_len(current + ch) > width:
            out.append(current)
            current = ""
        current += ch
    return out + [current]


def wrap(text: str, width: int, inside: bool = True) -> list[str]:
    """``text`` as lines of at most ``width`` cells, broken at spaces, else (``inside``) after ``, ; + / |`` inside
    a word (not before a digit), and only a piece wider than ``width`` split; every character but the spaces at the
    breaks is kept, in order."""
    width = max(width, 1)
    lines: list[str] = []
    for paragraph in str(text).splitlines() or [""]:
        if cell_len(paragraph) <= width:
            lines.append(paragraph)
            continue
        current = ""
        for word in paragraph.split():
            for k, piece in enumerate(_pieces(word, inside)):
                joined = current + (" " if current and k == 0 else "") + piece
                if cell_len(joined) <= width:
                    current = joined
                    continue
                if current:
                    lines.append(current)
                chunks = _split(piece, width)
                lines += chunks[:-1]
                current = chunks[-1]
        lines.append(current)
    return lines


def column_widths(widths: Sequence[int], minimums: Sequence[int], width: int, keys: int = 1) -> list[int]:
    """Each column's width in a console ``width`` cells wide: its natural width (``widths``), or narrower (it wraps)
    where it could not otherwise fit one table beside the first ``keys`` columns. The key columns keep at most
    half the table between them (down to ``minimums``, their longest word) so that another column fits beside
    them."""
    out = list(widths)
    room = width - _TABLE_OVERHEAD
    others = _COLUMN_OVERHEAD + 1 if len(widths) > keys else 0  # the least another column needs beside the keys

    def shrink(target: int, floor: Sequence[int]) -> None:
        while sum(w + _COLUMN_OVERHEAD for w in out[:keys]) > target:
            i = max(range(keys), key=lambda j: out[j] - floor[j])  # the key column with the most to give
            if out[i] <= floor[i]:
                return
            out[i] -= 1

    shrink(room // 2, minimums)  # wrap at word boundaries down to half the table
    shrink(room - others, [1] * keys)  # a console too narrow for the keys' longest words: split them
    cap = max(1, room - sum(w + _COLUMN_OVERHEAD for w in out[:keys]) - _COLUMN_OVERHEAD)
    return out[:keys] + [min(w, cap) for w in out[keys:]]


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


def _annotation(console: Console, text: str, table_width: int) -> Text | None:
    """A title or caption that fits on one line above (below) the table, as rich's centred annotation; None where
    it does not (``print_table`` prints it as a paragraph at the console's width instead)."""
    return Text(text) if cell_len(text) <= table_width else None


def _paragraph(console: Console, text: str, style: str) -> None:
    console.print(Text("\n".join(wrap(text, console.width)), style=style))


def print_table(console: Console, title: str, columns: Sequence[str], rows: Sequence[Sequence[object]],
                right: Sequence[str] = (), keys: int = 1, styles: Sequence[str | None] | None = None,
                caption: str | None = None) -> None:
    """Print ``rows`` (one cell per column; None shows as "—") under ``title``; the columns named in ``right`` are
    right-aligned; ``styles``: one rich style (or None) per row. Columns that do not fit ``console.width`` go to
    further tables, each repeating the first ``keys`` columns (their headers wrapped at word boundaries where that
    makes room); nothing is cut (see the module's docstring). A title or caption wider than its table is a
    paragraph of its own, wrapped at the console's width."""
    rows = [["—" if c is None else str(c) for c in r] for r in rows]
    columns = [str(c) for c in columns]
    keys = min(keys, len(columns))
    width = console.width
    body = [max([0] + [_width(r[i]) for r in rows]) for i in range(len(columns))]
    full = [max(_width(c), b) for c, b in zip(columns, body)]
    # a header wraps at its spaces only ("memory FLOPs/token" keeps FLOPs/token whole), a cell inside words too
    minimums = [max([_min_width(c, inside=False)] + [_min_width(r[i]) for r in rows]) for i, c in enumerate(columns)]
    if _TABLE_OVERHEAD + sum(w + _COLUMN_OVERHEAD for w in full) <= width:
        layout = [(list(range(len(columns))), full)]
    else:  # headers wrap at their words, a column's widest cell wraps (to its next widest, or _OUTLIER): they spread
        second = [sorted([0, 0] + [_width(r[i]) for r in rows])[-2] for i in range(len(columns))]
        compact = [max(b if i < keys else min(b, max(second[i], _OUTLIER)), minimums[i]) for i, b in enumerate(body)]
        widths = column_widths(compact, minimums, width, keys)
        layout = []
        for group in column_groups(widths, width, keys):
            mine = list(widths)
            spare = width - _TABLE_OVERHEAD - sum(mine[i] + _COLUMN_OVERHEAD for i in group)
            for i in sorted(group[keys:], key=lambda j: full[j] - mine[j]):  # room left unwraps whole columns
                if 0 < full[i] - mine[i] <= spare:
                    spare -= full[i] - mine[i]
                    mine[i] = full[i]
            for i in group[keys:]:  # and what is left widens a column whose cells wrap (fewer lines)
                grow = min(max(0, body[i] - mine[i]), spare)
                mine[i] += grow
                spare -= grow
            layout.append((group, mine))
    for n, (group, widths) in enumerate(layout):
        table_width = _TABLE_OVERHEAD + sum(widths[i] + _COLUMN_OVERHEAD for i in group)
        heading = title + (f" ({n + 1}/{len(layout)})" if len(layout) > 1 else "")
        ending = caption if caption and n == len(layout) - 1 else None
        table = Table(title=_annotation(console, heading, table_width),
                      caption=_annotation(console, ending, table_width) if ending else None)
        if table.title is None:
            _paragraph(console, heading, "table.title")
        for i in group:
            # the cells come wrapped to the column's width: rich only lays them out ("fold" never drops a character)
            table.add_column(Text("\n".join(wrap(columns[i], widths[i], inside=False))), width=widths[i],
                             overflow="fold",
                             justify="right" if columns[i] in right else "left")
        for k, r in enumerate(rows):
            table.add_row(*(Text("\n".join(wrap(r[i], widths[i]))) for i in group),
                          style=styles[k] if styles else None)
        console.print(table)
        if ending and table.caption is None:
            _paragraph(console, ending, "table.caption")
