"""Command-line options shared by several subcommands, and the bounds of every numeric flag.

A flag value is checked where argparse reads it (``InRange``), so an error names the flag the user
typed (``pace: --compute-speedup: must be ...``), never a library parameter, and no stage
sees a value outside the bounds documented with the file formats (docs/trace-format.md,
"Bounds"): NaN, infinities, integers beyond 64 bits and numbers whose arithmetic overflows are
refused here.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

from pace.errors import InputError
from pace.io import (
    MAX_COMPUTE_SPEEDUP,
    MAX_ITEMS,
    MAX_TENSOR_BYTES,
    MAX_WORKERS,
    MIN_COMPUTE_SPEEDUP,
)

# 1 kbit/s to 1 Pbit/s: the ring cost model then stays within the trace bounds on beta.
MIN_BANDWIDTH_GBPS = 1e-6
MAX_BANDWIDTH_GBPS = 1e6


class InRange(argparse.Action):
    """Stores a number that argparse's ``type`` parsed, after checking its bounds.

    Out of range raises ``InputError`` naming the flag (``pace: --credit: must be ...``, exit 2),
    like every other bad value; a value that does not parse at all stays argparse's error.
    """

    def __init__(
        self,
        option_strings: list[str],
        dest: str,
        *,
        lo: float,
        hi: float,
        lo_open: bool = False,
        hi_open: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.lo, self.hi, self.lo_open, self.hi_open = lo, hi, lo_open, hi_open

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        x = values
        where = option_string or "/".join(self.option_strings)
        # An int is always finite; NaN and the infinities come only through float().
        if not isinstance(x, int) and not math.isfinite(x):
            raise InputError(f"must be a finite number, got {_shown(x)}", where=where)
        if (x <= self.lo) if self.lo_open else (x < self.lo):
            raise InputError(
                f"must be {'>' if self.lo_open else '>='} {_num(self.lo)}, got {_shown(x)}",
                where=where,
            )
        if (x >= self.hi) if self.hi_open else (x > self.hi):
            raise InputError(
                f"must be {'<' if self.hi_open else '<='} {_num(self.hi)}, got {_shown(x)}",
                where=where,
            )
        self.store(namespace, x)

    def store(self, namespace: argparse.Namespace, x: float) -> None:
        setattr(namespace, self.dest, x)


class InRangeAppend(InRange):
    """``InRange`` for a repeatable flag: each value checked, all kept in a list."""

    def store(self, namespace: argparse.Namespace, x: float) -> None:
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or []), x])


def int_in(lo: int, hi: int) -> dict[str, Any]:
    """``add_argument`` keywords for an integer flag in ``[lo, hi]``."""
    return {"type": int, "action": InRange, "lo": lo, "hi": hi}


def float_in(
    lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False
) -> dict[str, Any]:
    """``add_argument`` keywords for a finite number flag between ``lo`` and ``hi``."""
    return {
        "type": float,
        "action": InRange,
        "lo": lo,
        "hi": hi,
        "lo_open": lo_open,
        "hi_open": hi_open,
    }


def floats_in(lo: float, hi: float) -> dict[str, Any]:
    """``add_argument`` keywords for a repeatable finite number flag in ``[lo, hi]``."""
    return {"type": float, "action": InRangeAppend, "lo": lo, "hi": hi, "default": []}


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _shown(x: object) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


class OutputPath(argparse.Action):
    """``-o``/``--output``: a file name, not empty and not an existing directory.

    Checked before any work, so a long compile does not end on an unwritable name; the write
    itself (``pace.io.write_atomic``) still reports any other failure naming the file.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        where = "/".join(self.option_strings)
        if not values:
            raise InputError("must be a file name, got an empty string", where=where)
        if os.path.isdir(values):
            raise InputError(f"{values!r} is a directory, give a file name", where=where)
        setattr(namespace, self.dest, values)


def add_what_if_options(p: argparse.ArgumentParser) -> None:
    """``--bandwidth-gbps``, ``--workers``, ``--compute-speedup`` (``compiler.apply_what_if``)."""
    p.add_argument(
        "--bandwidth-gbps",
        **float_in(MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS),
        metavar="X",
        help="what-if: re-derive the trace's all-reduce cost for this link bandwidth "
        f"({MIN_BANDWIDTH_GBPS:g} to {MAX_BANDWIDTH_GBPS:g})",
    )
    p.add_argument(
        "--workers",
        **int_in(1, MAX_WORKERS),
        metavar="W",
        help=f"what-if: re-derive the cost for W workers (1 to {MAX_WORKERS})",
    )
    p.add_argument(
        "--compute-speedup",
        # The range a schedule's meta.compute_speedup is held to as well (pace.io).
        **float_in(MIN_COMPUTE_SPEEDUP, MAX_COMPUTE_SPEEDUP),
        metavar="X",
        help="what-if: computation X times faster than profiled (e.g. a GPU vs this CPU; "
        f"{MIN_COMPUTE_SPEEDUP:g} to {MAX_COMPUTE_SPEEDUP:g})",
    )


def add_credit_options(p: argparse.ArgumentParser) -> None:
    """``--credit`` and ``--credit-bytes`` (``pace.sim.SimOptions``)."""
    p.add_argument(
        "--credit",
        **int_in(1, MAX_ITEMS),
        metavar="N",
        help="units in flight at once, sharing the bandwidth (default: the policy's, else 1)",
    )
    p.add_argument(
        "--credit-bytes",
        **int_in(1, MAX_TENSOR_BYTES),
        metavar="B",
        help="byte window: start another unit only while fewer bytes are in flight",
    )
