"""Max-min contiguous partition of a chain (PACE Sec. V-A, ``MaxMinSize``).

``MaxMinSize(chain, R)`` is the largest value ``m`` such that the chain of tensor sizes can be cut
into ``R`` contiguous, non-empty groups whose byte sums are all ``>= m``. A partition is written as
``starts``: the index of each group's first element, ``starts[0] == 0``, strictly increasing.

Two exact algorithms:

``max_min_table`` / ``max_min_dp``
    The paper's recursion, iteratively (no recursion limit) and vectorised with numpy: layer ``r``
    of the table holds ``MaxMinSize(chain[i:], r)`` for every suffix ``i``. One table answers every
    ``R <= max_groups`` at once, in O(N^2) per layer. Ties are broken as in Alg. 1 (line 20 uses a
    strict ``<``): the shortest first group that attains the maximum.

``max_min_bisect``
    Binary search on ``m`` with a greedy feasibility check, O(N log N log S).

Why the bisection is exact. Let ``c(m)`` be the number of groups the greedy scan makes when it
closes a group as soon as its sum reaches ``m`` (a trailing remainder below ``m`` is not counted).

* If ``c(m) >= R``, a partition into ``R`` groups all ``>= m`` exists: keep the first ``R - 1``
  greedy groups and put everything after them in the last one (sizes are positive, so merging only
  grows a sum, and that last group contains the ``R``-th greedy group).
* If some partition into ``R`` groups all ``>= m`` exists, then ``c(m) >= R``: by induction the
  greedy ``j``-th cut is never to the right of the partition's ``j``-th cut (greedy closes each
  group at the earliest point where it reaches ``m``, starting no later than the partition's group).

So feasibility is monotone in ``m`` and ``MaxMinSize(chain, R) = max{m : c(m) >= R}``. With integer
sizes the maximum is an integer, so an integer binary search over ``[1, total // R]`` finds it.
The greedy partition attains the same value as the DP, but may break ties differently (the greedy
puts all slack in the last group).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pace.errors import InputError

IntArray = npt.NDArray[np.int64]

# Below this many groups the scalar greedy scan (R bisect calls on a Python list) is cheaper than
# the vectorised pointer-doubling count (O(N log N) numpy work whatever R is). Measured on the
# 2-core dev machine: the crossover sits near a few hundred groups for N = 5,000.
_SCALAR_SCAN_MAX_GROUPS = 256


def _as_sizes(sizes: Sequence[int] | IntArray) -> IntArray:
    arr = np.asarray(sizes, dtype=np.int64)
    if arr.ndim != 1 or arr.size == 0:
        raise InputError("must be a non-empty 1-D sequence", field="sizes")
    if np.any(arr <= 0):
        raise InputError("must be positive", field="sizes")
    return arr


def _check_groups(n: int, n_groups: int) -> None:
    if not 1 <= n_groups <= n:
        raise InputError(f"must be in [1, {n}], got {n_groups}", field="n_groups")


def group_sums(sizes: Sequence[int] | IntArray, starts: Sequence[int] | IntArray) -> IntArray:
    """Byte sum of each group of the partition ``starts``."""
    arr = _as_sizes(sizes)
    return np.add.reduceat(arr, np.asarray(starts, dtype=np.int64))


@dataclass(frozen=True, kw_only=True, slots=True)
class MaxMinTable:
    """``MaxMinSize`` of every suffix for every group count up to ``max_groups``.

    ``value[r - 1, i]`` is ``MaxMinSize(chain[i:], r)`` (``-1`` where ``r > N - i``, the paper's
    ``-inf``); ``cut[r - 1, i]`` is the end (exclusive) of the first group of the optimal
    partition of that suffix.
    """

    value: IntArray
    cut: IntArray

    @property
    def max_groups(self) -> int:
        return int(self.value.shape[0])

    def partition(self, n_groups: int) -> IntArray:
        """Group starts of the paper's optimal partition of the whole chain into ``n_groups``."""
        n = self.value.shape[1]
        if not 1 <= n_groups <= min(n, self.max_groups):
            raise InputError(
                f"must be in [1, {min(n, self.max_groups)}], got {n_groups}", field="n_groups"
            )
        starts = np.empty(n_groups, dtype=np.int64)
        i = 0
        for r in range(n_groups, 0, -1):
            starts[n_groups - r] = i
            i = int(self.cut[r - 1, i])
        return starts


def max_min_table(sizes: Sequence[int] | IntArray, max_groups: int | None = None) -> MaxMinTable:
    """The paper's DP for every ``R <= max_groups`` (default: N). O(N^2) time per layer.

    Memory is O(N * max_groups) for the table plus one O(N^2) scratch matrix per layer, so this is
    the reference for chains of up to a few thousand tensors; ``max_min_bisect`` scales further.
    """
    arr = _as_sizes(sizes)
    n = int(arr.size)
    rmax = n if max_groups is None else max_groups
    _check_groups(n, rmax)
    prefix = np.concatenate(([0], np.cumsum(arr)))
    value = np.full((rmax, n + 1), -1, dtype=np.int64)
    cut = np.full((rmax, n + 1), n, dtype=np.int64)
    value[0, :n] = prefix[n] - prefix[:n]
    # seg[i, k] = sum of chain[i:k] for k > i; first-group ends k range over 1..n.
    idx = np.arange(n + 1)
    seg = prefix[None, :] - prefix[:, None]
    valid_end = idx[None, :] > idx[:, None]
    for r in range(2, rmax + 1):
        prev = value[r - 2]
        # A suffix i..n splits as chain[i:k] + (r-1 groups of chain[k:]); prev[k] == -1 marks
        # suffixes too short for r-1 groups, which min() then keeps out of the max.
        cand = np.where(valid_end, np.minimum(seg, prev[None, :]), -1)
        # argmax returns the first maximum: the shortest first group, as Alg. 1's strict `<`.
        best_k = np.argmax(cand, axis=1)
        best = cand[idx, best_k]
        feasible = (n - idx) >= r
        value[r - 1] = np.where(feasible, best, -1)
        cut[r - 1] = np.where(feasible, best_k, n)
    return MaxMinTable(value=value, cut=cut)


