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

from collections import deque
from collections.abc import Sequence

from pace.bounds import (
    MAX_BETA_US_PER_BYTE,
    MAX_DURATION_US,
    MAX_ITEMS,
    MAX_SLICES,
    MAX_TENSOR_BYTES,
    MAX_WORKERS,
    MIN_NONZERO_BETA_US_PER_BYTE,
    MIN_NONZERO_US,
)
from pace.checks import is_int, is_number, shown
from pace.digest import trace_digest
from pace.errors import InputError, ScheduleMismatchError
from pace.ir import DTYPE_ELEMENT_BYTES, CommModel, Schedule, Slice, Tensor, Trace
from pace.options import PHASES

# Names printed in a message: a cycle through thousands of ops, or a name of 10,000 characters,
# must still give one readable line.
_NAME_CHARS = 60
_CHAIN_NAMES = 6


def _is_int(x: object, minimum: int, maximum: int = MAX_TENSOR_BYTES) -> bool:
    return is_int(x) and minimum <= x <= maximum


def _is_num(x: object) -> bool:
    return is_number(x, finite=True)


def _in_range(x: object, maximum: float, least: float) -> bool:
    """A finite number, 0 or in ``[least, maximum]`` (pace.io's bounds)."""
    return _is_num(x) and (x == 0 or least <= x <= maximum)  # type: ignore[operator]


def _show(x: object) -> str:
    # repr, except for ints too long to print (str() refuses more than 4,300 digits).
    text = shown(x)
    return text if len(text) <= 40 else text[:37] + "..."


def _q(x: object, limit: int = _NAME_CHARS) -> str:
    """``repr(x)`` for a message, cut to one short line whatever a file put in it."""
    if isinstance(x, str):
        text = repr(x)
        return text if len(text) <= limit else text[: limit - 4] + "...'"
    return _show(x)


def _name(name: str) -> str:
    """A name for a message: escaped (one line) and cut to ``_NAME_CHARS``."""
    text = name if name.isprintable() else repr(name)[1:-1]
    return text if len(text) <= _NAME_CHARS else text[: _NAME_CHARS - 3] + "..."


def _chain(names: Sequence[str]) -> str:
    """``a -> b -> c``; a long chain keeps its ends: ``a -> b -> c -> ... (+N ops) -> y -> z``."""
    shown = [_name(n) for n in names]
    if len(shown) > _CHAIN_NAMES:
        head, tail = shown[: _CHAIN_NAMES - 2], shown[-2:]
        shown = [*head, f"... (+{len(names) - _CHAIN_NAMES} ops)", *tail]
    return " -> ".join(shown)


def _check_comm(comm: CommModel, path: str, where: str) -> None:
    if not _is_int(comm.workers, 1, MAX_WORKERS):
        raise InputError(
            f"must be an integer >= 1 and <= {MAX_WORKERS} (2**20), got {_show(comm.workers)}",
            where=where,
            field=f"{path}.workers",
        )
    for key, maximum, least in (
        ("alpha_us", MAX_DURATION_US, MIN_NONZERO_US),
        ("beta_us_per_byte", MAX_BETA_US_PER_BYTE, MIN_NONZERO_BETA_US_PER_BYTE),
    ):
        value = getattr(comm, key)
        if not _in_range(value, maximum, least):
            raise InputError(
                f"must be a finite number >= 0 and <= {maximum:g}, 0 or >= {least:g}, "
                f"got {_show(value)}",
                where=where,
                field=f"{path}.{key}",
            )


def _check_unique(names: Sequence[str], kind: str, list_key: str, where: str) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise InputError(
                f"must be a non-empty string, got {_q(name)}",
                where=where,
                field=f"{list_key}[{i}].name",
            )
        if name in index:
            raise InputError(
                f"duplicate {kind} name {_q(name)} (first at {list_key}[{index[name]}])",
                where=where,
                field=f"{list_key}[{i}].name",
            )
        index[name] = i
    return index


