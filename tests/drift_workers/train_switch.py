"""Two Horovod ranks: a schedule switch mid-training, decided by the drift trigger.

Launched by tests/test_drift_runtime.py with ``horovodrun -np 2 -H localhost:2 --gloo``. Each
rank trains the same MLP (many small tensors, so fusion matters) on its own seeded data:

1. vanilla ``hvd.DistributedOptimizer`` for ``--steps`` steps (the reference);
2. the pace runtime from the same initial weights, starting with an unfused schedule. Rank 0
   runs the drift loop: a ``Monitor`` fed by the runtime and the loop's iteration boundaries, a
   ``DriftController`` whose observed iteration times are *injected* (the link "slows down" by
   60% at ``--drift-at``, with jitter) together with unit durations of a link at half speed,
   and a background ``Replanner`` that recompiles with ``pace.compiler``. Every ``--sync-every``
   iterations all ranks meet in ``SwitchProtocol.boundary`` (one ``hvd.broadcast_object``);
   an accepted schedule is installed on every rank at the agreed boundary with the runtime's
   ``switch_schedule`` (between ``step()`` and the next backward). The runtime feeds the monitor
   (``wrap(..., monitor=)``: gradient-ready times and unit channel times); the training loop
   adds the iteration boundaries.

Random sleeps on every rank and the runtime's own delay injection make the ranks drift apart
in time. Prints one ``DRIFT_RESULT {json}`` line per rank.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))  # the repository, when run as a script

from pace.drift.estimate import IterationStats, ObservedStats  # noqa: E402
from pace.drift.monitor import Monitor  # noqa: E402
from pace.drift.replan import (  # noqa: E402
    DriftController,
    Replanner,
    SwitchProtocol,
    predict_schedule,
)
from pace.drift.trigger import TriggerOptions  # noqa: E402
from pace.ir import CommModel, Op, Schedule, Tensor, Trace  # noqa: E402

LAYERS = 8
WIDTH = 24
BATCH = 8
LR = 0.02
ALPHA_US = 400.0  # per-call latency: fusing the 16 small gradients pays
BETA_US_PER_BYTE = 0.001


def build_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(LAYERS - 1):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    layers.append(nn.Linear(WIDTH, 4))
    return nn.Sequential(*layers)


def model_trace(model: nn.Module, alpha_us: float = ALPHA_US) -> Trace:
    """A trace of the model's window: backward last layer first, then forward first layer first."""
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    ops: list[Op] = []
    prev: tuple[str, ...] = ()
    for name in reversed(linears):
        ops.append(Op(name=f"bw.{name}", phase="backward", duration_us=300.0, deps=prev))
        prev = (f"bw.{name}",)
    for name in linears:
        ops.append(Op(name=f"fw.{name}", phase="forward", duration_us=200.0, deps=prev))
        prev = (f"fw.{name}",)
    sizes = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
    element = {n: p.element_size() for n, p in model.named_parameters()}
    tensors = tuple(
        Tensor(
            name=f"{layer}.{kind}",
            size_bytes=sizes[f"{layer}.{kind}"],
            producer=f"bw.{layer}",
            consumers=(f"fw.{layer}",),
            element_bytes=element[f"{layer}.{kind}"],
        )
        for layer in linears
        for kind in ("weight", "bias")
    )
    comm = CommModel(workers=2, alpha_us=alpha_us, beta_us_per_byte=BETA_US_PER_BYTE)
    return Trace(model="drift-mlp", ops=tuple(ops), tensors=tensors, comm=comm)


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7_919 * (rank + 1) + step)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randint(0, 4, (BATCH,), generator=g)


def one_step(model: nn.Module, opt: torch.optim.Optimizer, rank: int, step: int) -> None:
    x, y = batch(rank, step)
    opt.zero_grad()
    functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
    opt.step()


