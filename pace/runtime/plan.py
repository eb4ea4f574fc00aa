"""Turn a Schedule (bytes of named tensors) into a runtime plan (element ranges of parameters).

Pure Python, no torch: the plan is built and checked from ``ParamInfo`` records, so the checks
that refuse a schedule which does not belong to the model are unit-testable without processes.

A plan is the exact issue order of the collectives. Every rank builds the same plan from the same
file and the same model, which is what lets the runtime issue collectives without negotiation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pace.errors import InputError, ScheduleMismatchError
from pace.ir import Schedule

# How many names a mismatch message lists before it says "...".
_NAMES_SHOWN = 5


@dataclass(frozen=True, kw_only=True, slots=True)
class ParamInfo:
    """What the runtime needs to know about one trainable parameter."""

    name: str
    numel: int
    element_size: int
    dtype: str

    @property
    def size_bytes(self) -> int:
        return self.numel * self.element_size


@dataclass(frozen=True, kw_only=True, slots=True)
class Piece:
    """Elements ``[start, stop)`` of parameter ``param``'s flattened (row-major) gradient."""

    param: int
    start: int
    stop: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanUnit:
    """One collective: a single piece (in-place on the gradient) or a fused flat buffer."""

    index: int
    pieces: tuple[Piece, ...]
    priority: float
    dtype: str

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.pieces)

    @property
    def params(self) -> tuple[int, ...]:
        """Distinct parameter indices, in piece order."""
        return tuple(dict.fromkeys(p.param for p in self.pieces))


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayPlan:
    """Units in issue order plus, per parameter, how many pieces must finish before its update."""

    units: tuple[PlanUnit, ...]
    pieces_per_param: tuple[int, ...]
    source: str

    def describe(self, unit: int, params: Sequence[ParamInfo]) -> str:
        """``unit 3 (fc.weight[0:512], fc.bias)``: for time-out and failure messages."""
        parts = []
        for p in self.units[unit].pieces:
            info = params[p.param]
            whole = p.start == 0 and p.stop == info.numel
            parts.append(info.name if whole else f"{info.name}[{p.start}:{p.stop}]")
        return f"unit {unit} ({', '.join(parts)})"


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_NAMES_SHOWN])
    return shown + (", ..." if len(names) > _NAMES_SHOWN else "")


