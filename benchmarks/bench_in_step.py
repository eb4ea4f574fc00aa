"""What computing in step costs: two training processes on this host, free-running or in step.

    python benchmarks/bench_in_step.py [--iterations 25] [--repeats 2] [--batch 10]

Every data-parallel job runs its ranks in step: each iteration's collectives hold the faster
rank until the slower one catches up, so both compute the same layers at the same time. Two
ranks on one host share its cache and memory bandwidth; whether computing in step costs more
than computing out of phase decides which `local` (no communication) the throttled-link
benchmark (``bench_netns.py``) must give the model. This script trains ``pace:vgg-cifar``
(one compute thread per process, no communication) three ways, alternating, in one run:

- ``alone``: one process;
- ``free``: two processes, each at its own pace;
- ``in step``: two processes that start every iteration together (a ``multiprocessing``
  barrier, outside the timed span: no network, no collective).

Printed per way: the forward's, the backward's and the step's medians per iteration (IQR), the
slower process's, over the repeats. No communication is timed anywhere.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks._common import iqr  # noqa: E402

WARMUP = 3  # iterations not counted: allocator, caches
WAYS = ("alone", "free", "in step")


def _train(rank: int, barrier: Any, iterations: int, batch: int, out: Any) -> None:
    """One process's iterations; ``barrier``: None to run free."""
    import torch
    from torch.nn import functional

    from pace.profiler.workloads import vgg_cifar

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = vgg_cifar(10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    spans: list[tuple[float, float, float]] = []
    for i in range(WARMUP + iterations):
        if barrier is not None:
            barrier.wait()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = functional.cross_entropy(model(x), y)
        t1 = time.perf_counter()
        loss.backward()  # type: ignore[no-untyped-call]
        t2 = time.perf_counter()
        opt.step()
        if i >= WARMUP:
            spans.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, (time.perf_counter() - t2) * 1e3))
    out.put((rank, spans))


def run_way(way: str, iterations: int, batch: int) -> list[tuple[float, float, float]]:
    """Each iteration's ``(forward, backward, step)`` ms, the slower process's per iteration."""
    procs_n = 1 if way == "alone" else 2
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(procs_n), ctx.Queue()
    procs = [
        ctx.Process(
            target=_train,
            args=(r, barrier if way == "in step" else None, iterations, batch, out),
        )
        for r in range(procs_n)
    ]
    for p in procs:
        p.start()
    per_rank = [out.get() for _ in procs]
    for p in procs:
        p.join()
    series = [spans for _, spans in sorted(per_rank)]
    return [max(ranks, key=sum) for ranks in zip(*series, strict=True)]


def _cell(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} ({iqr(xs):.1f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=25, help="counted iterations per way")
    ap.add_argument("--repeats", type=int, default=2, help="passes over the three ways")
    ap.add_argument("--batch", type=int, default=10, help="images per process per iteration")
    args = ap.parse_args(argv)
    got: dict[str, list[tuple[float, float, float]]] = {w: [] for w in WAYS}
    for rep in range(args.repeats):
        for way in WAYS if rep % 2 == 0 else WAYS[::-1]:  # alternate: drift hits all alike
            got[way] += run_way(way, args.iterations, args.batch)
    print("| way | forward ms (IQR) | backward ms (IQR) | step ms (IQR) | iteration ms | vs free |")
    print("|---|---|---|---|---|---|")
    free_ms = statistics.median(sum(s) for s in got["free"])
    for way in WAYS:
        spans = got[way]
        total = statistics.median(sum(s) for s in spans)
        cells = [_cell([s[k] for s in spans]) for k in range(3)]
        print(f"| {way} | {' | '.join(cells)} | {total:.1f} | {total / free_ms:.3f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
