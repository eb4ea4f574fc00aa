"""PACE Alg. 1: balanced fusion (MaxMinSize) for each group count R, best R by the oracle.

The paper enumerates R = 1..N and says a stochastic search is needed for large N. Here every R is
evaluated while ``N <= full_enumeration_max``; above that a deterministic coarse-to-fine search runs
instead: a geometric grid over [1, N], then repeated zooms into the bracket around the best few R
until the bracket is exhausted (every integer R inside it evaluated). The oracle cost is not
unimodal in R (a partition for R and one for R+1 can be quite different), which is why the zoom
keeps several brackets; ``tests/test_fusion_search.py`` compares it with full enumeration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from pace.errors import InputError
from pace.fusion.chain import Chain, IntArray
from pace.fusion.maxmin import MaxMinTable, max_min_bisect, max_min_table
from pace.options import MAXMIN_ALGORITHMS, MaxMinAlgorithm

# Chains up to this length are partitioned with the paper's own DP table (its tie-breaking);
# longer chains with the bisection, which attains the same max-min value in O(N log N log S).
DP_MAX_TENSORS = 300
# Up to this many tensors every R in 1..N is priced (Alg. 1 verbatim).
FULL_ENUMERATION_MAX = 400
_GRID_POINTS = 48
_ZOOM_POINTS = 8
_ZOOM_BRACKETS = 6


@dataclass(frozen=True, kw_only=True, slots=True)
class RSweep:
    """Outcome of the search over R: the best R, its partition, and every R priced."""

    best_groups: int
    best_starts: IntArray
    best_cost_us: float
    costs_us: dict[int, float] = field(default_factory=dict)
    maxmin: MaxMinAlgorithm = "dp"


class _Partitioner:
    """MaxMinSize partitions of one chain, for any R, by the chosen algorithm."""

    def __init__(self, chain: Chain, maxmin: str) -> None:
        if maxmin not in MAXMIN_ALGORITHMS:
            raise InputError(
                f"must be one of {', '.join(MAXMIN_ALGORITHMS)}, got {maxmin!r}", field="maxmin"
            )
        if maxmin == "auto":
            maxmin = "dp" if chain.n <= DP_MAX_TENSORS else "bisect"
        self.kind = cast(MaxMinAlgorithm, maxmin)
        self.sizes = chain.size_bytes
        self._table: MaxMinTable | None = None
        self._values: dict[int, int] = {}

    def __call__(self, n_groups: int) -> IntArray:
        if self.kind == "dp":
            if self._table is None:
                self._table = max_min_table(self.sizes)
            return self._table.partition(n_groups)
        # MaxMinSize is non-increasing in R: solved neighbours bracket the answer.
        smaller = [r for r in self._values if r < n_groups]
        larger = [r for r in self._values if r > n_groups]
        hi = self._values[max(smaller)] if smaller else int(self.sizes.sum())
        lo = self._values[min(larger)] if larger else 1
        value, starts = max_min_bisect(self.sizes, n_groups, bracket=(lo, hi))
        self._values[n_groups] = value
        return starts


def sweep_r(
    chain: Chain,
    cost: Callable[[IntArray], float],
    *,
    maxmin: str = "auto",
    full_enumeration_max: int = FULL_ENUMERATION_MAX,
) -> RSweep:
    """Alg. 1 lines 2-9: price the MaxMinSize partition of each R, keep the cheapest.

    Ties keep the smaller R, as Alg. 1 line 7 does (``R`` ascending, strict ``<``).
    """
    n = chain.n
    part = _Partitioner(chain, maxmin)
    costs: dict[int, float] = {}
    starts_of: dict[int, IntArray] = {}

    def price(r: int) -> float:
        if r not in costs:
            s = part(r)
            starts_of[r] = s
            costs[r] = cost(s)
        return costs[r]

    if n <= full_enumeration_max:
        for r in range(1, n + 1):
            price(r)
    else:
        grid = np.unique(np.round(np.geomspace(1, n, _GRID_POINTS)).astype(np.int64))
        for r in grid:
            price(int(r))
        # Zoom: around each of the best few R, price a finer grid inside its bracket (the
        # nearest priced R on each side) until no bracket has an unpriced R left.
        while True:
            priced = sorted(costs)
            best = sorted(priced, key=lambda r: (costs[r], r))[:_ZOOM_BRACKETS]
            todo: set[int] = set()
            for r in best:
                i = priced.index(r)
                lo = priced[i - 1] if i > 0 else r
                hi = priced[i + 1] if i + 1 < len(priced) else r
                for a, b in ((lo, r), (r, hi)):
                    if b - a > 1:
                        pts = np.unique(np.round(np.linspace(a, b, _ZOOM_POINTS + 2)))
                        todo.update(int(p) for p in pts[1:-1] if int(p) not in costs)
            if not todo:
                break
            for r in sorted(todo):
                price(r)
    best_r = min(costs, key=lambda r: (costs[r], r))
    return RSweep(
        best_groups=best_r,
        best_starts=starts_of[best_r],
        best_cost_us=costs[best_r],
        costs_us=costs,
        maxmin=part.kind,
    )
