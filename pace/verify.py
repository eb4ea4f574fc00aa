"""Structural checks of a Trace and of a Schedule against its Trace.

``pace.io`` checks what a JSON file can get wrong locally (types, ranges, missing keys). This
module checks what only the whole object can tell, and re-checks types and ranges so that a
Trace built in Python by another stage gets the same guarantees as one read from a file:

* ``verify_trace``: unique op and tensor names, every reference (deps, producer, consumers)
  names an existing op, the dependency graph has no cycle (the message prints one), every
  number is finite and in range, ``comm.workers >= 1``, at least one tensor, and the Lemma-1
  rule of the PACE paper: no producer of any tensor is, or depends directly or transitively on,
  a consumer of any tensor (the window is "all backward producers, then the next forward").
* ``verify_schedule``: the digest matches the trace (``ScheduleMismatchError``), every slice
  names a tensor of the trace with an integer byte range inside it, every tensor's bytes are
  covered exactly once (gaps and overlaps are reported with their byte ranges), priorities and
  ``predicted_iteration_us`` are finite, and the cost model is sane.

Every failure raises ``InputError`` with ``where`` (the file) and ``field`` (the JSON path).
Cost: linear in the size of the trace (50,000 ops verify in well under a second); networkx is
only used to extract a cycle for the error message.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from pace.errors import InputError, ScheduleMismatchError
from pace.io import trace_digest
from pace.ir import PHASES, CommModel, Schedule, Slice, Trace


def _is_int(x: object, minimum: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= minimum


def _is_num(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _check_comm(comm: CommModel, path: str, where: str) -> None:
    if not _is_int(comm.workers, 1):
        raise InputError(
            f"must be an integer >= 1, got {comm.workers!r}", where=where, field=f"{path}.workers"
        )
    for key in ("alpha_us", "beta_us_per_byte"):
        value = getattr(comm, key)
        if not (_is_num(value) and value >= 0):
            raise InputError(
                f"must be a finite number >= 0, got {value!r}", where=where, field=f"{path}.{key}"
            )


def _check_unique(names: Sequence[str], kind: str, list_key: str, where: str) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise InputError(
                f"must be a non-empty string, got {name!r}",
                where=where,
                field=f"{list_key}[{i}].name",
            )
        if name in index:
            raise InputError(
                f"duplicate {kind} name {name!r} (first at {list_key}[{index[name]}])",
                where=where,
                field=f"{list_key}[{i}].name",
            )
        index[name] = i
    return index


def _check_name_list(names: object, field: str, where: str) -> None:
    if not isinstance(names, tuple | list):
        raise InputError(f"must be a list of op names, got {names!r}", where=where, field=field)
    for k, name in enumerate(names):
        if not isinstance(name, str):
            raise InputError(
                f"must be an op name (a string), got {name!r}", where=where, field=f"{field}[{k}]"
            )


def _check_samples(comm: CommModel, path: str, where: str) -> None:
    if not isinstance(comm.samples, tuple | list):
        raise InputError(
            f"must be a list of (bytes, us) pairs, got {comm.samples!r}",
            where=where,
            field=f"{path}.samples",
        )
    for k, pt in enumerate(comm.samples):
        ok = (
            isinstance(pt, tuple | list)
            and len(pt) == 2
            and _is_int(pt[0], 0)
            and _is_num(pt[1])
            and pt[1] >= 0
        )
        if not ok:
            raise InputError(
                f"must be a (bytes >= 0, us >= 0) pair of finite numbers, got {pt!r}",
                where=where,
                field=f"{path}.samples[{k}]",
            )


def verify_trace(trace: Trace, where: str = "") -> None:
    """Raise ``InputError`` unless ``trace`` satisfies trace format v1 (see module docstring).

    >>> from pace.synth import random_trace
    >>> verify_trace(random_trace(seed=1))
    """
    ops = trace.ops
    op_index = _check_unique([op.name for op in ops], "op", "ops", where)
    _check_unique([t.name for t in trace.tensors], "tensor", "tensors", where)
    if not trace.tensors:
        raise InputError(
            "a trace needs at least one gradient tensor to all-reduce", where=where, field="tensors"
        )
    _check_comm(trace.comm, "comm", where)
    _check_samples(trace.comm, "comm", where)
    if not isinstance(trace.model, str):
        raise InputError(f"must be a string, got {trace.model!r}", where=where, field="model")

    # Successor lists by op index: the graph has an edge dep -> op.
    succ: list[list[int]] = [[] for _ in ops]
    indeg = [0] * len(ops)
    for i, op in enumerate(ops):
        if op.phase not in PHASES:
            raise InputError(
                f"must be one of {', '.join(PHASES)}; got {op.phase!r}",
                where=where,
                field=f"ops[{i}].phase",
            )
        if not (_is_num(op.duration_us) and op.duration_us >= 0):
            raise InputError(
                f"must be a finite number >= 0, got {op.duration_us!r}",
                where=where,
                field=f"ops[{i}].duration_us",
            )
        _check_name_list(op.deps, f"ops[{i}].deps", where)
        for k, dep in enumerate(op.deps):
            j = op_index.get(dep)
            if j is None:
                raise InputError(
                    f"op {dep!r} does not exist", where=where, field=f"ops[{i}].deps[{k}]"
                )
            succ[j].append(i)
            indeg[i] += 1

    _check_acyclic(trace, succ, indeg, where)

    # Tensors: references, sizes. Remember, for each consumer op, the first tensor it consumes
    # (only used to name it in a Lemma-1 message).
    consumed_by: dict[int, int] = {}
    producer_idx: list[int] = []
    for ti, t in enumerate(trace.tensors):
        if not _is_int(t.size_bytes, 1):
            raise InputError(
                f"must be an integer > 0, got {t.size_bytes!r}",
                where=where,
                field=f"tensors[{ti}].bytes",
            )
        eb = t.element_bytes
        if not _is_int(eb, 1) or eb & (eb - 1) or t.size_bytes % eb:
            raise InputError(
                f"must be a power of two that divides bytes ({t.size_bytes}), got {eb!r}",
                where=where,
                field=f"tensors[{ti}].element_bytes",
            )
        _check_name_list(t.consumers, f"tensors[{ti}].consumers", where)
        p = op_index.get(t.producer) if isinstance(t.producer, str) else None
        if p is None:
            raise InputError(
                f"op {t.producer!r} does not exist", where=where, field=f"tensors[{ti}].producer"
            )
        producer_idx.append(p)
        for k, c in enumerate(t.consumers):
            ci = op_index.get(c)
            if ci is None:
                raise InputError(
                    f"op {c!r} does not exist", where=where, field=f"tensors[{ti}].consumers[{k}]"
                )
            consumed_by.setdefault(ci, ti)

    _check_lemma1(trace, succ, consumed_by, producer_idx, where)


def _check_acyclic(trace: Trace, succ: list[list[int]], indeg: list[int], where: str) -> None:
    """Kahn's algorithm; on failure networkx extracts one cycle to print."""
    remaining = list(indeg)
    queue = deque(i for i, d in enumerate(remaining) if d == 0)
    seen = 0
    while queue:
        i = queue.popleft()
        seen += 1
        for j in succ[i]:
            remaining[j] -= 1
            if remaining[j] == 0:
                queue.append(j)
    if seen == len(trace.ops):
        return
    import networkx as nx

    graph: nx.DiGraph[int] = nx.DiGraph()
    # Only the ops left over are on or behind a cycle; a smaller graph keeps this fast.
    left = [i for i, d in enumerate(remaining) if d > 0]
    left_set = set(left)
    graph.add_edges_from((i, j) for i in left for j in succ[i] if j in left_set)
    cycle = nx.find_cycle(graph)
    names = [trace.ops[u].name for u, _ in cycle] + [trace.ops[cycle[0][0]].name]
    first = cycle[0][1]
    raise InputError(
        f"dependency cycle: {' -> '.join(names)}", where=where, field=f"ops[{first}].deps"
    )