def max_min_dp(sizes: Sequence[int] | IntArray, n_groups: int) -> tuple[int, IntArray]:
    """``MaxMinSize(chain, R)`` and the paper's partition, by the iterative DP."""
    arr = _as_sizes(sizes)
    _check_groups(int(arr.size), n_groups)
    table = max_min_table(arr, n_groups)
    return int(table.value[n_groups - 1, 0]), table.partition(n_groups)


def _greedy_count_scalar(prefix: list[int], m: int, need: int) -> int:
    """Greedy groups of sum >= m, counting up to ``need`` (stops early)."""
    n = len(prefix) - 1
    count = 0
    i = 0
    while count < need:
        k = bisect.bisect_left(prefix, prefix[i] + m, i + 1)
        if k > n:
            break
        count += 1
        i = k
    return count


def _greedy_count_vector(prefix: IntArray, m: int) -> int:
    """Greedy groups of sum >= m by pointer doubling over ``next[i]`` (O(N log N) numpy)."""
    n = prefix.size - 1
    # nxt[i] = end of the greedy group starting at i; n + 1 is the absorbing "no full group".
    nxt = np.searchsorted(prefix, prefix[:n] + m, side="left")
    nxt = np.concatenate((nxt, [n + 1, n + 1])).astype(np.int64)  # rows for n and n + 1
    nxt[n] = n + 1
    count = 0
    pos = 0
    # Binary lifting: jumps[j] = position after 2^j greedy groups.
    jumps = [nxt]
    while (1 << len(jumps)) <= n:
        j = jumps[-1]
        jumps.append(j[j])
    for level in range(len(jumps) - 1, -1, -1):
        target = int(jumps[level][pos])
        if target <= n:
            pos = target
            count += 1 << level
    return count


def max_min_bisect(
    sizes: Sequence[int] | IntArray,
    n_groups: int,
    *,
    bracket: tuple[int, int] | None = None,
) -> tuple[int, IntArray]:
    """``MaxMinSize(chain, R)`` and a greedy partition attaining it, by binary search on m.

    ``bracket = (lo, hi)``, when given, must contain the answer; the R sweep passes the values of
    already-solved neighbours (``MaxMinSize`` is non-increasing in R), which cuts most searches
    to a few steps. Both ends are checked (an infeasible ``lo`` or a feasible ``hi + 1`` widens
    the search back to the full range), so a wrong bracket costs time, never correctness.
    """
    arr = _as_sizes(sizes)
    n = int(arr.size)
    _check_groups(n, n_groups)
    prefix_arr = np.concatenate(([0], np.cumsum(arr))).astype(np.int64)
    total = int(prefix_arr[-1])
    scalar = n_groups <= _SCALAR_SCAN_MAX_GROUPS
    prefix_list = prefix_arr.tolist() if scalar else []

    def feasible(m: int) -> bool:
        if scalar:
            return _greedy_count_scalar(prefix_list, m, n_groups) >= n_groups
        return _greedy_count_vector(prefix_arr, m) >= n_groups

    # Each greedy group is < m + max_size, so c(m) >= R whenever R * (m + max_size) <= total:
    # this narrows the search from [1, total // R] to a window of width max_size.
    hi = total // n_groups
    lo = max(1, hi - int(arr.max()))
    full_hi = hi
    if bracket is not None:
        lo = max(lo, bracket[0])
        hi = max(lo, min(hi, bracket[1]))
    if not feasible(lo):
        lo = 1
        hi = full_hi
    elif hi < full_hi and feasible(hi + 1):
        hi = full_hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if feasible(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo, greedy_partition(prefix_arr, lo, n_groups)


def greedy_partition(prefix: IntArray, m: int, n_groups: int) -> IntArray:
    """First ``R - 1`` greedy groups of sum >= m, then the rest (requires ``c(m) >= R``)."""
    n = prefix.size - 1
    # One vectorised search for every group end, then a walk over a Python list (a scalar
    # numpy call per group would cost ~1 us each, which dominates at thousands of groups).
    nxt = np.searchsorted(prefix, prefix[:n] + m, side="left").tolist()
    starts = [0] * n_groups
    i = 0
    for g in range(1, n_groups):
        i = nxt[i]
        starts[g] = i
    return np.asarray(starts, dtype=np.int64)


def brute_force_max_min(sizes: Sequence[int], n_groups: int) -> int:
    """Max-min over every contiguous partition (2^(N-1) of them): the test reference."""
    from itertools import combinations

    n = len(sizes)
    _check_groups(n, n_groups)
    prefix = [0]
    for s in sizes:
        prefix.append(prefix[-1] + int(s))
    best = -1
    for inner in combinations(range(1, n), n_groups - 1):
        bounds = (0, *inner, n)
        best = max(best, min(prefix[b] - prefix[a] for a, b in itertools.pairwise(bounds)))
    return best
