"""``pace compare TRACE``: every baseline policy side by side, plus the lower bound.

For each policy: iteration time, speed-up over ``fifo`` (WFBP), communication busy time and the
part of it overlapped with computation. ``--schedule FILE`` adds a compiled schedule as one more
row. Simulator options (``--credit``, ``--barrier``, ``--one-compute-stream``), if given,
override every policy's defaults.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from pace.cli._output import print_json, print_table, warn
from pace.cli.simulate_cmd import (
    add_trace_options,
    load_trace_and_schedule,
    replay,
    result_summary,
    sim_options,
)
from pace.errors import InputError
from pace.options import POLICY_NAMES


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "compare",
        help="replay every baseline policy on a trace, side by side",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("trace", metavar="TRACE", help="trace file (.json or .json.gz)")
    p.add_argument(
        "--schedule",
        metavar="FILE",
        action="append",
        help="also replay this compiled schedule, on the loop of its mode (repeatable: an "
        "overlap and a sync schedule of one trace show what the synchronous mode costs)",
    )
    p.add_argument(
        "--policies",
        metavar="NAMES",
        help="comma-separated subset of the baselines (fifo, the reference, is always run)",
    )
    add_trace_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from pace.analysis import analyze
    from pace.compiler import best_lower_bound_us
    from pace.errors import LimitError
    from pace.sim import SimOptions

    paths: list[str] = list(args.schedule or [])
    # The baselines replay on the trace as the first schedule was compiled for (its cost model
    # and compute speed-up), in the overlapped loop; each schedule on the loop of its own mode.
    trace, _ = load_trace_and_schedule(
        args, schedule_path=paths[0] if paths else None, apply_mode=False
    )
    scheduled: list[tuple[str, Any, Any]] = []
    for path in paths:
        s_trace, sched = load_trace_and_schedule(args, schedule_path=path)
        name = "schedule" if sched.mode == "overlap" else f"schedule ({sched.mode})"
        if name in {n for n, _, _ in scheduled}:
            name = f"{name} #{len(scheduled) + 1}"
        scheduled.append((name, s_trace, sched))
    options = sim_options(args)
    explicit = options != SimOptions()
    rows: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    names: list[str] = list(POLICY_NAMES)
    if args.policies is not None:
        wanted = [n.strip() for n in args.policies.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in POLICY_NAMES]
        if unknown:
            raise InputError(
                f"unknown policy {unknown[0]!r}; known: {', '.join(POLICY_NAMES)}",
                where="--policies",
            )
        names = ["fifo", *(n for n in dict.fromkeys(wanted) if n != "fifo")]
    with Progress(transient=True, disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task("simulating", total=len(names) + len(scheduled) + 1)
        for name in names:
            progress.update(task, description=name)
            try:
                rows[name] = replay(trace, name, options)
            except LimitError as exc:
                # Valid, but beyond what a replay may cost: the other policies still compare.
                skipped[name] = exc.detail
            progress.advance(task)
        for name, s_trace, sched in scheduled:
            rows[name] = replay(s_trace, sched, options)
        progress.update(task, description="lower bound")
        bound, bound_kind = best_lower_bound_us(trace)
        progress.advance(task)
    critical = analyze(trace).critical_path_us
    fifo_us = rows["fifo"].iteration_us
    for name, why in skipped.items():
        warn(f"{name} not replayed: {why}")

    policies: dict[str, Any] = {}
    for name, res in rows.items():
        summary = result_summary(res)
        summary["speedup_vs_fifo"] = fifo_us / res.iteration_us if res.iteration_us > 0 else 1.0
        policies[name] = summary
    if args.json:
        print_json(
            {
                "trace": str(args.trace),
                "model": trace.model,
                "options_overridden": explicit,
                "lower_bound_us": bound,
                "lower_bound_kind": bound_kind,
                "critical_path_us": critical,
                "baselines": {name: res.iteration_us for name, res in rows.items()},
                "policies": policies,
                "skipped": skipped,
            }
        )
        return 0
    table_rows: list[list[Any]] = []
    for name, p in policies.items():
        opts = p["options"]
        parts = []
        if opts["credit"] is not None:
            parts.append(f"credit={opts['credit']}")
        if opts["credit_bytes"] is not None:
            window = opts["credit_bytes"]
            shown = f"{window / 1e6:.3g}MB" if window >= 1e6 else f"{window / 1e3:.3g}KB"
            parts.append(f"window={shown}")
        if opts["barrier"]:
            parts.append("barrier")
        mode = " ".join(parts)
        if opts["one_compute_stream"]:
            mode += " 1-stream"
        if opts["queued"]:
            mode += " queued"
        if opts["agreed_readiness"]:
            mode += " agreed"
        table_rows.append(
            [
                name,
                p["iteration_us"],
                f"{p['speedup_vs_fifo']:.3f}x",
                p["comm_busy_us"],
                p["overlap_us"],
                p["units"],
                mode,
            ]
        )
    # NaN prints as "-" and keeps the numeric columns right-aligned.
    nan = math.nan
    table_rows.append(
        [
            f"lower bound ({bound_kind})",
            bound,
            # A trace whose durations and costs are all zero has a zero bound.
            f"{fifo_us / bound:.3f}x" if bound > 0 else "-",
            nan,
            nan,
            nan,
            "",
        ]
    )
    print_table(
        f"pace compare {args.trace} ({trace.model})",
        ["policy", "iteration_us", "vs fifo", "comm_busy_us", "overlap_us", "units", "mode"],
        table_rows,
    )
    return 0
