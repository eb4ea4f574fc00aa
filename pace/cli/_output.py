"""Output helpers shared by the CLI subcommands (the only place, with the handlers, that prints).

Kept tiny on purpose: ``print_json`` for ``--json`` output (one object, machine-readable, on
stdout) and ``print_table`` for the human-readable form.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from pace.checks import is_number
from pace.errors import printable

# An error or warning is one line of at most this many characters, whatever names a file holds.
MAX_ERROR_CHARS = 300


def one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` escaped to one printable line, cut in the middle to ``limit`` characters.

    The head keeps ``pace: FILE: FIELD:``, the tail the end of the message (often the value).
    """
    line = printable(text)
    if len(line) <= limit:
        return line
    tail = limit // 4
    return f"{line[: limit - tail - 5]} ... {line[-tail:]}"


def warn(text: str) -> None:
    """One ``pace: warning: ...`` line on stderr."""
    sys.stderr.write(one_line(f"pace: warning: {text}") + "\n")


def _jsonable(obj: Any) -> Any:
    """Non-finite floats become ``null``: strict JSON has no NaN/Infinity, and readers break."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    return obj


def print_json(obj: Any) -> None:
    """Print ``obj`` as one JSON document on stdout (strict JSON, stable key order), in one
    write: an interrupt leaves all of it or none of it in the buffer."""
    text = json.dumps(_jsonable(obj), indent=2, sort_keys=True, allow_nan=False)
    sys.stdout.write(text + "\n")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if math.isfinite(value) else "-"
    return str(value)


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print a table on stdout; floats get one decimal, numbers are right-aligned."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    materialised = [list(r) for r in rows]
    for i, col in enumerate(columns):
        numeric = bool(materialised) and all(is_number(r[i]) for r in materialised if i < len(r))
        table.add_column(col, justify="right" if numeric else "left")
    for r in materialised:
        table.add_row(*(_cell(v) for v in r))
    # A fixed width keeps output identical whether or not stdout is a terminal (tests, pipes).
    # No markup or emoji codes: titles and cells carry names from files, and a tensor named
    # "[/]" is a MarkupError to rich, ":smile:" an emoji.
    Console(file=sys.stdout, width=120, soft_wrap=False, markup=False, emoji=False).print(table)
