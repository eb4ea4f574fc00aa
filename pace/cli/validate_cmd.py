"""``pace validate FILE [--trace TRACE] [--json]``: check a trace or schedule file.

The kind of file is taken from its ``format`` key. A schedule is checked on its own (types,
ranges) and, with ``--trace``, against the trace it claims to belong to (digest, every tensor
covered exactly once, and ``predicted_iteration_us`` equal to the simulator's replay of the
file). Any problem: one line on stderr naming file and field, exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from pace.cli._output import print_json, warn
from pace.errors import InputError
from pace.io import (
    SCHEDULE_FORMAT,
    TRACE_FORMAT,
    load_json,
    load_trace,
    schedule_from_dict,
    trace_digest,
    trace_from_dict,
)
from pace.ir import Schedule, Trace
from pace.verify import verify_schedule, verify_trace


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "validate",
        help="check a trace or schedule file (exit 2 with the offending field if malformed)",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("file", metavar="FILE", help="trace or schedule (.json or .json.gz)")
    p.add_argument(
        "--trace",
        metavar="TRACE",
        help="for a schedule: the trace it was compiled for (checks digest, coverage, prediction)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=run)


# Replay and file may sum the same floats in another order; anything beyond that is a mismatch.
_PREDICTION_RTOL = 1e-6


def _check_prediction(schedule: Schedule, trace: Trace, where: str) -> bool:
    """``predicted_iteration_us`` must be the replay of exactly this file (docs/schedule-format.md).
    Returns whether the runtime sends the units in the replay's order (a warning when not).

    The replay uses the schedule's own ``cost_model`` and ``meta.compute_speedup``: a what-if
    compile legitimately differs from the trace's measured one.
    """
    from pace.compiler import apply_what_if, issue_order_problem
    from pace.sim import schedule_policy, simulate

    if schedule.compute_speedup is not None:  # pace.io held it to its range
        trace = apply_what_if(trace, compute_speedup=schedule.compute_speedup)
    # A sync-mode schedule predicts the loop whose forward waits for every gradient.
    trace = apply_what_if(trace, mode=schedule.mode)
    replay = simulate(
        dataclasses.replace(trace, comm=schedule.cost_model), schedule_policy(schedule)
    )
    predicted = schedule.predicted_iteration_us
    if abs(replay.iteration_us - predicted) > _PREDICTION_RTOL * max(1.0, abs(replay.iteration_us)):
        raise InputError(
            f"file says {predicted:g} us, but replaying this schedule on the trace gives "
            f"{replay.iteration_us:g} us",
            where=where,
            field="predicted_iteration_us",
        )
    if schedule.in_order:  # the prediction is the runtime's order already
        return True
    # Only a file that passed is warned about: a refused one gets its one error line alone.
    why = issue_order_problem(schedule, replay.unit_start_us)
    if why is not None:
        warn(f"{where}: units: {why}")
    return why is None


def run(args: argparse.Namespace) -> int:
    where = str(args.file)
    obj = load_json(where)
    fmt = obj.get("format")
    summary: dict[str, Any]
    if fmt == TRACE_FORMAT:
        if args.trace is not None:
            raise InputError("only applies when FILE is a schedule", where="--trace")
        trace = trace_from_dict(obj, where=where)
        verify_trace(trace, where=where)
        summary = {
            "file": where,
            "kind": "trace",
            "valid": True,
            "model": trace.model,
            "ops": len(trace.ops),
            "tensors": len(trace.tensors),
            "total_bytes": trace.total_bytes,
            "trace_digest": trace_digest(trace),
        }
        text = (
            f"{where}: valid trace '{trace.model}': {len(trace.ops)} ops, "
            f"{len(trace.tensors)} tensors, {trace.total_bytes} bytes, {summary['trace_digest']}"
        )
    elif fmt == SCHEDULE_FORMAT:
        schedule = schedule_from_dict(obj, where=where)
        checked = args.trace is not None
        in_runtime_order: bool | None = None
        if checked:
            trace = load_trace(args.trace)
            verify_schedule(schedule, trace, where=where)
            in_runtime_order = _check_prediction(schedule, trace, where)
        summary = {
            "file": where,
            "kind": "schedule",
            "valid": True,
            "checked_against_trace": checked,
            # Whether priorities follow the replay's start order (None: no trace to replay).
            "in_runtime_order": in_runtime_order,
            "units": len(schedule.units),
            "predicted_iteration_us": schedule.predicted_iteration_us,
            "trace_digest": schedule.trace_digest,
        }
        scope = (
            f"matches {args.trace}"
            if checked
            else "structure only; pass --trace TRACE to check digest and coverage"
        )
        text = (
            f"{where}: valid schedule: {len(schedule.units)} units, predicted "
            f"{schedule.predicted_iteration_us:.1f} us ({scope})"
        )
    else:
        shown = repr(fmt) if isinstance(fmt, str) else "missing" if fmt is None else repr(fmt)
        raise InputError(
            f"expected {TRACE_FORMAT!r} or {SCHEDULE_FORMAT!r}, got {shown}",
            where=where,
            field="format",
        )
    if args.json:
        print_json(summary)
    else:
        print(text)
    return 0