def _check_lemma1(
    trace: Trace,
    succ: list[list[int]],
    consumed_by: dict[int, int],
    producer_idx: list[int],
    where: str,
) -> None:
    """No producer may be a consumer or a descendant of one (PACE Lemma 1).

    One multi-source BFS from every consumer marks all ops that run after some consumer; then
    each producer is a set lookup. Parent pointers give the path for the message. Linear time.
    """
    parent: dict[int, int] = dict.fromkeys(consumed_by, -1)
    queue = deque(consumed_by)
    while queue:
        i = queue.popleft()
        for j in succ[i]:
            if j not in parent:
                parent[j] = i
                queue.append(j)
    for ti, p in enumerate(producer_idx):
        if p not in parent:
            continue
        path = [p]
        while parent[path[-1]] != -1:
            path.append(parent[path[-1]])
        path.reverse()
        consumer = path[0]
        other = trace.tensors[consumed_by[consumer]].name
        names = " -> ".join(trace.ops[i].name for i in path)
        t = trace.tensors[ti]
        if len(path) == 1:
            detail = (
                f"producer {t.producer!r} of tensor {t.name!r} is itself a consumer "
                f"of tensor {other!r}"
            )
        else:
            detail = (
                f"producer {t.producer!r} of tensor {t.name!r} depends on "
                f"{trace.ops[consumer].name!r}, a consumer of tensor {other!r} (path {names})"
            )
        raise InputError(
            f"Lemma-1 rule broken: {detail}; producers must all precede consumers in the window",
            where=where,
            field=f"tensors[{ti}].producer",
        )


