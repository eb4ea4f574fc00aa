"""``pace import KINETO.json --execution-trace ET.json -o TRACE``: a torch.profiler trace -> trace.

Builds the trace window of docs/trace-format.md from the Chrome trace ``torch.profiler`` exports
and the execution trace recorded in the same session (docs/import.md): the op graph and the
gradients from the execution trace, durations from the Kineto events (GPU kernel time when there
are kernels), and the all-reduce cost fitted to the collectives the Kineto trace measured, or
``--comm`` / the what-if ring of ``pace profile``. torch is imported inside the handler.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from pace.cli._output import print_json, print_table
from pace.errors import InputError
from pace.options import IMPORT_TIMINGS


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "import",
        help="import a torch.profiler trace + execution trace into a trace",
        description=(__doc__ or "").splitlines()[0],
    )
    p.add_argument("kineto", metavar="KINETO", help="torch.profiler Chrome trace (.json or .gz)")
    p.add_argument(
        "--execution-trace",
        metavar="ET",
        help="the ExecutionTraceObserver file of the same profiling session",
    )
    p.add_argument(
        "--parameters",
        metavar="FILE",
        help="named_parameters() file (pace.importer.save_parameters), for traces without names",
    )
    p.add_argument("-o", "--output", required=True, help="trace file to write (.json or .json.gz)")
    p.add_argument(
        "--timing",
        choices=IMPORT_TIMINGS,
        help=(
            "span: CPU wall time to the next op; kernel: CPU time inside the op; device: GPU "
            "kernel time (default: device when the trace has GPU kernels, else span)"
        ),
    )
    p.add_argument(
        "--no-order-edges",
        action="store_true",
        help="keep only data dependencies (drop the one-stream order edges)",
    )
    p.add_argument("--name", help="model name to record in the trace")
    p.add_argument("--comm", metavar="FILE", help="cost model to embed (pace profile-comm)")
    p.add_argument("--workers", type=int, help="what-if: re-derive the cost for W workers")
    p.add_argument("--bandwidth-gbps", type=float, help="what-if: ring bandwidth")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401 - the window is built with the profiler's record types
    except ImportError as exc:
        raise InputError("torch is not installed (pip install 'pace[profile]')") from exc
    from pace.cost import what_if
    from pace.importer import import_trace
    from pace.io import save_trace

    comm = None
    if args.comm:
        from pace.profiler.comm import load_comm

        comm = load_comm(args.comm)
    result = import_trace(
        args.kineto,
        execution_trace=args.execution_trace,
        parameters=args.parameters,
        comm=comm,
        timing=args.timing,
        order_edges=not args.no_order_edges,
        name=args.name,
    )
    trace = result.trace
    if args.workers is not None or args.bandwidth_gbps is not None:
        meta = dict(trace.meta)
        meta["comm_source"] = f"{meta.get('comm_source', '')}, what-if workers/bandwidth applied"
        trace = dataclasses.replace(
            trace,
            comm=what_if(trace.comm, bandwidth_gbps=args.bandwidth_gbps, workers=args.workers),
            meta=meta,
        )
    save_trace(trace, args.output)
    fw = [o for o in trace.ops if o.phase == "forward"]
    bw = [o for o in trace.ops if o.phase == "backward"]
    summary: dict[str, Any] = {
        "output": args.output,
        "model": trace.model,
        "steps": len(trace.meta.get("steps", [])),
        "timing": trace.meta.get("timing"),
        "forward_ops": len(fw),
        "backward_ops": len(bw),
        "tensors": len(trace.tensors),
        "total_bytes": trace.total_bytes,
        "forward_us": sum(o.duration_us for o in fw),
        "backward_us": sum(o.duration_us for o in bw),
        "parameter_names": trace.meta.get("parameter_names"),
        "allreduce_calls": result.comm.calls,
        "allreduce_sizes": len(result.comm.samples),
        "comm_source": trace.meta.get("comm_source"),
        "alpha_us": trace.comm.alpha_us,
        "beta_us_per_byte": trace.comm.beta_us_per_byte,
        "workers": trace.comm.workers,
        "warnings": list(result.warnings),
    }
    if args.json:
        print_json(summary)
        return 0
    print_table(
        f"pace import {args.kineto} -> {args.output}",
        ["quantity", "value"],
        [
            [k, f"{v:.3e}" if k == "beta_us_per_byte" else v]
            for k, v in summary.items()
            if k not in ("output", "model", "warnings")
        ],
    )
    for line in result.warnings:
        sys.stderr.write(f"pace: warning: {line}\n")
    return 0
