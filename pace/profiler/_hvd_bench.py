"""Worker of ``pace profile-comm --backend horovod``; run by ``horovodrun``, one per rank.

Same statistic as the gloo benchmark: per size, the median over repetitions of the slowest
rank's all-reduce time. Rank 0 writes ``[[bytes, us], ...]`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    import horovod.torch as hvd
    import numpy as np
    import torch

    from pace.profiler.comm import sweep_order

    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", required=True)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--interference", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.interference:
        from pace.profiler.interference import probe_us

        plain_us = probe_us()  # before Horovod's background loop starts
    hvd.init()
    sizes = [int(s) for s in args.sizes.split(",")]
    bufs = [torch.ones(max(1, size // 4), dtype=torch.float32) for size in sizes]
    for size, buf in zip(sizes, bufs, strict=True):
        for _ in range(args.warmup):
            hvd.allreduce_(buf, op=hvd.Sum, name=f"warm.{size}")
    times: list[list[float]] = [[] for _ in bufs]
    for i, rep in sweep_order(sizes, args.reps):
        # A tiny all-reduce as a barrier: every rank starts the timed call together.
        hvd.allreduce(torch.zeros(1), name=f"bar.{i}.{rep}")
        t0 = time.perf_counter()
        hvd.allreduce_(bufs[i], op=hvd.Sum, name=f"ar.{sizes[i]}")
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        slowest = hvd.allgather(elapsed, name=f"t.{i}.{rep}").max()
        times[i].append(float(slowest))
    results = [
        [buf.numel() * 4, float(np.median(t)) * 1e6] for buf, t in zip(bufs, times, strict=True)
    ]
    if hvd.rank() == 0:
        Path(args.out).write_text(json.dumps(results))
    if args.interference:
        from pace.profiler.interference import measure_on_rank

        def allreduce(buf: torch.Tensor) -> None:
            hvd.allreduce_(buf, op=hvd.Sum, name=f"interference.{buf.numel()}")

        # Every rank holds the same (slowest-rank) times, so makes the same calls.
        measure_on_rank(
            allreduce,
            sizes_bytes=[int(b) for b, _ in results],
            call_us=[us for _, us in results],
            plain_us=plain_us,
            out=f"{args.out}.interference",
            rank=hvd.rank(),
        )
    hvd.shutdown()


if __name__ == "__main__":
    main()
