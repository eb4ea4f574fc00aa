"""The one analysis of a trace: index maps, topological order, compute-only times, releases, tails.

Every stage that reasons about a trace's timing reads it from here: the simulator (its replays),
the scheduler (``pace.lp.reduction``), the jittered replays of the robust selection, the
timeline's colours and drift's ideal-compute spans. Nothing else sorts the op DAG.

Because the trace format guarantees the Lemma-1 rule (no producer depends on any consumer), a
producer's finish time never depends on communication under ideal compute. A replay therefore
splits in two: tensor release times come from the compute-only schedule computed here, the
channel is replayed on its own (``pace.replay``), and the window's makespan is
``max(compute-only makespan, max_t done_t + tail_t)`` where ``tail_t`` is the longest path from
the start of any consumer of ``t`` to the end of the window (Theorem 1).

:func:`analyze` caches one :class:`TraceAnalysis` per trace object (thread-safe: the runtime's
background re-planner compiles while the main thread may replay), and
:meth:`TraceAnalysis.memo` keeps structures derived from it (the scheduler's tensor timing, the
jittered worlds) with it, so there is one cache in the whole pipeline.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pace.errors import InputError
from pace.ir import Trace

__all__ = ["TraceAnalysis", "analyze", "compute_sweeps"]

T = TypeVar("T")
V = TypeVar("V")

# Traces kept alive by the cache; each entry holds the trace itself so its id is never reused
# while the entry exists.
_CACHE_SIZE = 16
_cache: OrderedDict[int, tuple[Trace, TraceAnalysis]] = OrderedDict()
_lock = threading.Lock()


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class TraceAnalysis:
    """Everything about a trace that does not depend on communication. Build with
    :func:`analyze` (cached). Op fields are aligned with ``trace.ops``, tensor fields with
    ``trace.tensors``."""

    trace: Trace
    op_names: tuple[str, ...]
    op_index: dict[str, int]
    tensor_names: tuple[str, ...]
    tensor_index: dict[str, int]
    duration_us: list[float]
    deps: tuple[tuple[int, ...], ...]
    children: tuple[tuple[int, ...], ...]
    # Ops in topological order (Kahn's algorithm, ties in trace order).
    topo: tuple[int, ...]
    # Per op: tensors it consumes (waits for); per op: tensors it produces.
    consumes: tuple[tuple[int, ...], ...]
    produces: tuple[tuple[int, ...], ...]
    is_forward: tuple[bool, ...]
    # Forward ops that a global barrier holds back: every forward op that is not an ancestor of
    # (or equal to) a producer. Holding back an ancestor of a producer would deadlock the window.
    gated: tuple[bool, ...]
    producer: tuple[int, ...]
    consumers: tuple[tuple[int, ...], ...]
    size_bytes: tuple[int, ...]
    element_bytes: tuple[int, ...]
    fusion_kind: tuple[tuple[int, str], ...]  # per tensor: ``Tensor.fusion_kind``
    # Compute-only schedule (no communication at all): earliest start / finish of each op.
    es_us: list[float]
    ef_us: list[float]
    critical_path_us: float
    # Longest path from the start of each op to the end of the window (its duration included).
    op_tail_us: list[float]
    # Per tensor: ready time (producer finish under ideal compute) and tail of its consumers.
    release_us: list[float]
    tail_us: list[float]
    # Largest tail of a gated op: the window cannot end before comm_end + this under a barrier.
    barrier_tail_us: float
    # Tensors by ready time, ties in trace order (the order WFBP enqueues them).
    ready_order: tuple[int, ...]
    # Per tensor: compute-only start of its earliest consumer (inf if it has none): when the
    # next forward pass needs it. Sorting by it gives "layer order".
    need_us: list[float]
    _memo: dict[Any, Any] = field(default_factory=dict, repr=False)
    _memo_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def memo(self, key: Any, build: Callable[[TraceAnalysis], V]) -> V:
        """``build(self)``, computed once per ``key`` and kept with this analysis."""
        with self._memo_lock:
            if key in self._memo:
                return self._memo[key]  # type: ignore[no-any-return]
        value = build(self)
        with self._memo_lock:
            # Another thread may have built it meanwhile: keep the first, the values are equal.
            return self._memo.setdefault(key, value)  # type: ignore[no-any-return]


def analyze(trace: Trace) -> TraceAnalysis:
    """The cached :class:`TraceAnalysis` of ``trace`` (computed on first use).

    Raises ``InputError`` (naming the field) on duplicate or unknown names, a dependency cycle,
    or a consumer that is an ancestor of a producer (Lemma 1).
    """
    key = id(trace)
    with _lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] is trace:
            _cache.move_to_end(key)
            return hit[1]
    analysis = _build(trace)
    with _lock:
        _cache[key] = (trace, analysis)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return analysis


def compute_sweeps(
    topo: Sequence[int],
    deps: Sequence[Sequence[int]],
    children: Sequence[Sequence[int]],
    duration: Sequence[T],
    *,
    zero: T,
    maximum: Callable[[T, T], T],
) -> tuple[list[T], list[T], list[T]]:
    """Compute-only (ideal, no communication) op times: per op its earliest start and finish,
    and the longest path from its start to the end of the window (its own duration included).

    Generic over the value type: floats (``maximum=max``) for the trace itself, or numpy
    vectors of one value per jittered world (``maximum=numpy.maximum``) for many copies at once,
    so the sweep exists once.
    """
    n = len(duration)
    start: list[T] = [zero] * n
    finish: list[T] = [zero] * n
    for i in topo:
        s = zero
        for j in deps[i]:
            s = maximum(s, finish[j])
        start[i] = s
        finish[i] = s + duration[i]  # type: ignore[operator]
    from_start: list[T] = [zero] * n
    for i in reversed(topo):
        m = zero
        for c in children[i]:
            m = maximum(m, from_start[c])
        from_start[i] = duration[i] + m  # type: ignore[operator]
    return start, finish, from_start


def _index_ops(trace: Trace) -> tuple[dict[str, int], list[tuple[int, ...]]]:
    op_index: dict[str, int] = {}
    for i, op in enumerate(trace.ops):
        if op.name in op_index:
            raise InputError(f"duplicate op name {op.name!r}", field=f"ops[{i}].name")
        op_index[op.name] = i
    deps: list[tuple[int, ...]] = []
    for i, op in enumerate(trace.ops):
        row: list[int] = []
        for d in op.deps:
            j = op_index.get(d)
            if j is None:
                raise InputError(f"op {d!r} does not exist", field=f"ops[{i}].deps")
            row.append(j)
        deps.append(tuple(dict.fromkeys(row)))
    return op_index, deps


def _topological(trace: Trace, deps: Sequence[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """(children, topological order); Kahn's algorithm with ties in trace order."""
    n = len(deps)
    children_l: list[list[int]] = [[] for _ in range(n)]
    for i, row in enumerate(deps):
        for j in row:
            children_l[j].append(i)
    indeg = [len(r) for r in deps]
    queue = deque(i for i in range(n) if indeg[i] == 0)
    topo: list[int] = []
    while queue:
        i = queue.popleft()
        topo.append(i)
        for c in children_l[i]:
            indeg[c] -= 1
            if indeg[c] == 0:
                queue.append(c)
    if len(topo) != n:
        stuck = next(i for i in range(n) if indeg[i] > 0)
        raise InputError(f"dependency cycle through op {trace.ops[stuck].name!r}", field="ops")
    return (*(tuple(c) for c in children_l), tuple(topo))


