"""Overhead of the pace runtime vs vanilla Horovod: 2 ranks on loopback, CPU, gloo.

    python benchmarks/bench_runtime.py [--steps-per-block 20 --blocks 8]

The model is one where scheduling cannot help (compute-bound MLP; the schedule is plain
wait-free back-propagation order, one unit per gradient), so any difference is the runtime's
own cost: hooks, the dispatcher and completion threads, per-parameter optimizer steps.

Two launches of ``horovodrun -np 2 -H localhost:2 --gloo``:

* ``pace env``: Horovod with fusion and response cache off (what pace runs with); vanilla
  ``hvd.DistributedOptimizer`` and the pace runtime alternate block by block in one session, so
  machine load drifts hit both alike;
* ``horovod defaults``: vanilla with Horovod's default fusion (64 MiB) and response cache vs
  pace in the same session (pace warns that Horovod may regroup its units).

Variants: ``local`` (no communication: the floor), ``vanilla`` (hvd.DistributedOptimizer),
``vanilla-poll`` (the same with Horovod's spinning wait replaced by the runtime's polling),
``pace`` (replay), ``pace-barrier`` (replay + ``synchronize()`` after every step: the global
barrier put back, so only the machinery differs from vanilla), ``pace-online`` (ByteScheduler).
Prints one table: median per-iteration time per variant and the difference vs vanilla.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks._common import horovodrun_loopback  # noqa: E402


def _model(width: int, depth: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def _wfbp_schedule(model: Any) -> Any:
    from pace.ir import CommModel, Schedule, Slice, Unit

    params = list(model.named_parameters())
    units = tuple(
        Unit(
            priority=float(k),
            slices=(Slice(tensor=n, offset_bytes=0, size_bytes=p.numel() * p.element_size()),),
        )
        for k, (n, p) in enumerate(reversed(params))
    )
    return Schedule(
        trace_digest="sha256:bench",
        cost_model=CommModel(workers=2, alpha_us=0.0, beta_us_per_byte=0.0),
        units=units,
        predicted_iteration_us=0.0,
    )


def worker(args: argparse.Namespace) -> None:
    if args.pace_env:
        os.environ["HOROVOD_FUSION_THRESHOLD"] = "0"
        os.environ["HOROVOD_CACHE_CAPACITY"] = "0"
    import warnings

    import horovod.torch as hvd
    import torch
    from torch.nn import functional

    import pace.runtime

    torch.set_num_threads(1)
    hvd.init()
    g = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(args.batch, args.width, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)

    def make(kind: str) -> tuple[Any, Any]:
        model = _model(args.width, args.depth)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if kind == "local":
            return model, opt  # no communication at all: the floor
        if kind in ("vanilla", "vanilla-poll"):
            return model, hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the defaults launch warns about fusion on purpose
            schedule = None if kind == "pace-online" else _wfbp_schedule(model)
            return model, pace.runtime.wrap(opt, model, schedule, backend="horovod")

    # pace-barrier: synchronize() after every step, i.e. the global barrier put back, so the
    # difference to vanilla is the machinery alone, not the overlap with the next forward.
    # vanilla-poll: vanilla, but Horovod's spinning wait replaced by pace's polling back-off,
    # to separate "Horovod's wait steals the CPU" from the runtime's own cost.
    kinds = ["local", "vanilla", "vanilla-poll", "pace", "pace-barrier", "pace-online"]
    from horovod.torch import mpi_ops
    from horovod.torch import optimizer as hvd_optimizer

    from pace.runtime.backends import wait_polling

    spin_sync = hvd_optimizer.synchronize

    def polite_sync(handle: Any) -> Any:
        wait_polling(lambda: bool(mpi_ops.poll(handle)), math.inf)
        return spin_sync(handle)

    runs = {k: make(k) for k in kinds}

    def block(kind: str, steps: int) -> float:
        model, opt = runs[kind]
        hvd_optimizer.synchronize = polite_sync if kind == "vanilla-poll" else spin_sync
        t0 = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            functional.cross_entropy(model(x), y).backward()
            opt.step()
            if kind == "pace-barrier":
                opt.synchronize()
        if kind != "local":
            opt.synchronize()
        return (time.perf_counter() - t0) / steps

    for k in kinds:
        block(k, args.steps_per_block)  # warm-up
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for b in range(args.blocks):
        order = kinds if b % 2 == 0 else kinds[::-1]
        for k in order:
            times[k].append(block(k, args.steps_per_block))
    for _, opt in runs.values():
        if hasattr(opt, "close"):
            opt.close()
    if hvd.rank() == 0:
        print(
            "BENCH " + json.dumps({k: statistics.median(v) for k, v in times.items()}), flush=True
        )


def launch(args: argparse.Namespace, pace_env: bool) -> dict[str, float]:
    worker_args = ["--width", str(args.width), "--depth", str(args.depth)]
    worker_args += ["--batch", str(args.batch), "--blocks", str(args.blocks)]
    worker_args += ["--steps-per-block", str(args.steps_per_block)]
    if pace_env:
        worker_args.append("--pace-env")
    stdout = horovodrun_loopback(__file__, worker_args)
    for line in stdout.splitlines():
        _, sep, payload = line.partition("BENCH ")
        if sep:
            return dict(json.loads(payload))
    raise RuntimeError(stdout[-2000:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pace-env", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--steps-per-block", type=int, default=20)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    n_params = args.depth * (args.width * args.width + args.width) + args.width * 10 + 10
    print(
        f"MLP {args.depth}x{args.width} + head, {n_params * 4 / 2**20:.1f} MiB of gradients, "
        f"batch {args.batch}/rank, 2 ranks (gloo, loopback), SGD momentum; median of "
        f"{args.blocks} blocks x {args.steps_per_block} iterations"
    )
    print(f"{'horovod env':<18} {'variant':<12} {'ms/iter':>9} {'vs vanilla':>11}")
    for label, pace_env in (("fusion+cache off", True), ("defaults", False)):
        res = launch(args, pace_env)
        base = res["vanilla"]
        for k, v in res.items():
            print(f"{label:<18} {k:<12} {v * 1e3:9.2f} {100 * (v - base) / base:+10.2f}%")


if __name__ == "__main__":
    main()
