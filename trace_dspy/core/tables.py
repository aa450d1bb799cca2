"""Markdown tables: a header, the alignment row and one line per row."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

_RULES = {"l": "---", "r": "---:", "c": ":---:"}


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|")


def markdown_table(headers: Sequence[object], rows: Iterable[Sequence[object]], align: str | None = None) -> str:
    """The table as lines joined by newlines (no trailing one).

    ``align`` has one letter per column, ``l``, ``r`` or ``c`` (default: the
    first column left, the others right). Cells are written with ``str`` and a
    ``|`` inside one is escaped; format numbers before passing them.
    """
    width = len(headers)
    if not width:
        raise ValueError("a table needs at least one column")
    if align is None:
        align = "l" + "r" * (width - 1)
    if len(align) != width or set(align) - set(_RULES):
        raise ValueError(f"align {align!r} needs one of l, r, c for each of the {width} columns")
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |",
             "| " + " | ".join(_RULES[a] for a in align) + " |"]
    for number, row in enumerate(rows, 1):
        row = list(row)
        if len(row) != width:
            raise ValueError(f"row {number} has {len(row)} cells, the table has {width} columns: {row!r}")
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines)
