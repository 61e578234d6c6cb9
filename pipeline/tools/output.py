"""What the tools print: JSON lines for programs, aligned tables for people, body previews.

One table layout serves the ``rocketstore`` command and the jobs' summaries: columns padded to
their widest cell, two spaces apart, number columns right-aligned. Only how a cell is spelled
differs (:func:`plain_cell` for the command line, where numbers are copied into other commands;
the jobs pass their own, with thousands separators).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence


def json_line(obj: object) -> str:
    """``obj`` as one compact JSON line (no trailing newline), non-ASCII kept as it is."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def emit(obj: object) -> None:
    """Write ``obj`` to standard output as one JSON line."""
    sys.stdout.write(json_line(obj) + "\n")


def plain_cell(value: object) -> str:
    """A cell as the command line prints it: nothing for ``None``, ``true``/``false``."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def format_table(
    header: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    cell: Callable[[object], str] = plain_cell,
    indent: str = "",
) -> str:
    """An aligned text table, one line per row after the header, without a trailing newline.

    A column whose values are all numbers (or ``None``) is right-aligned, any other column
    left-aligned; trailing blanks are cut.
    """
    # Column by column: a table of 40,000 queues is 240,000 cells.
    values = list(zip(*rows, strict=True)) if rows else [() for _ in header]
    columns = []
    for name, column in zip(header, values, strict=True):
        texts = [name, *map(cell, column)]
        width = max(map(len, texts))
        numeric = bool(rows) and all(_is_number(v) or v is None for v in column)
        columns.append([t.rjust(width) if numeric else t.ljust(width) for t in texts])
    return "\n".join((indent + "  ".join(parts)).rstrip() for parts in zip(*columns, strict=True))


def print_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """:func:`format_table` with :func:`plain_cell`, to standard output."""
    sys.stdout.write(format_table(header, rows) + "\n")


def preview(body: bytes, limit: int = 40) -> str:
    """Body as printable text (control characters escaped), cut at ``limit`` characters."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(body)} bytes, not UTF-8>"
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"
