"""``pace profile`` (real iterations -> trace) and ``pace profile-comm`` (all-reduce cost).

``pace profile --model torchvision:resnet50 --batch-size 32 --iters 5 -o traces/r50.json.gz``
runs real training iterations and writes the trace window of docs/trace-format.md; the
all-reduce cost model it embeds is a measured one (``--comm comm.json``) or a ring what-if
(``--workers``, ``--bandwidth-gbps``; default 8 workers, 10 Gbps).

``pace profile-comm --backend gloo --workers 2 -o comm.json`` launches real worker processes,
times all-reduce over a size sweep and fits ``alpha + beta * bytes``.

torch is imported inside the handlers, so ``pace --help`` works without it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import Any

from pace.bounds import MAX_TENSOR_BYTES, MAX_WORKERS
from pace.cli._options import (
    MAX_BANDWIDTH_GBPS,
    MIN_BANDWIDTH_GBPS,
    OutputPath,
    float_in,
    int_in,
)
from pace.cli._output import print_json, print_table, warn
from pace.errors import InputError
from pace.options import COMM_BENCH_BACKENDS, PROFILE_TIMINGS

# Iterations, batch sizes, image sizes...: bounded so that no flag can ask for an absurd run.
_MAX_COUNT = 2**20

_SUFFIX = {"": 1, "k": 1024, "kb": 1024, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30}


def _size(text: str) -> int:
    """``4096``, ``64K``, ``16M``, ``1G`` -> bytes."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b") if text.strip() else ""
    num = t.rstrip("kmg")
    unit = t[len(num) :]
    try:
        value = float(num) * _SUFFIX[unit]
    except (ValueError, KeyError) as exc:
        raise InputError(
            f"not a size: {text!r} (use e.g. 4096, 64K, 16M)", where="--sizes"
        ) from exc
    # NaN fails the comparison; 1e400 is inf and would overflow int().
    if not 4 <= value <= MAX_TENSOR_BYTES:
        raise InputError(
            f"sizes must be >= 4 bytes and <= {MAX_TENSOR_BYTES} (2**48), got {text!r}",
            where="--sizes",
        )
    return int(value)


