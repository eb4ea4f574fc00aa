"""Two ranks: ``wrap(..., drift=...)``, the one switch, on real timings.

Launched by tests/test_drift_switch.py with ``torchrun --nproc-per-node 2`` (torch backend) or
``horovodrun -np 2 -H localhost:2 --gloo`` (horovod backend). The trace the schedule is compiled
from says each all-reduce call costs 20 ms (the link as the user profiled it, say, on a cluster
under load); here, on loopback, a call costs about a hundred microseconds. So the drift
trigger fires within a few iterations, rank 0 re-estimates the link from the runtime's unit
timings, recompiles in the background (the unfused schedule of 16 small gradients against a
fused one), and every rank switches at the same iteration. Training must stay bitwise equal to
DDP / ``hvd.DistributedOptimizer`` (a switch changes the order of collectives, not the sums).
Prints one ``DRIFT_RESULT {json}`` line per rank and mode.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))  # the repository, when run as a script

from pace.drift import DriftOptions, ObservedStats, TriggerOptions  # noqa: E402
from tests.drift_workers.train_switch import build_model  # noqa: E402
from tests.drift_workers.train_switch import model_trace as switch_trace  # noqa: E402

WIDTH = 24  # as train_switch's model
BATCH = 8
LR = 0.02
ALPHA_US = 20_000.0  # what the trace claims per call; loopback is ~100x faster


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7_919 * (rank + 1) + step)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randint(0, 4, (BATCH,), generator=g)


def train(model: nn.Module, opt: Any, rank: int, steps: int, *, clip: bool) -> None:
    """The usual loop; with ``clip``, clipping between backward and step (the sync mode's)."""
    for step in range(steps):
        x, y = batch(rank, step)
        opt.zero_grad()
        functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=("torch", "horovod"), required=True)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--modes", default="overlap,sync")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("HOROVOD_FUSION_THRESHOLD", "0")
    os.environ.setdefault("HOROVOD_CACHE_CAPACITY", "0")

    import pace.runtime
    from pace.compiler import compile_trace

    if args.backend == "horovod":
        import horovod.torch as hvd

        hvd.init()
        rank = int(hvd.rank())
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
    lines = _Lines()
    logging.getLogger("pace.drift").addHandler(lines)
    logging.getLogger("pace.drift").setLevel(logging.INFO)

    for mode in args.modes.split(","):
        sync = mode == "sync"
        result: dict[str, Any] = {"rank": rank, "mode": mode}
        lines.lines.clear()
        try:
            # Reference: DDP / Horovod with the same loop.
            model: nn.Module = build_model()
            if args.backend == "horovod":
                ref_opt: Any = hvd.DistributedOptimizer(
                    torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9),
                    named_parameters=model.named_parameters(),
                )
                ref_model = model
            else:
                from torch.nn.parallel import DistributedDataParallel

                ref_model = DistributedDataParallel(model)
                ref_opt = torch.optim.SGD(ref_model.parameters(), lr=LR, momentum=0.9)
            if sync and args.backend == "horovod":
                # Horovod's clipping pattern.
                for step in range(args.steps):
                    x, y = batch(rank, step)
                    ref_opt.zero_grad()
                    functional.cross_entropy(ref_model(x), y).backward()  # type: ignore[no-untyped-call]
                    ref_opt.synchronize()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
                    with ref_opt.skip_synchronize():
                        ref_opt.step()
            else:
                train(ref_model, ref_opt, rank, args.steps, clip=sync)
            reference = [p.detach().clone() for p in model.parameters()]

            model = build_model()
            # What the trace claims per call; loopback is ~100x faster.
            trace = switch_trace(model, alpha_us=ALPHA_US)
            initial = compile_trace(trace, fusion="none", baselines=False, mode=mode).schedule
            stats_dir = tempfile.mkdtemp(prefix="pace-drift-stats-")
            opt: Any = pace.runtime.wrap(
                torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9),
                model,
                initial,
                backend=args.backend,
                trace=trace,
                sync=sync,
                timeout_s=60.0,
                drift=DriftOptions(
                    sync_every=5,
                    lag=2,
                    trigger=TriggerOptions(consecutive=5, cooldown_iterations=200),
                    stats_dir=stats_dir,
                ),
            )
            train(model, opt, rank, args.steps, clip=sync)
            opt.synchronize()
            loop = opt._pace_drift
            params = [p.detach().clone() for p in model.parameters()]
            stats = sorted(Path(stats_dir).glob("stats-*.json"))
            result.update(
                equal=all(torch.equal(a, b) for a, b in zip(params, reference, strict=True)),
                max_abs_diff=max(
                    float((a - b).abs().max()) for a, b in zip(params, reference, strict=True)
                ),
                switched_at=loop.switched_at,
                units=len(opt.pace_plan.units),
                events=[(it, e.kind) for it, e in loop.decisions],
                log=list(lines.lines),
                stats_files=len(stats),
                stats_iterations=len(ObservedStats.load(str(stats[0])).iterations) if stats else 0,
            )
            opt.close()
            result["threads"] = [
                t.name for t in threading.enumerate() if t.name.startswith("pace-")
            ]
        except Exception as exc:  # reported to the test, which fails with the message
            result["error"] = f"{type(exc).__name__}: {exc}"
        print("DRIFT_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
