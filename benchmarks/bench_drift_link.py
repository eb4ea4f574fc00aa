"""Drift on a real link: the tc rate changes mid-training; does ``drift=True`` re-plan in time?

    python benchmarks/bench_drift_link.py [--rates 2gbit,500mbit] [--phase 40]

(as root, like ``bench_netns.py``, whose namespaces, veth pair and tc shaping it reuses.)

Two ranks in two network namespaces train ``pace:vgg-cifar`` on the CPU with the torch backend.
The link starts at the first rate; at iteration ``phase`` each rank sets its own egress to the
second rate (``tc`` inside its namespace, both at the same iteration), and at ``2 * phase``
back to the first. Every variant runs the same three phases in one launch, one after another:

* ``vanilla``: DDP;
* ``online``: the runtime's ByteScheduler mode (no schedule);
* ``static``: the schedule compiled for the first rate, replayed throughout;
* ``drift``: the same schedule with ``wrap(..., drift=DriftOptions(sync_every=5))``: rank 0
  re-estimates the link from the runtime's unit timings when the iteration time leaves the
  predicted band, recompiles in the background, and both ranks switch at the same iteration.

Printed per phase and variant: median iteration period and IQR; for ``drift`` the iterations
from each rate change to the trigger and to the switch, and the predicted gain of each accepted
re-plan against the measured one (static vs drift median over the rest of that phase). The
first phase compares ``drift`` with ``static`` while nothing drifts: the overhead of the
monitor and the agreement broadcasts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import bench_netns as netns  # noqa: E402

from benchmarks._common import iqr  # noqa: E402

VARIANTS = ("vanilla", "online", "static", "drift")


# --------------------------------------------------------------------------- the ranks' work


def _set_own_rate(rate: str) -> None:
    dev = os.environ["GLOO_SOCKET_IFNAME"]
    cmd = ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate]
    cmd += ["burst", "1mbit", "latency", "50ms"]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn import functional
    from torch.nn.parallel import DistributedDataParallel

    import pace.runtime
    from pace.drift import DriftOptions
    from pace.profiler.workloads import vgg_cifar

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(args.batch, 3, 32, 32, generator=g)
    y = torch.randint(0, netns.NUM_CLASSES, (args.batch,), generator=g)
    fast, slow = args.rates.split(",")
    out: dict[str, Any] = {}
    for kind in args.variants.split(","):
        torch.manual_seed(0)
        model: Any = vgg_cifar(netns.NUM_CLASSES)
        opt: Any
        if kind == "vanilla":
            model = DistributedDataParallel(model)
            opt = torch.optim.SGD(model.parameters(), lr=netns.LR, momentum=0.9)
        else:
            base = torch.optim.SGD(model.parameters(), lr=netns.LR, momentum=0.9)
            schedule = None if kind == "online" else args.schedule
            drift = DriftOptions(sync_every=5, lag=2) if kind == "drift" else False
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                opt = pace.runtime.wrap(
                    base, model, schedule, backend="torch", trace=args.trace, drift=drift
                )
        _set_own_rate(fast)
        dist.barrier()
        periods: list[float] = []
        last = time.perf_counter()
        for it in range(3 * args.phase + args.warmup):
            k = it - args.warmup  # measured iteration index; rate changes at phase boundaries
            if k == args.phase:
                _set_own_rate(slow)
            elif k == 2 * args.phase:
                _set_own_rate(fast)
            opt.zero_grad()
            functional.cross_entropy(model(x), y).backward()
            opt.step()
            now = time.perf_counter()
            if k >= 0:
                periods.append(now - last)
            last = now
        record: dict[str, Any] = {"periods": periods}
        if kind == "drift":
            loop = opt._pace_drift
            record["switched_at"] = [s - args.warmup for s in loop.switched_at]
            record["events"] = [
                (it - args.warmup, e.kind, e.current_us, e.candidate_us) for it, e in loop.decisions
            ]
        if hasattr(opt, "synchronize"):
            opt.synchronize()
        if hasattr(opt, "close"):
            opt.close()
        dist.barrier()
        out[kind] = record
    if rank == 0:
        Path(args.out).write_text(json.dumps(out))


# --------------------------------------------------------------------------- orchestration


def report(res: dict[str, Any], phase: int, rates: list[str]) -> None:
    names = [f"{rates[0]} (before)", f"{rates[1]} (changed)", f"{rates[0]} (restored)"]
    print(f"\nmedian iteration period, ms (IQR), {phase} iterations per phase")
    head = ["variant", *names]
    rows = []
    for kind, rec in res.items():
        p = rec["periods"]
        cells = [kind]
        for i in range(3):
            seg = [v * 1e3 for v in p[i * phase : (i + 1) * phase]]
            cells.append(f"{statistics.median(seg):.1f} ({iqr(seg):.1f})")
        rows.append(cells)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    drift = res.get("drift")
    static = res.get("static")
    if drift is None:
        return
    print("\ndrift decisions (iteration numbers count from the first measured iteration):")
    events = drift.get("events", [])
    for it, kind, cur, cand in events:
        gain = f", predicted gain {100 * (1 - cand / cur):+.1f}%" if cur > 0 else ""
        print(f"  iteration {it}: {kind}{gain}")
    print(f"  switched at iterations {drift.get('switched_at', [])}")
    for b, change in enumerate((phase, 2 * phase), start=1):
        fired = [e[0] for e in events if e[1] == "fired" and e[0] >= change]
        switches = [s for s in drift.get("switched_at", []) if s >= change]
        end = change + phase
        to_fire = f"{fired[0] - change}" if fired and fired[0] < end else "-"
        to_switch = f"{switches[0] - change}" if switches and switches[0] < end else "-"
        line = f"  change {b} at iteration {change}: trigger after {to_fire}, switch after "
        line += f"{to_switch} iterations"
        if static is not None and switches and switches[0] < end:
            s = switches[0]
            after_static = statistics.median(static["periods"][s:end])
            after_drift = statistics.median(drift["periods"][s:end])
            accepted = [e for e in events if e[1] == "switched" and change <= e[0] < s]
            pred = f"{100 * (1 - accepted[-1][3] / accepted[-1][2]):+.1f}%" if accepted else "-"
            line += (
                f"; after the switch static {after_static * 1e3:.1f} ms vs drift "
                f"{after_drift * 1e3:.1f} ms: measured gain "
                f"{100 * (1 - after_drift / after_static):+.1f}%, predicted {pred}"
            )
        print(line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", default="main", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--schedule", help=argparse.SUPPRESS)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    ap.add_argument("--rates", default="2gbit,500mbit", help="first rate, changed rate")
    ap.add_argument("--phase", type=int, default=40, help="iterations per phase")
    ap.add_argument("--warmup", type=int, default=3, help="unmeasured iterations first")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--trace", help="trace of pace:vgg-cifar to use instead of profiling")
    ap.add_argument("--reps", type=int, default=5, help="reps per size of the link fit")
    args = ap.parse_args(argv)
    if args.role == "worker":
        worker(args)
        return 0
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        print("bench_drift_link: needs root and iproute2 (ip, tc)", file=sys.stderr)
        return 2
    from pace.compiler import compile_trace
    from pace.io import load_trace, save_schedule, save_trace

    tmp = Path(tempfile.mkdtemp(prefix="pace-drift-link-"))
    try:
        if args.trace:
            base = load_trace(args.trace)
        else:
            netns._say(f"profiling {netns.MODEL}, batch {args.batch}, one CPU thread ...")
            base = netns.profile_trace(args.batch, tmp / "profile.trace.json.gz")
        fast = args.rates.split(",")[0]
        with netns.throttled_link() as link:
            netns.set_rate(link, fast)
            netns._say(f"[{fast}] fitting the all-reduce cost over the link ...")
            comm = netns.fit_link(link, "torch", base, tmp, args.reps)
            trace = dataclasses.replace(base, comm=comm)
            trace_path = tmp / "fast.trace.json.gz"
            save_trace(trace, trace_path)
            sched_path = tmp / "fast.schedule.json"
            save_schedule(compile_trace(trace, baselines=False).schedule, sched_path)
            out = tmp / "drift.json"
            argv_w = ["--role", "worker", "--out", str(out), "--schedule", str(sched_path)]
            argv_w += ["--trace", str(trace_path), "--variants", args.variants]
            argv_w += ["--rates", args.rates, "--phase", str(args.phase)]
            argv_w += ["--warmup", str(args.warmup), "--batch", str(args.batch)]
            netns._say(f"training {args.variants} through 3 phases of {args.phase} ...")
            netns.launch(link, "torch", argv_w, script=__file__)
            res = json.loads(out.read_text())
        report(res, args.phase, args.rates.split(","))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