# A dtype is a short name (torch's are at most 15 characters); this bounds what a file may say.
MAX_DTYPE_CHARS = 64


def _check_dtype(t: Tensor, ti: int, where: str) -> None:
    """``dtype``: a short string ("" when not recorded) that agrees with ``element_bytes`` when
    it is one torch names (``DTYPE_ELEMENT_BYTES``): the element boundaries of the schedule's
    slices come from ``element_bytes``, so the two must not disagree."""
    field = f"tensors[{ti}].dtype"
    if not isinstance(t.dtype, str) or len(t.dtype) > MAX_DTYPE_CHARS:
        raise InputError(
            f"must be a dtype name of at most {MAX_DTYPE_CHARS} characters, got {_q(t.dtype)}",
            where=where,
            field=field,
        )
    size = DTYPE_ELEMENT_BYTES.get(t.dtype)
    if size is not None and size != t.element_bytes:
        raise InputError(
            f"{t.dtype} has {size}-byte elements but element_bytes is {_q(t.element_bytes)}: "
            f"set element_bytes to {size}",
            where=where,
            field=field,
        )


def _check_one_kind(
    slices: Sequence[Slice], kinds: dict[str, tuple[int, str]], field: str, where: str
) -> None:
    """The runtime all-reduces a unit as one buffer of one dtype: its tensors must share a
    ``Tensor.fusion_kind``."""
    first: dict[tuple[int, str], str] = {}
    for s in slices:
        first.setdefault(kinds[s.tensor], s.tensor)
    if len(first) > 1:
        shown_kinds = ", ".join(
            f"{dtype or f'{size}-byte elements'} ({_q(name)})"
            for (size, dtype), name in sorted(first.items())
        )
        raise InputError(
            f"a unit is all-reduced as one buffer of one dtype, this one mixes {shown_kinds}: "
            "split it, or compile again with this version of pace",
            where=where,
            field=field,
        )


def _check_name_list(names: object, field: str, where: str) -> None:
    if not isinstance(names, tuple | list):
        raise InputError(f"must be a list of op names, got {_q(names)}", where=where, field=field)
    for k, name in enumerate(names):
        if not isinstance(name, str):
            raise InputError(
                f"must be an op name (a string), got {_q(name)}", where=where, field=f"{field}[{k}]"
            )


def _check_samples(comm: CommModel, path: str, where: str) -> None:
    if not isinstance(comm.samples, tuple | list):
        raise InputError(
            f"must be a list of (bytes, us) pairs, got {_q(comm.samples)}",
            where=where,
            field=f"{path}.samples",
        )
    for k, pt in enumerate(comm.samples):
        ok = (
            isinstance(pt, tuple | list)
            and len(pt) == 2
            and _is_int(pt[0], 0)
            and _in_range(pt[1], MAX_DURATION_US, MIN_NONZERO_US)
        )
        if not ok:
            raise InputError(
                f"must be a (bytes in [0, {MAX_TENSOR_BYTES}], us in [0, {MAX_DURATION_US:g}]) "
                f"pair, got {_show(pt)}",
                where=where,
                field=f"{path}.samples[{k}]",
            )


