"""Exact solver of ``1 | r_j, pmtn | max(C_j + q_j)``: preemptive largest-tail-first.

Horn (1974): at every moment run, among the released unfinished jobs, one with the largest tail
``q_j``. The only moments that matter are releases, so the schedule is built with one heap in
``O(N log N)``; it is optimal in continuous time, and its value equals Carlier's bound
``max over job sets J of (min r + sum p + min q)``. Ties keep the running job (no needless
preemption).

Two optional knobs turn it into the overhead-aware planner used by extraction (they make the
schedule a heuristic, no longer optimal for the cost model with per-call latency):

* ``preempt_cost_us``: a preempted job pays this again when it resumes (one more all-reduce
  call, ``alpha``), so planned piece times match what the replay will do;
* ``min_remaining_us``: preempt only if the running job still has more than this left — a job
  about to finish is cheaper to finish than to split;
* ``min_piece_us``: a running piece is not preempted before it has run this long (with a
  per-call latency ``alpha`` a piece shorter than ``alpha + beta`` carries no byte); a more urgent
  job then waits until the piece reaches that length.

The fusion search calls this thousands of times, so it is plain Python over lists (faster than
numpy at these sizes) and returns compact tuples.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from pace.errors import InputError

Piece = tuple[int, float, float]
"""``(job, start_us, end_us)``: one uninterrupted stretch of one job on the channel."""


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class ExactSolution:
    """A preemptive schedule: ``pieces`` in time order, completion time per job.

    ``makespan_us = max(compute_makespan_us, max_j completion_us[j] + tail_us[j])``.
    """

    pieces: tuple[Piece, ...]
    completion_us: tuple[float, ...]
    makespan_us: float
    preemptions: int


def solve_exact(
    release_us: Sequence[float] | npt.NDArray[Any],
    duration_us: Sequence[float] | npt.NDArray[Any],
    tail_us: Sequence[float] | npt.NDArray[Any],
    *,
    compute_makespan_us: float = 0.0,
    preempt_cost_us: float = 0.0,
    min_remaining_us: float = 0.0,
    min_piece_us: float = 0.0,
    grace_us: Sequence[float] | npt.NDArray[Any] | None = None,
) -> ExactSolution:
    """Optimal preemptive schedule of one channel (largest tail first).

    ``grace_us[j]`` (optional): job ``j`` may preempt a running job only ``grace_us[j]`` after
    its release. The planned piece then ends *after* the urgent job is ready, so a release that
    comes slightly late under timing jitter still finds the channel busy with the same piece
    (instead of a fresh, large piece of the preempted job that it would wait behind).

    >>> s = solve_exact([10, 20], [20, 4], [5, 10], compute_makespan_us=30)
    >>> s.pieces
    ((0, 10.0, 20.0), (1, 20.0, 24.0), (0, 24.0, 34.0))
    >>> s.makespan_us
    39.0
    """
    r = [float(x) for x in release_us]
    p = [float(x) for x in duration_us]
    q = [float(x) for x in tail_us]
    n = len(r)
    if len(p) != n or len(q) != n:
        raise InputError("release_us, duration_us and tail_us must have the same length")
    g = [0.0] * n if grace_us is None else [float(x) for x in grace_us]
    if len(g) != n:
        raise InputError("must have one value per job", field="grace_us")
    order = sorted(range(n), key=r.__getitem__)
    remaining = p[:]
    completion = [math.nan] * n
    pieces: list[Piece] = []
    heap: list[tuple[float, int]] = []
    push = heapq.heappush
    pop = heapq.heappop
    t = 0.0
    k = 0
    cur = -1
    cur_start = 0.0
    preemptions = 0
    while True:
        if cur < 0:
            if not heap:
                if k >= n:
                    break
                rk = r[order[k]]
                t = max(t, rk)
            while k < n and r[order[k]] <= t:
                j = order[k]
                push(heap, (-q[j], j))
                k += 1
            cur = pop(heap)[1]
            cur_start = t
        end = t + remaining[cur]
        ev = r[order[k]] if k < n else math.inf
        if heap and -heap[0][0] > q[cur]:
            # A more urgent job waits only because the running piece is still too short to
            # carry a byte: revisit the decision when it is long enough.
            top = heap[0][1]
            pt = max(cur_start + min_piece_us, r[top] + g[top])
            if t < pt < ev:
                ev = pt
        if ev < end:
            remaining[cur] -= ev - t
            t = ev
            while k < n and r[order[k]] <= t:
                j = order[k]
                push(heap, (-q[j], j))
                k += 1
            if (
                -heap[0][0] > q[cur]
                and remaining[cur] > min_remaining_us
                # The same sum as the revisit time above: ``t - cur_start`` can round below
                # ``min_piece_us`` at that very time, and the urgent job would never preempt.
                and t >= cur_start + min_piece_us
                and t >= r[heap[0][1]] + g[heap[0][1]]
            ):
                pieces.append((cur, cur_start, t))
                remaining[cur] += preempt_cost_us
                push(heap, (-q[cur], cur))
                preemptions += 1
                cur = -1
            continue
        t = end
        remaining[cur] = 0.0
        completion[cur] = t
        pieces.append((cur, cur_start, t))
        cur = -1
    makespan = max([c + qj for c, qj in zip(completion, q, strict=True)], default=-math.inf)
    makespan = max(makespan, compute_makespan_us)
    return ExactSolution(
        pieces=tuple(pieces),
        completion_us=tuple(completion),
        makespan_us=makespan,
        preemptions=preemptions,
    )
