"""Fusion search beyond Alg. 1: optimise the oracle's iteration time directly.

Alg. 1 only looks at partitions that maximise the smallest group, one per R. That objective is
blind to *where* a group sits: a large group at the urgent end of the chain (the last gradients of
the backward pass, needed first by the next forward pass) delays the critical path, while the same
group early in the chain costs nothing. This search prices partitions with the same oracle but
looks at many more of them:

1. **Seeds**: no fusion (R = N, so the search can never end worse than it under the oracle), the
   best few partitions of Alg. 1's R sweep, and a Horovod-like two-parameter family — close a
   group once it holds ``max_bytes`` or once the next tensor is ready more than ``max_gap_us``
   after the group's first one — on a grid scaled by the cost model (``alpha / beta`` is the size
   at which a call's fixed cost equals its transfer time).
2. **Local search** from the best seeds: toggle a group boundary (merge two neighbours or split a
   group) and shift a boundary by one tensor, first improvement, sweeping from the urgent end of
   the chain, until a sweep finds nothing or the evaluation budget is spent. Deterministic.

The caller (``plan_fusion``) replays the best distinct candidates with the real scheduler and the
simulator and keeps the one with the best replayed time, so per-partition alpha costs the oracle
does not see (extra preemptions) are accounted for before a plan is chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pace.fusion.chain import (
    REL_EPS,
    Chain,
    ChainOracle,
    IntArray,
    Score,
    partition_key,
    singletons,
    starts_from_cuts,
)
from pace.fusion.paper import RSweep


def _better(a: Score, b: Score) -> bool:
    """Lexicographic improvement with a relative tolerance on each component."""
    tol0 = REL_EPS * max(1.0, abs(b[0]))
    if a[0] < b[0] - tol0:
        return True
    if a[0] > b[0] + tol0:
        return False
    return a[1] < b[1] - REL_EPS * max(1.0, abs(b[1]))


@dataclass(frozen=True, kw_only=True, slots=True)
class PartitionCandidate:
    """One priced partition, labelled with where it came from."""

    label: str
    starts: IntArray
    cost_us: float


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchResult:
    """The best partition found and the best distinct candidates, cheapest first."""

    best: PartitionCandidate
    ranked: tuple[PartitionCandidate, ...]
    evaluations: int


def window_partition(chain: Chain, *, max_bytes: float, max_gap_us: float) -> IntArray:
    """Close a group once it holds ``max_bytes``, or before a tensor ready later than the group's
    first tensor plus ``max_gap_us`` (Horovod's fusion buffer and cycle time, on the chain)."""
    n = chain.n
    size = chain.size_bytes.tolist()
    release = chain.release_us.tolist()
    starts = [0]
    group_bytes = 0
    first_release = release[0]
    for i in range(n):
        if i > 0 and (group_bytes >= max_bytes or release[i] - first_release > max_gap_us):
            starts.append(i)
            group_bytes = 0
            first_release = release[i]
        group_bytes += size[i]
    return np.asarray(starts, dtype=np.int64)


def family_grid(chain: Chain) -> list[tuple[str, float, float]]:
    """(label, max_bytes, max_gap_us) grid of the window family, scaled by the cost model."""
    total = float(chain.size_bytes.sum())
    if chain.alpha_us > 0 and chain.beta_us_per_byte > 0:
        pivot = chain.alpha_us / chain.beta_us_per_byte
        byte_grid = [pivot * f for f in (0.25, 1.0, 4.0, 16.0, 64.0, 256.0)]
    else:
        byte_grid = list(np.geomspace(max(1.0, total / chain.n), total, 6))
    byte_grid.append(float("inf"))
    span_us = max(float(chain.release_us[-1] - chain.release_us[0]), 1e-9)
    gap_grid = [0.0, *(span_us * f for f in (0.001, 0.01, 0.05, 0.2)), float("inf")]
    return [(f"window(bytes={b:.3g},gap_us={g:.3g})", b, g) for b in byte_grid for g in gap_grid]


def _focus(oracle: ChainOracle, starts: IntArray, n: int) -> tuple[list[int], list[int]] | None:
    """(toggle positions, boundaries to shift) that can touch a critical block, urgent end
    first; ``None`` when the oracle gives no hints (then every position is tried)."""
    if oracle.plan_oracle is not None:
        return None
    jobs = oracle.critical_jobs(starts)
    bounds = [*starts.tolist(), n]
    toggles: set[int] = set()
    shifts: set[int] = set()
    for g in jobs:
        a, b = bounds[g], bounds[g + 1]
        toggles.update(range(max(a, 1), min(b, n - 1) + 1))
        shifts.update(p for p in (a, b) if 0 < p < n)
    return sorted(toggles, reverse=True), sorted(shifts, reverse=True)


def local_search(
    chain: Chain,
    oracle: ChainOracle,
    starts: IntArray,
    *,
    max_evaluations: int,
) -> tuple[IntArray, Score, int]:
    """First-improvement descent over boundary toggles (merge two neighbours / split a group)
    and one-tensor boundary shifts, restricted to the critical blocks of the current partition.

    Returns the final starts, their score and the number of moves priced (memo hits included:
    the budget bounds work, not distinct partitions).
    """
    n = chain.n
    starts = chain.legal(starts)
    cuts = np.zeros(n, dtype=bool)
    cuts[starts] = True
    # A required start (two dtypes meet) is never merged away.
    fixed = np.zeros(n, dtype=bool)
    fixed[chain.required_starts] = True
    current = starts
    best = oracle.score(current)
    spent = 0
    resume_at = n
    while spent < max_evaluations:
        focus = _focus(oracle, current, n)
        if focus is None:
            toggles = list(range(n - 1, 0, -1))
            shifts = np.flatnonzero(cuts)[:0:-1].tolist()
        else:
            toggles, shifts = focus
        moves: list[tuple[int, ...]] = [(p,) for p in toggles if not fixed[p]]
        for p in shifts:
            if not fixed[p]:
                moves.extend((p, q) for q in (p - 1, p + 1) if 0 < q < n and not cuts[q])
        # Resume the sweep where the last accepted move was instead of at the urgent end again:
        # moves above it were just tried and mostly still fail. A full pass of the (rotated)
        # list without improvement is still a local optimum.
        k = next((i for i, m in enumerate(moves) if m[0] <= resume_at), 0)
        moves = moves[k:] + moves[:k]
        accepted = False
        for move in moves:
            if spent >= max_evaluations:
                break
            for p in move:
                cuts[p] = not cuts[p]
            candidate = starts_from_cuts(cuts)
            score = oracle.score(candidate)
            spent += 1
            if _better(score, best):
                best = score
                current = candidate
                accepted = True
                resume_at = move[0]
                break
            for p in move:
                cuts[p] = not cuts[p]
        if not accepted:
            break
    return current, best, spent


def default_budget(n: int) -> int:
    """Local-search moves: 15 per tensor on a short chain (measured: on 220-tensor traces the
    result keeps improving up to ~3,000 moves, ~0.2 s); on a long one each move costs O(G log G)
    for G groups, so the budget shrinks as 1/N to bound the total work."""
    return int(min(max(15 * n, 500), 4000, max(300, 2_000_000 // max(n, 1))))


def search_fusion(
    chain: Chain,
    oracle: ChainOracle,
    *,
    sweep: RSweep,
    max_evaluations: int | None = None,
    seeds_for_local_search: int = 2,
) -> SearchResult:
    """Seeds + local search, all priced by ``cost``; see the module docstring."""
    budget = default_budget(chain.n) if max_evaluations is None else max_evaluations
    pool: dict[bytes, PartitionCandidate] = {}

    def add(label: str, starts: IntArray) -> None:
        starts = chain.legal(starts)
        key = partition_key(starts)
        if key not in pool:
            pool[key] = PartitionCandidate(label=label, starts=starts, cost_us=oracle(starts))

    add("none", singletons(chain.n))
    add(f"paper(R={sweep.best_groups})", sweep.best_starts)
    for label, max_bytes, gap in family_grid(chain):
        add(label, window_partition(chain, max_bytes=max_bytes, max_gap_us=gap))

    def rank(c: PartitionCandidate) -> Score:
        return oracle.score(c.starts)

    seeds = sorted(pool.values(), key=rank)[:seeds_for_local_search]
    # The best seed descends first; whatever budget it leaves goes to the next seed.
    remaining = budget
    for seed in seeds:
        if remaining <= 0:
            break
        starts, score, spent = local_search(chain, oracle, seed.starts, max_evaluations=remaining)
        remaining -= spent
        key = partition_key(starts)
        if key not in pool:
            pool[key] = PartitionCandidate(
                label=f"local({seed.label})", starts=starts, cost_us=score[0]
            )

    ranked = tuple(sorted(pool.values(), key=rank))
    return SearchResult(best=ranked[0], ranked=ranked, evaluations=oracle.evaluations)
