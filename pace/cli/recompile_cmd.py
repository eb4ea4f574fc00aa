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

from pace.bounds import MAX_ITEMS
from pace.cli._options import OutputPath, float_in, int_in
from pace.cli._output import print_json, print_table, warn
from pace.errors import InputError
from pace.options import FUSION_METHODS, SOLVERS


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
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="SCHEDULE",
        action=OutputPath,
        help="schedule to write (replaced atomically)",
    )
    p.add_argument(
        "--schedule",
        metavar="CURRENT",
        help="the schedule that was running: predicts the gain, and the observations are "
        "compared with its replay (with an interference term, the slowdown it causes is not "
        "taken for drift)",
    )
    p.add_argument(
        "--trace-out",
        metavar="FILE",
        action=OutputPath,
        help="also write the re-estimated trace",
    )
    p.add_argument(
        "--window",
        **int_in(1, MAX_ITEMS),
        default=20,
        metavar="N",
        help="iterations (default 20)",
    )
    p.add_argument(
        "--gain-threshold",
        # A relative gain is at most 1: a larger threshold would never switch.
        **float_in(0.0, 1.0),
        default=0.05,
        metavar="G",
        help="switch only above this predicted relative gain (default 0.05, AutoByte's)",
    )
    p.add_argument("--fusion", default="search", choices=FUSION_METHODS)
    p.add_argument("--solver", default="exact", choices=SOLVERS)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _check_bounds(stats: Any, where: str) -> None:
    """The trace bounds (docs/trace-format.md, "Bounds") on a run's statistics.

    The stats reader checks types and signs; a time of 1e308 us would still overflow the
    re-estimated trace (its durations, the fit of alpha and beta) into inf. Checked here, where
    the file enters the command, naming the file and the field.
    """
    from pace.io import MAX_DURATION_US, MAX_TENSOR_BYTES, MIN_NONZERO_US

    def check(value: float | None, field: str) -> None:
        if value is not None and not (value == 0 or MIN_NONZERO_US <= value <= MAX_DURATION_US):
            raise InputError(
                f"must be 0 or in [{MIN_NONZERO_US:g}, {MAX_DURATION_US:g}] us (at most a day), "
                f"got {value!r}",
                where=where,
                field=field,
            )

    for i, it in enumerate(stats.iterations):
        path = f"iterations[{i}]"
        for key in ("iteration_us", "backward_us", "forward_us"):
            check(getattr(it, key), f"{path}.{key}")
        for name, value in it.grad_ready_us.items():
            check(value, f"{path}.grad_ready_us.{name}")
        for j, (size, value) in enumerate(it.unit_samples):
            check(value, f"{path}.units[{j}]")
            if size > MAX_TENSOR_BYTES:
                raise InputError(
                    f"bytes must be <= {MAX_TENSOR_BYTES} (2**48), got {size}",
                    where=where,
                    field=f"{path}.units[{j}]",
                )


def run(args: argparse.Namespace) -> int:
    from pace.drift.estimate import EstimateOptions, ObservedStats
    from pace.drift.offline import recompile
    from pace.drift.trigger import TriggerOptions
    from pace.io import load_schedule, load_trace, save_schedule, save_trace

    # In range already (--window, --gain-threshold are checked where argparse reads them).
    est_opts = EstimateOptions(window=args.window)
    trig_opts = TriggerOptions(gain_threshold=args.gain_threshold)
    trace = load_trace(args.trace)
    stats = ObservedStats.load(args.observed)
    _check_bounds(stats, args.observed)
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
        if exc.where in ("", "samples"):
            # The re-estimate's errors (the fit of alpha and beta to the run's unit times names
            # its own "samples") come from the observed file: the user's to fix.
            field = f"{exc.where}{exc.field}" if exc.where else exc.field
            raise InputError(exc.detail, where=args.observed, field=field) from None
        raise
    save_schedule(res.schedule, args.output)
    term = trace.comm.interference
    if current is None and term is not None and term.active:
        warn(
            "the trace has an interference term but no --schedule was given: the observations "
            "are compared with the trace's ideal spans and every unit is taken back as if it ran "
            "beside compute, which errs where units ran alone; pass --schedule with the schedule "
            "that ran (docs/drift.md, Estimate)"
        )
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