def verify_schedule(schedule: Schedule, trace: Trace, where: str = "") -> None:
    """Raise ``InputError`` unless ``schedule`` is a valid schedule of ``trace``.

    A digest mismatch raises ``ScheduleMismatchError`` (a subclass of ``InputError``); it is
    checked first because every other failure would be a consequence of it.
    """
    expected = trace_digest(trace)
    if schedule.trace_digest != expected:
        raise ScheduleMismatchError(
            f"schedule was compiled for trace {schedule.trace_digest!r}, but the given trace "
            f"has digest {expected!r}",
            where=where,
            field="trace_digest",
        )
    _check_comm(schedule.cost_model, "cost_model", where)
    pred = schedule.predicted_iteration_us
    if not (_is_num(pred) and pred >= 0):
        raise InputError(
            f"must be a finite number >= 0, got {pred!r}",
            where=where,
            field="predicted_iteration_us",
        )
    sizes = {t.name: t.size_bytes for t in trace.tensors}
    elements = {t.name: t.element_bytes for t in trace.tensors}
    # tensor -> [(offset, end, field path)]
    pieces: dict[str, list[tuple[int, int, str]]] = {name: [] for name in sizes}
    for ui, unit in enumerate(schedule.units):
        if not _is_num(unit.priority):
            raise InputError(
                f"must be a finite number, got {unit.priority!r}",
                where=where,
                field=f"units[{ui}].priority",
            )
        if not isinstance(unit.slices, tuple | list) or not unit.slices:
            raise InputError(
                "must be a non-empty list of slices (a unit carries at least one slice)",
                where=where,
                field=f"units[{ui}].slices",
            )
        for si, s in enumerate(unit.slices):
            path = f"units[{ui}].slices[{si}]"
            if not isinstance(s, Slice):
                raise InputError(f"must be a Slice, got {s!r}", where=where, field=path)
            size = sizes.get(s.tensor) if isinstance(s.tensor, str) else None
            if size is None:
                raise InputError(
                    f"tensor {s.tensor!r} does not exist in the trace",
                    where=where,
                    field=f"{path}.tensor",
                )
            if not _is_int(s.offset_bytes, 0):
                raise InputError(
                    f"must be an integer >= 0, got {s.offset_bytes!r}",
                    where=where,
                    field=f"{path}.offset",
                )
            if not _is_int(s.size_bytes, 1):
                raise InputError(
                    f"must be an integer > 0, got {s.size_bytes!r}",
                    where=where,
                    field=f"{path}.bytes",
                )
            end = s.offset_bytes + s.size_bytes
            eb = elements[s.tensor]
            if s.offset_bytes % eb or s.size_bytes % eb:
                raise InputError(
                    f"offset {s.offset_bytes} / bytes {s.size_bytes} of {s.tensor!r} are not "
                    f"multiples of its element size {eb}",
                    where=where,
                    field=path,
                )
            if end > size:
                raise InputError(
                    f"bytes [{s.offset_bytes}, {end}) run past the end of tensor {s.tensor!r} "
                    f"({size} bytes)",
                    where=where,
                    field=path,
                )
            pieces[s.tensor].append((s.offset_bytes, end, path))

    for t in trace.tensors:
        parts = sorted(pieces[t.name])
        if not parts:
            raise InputError(
                f"tensor {t.name!r} ({t.size_bytes} bytes) is not covered by any slice",
                where=where,
                field="units",
            )
        covered_to = 0
        last_path = ""
        for offset, end, path in parts:
            if offset > covered_to:
                raise InputError(
                    f"tensor {t.name!r}: bytes [{covered_to}, {offset}) are not covered "
                    "by any slice",
                    where=where,
                    field="units",
                )
            if offset < covered_to:
                raise InputError(
                    f"tensor {t.name!r}: bytes [{offset}, {min(end, covered_to)}) are also "
                    f"covered by {last_path}",
                    where=where,
                    field=path,
                )
            covered_to = end
            last_path = path
        if covered_to < t.size_bytes:
            raise InputError(
                f"tensor {t.name!r}: bytes [{covered_to}, {t.size_bytes}) are not covered "
                "by any slice",
                where=where,
                field="units",
            )
