"""Reduce a trace + fusion plan to a one-machine scheduling instance (PACE Sec. IV-B).

Each all-reduce job (a fusion group; one tensor per job without fusion) becomes a job of
``1 | r_j, pmtn | max(C_j + q_j)``:

* **release** ``r_j``: when the job's last member tensor is produced. By the paper's Lemma 1 no
  producer depends on any all-reduce, so this is the producer's finish time under ideal compute
  with no communication at all — a plain longest-path value of the op DAG.
* **tail** ``q_j``: the longest computation path that starts at a consumer of the job and runs to
  the end of the window (consumer's own duration included). Theorem 1: the window's makespan is
  ``max(compute-only makespan, max_j C_j + q_j)`` where ``C_j`` is the job's completion time.
  For a fused group the tail is the maximum over all members' consumers, since every consumer of
  every member waits for the whole group.

A tensor without consumers gets tail 0: its all-reduce must still end inside the window.

Both passes are a single sweep over a topological order (networkx), so a 50,000-op trace costs
tens of milliseconds; per-tensor values are cached per trace object, because the fusion search
asks for many plans of the same trace.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import networkx as nx
import numpy as np
import numpy.typing as npt

from pace.errors import InputError
from pace.ir import FusionPlan, Trace

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class TensorTiming:
    """Per-tensor release and tail, in the trace's tensor order (plan independent)."""

    names: tuple[str, ...]
    release_us: FloatArray
    tail_us: FloatArray
    size_bytes: IntArray
    need_us: FloatArray  # compute-only start of the earliest consumer (inf: no consumer)
    compute_makespan_us: float
    index: Mapping[str, int]
    element_bytes: IntArray  # partitions of tensor k start and end on multiples of this


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Reduction:
    """The scheduling instance of one (trace, plan) pair; job ``j`` is ``plan.groups[j]``.

    ``duration_us`` is the all-reduce time of the whole job as one call under the trace's cost
    model (``alpha + beta * size``). Arrays are read-only.
    """

    jobs: tuple[tuple[str, ...], ...]
    release_us: FloatArray
    tail_us: FloatArray
    size_bytes: IntArray
    duration_us: FloatArray
    compute_makespan_us: float
    tensors: TensorTiming

    @property
    def n_jobs(self) -> int:
        return len(self.jobs)


_A = TypeVar("_A", bound="np.ndarray[Any, Any]")


def _frozen(a: _A) -> _A:
    a.setflags(write=False)
    return a


# Small identity-keyed cache: traces are immutable, and the fusion search calls `reduction`
# once per candidate plan of the same trace object. Keyed by id() with the object kept alive in
# the value, so a recycled id can never return another trace's timing.
_CACHE: OrderedDict[int, tuple[Trace, TensorTiming]] = OrderedDict()
_CACHE_SIZE = 8


def tensor_timing(trace: Trace) -> TensorTiming:
    """Release and tail of every tensor of ``trace`` (cached per trace object).

    Raises ``InputError`` on an unknown op name, a dependency cycle, or a producer that depends
    (directly or transitively) on a consumer — the Lemma-1 rule the reduction relies on.
    """
    hit = _CACHE.get(id(trace))
    if hit is not None and hit[0] is trace:
        _CACHE.move_to_end(id(trace))
        return hit[1]
    timing = _compute_timing(trace)
    _CACHE[id(trace)] = (trace, timing)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return timing


