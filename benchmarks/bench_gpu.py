"""pace on one CUDA GPU: the profiler against Kineto, and the runtime's overhead against DDP.

Two subcommands (docs/gpu.md has the commands, the machine and the figures):

``kineto --model SPEC --batch-size B``: profiles the workload with ``pace.profiler.profile``
(``timing="kernel"``, CUDA events) *inside* ``torch.profiler.profile`` (CPU + CUDA activities),
so both measure the same executions, and compares each forward aten op and each backward node
kind with the device time Kineto gives the matching event (the kernels it launched). Prints one
row per op kind and the totals; ``--json FILE`` writes them.

``overhead --model SPEC --batch-size B --schedule S`` (under ``torchrun --nproc-per-node 1``,
NCCL): trains the same model three ways in one process, block by block in turn so that clock
and load drift hit all alike: ``local`` (the plain optimizer, no communication), ``ddp``
(DistributedDataParallel) and ``pace`` (``pace.runtime.wrap`` replaying S, torch backend).
Per-iteration time of a block = (device-synchronised wall time of ``--steps`` iterations) /
steps; prints median, min and max over ``--blocks`` blocks per variant.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pace.profiler import profile
from pace.profiler.workloads import build_workload


def _device_us(event: Any) -> float:
    for name in ("device_time_total", "cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def kineto_check(spec: str, batch_size: int, iters: int, warmup: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as kineto

    work = build_workload(spec, batch_size=batch_size, device="cuda")
    # Compile kernels, pick algorithms: outside the comparison.
    for _ in range(2):
        work.optimizer.zero_grad()
        work.step_fn(work.model).backward()  # type: ignore[no-untyped-call]
        work.optimizer.step()
    torch.cuda.synchronize()
    runs = warmup + iters
    with kineto(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        trace = profile(
            work.model,
            work.step_fn,
            iters=iters,
            warmup=warmup,
            optimizer=work.optimizer,
            timing="kernel",
            calibrate=0,
            name=spec,
        )
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    theirs: dict[str, list[float]] = collections.defaultdict(list)
    for e in events:
        parent = e.cpu_parent.name if e.cpu_parent is not None else ""
        if e.name.startswith("aten::") and parent == "PythonDispatchMode":
            theirs["fw:" + e.name.removeprefix("aten::")].append(_device_us(e))
        elif not e.name.startswith(("aten::", "autograd::")) and e.name.endswith(
            ("Backward0", "Backward1")
        ):
            theirs["bw:" + e.name].append(_device_us(e))
    ours: dict[str, list[float]] = collections.defaultdict(list)
    for op in trace.ops:
        kind = op.name.rsplit(".", 1)[1]
        ours[("fw:" if op.phase == "forward" else "bw:") + kind].append(op.duration_us)
    rows = []
    checked = pace_total = kineto_total = 0.0
    within = 0
    for kind, mine in sorted(ours.items()):
        times = theirs.get(kind, [])
        if not times or len(times) != len(mine) * runs:
            rows.append({"kind": kind, "ops": len(mine), "matched": False, "kineto": len(times)})
            continue
        per_iter = [times[i * len(mine) : (i + 1) * len(mine)] for i in range(runs)]
        ref = [statistics.median(it[j] for it in per_iter[warmup:]) for j in range(len(mine))]
        ok = sum(abs(a - b) <= 0.25 * max(a, b) + 20.0 for a, b in zip(mine, ref, strict=True))
        within += ok
        checked += len(mine)
        pace_total += sum(mine)
        kineto_total += sum(ref)
        rows.append(
            {
                "kind": kind,
                "ops": len(mine),
                "matched": True,
                "pace_us": round(sum(mine), 1),
                "kineto_us": round(sum(ref), 1),
                "within_25pct_20us": ok,
            }
        )
    fw = sum(o.duration_us for o in trace.ops if o.phase == "forward")
    bw = sum(o.duration_us for o in trace.ops if o.phase == "backward")
    grads = {n: p.numel() * p.element_size() for n, p in work.model.named_parameters()}
    return {
        "model": spec,
        "batch_size": batch_size,
        "gpu": torch.cuda.get_device_name(),
        "rows": rows,
        "ops_checked": int(checked),
        "ops_within": within,
        "pace_total_us": round(pace_total, 1),
        "kineto_total_us": round(kineto_total, 1),
        "kernel_forward_us": round(fw, 1),
        "kernel_backward_us": round(bw, 1),
        "forward_wall_us": trace.meta["forward_wall_us"],
        "backward_wall_us": trace.meta["backward_wall_us"],
        "optimizer_us": trace.meta["optimizer_us"],
        "tensors": len(trace.tensors),
        "gradients_match": {t.name: t.size_bytes for t in trace.tensors} == grads,
    }


def overhead(spec: str, batch_size: int, schedule: str, blocks: int, steps: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817

    import pace.runtime

    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    variants: dict[str, Any] = {}
    for who in ("local", "ddp", "pace"):
        work = build_workload(spec, batch_size=batch_size, device=str(device))
        model = work.model
        opt: Any = work.optimizer
        module: Any = model
        if who == "ddp":
            module = DDP(model, device_ids=[device])
        elif who == "pace":
            opt = pace.runtime.wrap(opt, model, schedule, backend="torch")
        variants[who] = (module, opt, work.step_fn)

    def one(who: str, n: int) -> float:
        module, opt, step_fn = variants[who]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            opt.zero_grad()
            step_fn(module).backward()
            opt.step()
        if who == "pace":
            opt.synchronize()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e3

    for who in variants:
        one(who, 3)  # warm-up: kernels, buckets, NCCL communicators
    times: dict[str, list[float]] = {who: [] for who in variants}
    for _ in range(blocks):
        for who in variants:
            times[who].append(one(who, steps))
    variants["pace"][1].close()
    dist.destroy_process_group()
    out: dict[str, Any] = {
        "model": spec,
        "batch_size": batch_size,
        "gpu": torch.cuda.get_device_name(),
        "blocks": blocks,
        "steps_per_block": steps,
    }
    for who, ts in times.items():
        out[who] = {
            "median_ms": round(statistics.median(ts), 3),
            "min_ms": round(min(ts), 3),
            "max_ms": round(max(ts), 3),
        }
    ddp = out["ddp"]["median_ms"]
    out["pace_vs_ddp"] = round(out["pace"]["median_ms"] / ddp - 1.0, 4)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kineto")
    k.add_argument("--model", required=True)
    k.add_argument("--batch-size", type=int, required=True)
    k.add_argument("--iters", type=int, default=3)
    k.add_argument("--warmup", type=int, default=1)
    k.add_argument("--json")
    o = sub.add_parser("overhead")
    o.add_argument("--model", required=True)
    o.add_argument("--batch-size", type=int, required=True)
    o.add_argument("--schedule", required=True)
    o.add_argument("--blocks", type=int, default=7)
    o.add_argument("--steps", type=int, default=10)
    o.add_argument("--json")
    args = ap.parse_args()
    if args.cmd == "kineto":
        res = kineto_check(args.model, args.batch_size, args.iters, args.warmup)
        for row in res["rows"]:
            print(json.dumps(row))
        summary = {k: v for k, v in res.items() if k != "rows"}
    else:
        res = overhead(args.model, args.batch_size, args.schedule, args.blocks, args.steps)
        summary = res
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
