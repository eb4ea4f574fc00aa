"""Which Kineto events time which execution-trace nodes.

The execution trace gives the structure of a step, the Kineto trace the times. Two ways to pair
them:

* **Same session** (the execution trace observed a step the Kineto trace also recorded): every
  node's record-function id is a Kineto event's ``Record function id``, with the same name.
* **By position**: any other Kineto step whose operators are the same sequence, thread by thread
  in start order, times the node at the same position. This is how ``pace.importer.record``
  gets timings without the observer's cost (the observer formats every argument of every call,
  tens of microseconds per op, inside the Kineto spans of the step it observes: recording one
  step with the observer and the following ones without it keeps the structure exact and the
  timings clean), and how an execution trace of another step of the same program is imported.

Steps the observer did not run in are preferred (Kineto gives record-function ids only while an
observer runs, so they are told apart); when there are none, the observed steps' own times are
used (``meta.import.observer_in_timings``). When nothing pairs up, the files come from different
programs (or the model's ops change from step to step) and the import is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pace.errors import InputError
from pace.importer.et import EtNode
from pace.importer.kineto import HOST_CATEGORIES, KinetoEvent, KinetoTrace

STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
# Not paired by position: gloo's collectives run on its own threads (the observer files them
# under the caller's thread, Kineto under their own, and their timing against the caller varies
# from step to step); "## process_group:init ##"-style records are written once per session.
_UNPAIRED_PREFIXES: tuple[str, ...] = ("gloo:", "## ")


def _paired(name: str) -> bool:
    return not (STEP_RE.match(name) or name.startswith(_UNPAIRED_PREFIXES))


@dataclass(frozen=True, slots=True)
class Timed:
    """Start and end (Kineto microseconds) of the nodes of one execution-trace step, read from
    one Kineto step."""

    start_us: Mapping[int, float]
    end_us: Mapping[int, float]
    node_of_event: Mapping[int, int]  # Kineto "External id" -> execution-trace node id
    kineto_step: str
    observed: bool  # the step the execution-trace observer ran in (its overhead is in the times)


@dataclass(frozen=True, slots=True)
class KinetoStep:
    label: str
    threads: Mapping[str, tuple[KinetoEvent, ...]]  # tid -> host events in start order


def kineto_steps(kineto: KinetoTrace) -> list[KinetoStep]:
    """The ``ProfilerStep#N`` spans of the trace with the host events that start inside them,
    thread by thread; the whole trace if it has no steps.

    Events are put in start order by their ``External id`` (given when a call starts; the
    record-function id is 0 outside the steps an execution-trace observer saw).
    """
    host = [
        e
        for e in kineto.events
        if e.cat in HOST_CATEGORIES and _paired(e.name) and e.arg_int("External id") is not None
    ]
    marks = sorted(
        (e for e in kineto.events if e.cat in HOST_CATEGORIES and STEP_RE.match(e.name)),
        key=lambda e: e.ts_us,
    )
    spans = [(m.name, m.ts_us, m.end_us) for m in marks] or [
        ("the Kineto trace", float("-inf"), float("inf"))
    ]
    steps = []
    for label, lo, hi in spans:
        threads: dict[str, list[KinetoEvent]] = {}
        for e in host:
            if lo <= e.ts_us <= hi:
                threads.setdefault(e.tid, []).append(e)
        steps.append(
            KinetoStep(
                label=label,
                threads={
                    tid: tuple(sorted(evs, key=lambda e: (e.arg_int("External id"), e.ts_us)))
                    for tid, evs in threads.items()
                },
            )
        )
    return steps


def recorded_threads(members: Sequence[EtNode]) -> list[list[EtNode]]:
    """The nodes of a step that a Kineto trace also has, thread by thread in start order."""
    threads: dict[int, list[EtNode]] = {}
    for n in members:
        if n.rf_id > 0 and not n.is_meta and _paired(n.name):
            threads.setdefault(n.tid, []).append(n)
    return [sorted(nodes, key=lambda n: n.rf_id) for nodes in threads.values()]


def match_timings(
    members: Sequence[EtNode],
    kineto: KinetoTrace,
    steps: Sequence[KinetoStep],
    *,
    where: str,
) -> list[Timed]:
    """The Kineto steps that time this execution-trace step (module docstring)."""
    threads = recorded_threads(members)
    nodes = [n for t in threads for n in t]
    if not nodes:
        raise InputError("no recorded operators", where=where, field="nodes")
    observed: Timed | None = None
    observed_label = ""
    if all(n.rf_id in kineto.by_rf_id and kineto.by_rf_id[n.rf_id].name == n.name for n in nodes):
        events = [kineto.by_rf_id[n.rf_id] for n in nodes]
        first = min(events, key=lambda e: e.ts_us)
        observed_label = next(
            (s.label for s in steps if any(first in evs for evs in s.threads.values())),
            "the observed step",
        )
        observed = _timed(nodes, events, label=observed_label, observed=True)
    clean: list[Timed] = []
    with_observer: list[Timed] = [observed] if observed is not None else []
    closest: tuple[int, str, str] | None = None
    for step in steps:
        if step.label == observed_label:
            continue
        paired = _pair_threads(threads, step)
        if isinstance(paired, list):
            # Record-function ids are handed out only while an execution-trace observer runs.
            seen = any(e.arg_int("Record function id") for e in paired)
            timed = _timed(nodes, paired, label=step.label, observed=seen)
            (with_observer if seen else clean).append(timed)
        else:
            closest = _closer(closest, paired, step.label)
    if clean or with_observer:
        return clean or with_observer
    detail = ""
    if closest is not None:
        k, label, diff = closest
        detail = f" (closest: {label}, which differs at op #{k}: {diff})"
    kineto_name = Path(kineto.path).name
    raise InputError(
        f"no step of {kineto_name} has this execution trace's {len(nodes)} operators, "
        f"neither by record-function id nor in the same order{detail}: the files come from "
        "different programs; record both in one torch.profiler session (docs/import.md)",
        where=where,
        field="nodes",
    )


def _pair_threads(
    threads: Sequence[Sequence[EtNode]], step: KinetoStep
) -> list[KinetoEvent] | tuple[int, str]:
    """The step's events paired with ``threads``' nodes (in their order), each execution-trace
    thread with a distinct Kineto thread of the same operator sequence; else the first
    difference of the longest thread, as (position, description)."""
    free = dict(step.threads)
    out: list[KinetoEvent] = []
    for nodes in threads:
        names = [n.name for n in nodes]
        tid = next((t for t, evs in free.items() if [e.name for e in evs] == names), None)
        if tid is None:
            return _first_difference(names, free)
        out.extend(free.pop(tid))
    return out


def _first_difference(
    want: Sequence[str], candidates: Mapping[str, Sequence[KinetoEvent]]
) -> tuple[int, str]:
    best = (-1, "no thread of it has operators")
    for evs in candidates.values():
        got = [e.name for e in evs]
        k = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
        if k is None:
            k = min(len(want), len(got))
            diff = f"{len(got)} operators instead of {len(want)}"
        else:
            diff = f"{got[k]!r} instead of {want[k]!r}"
        if k > best[0]:
            best = (k, diff)
    return best


def _timed(
    nodes: Sequence[EtNode], events: Sequence[KinetoEvent], *, label: str, observed: bool
) -> Timed:
    return Timed(
        start_us={n.id: e.ts_us for n, e in zip(nodes, events, strict=True)},
        end_us={n.id: e.end_us for n, e in zip(nodes, events, strict=True)},
        node_of_event={
            ext: n.id
            for n, e in zip(nodes, events, strict=True)
            if (ext := e.arg_int("External id")) is not None
        },
        kineto_step=label,
        observed=observed,
    )


def _closer(
    best: tuple[int, str, str] | None, found: tuple[int, str], label: str
) -> tuple[int, str, str]:
    """Keep the step whose first difference comes latest."""
    if best is None or found[0] > best[0]:
        return (found[0], label, found[1])
    return best
