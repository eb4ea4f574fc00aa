"""The fast grid search of ``bytescheduler-tuned``: the same choice as replaying every grid point.

``bytescheduler-tuned`` cuts every tensor into ``partition`` slices (priority: the tensor's rank in
layer order) and replays every (partition, credit) point, keeping the smallest key
``(iteration_us, comm_busy_us, credit, -partition)``. Replaying each point through
:func:`pace.sim.simulate` builds one :class:`~pace.ir.Unit` per slice, indexes it and runs a heap
per unit; on a 2,000-tensor trace that is 72 replays of up to 2**16 units. This module makes the
same choice, bit for bit, much faster:

* **No unit objects.** A partition is described per tensor (slice count, the cost of a full
  slice, the cost of the last one); units are built only for the chosen point.
* **Tensor-level replays.** All slices of a tensor share its priority and release time, and every
  full slice costs the same, so the channel is replayed with a heap of *tensors*:
  :func:`serial_partition_replay` (credit 1) runs a tensor's slices back to back until the next
  release, and :func:`shared_partition_replay` (credit > 1, processor sharing in virtual time)
  keeps a heap only of the few units in flight. Both perform exactly the floating-point
  operations of the simulator's replays in the same order (``pace.replay.serial_replay`` and
  ``pace.sim.channels.shared_static_replay``), so times, and hence keys, are identical.
* **Exact pruning.** For every partition, :func:`partition_lower_bounds` gives a lower bound on
  the iteration of every credit (see there). Partitions are visited by ascending bound, and one
  whose bound exceeds the best iteration found so far (with a relative margin far above the
  rounding of either side) cannot hold the minimum and is skipped. The minimum of a total order
  does not depend on the visiting order, so the choice is the one of the full grid.

Anything outside this fast path (one compute stream, zero-byte tensors, non-positive costs,
more than 2**53 bytes) falls back to replaying every point with ``simulate``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pace.analysis import TraceAnalysis

_INF = math.inf
# Pruning margin: a partition is skipped only if its bound exceeds the best iteration by this
# relative amount. Both sides are sums of at most ~1e6 floating-point terms (relative error
# < 1e-9), so the margin keeps pruning exact while costing nothing measurable.
PRUNE_REL_MARGIN = 1e-7
# Tail thresholds tried by the lower bound (besides "no tail", the channel's own end).
_BOUND_THETAS = 48


@dataclass(frozen=True, slots=True, eq=False)
class Partition:
    """Every tensor cut into ``part``-byte slices, described per tensor in rank order.

    Rank ``r`` is the tensor ``order[r]``; its slices (priority ``r``) are ``count[r]`` units, all
    of cost ``full_cost_us`` and ``part`` bytes except the last (``last_cost_us[r]``,
    ``last_bytes[r]``).
    """

    part: int
    order: tuple[int, ...]
    count: list[int]
    full_cost_us: float
    last_cost_us: list[float]
    last_bytes: list[int]
    release_us: list[float]
    # Ranks by (release, rank): the order the simulator pushes units into its ready heap.
    release_order: list[int]
    units: int


def make_partition(analysis: TraceAnalysis, order: Sequence[int], part: int) -> Partition:
    """The per-tensor description of ``partition_units(analysis, order, part)``."""
    comm = analysis.trace.comm
    alpha = float(comm.alpha_us)
    beta = float(comm.beta_us_per_byte)
    sizes = analysis.size_bytes
    rel_all = analysis.release_us
    count: list[int] = []
    last_cost: list[float] = []
    last_bytes: list[int] = []
    release: list[float] = []
    for k in order:
        size = sizes[k]
        n = -(-size // part)
        lb = size - (n - 1) * part
        count.append(n)
        last_bytes.append(lb)
        # The simulator's cost of a unit: alpha + beta * (its bytes), an int.
        last_cost.append(alpha + beta * lb)
        release.append(rel_all[k])
    rel_order = sorted(range(len(release)), key=release.__getitem__)
    return Partition(
        part=part,
        order=tuple(order),
        count=count,
        full_cost_us=alpha + beta * part,
        last_cost_us=last_cost,
        last_bytes=last_bytes,
        release_us=release,
        release_order=rel_order,
        units=sum(count),
    )


@dataclass(frozen=True, slots=True)
class ReplayTimes:
    """What the tuned key and the window need from one replay."""

    comm_end_us: float
    busy_us: float
    # Per rank: when the tensor's last slice finished.
    done_us: list[float]


def serial_partition_replay(p: Partition) -> ReplayTimes:
    """``pace.replay.serial_replay`` of the partition's units (credit 1), per tensor.

    The ready unit with the smallest (priority, index) is the next slice of the ready tensor of
    smallest rank, so the channel runs that tensor's slices back to back until a release
    happens at or before a slice's start, then picks again. ``t`` accumulates exactly the unit
    costs the unit-level replay adds, in the same order. Channel busy time: its busy periods,
    summed in time order, as ``merge_intervals`` of back-to-back intervals gives.
    """
    n = len(p.count)
    rel = p.release_us
    rorder = p.release_order
    count = p.count
    c_full = p.full_cost_us
    c_last = p.last_cost_us
    left = list(count)
    done = [0.0] * n
    heap: list[int] = []
    push = heapq.heappush
    pop = heapq.heappop
    periods: list[float] = []
    period_start = 0.0
    started = False
    t = 0.0
    i = 0
    while i < n or heap:
        if not heap:
            r = rel[rorder[i]]
            if r > t or not started:
                if started:
                    periods.append(t - period_start)
                period_start = r if r > t else t
                started = True
            t = max(t, r)
        while i < n and rel[rorder[i]] <= t:
            push(heap, rorder[i])
            i += 1
        k = heap[0]
        nxt = rel[rorder[i]] if i < n else _INF
        m = left[k]
        # Slices of k start while no new release is due (each start re-checks the releases).
        while True:
            if m > 1:
                t += c_full
            else:
                t += c_last[k]
            m -= 1
            if m == 0 or nxt <= t:
                break
        left[k] = m
        if m == 0:
            pop(heap)
            done[k] = t
    if started:
        periods.append(t - period_start)
    return ReplayTimes(comm_end_us=t if started else 0.0, busy_us=sum(periods), done_us=done)


def shared_partition_replay(
    p: Partition, credit: int | None, credit_bytes: int | None = None
) -> ReplayTimes:
    """``pace.sim.channels.shared_static_replay`` of the partition's units, per tensor.

    The waiting heap holds tensors (the next unit of the smallest rank is that tensor's next
    slice); the in-flight heap holds units. Every virtual-time and real-time update is the
    unit-level replay's expression, evaluated at the same events.
    """
    n = len(p.count)
    units = p.units
    rel = p.release_us
    rorder = p.release_order
    count = p.count
    c_full = p.full_cost_us
    part = p.part
    c_last = p.last_cost_us
    b_last = p.last_bytes
    started_of = [0] * n
    done = [0.0] * n
    s_list = [0.0] * units
    f_list = [0.0] * units
    seq = 0
    max_units = credit if credit is not None else units + 1
    max_bytes: float = credit_bytes if credit_bytes is not None else _INF
    in_flight_bytes = 0
    waiting: list[int] = []
    flight: list[tuple[float, int, int, int]] = []  # (virtual finish, seq, rank, bytes)
    push = heapq.heappush
    pop = heapq.heappop
    t = 0.0
    v = 0.0
    i = 0
    while True:
        while i < n and rel[rorder[i]] <= t:
            push(waiting, rorder[i])
            i += 1
        while waiting and len(flight) < max_units and in_flight_bytes < max_bytes:
            k = waiting[0]
            j = started_of[k] + 1
            if j == count[k]:
                pop(waiting)
                cost = c_last[k]
                b = b_last[k]
            else:
                cost = c_full
                b = part
            started_of[k] = j
            s_list[seq] = t
            in_flight_bytes += b
            push(flight, (v + cost, seq, k, b))
            seq += 1
        t_release = rel[rorder[i]] if i < n else _INF
        nf = len(flight)
        t_finish = t + (flight[0][0] - v) * nf if nf else _INF
        if t_finish == _INF and t_release == _INF:
            break
        if t_release < t_finish:
            if nf:
                v += (t_release - t) / nf
            t = t_release
            continue
        v = flight[0][0]
        t = t_finish
        while flight and flight[0][0] <= v:
            _, sq, k, b = pop(flight)
            f_list[sq] = t
            done[k] = t
            in_flight_bytes -= b
    comm_end = max(f_list, default=0.0)
    return ReplayTimes(comm_end_us=comm_end, busy_us=_busy(s_list, f_list), done_us=done)


def _busy(starts: list[float], finishes: list[float]) -> float:
    """``core.covered_us(intervals)`` for intervals listed by start time.

    ``merge_intervals`` sorts by (start, finish); intervals that share a start merge the same
    way in any order, so the order by start suffices. Skips empty intervals, joins an interval
    that starts at or before the running end, and sums the merged lengths left to right.
    """
    if not starts:
        return 0
    s = np.asarray(starts)
    f = np.asarray(finishes)
    keep = f > s
    s = s[keep]
    f = f[keep]
    if not len(s):
        return 0
    run = np.maximum.accumulate(f)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run[:-1]
    first = np.flatnonzero(new)
    ends = np.empty(len(first))
    ends[:-1] = run[first[1:] - 1]
    ends[-1] = run[-1]
    lengths: list[float] = (ends - s[first]).tolist()
    return sum(lengths)


def iteration_of(analysis: TraceAnalysis, p: Partition, times: ReplayTimes, barrier: bool) -> float:
    """The simulator's window for these tensor done times (``pace.replay.window_us``)."""
    comm_end = times.comm_end_us
    it = max(analysis.critical_path_us, comm_end)
    tail = analysis.tail_us
    done = times.done_us
    for r, k in enumerate(p.order):
        x = done[r] + tail[k]
        it = max(it, x)
    if barrier and any(analysis.gated):
        it = max(it, comm_end + analysis.barrier_tail_us)
    return float(it)


