"""``pace timeline TRACE [--schedule FILE] -o OUT``: Gantt chart or Chrome trace of replays.

Replays the baseline(s) (``--baseline``, default ``fifo``) and, with ``--schedule``, the
compiled schedule (labelled ``pace``), with the same what-if and simulator options as
``pace simulate`` / ``pace compare`` (so the times shown are the ones they print), and writes
either a PNG with one panel per run on a shared time axis (``--format png``) or a Trace Event
Format JSON for Perfetto / ``chrome://tracing`` (``--format chrome``). Without ``--format`` the
format follows OUT's suffix: ``.json`` is a Chrome trace, anything else a PNG.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pace.cli._options import OutputPath
from pace.cli._output import print_json, print_table
from pace.cli.simulate_cmd import add_trace_options, load_trace_and_schedule, replay, sim_options
from pace.errors import InputError, LimitError
from pace.io import write_atomic
from pace.options import POLICY_NAMES, TIMELINE_FORMATS

FORMATS = TIMELINE_FORMATS


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "timeline",
        help="Gantt chart (PNG) or Chrome trace of the baseline vs a compiled schedule",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("trace", metavar="TRACE", help="trace file (.json or .json.gz)")
    p.add_argument(
        "--schedule", metavar="FILE", help="a compiled schedule of TRACE, shown as 'pace'"
    )
    p.add_argument(
        "--baseline",
        metavar="NAMES",
        default="fifo",
        help="comma-separated baseline policies to show first (default: fifo; see pace compare)",
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        action=OutputPath,
        help="file to write (replaced atomically)",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        help="png (Gantt chart) or chrome (Trace Event JSON); default: from OUT's suffix",
    )
    add_trace_options(p)
    p.set_defaults(func=run)


def output_format(args: argparse.Namespace) -> str:
    if args.format is not None:
        return str(args.format)
    return "chrome" if Path(args.output).suffix.lower() == ".json" else "png"


def baseline_names(args: argparse.Namespace) -> list[str]:
    names = list(dict.fromkeys(n.strip() for n in args.baseline.split(",") if n.strip()))
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown:
        raise InputError(
            f"unknown policy {unknown[0]!r}; known: {', '.join(POLICY_NAMES)}", where="--baseline"
        )
    if not names and args.schedule is None:
        raise InputError("nothing to show: give a policy or --schedule", where="--baseline")
    return names


def run(args: argparse.Namespace) -> int:
    from pace.timeline import build_timeline, render_png, to_chrome

    fmt = output_format(args)
    names = baseline_names(args)
    options = sim_options(args)
    trace, schedule = load_trace_and_schedule(args)
    try:
        runs = {name: replay(trace, name, options) for name in names}
    except LimitError as exc:
        raise InputError(exc.detail, where="--baseline") from None
    if schedule is not None:
        runs["pace"] = replay(trace, schedule, options)
    timeline = build_timeline(trace, runs)
    out = Path(args.output)
    try:
        if fmt == "chrome":
            text = json.dumps(to_chrome(timeline, trace=trace), allow_nan=False) + "\n"
            write_atomic(out, text.encode("ascii"))
        else:
            render_png(timeline, out)
    except ImportError as exc:
        raise InputError(str(exc), where="--format") from None
    # A list, not an object: print_json sorts keys, and the order is the panel order.
    summary = [
        {
            "label": r.label,
            "policy": r.policy,
            "iteration_us": r.iteration_us,
            "compute_lanes": r.compute_lanes,
            "comm_lanes": r.comm_lanes,
            "units": sum(1 for b in r.bars if b.kind == "comm"),
        }
        for r in timeline.runs
    ]
    if args.json:
        print_json({"trace": str(args.trace), "output": str(out), "format": fmt, "runs": summary})
        return 0
    first = timeline.runs[0].iteration_us
    print_table(
        f"pace timeline {args.trace} -> {out} ({fmt})",
        ["run", "iteration_us", f"vs {timeline.runs[0].label}", "units", "lanes (compute+comm)"],
        [
            [
                r.label,
                r.iteration_us,
                f"{first / r.iteration_us:.3f}x" if r.iteration_us > 0 else "-",
                s["units"],
                f"{r.compute_lanes}+{r.comm_lanes}",
            ]
            for r, s in zip(timeline.runs, summary, strict=True)
        ],
    )
    return 0
