"""The exception tree of pace.

Each exception maps to one outcome the CLI reports (exit codes in docs/design.md):
bad input -> exit 2 with one line naming the file and the field; anything else is a bug (exit 1).
"""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` with every unprintable character escaped as Python would (``\\n``,
    ``\\x1b``, ``\\ud800``), so that it prints as one line in any encoding."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class PaceError(Exception):
    """Base of every error pace raises on purpose."""


class InputError(PaceError, ValueError):
    """A trace, schedule, option or model the user gave is malformed or inconsistent.

    ``where`` is the file (or option) and ``field`` the JSON path inside it, so the message reads
    ``trace.json: tensors[3].producer: op 'bw.fc' does not exist``.
    """

    def __init__(self, message: str, *, where: str = "", field: str = "") -> None:
        self.where = where
        self.field = field
        self.detail = message
        # Names come from files: a newline or a terminal escape in one must not break the line.
        parts = [printable(p) for p in (where, field, message) if p]
        super().__init__(": ".join(parts))

    def located(self, where: str) -> InputError:
        """The same error, attributed to file ``where`` (kept if already attributed)."""
        if self.where:
            return self
        return type(self)(self.detail, where=where, field=self.field)


class ScheduleMismatchError(InputError):
    """A schedule does not belong to the trace or model it is used with."""


class LimitError(InputError):
    """Valid input whose replay would exceed a documented work limit (P3's 160 KiB slices of a
    200 GiB trace are more units than the simulator replays); callers that run every baseline
    leave that one out with a warning instead of failing."""


class SolverError(PaceError):
    """An LP solver failed, is missing, or ran out of time."""


class InfeasibleError(SolverError):
    """The scheduling LP has no solution for the given horizon."""


class SolverTimeoutError(SolverError):
    """The solver hit its time limit before proving optimality."""


class SolverMissingError(SolverError):
    """The requested solver backend is not installed."""


class RuntimeReplayError(PaceError):
    """The runtime could not replay a schedule (time-out, peer failure, ...)."""