def _build(trace: Trace) -> TraceAnalysis:
    ops = trace.ops
    n = len(ops)
    op_index, deps = _index_ops(trace)
    *children_t, topo = _topological(trace, deps)
    children = tuple(children_t)

    tensor_index: dict[str, int] = {}
    producer: list[int] = []
    consumers: list[tuple[int, ...]] = []
    consumes_l: list[list[int]] = [[] for _ in range(n)]
    produces_l: list[list[int]] = [[] for _ in range(n)]
    for k, t in enumerate(trace.tensors):
        if t.name in tensor_index:
            raise InputError(f"duplicate tensor name {t.name!r}", field=f"tensors[{k}].name")
        tensor_index[t.name] = k
        p = op_index.get(t.producer)
        if p is None:
            raise InputError(f"op {t.producer!r} does not exist", field=f"tensors[{k}].producer")
        producer.append(p)
        produces_l[p].append(k)
        row = []
        for c_name in t.consumers:
            ci = op_index.get(c_name)
            if ci is None:
                raise InputError(f"op {c_name!r} does not exist", field=f"tensors[{k}].consumers")
            row.append(ci)
        cons = tuple(dict.fromkeys(row))
        consumers.append(cons)
        for c in cons:
            consumes_l[c].append(k)

    dur = [float(op.duration_us) for op in ops]
    es, ef, op_tail = compute_sweeps(topo, deps, children, dur, zero=0.0, maximum=max)
    cp = max(ef, default=0.0)

    # Ancestors of producers (inclusive): walk the reverse graph from every producer.
    feeds_producer = [False] * n
    stack = list(dict.fromkeys(producer))
    for p in stack:
        feeds_producer[p] = True
    while stack:
        i = stack.pop()
        for j in deps[i]:
            if not feeds_producer[j]:
                feeds_producer[j] = True
                stack.append(j)
    # Every replay rests on Lemma 1 (no producer waits, even transitively, for a consumer);
    # verify_trace enforces it, but a stage may be handed an unverified trace.
    for k, cons in enumerate(consumers):
        for c in cons:
            if feeds_producer[c]:
                raise InputError(
                    f"consumer {ops[c].name!r} is an ancestor of a producer (Lemma 1)",
                    field=f"tensors[{k}].consumers",
                )
    is_forward = tuple(op.phase == "forward" for op in ops)
    gated = tuple(is_forward[i] and not feeds_producer[i] for i in range(n))
    barrier_tail = max((op_tail[i] for i in range(n) if gated[i]), default=0.0)

    release = [ef[p] for p in producer]
    tail = [max((op_tail[c] for c in cons), default=0.0) for cons in consumers]
    need = [min((es[c] for c in cons), default=math.inf) for cons in consumers]
    ready_order = tuple(sorted(range(len(release)), key=lambda k: (release[k], k)))

    return TraceAnalysis(
        trace=trace,
        op_names=tuple(op.name for op in ops),
        op_index=op_index,
        tensor_names=tuple(t.name for t in trace.tensors),
        tensor_index=tensor_index,
        duration_us=dur,
        deps=tuple(deps),
        children=children,
        topo=topo,
        consumes=tuple(tuple(r) for r in consumes_l),
        produces=tuple(tuple(r) for r in produces_l),
        is_forward=is_forward,
        gated=gated,
        producer=tuple(producer),
        consumers=tuple(consumers),
        size_bytes=tuple(int(t.size_bytes) for t in trace.tensors),
        element_bytes=tuple(int(t.element_bytes) for t in trace.tensors),
        fusion_kind=tuple(t.fusion_kind for t in trace.tensors),
        es_us=es,
        ef_us=ef,
        critical_path_us=cp,
        op_tail_us=op_tail,
        release_us=release,
        tail_us=tail,
        barrier_tail_us=barrier_tail,
        ready_order=ready_order,
        need_us=need,
    )
