"""Reading the foreign JSON files the importer takes (Kineto, Execution Trace, parameters).

These files are written by PyTorch, not by pace, so parsing is lenient where pace's own formats
are strict (``pace.io``): plain ``json`` semantics (a repeated key keeps its last value, as every
JSON tool the user has does). Every failure is an ``InputError`` naming the file, so the CLI
prints one line.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path
from typing import Any

from pace.errors import InputError

PathLike = str | os.PathLike[str]
_GZIP_MAGIC = b"\x1f\x8b"


def read_json_object(path: PathLike, what: str) -> dict[str, Any]:
    """The JSON object in ``path`` (plain or gzip); ``what`` names the kind of file in errors."""
    where = str(path)
    try:
        raw = Path(path).read_bytes()
    except IsADirectoryError:
        raise InputError(f"is a directory, expected a {what} file", where=where) from None
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror or exc}", where=where) from None
    if raw.startswith(_GZIP_MAGIC) or where.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"not a valid gzip file: {exc}", where=where) from None
    if not raw.strip():
        raise InputError(f"empty file, expected a {what} (a JSON object)", where=where)
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", where=where) from None
    except json.JSONDecodeError as exc:
        # A profiler killed while writing leaves a prefix: say so, it is the common cause.
        tail = exc.doc.rstrip()
        hint = " (file truncated?)" if exc.pos >= len(tail) or tail[-1:] not in "}]" else ""
        raise InputError(
            f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}){hint}",
            where=where,
        ) from None
    except RecursionError:
        raise InputError("not valid JSON: nested too deeply", where=where) from None
    if not isinstance(obj, dict):
        raise InputError(
            f"expected a {what} (a JSON object), got {type(obj).__name__}", where=where
        )
    return obj
