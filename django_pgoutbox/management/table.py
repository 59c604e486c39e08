"""Text tables for the management commands: a header row, each column as wide as its widest
cell, and text past a column's limit cut with an ellipsis, so that a reader sees it was cut.

Widths are counted in a terminal's columns (a CJK character takes two, a combining accent none),
and control characters are shown escaped: a cell may hold what a handler raised."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

ELLIPSIS = "…"

#: Between two columns.
GAP = "  "


@dataclass(frozen=True)
class Column:
    title: str
    #: ``">"`` for numbers, so that their digits line up.
    align: Literal["<", ">"] = "<"
    #: Longer cells are cut to this many characters, the last an ellipsis; None never cuts.
    max_width: int | None = None


def cut(text: str, width: int) -> str:
    """``text`` if it fits in ``width`` columns, else its head and an ellipsis."""
    if display_width(text) <= width:
        return text
    head, used = [], 0
    for char in text:
        used += _char_width(char)
        if used > width - 1:
            break
        head.append(char)
    return "".join(head) + ELLIPSIS


def display_width(text: str) -> int:
    """How many columns of a terminal ``text`` takes."""
    return sum(_char_width(char) for char in text)


def _char_width(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _printable(char: str) -> str:
    # ESC, BEL, a right-to-left override ...: written out, never acted upon by the terminal.
    return char if char.isprintable() else char.encode("unicode_escape").decode("ascii")


def _cell(value: object, column: Column) -> str:
    # One line per row: an error message's newlines and tabs would break the columns.
    text = "".join(map(_printable, " ".join(str(value).split())))
    return text if column.max_width is None else cut(text, column.max_width)


def render(columns: Sequence[Column], rows: Iterable[Sequence[object]]) -> list[str]:
    """The header row and one line per row, columns aligned; no trailing spaces."""
    cells = [
        [_cell(value, column) for value, column in zip(row, columns, strict=True)] for row in rows
    ]
    widths = [
        max([display_width(column.title), *(display_width(row[i]) for row in cells)])
        for i, column in enumerate(columns)
    ]
    lines = []
    for row in [[column.title for column in columns], *cells]:
        line = GAP.join(
            _pad(text, column.align, width)
            for text, column, width in zip(row, columns, widths, strict=True)
        )
        lines.append(line.rstrip())
    return lines


def _pad(text: str, align: Literal["<", ">"], width: int) -> str:
    padding = " " * (width - display_width(text))
    return text + padding if align == "<" else padding + text
