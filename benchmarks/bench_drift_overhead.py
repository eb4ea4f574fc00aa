"""What ``drift=True`` costs when nothing drifts: the same run with drift on and off.

    python benchmarks/bench_drift_overhead.py [--blocks 10 --steps 20 --sync-every 10]

Launches itself with ``torchrun --nproc-per-node 2`` (gloo on loopback). Each rank wraps two
copies of the same MLP with the same compiled schedule, one plain and one with
``drift=DriftOptions(...)`` whose trigger band is so wide that it never fires: what remains is
the monitor's hooks, the forward/backward spans and the agreement broadcast every
``sync_every`` iterations, the whole steady-state cost of leaving drift on. Blocks alternate
between the two so the shared machine's load drift hits both alike; rank 0 prints the median
per-iteration period of each, its interquartile range, and the ratio.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import iqr  # noqa: E402


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn import functional

    import pace.runtime
    from pace.compiler import compile_trace
    from pace.drift import DriftOptions, TriggerOptions
    from pace.ir import CommModel, Op, Tensor, Trace

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def model() -> nn.Module:
        torch.manual_seed(0)
        layers: list[nn.Module] = []
        for _ in range(args.layers):
            layers += [nn.Linear(args.width, args.width), nn.Tanh()]
        return nn.Sequential(*layers)

    m = model()
    linears = [n for n, x in m.named_modules() if isinstance(x, nn.Linear)]
    ops = [Op(name=f"bw.{n}", phase="backward", duration_us=100.0) for n in reversed(linears)]
    ops += [Op(name=f"fw.{n}", phase="forward", duration_us=100.0) for n in linears]
    chain = [o.name for o in ops]
    ops = [
        Op(name=o.name, phase=o.phase, duration_us=o.duration_us, deps=(chain[i - 1],) if i else ())
        for i, o in enumerate(ops)
    ]
    params = dict(m.named_parameters())
    tensors = tuple(
        Tensor(
            name=f"{n}.{k}",
            size_bytes=params[f"{n}.{k}"].numel() * 4,
            producer=f"bw.{n}",
            consumers=(f"fw.{n}",),
            element_bytes=4,
        )
        for n in linears
        for k in ("weight", "bias")
    )
    trace = Trace(
        model="overhead-mlp",
        ops=tuple(ops),
        tensors=tensors,
        comm=CommModel(workers=2, alpha_us=100.0, beta_us_per_byte=0.001),
    )
    schedule = compile_trace(trace, baselines=False).schedule
    never = TriggerOptions(deviation_threshold=1e9)
    runs = {}
    for kind in ("drift-off", "drift-on"):
        mk = model()
        drift = (
            DriftOptions(sync_every=args.sync_every, trigger=never) if kind == "drift-on" else False
        )
        opt = pace.runtime.wrap(
            torch.optim.SGD(mk.parameters(), lr=0.01),
            mk,
            schedule,
            backend="torch",
            trace=trace,
            drift=drift,
        )
        runs[kind] = (mk, opt)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.width, generator=g)
    y = torch.randn(args.batch, args.width, generator=g)

    def block(kind: str, steps: int) -> list[float]:
        mk, opt = runs[kind]
        starts = []
        for _ in range(steps + 1):
            starts.append(time.perf_counter())
            opt.zero_grad()
            functional.mse_loss(mk(x), y).backward()
            opt.step()
        opt.synchronize()
        return [b - a for a, b in itertools.pairwise(starts)]

    for kind in runs:
        block(kind, 5)
    periods: dict[str, list[float]] = {k: [] for k in runs}
    kinds = list(runs)
    for b in range(args.blocks):
        for kind in kinds if b % 2 == 0 else kinds[::-1]:
            periods[kind] += block(kind, args.steps)
    for _, opt in runs.values():
        opt.close()
    if rank == 0:
        base = statistics.median(periods["drift-off"])
        print(f"{'variant':<10} {'median ms':>10} {'IQR ms':>8} {'vs off':>8}")
        for kind, ps in periods.items():
            med = statistics.median(ps)
            print(f"{kind:<10} {med * 1e3:>10.2f} {iqr(ps) * 1e3:>8.2f} {med / base:>8.3f}")
        print(
            f"(2 ranks, gloo on loopback, MLP {args.layers}x{args.width}, batch {args.batch}; "
            f"{args.blocks} alternating blocks x {args.steps} iterations per variant; drift "
            f"agreement every {args.sync_every} iterations, trigger never fires)"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", default="main", help=argparse.SUPPRESS)
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sync-every", type=int, default=10)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    if args.role == "worker":
        worker(args)
        return 0
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc-per-node", "2", "--master-port", "29655", __file__]
    cmd += ["--role", "worker", *sys.argv[1:]]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run(cmd, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
