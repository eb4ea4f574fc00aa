"""``pace simulate TRACE (--policy NAME | --schedule FILE)``: replay one policy on a trace.

Prints the iteration time (``--json``: one object with at least ``iteration_us``; keys in
docs/design.md). Options change the simulator's mode (docs/simulator.md; the default is the
replay semantics of docs/schedule-format.md):
``--credit N`` units in flight sharing the bandwidth, ``--credit-bytes B`` a byte window,
``--barrier`` (the next forward waits for all communication), ``--one-compute-stream`` (ops
serialised), ``--queued`` (units in flight cross one at a time in issue order),
``--agreed-readiness`` (a unit waits until every rank knows its gradients are ready, as in the
runtime's online mode). ``--no-barrier`` etc. override a
policy's own default (``fifo``, ``horovod`` and ``ddp`` default to a barrier).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any

from pace.cli._options import add_credit_options, add_what_if_options
from pace.cli._output import print_json, print_table
from pace.errors import InputError, LimitError
from pace.options import POLICY_NAMES


def add_trace_options(p: argparse.ArgumentParser) -> None:
    """Options shared with ``pace compare``: the what-if cost model and simulator modes."""
    add_what_if_options(p)
    add_credit_options(p)
    p.add_argument(
        "--barrier",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the next forward pass waits for all communication (default: the policy's)",
    )
    p.add_argument(
        "--one-compute-stream",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run ops one at a time on one stream instead of unlimited parallel compute",
    )
    p.add_argument(
        "--queued",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="units in flight cross the link one at a time in issue order (an in-order backend)"
        " instead of sharing its bandwidth",
    )
    p.add_argument(
        "--agreed-readiness",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a unit goes only once every rank knows its gradients are ready (learnt from "
        "completed calls or a probe round, as the runtime's online mode)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="replay a policy or a compiled schedule on a trace",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("trace", metavar="TRACE", help="trace file (.json or .json.gz)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--policy", metavar="NAME", help="a baseline policy (see pace compare)")
    which.add_argument("--schedule", metavar="FILE", help="a compiled schedule of TRACE")
    add_trace_options(p)
    p.set_defaults(func=run)


def load_trace_what_if(args: argparse.Namespace) -> Any:
    """The trace of ``args.trace``, verified, with the what-if cost model applied."""
    return load_trace_and_schedule(args)[0]


def load_trace_and_schedule(
    args: argparse.Namespace, *, schedule_path: str | None = None, apply_mode: bool = True
) -> tuple[Any, Any]:
    """The what-if trace of ``args.trace`` and ``args.schedule`` (or None), checked together.

    The schedule is matched against the trace as profiled (its digest names that file), then the
    what-if is applied. A schedule compiled with ``--compute-speedup`` carries the speedup in its
    ``meta``, and every schedule its ``cost_model``; they apply unless the command line gives
    ``--compute-speedup`` / ``--bandwidth-gbps`` / ``--workers``. A schedule compiled for the
    runtime's synchronous mode (``mode: sync``) replays on that loop (``pace.compiler.sync_trace``)
    unless ``apply_mode`` is false. ``schedule_path`` overrides ``args.schedule``.
    """
    from pace.compiler import apply_what_if
    from pace.io import load_schedule, load_trace

    trace = load_trace(args.trace)
    schedule = None
    speedup = args.compute_speedup
    path = schedule_path if schedule_path is not None else getattr(args, "schedule", None)
    if path is not None:
        schedule = load_schedule(path, trace=trace)
        # In range: pace.io checks meta.compute_speedup and names the schedule file.
        if speedup is None:
            speedup = schedule.compute_speedup
    if schedule is not None and args.bandwidth_gbps is None and args.workers is None:
        # A schedule compiled for a what-if cluster replays on the cost model it was compiled
        # for (as `pace validate` does), unless the command line asks for another.
        trace = dataclasses.replace(trace, comm=schedule.cost_model)
    trace = apply_what_if(
        trace,
        bandwidth_gbps=args.bandwidth_gbps,
        workers=args.workers,
        compute_speedup=speedup,
        mode=schedule.mode if schedule is not None and apply_mode else "overlap",
    )
    return trace, schedule


def sim_options(args: argparse.Namespace) -> Any:
    from pace.sim import SimOptions

    try:
        return SimOptions(
            credit=args.credit,
            barrier=args.barrier,
            one_compute_stream=args.one_compute_stream,
            credit_bytes=args.credit_bytes,
            queued=args.queued,
            agreed_readiness=args.agreed_readiness,
        )
    except InputError as exc:
        raise InputError(exc.detail, where=_OPTION_FLAGS.get(exc.field, "options")) from None


# SimOptions fields and the flags that set them, so that the simulator's errors about an
# option name what the user typed.
_OPTION_FLAGS = {
    "credit": "--credit",
    "credit_bytes": "--credit-bytes",
    "barrier": "--barrier",
    "one_compute_stream": "--one-compute-stream",
    "queued": "--queued",
    "agreed_readiness": "--agreed-readiness",
}


def replay(trace: Any, policy: Any, options: Any) -> Any:
    """``pace.sim.simulate``, with an error about a simulator option blamed on its flag."""
    from pace.sim import simulate

    try:
        return simulate(trace, policy, options=options)
    except InputError as exc:
        if not exc.where and exc.field in _OPTION_FLAGS:
            raise InputError(exc.detail, where=_OPTION_FLAGS[exc.field]) from None
        raise


def result_summary(res: Any) -> dict[str, Any]:
    """The JSON fields of one replay."""
    return {
        "policy": res.policy,
        "iteration_us": res.iteration_us,
        "comm_busy_us": res.comm_busy_us,
        "comm_end_us": res.comm_end_us,
        "overlap_us": res.overlap_us,
        "units": len(res.units),
        "options": {
            "credit": res.options.credit,
            "barrier": res.options.barrier,
            "one_compute_stream": res.options.one_compute_stream,
            "credit_bytes": res.options.credit_bytes,
            "queued": res.options.queued,
            "agreed_readiness": res.options.agreed_readiness,
        },
        "knobs": dict(res.knobs),
    }


def run(args: argparse.Namespace) -> int:
    trace, schedule = load_trace_and_schedule(args)
    options = sim_options(args)
    policy: Any
    predicted: float | None = None
    if schedule is not None:
        policy = schedule
        predicted = float(policy.predicted_iteration_us)
    else:
        if args.policy not in POLICY_NAMES:
            raise InputError(
                f"unknown policy {args.policy!r}; known: {', '.join(POLICY_NAMES)}",
                where="--policy",
            )
        policy = args.policy
    try:
        res = replay(trace, policy, options)
    except LimitError as exc:
        raise InputError(exc.detail, where="--policy") from None
    out = result_summary(res)
    out["trace"] = str(args.trace)
    if predicted is not None:
        out["predicted_iteration_us"] = predicted
        out["matches_prediction"] = math.isclose(
            predicted, res.iteration_us, rel_tol=1e-6, abs_tol=1e-6
        )
    if args.json:
        print_json(out)
        return 0
    rows: list[tuple[str, Any]] = [
        ("policy", res.policy),
        ("iteration_us", res.iteration_us),
        ("comm_busy_us", res.comm_busy_us),
        ("overlap_us", res.overlap_us),
        ("units", len(res.units)),
        (
            "options",
            f"credit={res.options.credit} credit_bytes={res.options.credit_bytes} "
            f"barrier={res.options.barrier} "
            f"one_compute_stream={res.options.one_compute_stream} "
            f"queued={res.options.queued} agreed_readiness={res.options.agreed_readiness}",
        ),
    ]
    rows.extend((f"knob {k}", str(v)) for k, v in res.knobs.items())
    if predicted is not None:
        rows.append(("predicted_iteration_us (file)", predicted))
    print_table(f"pace simulate {args.trace}", ["field", "value"], rows)
    return 0
