"""The one replay kernel: a fixed list of units on one channel, under ideal compute.

This is the replay semantics of docs/schedule-format.md (the definition of a schedule's
``predicted_iteration_us``): one channel that, whenever it is free, starts the ready unit with
the smallest priority (ties in file order); a unit is ready once every tensor it carries is
produced and costs ``alpha_us + beta_us_per_byte * bytes``; a tensor is done when all its units
are. By Lemma 1 the release times do not depend on communication (``pace.analysis``), so the
channel is a priority list schedule (:func:`serial_replay`) and the window's makespan follows
from each tensor's completion and tail (:func:`window_us`, Theorem 1).

Everyone who replays units calls this: the simulator's static policies (``pace.sim``), the
scheduler scoring its candidates (``pace.lp``) and the robust selection replaying them in
jittered worlds.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from pace.analysis import TraceAnalysis
from pace.errors import InputError
from pace.ir import Unit

__all__ = [
    "UnitArrays",
    "index_units",
    "issue_ready_us",
    "iteration_us",
    "serial_replay",
    "start_order",
    "unit_copies",
    "updated_us",
    "window_us",
]


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class UnitArrays:
    """Units as index arrays against a :class:`~pace.analysis.TraceAnalysis`."""

    units: tuple[Unit, ...]
    priority: list[float]
    cost_us: list[float]
    size_bytes: list[int]
    # Distinct tensor indices per unit.
    tensors: list[tuple[int, ...]]
    # Per tensor: the units carrying it.
    units_of_tensor: list[list[int]]
    # Per unit: when it may be issued under ideal compute (max release of its tensors; with
    # ``in_order``, also no earlier than any unit before it in priority order).
    ready_us: list[float]
    # Units are issued strictly in priority order (DDP launches bucket i+1 only after bucket i).
    in_order: bool = False
    # Unit indices by (priority, file order).
    priority_order: tuple[int, ...] = ()
    # Per unit: the runtime's copy of its reduced buffer back into the gradients
    # (``comm.copy_us_per_byte``; 0 for a unit of one piece, reduced in place); empty where
    # the comm model has no copy cost.
    copy_us: tuple[float, ...] = ()


def index_units(
    analysis: TraceAnalysis, units: Sequence[Unit], *, in_order: bool = False
) -> UnitArrays:
    """Index ``units`` against ``analysis``; every tensor must be carried by at least one unit."""
    comm = analysis.trace.comm
    alpha = float(comm.alpha_us)
    beta = float(comm.beta_us_per_byte)
    copy_per_byte = float(comm.copy_us_per_byte)
    index = analysis.tensor_index
    release = analysis.release_us
    units_of_tensor: list[list[int]] = [[] for _ in analysis.tensor_names]
    priority: list[float] = []
    cost: list[float] = []
    sizes: list[int] = []
    tensors: list[tuple[int, ...]] = []
    ready: list[float] = []
    copy: list[float] = []
    for u, unit in enumerate(units):
        size = 0
        idx: list[int] = []
        for s, sl in enumerate(unit.slices):
            k = index.get(sl.tensor)
            if k is None:
                raise InputError(
                    f"tensor {sl.tensor!r} is not in the trace",
                    field=f"units[{u}].slices[{s}].tensor",
                )
            size += sl.size_bytes
            idx.append(k)
        if not idx:
            raise InputError("unit carries no slice", field=f"units[{u}].slices")
        distinct = tuple(dict.fromkeys(idx))
        for k in distinct:
            units_of_tensor[k].append(u)
        tensors.append(distinct)
        priority.append(float(unit.priority))
        cost.append(alpha + beta * size)
        sizes.append(size)
        copy.append(copy_per_byte * size if unit.fused else 0.0)
        ready.append(max(release[k] for k in distinct))
    for k, owners in enumerate(units_of_tensor):
        if not owners:
            raise InputError(
                f"tensor {analysis.tensor_names[k]!r} is carried by no unit", field="units"
            )
    porder = tuple(sorted(range(len(priority)), key=priority.__getitem__))
    if in_order:
        ready = issue_ready_us(ready, porder)
    return UnitArrays(
        units=tuple(units),
        priority=priority,
        cost_us=cost,
        size_bytes=sizes,
        tensors=tensors,
        units_of_tensor=units_of_tensor,
        ready_us=ready,
        in_order=in_order,
        priority_order=porder,
        # Empty without a copy cost: the replays of such traces (most) skip the pass.
        copy_us=tuple(copy) if copy_per_byte > 0 else (),
    )


def issue_ready_us(ready_us: Sequence[float], order: Sequence[int]) -> list[float]:
    """When a strict issuer can send each unit: once it is ready and every unit before it in
    ``order`` has been sent (no earlier than their ready times). With these times
    :func:`serial_replay` in ``order`` is the runtime's replay (strictly in priority order)."""
    out = list(ready_us)
    latest = 0.0
    for u in order:
        latest = max(latest, out[u])
        out[u] = latest
    return out