def plan_from_schedule(
    schedule: Schedule, params: Sequence[ParamInfo], *, where: str = ""
) -> ReplayPlan:
    """The replay plan of ``schedule`` for a model with trainable parameters ``params``.

    Raises ``ScheduleMismatchError`` when the schedule's tensors are not exactly the model's
    parameters with the model's sizes, and ``InputError`` for a schedule that cannot be replayed
    on this model (a slice not on an element boundary, a unit mixing dtypes, overlapping slices).
    """
    index = {p.name: i for i, p in enumerate(params)}
    in_schedule = list(dict.fromkeys(s.tensor for u in schedule.units for s in u.slices))
    unknown = [n for n in in_schedule if n not in index]
    scheduled = set(in_schedule)
    missing = [p.name for p in params if p.name not in scheduled]
    if unknown or missing:
        problems = []
        if unknown:
            problems.append(f"tensors not among the model's parameters: {_names(unknown)}")
        if missing:
            problems.append(f"model parameters without any slice: {_names(missing)}")
        raise ScheduleMismatchError(
            "schedule does not belong to this model (" + "; ".join(problems) + ")",
            where=where,
            field="units",
        )

    covered: list[list[tuple[int, int, str]]] = [[] for _ in params]
    units: list[PlanUnit] = []
    order = sorted(range(len(schedule.units)), key=lambda u: schedule.units[u].priority)
    for issue_pos, ui in enumerate(order):
        unit = schedule.units[ui]
        if not unit.slices:
            raise InputError(
                "a unit must carry at least one slice", where=where, field=f"units[{ui}]"
            )
        pieces = []
        dtypes = set()
        for si, s in enumerate(unit.slices):
            field = f"units[{ui}].slices[{si}]"
            i = index[s.tensor]
            info = params[i]
            dtypes.add(info.dtype)
            if s.offset_bytes % info.element_size or s.size_bytes % info.element_size:
                raise InputError(
                    f"offset {s.offset_bytes} / bytes {s.size_bytes} of {s.tensor!r} are not "
                    f"multiples of its element size {info.element_size}",
                    where=where,
                    field=field,
                )
            if s.size_bytes <= 0 or s.offset_bytes < 0:
                raise InputError(
                    "a slice needs offset >= 0 and bytes > 0", where=where, field=field
                )
            start = s.offset_bytes // info.element_size
            stop = start + s.size_bytes // info.element_size
            if stop > info.numel:
                raise ScheduleMismatchError(
                    f"slice ends at byte {s.offset_bytes + s.size_bytes} but model parameter "
                    f"{s.tensor!r} has {info.size_bytes} bytes",
                    where=where,
                    field=field,
                )
            covered[i].append((start, stop, field))
            pieces.append(Piece(param=i, start=start, stop=stop))
        if len(dtypes) > 1:
            raise InputError(
                f"a fused unit must carry one dtype, this one mixes {sorted(dtypes)}; `pace "
                "compile` fuses only tensors of one dtype where the trace records dtypes (`pace "
                "profile` and `pace import` of this version do) and of one element size where "
                "it does not: profile again and compile, or compile with --no-fusion "
                "--no-order-search",
                where=where,
                field=f"units[{ui}]",
            )
        units.append(
            PlanUnit(
                index=issue_pos, pieces=tuple(pieces), priority=unit.priority, dtype=dtypes.pop()
            )
        )

    for i, info in enumerate(params):
        at = 0
        for start, stop, field in sorted(covered[i]):
            if start != at:
                what = "overlaps the previous slice" if start < at else f"leaves a gap at {at}"
                raise InputError(
                    f"slice of {info.name!r} starting at element {start} {what}",
                    where=where,
                    field=field,
                )
            at = stop
        if at != info.numel:
            raise ScheduleMismatchError(
                f"schedule covers {at * info.element_size} bytes of {info.name!r}, the model "
                f"parameter has {info.size_bytes} bytes",
                where=where,
                field="units",
            )
    return ReplayPlan(
        units=tuple(units),
        pieces_per_param=tuple(len(c) for c in covered),
        source="schedule",
    )


def wfbp_plan(params: Sequence[ParamInfo]) -> ReplayPlan:
    """One unit per parameter in reverse registration order (backward order of a sequential model).

    This is the fallback plan for the torch backend: what plain data-parallel training does
    without fusion (wait-free back-propagation).
    """
    units = tuple(
        PlanUnit(
            index=pos,
            pieces=(Piece(param=i, start=0, stop=params[i].numel),),
            priority=float(pos),
            dtype=params[i].dtype,
        )
        for pos, i in enumerate(reversed(range(len(params))))
    )
    return ReplayPlan(units=units, pieces_per_param=(1,) * len(params), source="wfbp")


def partition_params(params: Sequence[ParamInfo], partition_bytes: int) -> ReplayPlan:
    """ByteScheduler's partitions: every parameter cut into pieces of at most ``partition_bytes``.

    Priority is the layer order (registration order: the input layer first), then the offset,
    as in ByteScheduler's Alg. 1. The units are listed in priority order; the online dispatcher
    decides the issue order at run time.
    """
    if partition_bytes <= 0:
        raise InputError("must be > 0", where="partition_bytes")
    units: list[PlanUnit] = []
    counts = []
    for i, info in enumerate(params):
        step = max(1, partition_bytes // info.element_size)
        n = 0
        for start in range(0, info.numel, step):
            units.append(
                PlanUnit(
                    index=len(units),
                    pieces=(Piece(param=i, start=start, stop=min(info.numel, start + step)),),
                    priority=float(len(units)),
                    dtype=info.dtype,
                )
            )
            n += 1
        counts.append(n)
    return ReplayPlan(units=tuple(units), pieces_per_param=tuple(counts), source="bytescheduler")