def _as_option(exc: InputError, *, default: str) -> InputError:
    """A library error about option ``batch_size`` reported as ``--batch-size``."""
    if exc.where:
        return exc
    where = "--" + exc.field.replace("_", "-") if exc.field else default
    return InputError(exc.detail, where=where)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "profile",
        help="profile real training iterations of a model into a trace",
        description=(__doc__ or "").splitlines()[0],
    )
    p.add_argument(
        "--model",
        required=True,
        help=(
            "torchvision:NAME (random weights, no download), pace:transformer, "
            "pace:lstm-seq2seq, pace:vgg-cifar"
        ),
    )
    p.add_argument("--batch-size", **int_in(1, _MAX_COUNT), default=8)
    p.add_argument(
        "--iters", **int_in(1, _MAX_COUNT), default=5, help="measured iterations (medians)"
    )
    p.add_argument(
        "--warmup", **int_in(0, _MAX_COUNT), default=2, help="unmeasured iterations first"
    )
    p.add_argument("--image-size", **int_in(1, _MAX_COUNT), default=224, help="torchvision: H = W")
    p.add_argument(
        "--num-classes", **int_in(1, _MAX_COUNT), default=1000, help="torchvision models"
    )
    p.add_argument(
        "--seq-len", **int_in(1, _MAX_COUNT), default=64, help="built-in sequence models"
    )
    p.add_argument(
        "--threads",
        **int_in(1, 4096),
        default=1,
        help="torch intra-op threads (default 1)",
    )
    p.add_argument(
        "--timing",
        choices=PROFILE_TIMINGS,
        default="span",
        help="span: op owns the wall time to the next op (default); kernel: time inside the op",
    )
    p.add_argument(
        "--no-order-edges",
        action="store_true",
        help="keep only data dependencies (drop the one-stream order edges)",
    )
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument("--seed", **int_in(0, 2**63 - 1), default=0)
    p.add_argument("--comm", metavar="FILE", help="measured cost model (pace profile-comm)")
    p.add_argument(
        "--workers",
        **int_in(1, MAX_WORKERS),
        help="what-if: number of workers (default 8)",
    )
    p.add_argument(
        "--bandwidth-gbps",
        **float_in(MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS),
        help="what-if: ring bandwidth (default 10)",
    )
    p.add_argument(
        "-o", "--output", required=True, action=OutputPath, help="trace file (.json or .json.gz)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=run_profile)

    c = subparsers.add_parser(
        "profile-comm",
        help="measure all-reduce cost with real worker processes and fit alpha + beta*bytes",
        description="Time all-reduce over a size sweep with W real processes; fit the cost.",
    )
    c.add_argument("--backend", choices=COMM_BENCH_BACKENDS, default="gloo")
    c.add_argument("--workers", **int_in(1, MAX_WORKERS), default=2)
    c.add_argument("--sizes", help="comma-separated sizes in bytes (64K, 16M ...)")
    c.add_argument(
        "--for-trace",
        metavar="TRACE",
        help="sweep from the smallest to the largest gradient tensor of this trace",
    )
    c.add_argument(
        "--reps",
        **int_in(1, _MAX_COUNT),
        default=10,
        help="timed all-reduces per size (median)",
    )
    c.add_argument("--warmup", **int_in(0, _MAX_COUNT), default=2)
    c.add_argument(
        "--interference",
        action="store_true",
        help="also measure what compute and all-reduces cost each other on these processes "
        "(the cost model's interference term, docs/simulator.md)",
    )
    c.add_argument(
        "--framework",
        action="store_true",
        help="with --backend horovod: also measure Horovod's own path (its defaults: fusion and "
        "response cache on, where the main fit runs under the runtime's settings), which the "
        "compiler weighs against its schedule (comm.framework, docs/scheduling.md)",
    )
    c.add_argument("-o", "--output", required=True, action=OutputPath, help="comm.json to write")
    c.add_argument(
        "--plot", metavar="PNG", action=OutputPath, help="also plot the samples and the fit"
    )
    c.add_argument("--json", action="store_true", help="print the fit as one JSON object")
    c.set_defaults(func=run_profile_comm)


def _comm_model(args: argparse.Namespace) -> tuple[Any, str]:
    from pace.cost import what_if
    from pace.profiler.comm import load_comm, what_if_comm

    if args.comm:
        model = load_comm(args.comm)
        if args.workers is None and args.bandwidth_gbps is None:
            return model, f"measured ({args.comm})"
        changed = what_if(model, bandwidth_gbps=args.bandwidth_gbps, workers=args.workers)
        return changed, f"measured ({args.comm}), what-if workers/bandwidth applied"
    workers = 8 if args.workers is None else args.workers
    bw = 10.0 if args.bandwidth_gbps is None else args.bandwidth_gbps
    model = what_if_comm(workers=workers, bandwidth_gbps=bw)
    return model, f"what-if ring: {workers} workers, {bw:g} Gbps, {model.alpha_us:g} us per call"


def _command(args: argparse.Namespace) -> str:
    parts = [
        "pace",
        "profile",
        "--model",
        args.model,
        "--batch-size",
        str(args.batch_size),
        "--iters",
        str(args.iters),
        "--warmup",
        str(args.warmup),
    ]
    if args.model.startswith("torchvision:"):
        parts += ["--image-size", str(args.image_size)]
    else:
        parts += ["--seq-len", str(args.seq_len)]
    if args.threads != 1:
        parts += ["--threads", str(args.threads)]
    if args.timing != "span":
        parts += ["--timing", args.timing]
    if args.no_order_edges:
        parts.append("--no-order-edges")
    for flag, value in (
        ("--comm", args.comm),
        ("--workers", args.workers),
        ("--bandwidth-gbps", args.bandwidth_gbps),
    ):
        if value is not None:
            parts += [flag, str(value)]
    parts += ["-o", args.output]
    return shlex.join(parts)


def run_profile(args: argparse.Namespace) -> int:
    for name in ("iters", "batch_size", "threads"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            raise InputError(f"must be >= 1, got {getattr(args, name)}", where=flag)
    if args.warmup < 0:
        raise InputError(f"must be >= 0, got {args.warmup}", where="--warmup")
    comm, comm_source = _comm_model(args)
    try:
        import torch
    except ImportError as exc:
        raise InputError("torch is not installed (pip install 'pace[profile]')") from exc
    from pace.io import save_trace
    from pace.profiler import build_workload, profile

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("CUDA is not available on this machine", where="--device")
    if args.threads is not None:
        torch.set_num_threads(args.threads)  # also for model construction
    try:
        work = build_workload(
            args.model,
            batch_size=args.batch_size,
            image_size=args.image_size,
            seq_len=args.seq_len,
            num_classes=args.num_classes,
            device=device,
            seed=args.seed,
        )
    except InputError as exc:
        raise _as_option(exc, default="--model") from None
    t0 = time.perf_counter()
    trace = profile(
        work.model,
        work.step_fn,
        iters=args.iters,
        warmup=args.warmup,
        optimizer=work.optimizer,
        comm=comm,
        threads=args.threads,
        timing=args.timing,
        order_edges=not args.no_order_edges,
        name=work.name,
        progress=not args.no_progress,
        meta={
            "batch_size": args.batch_size,
            "workload": dict(work.details),
            "command": _command(args),
            "comm_source": comm_source,
        },
    )
    seconds = time.perf_counter() - t0
    save_trace(trace, args.output)
    fw = [o for o in trace.ops if o.phase == "forward"]
    bw = [o for o in trace.ops if o.phase == "backward"]
    summary = {
        "output": args.output,
        "model": trace.model,
        "forward_ops": len(fw),
        "backward_ops": len(bw),
        "tensors": len(trace.tensors),
        "total_bytes": trace.total_bytes,
        "forward_us": sum(o.duration_us for o in fw),
        "backward_us": sum(o.duration_us for o in bw),
        "alpha_us": trace.comm.alpha_us,
        "beta_us_per_byte": trace.comm.beta_us_per_byte,
        "workers": trace.comm.workers,
        "comm_source": comm_source,
        "profile_seconds": round(seconds, 2),
    }
    if args.json:
        print_json(summary)
    else:
        print_table(
            f"pace profile {trace.model} -> {args.output}",
            ["quantity", "value"],
            [
                [k, f"{v:.3e}" if k == "beta_us_per_byte" else v]
                for k, v in summary.items()
                if k not in ("output", "model")
            ],
        )
    return 0


def run_profile_comm(args: argparse.Namespace) -> int:
    if args.workers < 2:
        raise InputError(f"must be >= 2, got {args.workers}", where="--workers")
    if args.reps < 1:
        raise InputError(f"must be >= 1, got {args.reps}", where="--reps")
    if args.sizes and args.for_trace:
        raise InputError("give --sizes or --for-trace, not both", where="--for-trace")
    from pace.profiler.comm import (
        DEFAULT_SIZES_BYTES,
        benchmark_allreduce,
        comm_to_dict,
        poor_fit_warning,
        save_comm,
        sizes_covering,
    )

    if args.sizes:
        sizes = [_size(s) for s in args.sizes.split(",") if s.strip()]
    elif args.for_trace:
        from pace.io import load_trace

        trace = load_trace(args.for_trace)
        sizes = sizes_covering([t.size_bytes for t in trace.tensors])
    else:
        sizes = list(DEFAULT_SIZES_BYTES)
    try:
        fit = benchmark_allreduce(
            backend=args.backend,
            workers=args.workers,
            sizes_bytes=sizes,
            reps=args.reps,
            warmup=args.warmup,
            interference=args.interference,
            framework=args.framework,
        )
    except InputError as exc:
        raise _as_option(exc, default="profile-comm") from None
    save_comm(fit, args.output)
    if (why := poor_fit_warning(fit)) is not None:
        warn(f"{args.output}: {why}")
    if args.plot:
        from pace.profiler.plot import plot_comm

        plot_comm(fit, args.plot)
    if args.json:
        print_json(comm_to_dict(fit))
    else:
        m = fit.model
        print_table(
            f"all-reduce, {args.backend}, {m.workers} workers -> {args.output}",
            ["bytes", "measured_us", "fit_us"],
            [[b, u, m.cost_us(b)] for b, u in m.samples],
        )
        sys.stdout.write(
            f"alpha_us={m.alpha_us:.1f} beta_us_per_byte={m.beta_us_per_byte:.3e} "
            f"(~{8e-3 / m.beta_us_per_byte if m.beta_us_per_byte > 0 else float('inf'):.2f} Gbps "
            f"algorithm bandwidth) r2={fit.r2:.4f} max_rel_error={fit.max_rel_error:.2f}\n"
        )
        if m.batched_alpha_us is not None and "batches" in fit.meta:
            b = fit.meta["batches"]
            sys.stdout.write(
                f"calls issued at once (one negotiation cycle): first {b['first_call_us']:.1f} "
                f"us, each further {b['further_call_us']:.1f} us (R^2 {b['r2']:.3f}): "
                f"batched_alpha_us={m.batched_alpha_us:.1f}\n"
            )
        if (fw := m.framework) is not None:
            sys.stdout.write(
                f"framework ({fw.backend} under its defaults): alpha_us={fw.alpha_us:.1f} "
                f"beta_us_per_byte={fw.beta_us_per_byte:.3e} "
                f"r2={fit.meta.get('framework_r2', 0):.4f}\n"
            )
        if m.interference is not None:
            t = m.interference
            sys.stdout.write(
                f"interference: compute loses {t.us_per_call:.1f} us/call + "
                f"{t.us_per_byte * 2**20:.0f} us/MiB beside all-reduces, {t.idle_loss:.3f} to "
                f"an idle backend; calls beside compute +{t.comm_us_per_call:.0f} us and x"
                f"{1 + t.comm_stretch:.3f} (R^2 {fit.meta.get('interference_r2', 0):.3f})\n"
            )
    return 0
