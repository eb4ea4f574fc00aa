"""Multi-process worker for the runtime tests: vanilla data parallelism vs the pace runtime.

Launched by tests/test_runtime_*.py through ``horovodrun -np 2 -H localhost:2 --gloo`` or
``torchrun --nproc-per-node 2`` (or directly, with RANK/WORLD_SIZE/MASTER_* set, for the
dying-rank test). Each rank trains the same small CNN on its own seeded data, first with the
vanilla optimizer (``hvd.DistributedOptimizer`` or DDP), then once per requested pace
configuration from the same initial weights, and prints one ``PACE_RESULT {json}`` line per
configuration: whether every parameter is bitwise equal to the vanilla run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))  # the repository, when run as a script

from pace.io import load_schedule, save_schedule  # noqa: E402
from pace.ir import CommModel, Schedule, Slice, Unit  # noqa: E402

BATCH = 8
LR = 0.05


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.conv2 = nn.Conv2d(4, 8, 3)
        self.fc1 = nn.Linear(8 * 8 * 8, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = functional.relu(self.conv1(x))
        x = functional.relu(self.conv2(x))
        x = functional.relu(self.fc1(x.flatten(1)))
        out: torch.Tensor = self.fc2(x)
        return out


def build_model(seed: int = 0) -> SmallCNN:
    torch.manual_seed(seed)
    return SmallCNN()


def make_schedule(model: nn.Module) -> Schedule:
    """A schedule with partitions AND fusion groups for SmallCNN (issue order = priority)."""
    size = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
    half = size["fc1.weight"] // 2 // 4 * 4
    third = size["conv2.weight"] // 3 // 4 * 4

    def s(name: str, offset: int = 0, nbytes: int | None = None) -> Slice:
        return Slice(
            tensor=name,
            offset_bytes=offset,
            size_bytes=size[name] - offset if nbytes is None else nbytes,
        )

    units = (
        Unit(priority=1, slices=(s("fc2.weight"), s("fc2.bias"))),  # fusion group
        Unit(priority=2, slices=(s("fc1.weight", 0, half),)),  # partition
        Unit(priority=3, slices=(s("fc1.weight", half), s("fc1.bias"))),  # partition + fusion
        Unit(priority=5, slices=(s("conv2.weight", third), s("conv2.bias"), s("conv1.bias"))),
        Unit(priority=4, slices=(s("conv2.weight", 0, third),)),
        Unit(priority=6, slices=(s("conv1.weight"),)),
    )
    return Schedule(
        trace_digest="sha256:test",
        cost_model=CommModel(workers=2, alpha_us=10.0, beta_us_per_byte=0.001),
        units=units,
        predicted_iteration_us=0.0,
    )


def per_tensor_schedule(model: nn.Module) -> Schedule:
    """One unit per tensor, in reverse registration order (no partition, no fusion)."""
    params = list(model.named_parameters())[::-1]
    return Schedule(
        trace_digest="sha256:test2",
        cost_model=CommModel(workers=2, alpha_us=10.0, beta_us_per_byte=0.001),
        units=tuple(
            Unit(
                priority=k,
                slices=(Slice(tensor=n, offset_bytes=0, size_bytes=p.numel() * p.element_size()),),
            )
            for k, (n, p) in enumerate(params)
        ),
        predicted_iteration_us=0.0,
    )


class NullMonitor:
    def on_grad_ready(self, tensor: int, t_us: float) -> None:
        raise AssertionError("no events on Horovod's own path")

    def on_unit_done(self, unit_index: int, size_bytes: int, duration_us: float) -> None:
        raise AssertionError("no events on Horovod's own path")


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1_000_003 * (rank + 1) + step)
    return torch.randn(BATCH, 1, 12, 12, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def make_optimizer(kind: str, params: Any) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=LR, momentum=0.9, weight_decay=1e-4)
    if kind == "adam":
        return torch.optim.Adam(params, lr=LR / 10, weight_decay=1e-4)
    if kind == "rmsprop":
        return torch.optim.RMSprop(params, lr=LR / 10, momentum=0.5)
    raise ValueError(kind)


def train(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    steps: int,
    rank: int,
    *,
    die_at: int = -1,
    stall_at: int = -1,
    stall_s: float = 0.0,
    after_step: Any = None,
) -> None:
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    for step in range(steps):
        if step == die_at:
            os._exit(17)  # simulate a crashed rank: no cleanup, sockets just close
        if step == stall_at:
            time.sleep(stall_s)  # a rank stuck (a slow data loader): the others wait on it
        x, y = batch(rank, step)
        opt.zero_grad()
        loss = functional.cross_entropy(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        sched.step()
        if after_step is not None:
            after_step(step)


def init_backend(backend: str) -> tuple[int, int]:
    if backend == "horovod":
        # Set before hvd.init(): Horovod reads them once (pace needs fusion and cache off).
        os.environ.setdefault("HOROVOD_FUSION_THRESHOLD", "0")
        os.environ.setdefault("HOROVOD_CACHE_CAPACITY", "0")
        import horovod.torch as hvd

        hvd.init()
        return int(hvd.rank()), int(hvd.size())
    import torch.distributed as dist

    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def vanilla(backend: str, kind: str, steps: int, rank: int) -> list[torch.Tensor]:
    model = build_model()
    if backend == "horovod":
        import horovod.torch as hvd

        opt = hvd.DistributedOptimizer(
            make_optimizer(kind, model.parameters()), named_parameters=model.named_parameters()
        )
        train(model, opt, steps, rank)
    else:
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model)
        train(ddp, make_optimizer(kind, ddp.parameters()), steps, rank)
    return [p.detach().clone() for p in model.parameters()]


def run_pace(
    backend: str,
    config: str,
    steps: int,
    rank: int,
    *,
    schedule_path: str,
    die_at: int,
    timeout_s: float,
    stall_at: int = -1,
    stall_s: float = 0.0,
) -> dict[str, Any]:
    import pace.runtime

    kind, _, variant = config.partition(":")
    # The fallback: ranks start from different weights; wrap must broadcast rank 0's.
    model = build_model(rank if "fallback" in variant else 0)
    knobs: dict[str, Any] = {"timeout_s": timeout_s}
    schedule: Any = schedule_path
    fallback = False
    if "online" in variant:
        schedule = None
        knobs["partition_bytes"] = 8192  # fc1.weight (64 KiB) -> 8 partitions
        knobs["credit_bytes"] = 20000
    if "delay" in variant:
        knobs["inject_delay_s"] = 0.002
        knobs["seed"] = 7
    if "fallback" in variant:
        # A schedule of another model: the wrapper must warn once and train plainly.
        schedule = make_schedule(build_model())
        schedule = Schedule(
            trace_digest=schedule.trace_digest,
            cost_model=schedule.cost_model,
            units=schedule.units[1:],  # drops fc2.*: a mismatch
            predicted_iteration_us=0.0,
        )
        fallback = True
    tmp = tempfile.TemporaryDirectory()
    monitor = None
    if "framework" in variant:
        monitor = NullMonitor()  # as benchmarks pass one to every variant: a warning, no failure
        # The compiler predicted Horovod's own path faster: a schedule file marked so.
        schedule = os.path.join(tmp.name, "framework.schedule.json")
        save_schedule(
            dataclasses.replace(
                load_schedule(schedule_path),
                framework="horovod",
                meta={"framework": {"predicted_iteration_us": 12345.0, "replay_us": 23456.0}},
            ),
            schedule,
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = pace.runtime.wrap(
            make_optimizer(kind, model.parameters()),
            model,
            schedule,
            backend=backend,  # type: ignore[arg-type]
            fallback=fallback,
            monitor=monitor,
            **knobs,
        )
    tmp.cleanup()
    result: dict[str, Any] = {
        "config": config,
        "rank": rank,
        "warnings": [str(w.message) for w in caught],
    }
    after_step = None
    if "switch" in variant:
        # Every rank switches at the same boundaries (every 7 steps), alternating schedules.
        plans = [per_tensor_schedule(model), make_schedule(model)]

        def after_step(step: int) -> None:
            if step % 7 == 6:
                opt.switch_schedule(plans[(step // 7) % 2])  # type: ignore[attr-defined]

    t0 = time.perf_counter()
    try:
        train(
            model,
            opt,
            steps,
            rank,
            die_at=die_at,
            stall_at=stall_at,
            stall_s=stall_s,
            after_step=after_step,
        )
        opt.synchronize()  # type: ignore[attr-defined]
    except Exception as exc:  # reported to the test, which asserts on it
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["seconds"] = time.perf_counter() - t0
    opt.close()  # type: ignore[attr-defined]
    result["threads_after_close"] = [
        t.name for t in threading.enumerate() if t.name.startswith("pace-")
    ]
    result["params"] = [p.detach().clone() for p in model.parameters()]
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["horovod", "torch"], required=True)
    ap.add_argument("--schedule", required=True, help="schedule file (written by the test)")
    ap.add_argument("--configs", required=True, help="comma list of optimizer[:variant]")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--die-rank", type=int, default=-1)
    ap.add_argument("--die-at", type=int, default=-1)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    ap.add_argument("--stall-rank", type=int, default=-1)
    ap.add_argument("--stall-at", type=int, default=-1)
    ap.add_argument("--stall-s", type=float, default=0.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rank, _ = init_backend(args.backend)
    refs: dict[str, list[torch.Tensor]] = {}
    for config in args.configs.split(","):
        kind = config.partition(":")[0]
        die_at = args.die_at if rank == args.die_rank else -1
        stall_at = args.stall_at if rank == args.stall_rank else -1
        if kind not in refs and args.die_at < 0 and args.stall_at < 0:
            refs[kind] = vanilla(args.backend, kind, args.steps, rank)
        res = run_pace(
            args.backend,
            config,
            args.steps,
            rank,
            schedule_path=args.schedule,
            die_at=die_at,
            timeout_s=args.timeout_s,
            stall_at=stall_at,
            stall_s=args.stall_s,
        )
        params = res.pop("params")
        if kind in refs:
            ref = refs[kind]
            res["equal"] = all(torch.equal(a, b) for a, b in zip(ref, params, strict=True))
            res["max_abs_diff"] = max(
                float((a - b).abs().max()) for a, b in zip(ref, params, strict=True)
            )
            res["moved"] = any(
                not torch.equal(a, b) for a, b in zip(ref, build_model().parameters(), strict=True)
            )
        print("PACE_RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
