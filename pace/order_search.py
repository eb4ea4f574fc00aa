"""The units' issue order searched under the runtime's own replay (docs/scheduling.md, section 13).

The runtime issues units strictly in priority order, each once its gradients are ready, and a
unit on the link is never preempted. The LP's schedule is preemptive and its priorities,
numbered in the start order of the contract's work-conserving replay, send whatever unit is
ready when the link frees: a large unit that is ready early but needed late then blocks the
urgent ones behind it. Holding it back (the link idles until the urgent unit is ready) is a
schedule neither the LP nor that replay can express, and on the calibrated traces of the
throttled link it was 1-4% faster (docs/results.md).

The same descent also joins units, and splits them. Every unit the runtime issues costs a
collective call: the link's per-call delay and, on a host whose cores compute and communicate,
the compute a call takes from the training beside it (the interference term,
`docs/scheduling.md`). The fusion stage prices its groups with the optimal preemptive
schedule, which charges neither, and the LP then splits jobs into pieces: on the calibrated
traces of the throttled link, joining units after all (a bias with its weight's last piece,
two neighbours) replayed 1.6-8.9% faster in the runtime's order (docs/results.md). The other
way, a fused group can hold back what the next forward needs first: the first layers'
gradients, ready last, fused with 6 MiB of the layers before them, made that forward wait for
the whole unit; sent apart, they replayed 1.4-3.4% faster on a 2 Gbit/s trace (:func:`splits`).

:func:`descend` is the search, pure and generic: a first-improvement descent over the states one
step away (``neighbours``: by default :func:`moves`, one unit taken out of the order and put
back at another position; the compiler's :func:`regroupings` also joins two units and splits
one), accepting a step only where it is faster on the objective and no slower on every other
judge (in the compiler: the other cost models it hedges over), within a budget of objective
evaluations.

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

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

Group = tuple[int, ...]
"""The compiled units (their indices) that one issued unit carries."""

REL_EPS = 1e-6
"""A move must make the objective this much (relative) faster to count: replays are floats,
and a descent must not wander on ties."""

SLOWER_EPS = 1e-9
"""How much (relative) slower another judge may come out of a move and still accept it
(float noise only: in effect never slower)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OrderSearch(Generic[T]):
    """Where :func:`descend` ended: the order, its objective and other judges' values, those of
    the start, the steps taken, the objective evaluations spent and whether the budget ran out
    (``False``: no single step improves, a local optimum)."""

    order: list[T]
    objective: float
    others: tuple[float, ...]
    start_objective: float
    start_others: tuple[float, ...]
    moves: int
    evaluations: int
    exhausted: bool


def moves(order: Sequence[T]) -> list[list[T]]:
    """Every order one move from ``order``: each element taken out and put at each other
    position, elements early in the order first, each tried at the far end first (the move
    that holds back a unit the work-conserving replay sends early)."""
    n = len(order)
    out: list[list[T]] = []
    seen = {tuple(order)}
    for i in range(n):
        rest = [*order[:i], *order[i + 1 :]]
        for j in range(n - 1, -1, -1):
            cand = [*rest[:j], order[i], *rest[j:]]
            if (key := tuple(cand)) not in seen:
                seen.add(key)
                out.append(cand)
    return out


def _neighbour_joins(groups: Sequence[Group]) -> Iterator[list[Group]]:
    for i in range(len(groups) - 1, 0, -1):
        yield [*groups[: i - 1], groups[i - 1] + groups[i], *groups[i + 1 :]]


def _far_joins(groups: Sequence[Group]) -> Iterator[list[Group]]:
    n = len(groups)
    for i in range(n):
        for j in range(i + 2, n):
            joined = groups[i] + groups[j]
            between = list(groups[i + 1 : j])
            yield [*groups[:i], *between, joined, *groups[j + 1 :]]
            yield [*groups[:i], joined, *between, *groups[j + 1 :]]


def joins(groups: Sequence[Group]) -> list[list[Group]]:
    """Every grouping one join from ``groups`` (units in issue order): two neighbours as one
    unit, the later end of the order first; then two units apart as one, at the later one's
    place and at the earlier one's."""
    return [*_neighbour_joins(groups), *_far_joins(groups)]


def splits(groups: Sequence[Group]) -> Iterator[list[Group]]:
    """Every grouping one split from ``groups``: a group of several members cut in two where its
    members' order allows (the compiler lists them in ready order), the two parts issued one
    after the other, in either order; the later end of the order first (the last groups are the
    ones the next forward waits for)."""
    for i in range(len(groups) - 1, -1, -1):
        g = groups[i]
        for k in range(len(g) - 1, 0, -1):
            head, tail = g[:k], g[k:]
            yield [*groups[:i], head, tail, *groups[i + 1 :]]
            yield [*groups[:i], tail, head, *groups[i + 1 :]]


def regroupings(groups: Sequence[Group]) -> Iterator[list[Group]]:
    """The compiler's steps from ``groups``: a join of neighbours (few, and the commonest gain:
    a bias beside its weight's last piece), then a move (:func:`moves`), then a join of two
    units apart, then a split (:func:`splits`). Lazy: a first-improvement descent mostly takes
    one of the first."""
    yield from _neighbour_joins(groups)
    yield from moves(groups)
    yield from _far_joins(groups)
    yield from splits(groups)


def descend(
    order: Sequence[T],
    objective: Callable[[Sequence[T]], float],
    *,
    others: Callable[[Sequence[T]], Sequence[float]] | None = None,
    budget: int,
    neighbours: Callable[[Sequence[T]], Iterable[list[T]]] = moves,
    on_step: Callable[[Sequence[T], Sequence[T]], None] | None = None,
) -> OrderSearch[T]:
    """First-improvement descent from ``order`` (see the module docstring): a step (one of
    ``neighbours(current)``) is taken where ``objective`` is at least ``REL_EPS`` smaller and no
    value of ``others`` (evaluated only then) is more than ``SLOWER_EPS`` larger than at the
    current state. At most ``budget`` evaluations of ``objective`` besides the start's.
    ``on_step(before, after)``: called with each step taken."""
    current = list(order)
    best = objective(current)
    best_others = tuple(others(current)) if others is not None else ()
    start, start_others = best, best_others
    taken = spent = 0
    local_optimum = False
    while not local_optimum and spent < budget:
        local_optimum = True
        for cand in neighbours(current):
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
            if on_step is not None:
                on_step(current, cand)
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
