"""The units' issue order searched under the runtime's own replay (docs/scheduling.md, section 13).

The runtime issues units strictly in priority order, each once its gradients are ready, and a
unit on the link is never preempted. The LP's schedule is preemptive and its priorities,
numbered in the start order of the contract's work-conserving replay, send whatever unit is
ready when the link frees: a large unit that is ready early but needed late then blocks the
urgent ones behind it. Holding it back (the link idles until the urgent unit is ready) is a
schedule neither the LP nor that replay can express, and on the calibrated traces of the
throttled link it was 1-4% faster (docs/results.md).

:func:`descend` is the search, pure and generic: a first-improvement descent over single moves
(one unit taken out of the order and put back at another position), accepting a move only where
it is faster on the objective and no slower on every other judge (in the compiler: the other
cost models it hedges over), within a budget of objective evaluations.

>>> sizes = [3.0, 1.0, 2.0]  # toy cost: weighted completion on one machine (Smith's rule)
>>> def done(order):
...     t = total = 0.0
...     for u in order:
...         t += sizes[u]
...         total += t * (3 - u)
...     return total
>>> r = descend([0, 1, 2], done, budget=100)
>>> r.order, r.objective, r.start_objective
([1, 0, 2], 20.0, 23.0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

REL_EPS = 1e-6
"""A move must make the objective this much (relative) faster to count: replays are floats,
and a descent must not wander on ties."""

SLOWER_EPS = 1e-9
"""How much (relative) slower another judge may come out of a move and still accept it
(float noise only: in effect never slower)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OrderSearch:
    """Where :func:`descend` ended: the order, its objective and other judges' values, those of
    the start, the moves taken, the objective evaluations spent and whether the budget ran out
    (``False``: no single move improves, a local optimum)."""

    order: list[int]
    objective: float
    others: tuple[float, ...]
    start_objective: float
    start_others: tuple[float, ...]
    moves: int
    evaluations: int
    exhausted: bool


def moves(order: Sequence[int]) -> list[list[int]]:
    """Every order one move from ``order``: each element taken out and put at each other
    position, elements early in the order first, each tried at the far end first (the move
    that holds back a unit the work-conserving replay sends early)."""
    n = len(order)
    out: list[list[int]] = []
    seen = {tuple(order)}
    for i in range(n):
        rest = [*order[:i], *order[i + 1 :]]
        for j in range(n - 1, -1, -1):
            cand = [*rest[:j], order[i], *rest[j:]]
            if (key := tuple(cand)) not in seen:
                seen.add(key)
                out.append(cand)
    return out


def descend(
    order: Sequence[int],
    objective: Callable[[Sequence[int]], float],
    *,
    others: Callable[[Sequence[int]], Sequence[float]] | None = None,
    budget: int,
) -> OrderSearch:
    """First-improvement descent from ``order`` (see the module docstring): a move is taken
    where ``objective`` is at least ``REL_EPS`` smaller and no value of ``others`` (evaluated
    only then) is more than ``SLOWER_EPS`` larger than at the current order. At most ``budget``
    evaluations of ``objective`` besides the start's."""
    current = list(order)
    best = objective(current)
    best_others = tuple(others(current)) if others is not None else ()
    start, start_others = best, best_others
    taken = spent = 0
    local_optimum = False
    while not local_optimum and spent < budget:
        local_optimum = True
        for cand in moves(current):
            if spent >= budget:
                local_optimum = False
                break
            spent += 1
            value = objective(cand)
            if not value < best * (1.0 - REL_EPS):
                continue
            rest = tuple(others(cand)) if others is not None else ()
            if any(r > b * (1.0 + SLOWER_EPS) for r, b in zip(rest, best_others, strict=True)):
                continue
            current, best, best_others = cand, value, rest
            taken += 1
            local_optimum = False
            break
    return OrderSearch(
        order=current,
        objective=best,
        others=best_others,
        start_objective=start,
        start_others=start_others,
        moves=taken,
        evaluations=spent,
        exhausted=not local_optimum,
    )
