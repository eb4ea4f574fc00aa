"""The ``pace`` command line.

Each subcommand lives in its own module of this package and exposes
``register(subparsers) -> None``, which adds its parser and sets ``func`` to a handler
``(args) -> int``. Handlers only parse, call one stage entry function and print; library code
never prints or exits.

Exit codes (docs/design.md): 0 ok; 2 bad input or usage, one line on stderr naming file and field;
1 a bug (traceback kept, since that is what a bug report needs).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from pace.errors import InputError, PaceError

# Subcommand modules, in the order `pace --help` lists them. A module that fails to import
# because an optional extra (torch, horovod) is missing still registers: it imports those
# lazily inside its handler.
_COMMANDS: tuple[str, ...] = (
    "pace.cli.compile_cmd",
    "pace.cli.simulate_cmd",
    "pace.cli.compare_cmd",
    "pace.cli.validate_cmd",
    "pace.cli.profile_cmd",
    "pace.cli.recompile_cmd",
    "pace.cli.timeline_cmd",
)


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on usage errors already; keep its message to one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"pace: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pace",
        description=(
            "Compile and replay the gradient all-reduce schedule of data-parallel training."
        ),
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for modname in _COMMANDS:
        importlib.import_module(modname).register(sub)
    return parser


def _version() -> str:
    from pace import __version__

    return f"pace {__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args))
    except InputError as exc:
        sys.stderr.write(f"pace: {exc}\n")
        return 2
    except PaceError as exc:
        # Solver failures etc. that reached the top: a clear line, not a traceback.
        sys.stderr.write(f"pace: {type(exc).__name__}: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("pace: interrupted\n")
        return 130
