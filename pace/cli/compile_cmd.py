"""``pace compile TRACE -o SCHEDULE``: fuse, schedule, and compare with every baseline.

Writes the schedule file (schedule format v1) and prints the fusion plan (groups and sizes), the
predicted iteration time, the lower bound and the gap to it, every simulated baseline, and the
compile time. ``--json`` prints one object instead (keys in docs/design.md). Warnings go to stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pace.cli._options import OutputPath, add_what_if_options, float_in, floats_in
from pace.cli._output import print_json, print_table, warn
from pace.io import MAX_COMPUTE_SPEEDUP, MIN_COMPUTE_SPEEDUP
from pace.options import FUSION_METHODS, SCHEDULE_MODES, SOLVERS, FusionMethod

# Groups listed one per row in the human-readable plan; longer plans are summarised.
_MAX_GROUP_ROWS = 40


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "compile",
        help="compile a trace into a fused, preemptive all-reduce schedule",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("trace", metavar="TRACE", help="trace file (.json or .json.gz)")
    p.add_argument(
        "-o",
        "--output",
        metavar="SCHEDULE",
        required=True,
        action=OutputPath,
        help="schedule file to write (replaced atomically: readers see the old or the new file)",
    )
    p.add_argument(
        "--fusion",
        choices=FUSION_METHODS,
        default=None,
        help="fusion method: search (default; beyond PACE Alg. 1), paper (Alg. 1), none",
    )
    p.add_argument(
        "--no-fusion", action="store_true", help="one all-reduce per tensor (= --fusion none)"
    )
    p.add_argument(
        "--solver",
        choices=SOLVERS,
        default="exact",
        help="exact (largest tail first, default) or lp (the paper's LP; falls back to exact)",
    )
    add_what_if_options(p)
    p.add_argument(
        "--mode",
        choices=SCHEDULE_MODES,
        default="overlap",
        help="the training loop the schedule is for: overlap (default; the runtime applies each "
        "update as soon as its gradient is reduced) or sync (wrap(..., sync=True): backward() "
        "returns with every gradient reduced, as DDP's; for clipping, GradScaler, ...)",
    )
    p.add_argument(
        "--robust",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="pick, among schedules nominally within --robust-tolerance of the best, the one "
        "with the best mean replay under timing jitter (default: on; see docs/scheduling.md)",
    )
    p.add_argument(
        "--robust-tolerance",
        **float_in(0.0, 1.0, hi_open=True),
        metavar="F",
        default=None,
        help="relative nominal slow-down a robust choice may cost (default 0.005)",
    )
    p.add_argument(
        "--hedge",
        metavar="TRACE",
        action="append",
        default=[],
        help="another cost model of the same job (a trace with the same ops and tensors, another "
        "comm), where the model is uncertain: ship the schedule with the least worst regret "
        "over all the models (repeatable; docs/scheduling.md, section 9)",
    )
    p.add_argument(
        "--hedge-compute",
        **floats_in(MIN_COMPUTE_SPEEDUP, MAX_COMPUTE_SPEEDUP),
        metavar="X",
        help="the job may compute X times faster than the trace (0.8: 1.25x slower): also "
        "compile for that and ship, among schedules within --robust-tolerance of the "
        "pipeline's on the trace, the one that loses least at that speed (repeatable; "
        "docs/scheduling.md, 'Robust to the compute's speed')",
    )
    p.add_argument(
        "--no-framework",
        action="store_true",
        help="replay the units even where the trace's measured framework path (comm.framework, "
        "vanilla Horovod) replays faster; by default the schedule then tells the runtime to "
        "train with that path (docs/scheduling.md, 'The framework's own path')",
    )
    p.add_argument(
        "--framework-margin",
        **float_in(0.0, 1.0),
        metavar="F",
        default=None,
        help="ship the units only where they replay at least this fraction faster than the "
        "framework's own path; else train with the path (default 0.05: the model's accuracy)",
    )
    p.add_argument(
        "--no-order-search",
        action="store_true",
        help="ship the units in the order the schedule's replay starts them; by default that "
        "order is searched under the runtime's strict-order replay (docs/scheduling.md, "
        "section 13)",
    )
    p.add_argument(
        "--no-join-units",
        action="store_true",
        help="let the order search move units only; by default it also joins two units into one "
        "where the runtime's replay is faster (every unit is a collective call, with its cost)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _fusion_method(args: argparse.Namespace) -> FusionMethod:
    from pace.errors import InputError

    if args.no_fusion:
        if args.fusion not in (None, "none"):
            raise InputError(f"conflicts with --fusion {args.fusion}", where="--no-fusion")
        return "none"
    method: FusionMethod = args.fusion or "search"  # argparse held it to FUSION_METHODS
    return method


def run(args: argparse.Namespace) -> int:
    from pace.compiler import compile_trace
    from pace.io import load_trace, save_schedule

    fusion = _fusion_method(args)
    trace = load_trace(args.trace)
    result = compile_trace(
        trace,
        fusion=fusion,
        solver=args.solver,
        bandwidth_gbps=args.bandwidth_gbps,
        workers=args.workers,
        compute_speedup=args.compute_speedup,
        mode=args.mode,
        robust=args.robust,
        robust_tolerance=args.robust_tolerance,
        hedge=[load_trace(path) for path in args.hedge],
        compute_hedge=args.hedge_compute,
        framework=not args.no_framework,
        framework_margin=args.framework_margin,
        order_search=not args.no_order_search,
        join_units=not args.no_join_units,
    )
    save_schedule(result.schedule, args.output)
    for w in result.warnings:
        warn(w)

    sizes = {t.name: t.size_bytes for t in result.trace.tensors}
    groups: list[tuple[list[str], int]] = [
        (list(g), sum(sizes[n] for n in g)) for g in result.plan.groups
    ]
    if args.json:
        details = {
            k: v
            for k, v in result.plan.details.items()
            if isinstance(v, int | float | str | dict | list)
        }
        print_json(
            {
                "trace": str(args.trace),
                "schedule": str(args.output),
                "mode": result.schedule.mode,
                "predicted_iteration_us": result.predicted_iteration_us,
                "lower_bound_us": result.lower_bound_us,
                "gap": result.gap,
                "baselines": dict(result.baselines),
                "compile_seconds": result.compile_seconds,
                "stage_seconds": dict(result.stage_seconds),
                "units": len(result.schedule.units),
                "fusion": result.plan.method,
                "fusion_groups": [{"tensors": names, "bytes": b} for names, b in groups],
                "fusion_details": details,
                "solver": args.solver,
                "robust": result.schedule.meta.get("robust"),
                "hedge": result.schedule.meta.get("hedge"),
                "compute_hedge": result.schedule.meta.get("compute_hedge"),
                "order_search": result.schedule.meta.get("order_search"),
                "framework": result.schedule.framework,
                "framework_us": result.framework_us,
                "cost_model": {
                    "alpha_us": result.trace.comm.alpha_us,
                    "beta_us_per_byte": result.trace.comm.beta_us_per_byte,
                    "workers": result.trace.comm.workers,
                },
                "warnings": list(result.warnings),
            }
        )
        return 0

    rows: list[list[Any]] = [
        [i, len(members), nbytes, _names(members)]
        for i, (members, nbytes) in enumerate(groups[:_MAX_GROUP_ROWS])
    ]
    if len(groups) > _MAX_GROUP_ROWS:
        rest = groups[_MAX_GROUP_ROWS:]
        rows.append(
            [
                f"+{len(rest)} more",
                sum(len(names) for names, _ in rest),
                sum(b for _, b in rest),
                "",
            ]
        )
    print_table(
        f"fusion plan ({result.plan.method}): {len(groups)} groups of "
        f"{len(result.trace.tensors)} tensors",
        ["group", "tensors", "bytes", "members"],
        rows,
    )
    predicted = result.predicted_iteration_us
    summary: list[list[Any]] = [
        ["pace (compiled)", predicted, _vs(result, predicted)],
        ["lower bound", result.lower_bound_us, "-"],
    ]
    if result.framework_us is not None:
        chosen = " (trained instead)" if result.schedule.framework else ""
        summary.append([f"framework's own path{chosen}", result.framework_us, "-"])
    for name, us in sorted(result.baselines.items(), key=lambda kv: kv[1]):
        summary.append([name, us, _vs(result, us)])
    print_table(
        f"iteration time (us), {result.schedule.mode} mode, schedule written to {args.output}",
        ["policy", "iteration_us", "vs lower bound"],
        summary,
    )
    sys.stdout.write(
        f"gap to lower bound: {result.gap * 100:.3f}%   units: {len(result.schedule.units)}   "
        f"compile: {result.compile_seconds:.3f} s\n"
    )
    if hedge := result.schedule.meta.get("hedge"):
        names = [str(args.trace), *args.hedge]
        labels = [
            names[m] + (" (order searched)" if searched else "")
            for m, searched in zip(hedge["compiled_under"], hedge["order_searched"], strict=True)
        ]
        print_table(
            "hedge: each model's schedule replayed under every model (us)",
            ["compiled under", *names, "worst regret"],
            [
                [f"{'* ' if i == hedge['chosen'] else ''}{labels[i]}", *row, f"{r:.2%}"]
                for i, (row, r) in enumerate(zip(hedge["replays_us"], hedge["regret"], strict=True))
            ],
        )
    if ch := result.schedule.meta.get("compute_hedge"):
        labels = ch["candidates"]
        print_table(
            "compute hedge: each schedule replayed on the trace and with the compute X times "
            f"faster (us; admissible within {ch['tolerance']:.2%} on the trace)",
            ["schedule", "trace", *(f"x{s:g}" for s in ch["speedups"])],
            [
                [f"{'* ' if i == ch['chosen'] else ''}{label}", nominal, *row]
                for i, (label, nominal, row) in enumerate(
                    zip(labels, ch["nominal_us"], ch["replays_us"], strict=True)
                )
            ],
        )
    if (order := result.schedule.meta.get("order_search")) and order.get("moves"):
        sys.stdout.write(
            f"issue order searched: {order['moves']} steps ({order['joins']} units "
            f"joined), {order['before_us'][0]:.1f} -> "
            f"{order['after_us'][0]:.1f} us in the runtime's order ({order['replays']} replays)\n"
        )
    return 0


def _vs(result: Any, us: float) -> str:
    if result.lower_bound_us <= 0:
        return "-"
    return f"+{(us / result.lower_bound_us - 1.0) * 100:.3f}%"


def _names(names: list[str]) -> str:
    if len(names) <= 3:
        return ", ".join(names)
    return f"{names[0]} .. {names[-1]}"
