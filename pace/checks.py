"""Type and range checks of one value, with the messages every pace error uses.

Python's ``bool`` is an ``int`` (``True + True == 2``), JSON's ``true`` is not a number, and a
flag or file field that says ``true`` where a count belongs is a mistake: every integer and
number check in pace refuses ``bool``. The predicates (``is_int``, ``is_number``) say whether a
value qualifies; ``require_int`` and ``require_number`` raise ``InputError`` otherwise, with
``where`` (file or option) and ``field`` (JSON path or parameter) as every ``InputError``:

>>> require_int(3, field="samples", minimum=1)
3
>>> require_int(True, field="samples", minimum=1)
Traceback (most recent call last):
    ...
pace.errors.InputError: samples: must be an integer >= 1, got True
>>> require_number(-1, where="--bandwidth-gbps", above=0)
Traceback (most recent call last):
    ...
pace.errors.InputError: --bandwidth-gbps: must be > 0, got -1
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

from pace.errors import InputError

__all__ = ["is_int", "is_number", "require_int", "require_number", "shown"]

# Integers of more bits than this overflow float() (the largest float is just below 2**1024).
_FLOAT_BITS = 1023


def is_int(x: object) -> TypeGuard[int]:
    """``x`` is an ``int`` and not a ``bool``."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: object, *, finite: bool = False) -> TypeGuard[int | float]:
    """``x`` is an ``int`` or a ``float`` and not a ``bool``; with ``finite``, also finite (as a
    float: an integer beyond float's range, which ``float()`` refuses, is not)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return False
    if not finite:
        return True
    return x.bit_length() <= _FLOAT_BITS if isinstance(x, int) else math.isfinite(x)


def shown(x: object) -> str:
    """``repr(x)`` for a message; an integer too long to print (``str`` refuses more than
    4,300 digits) is described by its size instead."""
    if is_int(x) and x.bit_length() > 128:
        return f"an integer of {x.bit_length()} bits"
    return repr(x)


def _bound(minimum: float | None, above: float | None) -> str:
    if above is not None:
        return f" > {_num(above)}"
    if minimum is not None:
        return f" >= {_num(minimum)}"
    return ""


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def require_int(
    value: Any,
    *,
    where: str = "",
    field: str = "",
    name: str = "",
    minimum: int | None = None,
    above: int | None = None,
    maximum: int | None = None,
) -> int:
    """``value`` if it is an integer (not a bool) ``>= minimum`` / ``> above`` / ``<= maximum``.

    Otherwise ``InputError``: ``must be an integer >= 1, got 0`` for a wrong type and a value
    below the bound alike, ``must be <= 8, got 9`` above ``maximum``. ``name`` (optional) starts
    the message: ``bytes must be an integer >= 0, got -5``.
    """
    lead = f"{name} must" if name else "must"
    ok = (
        is_int(value) and (minimum is None or value >= minimum) and (above is None or value > above)
    )
    if not ok:
        raise InputError(
            f"{lead} be an integer{_bound(minimum, above)}, got {shown(value)}",
            where=where,
            field=field,
        )
    if maximum is not None and value > maximum:
        raise InputError(f"{lead} be <= {maximum}, got {shown(value)}", where=where, field=field)
    return int(value)


def require_number(
    value: Any,
    *,
    where: str = "",
    field: str = "",
    name: str = "",
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
) -> float:
    """``value`` as a float if it is a finite number (not a bool) within the bounds.

    Otherwise ``InputError``: ``must be a finite number > 0, got nan`` for a wrong type or a
    non-finite value, ``must be > 0, got -1`` below the bound, ``must be <= 1, got 2`` above
    ``maximum``. ``name`` (optional) starts the message: ``us must be >= 0, got -1``.
    """
    lead = f"{name} must" if name else "must"
    bound = _bound(minimum, above)
    if not is_number(value, finite=True):
        raise InputError(
            f"{lead} be a finite number{bound}, got {shown(value)}", where=where, field=field
        )
    if (minimum is not None and value < minimum) or (above is not None and value <= above):
        raise InputError(f"{lead} be{bound}, got {shown(value)}", where=where, field=field)
    if maximum is not None and value > maximum:
        raise InputError(
            f"{lead} be <= {_num(maximum)}, got {shown(value)}", where=where, field=field
        )
    return float(value)