def start_order(start_us: Sequence[float], priority: Sequence[float]) -> list[int]:
    """Unit indices in the order a replay started them (ties: priority, then index): the
    priorities ``pace compile`` writes (``pace.compiler.in_issue_order``)."""
    return sorted(range(len(start_us)), key=lambda u: (start_us[u], priority[u], u))


def serial_replay(
    ready_us: Sequence[float], cost_us: Sequence[float], priority: Sequence[float]
) -> tuple[list[float], list[float]]:
    """Start and finish of each unit: one channel, smallest ``priority`` first among the ready
    ones, ties in list order. A single pass over the units by ready time with a heap."""
    n = len(ready_us)
    order = sorted(range(n), key=ready_us.__getitem__)
    start = [0.0] * n
    finish = [0.0] * n
    heap: list[tuple[float, int]] = []
    push = heapq.heappush
    pop = heapq.heappop
    t = 0.0
    i = 0
    while i < n or heap:
        if not heap:
            r = ready_us[order[i]]
            t = max(t, r)
        while i < n and ready_us[order[i]] <= t:
            u = order[i]
            push(heap, (priority[u], u))
            i += 1
        u = pop(heap)[1]
        start[u] = t
        t += cost_us[u]
        finish[u] = t
    return start, finish


def window_us(
    compute_makespan_us: float, done_us: Sequence[float], tail_us: Sequence[float]
) -> float:
    """Theorem 1: the window ends with the compute-only makespan or with the last tensor done
    plus the longest computation that waits for it, whichever is later."""
    makespan = compute_makespan_us
    for d, q in zip(done_us, tail_us, strict=True):
        v = d + q
        makespan = max(makespan, v)
    return makespan


def tensor_done_us(arrays: UnitArrays, finish_us: Sequence[float]) -> list[float]:
    """When each tensor is done: its last unit's finish."""
    return [max(finish_us[u] for u in owners) for owners in arrays.units_of_tensor]


def unit_copies(arrays: UnitArrays, finish_us: Sequence[float]) -> list[tuple[float, float]]:
    """``(finish_us, copy_us)`` of every unit whose completion copies its buffer back."""
    return [(finish_us[u], c) for u, c in enumerate(arrays.copy_us) if c > 0]


def updated_us(
    done_us: Sequence[float],
    size_bytes: Sequence[int],
    update_us_per_byte: float,
    copies: Sequence[tuple[float, float]] = (),
) -> list[float]:
    """When each reduced tensor reaches its consumers. pace's runtime completes units on one
    thread, one after the other: at each completion it copies a fused unit's buffer back into
    its gradients (``copies``: ``(finish_us, copy_us)`` per unit, ``comm.copy_us_per_byte``),
    then updates the tensors the completion finishes (``comm.update_us_per_byte`` per byte;
    the overlapped mode's optimizer step). Tensors done at the same instant are one completion,
    after every copy of that instant. With neither cost, ``done_us``. Reductions never wait for
    this thread, so the pass over their ends is exact under ideal compute (Lemma 1)."""
    if update_us_per_byte <= 0 and not copies:  # no copy on the hot path: callers only read
        return done_us if isinstance(done_us, list) else list(done_us)
    out = list(done_us)
    work: dict[float, float] = {}  # per completion instant: the thread's work, us
    members: dict[float, list[int]] = {}
    for t, c in copies:
        work[t] = work.get(t, 0.0) + c
    for k, t in enumerate(done_us):
        work[t] = work.get(t, 0.0) + update_us_per_byte * size_bytes[k]
        members.setdefault(t, []).append(k)
    free = 0.0  # when the completion thread is next idle
    for t in sorted(work):
        free = max(free, t) + work[t]
        for k in members.get(t, ()):
            out[k] = free
    return out


def iteration_us(analysis: TraceAnalysis, units: Sequence[Unit]) -> float:
    """The contract's replay of ``units`` (``predicted_iteration_us``), with no timeline."""
    arrays = index_units(analysis, units)
    _, finish = serial_replay(arrays.ready_us, arrays.cost_us, arrays.priority)
    done = updated_us(
        tensor_done_us(arrays, finish),
        analysis.size_bytes,
        analysis.trace.comm.update_us_per_byte,
        unit_copies(arrays, finish),
    )
    return window_us(analysis.critical_path_us, done, analysis.tail_us)
