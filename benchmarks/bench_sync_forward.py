"""Does the sync mode slow the forward that follows it? 2 Horovod ranks on loopback, CPU, gloo.

    python benchmarks/bench_sync_forward.py [--blocks 6 --steps-per-block 5]

On the throttled link (``bench_netns.py``) rank 0's forward in the sync mode with Horovod took
0-33 ms more than ``local``'s, although every unit is done before the forward starts
(docs/results.md). This runs the same model (``pace:vgg-cifar``, batch 10, one compute thread)
with the same Horovod settings (fusion and response cache off) on loopback, without ``tc``, and
times each phase per iteration, with the forward's minor page faults:

* ``local``: no communication;
* ``vanilla-nofusion``: ``hvd.DistributedOptimizer``;
* ``pace-sync``: ``pace.runtime.wrap(..., sync=True)`` with a hand-made sync schedule of 4 units
  of about equal size, in back-propagation order.

Variants alternate block by block in one launch. Prints each rank's medians.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks._common import horovodrun_loopback  # noqa: E402

KINDS = ("local", "vanilla-nofusion", "pace-sync")


def _sync_schedule(model: Any) -> Any:
    from pace.ir import CommModel, Schedule, Slice, Unit

    params = list(reversed(list(model.named_parameters())))
    sizes = [p.numel() * p.element_size() for _, p in params]
    quarter = sum(sizes) / 4
    units: list[Unit] = []
    group: list[Slice] = []
    filled = 0
    for (name, _), size in zip(params, sizes, strict=True):
        group.append(Slice(tensor=name, offset_bytes=0, size_bytes=size))
        filled += size
        if filled >= quarter:
            units.append(Unit(priority=float(len(units)), slices=tuple(group)))
            group, filled = [], 0
    if group:
        units.append(Unit(priority=float(len(units)), slices=tuple(group)))
    return Schedule(
        trace_digest="sha256:bench",
        cost_model=CommModel(workers=2, alpha_us=0.0, beta_us_per_byte=0.0),
        units=tuple(units),
        predicted_iteration_us=0.0,
        mode="sync",
    )


def worker(args: argparse.Namespace) -> None:
    # What pace runs with (bench_netns sets the same for every variant but vanilla).
    os.environ["HOROVOD_FUSION_THRESHOLD"] = "0"
    os.environ["HOROVOD_CACHE_CAPACITY"] = "0"
    import horovod.torch as hvd
    import torch
    from torch.nn import functional

    import pace.runtime
    from pace.profiler.workloads import vgg_cifar

    torch.set_num_threads(1)
    hvd.init()
    g = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(args.batch, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)

    def make(kind: str) -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = vgg_cifar(10)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if kind == "local":
            return model, opt
        if kind == "vanilla-nofusion":
            return model, hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return model, pace.runtime.wrap(
                opt, model, _sync_schedule(model), backend="horovod", sync=True
            )

    runs = {k: make(k) for k in KINDS}
    samples: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in KINDS}

    def block(kind: str, steps: int, keep: bool) -> None:
        model, opt = runs[kind]
        for _ in range(steps):
            opt.zero_grad()
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            loss = functional.cross_entropy(model(x), y)
            t1 = time.perf_counter()
            faults1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            t3 = time.perf_counter()
            if keep:
                samples[kind].append((t1 - t0, float(faults1 - faults0), t2 - t1, t3 - t2))
        if kind != "local":
            opt.synchronize()

    for k in KINDS:
        block(k, args.steps_per_block, keep=False)  # warm-up
    for b in range(args.blocks):
        for k in KINDS if b % 2 == 0 else KINDS[::-1]:
            block(k, args.steps_per_block, keep=True)
    for _, opt in runs.values():
        if hasattr(opt, "close"):
            opt.close()
    medians = {
        k: [statistics.median(s[i] for s in v) for i in range(4)] for k, v in samples.items()
    }
    print(f"BENCH {hvd.rank()} " + json.dumps(medians), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--steps-per-block", type=int, default=5)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    worker_args = ["--batch", str(args.batch), "--blocks", str(args.blocks)]
    worker_args += ["--steps-per-block", str(args.steps_per_block)]
    stdout = horovodrun_loopback(__file__, worker_args)
    per_rank: dict[int, dict[str, list[float]]] = {}
    for line in stdout.splitlines():
        _, sep, payload = line.partition("BENCH ")
        if sep:
            rank, _, data = payload.partition(" ")
            per_rank[int(rank)] = json.loads(data)
    if len(per_rank) != 2:
        raise SystemExit(stdout[-2000:])
    print(
        f"pace:vgg-cifar, batch {args.batch}/rank, 2 ranks (gloo, loopback), Horovod fusion and "
        f"response cache off; median over {args.blocks} blocks x {args.steps_per_block} iterations"
    )
    print(
        f"{'rank':>4} {'variant':<17} {'forward ms':>10} {'vs local':>9} {'fwd faults':>10} "
        f"{'backward ms':>11} {'step ms':>8}"
    )
    for rank in sorted(per_rank):
        res = per_rank[rank]
        base = res["local"][0]
        for k in KINDS:
            fwd, faults, bwd, step = res[k]
            print(
                f"{rank:>4} {k:<17} {fwd * 1e3:10.1f} {(fwd - base) * 1e3:+8.1f}  {faults:10.0f} "
                f"{bwd * 1e3:11.1f} {step * 1e3:8.1f}"
            )


if __name__ == "__main__":
    main()
