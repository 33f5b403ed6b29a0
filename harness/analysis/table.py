"""Plain-text tables for the terminal, CI logs and the README: one formatter for every command.

Columns are padded to their widest cell, first columns left-aligned, figures
right-aligned. A row with fewer cells than headers (e.g. "unsupported: why")
prints its last cell unpadded after the aligned ones. Plain text on purpose:
these tables are pasted into READMEs and CI logs, where box drawing breaks.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence

WIDTH = 100  # the columns a command's default output keeps within (a terminal's); --wide lifts it


def column_widths(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    """The width of each column: its header or its widest cell in a full row."""
    full = [r for r in rows if len(r) == len(headers)]
    return [max([len(h), *(len(r[i]) for r in full)]) for i, h in enumerate(headers)]


def format_line(cells: Sequence[str], widths: Sequence[int], left: int = 1) -> str:
    """One row: the first ``left`` columns left-aligned, the rest right-aligned."""
    n = len(cells) if len(cells) == len(widths) else len(cells) - 1
    parts = [c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells[:n], widths))]
    if n < len(cells):
        parts.append(cells[-1])
    return "  ".join(parts).rstrip()


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1, rule: bool = False
) -> list[str]:
    """The header line (and a rule of dashes under it if asked) and one line per row."""
    widths = column_widths(headers, rows)
    head = format_line(headers, widths, left)
    return [head, *(["-" * len(head)] if rule else []), *(format_line(r, widths, left) for r in rows)]


def wrapped(lines: Iterable[str], width: int = WIDTH, hang: int = 4) -> list[str]:
    """Each line within ``width``, its continuation indented ``hang`` past the line's own indent."""
    out: list[str] = []
    for line in lines:
        indent = " " * (len(line) - len(line.lstrip()) + hang)
        out += textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False) or [""]
    return out
