"""Worker of ``pace profile-comm --backend horovod``; run by ``horovodrun``, one per rank.

Same statistic as the gloo benchmark: per size, the median over repetitions of the slowest
rank's all-reduce time. Rank 0 writes ``[[bytes, us], ...]`` to ``--out``; with ``--batches``
also, per count of tensors issued at once, the slowest rank's batch times (``batch_times``) to
``--out.batches`` as ``{count: [us, ...]}``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# Tensors issued at once per timed batch (``batch_times``): enough counts for a line whose
# slope is the further call's cost, and a batch of 16 lasts milliseconds.
BATCH_COUNTS = (1, 2, 4, 8, 16)
# Floats per tensor of a batch: its bytes cost nothing beside a call's fixed part.
BATCH_ELEMENTS = 10
BATCH_WARMUP = 3
# Timed batches per count. A batch's time spreads about as widely as its median on a busy
# 2-core host (bench_hvd_calls: IQR 2.7 to 16 ms at 16 tensors), so the median needs many; 60
# take a few seconds.
BATCH_REPS = 60


def batch_times(
    hvd: Any,
    torch: Any,
    counts: Sequence[int],
    reps: int,
    *,
    warmup: int = BATCH_WARMUP,
    wait: Callable[[Any], object] | None = None,
) -> dict[int, list[float]]:
    """Per count ``k``, the slowest rank's seconds to all-reduce ``k`` tiny tensors issued at
    once (``allreduce_async_`` each, then ``synchronize`` on every handle, as
    ``hvd.DistributedOptimizer`` issues gradients whose hooks fire close together), one
    sample per repetition. Horovod negotiates the tensors submitted within one cycle together,
    so the time grows by less than a lone call per further tensor; that slope, as a share of a
    lone call, gives what a call negotiated beside others costs
    (``CommModel.batched_alpha_us``). Every batch starts from a tiny all-reduce (the ranks
    together), and the counts are interleaved per repetition, so a host that slows down slows
    every count alike. ``wait``: how each handle is waited for
    (default ``hvd.synchronize``, which spins, as vanilla Horovod's optimizer waits)."""
    wait = wait or hvd.synchronize
    times: dict[int, list[float]] = {k: [] for k in counts}
    for rep in range(warmup + reps):
        for k in counts:
            bufs = [torch.zeros(BATCH_ELEMENTS) for _ in range(k)]
            hvd.allreduce(torch.zeros(1), name="batch.bar")
            t0 = time.perf_counter()
            handles = [hvd.allreduce_async_(b, name=f"batch.{j}") for j, b in enumerate(bufs)]
            for h in handles:
                wait(h)
            elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            slowest = float(hvd.allgather(elapsed, name="batch.t").max())
            if rep >= warmup:
                times[k].append(slowest)
    return times


def write_batches(hvd: Any, torch: Any, out: str) -> None:
    """``batch_times`` of ``BATCH_COUNTS``, written by rank 0 to ``out`` as ``{count: [us,
    ...]}`` (read back by ``pace.profiler.comm.read_batches``)."""
    batches = batch_times(hvd, torch, BATCH_COUNTS, BATCH_REPS)
    if hvd.rank() == 0:
        Path(out).write_text(json.dumps({k: [t * 1e6 for t in ts] for k, ts in batches.items()}))


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
    ap.add_argument("--batches", action="store_true", help="also time batches (write_batches)")
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
    if args.batches:
        write_batches(hvd, torch, f"{args.out}.batches")
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