def partition_lower_bounds(
    analysis: TraceAnalysis, parts: Sequence[int], barrier: bool
) -> list[float]:
    """A lower bound on the iteration of each partition, valid for every credit and byte window.

    Every slice of tensor ``k`` is ready at ``release_k`` and the channel's total rate is at
    most one (one unit at a time, or several sharing it), so for any set ``S`` of tensors the
    last of those released at or after ``r`` is done no earlier than ``r`` plus their total
    cost. With ``S`` = the tensors whose tail is at least ``theta`` the window is at least
    ``r + theta + cost(S, released >= r)``; with ``S`` = every tensor and no tail, the channel's
    end (plus the barrier tail under a barrier) is at least ``r + cost(released >= r)``. Takes
    the best over ``r`` and a few ``theta``; also the compute-only makespan.
    """
    comm = analysis.trace.comm
    alpha = float(comm.alpha_us)
    beta = float(comm.beta_us_per_byte)
    n = len(analysis.size_bytes)
    cp = float(analysis.critical_path_us)
    if n == 0:
        return [cp for _ in parts]
    rel = np.asarray(analysis.release_us, dtype=float)
    tail = np.asarray(analysis.tail_us, dtype=float)
    size = np.asarray(analysis.size_bytes, dtype=np.int64)
    o = np.argsort(rel, kind="stable")
    rel_s = rel[o]
    tail_s = tail[o]
    size_s = size[o]
    pa = np.asarray(parts, dtype=np.int64)[:, None]
    # Cost of all slices of each tensor; slice counts in exact integer arithmetic.
    counts = -(-size_s[None, :] // pa)
    w = counts.astype(float) * alpha + beta * size_s.astype(float)[None, :]

    def suffix(x: np.ndarray) -> np.ndarray:
        return np.cumsum(x[:, ::-1], axis=1)[:, ::-1]

    best = np.maximum(cp, (rel_s[None, :] + suffix(w)).max(axis=1))
    if barrier and any(analysis.gated):
        best = np.maximum(best, (rel_s[None, :] + suffix(w)).max(axis=1) + analysis.barrier_tail_us)
    uniq = np.unique(tail_s)
    if len(uniq) > _BOUND_THETAS:
        # Evenly spread over the distinct tails, always with the largest few.
        pick = np.unique(
            np.concatenate(
                [
                    np.linspace(0, len(uniq) - 1, _BOUND_THETAS // 2).round().astype(int),
                    np.arange(len(uniq) - _BOUND_THETAS // 2, len(uniq)),
                ]
            )
        )
        uniq = uniq[pick]
    for th in uniq:
        m = tail_s >= th
        s = suffix(np.where(m[None, :], w, 0.0))
        val = np.where(m[None, :], rel_s[None, :] + s, -np.inf).max(axis=1) + th
        best = np.maximum(best, val)
    out: list[float] = best.tolist()
    return out


def fast_path_ok(analysis: TraceAnalysis, parts: Sequence[int]) -> bool:
    """Whether the tensor-level replays apply (else replay every grid point with simulate)."""
    comm = analysis.trace.comm
    alpha = float(comm.alpha_us)
    beta = float(comm.beta_us_per_byte)
    sizes = analysis.size_bytes
    if not sizes or min(sizes) < 1 or sum(sizes) >= 2**53 or max(parts) >= 2**53:
        return False
    # The bound counts work; costs must not be negative.
    return math.isfinite(alpha) and math.isfinite(beta) and alpha >= 0 and beta >= 0
