"""torch.profiler's Chrome trace (Kineto JSON) -> the events the importer needs.

A Kineto trace is ``{"traceEvents": [...], "distributedInfo": {...}, ...}``. The importer reads
complete events (``"ph": "X"``, ``ts``/``dur`` in microseconds):

* host events (``cat`` ``cpu_op`` or ``user_annotation``): keyed by ``args["Record function
  id"]``, the id the execution trace's nodes carry as ``rf_id``; these give every op's CPU time;
* device events (``kernel``, ``gpu_memcpy``, ``gpu_memset``): each names the host op that
  launched it by ``args["External id"]`` (or through the runtime launch with the same
  ``args["correlation"]``); their durations are the GPU time attributed to that op;
* collectives, read by ``pace.importer.comm``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pace.errors import InputError
from pace.importer.files import PathLike, read_json_object

HOST_CATEGORIES = frozenset({"cpu_op", "user_annotation"})
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "runtime"})


@dataclass(frozen=True, slots=True)
class KinetoEvent:
    """One complete event."""

    name: str
    cat: str
    ts_us: float
    dur_us: float
    tid: str
    args: Mapping[str, Any] = field(default_factory=dict)

    @property
    def end_us(self) -> float:
        return self.ts_us + self.dur_us

    def arg_int(self, key: str) -> int | None:
        value = self.args.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class KinetoTrace:
    path: str
    events: tuple[KinetoEvent, ...]  # every complete event, in file order
    by_rf_id: Mapping[int, KinetoEvent]  # host events by "Record function id"
    distributed: Mapping[str, Any]  # "distributedInfo" (rank, world_size, backend), or {}

    @property
    def device_events(self) -> tuple[KinetoEvent, ...]:
        return tuple(e for e in self.events if e.cat in DEVICE_CATEGORIES)

    def launching_host_event(self) -> dict[int, KinetoEvent]:
        """Device event index (in ``events``) -> the host op that launched it.

        Kineto gives a device event the ``External id`` of the innermost host op running when
        it was launched; when that is missing, the runtime call with the same ``correlation``
        carries it.
        """
        host_by_ext: dict[int, KinetoEvent] = {}
        runtime_ext: dict[int, int] = {}
        for e in self.events:
            ext = e.arg_int("External id")
            if ext is None:
                continue
            if e.cat == "cpu_op" or (e.cat in HOST_CATEGORIES and ext not in host_by_ext):
                host_by_ext[ext] = e
            elif e.cat in RUNTIME_CATEGORIES:
                corr = e.arg_int("correlation")
                if corr is not None:
                    runtime_ext[corr] = ext
        out: dict[int, KinetoEvent] = {}
        for i, e in enumerate(self.events):
            if e.cat not in DEVICE_CATEGORIES:
                continue
            ext = e.arg_int("External id")
            if ext is None or ext not in host_by_ext:
                corr = e.arg_int("correlation")
                ext = runtime_ext.get(corr) if corr is not None else None
            if ext is not None and ext in host_by_ext:
                out[i] = host_by_ext[ext]
        return out


def load_kineto(path: PathLike) -> KinetoTrace:
    """Parse the Kineto trace in ``path``; ``InputError`` names the file and the field."""
    where = str(path)
    obj = read_json_object(path, "torch.profiler (Kineto) trace")
    raw_events = obj.get("traceEvents")
    if raw_events is None:
        raise InputError(
            "missing: not a torch.profiler trace (export_chrome_trace writes "
            '{"traceEvents": [...]})',
            where=where,
            field="traceEvents",
        )
    if not isinstance(raw_events, list):
        raise InputError(
            f"must be a list, got {type(raw_events).__name__}", where=where, field="traceEvents"
        )
    events: list[KinetoEvent] = []
    by_rf: dict[int, KinetoEvent] = {}
    for i, raw in enumerate(raw_events):
        path_i = f"traceEvents[{i}]"
        if not isinstance(raw, dict):
            raise InputError(
                f"must be an object, got {type(raw).__name__}", where=where, field=path_i
            )
        if raw.get("ph") != "X":
            continue
        event = _complete_event(raw, where, path_i)
        events.append(event)
        rf = event.arg_int("Record function id")
        if event.cat in HOST_CATEGORIES and rf is not None and rf > 0:
            by_rf[rf] = event
    dist = obj.get("distributedInfo")
    return KinetoTrace(
        path=where,
        events=tuple(events),
        by_rf_id=by_rf,
        distributed=dist if isinstance(dist, dict) else {},
    )


def _number(raw: Mapping[str, Any], key: str, where: str, path: str) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(
            f"must be a finite number, got {value!r}", where=where, field=f"{path}.{key}"
        )
    return float(value)


def _complete_event(raw: Mapping[str, Any], where: str, path: str) -> KinetoEvent:
    name = raw.get("name")
    if not isinstance(name, str):
        raise InputError(f"must be a string, got {name!r}", where=where, field=f"{path}.name")
    dur = _number(raw, "dur", where, path)
    if dur < 0:
        raise InputError(f"must be >= 0, got {dur!r}", where=where, field=f"{path}.dur")
    args = raw.get("args", {})
    cat = raw.get("cat", "")
    return KinetoEvent(
        name=name,
        cat=cat if isinstance(cat, str) else "",
        ts_us=_number(raw, "ts", where, path),
        dur_us=dur,
        tid=str(raw.get("tid", "")),
        args=args if isinstance(args, dict) else {},
    )
