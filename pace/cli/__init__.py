"""The ``pace`` command line.

Each subcommand lives in its own module of this package and exposes
``register(subparsers) -> None``, which adds its parser and sets ``func`` to a handler
``(args) -> int``. Handlers only parse, call one stage entry function and print; library code
never prints or exits.

Exit codes (docs/design.md): 0 ok; 2 bad input or usage, one line on stderr naming file and field;
1 a bug (traceback kept, since that is what a bug report needs); 130 interrupted (Ctrl-C, one
line); 141 the reader of stdout went away (``pace compare --json | head -1``: silent, as any Unix
tool killed by SIGPIPE).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from types import FrameType

from pace.cli._output import one_line
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
    "pace.cli.import_cmd",
    "pace.cli.recompile_cmd",
    "pace.cli.timeline_cmd",
)


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on usage errors already; keep its message to one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        _error_line(f"pace: error: {message}")
        raise SystemExit(2)


EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141


def _error_line(text: str) -> None:
    try:
        sys.stderr.write(one_line(text) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        # stderr closed or a broken pipe: nowhere left to say it.
        pass


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


class _Interrupt(BaseException):
    """Ctrl-C, raised by ``main``'s SIGINT handler.

    Not ``KeyboardInterrupt``: CPython remembers a KeyboardInterrupt raised inside some of its
    C paths (and an import inside a class body wraps it in a RuntimeError), then kills the
    process with SIGINT at exit although ``main`` handled it and returned 130.
    """


class _Sigint:
    """Whether this run's SIGINT handler fired: C code that catches the exception and raises
    another (numpy's import turns it into an ImportError) cannot hide the interrupt then."""

    seen = False


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _Sigint.seen = True
    # A second Ctrl-C while the first one unwinds would interrupt that clean-up (removing a
    # temporary file, writing the line): ignored from here on.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise _Interrupt


@contextlib.contextmanager
def _sigint_handled(*, program: bool) -> Iterator[None]:
    try:
        previous = signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread: Ctrl-C stays the caller's (KeyboardInterrupt)
        yield
        return
    try:
        yield
    finally:
        # As a program, pace is about to exit: a late Ctrl-C must not raise past main. Called
        # from Python, the caller's handler comes back.
        signal.signal(signal.SIGINT, signal.SIG_IGN if program else previous)


@contextlib.contextmanager
def _encodable_output() -> Iterator[None]:
    """stdout and stderr that can print anything: a file name with undecodable bytes (a lone
    surrogate to Python) or a name in a script the terminal's encoding lacks is printed
    escaped instead of raising UnicodeEncodeError halfway through a table."""
    changed = []
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        errors = getattr(stream, "errors", None)
        if reconfigure is not None and errors in ("strict", None):
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="backslashreplace")
                changed.append((reconfigure, errors))
    try:
        yield
    finally:
        for reconfigure, errors in changed:
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors=errors)


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is an interrupt, or was raised while handling or because of one."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    if _Sigint.seen:
        return True
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, _Interrupt | KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (docs/design.md, "CLI contract").

    Every way a user can end a run cleanly is handled here, around parsing too: an interrupt
    (Ctrl-C) at any moment exits 130 with one line, files being written atomically (nothing
    half-written is left); a closed stdout (``| head -1``) exits 141 silently. ``argv=None``
    (the ``pace`` program) also leaves Ctrl-C ignored on return, as the process then exits.
    """
    _Sigint.seen = False
    try:
        with _sigint_handled(program=argv is None), _encodable_output():
            code = _run(argv)
            # Flushed here, not at interpreter exit, so a closed pipe is caught below.
            sys.stdout.flush()
            return code
    except (_Interrupt, KeyboardInterrupt):
        _error_line("pace: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        if _interrupted(exc):
            _error_line("pace: interrupted")
            return EXIT_INTERRUPTED
        raise


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        # Flag values out of range raise InputError naming the flag (pace.cli._options).
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return 2
        return int(args.func(args))
    except InputError as exc:
        _error_line(f"pace: {exc}")
        return 2
    except PaceError as exc:
        # Solver failures etc. that reached the top: a clear line, not a traceback.
        _error_line(f"pace: {type(exc).__name__}: {exc}")
        return 1


def _silence_stdout() -> None:
    """Point stdout at /dev/null: the interpreter flushes it again at exit, and a second
    ``BrokenPipeError`` there would print "Exception ignored ..." (Python's documented recipe)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):
        return  # not a real file (a test's StringIO): nothing will be flushed at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