def _compute_timing(trace: Trace) -> TensorTiming:
    names = [op.name for op in trace.ops]
    idx = {name: i for i, name in enumerate(names)}
    if len(idx) != len(names):
        raise InputError("duplicate op names", field="ops")
    n_ops = len(names)
    dur = [float(op.duration_us) for op in trace.ops]
    preds: list[list[int]] = [[] for _ in range(n_ops)]
    graph: nx.DiGraph[int] = nx.DiGraph()
    graph.add_nodes_from(range(n_ops))
    for i, op in enumerate(trace.ops):
        for k, dep in enumerate(op.deps):
            j = idx.get(dep)
            if j is None:
                raise InputError(f"op {dep!r} does not exist", field=f"ops[{i}].deps[{k}]")
            preds[i].append(j)
            graph.add_edge(j, i)
    try:
        order = list(nx.topological_sort(graph))
    except nx.NetworkXUnfeasible:
        cycle = " -> ".join(names[u] for u, _ in nx.find_cycle(graph))
        raise InputError(f"dependency cycle: {cycle}", field="ops") from None

    is_consumer = [False] * n_ops
    prod_idx: list[int] = []
    cons_idx: list[list[int]] = []
    for k, t in enumerate(trace.tensors):
        p = idx.get(t.producer)
        if p is None:
            raise InputError(f"op {t.producer!r} does not exist", field=f"tensors[{k}].producer")
        prod_idx.append(p)
        cs: list[int] = []
        for m, c in enumerate(t.consumers):
            ci = idx.get(c)
            if ci is None:
                raise InputError(f"op {c!r} does not exist", field=f"tensors[{k}].consumers[{m}]")
            cs.append(ci)
            is_consumer[ci] = True
        cons_idx.append(cs)

    # Forward sweep: compute-only finish times, and whether an op waits (transitively) on any
    # all-reduce — a producer that does breaks Lemma 1 and the whole reduction.
    finish = [0.0] * n_ops
    waits = [False] * n_ops
    for v in order:
        pv = preds[v]
        finish[v] = max([finish[u] for u in pv], default=0.0) + dur[v]
        waits[v] = is_consumer[v] or any(waits[u] for u in pv)
    # Backward sweep: longest path from an op's start to the end of the window.
    succs: list[list[int]] = [[] for _ in range(n_ops)]
    for v in range(n_ops):
        for u in preds[v]:
            succs[u].append(v)
    from_start = [0.0] * n_ops
    for v in reversed(order):
        from_start[v] = dur[v] + max([from_start[s] for s in succs[v]], default=0.0)

    n_t = len(trace.tensors)
    release = np.empty(n_t, dtype=np.float64)
    tail = np.zeros(n_t, dtype=np.float64)
    need = np.full(n_t, np.inf, dtype=np.float64)
    for k in range(n_t):
        p = prod_idx[k]
        if waits[p]:
            raise InputError(
                f"producer {names[p]!r} depends on an all-reduce consumer (Lemma 1)",
                field=f"tensors[{k}].producer",
            )
        release[k] = finish[p]
        if cons_idx[k]:
            tail[k] = max(from_start[c] for c in cons_idx[k])
            need[k] = min(finish[c] - dur[c] for c in cons_idx[k])
    size = np.fromiter((t.size_bytes for t in trace.tensors), dtype=np.int64, count=n_t)
    tnames = tuple(t.name for t in trace.tensors)
    tindex = {name: k for k, name in enumerate(tnames)}
    if len(tindex) != n_t:
        raise InputError("duplicate tensor names", field="tensors")
    return TensorTiming(
        names=tnames,
        release_us=_frozen(release),
        tail_us=_frozen(tail),
        size_bytes=_frozen(size),
        need_us=_frozen(need),
        compute_makespan_us=max(finish, default=0.0),
        index=tindex,
        element_bytes=_frozen(
            np.fromiter((t.element_bytes for t in trace.tensors), dtype=np.int64, count=n_t)
        ),
    )


def reduction(trace: Trace, plan: FusionPlan | None = None) -> Reduction:
    """The scheduling instance of ``trace`` under fusion ``plan`` (no fusion if ``None``).

    >>> from pace.synth import random_trace
    >>> red = reduction(random_trace(seed=1, n_layers=3, integer=True))
    >>> red.n_jobs == len(red.release_us) == len(red.tail_us)
    True
    """
    timing = tensor_timing(trace)
    if plan is None:
        jobs: tuple[tuple[str, ...], ...] = tuple((n,) for n in timing.names)
        release = timing.release_us.copy()
        tail = timing.tail_us.copy()
        size = timing.size_bytes.copy()
    else:
        jobs = tuple(tuple(g) for g in plan.groups)
        seen: set[str] = set()
        n_j = len(jobs)
        release = np.empty(n_j, dtype=np.float64)
        tail = np.empty(n_j, dtype=np.float64)
        size = np.empty(n_j, dtype=np.int64)
        for j, group in enumerate(jobs):
            if not group:
                raise InputError("empty fusion group", field=f"groups[{j}]")
            members = []
            for name in group:
                k = timing.index.get(name)
                if k is None:
                    raise InputError(f"tensor {name!r} does not exist", field=f"groups[{j}]")
                if name in seen:
                    raise InputError(f"tensor {name!r} in two groups", field=f"groups[{j}]")
                seen.add(name)
                members.append(k)
            m = np.asarray(members)
            release[j] = timing.release_us[m].max()
            tail[j] = timing.tail_us[m].max()
            size[j] = timing.size_bytes[m].sum()
        if len(seen) != len(timing.names):
            missing = next(n for n in timing.names if n not in seen)
            raise InputError(f"tensor {missing!r} is in no group", field="groups")
    comm = trace.comm
    duration = comm.alpha_us + comm.beta_us_per_byte * size.astype(np.float64)
    return Reduction(
        jobs=jobs,
        release_us=_frozen(release),
        tail_us=_frozen(tail),
        size_bytes=_frozen(size),
        duration_us=_frozen(duration),
        compute_makespan_us=timing.compute_makespan_us,
        tensors=timing,
    )
