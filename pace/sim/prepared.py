"""Per-trace structures the simulator computes once and reuses on every replay.

The fusion and scheduler stages call the simulator as an oracle thousands of times on the same
trace, so everything that depends on the trace alone (index maps, topological order, the
compute-only schedule, tensor release times, tails) is computed here once and cached by the
identity of the (frozen) ``Trace`` object.

Because the trace format guarantees the Lemma-1 rule (no producer depends on any consumer), a
producer's finish time never depends on communication under ideal compute. The replay therefore
splits in two: tensor release times come from the compute-only schedule, the channel is replayed
on its own, and the window's makespan is ``max(compute-only makespan, max_t done_t + tail_t)``
where ``tail_t`` is the longest path from the start of any consumer of ``t`` to the end of the
window. ``tail`` is computed here; only the channel replay depends on the policy.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass

from pace.errors import InputError
from pace.ir import Trace

# Traces kept alive by the cache; each entry holds the trace itself so its id is never reused
# while the entry exists.
_CACHE_SIZE = 16
_cache: OrderedDict[int, tuple[Trace, Prepared]] = OrderedDict()
_lock = threading.Lock()


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Prepared:
    """A trace compiled for replay. Build with :func:`prepare` (cached)."""

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


def prepare(trace: Trace) -> Prepared:
    """The cached :class:`Prepared` of ``trace`` (computed on first use).

    Thread-safe: the runtime's background re-planner replays while the main thread may too.
    """
    key = id(trace)
    with _lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] is trace:
            _cache.move_to_end(key)
            return hit[1]
    prep = _build(trace)
    with _lock:
        _cache[key] = (trace, prep)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return prep


def _build(trace: Trace) -> Prepared:
    ops = trace.ops
    n = len(ops)
    op_index: dict[str, int] = {}
    for i, op in enumerate(ops):
        if op.name in op_index:
            raise InputError(f"duplicate op name {op.name!r}", field=f"ops[{i}].name")
        op_index[op.name] = i
    deps: list[tuple[int, ...]] = []
    for i, op in enumerate(ops):
        row: list[int] = []
        for d in op.deps:
            j = op_index.get(d)
            if j is None:
                raise InputError(f"op {d!r} does not exist", field=f"ops[{i}].deps")
            row.append(j)
        deps.append(tuple(dict.fromkeys(row)))
    children_l: list[list[int]] = [[] for _ in range(n)]
    for i, row_t in enumerate(deps):
        for j in row_t:
            children_l[j].append(i)
    children = tuple(tuple(c) for c in children_l)

    indeg = [len(r) for r in deps]
    queue = deque(i for i in range(n) if indeg[i] == 0)
    topo: list[int] = []
    while queue:
        i = queue.popleft()
        topo.append(i)
        for c in children[i]:
            indeg[c] -= 1
            if indeg[c] == 0:
                queue.append(c)
    if len(topo) != n:
        stuck = next(i for i in range(n) if indeg[i] > 0)
        raise InputError(f"dependency cycle through op {ops[stuck].name!r}", field="ops")

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
    es = [0.0] * n
    ef = [0.0] * n
    for i in topo:
        s = 0.0
        for j in deps[i]:
            s = max(s, ef[j])
        es[i] = s
        ef[i] = s + dur[i]
    cp = max(ef, default=0.0)

    op_tail = [0.0] * n
    for i in reversed(topo):
        m = 0.0
        for c in children[i]:
            m = max(m, op_tail[c])
        op_tail[i] = dur[i] + m

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
    # The whole replay rests on Lemma 1 (no producer waits, even transitively, for a consumer);
    # verify_trace enforces it, but the simulator may be handed an unverified trace.
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

    return Prepared(
        trace=trace,
        op_names=tuple(op.name for op in ops),
        op_index=op_index,
        tensor_names=tuple(t.name for t in trace.tensors),
        tensor_index=tensor_index,
        duration_us=dur,
        deps=tuple(deps),
        children=children,
        topo=tuple(topo),
        consumes=tuple(tuple(r) for r in consumes_l),
        produces=tuple(tuple(r) for r in produces_l),
        is_forward=is_forward,
        gated=gated,
        producer=tuple(producer),
        consumers=tuple(consumers),
        size_bytes=tuple(int(t.size_bytes) for t in trace.tensors),
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
