"""``pace recompile TRACE --observed STATS.json -o SCHEDULE``: recompile for observed drift.

The offline equivalent of the runtime's drift loop (docs/drift.md): re-estimates the trace from
the statistics a run dumped (per-phase compute scale, refitted alpha/beta; median over the last
``--window`` iterations), compiles a schedule for it and writes it. With ``--schedule CURRENT``
(the schedule that was running) it also replays CURRENT on the re-estimated trace and says
whether the online trigger would switch (predicted gain above ``--gain-threshold``).
``--trace-out`` writes the re-estimated trace.
"""

from __future__ import annotations

import argparse
from typing import Any

from pace.cli._output import print_json, print_table
from pace.errors import InputError


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "recompile",
        help="re-estimate a trace from observed run statistics and compile a new schedule",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("trace", metavar="TRACE", help="the trace the run's schedule was compiled from")
    p.add_argument(
        "--observed", required=True, metavar="STATS", help="stats.json dumped by the runtime"
    )
    p.add_argument("-o", "--output", required=True, metavar="SCHEDULE", help="schedule to write")
    p.add_argument(
        "--schedule", metavar="CURRENT", help="the schedule that was running (to predict the gain)"
    )
    p.add_argument("--trace-out", metavar="FILE", help="also write the re-estimated trace")
    p.add_argument("--window", type=int, default=20, metavar="N", help="iterations (default 20)")
    p.add_argument(
        "--gain-threshold",
        type=float,
        default=0.05,
        metavar="G",
        help="switch only above this predicted relative gain (default 0.05, AutoByte's)",
    )
    p.add_argument("--fusion", default="search", choices=("search", "paper", "none"))
    p.add_argument("--solver", default="exact", choices=("exact", "lp"))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pace.drift.estimate import EstimateOptions, ObservedStats
    from pace.drift.offline import recompile
    from pace.drift.trigger import TriggerOptions
    from pace.io import load_schedule, load_trace, save_schedule, save_trace

    try:
        est_opts = EstimateOptions(window=args.window)
    except ValueError as exc:
        raise InputError(str(exc), where="--window") from None
    try:
        trig_opts = TriggerOptions(gain_threshold=args.gain_threshold)
    except ValueError as exc:
        raise InputError(str(exc), where="--gain-threshold") from None
    trace = load_trace(args.trace)
    stats = ObservedStats.load(args.observed)
    current = load_schedule(args.schedule, trace=trace) if args.schedule else None
    try:
        res = recompile(
            trace,
            stats,
            current=current,
            fusion=args.fusion,
            solver=args.solver,
            estimate_options=est_opts,
            trigger_options=trig_opts,
        )
    except InputError as exc:
        raise exc.located(args.observed) from None
    save_schedule(res.schedule, args.output)
    if args.trace_out:
        save_trace(res.trace, args.trace_out)
    est = res.estimate
    out: dict[str, Any] = {
        "trace": str(args.trace),
        "observed": str(args.observed),
        "schedule": str(args.output),
        "predicted_iteration_us": res.predicted_iteration_us,
        "compile_seconds": res.compile_seconds,
        "units": len(res.schedule.units),
        "estimate": est.summary(),
        "current_us": res.current_us,
        "gain": res.gain,
        "switch": res.switch,
    }
    if args.json:
        print_json(out)
        return 0
    rows: list[tuple[str, Any]] = [
        ("observed iteration_us (median)", est.observed_iteration_us),
        ("iterations used", est.iterations_used),
        ("forward scale", f"{est.forward_scale:.3f}"),
        ("backward scale", f"{est.backward_scale:.3f}"),
        ("alpha_us", est.alpha_us),
        ("beta_us_per_byte", f"{est.beta_us_per_byte:.6g}"),
        ("predicted_iteration_us (new)", res.predicted_iteration_us),
        ("compile_seconds", f"{res.compile_seconds:.3f}"),
        ("units", len(res.schedule.units)),
    ]
    if res.current_us is not None and res.gain is not None:
        rows.append(("current schedule, re-predicted", res.current_us))
        rows.append(("predicted gain", f"{100 * res.gain:.1f}%"))
        rows.append(("switch (gain > threshold)", "yes" if res.switch else "no"))
    print_table(f"pace recompile {args.trace} -> {args.output}", ["field", "value"], rows)
    return 0