def verify_trace(trace: Trace, where: str = "") -> None:
    """Raise ``InputError`` unless ``trace`` satisfies trace format v1 (see module docstring).

    >>> from pace.synth import random_trace
    >>> verify_trace(random_trace(seed=1))
    """
    ops = trace.ops
    for key, items in (("ops", ops), ("tensors", trace.tensors)):
        if len(items) > MAX_ITEMS:
            raise InputError(
                f"has {len(items)} elements, at most {MAX_ITEMS} are allowed",
                where=where,
                field=key,
            )
    op_index = _check_unique([op.name for op in ops], "op", "ops", where)
    _check_unique([t.name for t in trace.tensors], "tensor", "tensors", where)
    if not trace.tensors:
        raise InputError(
            "a trace needs at least one gradient tensor to all-reduce", where=where, field="tensors"
        )
    _check_comm(trace.comm, "comm", where)
    _check_samples(trace.comm, "comm", where)
    if not isinstance(trace.model, str):
        raise InputError(f"must be a string, got {_q(trace.model)}", where=where, field="model")

    # Successor lists by op index: the graph has an edge dep -> op.
    succ: list[list[int]] = [[] for _ in ops]
    indeg = [0] * len(ops)
    for i, op in enumerate(ops):
        if op.phase not in PHASES:
            raise InputError(
                f"must be one of {', '.join(PHASES)}; got {_q(op.phase)}",
                where=where,
                field=f"ops[{i}].phase",
            )
        if not _in_range(op.duration_us, MAX_DURATION_US, MIN_NONZERO_US):
            raise InputError(
                f"must be a finite number >= 0 and <= {MAX_DURATION_US:g} (one day in us), "
                f"0 or >= {MIN_NONZERO_US:g}, "
                f"got {_q(op.duration_us)}",
                where=where,
                field=f"ops[{i}].duration_us",
            )
        _check_name_list(op.deps, f"ops[{i}].deps", where)
        for k, dep in enumerate(op.deps):
            j = op_index.get(dep)
            if j is None:
                raise InputError(
                    f"op {_q(dep)} does not exist", where=where, field=f"ops[{i}].deps[{k}]"
                )
            succ[j].append(i)
            indeg[i] += 1

    _check_acyclic(trace, succ, indeg, where)

    # Tensors: references, sizes. Remember, for each consumer op, the first tensor it consumes
    # (only used to name it in a Lemma-1 message).
    consumed_by: dict[int, int] = {}
    producer_idx: list[int] = []
    total_bytes = 0
    for ti, t in enumerate(trace.tensors):
        if not _is_int(t.size_bytes, 1):
            raise InputError(
                f"must be an integer > 0 and <= {MAX_TENSOR_BYTES} (2**48 bytes, 256 TiB), "
                f"got {_q(t.size_bytes)}",
                where=where,
                field=f"tensors[{ti}].bytes",
            )
        total_bytes += t.size_bytes
        if total_bytes > MAX_TENSOR_BYTES:
            # Each tensor may be large, but their sum bounds every byte count a stage adds up.
            raise InputError(
                f"tensors[0..{ti}] hold {total_bytes} bytes together, more than the "
                f"{MAX_TENSOR_BYTES} (2**48 bytes, 256 TiB) a trace may hold",
                where=where,
                field=f"tensors[{ti}].bytes",
            )
        eb = t.element_bytes
        if not _is_int(eb, 1) or eb & (eb - 1) or t.size_bytes % eb:
            raise InputError(
                f"must be a power of two that divides bytes ({t.size_bytes}), got {_q(eb)}",
                where=where,
                field=f"tensors[{ti}].element_bytes",
            )
        _check_dtype(t, ti, where)
        _check_name_list(t.consumers, f"tensors[{ti}].consumers", where)
        p = op_index.get(t.producer) if isinstance(t.producer, str) else None
        if p is None:
            raise InputError(
                f"op {_q(t.producer)} does not exist", where=where, field=f"tensors[{ti}].producer"
            )
        producer_idx.append(p)
        for k, c in enumerate(t.consumers):
            ci = op_index.get(c)
            if ci is None:
                raise InputError(
                    f"op {_q(c)} does not exist", where=where, field=f"tensors[{ti}].consumers[{k}]"
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
    raise InputError(f"dependency cycle: {_chain(names)}", where=where, field=f"ops[{first}].deps")


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
        names = _chain([trace.ops[i].name for i in path])
        t = trace.tensors[ti]
        if len(path) == 1:
            detail = (
                f"producer {_q(t.producer)} of tensor {_q(t.name)} is itself a consumer "
                f"of tensor {_q(other)}"
            )
        else:
            detail = (
                f"producer {_q(t.producer)} of tensor {_q(t.name)} depends on "
                f"{_q(trace.ops[consumer].name)}, a consumer of tensor {_q(other)} (path {names})"
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
            f"schedule was compiled for trace {_q(schedule.trace_digest, 80)}, but the given "
            f"trace has digest {_q(expected, 80)}",
            where=where,
            field="trace_digest",
        )
    _check_comm(schedule.cost_model, "cost_model", where)
    pred = schedule.predicted_iteration_us
    if not (_is_num(pred) and pred >= 0):
        raise InputError(
            f"must be a finite number >= 0, got {_q(pred)}",
            where=where,
            field="predicted_iteration_us",
        )
    n_slices = sum(len(u.slices) for u in schedule.units if isinstance(u.slices, tuple | list))
    if len(schedule.units) > MAX_ITEMS or n_slices > MAX_SLICES:
        raise InputError(
            f"{len(schedule.units)} units carrying {n_slices} slices: at most {MAX_ITEMS} units "
            f"and {MAX_SLICES} slices are allowed",
            where=where,
            field="units",
        )
    sizes = {t.name: t.size_bytes for t in trace.tensors}
    kinds = {t.name: t.fusion_kind for t in trace.tensors}  # (element size, dtype)
    # tensor -> [(offset, end, field path)]
    pieces: dict[str, list[tuple[int, int, str]]] = {name: [] for name in sizes}
    for ui, unit in enumerate(schedule.units):
        if not _is_num(unit.priority):
            raise InputError(
                f"must be a finite number, got {_q(unit.priority)}",
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
                raise InputError(f"must be a Slice, got {_q(s)}", where=where, field=path)
            size = sizes.get(s.tensor) if isinstance(s.tensor, str) else None
            if size is None:
                raise InputError(
                    f"tensor {_q(s.tensor)} does not exist in the trace",
                    where=where,
                    field=f"{path}.tensor",
                )
            if not _is_int(s.offset_bytes, 0):
                raise InputError(
                    f"must be an integer >= 0, got {_q(s.offset_bytes)}",
                    where=where,
                    field=f"{path}.offset",
                )
            if not _is_int(s.size_bytes, 1):
                raise InputError(
                    f"must be an integer > 0, got {_q(s.size_bytes)}",
                    where=where,
                    field=f"{path}.bytes",
                )
            end = s.offset_bytes + s.size_bytes
            eb = kinds[s.tensor][0]
            if s.offset_bytes % eb or s.size_bytes % eb:
                raise InputError(
                    f"offset {s.offset_bytes} / bytes {s.size_bytes} of {_q(s.tensor)} are not "
                    f"multiples of its element size {eb}",
                    where=where,
                    field=path,
                )
            if end > size:
                raise InputError(
                    f"bytes [{s.offset_bytes}, {end}) run past the end of tensor {_q(s.tensor)} "
                    f"({size} bytes)",
                    where=where,
                    field=path,
                )
            pieces[s.tensor].append((s.offset_bytes, end, path))
        _check_one_kind(unit.slices, kinds, f"units[{ui}]", where)

    for t in trace.tensors:
        parts = sorted(pieces[t.name])
        if not parts:
            raise InputError(
                f"tensor {_q(t.name)} ({t.size_bytes} bytes) is not covered by any slice",
                where=where,
                field="units",
            )
        covered_to = 0
        last_path = ""
        for offset, end, path in parts:
            if offset > covered_to:
                raise InputError(
                    f"tensor {_q(t.name)}: bytes [{covered_to}, {offset}) are not covered "
                    "by any slice",
                    where=where,
                    field="units",
                )
            if offset < covered_to:
                raise InputError(
                    f"tensor {_q(t.name)}: bytes [{offset}, {min(end, covered_to)}) are also "
                    f"covered by {last_path}",
                    where=where,
                    field=path,
                )
            covered_to = end
            last_path = path
        if covered_to < t.size_bytes:
            raise InputError(
                f"tensor {_q(t.name)}: bytes [{covered_to}, {t.size_bytes}) are not covered "
                "by any slice",
                where=where,
                field="units",
            )