def fingerprint(params: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def units_key(schedule: Schedule) -> list[list[str]]:
    return [[f"{s.tensor}@{s.offset_bytes}" for s in u.slices] for u in schedule.ordered_units()]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--drift-at", type=int, default=300)
    ap.add_argument("--sync-every", type=int, default=10)
    ap.add_argument("--lag", type=int, default=2)
    ap.add_argument("--jitter-s", type=float, default=0.0005)
    ap.add_argument("--inject-delay-s", type=float, default=0.0001)
    args = ap.parse_args()

    os.environ.setdefault("HOROVOD_FUSION_THRESHOLD", "0")
    os.environ.setdefault("HOROVOD_CACHE_CAPACITY", "0")
    torch.set_num_threads(1)
    import horovod.torch as hvd

    import pace.runtime
    from pace.compiler import compile_trace

    hvd.init()
    rank = int(hvd.rank())
    result: dict[str, Any] = {"rank": rank}
    try:
        # 1. Reference: vanilla Horovod.
        model = build_model()
        base = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        opt: Any = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
        for step in range(args.steps):
            one_step(model, opt, rank, step)
        reference = [p.detach().clone() for p in model.parameters()]

        # 2. pace runtime with a drift-triggered switch.
        model = build_model()
        base = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        trace = model_trace(model)
        initial = compile_trace(trace, fusion="none", baselines=False).schedule
        knobs = {"inject_delay_s": args.inject_delay_s, "seed": rank, "timeout_s": 120.0}
        names = [n for n, _ in model.named_parameters()]
        monitor = Monitor(names, capacity=32)
        opt = pace.runtime.wrap(
            base, model, schedule=initial, backend="horovod", monitor=monitor, **knobs
        )
        if list(opt.pace_param_names) != names:
            raise RuntimeError("the runtime's parameter order is not named_parameters() order")

        def bcast(payload: bytes | None) -> bytes:
            out = hvd.broadcast_object(payload, root_rank=0, name="pace.drift.switch")
            return bytes(out) if out else b""

        proto = SwitchProtocol(
            rank=rank, broadcast_bytes=bcast, sync_every=args.sync_every, lag=args.lag
        )

        # The runtime stamps gradients with time.perf_counter() in us: use the same clock.
        def clock_us() -> float:
            return time.perf_counter() * 1e6

        rng = random.Random(1000 + rank)
        injected: list[float] = []

        def observed(n: int) -> ObservedStats:
            # The real monitor's window, with the injected drift: iteration times and the unit
            # durations of a link at half speed (the compute spans are dropped: the trace's
            # durations are synthetic, not this CPU's).
            snap = monitor.snapshot(last=n)
            its = tuple(
                IterationStats(
                    iteration=it.iteration,
                    iteration_us=t,
                    grad_ready_us={},
                    unit_samples=tuple(
                        (tn.size_bytes, ALPHA_US + 2 * BETA_US_PER_BYTE * tn.size_bytes)
                        for tn in trace.tensors
                    ),
                )
                for it, t in zip(snap.iterations, injected[-len(snap.iterations) :], strict=True)
            )
            return ObservedStats(iterations=its)

        controller: DriftController[Schedule] | None = None
        if rank == 0:
            controller = DriftController(
                trace=trace,
                plan=initial,
                predicted_iteration_us=initial.predicted_iteration_us,
                replanner=Replanner(
                    compile_fn=lambda t: compile_trace(t, baselines=False).schedule,
                    predict_fn=predict_schedule,
                ),
                observed=observed,
                trigger_options=TriggerOptions(consecutive=5, cooldown_iterations=50),
            )
        switches: list[int] = []
        plans = [units_key(initial)]
        # Injected "real" time of the running schedule: the prediction, x1.6 once the link
        # slows down, and after an accepted switch the controller's calibrated prediction of
        # the new schedule (what it would really run at).
        level = initial.predicted_iteration_us
        monitor.on_iteration_start(clock_us())
        unit_samples = 0
        for step in range(args.steps):
            monitor.on_backward_start(clock_us())
            one_step(model, opt, rank, step)
            if rng.random() < 0.3:
                time.sleep(rng.random() * args.jitter_s)
            monitor.on_iteration_end(clock_us())
            last = monitor.snapshot(last=1).iterations
            unit_samples += len(last[-1].unit_samples) if last else 0
            if controller is not None:
                if step == args.drift_at:
                    level *= 1.6
                t = level * (1 + rng.uniform(-0.03, 0.03))
                injected.append(t)
                accepted = controller.step(t)
                if accepted is not None:
                    proto.propose(accepted)
                    level = controller.trigger.reference_us
            new = proto.boundary(step)
            if new is not None:
                # The agreed boundary: between step() and the next backward, on every rank.
                at = opt.switch_schedule(new)
                if at != step + 1:
                    raise RuntimeError(f"runtime switched at {at}, protocol agreed {step + 1}")
                switches.append(at)
                plans.append(units_key(new))
        opt.synchronize()
        opt.close()
        if controller is not None:
            controller.replanner.close()
            result["events"] = [(e.iteration, e.kind) for e in controller.events]
        params = [p.detach().clone() for p in model.parameters()]
        result.update(
            equal=all(torch.equal(a, b) for a, b in zip(params, reference, strict=True)),
            max_abs_diff=max(
                float((a - b).abs().max()) for a, b in zip(params, reference, strict=True)
            ),
            moved=not all(
                torch.equal(a, b) for a, b in zip(params, build_model().parameters(), strict=True)
            ),
            fingerprint=fingerprint(params),
            switches=switches,
            plans=plans,
            monitored_iterations=monitor.iterations_seen,
            unit_samples=unit_samples,
            threads=[
                t.name for t in threading.enumerate() if t.name.startswith(("pace-", "Thread"))
            ],
        )
    except Exception as exc:  # reported to the test, which fails with the message
        result["error"] = f"{type(exc).__name__}: {exc}"
    print("DRIFT_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
